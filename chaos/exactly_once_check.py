"""The exactly-once checker: what transactional consume-transform-produce workers did, against the
final input and output topics (issue 38). Pure: no I/O, no clock.

The workers (`chaos.exactly_once`) read the input topic in a consumer group with read_committed and
no auto-commit, and for each batch, in one transaction, write one output record per input record to
the output partition of the same number, whose value names its source (`transformed`), and commit
the batch's input offsets to the group (`send_offsets_to_transaction`). Read at the end with a
read_committed consumer, the output must hold

  - every input record exactly once: none missing below the group's final committed offset of its
    partition (`eos-lost`; those above it were never processed, which `eos-final-offsets` reports),
    none twice (`eos-duplicate`);
  - only records made from an input record (`eos-phantom`: a source that is not in the input, or a
    value that is not the transform of the input record there), in the output partition of their
    input partition (`eos-misplaced`);
  - each input partition's records in input order (`eos-reordered`: a record of an input partition
    after one made from a later input offset);
  - no transaction left open: the last stable offset of every output partition reaches its log end
    (`eos-lso-stuck`).

The group's committed input offsets never go back (`eos-commit-regression`): the commits the workers
saw acknowledged (commit_transaction returned), in the order they returned; the committed offsets a
watcher polled (OffsetFetch to the coordinator, as a worker taking a partition over reads them), in
poll order; and no poll sent after a commit was acknowledged reads less than it committed
(`eos-stale-offset`: a worker taking the partition over would process records again). At the end
the committed offset of every input partition is its log end (`eos-final-offsets`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kq.chaos.checker import Anomaly, CheckResult

SOURCE_SEPARATOR = b"|"


@dataclass(frozen=True, slots=True)
class InputRecord:
    """One record of the final input topic."""

    partition: int
    offset: int
    value: bytes


@dataclass(frozen=True, slots=True)
class OutputRecord:
    """One record a read_committed consumer read from the final output topic."""

    partition: int
    offset: int
    value: bytes | None


@dataclass(frozen=True, slots=True)
class TransactionCommit:
    """A transaction whose commit_transaction returned: the input offsets (partition, next offset to
    read) it committed to the group."""

    worker: str
    offsets: tuple[tuple[int, int], ...]
    acked_s: float


@dataclass(frozen=True, slots=True)
class OffsetPoll:
    """The group's committed input offsets as one OffsetFetch answered them (None: none committed)."""

    requested_s: float
    observed_s: float
    offsets: tuple[tuple[int, int | None], ...]


@dataclass(slots=True)
class ExactlyOnceHistory:
    """What the workers and the watcher saw; appended from their threads (list appends are atomic),
    read once they stopped. Counters by name: transactions aborted, producers recreated, errors by
    librdkafka's error name, ..."""

    commits: list[TransactionCommit] = field(default_factory=list)
    polls: list[OffsetPoll] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    origin_s: float = 0.0

    def excerpt(self) -> dict[str, object]:
        """The commits and polls as JSON-ready data, times from the start, for failed runs."""

        def relative(at_s: float) -> float:
            return round(at_s - self.origin_s, 3)

        return {
            "commits": [
                {"worker": c.worker, "offsets": dict(c.offsets), "acked_s": relative(c.acked_s)}
                for c in self.commits
            ],
            "polls": [
                {
                    "offsets": dict(p.offsets),
                    "requested_s": relative(p.requested_s),
                    "observed_s": relative(p.observed_s),
                }
                for p in self.polls
            ],
            "counters": dict(self.counters),
        }


@dataclass(frozen=True, slots=True)
class ExactlyOnceFinal:
    """The end state: the input topic by partition, the output as read_committed read it, each output
    partition's (last stable offset, log end) and the group's final committed input offsets."""

    input_records: Mapping[int, Sequence[InputRecord]]
    input_ends: Mapping[int, int]
    output_records: Mapping[int, Sequence[OutputRecord]]
    output_bounds: Mapping[int, tuple[int, int]]
    final_committed: Mapping[int, int | None]


