"""The records of RecordBatch v2 batches walked as numpy arrays: no Python step per field.

`records._walk_record` reads one record at a time: about 2.3 µs a record, at the edge, in apply on
every replica, and in every reader. Here only the chain of record lengths is followed in Python (a
record starts where the one before stopped: one varint a record, about 0.15 µs); every other field
of every record is then read and checked at once, as arrays, and so are the lengths themselves.

It checks what `_walk_record` checks for records without headers, and never more leniently; it
answers None for anything else (a record with headers, or any check failing), and the caller then
walks the records in Python, which decides: it accepts them, or raises the precise
MalformedBatchError. So a batch is accepted or refused alike whichever path ran, on every replica
(the one rule); tests/storage/test_record_arrays.py checks it on generated and corrupted batches.

Used by `records._walk` for a batch of at least ARRAY_WALK_RECORDS_MIN records (below that numpy's
fixed cost is more than the walk's), and by the Spark source to build Arrow columns
(spark/columns.py). Everything is bounded by the batch: arrays of one item a record (at most
RECORDS_PER_APPEND_MAX a batch), a loop of one step a record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kq.proto.limits import (
    ARRAY_RUN_BACKOFF_MAX,
    ARRAY_RUN_BACKOFF_MIN,
    ARRAY_RUN_MIN,
    ARRAY_RUN_PROBE_MAX,
    ARRAY_RUN_PROBE_MIN,
)
from kq.proto.records import (
    INT64_MAX,
    NO_TIMESTAMP,
    RECORD_BYTES_MIN,
    VARINT_BYTES_MAX,
    VARLONG_BYTES_MAX,
    BatchHeader,
    MalformedBatchError,
    read_varint,
)

Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
Bytes = npt.NDArray[np.uint8]

# After the records in `joined`, so that a fixed-width read from any record's start stays inside it.
PADDING = bytes(VARLONG_BYTES_MAX + 16)
POSITION_MAX = 2**31 - 1  # Positions are int64 here, but binary views (spark/columns.py) hold int32.


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What the walk needs of a batch's (checked) header."""

    record_count: int
    last_offset_delta: int
    base_timestamp_ms: int
    append_time_ms: int | None  # maxTimestamp for a LogAppendTime batch: every record's timestamp.

    @classmethod
    def of(cls, header: BatchHeader) -> BatchShape:
        """The shape of a batch whose header passed its checks."""
        append_time_ms = header.max_timestamp_ms if header.log_append_time else None
        return cls(header.record_count, header.last_offset_delta, header.base_timestamp_ms, append_time_ms)

    @property
    def dense(self) -> bool:
        """A producer's batch: record i has offsetDelta i (else compacted: rising, with gaps)."""
        return self.record_count == self.last_offset_delta + 1


@dataclass(frozen=True, slots=True)
class RecordArrays:
    """Every record's fields, one item a record; starts are positions in the joined buffer."""

    offset_deltas: Ints
    timestamps_ms: Ints
    key_starts: Ints
    key_lengths: Ints  # -1: a null key
    value_starts: Ints
    value_lengths: Ints


def joined(regions: Sequence[bytes | memoryview]) -> bytes:
    """The records regions of consecutive batches in one buffer for `walk_records`, padded so that
    fixed-width reads from any record's start stay inside it (spark/columns.py's binary views)."""
    return b"".join([*regions, PADDING])


def walk_records(
    buffer: bytes | memoryview, shapes: Sequence[BatchShape], ends: Sequence[int], record_bytes_max: int
) -> RecordArrays | None:
    """The records of the batches whose records regions `buffer` holds one after the other (`joined`,
    or one batch's region as it is: the walk reads nothing past the buffer; batch k's ends at
    ends[k]), checked as `records._walk` checks records without headers whose key and value hold at
    most `record_bytes_max` bytes; None if a record has headers or fails a check (the walk then says
    which)."""
    if len(buffer) > POSITION_MAX or not shapes or not len(buffer):
        return None
    counts = [shape.record_count for shape in shapes]
    array = np.frombuffer(buffer, np.uint8)
    found = _record_bounds(array, buffer, counts, np.array(ends, np.int64))
    if found is None:
        return None
    bodies, stops = found
    fields = _fields(array, bodies, stops)
    if fields is None:
        return None
    timestamp_deltas, offset_deltas, key_starts, key_lengths, value_starts, value_lengths = fields
    if not _offset_deltas_fit(offset_deltas, shapes):
        return None
    timestamps_ms = _timestamps(timestamp_deltas, shapes)
    if timestamps_ms is None:
        return None
    sizes = np.maximum(key_lengths, 0) + np.maximum(value_lengths, 0)
    if int(sizes.max()) > record_bytes_max:
        return None
    return RecordArrays(offset_deltas, timestamps_ms, key_starts, key_lengths, value_starts, value_lengths)


