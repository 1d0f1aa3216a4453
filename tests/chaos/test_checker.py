"""The checker against hand-made histories: a clean one passes, and each kind of violation is reported."""

from __future__ import annotations

from kq.chaos.checker import CheckResult, PartitionLog, check
from kq.chaos.history import (
    Ack,
    ClientError,
    ConsumedRecord,
    GroupCommit,
    GroupDelivery,
    GroupObservation,
    History,
    HwmObservation,
    Unknown,
    resumed_ack,
)
from kq.client import ConsumerRecord

NODES = ("1", "2", "3")


def record(offset: int, value: bytes, partition: int = 0) -> ConsumerRecord:
    """A stored record as a node returns it."""
    return ConsumerRecord("t", partition, offset, 1_000, 0, None, value)


def log(*values: bytes, start: int = 0) -> PartitionLog:
    """A partition log holding `values` from offset `start`."""
    records = tuple(record(start + i, value) for i, value in enumerate(values))
    return PartitionLog(start, start + len(values), records)


def acked_history(values: list[bytes], producer: str = "p0") -> History:
    """A history in which `producer` sent `values` in order and each was acknowledged at offset i."""
    history = History()
    for sequence, value in enumerate(values):
        history.attempted[value] = (producer, sequence)
        history.acks.append(Ack(producer, sequence, value, 0, sequence, sequence + 1, float(sequence)))
    return history


def same_everywhere(partition_log: PartitionLog) -> dict[str, dict[int, PartitionLog]]:
    """Every node holding the same single partition."""
    return {node: {0: partition_log} for node in NODES}


def kinds(result: CheckResult) -> dict[str, int]:
    """Anomaly kind -> count."""
    return result.anomaly_counts


def test_a_clean_history_passes() -> None:
    """Every acknowledged record once, in order, identical everywhere: no anomaly, right counts."""
    history = acked_history([b"a", b"b", b"c"])
    result = check(history, same_everywhere(log(b"a", b"b", b"c")))
    assert result.ok, result.anomalies
    assert result.counts["records_acknowledged"] == 3
    assert result.counts["records_in_log"] == 3


def test_lost_duplicate_and_reordered_writes_are_each_reported() -> None:
    """One history with a lost write, a duplicate and a reordering: each is reported with its offsets."""
    history = acked_history([b"a", b"b", b"c", b"d"])
    # b"b" is lost, b"c" is stored twice, and b"d" now precedes b"a"'s successor in send order.
    result = check(history, same_everywhere(log(b"a", b"d", b"c", b"c")))
    assert set(kinds(result)) >= {"lost", "duplicate", "reordered"}, result.anomalies
    lost = next(a for a in result.anomalies if a.kind == "lost")
    assert lost.partition == 0 and lost.offsets == (1,) and "#1" in lost.detail
    duplicate = next(a for a in result.anomalies if a.kind == "duplicate")
    assert duplicate.offsets == (2, 3)
    reordered = next(a for a in result.anomalies if a.kind == "reordered")
    assert reordered.offsets == (2, 1) and "#2 before #3" in reordered.detail
    assert duplicate.nodes == NODES, "identical logs are reported once, naming every node"


def test_an_unknown_outcome_may_land_once_but_not_twice() -> None:
    """A failed send that was written once is fine; written twice it is a duplicate."""
    history = acked_history([b"a"])
    history.attempted[b"x"] = ("p0", 1)
    history.unknowns.append(Unknown("p0", 1, b"x", "UnavailableError", 2.0))
    assert check(history, same_everywhere(log(b"a", b"x"))).ok
    assert check(history, same_everywhere(log(b"a"))).ok
    assert kinds(check(history, same_everywhere(log(b"a", b"x", b"x")))) == {"duplicate": 1}


def test_misplaced_and_phantom_records_are_reported() -> None:
    """An acknowledged record at another offset, and a record nobody sent."""
    history = acked_history([b"a", b"b"])
    result = check(history, same_everywhere(log(b"b", b"a", b"ghost")))
    assert kinds(result).get("misplaced") == 2 and kinds(result).get("phantom") == 1


def test_divergent_replicas_and_holes_are_reported() -> None:
    """Nodes disagreeing at an offset, and a node whose offsets skip one."""
    history = acked_history([b"a", b"b", b"c"])
    holed = PartitionLog(0, 3, (record(0, b"a"), record(2, b"c")))
    logs = {"1": {0: log(b"a", b"b", b"c")}, "2": {0: log(b"a", b"x", b"c")}, "3": {0: holed}}
    result = check(history, logs)
    divergence = [a for a in result.anomalies if a.kind == "divergence"]
    assert {a.nodes for a in divergence} == {("1", "2"), ("1", "3")}
    assert any(a.offsets == (1,) for a in divergence)
    hole = next(a for a in result.anomalies if a.kind == "hole")
    assert hole.nodes == ("3",) and hole.offsets == (1, 2)


