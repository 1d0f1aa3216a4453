"""Record batches: round trips, malformed batches refused, and stored batches checked on every read."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kq.proto.records import (
    MalformedBatchError,
    count_records,
    encode_batch,
    encode_record,
    parse_batch,
    validate_batch,
)
from kq.storage import CorruptRecordError
from kq.storage.records import decode_batch
from kq.storage.records import encode_batch as encode_stored

headers = st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=50)), max_size=5).map(tuple)
records = st.lists(
    st.tuples(
        st.none() | st.binary(max_size=100),
        st.none() | st.binary(max_size=500),
        headers,
        st.integers(min_value=0, max_value=2**62),
    ),
    min_size=1,
    max_size=20,
)


@given(records)
def test_batch_round_trip_keeps_every_field(
    fields: list[tuple[bytes | None, bytes | None, tuple[tuple[str, bytes], ...], int]],
) -> None:
    """Encoded records decode to the same fields, absent and empty key/value kept apart."""
    batch = encode_batch(
        encode_record(key, value, headers, timestamp) for key, value, headers, timestamp in fields
    )
    decoded = parse_batch(batch, 1_000, 1_000)
    assert count_records(batch) == len(fields)
    assert [(r.key, r.value, r.headers, r.timestamp_ms) for r in decoded] == fields


@given(records, st.data())
def test_truncated_batches_are_refused(
    fields: list[tuple[bytes | None, bytes | None, tuple[tuple[str, bytes], ...], int]], data: st.DataObject
) -> None:
    """Any batch cut inside a record fails the leader's check instead of being stored."""
    encoded = [encode_record(key, value, headers, timestamp) for key, value, headers, timestamp in fields]
    batch = encode_batch(encoded)
    boundaries = {sum(len(record) for record in encoded[:i]) for i in range(len(encoded) + 1)}
    cut = data.draw(st.integers(min_value=1, max_value=len(batch) - 1).filter(lambda c: c not in boundaries))
    with pytest.raises(MalformedBatchError):
        parse_batch(batch[:cut], 1_000, 1_000)


def test_batch_limits_and_garbage_are_refused() -> None:
    """Too many records or headers, unknown attribute bits and garbage are all refused."""
    batch = encode_batch([encode_record(None, b"v")] * 3)
    with pytest.raises(MalformedBatchError, match="more than 2 records"):
        parse_batch(batch, 2, 10)
    with pytest.raises(MalformedBatchError, match="headers"):
        parse_batch(encode_record(None, b"v", [("a", b"1"), ("b", b"2")]), 10, 1)
    flagged = bytearray(encode_record(None, b"v"))
    flagged[4] |= 0x80
    with pytest.raises(MalformedBatchError, match="attribute"):
        parse_batch(bytes(flagged), 10, 10)
    with pytest.raises(MalformedBatchError):
        parse_batch(b"\xff" * 9, 10, 10)


@given(st.binary(min_size=1, max_size=300), st.data())
def test_any_flipped_bit_in_a_stored_batch_is_detected(records_bytes: bytes, data: st.DataObject) -> None:
    """Flipping any bit of a stored batch makes decoding fail loudly."""
    stored = bytearray(encode_stored(7, 3, 1_000, records_bytes))
    position = data.draw(st.integers(min_value=0, max_value=len(stored) - 1))
    stored[position] ^= 1 << data.draw(st.integers(min_value=0, max_value=7))
    with pytest.raises(CorruptRecordError):
        decode_batch(bytes(stored), 7)


def test_stored_batch_round_trips_and_checks_its_offset() -> None:
    """A stored batch gives back its records; stored under the wrong offset it is corrupt."""
    stored = encode_stored(5, 2, 1_000, b"payload")
    batch = decode_batch(stored, 5)
    assert (batch.base_offset, batch.record_count, batch.append_time_ms, batch.records) == (
        5,
        2,
        1_000,
        b"payload",
    )
    assert batch.next_offset == 7
    with pytest.raises(CorruptRecordError, match="offset"):
        decode_batch(stored, 6)


@given(records, st.data())
def test_validator_and_decoder_agree_on_any_damaged_batch(
    fields: list[tuple[bytes | None, bytes | None, tuple[tuple[str, bytes], ...], int]], data: st.DataObject
) -> None:
    """The leader's allocation-free check accepts exactly the batches the decoder can read."""
    batch = bytearray(
        encode_batch(
            encode_record(key, value, headers, timestamp) for key, value, headers, timestamp in fields
        )
    )
    for _ in range(data.draw(st.integers(min_value=0, max_value=3))):
        position = data.draw(st.integers(min_value=0, max_value=len(batch) - 1))
        batch[position] = data.draw(st.integers(min_value=0, max_value=255))
    try:
        decoded: int | None = len(parse_batch(bytes(batch), 1_000, 1_000))
    except MalformedBatchError:
        decoded = None
    try:
        validated: int | None = validate_batch(bytes(batch), 1_000, 1_000, 1 << 30, 1 << 16)
    except MalformedBatchError:
        validated = None
    assert validated == decoded
