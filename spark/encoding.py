"""Arrow rows encoded into RecordBatch v2 batches as arrays: the sink's common case without a Python
step per row.

The sink's row-by-row encoder (`sink._Encoder`) spent about 14 µs of an executor's CPU a row:
Kafka's murmur2 of each key in Python, a `NewRecord` and its encoding, the row's bookkeeping. For an
Arrow batch of at least SPARK_WRITE_ARRAYS_ROWS_MIN rows to one topic, with a `value` column and
maybe a `key` column (binary or string) and nothing else, this module does the same with numpy and
Arrow's C++: the keys' murmur2 as arrays (one pass a 4-byte word of the keys of each length), each
record's small fields (length, attributes, timestamp and offset deltas, key and value lengths, no
headers) written into arrays, and each record joined from them, its key and its value by Arrow's
`binary_join_element_wise`, so the records of a piece are one contiguous buffer.

The records are byte for byte those `records.encode_record` writes (tests/spark/test_encoding.py
compares them, and murmur2 with `client.partitioner.murmur2`), and the rows go to the partitions
the row encoder picks: by key, else one partition per Arrow batch, rotating. A batch with a row the
row encoder would refuse (a record over RECORD_BYTES_MAX) is left to it, which names the row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from kq.proto.compression import NONE
from kq.proto.limits import RECORD_BYTES_MAX, RECORDS_PER_APPEND_MAX, SPARK_WRITE_BATCH_BYTES
from kq.proto.records import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, assemble_batch

Ints = npt.NDArray[np.int64]
Words = npt.NDArray[np.uint32]

_MURMUR_SEED = np.uint32(0x9747B28C)
_MURMUR_M = np.uint32(0x5BD1E995)
_VARINT_BYTES_MAX = 5  # Every varint written here is an int32 (lengths, offset deltas).
_NO_HEADERS = b"\x00"  # A record's header count, 0, as a varint.
_NOTHING = pa.scalar(b"", pa.binary())  # Between a record's parts.


@dataclass(slots=True)
class EncodedBatch:
    """A piece's records, encoded back to back: what `KqClient.produce_batch` builds a batch from (as
    from a `BatchBuilder`), with the producer fields it stamps per request."""

    records: bytes | memoryview  # A view of Arrow's buffer: `build` copies it into the batch once.
    record_count: int
    timestamp_ms: int  # Every record's (CreateTime): the batch's base and max timestamp.

    def build(
        self,
        compression: int = NONE,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        base_sequence: int = NO_SEQUENCE,
    ) -> bytes:
        """The batch: header, CRC, `compression` applied."""
        return assemble_batch(
            self.records,
            self.record_count,
            self.timestamp_ms,
            self.timestamp_ms,
            compression,
            producer_id,
            producer_epoch,
            base_sequence,
        )


@dataclass(frozen=True, slots=True)
class Chunk:
    """Consecutive rows of one partition (positions in the Arrow batch, in row order), encoded."""

    partition: int
    rows: Ints
    batch: EncodedBatch
    size: int  # Its records' bytes.


def binary_column(batch: pa.RecordBatch, name: str) -> pa.Array:
    """The column as plain binary: strings are their UTF-8 bytes (a cast that keeps the buffers)."""
    column = batch.column(name)
    return column if pa.types.is_binary(column.type) else column.cast(pa.binary())


def encode_rows(
    keys: pa.Array | None,
    values: pa.Array,
    partitions: int,
    sticky_partition: Callable[[], int],
    now_ms: int,
) -> list[Chunk] | None:
    """The rows as chunks of at most SPARK_WRITE_BATCH_BYTES and RECORDS_PER_APPEND_MAX records per
    partition, in row order within each partition; None if a row's record is over RECORD_BYTES_MAX
    (the row encoder then names it). Rows with a key go to Kafka's murmur2 partition of it, the others
    to `sticky_partition()` (asked once, only if there is such a row)."""
    count = len(values)
    key_lengths = _lengths(keys) if keys is not None else np.full(count, -1, np.int64)
    value_lengths = _lengths(values)
    sizes = np.maximum(key_lengths, 0) + np.maximum(value_lengths, 0)
    if count == 0 or int(sizes.max()) > RECORD_BYTES_MAX:
        return None
    chosen = np.zeros(count, np.int64)
    keyed = key_lengths >= 0
    if keys is not None and keyed.any():
        chosen[keyed] = (murmur2_of(keys, key_lengths, keyed) & 0x7FFFFFFF) % partitions
    if not keyed.all():
        chosen[~keyed] = sticky_partition()
    chunks: list[Chunk] = []
    order = np.argsort(chosen, kind="stable")  # Rows grouped by partition, in row order in each.
    bounds = np.flatnonzero(np.diff(chosen[order])) + 1
    for rows in np.split(order, bounds):
        chunks += _chunks(int(chosen[rows[0]]), rows, keys, values, key_lengths, value_lengths, now_ms)
    return chunks


def _lengths(column: pa.Array) -> Ints:
    """Each row's byte length, -1 where null."""
    offsets = np.frombuffer(column.buffers()[1], np.int32, len(column) + 1, column.offset * 4)
    lengths = np.diff(offsets).astype(np.int64)
    if column.null_count:
        lengths[column.is_null().to_numpy(zero_copy_only=False)] = -1
    return lengths


