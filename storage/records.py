"""Binary encoding of one stored record, with a CRC32C that is verified on every decode.

Layout of an encoded record (all integers big-endian):

    crc32c        u32   over every byte after this field
    offset        u64   the record's offset (also in the LMDB key; a mismatch is corruption)
    attributes    u8    bit 0: key present, bit 1: value present, bit 2: LogAppendTime
    timestamp_ms  i64
    key_length    u32   then `key_length` bytes (0 and absent when bit 0 is clear)
    value_length  u32   then `value_length` bytes (0 and absent when bit 1 is clear)
    header_count  u16   then per header: name_length u16, name (UTF-8), value_length u32, value
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c as crc32c_module

from storage.errors import CorruptRecordError

_PREFIX = struct.Struct(">IQBq")  # crc, offset, attributes, timestamp
_LENGTH = struct.Struct(">I")
_SHORT = struct.Struct(">H")
_KEY_PRESENT = 0x01
_VALUE_PRESENT = 0x02
_LOG_APPEND_TIME = 0x04

TIMESTAMP_CREATE_TIME = 0
TIMESTAMP_LOG_APPEND_TIME = 1

HEADER_COUNT_MAX = 1_000
HEADER_NAME_BYTES_MAX = 1_024


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A record as it lies in a partition log."""

    offset: int
    timestamp_ms: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class NewRecord:
    """A record about to be appended: everything but its offset, which the log assigns."""

    timestamp_ms: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


def crc32c(data: bytes | memoryview) -> int:
    """CRC32C (Castagnoli) of `data`."""
    return int(crc32c_module.crc32c(data))


def encode_record(offset: int, record: NewRecord) -> bytes:
    """Encodes `record` at `offset` in the layout of this module's docstring."""
    assert len(record.headers) <= HEADER_COUNT_MAX
    attributes = 0
    parts: list[bytes] = []
    if record.key is not None:
        attributes |= _KEY_PRESENT
        parts += (_LENGTH.pack(len(record.key)), record.key)
    else:
        parts.append(_LENGTH.pack(0))
    if record.value is not None:
        attributes |= _VALUE_PRESENT
        parts += (_LENGTH.pack(len(record.value)), record.value)
    else:
        parts.append(_LENGTH.pack(0))
    if record.timestamp_type == TIMESTAMP_LOG_APPEND_TIME:
        attributes |= _LOG_APPEND_TIME
    parts.append(_SHORT.pack(len(record.headers)))
    for name, value in record.headers:
        name_bytes = name.encode()
        parts += (_SHORT.pack(len(name_bytes)), name_bytes, _LENGTH.pack(len(value)), value)
    body = b"".join(parts)
    head = _PREFIX.pack(0, offset, attributes, record.timestamp_ms)[4:]
    checksum = crc32c_module.crc32c(head)
    checksum = crc32c_module.crc32c(body, checksum)
    return _LENGTH.pack(checksum) + head + body


def decode_record(data: bytes | memoryview, expected_offset: int | None = None) -> StoredRecord:
    """Decodes one record, verifying its checksum (and offset when given); raises CorruptRecordError."""
    view = memoryview(data)
    if len(view) < _PREFIX.size + 2 * _LENGTH.size + _SHORT.size:
        raise CorruptRecordError(f"record of {len(view)} bytes is shorter than its fixed fields")
    checksum, offset, attributes, timestamp_ms = _PREFIX.unpack_from(view, 0)
    if crc32c(view[4:]) != checksum:
        raise CorruptRecordError(f"CRC32C mismatch in record at offset {offset}")
    if expected_offset is not None and offset != expected_offset:
        raise CorruptRecordError(f"record stored under offset {expected_offset} says {offset}")
    try:
        position = _PREFIX.size
        key, position = _read_blob(view, position, bool(attributes & _KEY_PRESENT))
        value, position = _read_blob(view, position, bool(attributes & _VALUE_PRESENT))
        (header_count,) = _SHORT.unpack_from(view, position)
        position += _SHORT.size
        headers: list[tuple[str, bytes]] = []
        for _ in range(header_count):
            (name_length,) = _SHORT.unpack_from(view, position)
            position += _SHORT.size
            name = bytes(view[position : position + name_length]).decode()
            position += name_length
            header_value, position = _read_blob(view, position, True)
            headers.append((name, header_value or b""))
    except (struct.error, UnicodeDecodeError) as error:
        raise CorruptRecordError(f"record at offset {offset} is malformed: {error}") from error
    if position != len(view):
        raise CorruptRecordError(f"record at offset {offset} has {len(view) - position} trailing bytes")
    timestamp_type = TIMESTAMP_LOG_APPEND_TIME if attributes & _LOG_APPEND_TIME else TIMESTAMP_CREATE_TIME
    return StoredRecord(offset, timestamp_ms, timestamp_type, key, value, tuple(headers))


def _read_blob(view: memoryview, position: int, present: bool) -> tuple[bytes | None, int]:
    (length,) = _LENGTH.unpack_from(view, position)
    position += _LENGTH.size
    if position + length > len(view):
        raise struct.error("length runs past the end of the record")
    blob = bytes(view[position : position + length]) if present else None
    return blob, position + length
