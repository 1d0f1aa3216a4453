"""Kafka's batch codecs: round trips for each, and bombs, garbage, truncation and trailing bytes refused
before anything is expanded beyond the bound."""

from __future__ import annotations

import gzip
import struct

import cramjam
import lz4.frame
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kq.proto.compression import (
    CODEC_NAMES,
    CODECS,
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    CompressionError,
    compress,
    decompress,
)
from kq.proto.limits import SNAPPY_XERIAL_BLOCKS_MAX

COMPRESSED = [GZIP, SNAPPY, LZ4, ZSTD]


def xerial(*blocks: bytes) -> bytes:
    """snappy-java's framing around raw snappy blocks (what Kafka's Java client writes)."""
    framed = [struct.pack(">i", len(block)) + block for block in blocks]
    return b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + b"".join(framed)


def test_the_codec_numbers_are_kafkas() -> None:
    """Attribute bits 0-2 of a RecordBatch, by name."""
    assert CODECS == {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
    assert CODEC_NAMES[4] == "zstd"


@pytest.mark.parametrize("codec", [NONE, *COMPRESSED])
@given(data=st.binary(max_size=5_000))
def test_round_trip(codec: int, data: bytes) -> None:
    """What is compressed expands to the same bytes."""
    assert decompress(compress(data, codec), codec, 10_000) == data


@given(st.lists(st.binary(min_size=1, max_size=3_000), min_size=1, max_size=5))
def test_xerial_framed_snappy_is_read(blocks: list[bytes]) -> None:
    """snappy-java's xerial framing expands to its blocks joined; raw snappy too."""
    framed = xerial(*(bytes(cramjam.snappy.compress_raw(block)) for block in blocks))
    assert decompress(framed, SNAPPY, 20_000) == b"".join(blocks)


@pytest.mark.parametrize("codec", COMPRESSED)
def test_streams_expanding_past_the_limit_are_refused(codec: int) -> None:
    """A highly compressible stream larger than the limit is refused (no unbounded expansion)."""
    bomb = compress(b"\0" * 1_000_000, codec)
    assert len(bomb) < 60_000
    with pytest.raises(CompressionError, match=r"beyond 100000|over 100000"):
        decompress(bomb, codec, 100_000)
    assert len(decompress(bomb, codec, 1_000_000)) == 1_000_000  # Exactly at the bound is fine.


def test_an_uncompressed_batch_over_the_bound_is_refused() -> None:
    """NONE has the same bound: the records themselves may not exceed it."""
    with pytest.raises(CompressionError, match="exceed"):
        decompress(b"x" * 11, NONE, 10)


@pytest.mark.parametrize("codec", COMPRESSED)
def test_garbage_truncation_and_trailing_bytes_are_refused(codec: int) -> None:
    """Bytes that are not a whole stream of the codec raise CompressionError, not a library error."""
    stream = compress(b"hello, kafka " * 100, codec)
    with pytest.raises(CompressionError):
        decompress(b"\x01\x02\x03\x04 definitely not compressed", codec, 100_000)
    for cut in (1, 3, len(stream) // 2):
        with pytest.raises(CompressionError):
            decompress(stream[:-cut], codec, 100_000)
    if (
        codec != ZSTD
    ):  # A zstd stream may hold several frames (Java's reader reads across them): not trailing.
        with pytest.raises(CompressionError):
            decompress(stream + b"\x00junk", codec, 100_000)


def test_lz4_frames_with_dependent_blocks_are_refused() -> None:
    """Kafka's Java reader refuses linked blocks, and kq serves the batch to it verbatim: refused here."""
    linked = lz4.frame.compress(b"abc" * 100_000, block_linked=True, block_size=lz4.frame.BLOCKSIZE_MAX64KB)
    with pytest.raises(CompressionError, match="dependent blocks"):
        decompress(linked, LZ4, 1_000_000)
    two_frames = compress(b"a", LZ4) + compress(b"b", LZ4)
    with pytest.raises(CompressionError, match="after the LZ4 frame"):
        decompress(two_frames, LZ4, 1_000)


def test_kq_writes_what_kafkas_java_client_writes() -> None:
    """gzip without a timestamp; LZ4 frames of independent 64 KiB blocks; raw snappy."""
    assert gzip.decompress(compress(b"x", GZIP)) == b"x" and compress(b"x", GZIP)[4:8] == b"\x00" * 4
    frame = compress(b"y" * 200_000, LZ4)
    assert frame[4] & 0x20 and (frame[5] >> 4) & 7 == 4  # FLG: independent blocks; BD: 64 KiB.
    assert bytes(cramjam.snappy.decompress_raw(compress(b"z", SNAPPY))) == b"z"


def test_xerial_snappy_is_bounded_in_blocks_and_lengths() -> None:
    """Too many xerial blocks, a block length past the stream, or a bomb block are refused."""
    one = bytes(cramjam.snappy.compress_raw(b"a"))
    with pytest.raises(CompressionError, match=f"more than {SNAPPY_XERIAL_BLOCKS_MAX}"):
        decompress(xerial(*[one] * (SNAPPY_XERIAL_BLOCKS_MAX + 1)), SNAPPY, 1_000_000)
    with pytest.raises(CompressionError, match="does not fit"):
        decompress(xerial(one)[:-1], SNAPPY, 1_000)
    with pytest.raises(CompressionError, match="cut short"):
        decompress(b"\x82SNAPPY\x00\x00\x00", SNAPPY, 1_000)
    big = bytes(cramjam.snappy.compress_raw(b"\x00" * 600))
    with pytest.raises(CompressionError, match="beyond 1000"):
        decompress(xerial(big, big), SNAPPY, 1_000)


def test_unknown_codecs_are_refused() -> None:
    """Attribute values 5-7 name no codec."""
    for codec in (5, 6, 7):
        with pytest.raises(CompressionError, match="unknown"):
            decompress(b"x", codec, 10)
        with pytest.raises(CompressionError, match="unknown"):
            compress(b"x", codec)