def test_consumer_anomalies_are_reported() -> None:
    """A high-water mark going backwards or past the final log, a dirty read, a skipped offset."""
    history = acked_history([b"a", b"b"])
    history.hwm += [
        HwmObservation("c0", "1", 0, 2, 1.0),
        HwmObservation("c0", "1", 0, 1, 2.0),
        HwmObservation("c0", "1", 0, 5, 3.0),
    ]
    history.consumed += [ConsumedRecord("c0", "1", 0, 0, b"a"), ConsumedRecord("c0", "1", 0, 0, b"zzz")]
    history.consumed.append(ConsumedRecord("c1", "2", 0, 1, b"b"))
    result = check(history, same_everywhere(log(b"a", b"b")))
    assert kinds(result) == {"hwm-regression": 1, "hwm-beyond-log": 1, "dirty-read": 1, "consumer-gap": 2}


def test_unexpected_client_errors_are_anomalies() -> None:
    """An idempotent producer should never see a sequence error."""
    history = acked_history([b"a"])
    history.client_errors.append(ClientError("p0", "ProducerSequenceError", "out of order", 1.0))
    assert kinds(check(history, same_everywhere(log(b"a")))) == {"client-error": 1}


def test_failover_is_timed_from_the_next_leaders_first_acknowledgement() -> None:
    """Answers already on their way from the old leader (within the grace) do not end the failover."""
    acks = [
        Ack("p0", 0, b"a", 0, 0, 10, 0.9),  # Before the fault, begun at t=1.0 and in place at t=1.05.
        Ack("p1", 0, b"b", 0, 1, 11, 1.01),  # In flight from the old leader.
        Ack("p2", 0, b"c", 0, 2, 12, 1.2),  # Committed by the old leader while the fault went in.
        Ack("probe0", 0, b"d", 0, 3, 30, 1.5),  # Probes never time failovers.
        Ack("p1", 1, b"e", 0, 4, 13, 1.7),  # Beyond every entry the old leader answered: the new leader.
        Ack("p0", 1, b"f", 0, 5, 15, 1.8),
    ]
    found = resumed_ack(acks, 1.0, 1.05, 10, leader_fault=True)
    assert found is not None and found.acked_s == 1.7
    assert resumed_ack(acks, 1.0, 1.0, 10, leader_fault=False) == acks[1]
    assert resumed_ack(acks, 2.0, 2.0, 15, leader_fault=True) is None


def group_history(values: list[bytes]) -> History:
    """`acked_history` plus a group that received every record once and committed the end twice."""
    history = acked_history(values)
    history.group_deliveries += [
        GroupDelivery("g", "m0", 1, "t", 0, offset, value) for offset, value in enumerate(values)
    ]
    history.group_commits += [
        GroupCommit("g", "m0", 1, "t", ((0, 1),), 10.0),
        GroupCommit("g", "m1", 2, "t", ((0, len(values)),), 12.0),
    ]
    history.group_observations.append(GroupObservation("g", "m1", 2, "t", 0, 1, 11.0, 11.1))
    return history


def final_offsets(offset: int) -> dict[str, dict[str, dict[int, int]]]:
    """Group `g` holding `offset` for partition 0 on every node."""
    return {"g": {node: {0: offset} for node in NODES}}


def test_a_clean_group_history_passes() -> None:
    """Every record delivered, commits rising across a rebalance, every node at the log end: no anomaly."""
    history = group_history([b"a", b"b", b"c"])
    result = check(history, same_everywhere(log(b"a", b"b", b"c")), final_offsets(3))
    assert result.ok, result.anomalies
    assert result.counts["group_commits"] == 2 and result.counts["group_generation_max"] == 2
    assert result.counts["group_acked_beyond_commit"] == 0


def test_a_commit_going_backwards_is_reported() -> None:
    """An acknowledged commit below an earlier one, a stale read at a join, and a node behind the acks."""
    history = group_history([b"a", b"b", b"c"])
    history.group_commits.append(GroupCommit("g", "m0", 3, "t", ((0, 2),), 13.0))  # 3, then 2.
    # Joins asked at t=12.5, after the commit of 3 was acknowledged, read 1 and nothing.
    history.group_observations.append(GroupObservation("g", "m2", 3, "t", 0, 1, 12.5, 12.6))
    history.group_observations.append(GroupObservation("g", "m2", 3, "t", 0, None, 12.5, 12.6))
    offsets = final_offsets(3)
    offsets["g"]["2"] = {0: 2}
    result = check(history, same_everywhere(log(b"a", b"b", b"c")), offsets)
    assert kinds(result) == {"group-commit-regression": 4, "group-divergence": 1}, result.anomalies
    regressions = [a for a in result.anomalies if a.kind == "group-commit-regression"]
    assert regressions[0].offsets == (3, 2) and "m0 (generation 3) committed 2" in regressions[0].detail
    assert {a.offsets for a in regressions[1:3]} == {(3, 1), (3, -1)}
    assert regressions[3].nodes == ("2",)


