"""The stored form of one appended batch: Kafka's RecordBatch v2 as the producer sent it, its base offset
stamped, with the CRC32C it carries verified on every read.

The stored value holds nothing else: the v2 header has the record count, the timestamps and its own
CRC32C (over everything after the CRC field, so stamping the base offset, which it does not cover,
keeps it valid). The fields storage reads (integers big-endian, positions in bytes; the whole
layout is in proto/records.py):

     0  baseOffset       int64   the offset of the first record; equal to the LMDB key's (else corrupt)
     8  batchLength      int32   bytes after this field: the value is 12 + batchLength bytes
    16  magic            int8    2
    17  crc              uint32  CRC32C of bytes 21 to the end (compressed records included)
    23  lastOffsetDelta  int32   the batch holds offsets baseOffset .. baseOffset + lastOffsetDelta
    35  maxTimestamp     int64   the largest record timestamp (or the LogAppendTime)
    57  recordsCount     int32   lastOffsetDelta + 1 as appended; fewer once compacted (the offsets of
                                 the records compaction dropped are gaps; the batch's span stays)
    61  records          as the producer sent them (compressed or not; opaque to storage)

storage imports nothing of kq, so it reads these few fields itself rather than through proto/records.py;
tests/storage/test_records.py checks that the two readings agree.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c as crc32c_module

from kq.storage.errors import CorruptRecordError

_HEADER = struct.Struct(">qiibIhiqqqhii")  # baseOffset .. recordsCount, as in proto/records.py.
_BASE_OFFSET = struct.Struct(">q")
_LEADER_EPOCH = struct.Struct(">i")  # partitionLeaderEpoch, after baseOffset and batchLength.
_LEADER_EPOCH_AT = 12
_RECORD_COUNT = struct.Struct(">i")
HEADER_BYTES = _HEADER.size  # 61
_RECORD_COUNT_AT = 57
_LENGTH_PREFIX_BYTES = 12
_CRC_START = 21
_MAGIC = 2


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """A batch read back from a partition log, its CRC32C and base offset verified.

    `data` is the stored RecordBatch v2, byte for byte what a fetch serves (and what a Kafka Fetch
    response carries verbatim).
    """

    base_offset: int
    record_count: int  # Records in the batch: lastOffsetDelta + 1, or fewer once compacted.
    max_timestamp_ms: int
    data: bytes
    last_offset_delta: int

    @property
    def next_offset(self) -> int:
        """The offset just past this batch (past its last record as appended, compacted away or not)."""
        return self.base_offset + self.last_offset_delta + 1


def record_count_of(batch: bytes | memoryview) -> int:
    """The recordsCount field of a batch's header (the caller knows the batch is whole)."""
    return int(_RECORD_COUNT.unpack_from(batch, _RECORD_COUNT_AT)[0])


_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_AT = 23


def offset_span_of(batch: bytes | memoryview) -> int:
    """How many offsets a stored batch spans, lastOffsetDelta + 1: its record count until compaction
    drops some of its records (their offsets stay the batch's)."""
    return int(_LAST_OFFSET_DELTA.unpack_from(batch, _LAST_OFFSET_DELTA_AT)[0]) + 1


_MAX_TIMESTAMP = struct.Struct(">q")
_MAX_TIMESTAMP_AT = 35  # After baseOffset .. attributes, lastOffsetDelta and baseTimestamp.


def max_timestamp_of(batch: bytes | memoryview) -> int:
    """A stored batch's maxTimestamp (its LogAppendTime for such a batch), from its v2 header."""
    return int(_MAX_TIMESTAMP.unpack_from(batch, _MAX_TIMESTAMP_AT)[0])


_BATCH_LENGTH = struct.Struct(">i")
_BATCH_LENGTH_AT = 8


def stored_length_of(batch: bytes | memoryview) -> int:
    """The bytes of a whole stored batch, 12 + batchLength, read from its header: what a batch stored
    in pieces adds up to (storage/__init__.py, `record_pieces`)."""
    return _LENGTH_PREFIX_BYTES + int(_BATCH_LENGTH.unpack_from(batch, _BATCH_LENGTH_AT)[0])


def stamp_base_offset(batch: bytes | memoryview, base_offset: int, leader_epoch: int | None = None) -> bytes:
    """The stored value of `batch` (or of its first piece) at `base_offset`: only its first 8 bytes
    change, and with `leader_epoch` its partitionLeaderEpoch (bytes 12-15) too; neither is under the CRC."""
    if leader_epoch is None:
        return _BASE_OFFSET.pack(base_offset) + batch[_BASE_OFFSET.size :]
    return (
        _BASE_OFFSET.pack(base_offset)
        + batch[_BASE_OFFSET.size : _LEADER_EPOCH_AT]
        + _LEADER_EPOCH.pack(leader_epoch)
        + batch[_LEADER_EPOCH_AT + _LEADER_EPOCH.size :]
    )


def leader_epoch_of(batch: bytes | memoryview) -> int:
    """A stored batch's partitionLeaderEpoch (-1: none, as producers send it), from its v2 header."""
    return int(_LEADER_EPOCH.unpack_from(batch, _LEADER_EPOCH_AT)[0])


def decode_batch(raw: bytes | memoryview, expected_base_offset: int) -> StoredBatch:
    """Decodes a stored batch, verifying its layout, CRC32C and base offset; raises CorruptRecordError."""
    where = f"batch stored at offset {expected_base_offset}"
    if len(raw) < HEADER_BYTES:
        raise CorruptRecordError(f"{where} is shorter than its header")
    (
        base_offset,
        batch_length,
        _,
        magic,
        crc,
        _,
        last_offset_delta,
        _,
        max_timestamp_ms,
        _,
        _,
        _,
        record_count,
    ) = _HEADER.unpack_from(raw, 0)
    if magic != _MAGIC or _LENGTH_PREFIX_BYTES + batch_length != len(raw):
        raise CorruptRecordError(f"{where}: magic {magic}, batchLength {batch_length} for {len(raw)} bytes")
    if crc32c_module.crc32c(memoryview(raw)[_CRC_START:]) != crc:
        raise CorruptRecordError(f"CRC32C mismatch in {where}")
    if base_offset != expected_base_offset:
        raise CorruptRecordError(f"{where} says its base offset is {base_offset}")
    if not 0 < record_count <= last_offset_delta + 1:
        raise CorruptRecordError(f"{where}: {record_count} records, lastOffsetDelta {last_offset_delta}")
    return StoredBatch(base_offset, record_count, max_timestamp_ms, bytes(raw), last_offset_delta)
