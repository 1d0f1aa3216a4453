"""Record codec: round trips, and every corruption is detected rather than served."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage import CorruptRecordError, NewRecord
from storage.records import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, decode_record, encode_record

headers = st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=50)), max_size=5).map(tuple)
new_records = st.builds(
    NewRecord,
    timestamp_ms=st.integers(min_value=0, max_value=2**62),
    timestamp_type=st.sampled_from([TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME]),
    key=st.none() | st.binary(max_size=100),
    value=st.none() | st.binary(max_size=1000),
    headers=headers,
)


@given(st.integers(min_value=0, max_value=2**63), new_records)
def test_round_trip_keeps_every_field(offset: int, record: NewRecord) -> None:
    """What is encoded decodes to the same fields, absent and empty key/value kept apart."""
    decoded = decode_record(encode_record(offset, record), offset)
    assert (decoded.offset, decoded.timestamp_ms, decoded.timestamp_type) == (
        offset,
        record.timestamp_ms,
        record.timestamp_type,
    )
    assert (decoded.key, decoded.value, decoded.headers) == (record.key, record.value, record.headers)


@given(new_records, st.data())
def test_any_flipped_byte_is_detected(record: NewRecord, data: st.DataObject) -> None:
    """Flipping any bit of an encoded record makes decoding fail loudly."""
    encoded = bytearray(encode_record(7, record))
    position = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    encoded[position] ^= 1 << data.draw(st.integers(min_value=0, max_value=7))
    with pytest.raises(CorruptRecordError):
        decode_record(bytes(encoded), 7)


def test_record_under_the_wrong_offset_is_corrupt() -> None:
    """A record whose own offset disagrees with its key is refused."""
    encoded = encode_record(5, NewRecord(1, TIMESTAMP_CREATE_TIME, None, b"v"))
    with pytest.raises(CorruptRecordError, match="offset"):
        decode_record(encoded, 6)


def test_truncated_record_is_corrupt() -> None:
    """A record cut short fails its checksum."""
    encoded = encode_record(0, NewRecord(1, TIMESTAMP_CREATE_TIME, b"key", b"value"))
    with pytest.raises(CorruptRecordError):
        decode_record(encoded[:-1], 0)
