"""The records walked as arrays (proto/arrays.py) against the Python walk, for the edge's and apply's
check of a large batch: the same batches accepted, the same errors, the same work charged.

The arrays are a shortcut for a batch whose records all pass; anything else goes to the walk. So a
batch must never pass the arrays and fail the walk: apply on a replica that took one path would
then differ from one that took the other. Generated batches (every codec, LogAppendTime, one- to
three-byte varints, nulls, headers) and corrupted ones (bytes changed, then the CRC made right
again, so each corruption reaches the record checks) are checked both ways.
"""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kq.proto import arrays as arrays_module
from kq.proto import records as records_module
from kq.proto.arrays import BatchShape, RecordArrays, joined, walk_records
from kq.proto.arrays import _record_starts as record_starts
from kq.proto.compression import CODECS, NONE
from kq.proto.limits import (
    APPEND_BYTES_MAX,
    ARRAY_WALK_RECORDS_MIN,
    HEADER_NAME_BYTES_MAX,
    HEADERS_PER_RECORD_MAX,
    RECORD_BYTES_MAX,
    RECORDS_PER_APPEND_MAX,
)
from kq.proto.records import (
    BATCH_HEADER_BYTES,
    MalformedBatchError,
    NewRecord,
    WorkMeter,
    check_batch,
    checked_records,
    encode_batch,
    parse_batch,
    read_varint,
    with_log_append_time,
)
from tests.storage.batches import BASE_TIME_MS, restamped
from tests.storage.batches import records as batch_records

BUDGET = 10**9

records = batch_records(with_headers=True)


def check(data: bytes, arrays: bool, record_bytes_max: int = RECORD_BYTES_MAX) -> tuple[str, object, int]:
    """check_batch's outcome (its header, or its error's message) and the work it charged, with the
    arrays tried first for batches of ARRAY_WALK_RECORDS_MIN records or more, or never."""
    meter = WorkMeter(BUDGET)
    threshold = ARRAY_WALK_RECORDS_MIN if arrays else RECORDS_PER_APPEND_MAX + 1
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(records_module, "ARRAY_WALK_RECORDS_MIN", threshold)
        try:
            header = check_batch(
                data,
                RECORDS_PER_APPEND_MAX,
                HEADERS_PER_RECORD_MAX,
                record_bytes_max,
                HEADER_NAME_BYTES_MAX,
                APPEND_BYTES_MAX,
                meter,
            )
        except MalformedBatchError as error:
            return ("error", str(error), BUDGET - meter.remaining)
    return ("ok", header, BUDGET - meter.remaining)


def arrays_accept(data: bytes, record_bytes_max: int = RECORD_BYTES_MAX) -> bool:
    """Whether the arrays alone accept the batch's records (its header checked as the walk checks it),
    read from the batch's own bytes (as the edge and apply do) and from a padded copy (`joined`, as
    the Spark source does): both must say the same, field for field."""
    header, buffer, start, end = checked_records(data)
    shapes, ends = [BatchShape.of(header)], [end - start]
    padded = walk_records(joined([memoryview(buffer)[start:end]]), shapes, ends, record_bytes_max)
    unpadded = walk_records(memoryview(buffer)[start:end], shapes, ends, record_bytes_max)
    assert (padded is None) == (unpadded is None)
    if padded is not None and unpadded is not None:
        for name in RecordArrays.__slots__:
            assert (getattr(padded, name) == getattr(unpadded, name)).all(), name
    return padded is not None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(records, min_size=1, max_size=6),
    st.integers(ARRAY_WALK_RECORDS_MIN, ARRAY_WALK_RECORDS_MIN + 20),
    st.sampled_from(sorted(CODECS.values())),
    st.booleans(),
)
def test_a_sound_batch_passes_both_ways_and_the_arrays_read_the_walks_fields(
    kinds: list[NewRecord], count: int, codec: int, append_time: bool
) -> None:
    """Accepted both ways with the same work charged; without headers the arrays accept it themselves
    and read every record's offset, timestamp, key and value as the walk does."""
    batch = [kinds[index % len(kinds)] for index in range(count)]
    data = encode_batch(batch, codec, base_timestamp_ms=BASE_TIME_MS)
    if append_time:
        data = with_log_append_time(data, BASE_TIME_MS + 5)
    assert check(data, arrays=True) == check(data, arrays=False)
    assert check(data, arrays=True)[0] == "ok"
    has_headers = any(record.headers for record in batch)
    assert arrays_accept(data) is not has_headers
    if has_headers:
        return
    header, buffer, start, end = checked_records(data)
    region = joined([memoryview(buffer)[start:end]])
    fields = walk_records(region, [BatchShape.of(header)], [end - start], RECORD_BYTES_MAX)
    assert fields is not None
    walked = parse_batch(data)

    def blob(starts: object, lengths: object, index: int) -> bytes | None:
        at, length = int(starts[index]), int(lengths[index])  # type: ignore[index]
        return None if length < 0 else region[at : at + length]

    for index, record in enumerate(walked):
        assert int(fields.offset_deltas[index]) == record.offset_delta
        assert int(fields.timestamps_ms[index]) == record.timestamp_ms
        assert blob(fields.key_starts, fields.key_lengths, index) == record.key
        assert blob(fields.value_starts, fields.value_lengths, index) == record.value