def test_a_commit_acknowledged_after_the_join_read_is_not_required_there() -> None:
    """A join read only has to see commits acknowledged before it was sent."""
    history = group_history([b"a", b"b", b"c"])
    history.group_observations.append(GroupObservation("g", "m2", 2, "t", 0, 1, 11.5, 12.5))
    assert check(history, same_everywhere(log(b"a", b"b", b"c")), final_offsets(3)).ok


def test_an_acknowledged_record_never_delivered_is_reported() -> None:
    """The group committed past a record no member was given: the record is lost to the group."""
    history = group_history([b"a", b"b", b"c"])
    history.group_deliveries = [d for d in history.group_deliveries if d.value != b"b"]
    result = check(history, same_everywhere(log(b"a", b"b", b"c")), final_offsets(3))
    assert kinds(result) == {"group-undelivered": 1}
    undelivered = result.anomalies[0]
    assert undelivered.partition == 0 and undelivered.offsets == (1,) and "p0 record #1" in undelivered.detail


def test_a_stored_record_of_unknown_outcome_below_the_commit_must_be_delivered_too() -> None:
    """A record whose send failed but which landed is in the log: skipping it is a loss as well."""
    history = group_history([b"a", b"b"])
    history.attempted[b"x"] = ("p0", 2)
    history.unknowns.append(Unknown("p0", 2, b"x", "UnavailableError", 2.0))
    history.group_commits.append(GroupCommit("g", "m1", 2, "t", ((0, 3),), 13.0))
    result = check(history, same_everywhere(log(b"a", b"b", b"x")), final_offsets(3))
    assert kinds(result) == {"group-undelivered": 1} and result.anomalies[0].offsets == (2,)


def test_duplicates_are_allowed_and_records_beyond_the_commit_are_only_counted() -> None:
    """At-least-once: a record delivered twice is fine; a record past the final commit is not checked."""
    history = group_history([b"a", b"b", b"c"])
    history.group_deliveries.append(GroupDelivery("g", "m1", 2, "t", 0, 0, b"a"))
    history.group_deliveries = [d for d in history.group_deliveries if d.value != b"c"]
    history.group_commits.pop()  # Only the commit to 1 was acknowledged; the nodes hold 2 (answer lost).
    result = check(history, same_everywhere(log(b"a", b"b", b"c")), final_offsets(2))
    assert result.ok, result.anomalies
    assert result.counts["group_acked_beyond_commit"] == 1


def test_a_group_delivery_unlike_the_final_log_is_a_dirty_read() -> None:
    """A member was given a record the final log does not hold at that offset."""
    history = group_history([b"a", b"b", b"c"])
    history.group_deliveries.append(GroupDelivery("g", "m1", 2, "t", 0, 1, b"zzz"))
    result = check(history, same_everywhere(log(b"a", b"b", b"c")), final_offsets(3))
    assert kinds(result) == {"group-dirty-read": 1}


def test_a_group_that_committed_offset_zero_is_not_behind() -> None:
    """Committed offset 0 on every node, acknowledged as 0, is no regression (0 is not 'none')."""
    history = History()
    history.group_commits.append(GroupCommit("g", "m0", 1, "t", ((0, 0),), 1.0))
    assert check(history, same_everywhere(log()), final_offsets(0)).ok


def test_a_groups_failover_is_timed_by_its_own_partitions_and_indexes() -> None:
    """With a Raft group per worker process, indexes of different groups do not compare: another
    group's acks (partition 1 here, higher indexes, never cut off) neither end nor hide the failover
    of the killed leader's group (partition 0)."""
    acks = [
        Ack("p0", 0, b"a", 0, 0, 10, 0.9),
        Ack("p1", 0, b"b", 1, 0, 500, 1.1),  # Another group, going on during the failover.
        Ack("p1", 1, b"c", 1, 1, 501, 1.3),
        Ack("p0", 1, b"d", 0, 1, 12, 1.9),  # The killed leader's group, from its new leader.
    ]
    found = resumed_ack(acks, 1.0, 1.05, 10, leader_fault=True, partitions=frozenset({0}))
    assert found is not None and found.acked_s == 1.9
    other = resumed_ack(acks, 1.0, 1.05, 10, leader_fault=True)
    assert other is not None and other.acked_s == 1.3  # Without the filter: the unaffected group ends it.
