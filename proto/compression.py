"""Kafka's record-batch compression codecs, by the value of a RecordBatch v2's attribute bits 0-2.

When a batch is compressed, everything after its records-count field is one compressed stream
(proto/records.py). kq stores and serves that stream as the producer sent it; the edge and `apply`
expand it once, within a hard bound, only to validate the records inside. Each codec's stream is
the one Kafka's Java client writes and reads, so a batch kq accepts is readable by every Kafka
consumer (Java, librdkafka, kafka-python, aiokafka) that later fetches it verbatim:

    0 none
    1 gzip    one gzip member (RFC 1952); zlib expands it with `max_length`
    2 snappy  raw snappy, or snappy-java's "xerial" framing (magic, two versions, then blocks of
              int32 length + raw snappy); each raw block's declared length is checked before expanding
    3 lz4     one LZ4 *frame* with independent blocks (Java's reader refuses dependent ones)
    4 zstd    zstd frames, expanded straight into a buffer of the bound (a bomb stops when it is full)

Expanding is bounded: a stream that would expand beyond `size_max` is refused before it is expanded
in full, and a truncated stream, trailing bytes after the stream or a corrupt stream are refused
with CompressionError. Snappy and zstd go through `cramjam` (Rust bindings): zstandard's
stream reader returns a truncated frame's output without an error, and cramjam also gives Kafka's
snappy codec, which kq had no library for.
"""

from __future__ import annotations

import gzip
import struct
import zlib

import cramjam
import lz4.frame

from kq.proto.limits import SNAPPY_XERIAL_BLOCKS_MAX

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4  # Kafka's attribute values.
CODECS = {"none": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}
CODEC_NAMES = {codec: name for name, codec in CODECS.items()}
GZIP_LEVEL = 6  # Java's GZIPOutputStream default; Python's gzip module defaults to a slower 9.
ZSTD_LEVEL = 3  # Kafka's default zstd level.
LZ4_BLOCK_SIZE = lz4.frame.BLOCKSIZE_MAX64KB  # What Kafka's Java client writes.
_GZIP_WINDOW_BITS = 16 + zlib.MAX_WBITS  # A gzip header and trailer, nothing else (no raw zlib).
_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_LZ4_BLOCK_INDEPENDENCE = 0x20  # Bit 5 of the frame descriptor's FLG byte.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_BYTES = 16  # Magic, then int32 version and int32 compatible version.
_XERIAL_BLOCK_LENGTH = struct.Struct(">i")
_ZSTD_FIRST_BUFFER_BYTES = 64 * 1024
_ZSTD_RATIO_GUESS = 8  # The first buffer holds a stream eight times its compressed size.


class CompressionError(ValueError):
    """A compressed stream that is corrupt, truncated, of an unknown codec or expands beyond its bound."""


def compress(data: bytes, codec: int) -> bytes:
    """`data` compressed with `codec` the way Kafka's Java client would (NONE returns it unchanged)."""
    if codec == NONE:
        return data
    if codec == GZIP:
        return gzip.compress(data, compresslevel=GZIP_LEVEL, mtime=0)
    if codec == SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))  # Every Kafka client reads raw snappy.
    if codec == LZ4:
        return bytes(
            lz4.frame.compress(
                data,
                block_size=LZ4_BLOCK_SIZE,
                block_linked=False,
                content_checksum=False,
                block_checksum=False,
                store_size=False,
            )
        )
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data, level=ZSTD_LEVEL))
    raise CompressionError(f"unknown compression codec {codec}")


def decompress(data: bytes | memoryview, codec: int, size_max: int) -> bytes:
    """The bytes inside `data`; raises CompressionError when corrupt, truncated or over `size_max`."""
    if codec == NONE:
        if len(data) > size_max:
            raise CompressionError(f"{len(data)} bytes exceed the {size_max}-byte bound")
        return bytes(data)
    if codec == GZIP:
        return _gunzip(data, size_max)
    if codec == SNAPPY:
        return _unsnappy(data, size_max)
    if codec == LZ4:
        return _unlz4(data, size_max)
    if codec == ZSTD:
        return _unzstd(data, size_max)
    raise CompressionError(f"unknown compression codec {codec}")


def _gunzip(data: bytes | memoryview, size_max: int) -> bytes:
    """One gzip member, expanded to at most size_max + 1 bytes (one more tells a bomb from a fit)."""
    decompressor = zlib.decompressobj(wbits=_GZIP_WINDOW_BITS)
    try:
        expanded = decompressor.decompress(data, size_max + 1)
    except zlib.error as error:
        raise CompressionError(f"corrupt gzip stream: {error}") from error
    if len(expanded) > size_max:
        raise CompressionError(f"gzip stream expands beyond {size_max} bytes")
    if not decompressor.eof:
        raise CompressionError("gzip stream is cut short")
    if decompressor.unused_data:
        raise CompressionError(f"{len(decompressor.unused_data)} bytes after the gzip stream")
    return expanded


