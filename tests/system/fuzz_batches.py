"""Record batches for the fuzz test: valid Kafka RecordBatch v2 (proto/records.py, every codec of
proto/compression.py) and mutations of each part of one.

Each generator returns a `BatchCase`: the bytes of ProduceRequest.records (the count, the codec and the
producer fields travel inside the batch) and a short label for the failure report. A mutation keeps
the batch's CRC32C right unless it is what the case breaks, so the mutation reaches the check it
aims at (the header, the decompressor, the record walk).
"""

from __future__ import annotations

import functools
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass

import crc32c
import lz4.frame
import zstandard

from kq.proto.compression import CODEC_NAMES, GZIP, LZ4, NONE, SNAPPY, ZSTD, compress
from kq.proto.limits import APPEND_BYTES_MAX
from kq.proto.records import (
    CONTROL_FLAG,
    LOG_APPEND_TIME_FLAG,
    TRANSACTIONAL_FLAG,
    NewRecord,
    assemble_batch,
    encode_batch,
)

RECORD_BYTES_MAX = 1024 * 1024
RECORDS_PER_APPEND_MAX = 10_000
HEADERS_PER_RECORD_MAX = 1_000
HEADER_NAME_BYTES_MAX = 1_024
CODECS = (NONE, GZIP, SNAPPY, LZ4, ZSTD)
NOW_MS = 1_700_000_000_000
Producer = tuple[int, int, int]  # (producer id, epoch, base sequence); (-1, -1, -1): not idempotent.
NOT_IDEMPOTENT: Producer = (-1, -1, -1)


@dataclass(frozen=True, slots=True)
class BatchCase:
    """What a produce request carries (one batch, as sent) and a label for the report."""

    records: bytes
    label: str


def _record(rng: random.Random) -> NewRecord:
    key = rng.choice([None, b"", b"k", rng.randbytes(rng.randint(1, 40))])
    value = rng.choice([None, b"", b"v", rng.randbytes(rng.randint(1, 300))])
    headers = tuple(
        (rng.choice(["h", "", "ü", "x" * 30]), rng.randbytes(rng.randint(0, 10)))
        for _ in range(rng.choice([0, 0, 1, 3]))
    )
    timestamp_ms = rng.choice([None, 0, 1, NOW_MS, 2**62])
    return NewRecord(key, value, headers, timestamp_ms)


def valid_records(rng: random.Random) -> list[NewRecord]:
    """One to twenty valid records (keys, values and headers present or absent)."""
    return [_record(rng) for _ in range(rng.choice([1, 1, 2, 5, 20]))]


def _encoded(records: list[NewRecord]) -> bytes:
    """The records of a batch, back to back and uncompressed (what follows the 61-byte header)."""
    return encode_batch(records, NONE, base_timestamp_ms=NOW_MS)[61:]


def _forged(
    records: bytes, count: int, codec: int, producer: Producer = NOT_IDEMPOTENT, **fields: int
) -> bytes:
    """A batch around `records` (compressed with `codec`) with any header field forged; CRC right."""
    payload = compress(records, codec) if fields.pop("compress", 1) else records
    values = {
        "attributes": codec,
        "last_offset_delta": count - 1,
        "base_timestamp_ms": NOW_MS,
        "max_timestamp_ms": NOW_MS,
        "producer_id": producer[0],
        "producer_epoch": producer[1],
        "base_sequence": producer[2],
        "record_count": count,
    }
    values.update(fields)
    tail = struct.pack(">hiqqqhii", *values.values())
    crc = crc32c.crc32c(payload, crc32c.crc32c(tail))
    head = struct.pack(">qiibI", 0, 49 + len(payload), -1, 2, crc)
    return head + tail + payload


