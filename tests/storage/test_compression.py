"""Batch compression: round trips for every codec, and bombs or garbage refused before expanding."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kq.proto.compression import LZ4, NONE, ZSTD, CompressionError, compress, decompress


@pytest.mark.parametrize("codec", [NONE, ZSTD, LZ4])
@given(data=st.binary(max_size=5_000))
def test_round_trip(codec: int, data: bytes) -> None:
    """What is compressed expands to the same bytes."""
    assert decompress(compress(data, codec), codec, 10_000) == data


@pytest.mark.parametrize("codec", [ZSTD, LZ4])
def test_batches_expanding_past_the_limit_are_refused(codec: int) -> None:
    """A highly compressible batch larger than the limit is refused (no unbounded expansion)."""
    bomb = compress(b"\0" * 1_000_000, codec)
    assert len(bomb) < 10_000
    with pytest.raises(CompressionError):
        decompress(bomb, codec, 100_000)


@pytest.mark.parametrize("codec", [ZSTD, LZ4])
def test_garbage_is_refused(codec: int) -> None:
    """Bytes that are not a frame of the codec raise CompressionError, not a library error."""
    with pytest.raises(CompressionError):
        decompress(b"\x01\x02\x03\x04 definitely not compressed", codec, 100_000)
