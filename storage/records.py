"""The stored form of one appended batch, with a CRC32C that is verified on every read.

Layout of a stored batch value (integers big-endian):

    crc32c          u32   over every byte after this field
    base_offset     u64   offset of the first record (also in the LMDB key; a mismatch is corruption)
    record_count    u32   records in the batch; they hold offsets base_offset .. base_offset+count-1
    append_time_ms  i64   the leader's clock when it proposed the entry: the timestamp of records
                          whose producer gave none (Kafka's LogAppendTime)
    compression     u8    0 none, 1 zstd, 2 lz4 (proto/compression.py)
    records               the records exactly as the producer's batch carried them (layout in
                          proto/records.py, compressed as `compression` says; opaque to storage)

Each record is therefore covered by its batch's checksum, and carries its offset (base + position),
timestamp, key, value and headers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c as crc32c_module

from kq.storage.errors import CorruptRecordError

_HEADER = struct.Struct(">IQIqB")  # crc, base offset, record count, append time, compression
HEADER_BYTES = _HEADER.size


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """A batch read back from a partition log, checksum verified."""

    base_offset: int
    record_count: int
    append_time_ms: int
    records: bytes
    compression: int = 0

    @property
    def next_offset(self) -> int:
        """The offset just past this batch."""
        return self.base_offset + self.record_count


def encode_batch(
    base_offset: int, record_count: int, append_time_ms: int, records: bytes, compression: int = 0
) -> bytes:
    """The stored value of a batch."""
    assert record_count > 0
    head = _HEADER.pack(0, base_offset, record_count, append_time_ms, compression)[4:]
    checksum = crc32c_module.crc32c(records, crc32c_module.crc32c(head))
    return struct.pack(">I", checksum) + head + records


def decode_batch(raw: bytes | memoryview, expected_base_offset: int) -> StoredBatch:
    """Decodes a stored batch, verifying its checksum and offset; raises CorruptRecordError."""
    if len(raw) < HEADER_BYTES:
        raise CorruptRecordError(f"batch at offset {expected_base_offset} is shorter than its header")
    checksum, base_offset, record_count, append_time_ms, compression = _HEADER.unpack_from(raw, 0)
    if crc32c_module.crc32c(memoryview(raw)[4:]) != checksum:
        raise CorruptRecordError(f"CRC32C mismatch in batch at offset {expected_base_offset}")
    if base_offset != expected_base_offset:
        raise CorruptRecordError(f"batch stored under offset {expected_base_offset} says {base_offset}")
    return StoredBatch(base_offset, record_count, append_time_ms, bytes(raw[HEADER_BYTES:]), compression)
