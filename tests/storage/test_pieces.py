"""Batches longer than one LMDB page are stored in page-sized pieces: read back whole, counted whole,
and every piece goes with its batch (trim, rewrite, topic purge, copy)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kq.proto.records import NewRecord, encode_batch, with_base_offset
from kq.storage import CorruptRecordError, Store
from kq.storage.store import OVERFLOW_PAGE_HEADER_BYTES
from tests.storage.test_store import copy_into

PAGE_BYTES = 4096  # Linux x86_64 and aarch64 with 4 KiB pages: what CI runs on.


def big_batch(seed: int, records: int = 6, value_bytes: int = 5_000) -> bytes:
    """A batch of incompressible values, several pages long."""
    rng = random.Random(seed)
    return encode_batch(
        [NewRecord(b"k%d" % i, rng.randbytes(value_bytes), (), 100 + i) for i in range(records)]
    )


def rows(store: Store, database: bytes) -> list[tuple[bytes, bytes]]:
    return [(key, value) for name, key, value in store.dump() if name == database]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "store", map_size_bytes=256 * 1024**2)


def test_a_long_batch_is_stored_in_page_sized_pieces_and_read_whole(store: Store) -> None:
    """Each piece fills one overflow page at most; every read returns the batch byte for byte."""
    if store._piece_bytes != PAGE_BYTES - OVERFLOW_PAGE_HEADER_BYTES:
        pytest.skip(f"LMDB page size is not {PAGE_BYTES} here")
    small, long_one = encode_batch([NewRecord(None, b"x", (), 1)]), big_batch(1)
    with store.write() as writer:
        topic = writer.create_topic("t", 1, 0)
        assert writer.append(topic.topic_id, 0, small) == 0
        assert writer.append(topic.topic_id, 0, long_one) == 1
    expected = with_base_offset(long_one, 1)
    pieces = rows(store, b"record_pieces")
    assert len(pieces) == -(-len(expected) // store._piece_bytes) - 1
    assert all(len(value) <= PAGE_BYTES - OVERFLOW_PAGE_HEADER_BYTES for _, value in pieces)
    heads = rows(store, b"records")
    assert [len(value) for _, value in heads] == [len(small), store._piece_bytes]
    with store.read() as reader:
        batches = reader.batches(topic.topic_id, 0, 1, 1 << 20)
        assert [b.data for b in batches] == [expected]
        assert reader.stored_batch(topic.topic_id, 0, 1) == expected
        assert [bytes(v) for _, v in reader.stored_batches(topic.topic_id, 0, 0, 10)] == [small, expected]
        assert [s.size_bytes for s in reader.oldest_batches(topic.topic_id, 0, 10)] == [
            len(small),
            len(expected),
        ]
        state = reader.partition(topic.topic_id, 0)
    assert state is not None and state.size_bytes == len(small) + len(expected)


def test_trim_rewrite_and_purge_delete_every_piece(store: Store) -> None:
    """No piece outlives its batch, whichever way the batch goes; sizes follow the whole batches."""
    with store.write() as writer:
        topic = writer.create_topic("t", 2, 0)
        for seed in range(3):
            writer.append(topic.topic_id, 0, big_batch(seed))
        writer.append(topic.topic_id, 1, big_batch(9))
    with store.write() as writer:
        writer.trim(topic.topic_id, 0, 6, 10)  # The first batch (offsets 0-5) goes.
    with store.read() as reader:
        second = reader.stored_batch(topic.topic_id, 0, 6)
        assert reader.stored_batch(topic.topic_id, 0, 0) is None
    assert second is not None
    keys = {key[:20] for key, _ in rows(store, b"record_pieces")}
    assert len(keys) == 3  # Batches at 6 and 12 of partition 0, and partition 1's.
    shorter = with_base_offset(encode_batch([NewRecord(b"k", b"v", (), 100 + i) for i in range(6)]), 6)
    with store.write() as writer:  # A compaction rewrite to one piece, then a removal.
        freed = writer.rewrite_batch(topic.topic_id, 0, 6, shorter)
        assert freed == len(second) - len(shorter)
        writer.rewrite_batch(topic.topic_id, 0, 12, None)
    with store.read() as reader:
        assert reader.stored_batch(topic.topic_id, 0, 6) == shorter
        state = reader.partition(topic.topic_id, 0)
    assert state is not None and state.size_bytes == len(shorter)
    assert len({key[:20] for key, _ in rows(store, b"record_pieces")}) == 1
    with store.write() as writer:
        assert writer.delete_topic(topic, 10)
    assert rows(store, b"record_pieces") == [] and rows(store, b"records") == []


def test_a_missing_piece_is_reported_as_corruption(store: Store) -> None:
    """A batch short of a piece never reaches a reader."""
    with store.write() as writer:
        topic = writer.create_topic("t", 1, 0)
        writer.append(topic.topic_id, 0, big_batch(3))
    environment, pieces = store._environment, store._databases[b"record_pieces"]
    with environment.begin(write=True) as transaction:
        key = next(iter(transaction.cursor(db=pieces)))[0]
        transaction.delete(key, db=pieces)
    with store.read() as reader, pytest.raises(CorruptRecordError):
        reader.batches(topic.topic_id, 0, 0, 1 << 20)


def test_a_batch_stored_whole_by_an_older_kq_still_reads_and_trims(store: Store) -> None:
    """Stores written before pieces existed hold long batches in one value: read and deleted alike."""
    with store.write() as writer:
        topic = writer.create_topic("t", 1, 0)
        writer.append(topic.topic_id, 0, encode_batch([NewRecord(None, b"x", (), 1)]))
        writer.append(topic.topic_id, 0, big_batch(4))
    whole = with_base_offset(big_batch(4), 1)
    environment, records = store._environment, store._databases[b"records"]
    pieces = store._databases[b"record_pieces"]
    with environment.begin(write=True) as transaction:  # The layout append wrote before pieces.
        transaction.drop(pieces, delete=False)
        transaction.put(rows(store, b"records")[1][0], whole, db=records)
    with store.read() as reader:
        assert [b.data for b in reader.batches(topic.topic_id, 0, 1, 1 << 20)] == [whole]
    with store.write() as writer:
        writer.trim(topic.topic_id, 0, 7, 10)
        state = writer.partition(topic.topic_id, 0)
    assert rows(store, b"records") == [] and state is not None and state.size_bytes == 0


def test_a_copy_carries_the_pieces(store: Store, tmp_path: Path) -> None:
    """A store copy (what a follower receives) holds the pieces and serves the same batches."""
    with store.write() as writer:
        topic = writer.create_topic("t", 1, 0)
        writer.append(topic.topic_id, 0, big_batch(5))
    transaction = store.begin_snapshot()
    try:
        copy_into(store, tmp_path / "copy", transaction)
    finally:
        transaction.abort()
    copy = Store.open(tmp_path / "copy")
    try:
        assert copy.dump() == store.dump()
        with copy.read() as reader:
            assert [b.base_offset for b in reader.batches(topic.topic_id, 0, 0, 1 << 20)] == [0]
    finally:
        copy.close()


def test_a_batch_of_more_pieces_than_the_packed_suffixes_reads_back_whole(store: Store) -> None:
    """A batch past the table of packed piece suffixes (1,024 pieces: ~4 MiB of 4 KiB pages) is stored
    and read back byte for byte, its later pieces keyed as the first ones are."""
    batch = big_batch(2, records=9, value_bytes=500_000)
    assert len(batch) > 1_030 * store._piece_bytes
    with store.write() as writer:
        topic = writer.create_topic("t", 1, 0)
        writer.append(topic.topic_id, 0, batch)
    assert len(rows(store, b"record_pieces")) == -(-len(batch) // store._piece_bytes) - 1
    with store.read() as reader:
        assert reader.stored_batch(topic.topic_id, 0, 0) == with_base_offset(batch, 0)
