"""Served record batches decoded straight into Arrow columns, with numpy: no Python step per field.

The Spark source reads millions of records, and walking each one in Python (`parse_batch_as`, about
4 µs a record) was most of its time. Here each batch's header is checked by `records.checked_records`
(the walk's own code, the CRC included), all the records of a fetch are walked at once as arrays
(proto/arrays.py), and keys and values become Arrow binary columns by one copy in Arrow's C++.

A fetch the arrays cannot vouch for whole (a record with headers, any failed check) is left to the
Python walk (`client.decode_batches`), which decodes it or raises the precise MalformedBatchError;
so both paths give the same rows and the same errors, which tests/spark/test_columns.py checks on
generated and corrupted batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from kq.client.client import decode_batches
from kq.proto.arrays import BatchShape, joined, walk_records
from kq.proto.limits import RECORD_BYTES_MAX
from kq.proto.records import MalformedBatchError, checked_records
from kq.spark.schema import HEADER_ARROW_TYPE, MICROS_PER_MILLI, TIMESTAMP_ARROW_TYPE, record_batch

Ints = npt.NDArray[np.int64]

_INLINE_BYTES = 12  # A binary view holds a value of at most 12 bytes inline (Arrow's BinaryView layout).
_VIEW_BYTES = 16


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
        return None  # Nothing to decode: the walk answers at once.
    regions: list[bytes | memoryview] = []
    shapes: list[BatchShape] = []
    bases, batch_ends = [], []
    for data in batches:
        try:
            header, held, start, end = checked_records(data)
        except MalformedBatchError:
            return None
        if header.is_control:  # A transaction marker: the Python walk steps over it.
            return None
        regions.append(memoryview(held)[start:end])
        shapes.append(BatchShape.of(header))
        bases.append(header.base_offset)
        batch_ends.append(header.base_offset + header.last_offset_delta + 1)
    buffer = joined(regions)
    ends = np.cumsum([len(region) for region in regions]).tolist()
    fields = walk_records(buffer, shapes, ends, RECORD_BYTES_MAX)
    if fields is None:
        return None
    counts = [shape.record_count for shape in shapes]
    offsets = np.repeat(np.array(bases, np.int64), counts) + fields.offset_deltas
    if not (offsets[1:] > offsets[:-1]).all():  # Across batches too (the reader refuses them: the walk's).
        return None
    appended = [int(shape.append_time_ms is not None) for shape in shapes]  # Kafka's LogAppendTime: 1.
    timestamp_types = np.repeat(np.array(appended, np.int32), counts)
    first, stop, next_offset = _chosen(offsets, counts, batch_ends, offset, limit)
    chosen = slice(first, stop)
    columns = Columns(
        offsets[chosen],
        fields.timestamps_ms[chosen],
        timestamp_types[chosen],
        _binary(buffer, fields.key_starts[chosen], fields.key_lengths[chosen]),
        _binary(buffer, fields.value_starts[chosen], fields.value_lengths[chosen]),
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


def _binary(buffer: bytes, starts: Ints, lengths: Ints) -> pa.Array:
    """A binary column of buffer[start:start + length] (null where length is -1), by way of Arrow's
    binary views, which point into `buffer` itself: one copy, in C++, when cast to plain binary.

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
    # The 12 bytes (or 4) from each start, read through a view of `buffer` whose items overlap.
    width = _INLINE_BYTES if short.any() else 4
    windows = np.ndarray((len(buffer) - width + 1,), np.dtype((np.void, width)), buffer, strides=(1,))
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
        pa.binary_view(), count, [validity, pa.py_buffer(views), pa.py_buffer(buffer)]
    )
    return array.cast(pa.binary())
