"""The LMDB store: batches appended and read by offset, size rules, corruption detected, copy and replace."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import lmdb
import pytest

from kq.proto.records import NewRecord, encode_batch, parse_batch, with_base_offset
from kq.storage import CorruptRecordError, PartitionState, ProducerAppend, ProducerWindow, Store
from kq.storage.store import PRODUCER_APPENDS_KEPT, _producer_row, _producer_window


def batch(*values: bytes, timestamp_ms: int = 100) -> bytes:
    """A RecordBatch v2 of `values`, as a producer sends it (base offset 0)."""
    return encode_batch([NewRecord(None, value, (), timestamp_ms) for value in values])


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)
    with store.write() as writer:
        topic = writer.create_topic("t", 2, 5)
        writer.append(topic.topic_id, 0, batch(b"a", b"b", timestamp_ms=100))
        writer.append(topic.topic_id, 1, batch(b"c", timestamp_ms=101))
        writer.append(topic.topic_id, 0, batch(b"d", timestamp_ms=102))
    return store


def test_batches_come_back_in_order_per_partition(store: Store) -> None:
    """Batches come back as sent but for their stamped base offset, with counts and max timestamps."""
    with store.read() as reader:
        zero = reader.batches(1, 0, 0, 1 << 20)
        one = reader.batches(1, 1, 0, 1 << 20)
        state = reader.partition(1, 0)
    assert [(b.base_offset, b.record_count, b.max_timestamp_ms) for b in zero] == [(0, 2, 100), (2, 1, 102)]
    assert zero[0].data == batch(b"a", b"b")  # Base offset 0: byte for byte what the producer sent.
    assert zero[1].data == with_base_offset(batch(b"d", timestamp_ms=102), 2)
    assert [r.value for r in parse_batch(zero[1].data)] == [b"d"]
    assert [(b.base_offset, b.data) for b in one] == [(0, batch(b"c", timestamp_ms=101))]
    assert state is not None and (state.log_start_offset, state.log_end_offset) == (0, 3)
    assert state.size_bytes == len(zero[0].data) + len(zero[1].data)


def test_read_starts_at_the_batch_holding_the_offset(store: Store) -> None:
    """An offset inside a batch returns that batch; the log end returns nothing; bytes cut the read."""
    with store.read() as reader:
        assert [b.base_offset for b in reader.batches(1, 0, 1, 1 << 20)] == [0, 2]
        assert [b.base_offset for b in reader.batches(1, 0, 2, 1 << 20)] == [2]
        assert reader.batches(1, 0, 3, 1 << 20) == []
        assert reader.batches(1, 1, 1, 1 << 20) == []
        assert [b.base_offset for b in reader.batches(1, 0, 0, 1)] == [0]


def test_a_read_stops_once_its_batches_hold_the_records_asked_for(store: Store) -> None:
    """`max_records` counts the records from the offset on (at least one batch is read): a fetch of a few
    records does not read (and check) a whole `max_bytes` of batches it will not serve."""
    with store.read() as reader:
        assert [b.base_offset for b in reader.batches(1, 0, 0, 1 << 20, max_records=2)] == [0]
        assert [b.base_offset for b in reader.batches(1, 0, 0, 1 << 20, max_records=3)] == [0, 2]
        assert [b.base_offset for b in reader.batches(1, 0, 1, 1 << 20, max_records=1)] == [0]
        assert [b.base_offset for b in reader.batches(1, 0, 1, 1 << 20, max_records=2)] == [0, 2]
        assert [b.base_offset for b in reader.batches(1, 0, 0, 1 << 20, max_records=0)] == [0]


def test_trim_deletes_whole_batches_below_the_new_start(store: Store) -> None:
    """Trimming inside a batch keeps that batch; trimming past it deletes it."""
    with store.write() as writer:
        assert writer.trim(1, 0, 1, 100) == 1
    with store.read() as reader:
        assert [b.base_offset for b in reader.batches(1, 0, 1, 1 << 20)] == [0, 2]
    with store.write() as writer:
        writer.trim(1, 0, 2, 100)
    with store.read() as reader:
        state = reader.partition(1, 0)
        assert [b.base_offset for b in reader.batches(1, 0, 2, 1 << 20)] == [2]
    assert state is not None and state.log_start_offset == 2


def test_corrupted_stored_batch_is_never_served(store: Store) -> None:
    """A bit flipped inside LMDB is reported as CorruptRecordError on read."""
    environment = store._environment
    records_db = store._databases[b"records"]
    with environment.begin(write=True) as transaction:
        key = next(iter(transaction.cursor(db=records_db)))[0]
        raw = bytearray(transaction.get(key, db=records_db))
        raw[-3] ^= 0xFF
        transaction.put(key, bytes(raw), db=records_db)
    with store.read() as reader, pytest.raises(CorruptRecordError):
        reader.batches(1, 0, 0, 1 << 20)


def test_producer_windows_keep_the_last_appends_of_one_epoch(store: Store) -> None:
    """A partition remembers a producer's last five appends in its epoch; a new epoch starts over."""
    with store.write() as writer:
        for sequence in range(7):
            writer.remember_producer_append(
                3,
                1,
                0,
                0,
                ProducerAppend(sequence, 1, 10 + sequence),
                writer.producer_window(3, 1, 0),
                appended_ms=5,
            )
        window = writer.producer_window(3, 1, 0)
        assert window is not None and window.epoch == 0
        assert [a.first_sequence for a in window.appends] == [2, 3, 4, 5, 6]
        writer.remember_producer_append(3, 1, 0, 1, ProducerAppend(0, 4, 20), window, appended_ms=7)
        assert writer.producer_window(3, 1, 0) == type(window)(1, (ProducerAppend(0, 4, 20),), 7)
        assert writer.producer_window(3, 1, 1) is None