def murmur2_of(keys: pa.Array, lengths: Ints, keyed: npt.NDArray[np.bool_]) -> Ints:
    """Kafka's murmur2 (`Utils.murmur2`, as an unsigned 32-bit value) of each keyed row's key, as arrays:
    the keys of each length together, one pass a 4-byte word."""
    held = keys.buffers()[2]
    data = np.frombuffer(held, np.uint8) if held is not None else np.zeros(0, np.uint8)
    starts = np.frombuffer(keys.buffers()[1], np.int32, len(keys) + 1, keys.offset * 4)[:-1].astype(np.int64)
    rows = np.flatnonzero(keyed)
    hashes = np.zeros(len(rows), np.uint32)
    for length in np.unique(lengths[rows]):
        same = lengths[rows] == length
        hashes[same] = _murmur2(data, starts[rows[same]], int(length))
    return hashes.astype(np.int64)


def _murmur2(data: npt.NDArray[np.uint8], starts: Ints, length: int) -> Words:
    """murmur2 of the `length`-byte keys at `starts` in `data` (uint32 arithmetic wraps, as Java's int)."""
    with np.errstate(over="ignore"):
        h = np.full(len(starts), _MURMUR_SEED ^ np.uint32(length), np.uint32)
        whole = length - length % 4
        for at in range(0, whole, 4):
            k = (
                data[starts + at].astype(np.uint32)
                | (data[starts + at + 1].astype(np.uint32) << 8)
                | (data[starts + at + 2].astype(np.uint32) << 16)
                | (data[starts + at + 3].astype(np.uint32) << 24)
            )
            k = k * _MURMUR_M
            k ^= k >> 24
            k = k * _MURMUR_M
            h = h * _MURMUR_M
            h ^= k
        remainder = length % 4
        if remainder == 3:
            h ^= data[starts + whole + 2].astype(np.uint32) << 16
        if remainder >= 2:
            h ^= data[starts + whole + 1].astype(np.uint32) << 8
        if remainder >= 1:
            h ^= data[starts + whole].astype(np.uint32)
            h = h * _MURMUR_M
        h ^= h >> 13
        h = h * _MURMUR_M
        h ^= h >> 15
    return h


def _chunks(
    partition: int,
    rows: Ints,
    keys: pa.Array | None,
    values: pa.Array,
    key_lengths: Ints,
    value_lengths: Ints,
    now_ms: int,
) -> list[Chunk]:
    """One partition's rows cut into requests, each encoded."""
    sizes = _record_sizes(key_lengths[rows], value_lengths[rows], np.arange(len(rows)))
    chunks: list[Chunk] = []
    start = 0
    cumulative = np.cumsum(sizes)
    while start < len(rows):
        before = int(cumulative[start - 1]) if start else 0
        stop = int(np.searchsorted(cumulative, before + SPARK_WRITE_BATCH_BYTES, side="right"))
        stop = min(max(stop, start + 1), start + RECORDS_PER_APPEND_MAX)
        chosen = rows[start:stop]
        records = _records(chosen, keys, values, key_lengths[chosen], value_lengths[chosen])
        batch = EncodedBatch(records, len(chosen), now_ms)
        chunks.append(Chunk(partition, chosen, batch, len(records)))
        start = stop
    return chunks


def _record_sizes(key_lengths: Ints, value_lengths: Ints, offset_deltas: Ints) -> Ints:
    """Each record's encoded size, its length varint included (timestamp delta 0: one byte)."""
    body = _body_sizes(key_lengths, value_lengths, offset_deltas)
    return body + _varint_sizes(body)


def _body_sizes(key_lengths: Ints, value_lengths: Ints, offset_deltas: Ints) -> Ints:
    """What a record's length varint counts: attributes, timestamp delta (0), offset delta, key and value
    (lengths and bytes), header count."""
    return (
        2
        + _varint_sizes(offset_deltas)
        + _varint_sizes(key_lengths)
        + np.maximum(key_lengths, 0)
        + _varint_sizes(value_lengths)
        + np.maximum(value_lengths, 0)
        + 1
    )


def _zigzag(values: Ints) -> Ints:
    """Kafka's zigzag encoding of each value (non-negative)."""
    return (values << 1) ^ (values >> 63)


def _varint_sizes(values: Ints) -> Ints:
    """Bytes of each value's zigzag varint."""
    raw = _zigzag(values)
    size = np.ones(len(values), np.int64)
    for shift in (7, 14, 21, 28):
        size += raw >= (1 << shift)
    return size