CORRUPTIBLE = encode_batch(
    [
        NewRecord(
            None if n % 5 == 0 else f"key-{n}".encode(),
            b"v" * (n * 7 % 150) if n % 11 else None,
            timestamp_ms=BASE_TIME_MS + (n * 2**13 if n % 3 else -n),
        )
        for n in range(ARRAY_WALK_RECORDS_MIN + 8)
    ],
    NONE,
    base_timestamp_ms=BASE_TIME_MS,
)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=3),
    st.integers(0, 3),
    st.sampled_from([RECORD_BYTES_MAX, 100]),
)
def test_a_corrupted_batch_is_judged_alike_both_ways(
    flips: list[tuple[int, int]], cut: int, record_bytes_max: int
) -> None:
    """Record bytes changed (or the batch cut short), the CRC made right: the same verdict, message
    and work charged, and the arrays never accept what the walk refuses."""
    data = bytearray(CORRUPTIBLE)
    for at, value in flips:
        data[BATCH_HEADER_BYTES + at % (len(data) - BATCH_HEADER_BYTES)] = value
    if cut:
        del data[len(data) - cut :]
        struct.pack_into(">i", data, 8, len(data) - 12)  # batchLength: only the records are short.
    batch = restamped(data)
    walked = check(batch, arrays=False, record_bytes_max=record_bytes_max)
    assert check(batch, arrays=True, record_bytes_max=record_bytes_max) == walked
    try:
        accepted = arrays_accept(batch, record_bytes_max)  # Read padded and not: the same answer.
    except MalformedBatchError:
        return  # The header's own check (the walk's code) refused it.
    if walked[0] == "error":
        assert not accepted, f"the arrays accepted what the walk refuses: {walked[1]}"


def test_a_batch_below_the_threshold_is_walked_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """A few records are cheaper to walk than to set up arrays for: the arrays are not called."""

    def refuse(*_: object) -> None:
        raise AssertionError("walked as arrays")

    monkeypatch.setattr("kq.proto.arrays.walk_records", refuse)
    small = encode_batch([NewRecord(None, b"v")] * (ARRAY_WALK_RECORDS_MIN - 1), NONE)
    assert check(small, arrays=True)[0] == "ok"


# Runs of records of one length (proto/arrays.py `_record_starts` takes them whole): records short
# enough for one-byte lengths, then two-byte ones, then a few of varied lengths, then a run again.
RUNS = encode_batch(
    [NewRecord(b"k", b"s" * 20)] * 150
    + [NewRecord(b"key", b"v" * 100)] * 150
    + [NewRecord(None, b"w" * n) for n in range(5)]
    + [NewRecord(b"key", b"v" * 100)] * 100,
    NONE,
    base_timestamp_ms=BASE_TIME_MS,
)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=3))
def test_a_corrupted_run_of_equal_records_is_judged_alike_both_ways(flips: list[tuple[int, int]]) -> None:
    """Within runs of equal records too (a length byte changed to another length, or to look like
    the next record's): the same verdict, message and work both ways."""
    assert arrays_accept(RUNS)
    data = bytearray(RUNS)
    for at, value in flips:
        data[BATCH_HEADER_BYTES + at % (len(data) - BATCH_HEADER_BYTES)] = value
    batch = restamped(data)
    assert check(batch, arrays=True) == check(batch, arrays=False)
    with contextlib.suppress(MalformedBatchError):  # The header's own check refused it.
        arrays_accept(batch)  # Read padded and not: the same answer.


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 404), st.integers(0, 1), st.integers(0, 255))
def test_a_run_with_one_length_byte_changed_is_judged_alike_both_ways(
    record: int, which: int, value: int
) -> None:
    """The corruption that matters to runs: one record's length byte (the first, or the second of a
    two-byte length), changed to any value."""
    header, buffer, start, end = checked_records(RUNS)
    region = joined([memoryview(buffer)[start:end]])
    starts = record_starts(np.frombuffer(region, np.uint8), region, header.record_count)
    assert starts is not None
    data = bytearray(RUNS)
    data[BATCH_HEADER_BYTES + int(starts[record]) + which] = value
    batch = restamped(data)
    assert check(batch, arrays=True) == check(batch, arrays=False)
    with contextlib.suppress(MalformedBatchError):
        arrays_accept(batch)  # Read padded and not: the same answer.


def test_runs_of_equal_records_are_taken_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of equal records is followed in a few numpy tests, not a step a record, and the
    starts they give are the chain's."""
    header, buffer, start, end = checked_records(RUNS)
    region = joined([memoryview(buffer)[start:end]])
    tests: list[int] = []
    real_run = arrays_module._run

    def counting(*args: Any) -> tuple[int, Any]:
        run, starts = real_run(*args)
        tests.append(run)
        return run, starts

    monkeypatch.setattr(arrays_module, "_run", counting)
    starts = record_starts(np.frombuffer(region, np.uint8), region, header.record_count)
    assert starts is not None and len(tests) <= 12 and sum(tests) >= header.record_count - 40
    chain, position = [], 0
    for _ in range(header.record_count):  # The chain of lengths, one varint at a time.
        chain.append(position)
        length, position = read_varint(region, position, len(region), 5)
        position += length
    assert starts.tolist() == chain
