"""The checker's documented gaps: records retention trimmed or compaction removed are counted, not
reported; everything else missing, and every other anomaly, is still reported."""

from __future__ import annotations

from kq.chaos.checker import CheckResult, PartitionLog, check
from kq.chaos.gaps import COMPACTED, TRIMMED, Lifecycle
from kq.chaos.history import TOMBSTONE_ID_HEADER, Ack, ConsumedRecord, GroupCommit, GroupDelivery, History
from kq.client import ConsumerRecord

NODES = ("1", "2", "3")
RETENTION = Lifecycle(trims=True)
COMPACTION = Lifecycle(compacted=True, delete_retention_ms=1_000, read_wall_ms=10_000)


def stored(offset: int, value: bytes | None, key: bytes | None = None, partition: int = 0) -> ConsumerRecord:
    """A record as a node returns it; a tombstone (value None) carries its identity in a header."""
    headers = ((TOMBSTONE_ID_HEADER, b"t%d" % offset),) if value is None else ()
    return ConsumerRecord("t", partition, offset, 1_000, 0, key, value, headers)


def partition_log(start: int, end: int, *records: ConsumerRecord) -> PartitionLog:
    """A partition log spanning [start, end) and holding `records` (gaps allowed)."""
    return PartitionLog(start, end, tuple(records))


def everywhere(log: PartitionLog) -> dict[str, dict[int, PartitionLog]]:
    """Every node holding the same single partition."""
    return {node: {0: log} for node in NODES}


def sent(values: list[bytes], keys: list[bytes | None] | None = None) -> History:
    """One producer sent `values` (keyed by `keys`), each acknowledged at offset i of partition 0."""
    history = History()
    history.attempt("p0", list(range(len(values))), values, keys or [])
    for sequence, value in enumerate(values):
        history.acks.append(Ack("p0", sequence, value, 0, sequence, sequence + 1, float(sequence)))
    return history


def kinds(result: CheckResult) -> dict[str, int]:
    """Anomaly kind -> count."""
    return result.anomaly_counts


def test_records_below_the_final_log_start_are_trimmed_gaps() -> None:
    """Retention trimmed offsets 0-2 on every node: counted as trimmed, no anomaly; a consumer that was
    moved up to the log start skipped them, and what it read before the trim is no dirty read."""
    history = sent([b"a", b"b", b"c", b"d", b"e"])
    history.consumed += [
        ConsumedRecord("c0", "1", 0, 0, b"a"),  # Read before the trim.
        ConsumedRecord("c0", "1", 0, 3, b"d"),  # Moved up to the log start: skipped 1 and 2.
        ConsumedRecord("c0", "1", 0, 4, b"e"),
    ]
    result = check(
        history, everywhere(partition_log(3, 5, stored(3, b"d"), stored(4, b"e"))), lifecycle=RETENTION
    )
    assert result.ok, result.anomalies
    assert result.gaps == {TRIMMED: 3, COMPACTED: 0}
    assert result.counts["gaps_trimmed"] == 3 and result.counts["log_start_offset_max"] == 3


def test_a_missing_record_above_the_log_start_is_still_lost() -> None:
    """Trimmed below 2, but offset 3 is gone too: that one is lost, and the hole is reported."""
    history = sent([b"a", b"b", b"c", b"d", b"e"])
    result = check(
        history, everywhere(partition_log(2, 5, stored(2, b"c"), stored(4, b"e"))), lifecycle=RETENTION
    )
    assert kinds(result) == {"lost": 1, "hole": 3}, result.anomalies
    assert next(a for a in result.anomalies if a.kind == "lost").offsets == (3,)
    assert result.gaps[TRIMMED] == 2


def test_a_moved_log_start_without_retention_is_an_anomaly() -> None:
    """No retention configured: a log start above 0 is reported, and the records below it are lost."""
    history = sent([b"a", b"b", b"c"])
    result = check(history, everywhere(partition_log(1, 3, stored(1, b"b"), stored(2, b"c"))))
    assert kinds(result) == {"unexpected-trim": 3, "lost": 1}
    assert result.gaps == {TRIMMED: 0, COMPACTED: 0}