def _records(
    rows: Ints, keys: pa.Array | None, values: pa.Array, key_lengths: Ints, value_lengths: Ints
) -> memoryview:
    """The records of `rows`, back to back: per row its head (length, attributes 0, timestamp delta 0,
    offset delta, key length), key, value length, value and header count (0), joined by Arrow.

    Each varint is taken from a table of them (`_VARINTS`) when every one of a field's fits (lengths
    and deltas below 32 KiB: the common case); else written byte by byte (`_varint_column`)."""
    count = len(rows)
    deltas = np.arange(count, dtype=np.int64)
    body = _body_sizes(key_lengths, value_lengths, deltas)
    indices = pa.array(rows)
    taken_values = _rows_of(values, rows, indices)
    taken_keys = _rows_of(keys, rows, indices) if keys is not None else _NOTHING
    tabled = [_tabled(field) for field in (body, key_lengths, value_lengths)]
    if count <= len(_DELTA_VARINTS) and all(column is not None for column in tabled):
        body_varints, key_length_varints, value_length_varints = tabled
        joined = pc.binary_join_element_wise(
            body_varints,
            _ZERO_ATTRIBUTES_AND_TIMESTAMP,
            _DELTA_VARINTS.slice(0, count),
            key_length_varints,
            taken_keys,
            value_length_varints,
            taken_values,
            _NO_HEADERS_SCALAR,
            _NOTHING,
            null_handling="replace",
            null_replacement="",
        )
        return _joined_bytes(joined)
    head = _varint_column([body, None, np.zeros(count, np.int64), deltas, key_lengths])
    middle = _varint_column([value_lengths])
    tail = _no_headers(count)
    joined = pc.binary_join_element_wise(
        head, taken_keys, middle, taken_values, tail, _NOTHING, null_handling="replace", null_replacement=""
    )
    return _joined_bytes(joined)


def _rows_of(column: pa.Array, rows: Ints, indices: pa.Array) -> pa.Array:
    """The column's `rows` (ascending): a zero-copy slice when they are consecutive, else taken."""
    if len(rows) and int(rows[-1]) - int(rows[0]) == len(rows) - 1:
        return column.slice(int(rows[0]), len(rows))
    return column.take(indices)


def _tabled(field: Ints) -> pa.Array | None:
    """Each value's zigzag varint from `_VARINTS`, as a binary column; None if one is not there."""
    raw = _zigzag(field)
    if len(raw) and (int(raw.max()) >= len(_VARINTS) or int(raw.min()) < 0):
        return None
    return _VARINTS.take(pa.array(raw))


def _joined_bytes(joined: pa.Array) -> memoryview:
    """The bytes of a binary column's values, back to back (a view: the batch's assembly copies them)."""
    offsets = joined.buffers()[1]
    start = int(np.frombuffer(offsets, np.int32, 1, joined.offset * 4)[0])
    end = int(np.frombuffer(offsets, np.int32, 1, (joined.offset + len(joined)) * 4)[0])
    return memoryview(joined.buffers()[2])[start:end]


def _no_headers(count: int) -> pa.Array:
    """`count` header counts of 0 (each a one-byte varint)."""
    offsets = np.arange(count + 1, dtype=np.int32)
    return pa.Array.from_buffers(
        pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(_NO_HEADERS * count)]
    )


def _varint_column(fields: list[Ints | None]) -> pa.Array:
    """A binary column whose row i is the fields' zigzag varints of row i, back to back (a None field
    is the attributes byte, 0)."""
    count = len(next(field for field in fields if field is not None))
    sizes = [np.ones(count, np.int64) if field is None else _varint_sizes(field) for field in fields]
    lengths = np.sum(sizes, axis=0)
    offsets = np.zeros(count + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = np.zeros(int(offsets[-1]), np.uint8)
    at = offsets[:-1].copy()
    for field, size in zip(fields, sizes, strict=True):
        if field is not None:
            raw = _zigzag(field)  # Non-negative, below 2**32.
            for index in range(_VARINT_BYTES_MAX):
                writing = size > index
                if not writing.any():
                    break
                byte = ((raw >> (7 * index)) & 0x7F) | np.where(size > index + 1, 0x80, 0)
                data[at[writing] + index] = byte[writing]
        at += size
    return pa.Array.from_buffers(
        pa.binary(), count, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    )


# The varints of zigzag values 0 to 65,535 (lengths and deltas -1 to 32,767), and of the offset deltas
# 0 to RECORDS_PER_APPEND_MAX - 1: what `_records` takes them from.
_TABLED = np.arange(1 << 16, dtype=np.int64)
_VARINTS = _varint_column([(_TABLED >> 1) ^ -(_TABLED & 1)])  # Row i: the values whose zigzag is i.
_DELTA_VARINTS = _VARINTS.take(pa.array(np.arange(min(RECORDS_PER_APPEND_MAX, 1 << 15), dtype=np.int64) * 2))
_ZERO_ATTRIBUTES_AND_TIMESTAMP = pa.scalar(b"\x00\x00", pa.binary())  # Attributes 0, timestamp delta 0.
_NO_HEADERS_SCALAR = pa.scalar(_NO_HEADERS, pa.binary())