def _unlz4(data: bytes | memoryview, size_max: int) -> bytes:
    """One LZ4 frame of independent blocks, expanded to at most size_max + 1 bytes."""
    if len(data) < 7 or bytes(data[:4]) != _LZ4_MAGIC:
        raise CompressionError("not an LZ4 frame (Kafka's lz4 codec is the frame format)")
    if not data[4] & _LZ4_BLOCK_INDEPENDENCE:
        raise CompressionError("LZ4 frame with dependent blocks (Kafka's Java reader refuses them)")
    decompressor = lz4.frame.LZ4FrameDecompressor()
    try:
        expanded = bytes(decompressor.decompress(bytes(data), max_length=size_max + 1))
    except RuntimeError as error:  # python-lz4 raises RuntimeError for every frame error.
        raise CompressionError(f"corrupt LZ4 frame: {error}") from error
    if len(expanded) > size_max:
        raise CompressionError(f"LZ4 frame expands beyond {size_max} bytes")
    if not decompressor.eof:
        raise CompressionError("LZ4 frame is cut short")
    if decompressor.unused_data:
        raise CompressionError(f"{len(decompressor.unused_data)} bytes after the LZ4 frame")
    return expanded


def _unsnappy(data: bytes | memoryview, size_max: int) -> bytes:
    """Raw snappy, or xerial-framed blocks of raw snappy (snappy-java's framing: Kafka's Java client)."""
    if bytes(data[: len(_XERIAL_MAGIC)]) != _XERIAL_MAGIC:
        return _raw_snappy(data, size_max)
    if len(data) < _XERIAL_HEADER_BYTES:
        raise CompressionError("xerial snappy header is cut short")
    parts: list[bytes] = []
    position, expanded_bytes = _XERIAL_HEADER_BYTES, 0
    while position < len(data):
        if len(parts) >= SNAPPY_XERIAL_BLOCKS_MAX:
            raise CompressionError(f"more than {SNAPPY_XERIAL_BLOCKS_MAX} xerial snappy blocks")
        if position + _XERIAL_BLOCK_LENGTH.size > len(data):
            raise CompressionError("xerial snappy block length is cut short")
        (length,) = _XERIAL_BLOCK_LENGTH.unpack_from(data, position)
        start = position + _XERIAL_BLOCK_LENGTH.size
        if not 0 < length <= len(data) - start:
            raise CompressionError(f"xerial snappy block of {length} bytes does not fit the stream")
        part = _raw_snappy(data[start : start + length], size_max - expanded_bytes, size_max)
        parts.append(part)
        expanded_bytes += len(part)
        position = start + length
    return b"".join(parts)


def _raw_snappy(data: bytes | memoryview, size_max: int, bound_bytes: int | None = None) -> bytes:
    """One raw snappy block: its declared length is read and checked before anything is expanded.

    `size_max` is what is left of the bound, `bound_bytes` the whole bound (for the message).
    """
    try:
        declared = int(cramjam.snappy.decompress_raw_len(bytes(data)))
    except cramjam.DecompressionError as error:
        raise CompressionError(f"corrupt snappy block: {error}") from error
    if declared > size_max:
        raise CompressionError(f"snappy stream expands beyond {bound_bytes or size_max} bytes")
    output = bytearray(declared)
    try:
        written = int(cramjam.snappy.decompress_raw_into(bytes(data), output))
    except cramjam.DecompressionError as error:
        raise CompressionError(f"corrupt snappy block: {error}") from error
    if written != declared:
        raise CompressionError(f"snappy block gave {written} bytes; it declares {declared}")
    return bytes(output)


def _unzstd(data: bytes | memoryview, size_max: int) -> bytes:
    """zstd frames expanded into a buffer, at most size_max + 1 bytes: a stream that fills that is refused.

    cramjam stops writing when the buffer is full, so a bomb costs at most the buffer; it also refuses
    a truncated or corrupt frame (where zstandard's stream reader returns the partial output). The
    buffer starts small and grows eightfold up to the bound, because a buffer of the bound for every
    batch (zeroed: 3 MiB) made checking a one-record zstd batch cost ~20 times the others; a larger
    stream is expanded again at each size, at most three times. A frame's declared window is only
    address space: pages are touched as output is written.
    """
    source = bytes(data)
    size = min(size_max + 1, max(_ZSTD_FIRST_BUFFER_BYTES, _ZSTD_RATIO_GUESS * len(source)))
    while True:
        output = bytearray(size)
        try:
            written = int(cramjam.zstd.decompress_into(source, output))
        except cramjam.DecompressionError as error:  # Corrupt, cut short, or more than the buffer holds.
            if size <= size_max:
                size = min(size_max + 1, size * 8)
                continue
            raise CompressionError(
                f"zstd stream corrupt, cut short or over {size_max} bytes: {error}"
            ) from error
        if written > size_max:
            raise CompressionError(f"zstd stream expands beyond {size_max} bytes")
        return bytes(output[:written])
