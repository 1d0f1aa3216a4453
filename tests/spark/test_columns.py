"""The Spark source's columnar decoding (spark/columns.py) against the Python walk it stands in for.

Both must give the same rows, the same next offset and the same errors, on generated fetches (every
codec, LogAppendTime, compacted batches, one- to three-byte varints, nulls, headers) and on fetches
corrupted after their CRC was computed again, so that every corruption reaches the record checks.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kq.client.client import RECORDS_UNCUT, decode_batches
from kq.proto.compression import CODECS, NONE
from kq.proto.records import (
    BATCH_HEADER_BYTES,
    MalformedBatchError,
    NewRecord,
    WorkMeter,
    compacted_batch,
    encode_batch,
    with_base_offset,
    with_log_append_time,
)
from kq.spark.columns import decode_columns, fetched_rows
from kq.spark.schema import arrow_schema, record_batch
from tests.storage.batches import BASE_TIME_MS, restamped
from tests.storage.batches import records as batch_records

TOPIC, PARTITION = "t", 3
SCHEMA = arrow_schema(include_headers=True, served_by=True)

records = batch_records(with_headers=False)


@st.composite
def batch_specs(draw: st.DrawFn) -> tuple[list[NewRecord], int, bool, frozenset[int]]:
    """A batch's records, codec, LogAppendTime or not, and which offsetDeltas compaction drops."""
    batch = draw(st.lists(records, min_size=1, max_size=12))
    codec = draw(st.sampled_from(sorted(CODECS.values())))
    dropped = draw(st.frozensets(st.integers(0, len(batch) - 1), max_size=len(batch) - 1))
    return batch, codec, draw(st.booleans()), dropped


def build_fetch(specs: list[tuple[list[NewRecord], int, bool, frozenset[int]]], first: int) -> list[bytes]:
    """Stored batches as a node serves them: consecutive base offsets from `first`."""
    served, base = [], first
    for batch, codec, append_time, dropped in specs:
        data = encode_batch(batch, codec, base_timestamp_ms=BASE_TIME_MS)
        if append_time:
            data = with_log_append_time(data, BASE_TIME_MS + 5)
        compacted = compacted_batch(data, dropped, WorkMeter(2**40)).data if dropped else None
        served.append(with_base_offset(compacted or data, base))
        base += len(batch)
    return served


def walked(batches: list[bytes], offset: int, limit: int) -> tuple[pa.RecordBatch | None, int]:
    """What the Python walk (the client's decoding) gives, as rows."""
    decoded, next_offset = decode_batches(TOPIC, PARTITION, batches, offset, limit)
    return (record_batch(decoded, SCHEMA, True, "2") if decoded else None), next_offset


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(batch_specs(), min_size=1, max_size=4),
    st.integers(0, 5),
    st.integers(1, 60),
    st.booleans(),
)
def test_columns_give_the_rows_of_the_python_walk(
    specs: list[tuple[list[NewRecord], int, bool, frozenset[int]]], skip: int, limit: int, uncut: bool
) -> None:
    """Same rows and next offset from any offset in the first batch and any limit; without headers the
    columnar path decides (it is not the walk answering for it)."""
    first = 1_000
    batches = build_fetch(specs, first)
    offset, limit = first + skip, RECORDS_UNCUT if uncut else limit
    rows, next_offset = fetched_rows(TOPIC, PARTITION, batches, offset, limit, SCHEMA, True, "2")
    expected_rows, expected_next = walked(batches, offset, limit)
    assert next_offset == expected_next
    if expected_rows is None:
        assert rows is None
    else:
        assert rows is not None and rows.equals(expected_rows)
    assert decode_columns(batches, offset, limit) is not None


def test_a_record_with_headers_is_left_to_the_walk() -> None:
    """Headers are decoded by the walk (the columnar path declines the fetch); rows are the same."""
    batch = encode_batch([NewRecord(b"k", b"v", (("h", b"1"),)), NewRecord(None, b"w")], NONE)
    assert decode_columns([batch], 0, RECORDS_UNCUT) is None
    rows, next_offset = fetched_rows(TOPIC, PARTITION, [batch], 0, RECORDS_UNCUT, SCHEMA, True, "2")
    assert next_offset == 2 and rows is not None
    assert rows.column("headers").to_pylist() == [[{"key": "h", "value": b"1"}], []]


def test_no_batches_is_no_rows() -> None:
    """An empty fetch: no rows, and the next fetch starts where this one did."""
    assert fetched_rows(TOPIC, PARTITION, [], 42, 10, SCHEMA, True, None) == (None, 42)


def outcome(decode: Callable[[], object]) -> tuple[str, object]:
    """("rows", what `decode` returned) or ("error", the MalformedBatchError's message)."""
    try:
        return ("rows", decode())
    except MalformedBatchError as error:
        return ("error", str(error))


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    st.integers(0, 2),
)
def test_corrupted_records_are_refused_as_the_walk_refuses_them(
    flips: list[tuple[int, int]], cut: int
) -> None:
    """Bytes of the records changed (and the CRC made right again), or the batch cut short: the
    columnar path either declines (the walk then decides) or agrees with the walk exactly."""
    batch = [
        NewRecord(b"key", b"v" * 70, timestamp_ms=BASE_TIME_MS + 3),
        NewRecord(None, b"", timestamp_ms=BASE_TIME_MS - 1),
        NewRecord(b"k" * 13, None, timestamp_ms=BASE_TIME_MS + 2**20),
    ]
    data = bytearray(encode_batch(batch, NONE, base_timestamp_ms=BASE_TIME_MS))
    for at, value in flips:
        data[BATCH_HEADER_BYTES + at % (len(data) - BATCH_HEADER_BYTES)] = value
    if cut:
        del data[len(data) - cut :]
        struct.pack_into(">i", data, 8, len(data) - 12)  # batchLength, so only the records are short.
    fetch = [restamped(data)]
    walk = outcome(lambda: decode_batches(TOPIC, PARTITION, fetch, 0, RECORDS_UNCUT))
    if decode_columns(fetch, 0, RECORDS_UNCUT) is None:
        return  # Declined: the walk decides, as fetched_rows does.
    assert walk[0] == "rows", f"the columns accepted what the walk refuses: {walk}"
    rows, next_offset = fetched_rows(TOPIC, PARTITION, fetch, 0, RECORDS_UNCUT, SCHEMA, True, "2")
    expected_rows, expected_next = walked(fetch, 0, RECORDS_UNCUT)
    assert next_offset == expected_next and rows is not None and rows.equals(expected_rows)


@pytest.mark.parametrize("offset", [0, 1, 2, 3])
def test_offsets_before_the_fetch_offset_are_dropped(offset: int) -> None:
    """A first batch starting before the offset asked for gives only the records from it on."""
    batch = encode_batch([NewRecord(None, bytes([n])) for n in range(3)], NONE)
    schema = arrow_schema(include_headers=False, served_by=False)
    rows, next_offset = fetched_rows(TOPIC, PARTITION, [batch], offset, RECORDS_UNCUT, schema, False, None)
    assert next_offset == 3
    assert (rows.column("offset").to_pylist() if rows is not None else []) == list(range(offset, 3))


def test_a_malformed_batch_raises_the_walks_error() -> None:
    """A batch whose bytes do not match its CRC fails the read with the walk's error."""
    data = bytearray(encode_batch([NewRecord(b"k", b"v")], NONE))
    data[-1] ^= 0xFF
    with pytest.raises(MalformedBatchError, match="CRC32C mismatch"):
        fetched_rows(TOPIC, PARTITION, [bytes(data)], 0, RECORDS_UNCUT, SCHEMA, True, None)