def test_nodes_disagreeing_about_the_log_start_are_a_divergence() -> None:
    """Every node must hold the same bounds: one that trimmed further than the others is reported."""
    history = sent([b"a", b"b", b"c"])
    logs = everywhere(partition_log(1, 3, stored(1, b"b"), stored(2, b"c")))
    logs["3"] = {0: partition_log(2, 3, stored(2, b"c"))}
    result = check(history, logs, lifecycle=RETENTION)
    assert kinds(result) == {"divergence": 2}, result.anomalies
    assert {a.nodes for a in result.anomalies} == {("3", "1")} | {("1", "3")}


def test_a_consumer_skipping_records_the_final_log_holds_is_reported() -> None:
    """Offsets skipped by a consumer must be gone from the final log: here offset 3 is still there."""
    history = sent([b"a", b"b", b"c", b"d", b"e"])
    history.consumed += [ConsumedRecord("c0", "1", 0, 2, b"c"), ConsumedRecord("c0", "1", 0, 4, b"e")]
    log = partition_log(2, 5, stored(2, b"c"), stored(3, b"d"), stored(4, b"e"))
    result = check(history, everywhere(log), lifecycle=RETENTION)
    assert kinds(result) == {"consumer-gap": 1}
    assert result.anomalies[0].offsets == (3, 4, 3)


def test_a_read_below_the_log_start_that_differs_is_still_a_dirty_read_above_it() -> None:
    """A record read at an offset the final log still holds must be that record, trims or not."""
    history = sent([b"a", b"b", b"c"])
    history.consumed += [ConsumedRecord("c0", "1", 0, 0, b"a"), ConsumedRecord("c0", "1", 0, 1, b"zzz")]
    log = partition_log(1, 3, stored(1, b"b"), stored(2, b"c"))
    assert kinds(check(history, everywhere(log), lifecycle=RETENTION)) == {"dirty-read": 1}


def test_superseded_keys_and_old_tombstones_are_compacted_gaps() -> None:
    """Offsets 0 (k1, superseded at 2) and 1 (k2, superseded by the tombstone at 3) are gone; the
    tombstone at 3 (sent at 8000 ms, 2 s before the read, delete.retention.ms 1 s) went too. Offsets
    never moved: the log still spans [0, 5)."""
    history = sent([b"a", b"b", b"c", b"t3", b"e"], [b"k1", b"k2", b"k1", b"k2", b"k3"])
    history.tombstones[b"t3"] = 8_000
    log = partition_log(0, 5, stored(2, b"c", b"k1"), stored(4, b"e", b"k3"))
    result = check(history, everywhere(log), lifecycle=COMPACTION)
    assert result.ok, result.anomalies
    assert result.gaps == {TRIMMED: 0, COMPACTED: 3}


def test_a_young_tombstone_and_a_keys_newest_record_must_stay() -> None:
    """The newest record of a key (offset 2) and a tombstone younger than delete.retention.ms
    (offset 3, sent 0.5 s before the read) may not be compacted away: both are lost."""
    history = sent([b"a", b"b", b"c", b"t3"], [b"k1", b"k2", b"k1", b"k2"])
    history.tombstones[b"t3"] = 9_500
    result = check(history, everywhere(partition_log(0, 4, stored(1, b"b", b"k2"))), lifecycle=COMPACTION)
    assert kinds(result) == {"lost": 2}, result.anomalies
    assert sorted(a.offsets for a in result.anomalies) == [(2,), (3,)]
    assert result.gaps[COMPACTED] == 1


def test_a_record_superseded_only_in_another_partition_must_stay() -> None:
    """Compaction is per partition: the same key at a higher offset elsewhere supersedes nothing."""
    history = sent([b"a"], [b"k1"])
    history.attempt("p1", [0], [b"b"], [b"k1"])
    history.acks.append(Ack("p1", 0, b"b", 1, 5, 9, 1.0))
    logs = {
        node: {0: partition_log(0, 1), 1: partition_log(5, 6, stored(5, b"b", b"k1", 1))} for node in NODES
    }
    result = check(history, logs, lifecycle=Lifecycle(compacted=True, trims=True))
    assert kinds(result) == {"lost": 1}
    assert result.anomalies[0].partition == 0


def test_compaction_gaps_need_a_compacted_topic() -> None:
    """The same superseded record missing from a topic that is not compacted is lost, and a hole."""
    history = sent([b"a", b"b"], [b"k1", b"k1"])
    result = check(history, everywhere(partition_log(0, 2, stored(1, b"b", b"k1"))))
    assert kinds(result) == {"lost": 1, "hole": 3}


