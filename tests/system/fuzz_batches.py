"""Record batches for the fuzz test: valid ones (proto/records.py, proto/compression.py) and mutations.

Each generator returns a `BatchCase`: the bytes of ProduceRequest.records, the record_count and
compression the request claims, and a short label for the failure report.
"""

from __future__ import annotations

import functools
import io
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass

import lz4.block
import lz4.frame
import zstandard

from kq.proto.compression import LZ4, NONE, ZSTD, compress
from kq.proto.limits import APPEND_BYTES_MAX
from kq.proto.records import encode_batch, encode_record

RECORD_BYTES_MAX = 1024 * 1024
RECORDS_PER_APPEND_MAX = 10_000
HEADERS_PER_RECORD_MAX = 1_000
HEADER_NAME_BYTES_MAX = 1_024
CODEC_NAMES = {NONE: "none", ZSTD: "zstd", LZ4: "lz4"}


@dataclass(frozen=True, slots=True)
class BatchCase:
    """What a produce request carries: records as sent, the claimed count and codec, and a label."""

    records: bytes
    record_count: int
    compression: int
    label: str


def _record(rng: random.Random) -> bytes:
    key = rng.choice([None, b"", b"k", rng.randbytes(rng.randint(1, 40))])
    value = rng.choice([None, b"", b"v", rng.randbytes(rng.randint(1, 300))])
    headers = [
        (rng.choice(["h", "", "ü", "x" * 30]), rng.randbytes(rng.randint(0, 10)))
        for _ in range(rng.choice([0, 0, 1, 3]))
    ]
    timestamp_ms = rng.choice([0, 0, 1, 1_700_000_000_000, 2**63 - 1])
    return encode_record(key, value, headers, timestamp_ms)


def valid_records(rng: random.Random) -> list[bytes]:
    """One to twenty valid records (keys, values and headers present or absent)."""
    return [_record(rng) for _ in range(rng.choice([1, 1, 2, 5, 20]))]


def _raw_record(body: bytes, length: int | None = None) -> bytes:
    return struct.pack(">I", len(body) if length is None else length) + body


def _fields(
    attributes: int, timestamp_ms: int, key: bytes, value: bytes, headers: bytes, header_count: int
) -> bytes:
    return (
        struct.pack(">Bq", attributes, timestamp_ms)
        + struct.pack(">I", len(key))
        + key
        + struct.pack(">I", len(value))
        + value
        + struct.pack(">H", header_count)
        + headers
    )


def _header(name: bytes, value: bytes) -> bytes:
    return struct.pack(">H", len(name)) + name + struct.pack(">I", len(value)) + value


# Single records that break one rule of the layout each (the label says which).
BAD_RECORDS: tuple[tuple[str, bytes], ...] = (
    ("negative timestamp", _raw_record(_fields(3, -1, b"k", b"v", b"", 0))),
    ("unknown attribute bits", _raw_record(_fields(0xFF, 0, b"k", b"v", b"", 0))),
    ("key length without key-present bit", _raw_record(_fields(2, 0, b"k", b"v", b"", 0))),
    ("header name not UTF-8", _raw_record(_fields(3, 0, b"k", b"v", _header(b"\xff\xfe", b"x"), 1))),
    ("header count says 5, holds 1", _raw_record(_fields(3, 0, b"k", b"v", _header(b"h", b"x"), 5))),
    ("header count 65535, none present", _raw_record(_fields(3, 0, b"k", b"v", b"", 65_535))),
    ("header name length 1025", _raw_record(_fields(3, 0, b"", b"", _header(b"n" * 1_025, b""), 1))),
    ("record length 0xFFFFFFFF", _raw_record(_fields(3, 0, b"k", b"v", b"", 0), 0xFFFF_FFFF)),
    ("record length 0", _raw_record(b"", 0)),
    ("record shorter than its fixed fields", _raw_record(b"\x03" + b"\x00" * 8)),
    ("record length 1 short", _raw_record(_fields(3, 0, b"k", b"v", b"", 0)[:-1])),
    ("trailing bytes inside record", _raw_record(_fields(3, 0, b"k", b"v", b"", 0) + b"\x00\x00")),
    ("key length past the record", _raw_record(struct.pack(">Bq", 1, 0) + struct.pack(">I", 2**31) + b"k")),
    ("three bytes only", b"\x00\x00\x00"),
)