def transformed(topic: str, partition: int, offset: int, value: bytes) -> bytes:
    """The output value of an input record: its source, then its value."""
    return f"{topic}/{partition}/{offset}".encode() + SOURCE_SEPARATOR + value


def source_of(value: bytes | None) -> tuple[int, int, bytes] | None:
    """(input partition, input offset, input value) an output value names, or None if it names none."""
    if value is None or SOURCE_SEPARATOR not in value:
        return None
    head, _, original = value.partition(SOURCE_SEPARATOR)
    parts = head.rsplit(b"/", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return int(parts[1]), int(parts[2]), original


def check_exactly_once(
    history: ExactlyOnceHistory, final: ExactlyOnceFinal, input_topic: str, result: CheckResult | None = None
) -> CheckResult:
    """Every check of the module docstring; anomalies and `eos_*` counts go into `result`."""
    result = result if result is not None else CheckResult()
    inputs = {(r.partition, r.offset): r for records in final.input_records.values() for r in records}
    seen = _check_output(result, final, inputs, input_topic)
    unprocessed = 0
    for (partition, offset), record in sorted(inputs.items()):
        places = seen.get((partition, offset), [])
        committed = final.final_committed.get(partition)
        if not places and (committed is None or offset >= committed):
            unprocessed += 1  # Never committed: the workers did not get to it (`eos-final-offsets`).
        elif not places:
            result.add(
                Anomaly("eos-lost", f"input record {record.value!r} is in no output", partition, (offset,))
            )
        elif len(places) > 1:
            where = ", ".join(f"output {p}@{o}" for p, o in places)
            result.add(
                Anomaly(
                    "eos-duplicate",
                    f"input {partition}@{offset} written {len(places)} times: {where}",
                    partition,
                    (offset, *(o for _, o in places)),
                )
            )
    for partition, (stable, end) in sorted(final.output_bounds.items()):
        if stable < end:
            result.add(
                Anomaly(
                    "eos-lso-stuck",
                    f"output last stable offset {stable} below its log end {end}",
                    partition,
                    (stable, end),
                )
            )
    _check_commits(result, history)
    _check_polls(result, history)
    for partition, end in sorted(final.input_ends.items()):
        committed = final.final_committed.get(partition)
        if committed != end:
            result.add(
                Anomaly(
                    "eos-final-offsets",
                    f"final committed offset {committed} but the input ends at {end}",
                    partition,
                    (-1 if committed is None else committed, end),
                )
            )
    result.counts.update(_counts(history, final, seen))
    result.counts["eos_inputs_unprocessed"] = unprocessed
    return result


def _check_output(
    result: CheckResult,
    final: ExactlyOnceFinal,
    inputs: Mapping[tuple[int, int], InputRecord],
    input_topic: str,
) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """Phantoms, misplaced and reordered output records; returns input (partition, offset) -> the
    output (partition, offset) of every record made from it."""
    seen: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for partition, records in sorted(final.output_records.items()):
        last: dict[int, int] = {}  # Input partition -> input offset of its last record here.
        for record in records:
            source = source_of(record.value)
            origin = inputs.get(source[:2]) if source is not None else None
            if (
                source is None
                or origin is None
                or record.value != transformed(input_topic, origin.partition, origin.offset, origin.value)
            ):
                result.add(
                    Anomaly(
                        "eos-phantom",
                        f"output record {record.value!r} made from no input record",
                        partition,
                        (record.offset,),
                    )
                )
                continue
            from_partition, from_offset, _ = source
            repeat = bool(seen[(from_partition, from_offset)])
            seen[(from_partition, from_offset)].append((partition, record.offset))
            if from_partition != partition:
                result.add(
                    Anomaly(
                        "eos-misplaced",
                        f"input {from_partition}@{from_offset} written to output partition {partition}",
                        partition,
                        (record.offset,),
                    )
                )
            if repeat:  # A duplicate: reported as one, its position not compared again.
                continue
            previous = last.get(from_partition)
            if previous is not None and from_offset < previous:
                result.add(
                    Anomaly(
                        "eos-reordered",
                        f"input {from_partition}@{from_offset} at output offset "
                        f"{record.offset}, after input offset {previous}",
                        partition,
                        (record.offset, from_offset, previous),
                    )
                )
            last[from_partition] = max(from_offset, previous if previous is not None else from_offset)
    return seen


def _check_commits(result: CheckResult, history: ExactlyOnceHistory) -> None:
    """Acknowledged commits, in the order they returned, never lower a partition's offset."""
    highest: dict[int, tuple[int, TransactionCommit]] = {}
    for commit in history.commits:
        for partition, offset in commit.offsets:
            before = highest.get(partition)
            if before is not None and offset < before[0]:
                at_s, earlier_s = commit.acked_s - history.origin_s, before[1].acked_s - history.origin_s
                result.add(
                    Anomaly(
                        "eos-commit-regression",
                        f"{commit.worker} committed {offset} at t={at_s:.3f} s "
                        f"after {before[1].worker} committed {before[0]} at t={earlier_s:.3f} s",
                        partition,
                        (offset, before[0]),
                    )
                )
            if before is None or offset >= before[0]:
                highest[partition] = (offset, commit)


def _check_polls(result: CheckResult, history: ExactlyOnceHistory) -> None:
    """No poll reads less than a poll answered before it was sent, or than a commit acknowledged
    before it was sent (polls that overlap in time are not ordered)."""
    commits = sorted(history.commits, key=lambda commit: commit.acked_s)
    answered = sorted(history.polls, key=lambda poll: poll.observed_s)
    commit_position = poll_position = 0
    acked: dict[int, int] = {}  # Partition -> highest offset acknowledged before the current poll.
    settled: dict[int, tuple[int, OffsetPoll]] = {}  # Partition -> highest read answered before it.
    for poll in sorted(history.polls, key=lambda poll: poll.requested_s):
        while commit_position < len(commits) and commits[commit_position].acked_s < poll.requested_s:
            for partition, offset in commits[commit_position].offsets:
                acked[partition] = max(acked.get(partition, offset), offset)
            commit_position += 1
        while poll_position < len(answered) and answered[poll_position].observed_s < poll.requested_s:
            earlier = answered[poll_position]
            for partition, committed in earlier.offsets:
                value = -1 if committed is None else committed
                if partition not in settled or value > settled[partition][0]:
                    settled[partition] = (value, earlier)
            poll_position += 1
        at_s = poll.requested_s - history.origin_s
        for partition, committed in poll.offsets:
            value = -1 if committed is None else committed
            before = settled.get(partition)
            if before is not None and value < before[0]:
                before_s = before[1].requested_s - history.origin_s
                result.add(
                    Anomaly(
                        "eos-commit-regression",
                        f"committed offset read as {committed} at t={at_s:.3f} s after {before[0]} "
                        f"at t={before_s:.3f} s",
                        partition,
                        (value, before[0]),
                    )
                )
            if partition in acked and value < acked[partition]:
                result.add(
                    Anomaly(
                        "eos-stale-offset",
                        f"committed offset read as {committed} at t={at_s:.3f} s (answered at "
                        f"t={poll.observed_s - history.origin_s:.3f} s), after a commit of "
                        f"{acked[partition]} was acknowledged",
                        partition,
                        (value, acked[partition]),
                    )
                )


def _counts(
    history: ExactlyOnceHistory,
    final: ExactlyOnceFinal,
    seen: Mapping[tuple[int, int], list[tuple[int, int]]],
) -> dict[str, int]:
    counts = {
        "eos_input_records": sum(len(records) for records in final.input_records.values()),
        "eos_output_records": sum(len(records) for records in final.output_records.values()),
        "eos_inputs_written_once": sum(1 for places in seen.values() if len(places) == 1),
        "eos_transactions_committed": len(history.commits),
        "eos_offset_polls": len(history.polls),
    }
    counts.update({f"eos_{name}": count for name, count in sorted(history.counters.items())})
    return counts
