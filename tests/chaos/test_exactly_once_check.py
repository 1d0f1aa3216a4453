"""The exactly-once checker against hand-made histories: a clean run passes, and each violation (a lost,
duplicated, reordered, misplaced or invented output record, a stuck LSO, committed offsets going back
or read stale, final offsets short of the input's end) is reported."""

from __future__ import annotations

from kq.chaos.checker import CheckResult
from kq.chaos.exactly_once_check import (
    ExactlyOnceFinal,
    ExactlyOnceHistory,
    InputRecord,
    OffsetPoll,
    OutputRecord,
    TransactionCommit,
    check_exactly_once,
    source_of,
    transformed,
)

TOPIC = "in"


def inputs(partition: int, count: int) -> list[InputRecord]:
    """`count` input records of a partition, at offsets 0..count-1."""
    return [InputRecord(partition, offset, f"in-{partition}-{offset}".encode()) for offset in range(count)]


def outputs(partition: int, sources: list[tuple[int, int]], start: int = 0) -> list[OutputRecord]:
    """Output records of a partition made from the input records at `sources` (partition, offset), at
    every other offset from `start` (as if each sat in a transaction of its own, with its marker)."""
    return [
        OutputRecord(partition, start + 2 * i, transformed(TOPIC, p, o, f"in-{p}-{o}".encode()))
        for i, (p, o) in enumerate(sources)
    ]


def final(
    output: dict[int, list[OutputRecord]] | None = None,
    committed: dict[int, int | None] | None = None,
    bounds: dict[int, tuple[int, int]] | None = None,
) -> ExactlyOnceFinal:
    """Two input partitions of 3 records; by default each written once, in order, every offset
    committed and every transaction complete."""
    output = output or {p: outputs(p, [(p, o) for o in range(3)]) for p in (0, 1)}
    return ExactlyOnceFinal(
        {p: inputs(p, 3) for p in (0, 1)},
        {0: 3, 1: 3},
        output,
        bounds or {0: (6, 6), 1: (6, 6)},
        committed if committed is not None else {0: 3, 1: 3},
    )


def history(
    commits: list[TransactionCommit] | None = None, polls: list[OffsetPoll] | None = None
) -> ExactlyOnceHistory:
    """Commits of the default run (partition 0 then 1, one after the other) unless given."""
    result = ExactlyOnceHistory()
    result.commits = (
        commits
        if commits is not None
        else [TransactionCommit("w0", ((0, 2),), 1.0), TransactionCommit("w1", ((0, 3), (1, 3)), 2.0)]
    )
    result.polls = polls or [
        OffsetPoll(1.5, 1.6, ((0, 2), (1, None))),
        OffsetPoll(2.5, 2.6, ((0, 3), (1, 3))),
    ]
    return result


def kinds(result: CheckResult) -> dict[str, int]:
    """Anomaly kind -> count."""
    return result.anomaly_counts


def test_a_clean_run_passes_with_its_counts() -> None:
    """Every input once, in order, offsets rising to the input's end: no anomaly."""
    result = check_exactly_once(history(), final(), TOPIC)
    assert result.ok, result.anomalies
    assert result.counts["eos_input_records"] == 6
    assert result.counts["eos_inputs_written_once"] == 6
    assert result.counts["eos_transactions_committed"] == 2


def test_a_value_names_its_source() -> None:
    """The transform's value is read back as (partition, offset, original); anything else names none."""
    assert source_of(transformed("a/b", 2, 17, b"x|y")) == (2, 17, b"x|y")
    assert source_of(b"no separator") is None
    assert source_of(None) is None
    assert source_of(b"in/x/1|v") is None


def test_a_lost_and_a_duplicated_input_record_are_reported() -> None:
    """Input 0@1 missing, 1@2 written twice (the second copy a transaction whose abort was lost)."""
    output = {0: outputs(0, [(0, 0), (0, 2)]), 1: outputs(1, [(1, 0), (1, 1), (1, 2), (1, 2)])}
    result = check_exactly_once(history(), final(output), TOPIC)
    assert kinds(result) == {"eos-lost": 1, "eos-duplicate": 1}
    lost = next(a for a in result.anomalies if a.kind == "eos-lost")
    assert (lost.partition, lost.offsets) == (0, (1,))
    duplicate = next(a for a in result.anomalies if a.kind == "eos-duplicate")
    assert duplicate.partition == 1 and duplicate.offsets == (2, 4, 6)


