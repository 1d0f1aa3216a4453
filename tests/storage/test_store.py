"""The LMDB store: appends and reads, fetch size rules, corruption detected on read, copy and replace."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import CorruptRecordError, NewRecord, Store
from storage.records import TIMESTAMP_CREATE_TIME


def record(value: bytes, key: bytes | None = None) -> NewRecord:
    return NewRecord(1_700_000_000_000, TIMESTAMP_CREATE_TIME, key, value, (("h", b"1"),))


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)
    with store.write() as writer:
        topic = writer.create_topic("t", 2, 5)
        writer.append(topic.topic_id, 0, [record(b"a", b"k"), record(b"b")])
        writer.append(topic.topic_id, 1, [record(b"c")])
        writer.append(topic.topic_id, 0, [record(b"d")])
    return store


def test_records_round_trip_in_order_per_partition(store: Store) -> None:
    """Records come back with their offsets, keys, values and headers, partition by partition."""
    with store.read() as reader:
        zero = reader.records(1, 0, 0, 100, 1 << 20)
        one = reader.records(1, 1, 0, 100, 1 << 20)
        state = reader.partition(1, 0)
    assert [(r.offset, r.key, r.value, r.headers) for r in zero] == [
        (0, b"k", b"a", (("h", b"1"),)),
        (1, None, b"b", (("h", b"1"),)),
        (2, None, b"d", (("h", b"1"),)),
    ]
    assert [(r.offset, r.value) for r in one] == [(0, b"c")]
    assert state is not None and (state.log_start_offset, state.log_end_offset) == (0, 3)


def test_fetch_limits_count_and_bytes_but_always_return_one(store: Store) -> None:
    """max_records and max_bytes cut a read; a single record larger than max_bytes still comes back."""
    with store.read() as reader:
        assert [r.offset for r in reader.records(1, 0, 1, 1, 1 << 20)] == [1]
        assert [r.offset for r in reader.records(1, 0, 0, 100, 1)] == [0]
        assert reader.records(1, 0, 3, 100, 1 << 20) == []


def test_corrupted_stored_record_is_never_served(store: Store, tmp_path: Path) -> None:
    """A bit flipped inside LMDB is reported as CorruptRecordError on read."""
    environment = store._environment
    records_db = store._databases[b"records"]
    with environment.begin(write=True) as transaction:
        key = next(iter(transaction.cursor(db=records_db)))[0]
        raw = bytearray(transaction.get(key, db=records_db))
        raw[-3] ^= 0xFF
        transaction.put(key, bytes(raw), db=records_db)
    with store.read() as reader, pytest.raises(CorruptRecordError):
        reader.records(1, 0, 0, 100, 1 << 20)


def test_compact_copy_replaces_another_store_exactly(store: Store, tmp_path: Path) -> None:
    """A compact copy taken in a read transaction, loaded into another store, reproduces it byte for byte."""
    transaction = store.begin_snapshot()
    store.copy_to(tmp_path / "copy", transaction)
    transaction.abort()
    copy = Store.open(tmp_path / "copy", map_size_bytes=64 * 1024**2)
    other = Store.open(tmp_path / "other", map_size_bytes=64 * 1024**2)
    with other.write() as writer:
        writer.create_topic("stale", 1, 0)
    other.replace_with(copy)
    assert other.dump() == store.dump()