def test_producer_rows_are_the_fields_back_to_back_whatever_the_count() -> None:
    """A `producers` row packed in one call (up to PRODUCER_APPENDS_KEPT appends) is the epoch, the
    count, each append and the time, field after field, as the row was always laid out; more appends
    than that (a row no apply writes) fall back to the same layout; each reads back as written."""
    for count in range(PRODUCER_APPENDS_KEPT + 3):
        appends = [ProducerAppend(7 * i, i + 1, 2**40 + i) for i in range(count)]
        laid_out = (
            struct.pack(">HB", 3, count)
            + b"".join(struct.pack(">IIQ", *a) for a in appends)
            + struct.pack(">q", -5)
        )
        assert _producer_row(3, appends, -5) == laid_out
        assert _producer_window(laid_out) == ProducerWindow(3, tuple(appends), -5)


def test_an_append_at_a_taken_offset_fails_and_writes_nothing(store: Store) -> None:
    """The base offset comes from the partition's state; a row already there (a state that went
    wrong) stops the append before any byte of the new batch is written, and the transaction is
    aborted: the stored batch and the partition's state stay as they were."""
    before = store.dump()
    with pytest.raises(AssertionError, match="already taken"), store.write() as writer:
        writer._put_partition(1, 0, PartitionState(0, 0, 0))  # Pretends the partition is empty.
        writer.append(1, 0, batch(b"x" * 10_000))  # Pieces too: none may be written.
    assert store.dump() == before


def test_a_write_commits_when_its_block_ends_and_aborts_when_it_raises(store: Store) -> None:
    """`Store.write()`: the applied index a block sets is there after it, not after one that raised;
    inside the block the writer reads the index it set."""
    with store.write() as writer:
        writer.set_applied_index(5)
        assert writer.applied_index() == 5
    with pytest.raises(RuntimeError), store.write() as writer:
        writer.set_applied_index(9)
        raise RuntimeError("stop")
    assert store.applied_index() == 5
    with store.write() as writer, pytest.raises(AssertionError):
        writer.set_applied_index(5)  # Never backwards, nor twice.


def test_copy_replaces_another_store_exactly(store: Store, tmp_path: Path) -> None:
    """A copy taken in a read transaction, loaded into another store, reproduces it byte for byte."""
    expected = store.dump()
    transaction = store.begin_snapshot()
    with store.write() as writer:  # Written after the transaction began: not in the copy.
        writer.create_topic("later", 1, 0)
    copy_into(store, tmp_path / "copy", transaction)
    transaction.abort()
    copy = Store.open(tmp_path / "copy", map_size_bytes=64 * 1024**2)
    other = Store.open(tmp_path / "other", map_size_bytes=64 * 1024**2)
    with other.write() as writer:
        writer.create_topic("stale", 1, 0)
    other.replace_with(copy)
    assert other.dump() == copy.dump() == expected


def test_a_copy_into_a_closed_pipe_stops_with_an_error(store: Store) -> None:
    """Shutdown during a copy closes the pipe the copy is written into (raft/snapshot.py): LMDB's
    copy then stops with an error instead of running to its end."""
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    transaction = store.begin_snapshot()
    try:
        with pytest.raises(lmdb.Error, match="Broken pipe"):
            store.copy_to_fd(write_fd, transaction)
    finally:
        transaction.abort()
        os.close(write_fd)


def copy_into(store: Store, directory: Path, transaction: Any) -> None:
    """`store` as `transaction` sees it, as a new environment in `directory` (what a follower restores)."""
    directory.mkdir()
    with (directory / "data.mdb").open("wb") as file:
        store.copy_to_fd(file.fileno(), transaction)
