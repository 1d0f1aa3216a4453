"""Hypothesis strategies for records and corrupted batches, shared by the tests of the two walks of a
batch's records (the Python walk and the arrays: tests/storage/test_record_arrays.py,
tests/spark/test_columns.py)."""

from __future__ import annotations

import struct

import crc32c
from hypothesis import strategies as st

from kq.proto.records import CRC_START, NewRecord

BASE_TIME_MS = 1_700_000_000_000

blobs = st.one_of(
    st.none(),
    st.binary(max_size=20),  # Inline in an Arrow binary view (12 bytes or fewer) and not.
    st.binary(min_size=60, max_size=200),  # Two-byte lengths.
    st.integers(8_200, 8_300).map(lambda size: bytes([size % 251]) * size),  # Three-byte lengths.
)


def records(with_headers: bool) -> st.SearchStrategy[NewRecord]:
    """Records with null, short, two- and three-byte-length keys and values, timestamps one to six bytes
    from the batch's, and (`with_headers`) sometimes a header."""
    return st.builds(
        NewRecord,
        key=blobs,
        value=blobs,
        headers=st.one_of(st.just(()), st.just((("h", b"1"),))) if with_headers else st.just(()),
        timestamp_ms=st.one_of(
            st.none(),
            st.integers(BASE_TIME_MS - 100, BASE_TIME_MS + 100),  # One-byte deltas.
            st.integers(BASE_TIME_MS, BASE_TIME_MS + 2**40),  # Up to six bytes.
        ),
    )


def restamped(data: bytearray) -> bytes:
    """`data` with its CRC32C computed again, so a corruption of its records reaches the walk."""
    struct.pack_into(">I", data, CRC_START - 4, crc32c.crc32c(bytes(data[CRC_START:])))
    return bytes(data)
