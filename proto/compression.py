"""Compression of record batches (zstd, lz4): the producer compresses, storage keeps it, readers expand.

A compressed batch is the whole record batch (proto/records.py) compressed as one frame. Expanding
is bounded: a batch that would expand beyond `size_max` is refused before it is expanded in full.
"""

from __future__ import annotations

import io
import struct

import lz4.block
import zstandard

NONE, ZSTD, LZ4 = 0, 1, 2  # The Compression enum of kq.proto.
CODECS = {"none": NONE, "zstd": ZSTD, "lz4": LZ4}
ZSTD_LEVEL = 3
_LZ4_SIZE = struct.Struct("<I")  # lz4.block's stored-size prefix.


class CompressionError(ValueError):
    """A compressed batch that cannot be expanded within its limit."""


def compress(records: bytes, codec: int) -> bytes:
    """`records` compressed with `codec` (NONE returns them unchanged)."""
    if codec == NONE:
        return records
    if codec == ZSTD:
        return bytes(zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(records))
    if codec == LZ4:
        return bytes(lz4.block.compress(records, store_size=True))
    raise CompressionError(f"unknown compression codec {codec}")


def decompress(data: bytes, codec: int, size_max: int) -> bytes:
    """The record batch inside `data`; raises CompressionError when it is corrupt or over `size_max`."""
    if codec == NONE:
        return data
    try:
        if codec == ZSTD:
            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as reader:
                expanded = bytes(reader.read(size_max + 1))
        elif codec == LZ4:
            if len(data) < _LZ4_SIZE.size or _LZ4_SIZE.unpack_from(data)[0] > size_max:
                raise CompressionError(f"lz4 batch is empty or expands beyond {size_max} bytes")
            expanded = bytes(lz4.block.decompress(data))
        else:
            raise CompressionError(f"unknown compression codec {codec}")
    except (zstandard.ZstdError, lz4.block.LZ4BlockError) as error:
        raise CompressionError(f"corrupt compressed batch: {error}") from error
    if len(expanded) > size_max:
        raise CompressionError(f"compressed batch expands beyond {size_max} bytes")
    return expanded