def _record_bounds(
    buffer: Bytes, data: bytes | memoryview, counts: list[int], ends: Ints
) -> tuple[Ints, Ints] | None:
    """Where each record's fields start (after its length) and where it stops; None if a length is
    wrong.

    `_record_starts` follows the lengths (reading a negative one as positive: it only proposes);
    then they are read again, and checked, as arrays (a negative length, whose lowest bit is set, is
    refused there), and each record must stop where the next starts."""
    start_array = _record_starts(buffer, data, sum(counts))
    if start_array is None:
        return None
    record_ends = np.repeat(ends, counts)
    lengths, bodies, fine = _varints(buffer, start_array, record_ends, VARINT_BYTES_MAX)
    stops = bodies + lengths
    fine &= (lengths >= RECORD_BYTES_MIN) & (stops <= record_ends)
    fine[:-1] &= stops[:-1] == start_array[1:]  # Regions are contiguous: a batch's end is the next's start.
    last_records = np.cumsum(counts) - 1
    if not fine.all() or (stops[last_records] != ends).any():
        return None
    return bodies, stops


def _record_starts(buffer: Bytes, data: bytes | memoryview, total: int) -> Ints | None:
    """Where `total` records start, each where the one before stopped; None if a length cannot be
    read.

    The one Python loop a record, as short as it can be, except over runs of records whose lengths
    are the same bytes (fixed-size values): at a record whose length takes one or two bytes, a numpy
    test reads the bytes where the next records would start if they were as long, and takes every
    record up to the first that differs at once (limits.py ARRAY_RUN_*: tests grow while they hold,
    and back off while they find nothing, so varied lengths cost a few tests a batch). Records with
    the same one- or two-byte length varint are exactly as long, so this is the chain the loop
    finds, and `_record_bounds` checks it whatever found it."""
    walked = [0] * total  # Starts found one by one, at their index.
    pieces: list[Ints] = []
    position = index = 0
    probe, backoff, walk = ARRAY_RUN_PROBE_MIN, ARRAY_RUN_BACKOFF_MIN, 0
    last_start = len(data) - 2  # A start the test reads keeps both of its bytes inside the buffer.
    try:
        while index < total:
            if walk:  # One record at a time.
                stop = min(index + walk, total)
                for at in range(index, stop):
                    walked[at] = position
                    byte = data[position]
                    if byte < 0x80:
                        position += 1 + (byte >> 1)
                    elif (high := data[position + 1]) < 0x80:
                        position += 2 + (((byte & 0x7F) | (high << 7)) >> 1)
                    else:
                        length, position = read_varint(data, position, len(data), VARINT_BYTES_MAX)
                        position += max(length, 0)
                pieces.append(np.array(walked[index:stop], np.int64))
                index, walk = stop, 0
                continue
            byte = data[position]
            if byte < 0x80:
                size, high = 1 + (byte >> 1), -1
            elif (high := data[position + 1]) < 0x80:
                size = 2 + (((byte & 0x7F) | (high << 7)) >> 1)
            else:  # Records of 8 KiB or more (or a bad length): few, walked one by one.
                walk = 1
                continue
            count = min(probe, total - index, (last_start - position) // size + 1)
            after, later = position + size, position + 2 * size
            if (  # A look at the next two records in Python first: a numpy test costs ~8 µs.
                count < ARRAY_RUN_MIN
                or data[after] != byte
                or data[later] != byte
                or (high >= 0 and (data[after + 1] != high or data[later + 1] != high))
            ):
                walk, backoff = backoff, min(backoff * 2, ARRAY_RUN_BACKOFF_MAX)  # Lengths vary here.
                continue
            run, starts = _run(buffer, position, size, count, byte, high)
            pieces.append(starts)
            position, index = position + size * run, index + run
            if run == count:
                probe, backoff = min(probe * 2, ARRAY_RUN_PROBE_MAX), ARRAY_RUN_BACKOFF_MIN
            elif run >= ARRAY_RUN_MIN:
                probe = ARRAY_RUN_PROBE_MIN
            else:  # A short run: lengths vary here after all.
                probe, walk, backoff = ARRAY_RUN_PROBE_MIN, backoff, min(backoff * 2, ARRAY_RUN_BACKOFF_MAX)
    except (IndexError, MalformedBatchError):
        return None
    return np.concatenate(pieces) if pieces else np.zeros(0, np.int64)


def _run(buffer: Bytes, position: int, size: int, count: int, byte: int, high: int) -> tuple[int, Ints]:
    """How many of the `count` records from `position` have the length bytes of the first (`byte`,
    and `high` unless it is -1), were each `size` bytes long (so each is), and their starts."""
    starts = np.arange(position, position + size * count, size, dtype=np.int64)
    same = buffer[starts] == byte
    if high >= 0:
        same &= buffer[starts + 1] == high
    run = count if bool(same.all()) else int(same.argmin())  # At least 1: starts[0] is `position`.
    return run, starts[:run]


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
    `read_varint` reads one.

    Bytes are read with `take(mode="clip")`: a read past the buffer's end reads its last byte, so the
    buffer needs no padding (the edge's and apply's check walk the batch's own bytes, uncopied). A
    varint is fine only if it ends within its record, so whatever such a read gives, a varint that
    needs it is not fine: it runs past its record (a terminating byte) or past `bytes_max` (the last
    byte, which continued the varint, continues it again), as with zeros read from padding.

    One pass a byte of the longest varint: most are one or two bytes (lengths below 8 KiB)."""
    first = buffer.take(position, mode="clip")
    if int(first.max()) < 0x80:  # One byte each: lengths and deltas below 64, the common case.
        value = first.astype(np.int64)
        return (value >> 1) ^ -(value & 1), position + 1, position < stops
    second = buffer.take(position + 1, mode="clip")
    if int(np.minimum(first, second).max()) < 0x80:  # At most two bytes each (below 8 KiB).
        two = first >= 0x80
        value = (first & 0x7F).astype(np.int64) | np.where(two, second.astype(np.int64) << 7, 0)
        after = position + 1 + two
        return (value >> 1) ^ -(value & 1), after, after <= stops
    raw = (first & 0x7F).astype(np.uint64)
    going = first >= 0x80  # Varints with a byte still to read.
    size = np.ones(len(position), np.int64)
    fine = np.ones(len(position), np.bool_)
    for index in range(1, bytes_max):
        if not going.any():
            break
        byte = buffer.take(position + index, mode="clip")
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


def _offset_deltas_fit(deltas: Ints, shapes: Sequence[BatchShape]) -> bool:
    """Whether each batch's offsetDeltas are as `_walk` wants: 0, 1, 2... in a producer's (dense)
    batch; rising within [0, lastOffsetDelta] in a compacted one."""
    if len(shapes) == 1 and shapes[0].dense:  # One producer's batch: the edge's and apply's case.
        return bool((deltas == np.arange(len(deltas))).all())
    counts = np.array([shape.record_count for shape in shapes], np.int64)
    firsts = np.cumsum(counts) - counts
    index = np.arange(len(deltas)) - np.repeat(firsts, counts)
    is_dense = np.repeat(np.array([shape.dense for shape in shapes], np.bool_), counts)
    if not (deltas[is_dense] == index[is_dense]).all():
        return False
    sparse = ~is_dense
    if not sparse.any():
        return True
    rising = np.ones(len(deltas), np.bool_)
    rising[1:] = deltas[1:] > deltas[:-1]
    rising[firsts] = deltas[firsts] >= 0
    highest = np.repeat(np.array([shape.last_offset_delta for shape in shapes], np.int64), counts)
    return bool((rising[sparse] & (deltas[sparse] <= highest[sparse])).all())


def _timestamps(deltas: Ints, shapes: Sequence[BatchShape]) -> Ints | None:
    """Each record's timestamp: its batch's LogAppendTime, or baseTimestamp + its delta, which must be
    -1 or more and fit int64 (None if one does not: the walk says which)."""
    if len(shapes) == 1:  # One batch: the edge's and apply's case.
        base, append_time_ms = shapes[0].base_timestamp_ms, shapes[0].append_time_ms
        if append_time_ms is not None:
            return np.full(len(deltas), append_time_ms, np.int64)
        if int(deltas.min()) < NO_TIMESTAMP - base or int(deltas.max()) > INT64_MAX - max(base, 0):
            return None
        return deltas + base
    counts = [shape.record_count for shape in shapes]
    bases = np.repeat(np.array([shape.base_timestamp_ms for shape in shapes], np.int64), counts)
    appended = np.repeat(np.array([shape.append_time_ms is not None for shape in shapes], np.bool_), counts)
    # base >= -1 (the header's check), so neither bound overflows; at base -1 this refuses a delta of
    # INT64_MAX, which the walk then judges.
    fine = (deltas >= NO_TIMESTAMP - bases) & (deltas <= INT64_MAX - np.maximum(bases, 0))
    if not (fine | appended).all():
        return None
    created = bases + np.where(appended, 0, deltas)
    if not appended.any():
        return created
    times = [NO_TIMESTAMP if shape.append_time_ms is None else shape.append_time_ms for shape in shapes]
    return np.where(appended, np.repeat(np.array(times, np.int64), counts), created)