def test_a_compacted_log_may_skip_offsets_but_never_go_back_or_leave_its_bounds() -> None:
    """Offsets of a compacted log rise with gaps; one repeated, or beyond the log end, is a hole."""
    history = sent([b"a", b"b", b"c"], [b"k", b"k", b"k"])
    bad = partition_log(0, 2, stored(1, b"b", b"k"), stored(1, b"b", b"k"), stored(2, b"c", b"k"))
    result = check(history, everywhere(bad), lifecycle=COMPACTION)
    assert kinds(result).get("hole") == 6, result.anomalies  # Two per node: the repeat and offset 2.


def test_reads_of_compacted_records_and_group_deliveries_are_no_dirty_reads() -> None:
    """A consumer and a group member read k1's old record before compaction removed it, and stepped
    over compacted offsets: no anomaly; the group need not have been given what compaction removed."""
    history = sent([b"a", b"b", b"c"], [b"k1", b"k2", b"k1"])
    history.consumed += [
        ConsumedRecord("c0", "1", 0, 0, b"a", key=b"k1"),
        ConsumedRecord("c0", "1", 0, 1, b"b", key=b"k2"),
        ConsumedRecord("c1", "2", 0, 1, b"b", key=b"k2"),  # Started after 0 was compacted away.
        ConsumedRecord("c1", "2", 0, 2, b"c", key=b"k1"),
    ]
    history.group_deliveries += [
        GroupDelivery("g", "m0", 1, "t", 0, 1, b"b", key=b"k2"),
        GroupDelivery("g", "m0", 1, "t", 0, 2, b"c", key=b"k1"),
        GroupDelivery("g", "m1", 1, "t", 0, 0, b"a", key=b"k1"),
    ]
    history.group_commits.append(GroupCommit("g", "m0", 1, "t", ((0, 3),), 5.0))
    log = partition_log(0, 3, stored(1, b"b", b"k2"), stored(2, b"c", b"k1"))
    result = check(history, everywhere(log), {"g": {node: {0: 3} for node in NODES}}, COMPACTION)
    assert result.ok, result.anomalies
    assert result.gaps[COMPACTED] == 1


def test_a_read_of_a_record_no_rule_removes_is_a_dirty_read() -> None:
    """A consumer read k1 at offset 0; the final log has nothing there and no newer k1: reported."""
    history = sent([b"a", b"b"], [b"k1", b"k2"])
    history.consumed.append(ConsumedRecord("c0", "1", 0, 0, b"a", key=b"k1"))
    history.group_deliveries.append(GroupDelivery("g", "m0", 1, "t", 0, 0, b"a", key=b"k1"))
    log = partition_log(0, 2, stored(1, b"b", b"k2"))
    result = check(history, everywhere(log), lifecycle=COMPACTION)
    assert kinds(result) == {"lost": 1, "dirty-read": 1, "group-dirty-read": 1}, result.anomalies


def test_duplicates_and_misplaced_records_are_reported_in_a_compacted_trimmed_topic() -> None:
    """Gaps excuse absence only: a record twice (b), or at another offset than acknowledged (d), is
    reported, and c, neither below the log start nor superseded, is lost; a, below it, is trimmed."""
    history = sent([b"a", b"b", b"c", b"d"], [b"k1", b"k2", b"k3", b"k4"])
    log = partition_log(1, 4, stored(1, b"b", b"k2"), stored(2, b"d", b"k4"), stored(3, b"b", b"k2"))
    result = check(history, everywhere(log), lifecycle=Lifecycle(trims=True, compacted=True))
    assert kinds(result) == {"duplicate": 1, "misplaced": 1, "lost": 1}, result.anomalies
    assert result.gaps == {TRIMMED: 1, COMPACTED: 0}


def test_tombstones_are_named_by_their_header() -> None:
    """A tombstone in the log is the record its identity header names; one without it is a phantom."""
    history = sent([b"t0"], [b"k1"])
    history.tombstones[b"t0"] = 9_900
    nameless = ConsumerRecord("t", 0, 1, 1_000, 0, b"k1", None)
    result = check(
        history, everywhere(partition_log(0, 2, stored(0, None, b"k1"), nameless)), lifecycle=COMPACTION
    )
    assert kinds(result) == {"phantom": 1}, result.anomalies