@functools.cache
def zstd_bomb() -> bytes:
    """A small zstd frame that expands one byte past APPEND_BYTES_MAX."""
    return bytes(zstandard.ZstdCompressor(level=3).compress(b"\x00" * (APPEND_BYTES_MAX + 1)))


def _zstd_without_size(data: bytes) -> bytes:
    """A zstd frame written as a stream: its header does not say the expanded size."""
    out = io.BytesIO()
    writer = zstandard.ZstdCompressor(level=3).stream_writer(out, closefd=False)
    writer.write(data)
    writer.flush(zstandard.FLUSH_FRAME)
    return out.getvalue()


def _lz4_with_size(claimed: int, data: bytes) -> bytes:
    return struct.pack("<I", claimed) + bytes(lz4.block.compress(data, store_size=False))


Maker = Callable[[random.Random], BatchCase]


def _valid(rng: random.Random) -> BatchCase:
    records = valid_records(rng)
    codec = rng.choice([NONE, ZSTD, LZ4])
    return BatchCase(
        compress(encode_batch(records), codec), len(records), codec, f"valid {CODEC_NAMES[codec]}"
    )


def _truncated(rng: random.Random) -> BatchCase:
    records = valid_records(rng)
    codec = rng.choice([NONE, ZSTD, LZ4])
    data = compress(encode_batch(records), codec)
    cut = rng.randrange(1, len(data))
    return BatchCase(
        data[:cut], len(records), codec, f"{CODEC_NAMES[codec]} batch cut to {cut}/{len(data)} bytes"
    )


def _count_lying(rng: random.Random) -> BatchCase:
    records = valid_records(rng)
    codec = rng.choice([NONE, ZSTD, LZ4])
    claimed = rng.choice([0, len(records) - 1, len(records) + 1, 10_000, 10_001, 2**32 - 1])
    data = compress(encode_batch(records), codec)
    return BatchCase(data, claimed, codec, f"{CODEC_NAMES[codec]} batch of {len(records)} claiming {claimed}")


def _empty(rng: random.Random) -> BatchCase:
    codec = rng.choice([NONE, ZSTD, LZ4])
    claimed = rng.choice([0, 1])
    return BatchCase(compress(b"", codec), claimed, codec, f"{CODEC_NAMES[codec]} of b'' claiming {claimed}")


def _bit_flips(rng: random.Random) -> BatchCase:
    records = valid_records(rng)
    codec = rng.choice([NONE, ZSTD, LZ4])
    data = bytearray(compress(encode_batch(records), codec))
    flips = rng.randint(1, 3)
    for _ in range(flips):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return BatchCase(bytes(data), len(records), codec, f"{CODEC_NAMES[codec]} batch with {flips} bit flip(s)")


def _garbage_compressed(rng: random.Random) -> BatchCase:
    codec = rng.choice([ZSTD, LZ4])
    kind = rng.randrange(4)
    if kind == 0:
        data, what = rng.randbytes(rng.choice([1, 4, 5, 16, 200])), "random bytes"
    elif kind == 1:
        data, what = b"\x28\xb5\x2f\xfd" + rng.randbytes(rng.randint(0, 40)), "zstd magic then random bytes"
    elif kind == 2:
        data, what = _lz4_with_size(rng.choice([0, 1, 2**31, 2**32 - 1]), b"abc"), "lz4 with a lying size"
    else:
        data, what = bytes(lz4.frame.compress(encode_batch(valid_records(rng)))), "lz4 frame format"
    return BatchCase(data, rng.choice([0, 1]), codec, f"{CODEC_NAMES[codec]} label on {what}")