def _varint(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def _body(
    index: int,
    *,
    timestamp_delta: bytes = b"\x00",
    key: bytes = _varint(1) + b"k",
    value: bytes = _varint(1) + b"v",
    headers: bytes = _varint(0),
) -> bytes:
    """A record body (after its length) with any field replaced by raw bytes."""
    return b"\x00" + timestamp_delta + _varint(index) + key + value + headers


def _framed(body: bytes, length: int | None = None) -> bytes:
    return _varint(len(body) if length is None else length) + body


def _header(name: bytes, value: bytes) -> bytes:
    return _varint(len(name)) + name + _varint(len(value)) + value


# Single records (at position `index`) that break one rule of the layout each (the label says which).
BAD_RECORDS: tuple[tuple[str, Callable[[int], bytes]], ...] = (
    ("negative timestamp", lambda i: _framed(_body(i, timestamp_delta=_varint(-NOW_MS - 5)))),
    ("offsetDelta of the next record", lambda i: _framed(_body(i + 1))),
    ("key length -2", lambda i: _framed(_body(i, key=_varint(-2)))),
    ("header name not UTF-8", lambda i: _framed(_body(i, headers=_varint(1) + _header(b"\xff\xfe", b"x")))),
    ("header count says 5, holds 1", lambda i: _framed(_body(i, headers=_varint(5) + _header(b"h", b"x")))),
    ("header count 2**31 - 1, none present", lambda i: _framed(_body(i, headers=_varint(2**31 - 1)))),
    ("header name length 1025", lambda i: _framed(_body(i, headers=_varint(1) + _header(b"n" * 1_025, b"")))),
    (
        "header value length -5",
        lambda i: _framed(_body(i, headers=_varint(1) + _varint(1) + b"h" + _varint(-5))),
    ),
    ("record length 2**31 - 1", lambda i: _framed(_body(i), 2**31 - 1)),
    ("record length 0", lambda i: _framed(b"", 0)),
    ("record length -1", lambda i: _framed(b"", -1)),
    ("record length 1 short", lambda i: _framed(_body(i)[:-1])),
    ("trailing bytes inside record", lambda i: _framed(_body(i) + b"\x00\x00")),
    ("key length past the record", lambda i: _framed(_body(i, key=_varint(2**30) + b"k"))),
    ("a six-byte varint", lambda i: _framed(_body(i, key=b"\x80\x80\x80\x80\x80\x00"))),
    ("a varint beyond int32", lambda i: _framed(_body(i, key=b"\xff\xff\xff\xff\x7f"))),
    ("an eleven-byte varlong", lambda i: _framed(_body(i, timestamp_delta=b"\x81" * 10 + b"\x00"))),
    ("three bytes only", lambda i: b"\x00\x00\x00"),
)


@functools.cache
def bomb(codec: int) -> bytes:
    """A small batch whose records expand one byte past APPEND_BYTES_MAX (8 MiB for snappy's blocks)."""
    size = APPEND_BYTES_MAX + 1 if codec != SNAPPY else 8 * 1024 * 1024
    return _forged(b"\x00" * size, 1, codec)


def _zstd_without_size(data: bytes) -> bytes:
    """A zstd frame written as a stream (as Java's client writes one): its header has no expanded size."""
    compressor = zstandard.ZstdCompressor(level=3).compressobj()
    return bytes(compressor.compress(data) + compressor.flush())


Maker = Callable[[random.Random, Producer], BatchCase]


def _valid(rng: random.Random, producer: Producer) -> BatchCase:
    codec = rng.choice(CODECS)
    data = encode_batch(valid_records(rng), codec, *producer, base_timestamp_ms=rng.choice([None, NOW_MS]))
    return BatchCase(data, f"valid {CODEC_NAMES[codec]}")


def _truncated(rng: random.Random, producer: Producer) -> BatchCase:
    codec = rng.choice(CODECS)
    data = encode_batch(valid_records(rng), codec, *producer)
    cut = rng.randrange(0, len(data))
    return BatchCase(data[:cut], f"{CODEC_NAMES[codec]} batch cut to {cut}/{len(data)} bytes")


def _count_lying(rng: random.Random, producer: Producer) -> BatchCase:
    records = valid_records(rng)
    codec = rng.choice(CODECS)
    claimed = rng.choice([0, len(records) - 1, len(records) + 1, 10_000, 10_001, -1, 2**31 - 1])
    data = _forged(_encoded(records), claimed, codec, producer)
    return BatchCase(data, f"{CODEC_NAMES[codec]} batch of {len(records)} claiming {claimed}")


def _empty(rng: random.Random, producer: Producer) -> BatchCase:
    codec = rng.choice(CODECS)
    claimed = rng.choice([0, 1])
    return BatchCase(
        _forged(b"", claimed, codec, producer), f"{CODEC_NAMES[codec]} of b'' claiming {claimed}"
    )


def _bit_flips(rng: random.Random, producer: Producer) -> BatchCase:
    codec = rng.choice(CODECS)
    data = bytearray(encode_batch(valid_records(rng), codec, *producer))
    flips = rng.randint(1, 3)
    for _ in range(flips):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    fixed = rng.random() < 0.5
    if fixed:  # The CRC made right again: the flips reach the header's fields, the stream, the records.
        struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    return BatchCase(bytes(data), f"{CODEC_NAMES[codec]} batch, {flips} bit flip(s), CRC fixed: {fixed}")


def _header_fields(rng: random.Random, producer: Producer) -> BatchCase:
    records = valid_records(rng)
    label, fields = rng.choice(
        [
            ("transactional", {"attributes": TRANSACTIONAL_FLAG}),
            ("control", {"attributes": CONTROL_FLAG}),
            ("LogAppendTime", {"attributes": LOG_APPEND_TIME_FLAG}),
            ("attribute bit 6", {"attributes": 0x40}),
            ("attribute bit 15", {"attributes": -0x8000}),
            ("codec 5", {"attributes": 5, "compress": 0}),
            ("codec 7", {"attributes": 7, "compress": 0}),
            ("lastOffsetDelta 0", {"last_offset_delta": 0}),
            ("lastOffsetDelta -1", {"last_offset_delta": -1}),
            ("baseTimestamp -2", {"base_timestamp_ms": -2}),
            ("baseTimestamp -1", {"base_timestamp_ms": -1}),
            ("maxTimestamp -9", {"max_timestamp_ms": -9}),
            ("producer id -2", {"producer_id": -2}),
            ("idempotent, epoch -1", {"producer_id": 1, "producer_epoch": -1, "base_sequence": 0}),
            ("idempotent, sequence -1", {"producer_id": 1, "producer_epoch": 0, "base_sequence": -1}),
            (
                "idempotent, sequence 2**31 - 1",
                {"producer_id": 1, "producer_epoch": 0, "base_sequence": 2**31 - 1},
            ),
        ]
    )
    data = _forged(_encoded(records), len(records), NONE, producer, **fields)
    return BatchCase(data, f"header field: {label}")


def _frame_fields(rng: random.Random, producer: Producer) -> BatchCase:
    """The fields before the CRC: magic, batchLength, partitionLeaderEpoch, base offset."""
    data = bytearray(encode_batch(valid_records(rng), rng.choice(CODECS), *producer))
    label, position, packing, value = rng.choice(
        [
            ("magic 0", 16, ">b", 0),
            ("magic 1", 16, ">b", 1),
            ("magic 3", 16, ">b", 3),
            ("batchLength + 1", 8, ">i", len(data) - 11),
            ("batchLength - 1", 8, ">i", len(data) - 13),
            ("batchLength -1", 8, ">i", -1),
            ("partitionLeaderEpoch 7", 12, ">i", 7),
            ("base offset 2**63 - 1", 0, ">q", 2**63 - 1),
            ("base offset -1", 0, ">q", -1),
        ]
    )
    struct.pack_into(packing, data, position, value)
    return BatchCase(bytes(data), f"frame field: {label}")


def _garbage_compressed(rng: random.Random, producer: Producer) -> BatchCase:
    codec = rng.choice([GZIP, SNAPPY, LZ4, ZSTD])
    records = _encoded(valid_records(rng))
    payload, what = rng.choice(
        [
            (rng.randbytes(rng.choice([1, 4, 5, 16, 200])), "random bytes"),
            (b"\x28\xb5\x2f\xfd" + rng.randbytes(rng.randint(0, 40)), "zstd magic then random bytes"),
            (b"\x04\x22\x4d\x18" + rng.randbytes(rng.randint(0, 40)), "lz4 magic then random bytes"),
            (b"\x1f\x8b\x08\x00" + rng.randbytes(rng.randint(0, 40)), "gzip magic then random bytes"),
            (b"\x82SNAPPY\x00" + rng.randbytes(rng.randint(0, 40)), "xerial magic then random bytes"),
            (bytes(lz4.frame.compress(records * 2_000, block_linked=True)), "lz4 frame of linked blocks"),
            (compress(records, GZIP) + b"\x00junk", "gzip then trailing bytes"),
            (compress(records, LZ4) + compress(records, LZ4), "two lz4 frames"),
        ]
    )
    return BatchCase(
        _forged(payload, 1, codec, producer, compress=0), f"{CODEC_NAMES[codec]} label on {what}"
    )


def _codec_mismatch(rng: random.Random, producer: Producer) -> BatchCase:
    records = valid_records(rng)
    sent, claimed = rng.sample(CODECS, 2)
    data = _forged(compress(_encoded(records), sent), len(records), claimed, producer, compress=0)
    return BatchCase(data, f"{CODEC_NAMES[sent]} bytes labelled {CODEC_NAMES[claimed]}")


def _zstd_frames(rng: random.Random, producer: Producer) -> BatchCase:
    first = valid_records(rng)
    one = compress(_encoded(first), ZSTD)
    second = rng.randint(1, 5)
    two = _zstd_frame_of(second, len(first))  # Its records numbered on from the first frame's.
    data, what = rng.choice(
        [
            (
                _forged(one + two, len(first), ZSTD, producer, compress=0),
                "two zstd frames, count of the first",
            ),
            (
                _forged(one + two, len(first) + second, ZSTD, producer, compress=0),
                "two zstd frames, count of both",
            ),
            (
                _forged(one + b"\x00garbage", len(first), ZSTD, producer, compress=0),
                "zstd frame, then garbage",
            ),
            (
                _forged(_zstd_without_size(_encoded(first)), len(first), ZSTD, producer, compress=0),
                "zstd frame without a size",
            ),
        ]
    )
    return BatchCase(data, what)


def _zstd_frame_of(count: int, first_index: int) -> bytes:
    """A zstd frame of `count` records numbered from `first_index`."""
    encoded = b"".join(
        _framed(_body(first_index + i, key=_varint(-1), value=_varint(1) + b"v")) for i in range(count)
    )
    return compress(encoded, ZSTD)


def _bomb(rng: random.Random, producer: Producer) -> BatchCase:
    codec = rng.choice([GZIP, SNAPPY, LZ4, ZSTD])
    return BatchCase(bomb(codec), f"{CODEC_NAMES[codec]} records expanding past 3 MiB")


def _bad_record(rng: random.Random, producer: Producer) -> BatchCase:
    label, make = rng.choice(BAD_RECORDS)
    codec = rng.choice([NONE, NONE, GZIP, SNAPPY, LZ4, ZSTD])
    if rng.random() < 0.5:
        records, count = _encoded(valid_records(rng)[:1]) + make(1), 2
    else:
        records, count = make(0), 1
    return BatchCase(_forged(records, count, codec, producer), f"{CODEC_NAMES[codec]}: {label}")


def _several_batches(rng: random.Random, producer: Producer) -> BatchCase:
    """Two whole batches in one request: a Kafka records field may hold several, a kq request one."""
    first = encode_batch(valid_records(rng), rng.choice(CODECS), *producer)
    return BatchCase(first + encode_batch(valid_records(rng)), "two batches in one request")


def _old_format(rng: random.Random, producer: Producer) -> BatchCase:
    """A batch in kq's own layout before RecordBatch v2 (what an old client would still send)."""
    body = struct.pack(">BqI", 3, NOW_MS, 1) + b"k" + struct.pack(">I", 1) + b"v" + struct.pack(">H", 0)
    return BatchCase(struct.pack(">I", len(body)) + body, "kq's batch layout before RecordBatch v2")


def _many_records(rng: random.Random, producer: Producer) -> BatchCase:
    count = rng.choice([RECORDS_PER_APPEND_MAX, RECORDS_PER_APPEND_MAX + 1])
    codec = rng.choice([NONE, ZSTD])
    data = encode_batch([NewRecord(None, b"")] * count, codec, *producer)
    return BatchCase(data, f"{count} empty records ({CODEC_NAMES[codec]})")


def _many_headers(rng: random.Random, producer: Producer) -> BatchCase:
    count = rng.choice([HEADERS_PER_RECORD_MAX, HEADERS_PER_RECORD_MAX + 1])
    data = encode_batch([NewRecord(b"k", b"v", (("h", b""),) * count)], NONE, *producer)
    return BatchCase(data, f"one record with {count} headers")


def _big_record(rng: random.Random, producer: Producer) -> BatchCase:
    size = rng.choice([RECORD_BYTES_MAX - 1, RECORD_BYTES_MAX + 1])
    codec = rng.choice([NONE, ZSTD, LZ4])
    data = encode_batch([NewRecord(None, b"\x00" * size)], codec, *producer)
    return BatchCase(data, f"one record of {size} bytes ({CODEC_NAMES[codec]})")


def _oversized(rng: random.Random, producer: Producer) -> BatchCase:
    size = rng.choice([APPEND_BYTES_MAX + 1, 9 * 1024 * 1024])
    return BatchCase(assemble_batch(b"\x00" * size, 1, NOW_MS, NOW_MS), f"{size} bytes of records")


COMMON: tuple[Maker, ...] = (
    _valid,
    _valid,
    _valid,
    _truncated,
    _count_lying,
    _empty,
    _bit_flips,
    _header_fields,
    _frame_fields,
    _garbage_compressed,
    _codec_mismatch,
    _zstd_frames,
    _bomb,
    _bad_record,
    _several_batches,
    _old_format,
    _many_headers,
)
LARGE: tuple[Maker, ...] = (_many_records, _big_record, _oversized)  # Megabytes each: rare.


def batch_case(rng: random.Random, large: bool, producer: Producer = NOT_IDEMPOTENT) -> BatchCase:
    """A valid or mutated batch, stamped with `producer`; `large` picks a megabyte-sized case."""
    return rng.choice(LARGE if large else COMMON)(rng, producer)