def test_output_out_of_input_order_is_reported() -> None:
    """Input 0@2 written before 0@1."""
    output = {0: outputs(0, [(0, 0), (0, 2), (0, 1)]), 1: outputs(1, [(1, o) for o in range(3)])}
    assert kinds(check_exactly_once(history(), final(output), TOPIC)) == {"eos-reordered": 1}


def test_phantom_and_misplaced_output_records_are_reported() -> None:
    """A record of no input, one whose value is not its source's transform, one in another partition."""
    forged = OutputRecord(1, 10, transformed(TOPIC, 1, 1, b"not the input value"))
    invented = OutputRecord(1, 12, b"made up")
    beyond = OutputRecord(1, 14, transformed(TOPIC, 1, 9, b"in-1-9"))
    output = {
        0: outputs(0, [(0, 0), (0, 1), (0, 2), (1, 0)]),
        1: [*outputs(1, [(1, 1), (1, 2)]), forged, invented, beyond],
    }
    assert kinds(check_exactly_once(history(), final(output), TOPIC)) == {
        "eos-phantom": 3,
        "eos-misplaced": 1,
    }


def test_a_stuck_last_stable_offset_is_reported() -> None:
    """An output partition whose read_committed end stays below its log end: a transaction left open."""
    result = check_exactly_once(history(), final(bounds={0: (6, 6), 1: (4, 7)}), TOPIC)
    assert kinds(result) == {"eos-lso-stuck": 1}


def test_acknowledged_commits_going_back_are_reported() -> None:
    """A worker's acknowledged commit below one acknowledged before it (on the same partition)."""
    commits = [
        TransactionCommit("w0", ((0, 3),), 1.0),
        TransactionCommit("w1", ((0, 2), (1, 3)), 2.0),
        TransactionCommit("w0", ((0, 3),), 3.0),
    ]
    result = check_exactly_once(history(commits, [OffsetPoll(3.5, 3.6, ((0, 3), (1, 3)))]), final(), TOPIC)
    assert kinds(result) == {"eos-commit-regression": 1}
    assert result.anomalies[0].offsets == (2, 3)


def test_polled_offsets_going_back_or_lagging_an_acknowledged_commit_are_reported() -> None:
    """A poll below a poll answered before it was sent; a poll below a commit acknowledged before it
    was sent; a poll overlapping an earlier one is not compared with it."""
    polls = [
        OffsetPoll(1.5, 1.6, ((0, 2), (1, None))),
        OffsetPoll(1.55, 1.58, ((0, 1), (1, None))),  # Overlaps the first: not a regression of it.
        OffsetPoll(1.7, 1.8, ((0, 1), (1, None))),  # Below the first poll's 2: a regression.
        OffsetPoll(2.5, 2.6, ((0, 3), (1, None))),  # Commit (1, 3) was acknowledged at 2.0: stale.
    ]
    commits = [TransactionCommit("w1", ((1, 3),), 2.0)]
    result = check_exactly_once(history(commits, polls), final(), TOPIC)
    assert kinds(result) == {"eos-commit-regression": 1, "eos-stale-offset": 1}


def test_final_committed_offsets_short_of_the_input_end_are_reported() -> None:
    """Partition 1 committed to 2 of 3, partition 0 never committed."""
    result = check_exactly_once(history(), final(committed={0: None, 1: 2}), TOPIC)
    assert kinds(result) == {"eos-final-offsets": 2}


def test_records_the_workers_never_committed_are_unprocessed_not_lost() -> None:
    """The workers stopped short (committed 1 of partition 1's 3 records): the two records beyond the
    committed offset, missing from the output, are counted as unprocessed; one below it is lost."""
    output = {0: outputs(0, [(0, o) for o in range(3)]), 1: []}
    result = check_exactly_once(history(), final(output, committed={0: 3, 1: 1}), TOPIC)
    assert kinds(result) == {"eos-final-offsets": 1, "eos-lost": 1}
    assert result.counts["eos_inputs_unprocessed"] == 2


def test_the_history_excerpt_gives_times_from_the_start() -> None:
    """What a failed run keeps (eos-history.json): commits and polls, times relative to the origin."""
    recorded = history()
    recorded.origin_s = 1.0
    excerpt = recorded.excerpt()
    assert excerpt["commits"] == [
        {"worker": "w0", "offsets": {0: 2}, "acked_s": 0.0},
        {"worker": "w1", "offsets": {0: 3, 1: 3}, "acked_s": 1.0},
    ]
    assert excerpt["polls"] == [
        {"offsets": {0: 2, 1: None}, "requested_s": 0.5, "observed_s": 0.6},
        {"offsets": {0: 3, 1: 3}, "requested_s": 1.5, "observed_s": 1.6},
    ]
