"""Leader epochs in the store (KIP-101): stamped in each appended batch's partitionLeaderEpoch (outside
its CRC), recorded per partition only when they rise, never going down, trimmed with the log, purged
with the topic, bounded per partition; and the pure OffsetForLeaderEpoch rule over them."""

from __future__ import annotations

from pathlib import Path

import pytest

from kq.proto.records import NewRecord, encode_batch, parse_batch, read_header
from kq.raft.epochs import end_offset_for, epoch_at
from kq.storage import Store
from kq.storage import store as store_module


def batch(value: bytes) -> bytes:
    """A producer's RecordBatch v2 of one record (partitionLeaderEpoch -1, as producers send)."""
    return encode_batch([NewRecord(None, value, (), 100)])


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)


def test_epochs_are_stamped_recorded_on_a_rise_and_never_go_down(store: Store) -> None:
    """Epoch 0 (an entry from before epochs) stamps and records nothing; 3, 3, 5 record two rows; a
    stale 4 after 5 is stamped 5; every stamped batch still passes its CRC check."""
    with store.write() as writer:
        topic = writer.create_topic("t", 1, 5)
        for epoch in (0, 3, 3, 5, 4):
            writer.append(topic.topic_id, 0, batch(b"v"), epoch)
    with store.read() as reader:
        assert reader.leader_epochs(topic.topic_id, 0) == [(3, 1), (5, 3)]
        assert reader.latest_leader_epoch(topic.topic_id, 0) == 5
        stored = reader.batches(topic.topic_id, 0, 0, 1 << 20)
    assert [read_header(b.data).partition_leader_epoch for b in stored] == [-1, 3, 3, 5, 5]
    for stored_batch in stored:
        assert [r.value for r in parse_batch(stored_batch.data)] == [b"v"]  # CRC still valid.


def test_trim_drops_epochs_wholly_below_the_log_start_and_purge_drops_all(store: Store) -> None:
    with store.write() as writer:
        topic = writer.create_topic("t", 1, 5)
        for epoch in (1, 2, 3, 4):
            writer.append(topic.topic_id, 0, batch(b"v"), epoch)
        writer.trim(topic.topic_id, 0, 2, 100)
    with store.read() as reader:
        assert reader.leader_epochs(topic.topic_id, 0) == [(3, 2), (4, 3)]
    with store.write() as writer:
        meta = writer.topic("t")
        assert meta is not None
        writer.delete_topic(meta, 100)
    with store.read() as reader:
        assert reader.leader_epochs(topic.topic_id, 0) == []
        assert reader.latest_leader_epoch(topic.topic_id, 0) is None


def test_a_partition_keeps_a_bounded_number_of_epochs(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "LEADER_EPOCHS_PER_PARTITION_MAX", 3)
    with store.write() as writer:
        topic = writer.create_topic("t", 2, 5)
        writer.append(topic.topic_id, 1, batch(b"other"), 9)
        for epoch in range(1, 7):
            writer.append(topic.topic_id, 0, batch(b"v"), epoch)
    with store.read() as reader:
        assert reader.leader_epochs(topic.topic_id, 0) == [(4, 3), (5, 4), (6, 5)]
        assert reader.leader_epochs(topic.topic_id, 1) == [(9, 0)]


def test_end_offset_for_follows_kafkas_leader_epoch_cache() -> None:
    """The current epoch ends at the log end; an older one at the next appended epoch's start; an
    epoch between appended ones answers the one below it; unknown and future ones are undefined."""
    epochs = [(3, 0), (5, 10), (8, 20)]
    assert end_offset_for(epochs, 9, 9, 30) == (9, 30)
    assert end_offset_for(epochs, 9, 8, 30) == (8, 30)
    assert end_offset_for(epochs, 9, 5, 30) == (5, 20)
    assert end_offset_for(epochs, 9, 4, 30) == (3, 10)
    assert end_offset_for(epochs, 9, 2, 30) == (2, 0)
    assert end_offset_for(epochs, 9, 10, 30) == (-1, -1)
    assert end_offset_for(epochs, 9, -1, 30) == (-1, -1)
    assert end_offset_for([], 4, 2, 7) == (2, 7)
    assert [epoch_at(epochs, offset) for offset in (0, 9, 10, 25)] == [3, 3, 5, 8]
    assert epoch_at([], 3) == -1
