"""Retention's decision: which prefix of a partition has expired, by time and by size, at any clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from kq.broker.retention import Retention, trim_point
from kq.proto.records import NewRecord, encode_batch
from kq.raft import commands, state_machine
from kq.raft.state_machine import apply
from kq.raft.topic_config import effective
from kq.storage import BatchSpan, PartitionState, Store
from tests.broker.fake_consensus import FakeConsensus
from tests.broker.test_batcher import HeldConsensus

HOUR_MS = 3_600_000
NOW_MS = 1_800_000_000_000


def spans(*timestamps: int, size: int = 100) -> list[BatchSpan]:
    """Batches of ten records each, `size` bytes each, with these max timestamps, from offset 0."""
    return [BatchSpan(10 * i, 10, timestamp, size) for i, timestamp in enumerate(timestamps)]


def state(batches: list[BatchSpan], start: int = 0) -> PartitionState:
    return PartitionState(
        start, batches[-1].end_offset if batches else start, sum(b.size_bytes for b in batches)
    )


def test_time_expires_the_old_prefix_and_stops_at_the_first_batch_that_stays() -> None:
    """Two batches over an hour old go; a younger one stops the scan, even with older ones after it."""
    batches = spans(NOW_MS - 3 * HOUR_MS, NOW_MS - 2 * HOUR_MS, NOW_MS - 1_000, NOW_MS - 5 * HOUR_MS)
    config = effective({"retention.ms": str(HOUR_MS)})
    assert trim_point(batches, state(batches), config, NOW_MS) == (20, "retention.ms")
    assert trim_point(batches, state(batches), config, NOW_MS - 3 * HOUR_MS) is None


def test_a_batch_without_a_timestamp_never_expires_by_time() -> None:
    batches = spans(-1, NOW_MS - 3 * HOUR_MS)
    assert trim_point(batches, state(batches), effective({"retention.ms": "0"}), NOW_MS) is None


def test_size_keeps_at_least_retention_bytes_like_kafka() -> None:
    """1,000 bytes stored, retention.bytes 450: the oldest five batches go, the partition keeps 500
    (deleting a sixth would leave less than the bound, which Kafka never does)."""
    batches = spans(*([NOW_MS] * 10))
    config = effective({"retention.bytes": "450"})
    assert trim_point(batches, state(batches), config, NOW_MS) == (50, "retention.bytes")
    assert trim_point(batches, state(batches), effective({"retention.bytes": "1000"}), NOW_MS) is None


def test_compact_only_topics_and_unbounded_ones_are_not_trimmed() -> None:
    batches = spans(NOW_MS - 3 * HOUR_MS)
    assert (
        trim_point(
            batches, state(batches), effective({"retention.ms": "1", "cleanup.policy": "compact"}), NOW_MS
        )
        is None
    )
    assert trim_point(batches, state(batches), effective({}), NOW_MS) is None


def test_batches_left_below_the_start_call_for_the_same_trim_again() -> None:
    """A bounded trim left batches below the log start: retention proposes a trim at the start."""
    batches = spans(NOW_MS, NOW_MS, NOW_MS)
    assert trim_point(
        batches, state(batches, start=20), effective({"retention.ms": str(HOUR_MS)}), NOW_MS
    ) == (
        20,
        "batches left below the log start",
    )


def test_due_reads_committed_state_with_node_defaults(tmp_path: Path) -> None:
    """A store with two topics: one with its own retention.ms, one following the node's default; the
    leader's round names the expired prefix of each and nothing else."""
    store = Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)
    old, young = NOW_MS - 3 * HOUR_MS, NOW_MS - 1_000
    log = [
        commands.create_topic("own", 1, 1, {"retention.ms": str(HOUR_MS)}),
        commands.create_topic("inherits", 1, 1),
        commands.create_topic("kept", 1, 1, {"retention.ms": "-1"}),
    ]
    for topic in ("own", "inherits", "kept"):
        for timestamp in (old, old, young):
            batch = encode_batch([NewRecord(None, b"v", timestamp_ms=timestamp)], base_timestamp_ms=timestamp)
            log.append(commands.append(NOW_MS, [commands.partition_append(topic, 0, batch)]))
    for index, command in enumerate(log, start=1):
        apply(store, index, commands.encode(command))
    retention = Retention(
        store, HeldConsensus(store), lambda: NOW_MS, {"retention.ms": str(2 * HOUR_MS)}, 1.0
    )
    due = {(trim.topic, trim.before_offset) for trim in retention.due(NOW_MS)}
    assert due == {("own", 2), ("inherits", 2)}
    store.close()


def test_a_deleted_topic_s_batches_go_in_bounded_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleting a topic deletes at most TRIM_BATCHES_PER_ENTRY_MAX of its batches in that entry (here
    3); the leader's retention purges the rest, one bounded entry at a time, and nothing else: a
    purge naming a live topic's id deletes nothing."""
    monkeypatch.setattr(state_machine, "TRIM_BATCHES_PER_ENTRY_MAX", 3)
    store = Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)
    log = [commands.create_topic("gone", 1, 1), commands.create_topic("kept", 1, 1)]
    for topic in ("gone", "kept"):
        for _ in range(10):
            batch = encode_batch([NewRecord(None, b"v")], base_timestamp_ms=NOW_MS)
            log.append(commands.append(NOW_MS, [commands.partition_append(topic, 0, batch)]))
    log.append(commands.delete_topic("gone"))
    log.append(commands.purge_topic(2))  # "kept": live, untouched.
    for index, command in enumerate(log, start=1):
        apply(store, index, commands.encode(command))

    def stored() -> dict[bytes, int]:
        rows: dict[bytes, int] = {}
        for database, key, _ in store.dump():
            if database in (b"records", b"timestamps"):
                rows[key[:8]] = rows.get(key[:8], 0) + 1
        return rows

    assert stored() == {(1).to_bytes(8, "big"): 2 * 7, (2).to_bytes(8, "big"): 2 * 10}
    with store.read() as reader:
        assert reader.purges() == [1]
    consensus = FakeConsensus(store, lambda index: None)
    retention = Retention(store, consensus, lambda: NOW_MS, {}, 1.0)
    assert retention.purge_deleted() == 3  # 7 batches left: 3, 3, then 1 and the row.
    assert stored() == {(2).to_bytes(8, "big"): 2 * 10}
    with store.read() as reader:
        assert reader.purges() == []
    store.close()
