"""Key compaction: the leader's decisions (key map, drops, entries) and their effect on real stores.

The pure functions get any clock; the Compactor runs against a single-replica consensus that applies
each proposal at once to a real LMDB store, and a second store applies the very same entries, so the
tests also show that replicas end byte-identical.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kq.broker.compactor import (
    BatchDrops,
    Compactor,
    KeyMap,
    batch_drops,
    build_key_map,
    key_digest,
    pack_entries,
)
from kq.proto.compression import GZIP, NONE
from kq.proto.kq_pb2 import Command
from kq.proto.limits import ENTRY_WORK_MAX
from kq.proto.records import NewRecord, encode_batch, parse_batch, read_header
from kq.raft import commands
from kq.raft.state_machine import apply
from kq.raft.topic_config import effective
from kq.storage import Store
from tests.broker.fake_consensus import FakeConsensus

NOW_MS = 1_800_000_000_000
DAY_MS = 86_400_000
COMPACT = {"cleanup.policy": "compact"}


def record(key: str | None, value: str | None, timestamp_ms: int = NOW_MS - DAY_MS) -> NewRecord:
    return NewRecord(
        None if key is None else key.encode(),
        None if value is None else value.encode(),
        timestamp_ms=timestamp_ms,
    )


def batch(*records: NewRecord, compression: int = NONE) -> bytes:
    return encode_batch(list(records), compression, base_timestamp_ms=records[0].timestamp_ms)


class Cluster:
    """A leader store that the compactor reads and proposes to, and a follower that applies the same log."""

    def __init__(self, tmp_path: Path, configs: dict[str, str] | None = None, partitions: int = 1) -> None:
        self.leader = Store.open(tmp_path / "leader", map_size_bytes=64 * 1024**2)
        self.follower = Store.open(tmp_path / "follower", map_size_bytes=64 * 1024**2)
        self.run(commands.create_topic("t", partitions, 1, {**COMPACT, **(configs or {})}))

    def run(self, command: Command) -> None:
        data = commands.encode(command)
        index = self.leader.applied_index() + 1
        apply(self.leader, index, data)
        apply(self.follower, index, data)

    def produce(self, *batches: bytes, partition: int = 0) -> None:
        for data in batches:
            self.run(commands.append(NOW_MS, [commands.partition_append("t", partition, data)]))

    def compactor(self, now_ms: int = NOW_MS, keys_max: int = 1_000) -> Compactor:
        follower = self.follower

        class Mirroring(FakeConsensus):
            def propose(self, data: bytes, callback):  # type: ignore[no-untyped-def]
                index = self.store.applied_index() + 1
                apply(follower, index, data)  # The follower applies the committed entry too.
                super().propose(data, callback)

        consensus = Mirroring(self.leader, lambda index: None)
        return Compactor(self.leader, consensus, lambda: now_ms, {}, 1.0, keys_max)

    def read(
        self, store: Store | None = None, partition: int = 0
    ) -> list[tuple[int, str | None, str | None]]:
        """(offset, key, value) of every record of the partition, in order."""
        with (store or self.leader).read() as reader:
            batches = reader.batches(1, partition, 0, 1 << 30)
        return [
            (
                b.base_offset + r.offset_delta,
                None if r.key is None else r.key.decode(),
                None if r.value is None else r.value.decode(),
            )
            for b in batches
            for r in parse_batch(b.data)
        ]

    def close(self) -> None:
        assert self.leader.dump() == self.follower.dump(), "replicas differ after compaction"
        self.leader.close()
        self.follower.close()


def test_the_newest_record_of_each_key_is_kept_at_its_offset_and_replicas_match(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    cluster.produce(
        batch(record("a", "1"), record("b", "1"), record("c", "1")),
        batch(record("a", "2"), record("b", "2")),
        batch(record("a", "3"), record("d", "1"), compression=GZIP),
    )
    reports = cluster.compactor().run_once()
    assert cluster.read() == [(2, "c", "1"), (4, "b", "2"), (5, "a", "3"), (6, "d", "1")]
    assert [(r.end_offset, r.records_dropped, r.batches_removed) for r in reports] == [(7, 3, 0)]
    with cluster.leader.read() as reader:
        state = reader.partition(1, 0)
    assert state is not None and (state.log_start_offset, state.log_end_offset) == (0, 7)
    cluster.close()


def test_a_batch_that_keeps_no_record_is_removed_and_reads_step_over_the_gap(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    cluster.produce(batch(record("a", "1"), record("b", "1")), batch(record("a", "2"), record("b", "2")))
    cluster.compactor().run_once()
    assert cluster.read() == [(2, "a", "2"), (3, "b", "2")]
    with cluster.leader.read() as reader:
        state = reader.partition(1, 0)
        # A read at an offset of the removed batch gets the next batch: never an empty answer mid-log.
        assert [b.base_offset for b in reader.batches(1, 0, 0, 1 << 20)] == [2]
        assert [b.base_offset for b in reader.batches(1, 0, 1, 1 << 20)] == [2]
        assert reader.batches(1, 0, 4, 1 << 20) == []
    assert state is not None and (state.log_start_offset, state.log_end_offset) == (0, 4)
    cluster.close()


def test_size_follows_the_rewrites(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    cluster.produce(*(batch(record(f"k{i % 3}", "v" * 100)) for i in range(12)))
    cluster.compactor().run_once()
    with cluster.leader.read() as reader:
        state = reader.partition(1, 0)
        stored = reader.batches(1, 0, 0, 1 << 30)
    assert state is not None and state.size_bytes == sum(len(b.data) for b in stored)
    assert [b.base_offset for b in stored] == [9, 10, 11]
    cluster.close()


def test_tombstones_stay_for_delete_retention_ms_then_go(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, {"delete.retention.ms": str(DAY_MS)})
    cluster.produce(
        batch(record("a", "1"), record("b", "1")),
        batch(record("a", None, timestamp_ms=NOW_MS - 1_000)),
    )
    cluster.compactor(NOW_MS).run_once()
    assert cluster.read() == [(1, "b", "1"), (2, "a", None)]  # The tombstone is young: kept.
    later = cluster.compactor(NOW_MS + DAY_MS)
    assert later.run_once()  # Due: a kept tombstone expires, though nothing new was written.
    assert cluster.read() == [(1, "b", "1")]
    cluster.close()


def test_records_younger_than_the_lag_are_left_alone(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, {"min.compaction.lag.ms": "60000"})
    cluster.produce(
        batch(record("a", "1", NOW_MS - 120_000)),
        batch(record("a", "2", NOW_MS - 90_000)),
        batch(record("a", "3", NOW_MS - 1_000)),
    )
    cluster.compactor().run_once()
    # The map ends before the young batch: "2" supersedes "1"; "3" does not yet supersede "2".
    assert cluster.read() == [(1, "a", "2"), (2, "a", "3")]
    cluster.close()


def test_records_without_a_key_are_dropped(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    cluster.produce(batch(record(None, "x"), record("a", "1")))
    cluster.compactor().run_once()
    assert cluster.read() == [(1, "a", "1")]
    cluster.close()


def test_a_full_key_map_compacts_over_several_passes(tmp_path: Path) -> None:
    """With room for four keys, the first pass maps two batches, the second two more; the third maps
    the last batch whole (eight keys: a batch always fits), and only it drops the superseded records.
    (A ratio of 0: a pass is due whenever anything is dirty.)"""
    cluster = Cluster(tmp_path, {"min.cleanable.dirty.ratio": "0"})
    cluster.produce(*(batch(record(f"k{i}", "1"), record(f"k{i + 1}", "1")) for i in range(0, 8, 2)))
    cluster.produce(batch(*(record(f"k{i}", "2") for i in range(8))))
    compactor = cluster.compactor(keys_max=4)
    ends = []
    for _ in range(4):
        ends += [report.end_offset for report in compactor.run_once()]
    assert ends == [4, 8, 16]
    assert cluster.read() == [(8 + i, f"k{i}", "2") for i in range(8)]
    cluster.close()


def test_a_pass_is_due_only_when_enough_is_dirty(tmp_path: Path) -> None:
    """Nothing new: no pass. A little new beside much clean: still none (min.cleanable.dirty.ratio 0.5)."""
    cluster = Cluster(tmp_path)
    cluster.produce(batch(record("a", "1")), batch(record("a", "2")))
    compactor = cluster.compactor()
    assert compactor.run_once()
    proposals = compactor._consensus.proposals  # type: ignore[attr-defined]
    assert compactor.run_once() == []
    cluster.produce(*(batch(record(f"k{i}", "v" * 50)) for i in range(10)))
    assert [r.end_offset for r in compactor.run_once()] == [12]
    cluster.produce(batch(record("k0", "v")))
    assert compactor.run_once() == []
    assert compactor._consensus.proposals == proposals  # type: ignore[attr-defined]
    cluster.close()


def test_compaction_skips_delete_only_topics(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, {"cleanup.policy": "delete"})
    cluster.produce(batch(record("a", "1")), batch(record("a", "2")))
    assert cluster.compactor().run_once() == []
    assert [offset for offset, _, _ in cluster.read()] == [0, 1]
    cluster.close()


def test_key_map_and_drops_are_pure_functions_of_the_batches() -> None:
    config = effective(COMPACT)
    first = batch(record("a", "1"), record("b", "1"))
    second = batch(record("a", "2"))
    key_map = build_key_map([(0, first), (2, second)], 0, config, NOW_MS, 100)
    assert key_map == KeyMap({key_digest(b"a"): 2, key_digest(b"b"): 1}, 3)
    drops, expiry = batch_drops(0, first, key_map, config, NOW_MS)
    assert (drops.base_offset, drops.dropped, expiry) == (0, (0,), None)
    assert drops.work > 0


def test_entries_are_packed_within_apply_s_work_budget() -> None:
    heavy = [BatchDrops(i, (0,), ENTRY_WORK_MAX // 3 + 1) for i in range(7)]
    entries = list(pack_entries([BatchDrops(99, (), 5), *heavy]))
    assert [len(entry) for entry in entries] == [2, 2, 2, 1]
    assert all(sum(d.work for d in entry) <= ENTRY_WORK_MAX for entry in entries)


def test_a_compaction_entry_is_checked_and_bounded_in_apply(tmp_path: Path) -> None:
    """A crafted entry (descending offsets, too many batches) is refused alike on every replica; one
    naming a batch that is not stored skips it; one for a recreated topic does nothing."""
    cluster = Cluster(tmp_path)
    cluster.produce(batch(record("a", "1"), record("a", "2")))
    data = commands.encode(commands.compact("t", 1, 0, [(5, [0]), (0, [0])]))
    result = apply(cluster.leader, cluster.leader.applied_index() + 1, data)
    apply(cluster.follower, cluster.follower.applied_index() + 1, data)
    assert "not after" in getattr(result, "reason", "")
    data = commands.encode(commands.compact("t", 1, 0, [(0, [0]), (7, [0])]))
    result = apply(cluster.leader, cluster.leader.applied_index() + 1, data)
    apply(cluster.follower, cluster.follower.applied_index() + 1, data)
    assert (getattr(result, "records_dropped", None), getattr(result, "batches_skipped", None)) == (1, 1)
    data = commands.encode(commands.compact("t", 2, 0, [(0, [1])]))
    result = apply(cluster.leader, cluster.leader.applied_index() + 1, data)
    apply(cluster.follower, cluster.follower.applied_index() + 1, data)
    assert getattr(result, "records_dropped", None) == 0
    assert cluster.read() == [(1, "a", "2")]
    cluster.close()


@pytest.mark.parametrize("dropped", [[], [3, 2], [10_000]])
def test_malformed_drop_lists_are_refused(tmp_path: Path, dropped: list[int]) -> None:
    cluster = Cluster(tmp_path)
    cluster.produce(batch(record("a", "1")))
    data = commands.encode(commands.compact("t", 1, 0, [(0, dropped)]))
    result = apply(cluster.leader, cluster.leader.applied_index() + 1, data)
    apply(cluster.follower, cluster.follower.applied_index() + 1, data)
    assert getattr(result, "reason", None)
    assert [offset for offset, _, _ in cluster.read()] == [0]
    cluster.close()


def test_a_compacted_batch_keeps_its_header_but_the_count(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    original = batch(record("a", "1"), record("b", "1"), record("a", "2"), compression=GZIP)
    cluster.produce(original)
    cluster.compactor().run_once()
    with cluster.leader.read() as reader:
        (stored,) = reader.batches(1, 0, 0, 1 << 20)
    before, after = read_header(original), read_header(stored.data)
    assert (after.record_count, after.compression) == (2, NONE)
    assert (after.last_offset_delta, after.base_timestamp_ms, after.max_timestamp_ms) == (
        before.last_offset_delta,
        before.base_timestamp_ms,
        before.max_timestamp_ms,
    )
    assert stored.next_offset == 3
    cluster.close()
