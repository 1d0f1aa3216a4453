"""Served record batches decoded straight into Arrow columns, with numpy: no Python step per field.

The Spark source reads millions of records, and walking each one in Python (`parse_batch_as`, about
4 µs a record) was most of its time. Here only the chain of record lengths is followed in Python
(each record's start depends on the one before: one varint a record); every other field of every
record of a fetch is read, checked and gathered at once, as numpy arrays over the whole fetch, and
keys and values become Arrow binary columns by one copy in Arrow's C++.

It checks what `proto.records._walk_record` checks, and never more leniently: each batch's header
through `records.checked_records` (the same code, the CRC included), then every record's length,
varints, offsetDelta, timestamp, key and value lengths and size. A fetch it cannot vouch for whole
(a record with headers, a varint beyond two bytes where it did not expect one, or any failed check)
is left to the Python walk (`client.decode_batches`), which decodes it or raises the precise
MalformedBatchError; so both paths give the same rows and the same errors, which
tests/spark/test_columns.py checks on generated and corrupted batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from kq.client.client import decode_batches
from kq.proto.limits import RECORD_BYTES_MAX
from kq.proto.records import (
    INT64_MAX,
    NO_TIMESTAMP,
    VARINT_BYTES_MAX,
    VARLONG_BYTES_MAX,
    MalformedBatchError,
    checked_records,
    read_varint,
)
from kq.spark.schema import HEADER_ARROW_TYPE, MICROS_PER_MILLI, TIMESTAMP_ARROW_TYPE, record_batch

Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
Bytes = npt.NDArray[np.uint8]

RECORD_BYTES_MIN = 6  # As records._RECORD_BYTES_MIN: attributes and five one-byte fields.
_PADDING = bytes(VARLONG_BYTES_MAX + 16)  # After the records, so every gather below stays in the buffer.
_INLINE_BYTES = 12  # A binary view holds a value of at most 12 bytes inline (Arrow's BinaryView layout).
_VIEW_BYTES = 16
_VIEW_OFFSET_MAX = 2**31 - 1  # A view's offset is an int32, and so is a binary column's.


@dataclass(frozen=True, slots=True)
class Columns:
    """The records of one fetch, as columns: each array has one item a record, in offset order."""

    offsets: Ints
    timestamps_ms: Ints
    timestamp_types: npt.NDArray[np.int32]
    keys: pa.Array  # binary, null where the key is null
    values: pa.Array


def fetched_rows(
    topic: str,
    partition: int,
    batches: Sequence[bytes],
    offset: int,
    limit: int,
    schema: pa.Schema,
    include_headers: bool,
    served_by: str | None,
) -> tuple[pa.RecordBatch | None, int]:
    """At most `limit` records of served `batches` from `offset` on, as one Arrow record batch in
    `schema` (None: no record), and the offset to read from next; as `client.decode_batches` says."""
    decoded = decode_columns(batches, offset, limit)
    if decoded is None:
        records, next_offset = decode_batches(topic, partition, batches, offset, limit)
        return (record_batch(records, schema, include_headers, served_by) if records else None), next_offset
    columns, next_offset = decoded
    count = len(columns.offsets)
    if not count:
        return None, next_offset
    arrays = [
        columns.keys,
        columns.values,
        pa.repeat(pa.scalar(topic, pa.string()), count),
        pa.array(np.full(count, partition, np.int32)),
        pa.array(columns.offsets),
        pa.array(columns.timestamps_ms * MICROS_PER_MILLI).cast(TIMESTAMP_ARROW_TYPE),
        pa.array(columns.timestamp_types),
    ]
    if include_headers:  # No record has headers here (else the Python walk decoded them): empty lists.
        empty = pa.array([], HEADER_ARROW_TYPE)
        arrays.append(pa.ListArray.from_arrays(pa.array(np.zeros(count + 1, np.int32)), empty))
    if served_by is not None:
        arrays.append(pa.repeat(pa.scalar(served_by, pa.string()), count))
    return pa.RecordBatch.from_arrays(arrays, schema=schema), next_offset


def decode_columns(batches: Sequence[bytes], offset: int, limit: int) -> tuple[Columns, int] | None:
    """`decode_batches`'s records and next offset as columns, or None where the Python walk must decide
    (which also decides which error a malformed fetch raises, and whether a batch past `limit` is
    looked at at all)."""
    if not batches:
        return _no_columns(offset)
    regions: list[bytes | memoryview] = []
    counts, bases, dense, last_deltas, base_times, append_times, batch_ends = [], [], [], [], [], [], []
    for data in batches:
        try:
            header, held, start, end = checked_records(data)
        except MalformedBatchError:
            return None
        regions.append(memoryview(held)[start:end])
        counts.append(header.record_count)
        bases.append(header.base_offset)
        dense.append(header.record_count == header.last_offset_delta + 1)
        last_deltas.append(header.last_offset_delta)
        base_times.append(header.base_timestamp_ms)
        append_times.append(header.max_timestamp_ms if header.log_append_time else None)
        batch_ends.append(header.base_offset + header.last_offset_delta + 1)
    joined = b"".join([*regions, _PADDING])
    if len(joined) > _VIEW_OFFSET_MAX:
        return None
    ends = np.cumsum([len(region) for region in regions], dtype=np.int64)
    buffer = np.frombuffer(joined, np.uint8)
    found = _record_bodies(buffer, joined, counts, ends)
    if found is None:
        return None
    bodies, stops = found
    fields = _fields(buffer, bodies, stops)
    if fields is None:
        return None
    timestamp_deltas, offset_deltas, key_starts, key_lengths, value_starts, value_lengths = fields
    per_record = np.repeat(np.arange(len(counts)), counts)
    if not _offset_deltas_fit(offset_deltas, np.array(counts), np.array(dense), np.array(last_deltas)):
        return None
    timestamps_ms = _timestamps(timestamp_deltas, per_record, base_times, append_times)
    if timestamps_ms is None:
        return None
    sizes = np.maximum(key_lengths, 0) + np.maximum(value_lengths, 0)
    if len(sizes) and int(sizes.max()) > RECORD_BYTES_MAX:
        return None
    offsets = np.array(bases, np.int64)[per_record] + offset_deltas
    if not (offsets[1:] > offsets[:-1]).all():  # Across batches too (the reader refuses them: the walk's).
        return None
    timestamp_types = np.array([0 if at is None else 1 for at in append_times], np.int32)[per_record]
    first, stop, next_offset = _chosen(offsets, counts, batch_ends, offset, limit)
    chosen = slice(first, stop)
    columns = Columns(
        offsets[chosen],
        timestamps_ms[chosen],
        timestamp_types[chosen],
        _binary(joined, key_starts[chosen], key_lengths[chosen]),
        _binary(joined, value_starts[chosen], value_lengths[chosen]),
    )
    return columns, next_offset


def _chosen(
    offsets: Ints, counts: list[int], batch_ends: list[int], offset: int, limit: int
) -> tuple[int, int, int]:
    """Which records `decode_batches` returns, [first, stop), and its next offset: it drops a first
    batch's records before `offset`, decodes batches while it holds fewer than `limit` records, then
    keeps `limit` of them (next: the first one left out), or all (next: past the last batch decoded)."""
    first = int(np.searchsorted(offsets, offset)) if offsets[0] < offset else 0
    kept = np.maximum(np.cumsum(counts) - first, 0)  # Records held after each batch.
    decoded = int(np.searchsorted(kept, limit)) + 1  # Batches decoded: up to the one reaching `limit`.
    held = int(kept[min(decoded, len(counts)) - 1])
    if held > limit:
        return first, first + limit, int(offsets[first + limit])
    return first, first + held, max([offset, *batch_ends[:decoded]])


def _no_columns(next_offset: int) -> tuple[Columns, int]:
    empty = np.zeros(0, np.int64)
    nothing = pa.array([], pa.binary())
    return Columns(empty, empty, np.zeros(0, np.int32), nothing, nothing), next_offset


def _record_bodies(buffer: Bytes, joined: bytes, counts: list[int], ends: Ints) -> tuple[Ints, Ints] | None:
    """Where each record's fields start (after its length) and where it stops, following the lengths
    from the first record of each batch; None if a length is wrong (the walk then says how).

    The one Python loop a record, as short as it can be: each record's start is where the one
    before stopped, so the lengths are followed one by one; they are read again, and checked,
    as arrays below (a negative length has its lowest bit set, and is refused there)."""
    starts = [0] * sum(counts)
    position = 0
    try:
        for index in range(len(starts)):  # One loop over every batch's records: the regions are contiguous.
            starts[index] = position
            byte = joined[position]
            if byte < 0x80:
                position += 1 + (byte >> 1)
            elif (high := joined[position + 1]) < 0x80:
                position += 2 + (((byte & 0x7F) | (high << 7)) >> 1)
            else:
                length, position = read_varint(joined, position, len(joined), VARINT_BYTES_MAX)
                position += max(length, 0)
    except (IndexError, MalformedBatchError):
        return None
    first_records = np.cumsum(counts) - counts
    record_ends = np.repeat(ends, counts)
    start_array = np.array(starts, np.int64)
    lengths, bodies, fine = _varints(buffer, start_array, record_ends, VARINT_BYTES_MAX)
    stops = bodies + lengths
    fine &= (lengths >= RECORD_BYTES_MIN) & (stops <= record_ends)
    fine[:-1] &= stops[:-1] == start_array[1:]  # Regions are contiguous: a batch's end is the next's start.
    if not fine.all() or stops[-1] != ends[-1] or (stops[first_records[1:] - 1] != ends[:-1]).any():
        return None
    return bodies, stops


def _fields(buffer: Bytes, bodies: Ints, stops: Ints) -> tuple[Ints, ...] | None:
    """Every record's timestampDelta, offsetDelta, key (start, length) and value (start, length),
    checked as `_walk_record` checks them; None if any record fails, or has headers."""
    position = bodies + 1  # After the record's attributes (unused).
    timestamp_deltas, position, fine = _varints(buffer, position, stops, VARLONG_BYTES_MAX)
    offset_deltas, position, ok = _varints(buffer, position, stops, VARINT_BYTES_MAX)
    fine &= ok
    key_lengths, position, ok = _varints(buffer, position, stops, VARINT_BYTES_MAX)
    fine &= ok & (key_lengths >= -1)
    key_starts = position
    position = position + np.maximum(key_lengths, 0)
    value_lengths, position, ok = _varints(buffer, position, stops, VARINT_BYTES_MAX)
    fine &= ok & (value_lengths >= -1)
    value_starts = position
    position = position + np.maximum(value_lengths, 0)
    header_counts, position, ok = _varints(buffer, position, stops, VARINT_BYTES_MAX)
    fine &= ok & (header_counts == 0) & (position == stops)
    if not fine.all():
        return None
    return timestamp_deltas, offset_deltas, key_starts, key_lengths, value_starts, value_lengths


def _varints(buffer: Bytes, position: Ints, stops: Ints, bytes_max: int) -> tuple[Ints, Ints, Bools]:
    """The zigzag varint at each position: (values, positions after them, which are well formed: within
    their record, at most `bytes_max` bytes, inside int32 (5 bytes) or int64 (10 bytes)), as
    `records.read_varint` reads one. Positions past the buffer read its padding and are not fine.

    One pass a byte of the longest varint: most are one or two bytes (lengths below 8 KiB)."""
    position = np.minimum(position, len(buffer) - VARLONG_BYTES_MAX - 1)
    byte = buffer[position]
    raw = (byte & 0x7F).astype(np.uint64)
    going = byte >= 0x80  # Varints with a byte still to read.
    size = np.ones(len(position), np.int64)
    fine = np.ones(len(position), np.bool_)
    for index in range(1, bytes_max):
        if not going.any():
            break
        byte = buffer[position + index]
        raw |= np.where(going, (byte & 0x7F).astype(np.uint64) << np.uint64(7 * index), np.uint64(0))
        if index == VARLONG_BYTES_MAX - 1:  # The tenth byte may hold only bit 63.
            fine &= ~going | (byte <= 1)
        size += going
        going &= byte >= 0x80
    fine &= ~going & (position + size <= stops)
    if bytes_max == VARINT_BYTES_MAX:
        fine &= (raw >> np.uint64(32)) == 0
    values = (raw >> np.uint64(1)).astype(np.int64) ^ -(raw & np.uint64(1)).astype(np.int64)
    return values, position + size, fine


def _offset_deltas_fit(deltas: Ints, counts: Ints, dense: Bools, last_deltas: Ints) -> bool:
    """Whether each batch's offsetDeltas are as `_walk` wants: 0, 1, 2... in a producer's (dense) batch;
    rising within [0, lastOffsetDelta] in a compacted one."""
    firsts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    index = np.arange(len(deltas)) - np.repeat(firsts, counts)
    is_dense = np.repeat(dense, counts)
    if not (deltas[is_dense] == index[is_dense]).all():
        return False
    sparse = ~is_dense
    if not sparse.any():
        return True
    rising = np.ones(len(deltas), np.bool_)
    rising[1:] = deltas[1:] > deltas[:-1]
    rising[firsts] = deltas[firsts] >= 0
    return bool((rising[sparse] & (deltas[sparse] <= np.repeat(last_deltas, counts)[sparse])).all())


def _timestamps(
    deltas: Ints, per_record: Ints, base_times: list[int], append_times: list[int | None]
) -> Ints | None:
    """Each record's timestamp: its batch's LogAppendTime, or baseTimestamp + its delta, which must be
    -1 or more and fit int64 (None if one does not: the walk says which)."""
    bases = np.array(base_times, np.int64)[per_record]
    # base >= -1 (checked_records), so neither bound overflows; at base -1 this refuses a delta of
    # INT64_MAX, which the walk then judges.
    fine = (deltas >= NO_TIMESTAMP - bases) & (deltas <= INT64_MAX - np.maximum(bases, 0))
    appended = np.array([at is not None for at in append_times], np.bool_)[per_record]
    if not (fine | appended).all():
        return None
    created = bases + np.where(appended, 0, deltas)
    if not appended.any():
        return created
    times = np.array([NO_TIMESTAMP if at is None else at for at in append_times], np.int64)[per_record]
    return np.where(appended, times, created)


def _binary(joined: bytes, starts: Ints, lengths: Ints) -> pa.Array:
    """A binary column of joined[start:start + length] (null where length is -1), by way of Arrow's
    binary views, which point into `joined` itself: one copy, in C++, when cast to plain binary.

    A view is 16 bytes: the length, then the value itself when it has at most 12 bytes (zeros after
    it), else its first four bytes, the buffer's index (0) and the value's offset in it."""
    count = len(starts)
    present = lengths >= 0
    if not present.any():
        return pa.nulls(count, pa.binary())
    lengths = np.where(present, lengths, 0)
    views = np.zeros((count, _VIEW_BYTES), np.uint8)
    words = views.view(np.int32)  # (count, 4)
    short = lengths <= _INLINE_BYTES
    every_short = bool(short.all())
    # The 12 bytes (or 4) from each start, read through a view of `joined` whose items overlap.
    width = _INLINE_BYTES if short.any() else 4
    windows = np.ndarray((len(joined) - width + 1,), np.dtype((np.void, width)), joined, strides=(1,))
    head = windows[starts].view(np.uint8).reshape(count, width)
    if width == _INLINE_BYTES:
        head = head * (np.arange(_INLINE_BYTES) < np.where(short, lengths, _INLINE_BYTES)[:, None])
    views[:, 4 : 4 + width] = head
    words[:, 0] = lengths
    if not every_short:
        long_ = ~short
        words[:, 2] = np.where(long_, 0, words[:, 2])  # Buffer index 0 where the bytes are not inline.
        words[:, 3] = np.where(long_, starts, words[:, 3])
    validity = None if present.all() else pa.py_buffer(np.packbits(present, bitorder="little"))
    array = pa.Array.from_buffers(
        pa.binary_view(), count, [validity, pa.py_buffer(views), pa.py_buffer(joined)]
    )
    return array.cast(pa.binary())