def _codec_mismatch(rng: random.Random) -> BatchCase:
    records = valid_records(rng)
    sent, claimed = rng.choice(
        [(NONE, ZSTD), (NONE, LZ4), (ZSTD, NONE), (LZ4, NONE), (ZSTD, LZ4), (LZ4, ZSTD)]
    )
    data = compress(encode_batch(records), sent)
    return BatchCase(
        data, len(records), claimed, f"{CODEC_NAMES[sent]} bytes labelled {CODEC_NAMES[claimed]}"
    )


def _zstd_frames(rng: random.Random) -> BatchCase:
    first, second = valid_records(rng), valid_records(rng)
    kind = rng.randrange(4)
    one, two = compress(encode_batch(first), ZSTD), compress(encode_batch(second), ZSTD)
    if kind == 0:
        return BatchCase(one + two, len(first), ZSTD, "two zstd frames, count of the first")
    if kind == 1:
        return BatchCase(one + two, len(first) + len(second), ZSTD, "two zstd frames, count of both")
    if kind == 2:
        return BatchCase(one + b"\x00garbage", len(first), ZSTD, "zstd frame then trailing garbage")
    return BatchCase(_zstd_without_size(encode_batch(first)), len(first), ZSTD, "zstd frame without a size")


def _bomb(rng: random.Random) -> BatchCase:
    return BatchCase(zstd_bomb(), rng.choice([0, 1]), ZSTD, "zstd frame expanding past 3 MiB")


def _bad_record(rng: random.Random) -> BatchCase:
    label, record = rng.choice(BAD_RECORDS)
    codec = rng.choice([NONE, NONE, ZSTD, LZ4])
    records = [*valid_records(rng)[:1], record] if rng.random() < 0.5 else [record]
    return BatchCase(
        compress(encode_batch(records), codec), len(records), codec, f"{CODEC_NAMES[codec]}: {label}"
    )


def _many_records(rng: random.Random) -> BatchCase:
    count = rng.choice([RECORDS_PER_APPEND_MAX, RECORDS_PER_APPEND_MAX + 1])
    record = encode_record(None, b"")
    codec = rng.choice([NONE, ZSTD])
    return BatchCase(
        compress(record * count, codec), count, codec, f"{count} empty records ({CODEC_NAMES[codec]})"
    )


def _many_headers(rng: random.Random) -> BatchCase:
    count = rng.choice([HEADERS_PER_RECORD_MAX, HEADERS_PER_RECORD_MAX + 1])
    record = encode_record(b"k", b"v", [("h", b"")] * count)
    return BatchCase(record, 1, NONE, f"one record with {count} headers")


def _big_record(rng: random.Random) -> BatchCase:
    size = rng.choice([RECORD_BYTES_MAX - 1, RECORD_BYTES_MAX + 1])
    codec = rng.choice([NONE, ZSTD])
    record = encode_record(None, b"\x00" * size)
    return BatchCase(compress(record, codec), 1, codec, f"one record of {size} bytes ({CODEC_NAMES[codec]})")


def _oversized(rng: random.Random) -> BatchCase:
    size = rng.choice([APPEND_BYTES_MAX + 1, 9 * 1024 * 1024])
    return BatchCase(b"\x00" * size, 1, NONE, f"{size} bytes of records")


COMMON: tuple[Maker, ...] = (
    _valid,
    _valid,
    _valid,
    _truncated,
    _count_lying,
    _empty,
    _bit_flips,
    _garbage_compressed,
    _codec_mismatch,
    _zstd_frames,
    _bomb,
    _bad_record,
    _many_headers,
)
LARGE: tuple[Maker, ...] = (_many_records, _big_record, _oversized)  # Megabytes each: rare.


def batch_case(rng: random.Random, large: bool) -> BatchCase:
    """A valid or mutated batch; `large` picks one of the megabyte-sized cases."""
    return rng.choice(LARGE if large else COMMON)(rng)
