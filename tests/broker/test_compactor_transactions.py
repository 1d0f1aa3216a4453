"""Compaction and transactions (pure): an aborted transaction's records supersede nothing and are
dropped whole, a marker is kept, as Kafka's cleaner does."""

from __future__ import annotations

from kq.broker.compactor import aborted_ranges, batch_drops, build_key_map, key_digest
from kq.proto.records import (
    TRANSACTIONAL_FLAG,
    NewRecord,
    assemble_batch,
    control_batch,
    encode_batch,
    encode_record,
    read_header,
    with_base_offset,
)
from kq.raft.topic_config import effective
from kq.storage.transactions import AbortedTransaction

CONFIG = effective({"cleanup.policy": "compact"}, {})
NOW_MS = 10_000


def _transactional(producer_id: int, key: bytes, value: bytes) -> bytes:
    record = encode_record(NewRecord(key, value, timestamp_ms=1), 0, 0)
    return assemble_batch(record, 1, 1, 1, 0, producer_id, 0, 0, attributes=TRANSACTIONAL_FLAG)


def test_an_aborted_transaction_neither_supersedes_nor_survives_and_its_marker_stays() -> None:
    """k=v1 committed at 0; an aborted write k=v2 at 1 (its marker at 2): v1 stays the newest of k, the
    aborted batch is dropped whole, the marker is kept."""
    committed = with_base_offset(encode_batch([NewRecord(b"k", b"v1", timestamp_ms=1)]), 0)
    aborted_write = with_base_offset(_transactional(7, b"k", b"v2"), 1)
    marker = with_base_offset(control_batch(7, 0, False, 0, 1), 2)
    batches = [(0, committed), (1, aborted_write), (2, marker)]
    aborted = aborted_ranges([AbortedTransaction(7, 1, 2)])
    assert aborted(read_header(aborted_write)) and not aborted(read_header(committed))
    key_map = build_key_map(batches, 0, CONFIG, NOW_MS, 100, aborted)
    assert key_map.latest == {key_digest(b"k"): 0} and key_map.end_offset == 3
    drops = [batch_drops(base, data, key_map, CONFIG, NOW_MS, aborted)[0].dropped for base, data in batches]
    assert drops == [(), (0,), ()]
