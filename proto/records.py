"""The record batch: how a produce request carries its records, and how they are stored and replicated.

A batch is the concatenation of records; each record (integers big-endian):

    length        u32   bytes after this field
    attributes    u8    bit 0: key present, bit 1: value present (other bits must be 0)
    timestamp_ms  i64   producer's create time; 0 means "the leader's append time"
    key_length    u32   then `key_length` bytes (0 when the key is absent)
    value_length  u32   then `value_length` bytes (0 when the value is absent)
    header_count  u16   then per header: name_length u16, name (UTF-8), value_length u32, value

The client encodes a batch once; the leader checks it (`parse_batch`) and the bytes then travel
unchanged through Raft into every node's store, so no node re-encodes a record. Only the standard
library is used: the client, the broker and the state machine all read this one definition.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_LENGTH = struct.Struct(">I")
_FIXED = struct.Struct(">Bq")  # attributes, timestamp_ms
_SHORT = struct.Struct(">H")
KEY_PRESENT = 0x01
VALUE_PRESENT = 0x02
_KNOWN_ATTRIBUTES = KEY_PRESENT | VALUE_PRESENT
# length + attributes + timestamp + key length + value length + header count.
RECORD_OVERHEAD_BYTES = _LENGTH.size + _FIXED.size + 2 * _LENGTH.size + _SHORT.size


class MalformedBatchError(ValueError):
    """A batch that does not follow the layout; the message says where."""


@dataclass(frozen=True, slots=True)
class WireRecord:
    """One record of a batch, decoded."""

    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    size_bytes: int  # Key + value + header names and values: what the record size limit counts.


def encode_record(
    key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]] = (), timestamp_ms: int = 0
) -> bytes:
    """One record in batch layout (length prefix included); batches are concatenations of these."""
    attributes = (KEY_PRESENT if key is not None else 0) | (VALUE_PRESENT if value is not None else 0)
    key_bytes = key or b""
    value_bytes = value or b""
    parts = [
        _FIXED.pack(attributes, timestamp_ms),
        _LENGTH.pack(len(key_bytes)),
        key_bytes,
        _LENGTH.pack(len(value_bytes)),
        value_bytes,
        _SHORT.pack(len(headers)),
    ]
    for name, header_value in headers:
        name_bytes = name.encode()
        parts += (_SHORT.pack(len(name_bytes)), name_bytes, _LENGTH.pack(len(header_value)), header_value)
    body = b"".join(parts)
    return _LENGTH.pack(len(body)) + body


def encode_batch(records: Iterable[bytes]) -> bytes:
    """Concatenates records made by `encode_record`."""
    return b"".join(records)


def count_records(batch: bytes) -> int:
    """Number of records, walking only the length prefixes; raises MalformedBatchError."""
    count, position, end = 0, 0, len(batch)
    while position < end:
        if position + _LENGTH.size > end:
            raise MalformedBatchError(f"record {count} has a cut-short length prefix")
        (length,) = _LENGTH.unpack_from(batch, position)
        position += _LENGTH.size + length
        count += 1
    if position != end:
        raise MalformedBatchError(f"record {count - 1} runs past the end of the batch")
    return count


def validate_batch(
    batch: bytes, records_max: int, headers_max: int, record_bytes_max: int, header_name_bytes_max: int
) -> int:
    """Checks every record's layout and limits without copying anything; returns the record count.

    This is the leader's check of each produce request (the hot path), so it only walks offsets;
    `parse_batch` is the decoder. Raises MalformedBatchError naming the record and the problem.
    """
    count, position, end = 0, 0, len(batch)
    while position < end:
        if count >= records_max:
            raise MalformedBatchError(f"more than {records_max} records in one batch")
        if position + _LENGTH.size > end:
            raise MalformedBatchError(f"record {count}: cut-short length prefix")
        (length,) = _LENGTH.unpack_from(batch, position)
        start = position + _LENGTH.size
        position = start + length
        if position > end:
            raise MalformedBatchError(f"record {count}: runs past the end of the batch")
        problem = _record_problem(
            batch, start, position, headers_max, record_bytes_max, header_name_bytes_max
        )
        if problem is not None:
            raise MalformedBatchError(f"record {count}: {problem}")
        count += 1
    return count


def _record_problem(
    batch: bytes, start: int, stop: int, headers_max: int, record_bytes_max: int, header_name_bytes_max: int
) -> str | None:
    """What is wrong with the record in batch[start:stop], or None."""
    if stop - start < RECORD_OVERHEAD_BYTES - _LENGTH.size:
        return "shorter than its fixed fields"
    attributes, timestamp_ms = _FIXED.unpack_from(batch, start)
    if attributes & ~_KNOWN_ATTRIBUTES:
        return f"unknown attribute bits {attributes:#x}"
    if timestamp_ms < 0:
        return "negative timestamp"
    (key_length,) = _LENGTH.unpack_from(batch, start + _FIXED.size)
    position = start + _FIXED.size + _LENGTH.size + key_length
    if position + _LENGTH.size > stop or (key_length and not attributes & KEY_PRESENT):
        return "bad key length"
    (value_length,) = _LENGTH.unpack_from(batch, position)
    position += _LENGTH.size + value_length
    if position + _SHORT.size > stop or (value_length and not attributes & VALUE_PRESENT):
        return "bad value length"
    (header_count,) = _SHORT.unpack_from(batch, position)
    position += _SHORT.size
    if header_count > headers_max:
        return f"more than {headers_max} headers"
    size_bytes = key_length + value_length
    for _ in range(header_count):
        if position + _SHORT.size > stop:
            return "cut-short header"
        (name_length,) = _SHORT.unpack_from(batch, position)
        position += _SHORT.size
        if name_length > header_name_bytes_max or position + name_length + _LENGTH.size > stop:
            return f"header name over {header_name_bytes_max} bytes or cut short"
        try:
            batch[position : position + name_length].decode()
        except UnicodeDecodeError:
            return "header name is not UTF-8"
        (header_length,) = _LENGTH.unpack_from(batch, position + name_length)
        position += name_length + _LENGTH.size + header_length
        size_bytes += name_length + header_length
    if position != stop:
        return "its fields do not add up to its length"
    if size_bytes > record_bytes_max:
        return f"{size_bytes} bytes; the limit is {record_bytes_max} (key, value and headers)"
    return None


def parse_batch(batch: bytes, records_max: int, headers_max: int) -> list[WireRecord]:
    """Every record of `batch`, each fully checked; raises MalformedBatchError naming the record."""
    records: list[WireRecord] = []
    position, end = 0, len(batch)
    view = memoryview(batch)
    while position < end:
        if len(records) >= records_max:
            raise MalformedBatchError(f"more than {records_max} records in one batch")
        try:
            (length,) = _LENGTH.unpack_from(view, position)
            start = position + _LENGTH.size
            if start + length > end:
                raise MalformedBatchError(f"record {len(records)} runs past the end of the batch")
            records.append(_parse_record(view[start : start + length], headers_max))
        except (struct.error, UnicodeDecodeError) as error:
            raise MalformedBatchError(f"record {len(records)} is malformed: {error}") from error
        except MalformedBatchError as error:
            raise MalformedBatchError(f"record {len(records)}: {error}") from error
        position = start + length
    return records


def _parse_record(body: memoryview, headers_max: int) -> WireRecord:
    attributes, timestamp_ms = _FIXED.unpack_from(body, 0)
    if attributes & ~_KNOWN_ATTRIBUTES:
        raise MalformedBatchError(f"unknown attribute bits {attributes:#x}")
    if timestamp_ms < 0:
        raise MalformedBatchError("negative timestamp")
    key, position = _blob(body, _FIXED.size, bool(attributes & KEY_PRESENT))
    value, position = _blob(body, position, bool(attributes & VALUE_PRESENT))
    (header_count,) = _SHORT.unpack_from(body, position)
    position += _SHORT.size
    if header_count > headers_max:
        raise MalformedBatchError(f"more than {headers_max} headers")
    headers: list[tuple[str, bytes]] = []
    size_bytes = len(key or b"") + len(value or b"")
    for _ in range(header_count):
        (name_length,) = _SHORT.unpack_from(body, position)
        position += _SHORT.size
        name = bytes(body[position : position + name_length]).decode()
        position += name_length
        header_value, position = _blob(body, position, True)
        headers.append((name, header_value or b""))
        size_bytes += name_length + len(header_value or b"")
    if position != len(body):
        raise MalformedBatchError(f"{len(body) - position} bytes after the last field")
    return WireRecord(timestamp_ms, key, value, tuple(headers), size_bytes)


def _blob(body: memoryview, position: int, present: bool) -> tuple[bytes | None, int]:
    (length,) = _LENGTH.unpack_from(body, position)
    position += _LENGTH.size
    if position + length > len(body):
        raise MalformedBatchError("a length runs past the end of the record")
    if not present and length:
        raise MalformedBatchError("an absent key or value has a non-zero length")
    return (bytes(body[position : position + length]) if present else None), position + length
