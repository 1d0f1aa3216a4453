"""The checker against hand-made histories: a clean one passes, and each kind of violation is reported."""

from __future__ import annotations

from chaos.checker import CheckResult, PartitionLog, check
from chaos.history import Ack, ClientError, ConsumedRecord, History, HwmObservation, Unknown, resumed_ack
from client import ConsumerRecord

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
