"""Lengths a Kafka request declares, checked before kio's native reader sees the frame.

kio's reader (Rust) reserves room for a declared length before it reads: a 25-byte frame made it ask
for 253 GB, and the failed allocation aborted the whole node process (the Kafka listener fuzz found
it in CI). Here the request body is walked by its kio schema, building nothing: every array must
declare at most as many elements as bytes remain in the frame (each element takes at least one) and
at most KAFKA_ARRAY_ELEMENTS_MAX, and every string or bytes field at most the bytes that remain; else
the frame is refused as undecodable (INVALID_REQUEST, the connection closed: what Kafka answers a
request it cannot parse). A frame the walk cannot follow (a type it does not know, a nullable struct)
is left to the reader, which refuses a malformed one with an error of its own.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from kq.proto.limits import KAFKA_ARRAY_ELEMENTS_MAX

_FIXED_BYTES = {
    "bool": 1,
    "int8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "float64": 8,
    "uuid": 16,
}
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class _LostError(Exception):
    """The walk cannot follow the frame any further: the reader decides."""


class _HostileError(Exception):
    """An array declares more elements than the frame can hold."""


def array_length_problem(frame: bytes | memoryview, offset: int, schema: Any) -> str | None:
    """Why the body of `schema` at `offset` in `frame` declares an impossible array, or None."""
    walk = _Walk(memoryview(frame), offset)
    try:
        walk.entity(schema, bool(getattr(schema, "__flexible__", False)))
    except _HostileError as problem:
        return str(problem)
    except (_LostError, IndexError, struct.error):
        return None
    return None


@functools.cache
def _plan(schema: Any) -> tuple[tuple[str, Any, str, bool], ...]:
    """The inline fields of `schema` in order: (name, field class, kafka type or "", nullable)."""
    plan = []
    for field in dataclasses.fields(schema):
        if get_field_tag(field) is not None:
            continue  # Read from the tagged-fields section, skipped whole by its size.
        kind = classify_field(field)
        kafka_type = "" if isinstance(kind, EntityField | EntityTupleField) else get_schema_field_type(field)
        plan.append((field.name, kind, kafka_type, is_optional(field)))
    return tuple(plan)


class _Walk:
    def __init__(self, frame: memoryview, offset: int) -> None:
        self._frame = frame
        self._at = offset

    def _take(self, count: int) -> None:
        if count < 0 or self._at + count > len(self._frame):
            raise _LostError
        self._at += count

    def _uvarint(self) -> int:
        value = shift = 0
        for _ in range(5):
            byte = self._frame[self._at]
            self._at += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
        raise _LostError

    def _length(self, flexible: bool, wide: bool) -> int | None:
        """A string's, bytes' or array's length (None: null)."""
        if flexible:
            value = self._uvarint() - 1
        elif wide:
            value = _I32.unpack_from(self._frame, self._at)[0]
            self._at += 4
        else:
            value = _I16.unpack_from(self._frame, self._at)[0]
            self._at += 2
        return None if value < 0 else value

    def entity(self, schema: Any, flexible: bool) -> None:
        for name, kind, kafka_type, nullable in _plan(schema):
            if isinstance(kind, EntityTupleField | PrimitiveTupleField):
                count = self._length(flexible, wide=True)
                if count is None:
                    continue
                remaining = len(self._frame) - self._at
                if count > remaining or count > KAFKA_ARRAY_ELEMENTS_MAX:
                    where = f"{schema.__name__}.{name}"
                    raise _HostileError(f"{where} declares {count} elements in {remaining} bytes")
                for _ in range(count):
                    if isinstance(kind, EntityTupleField):
                        self.entity(kind.type_, flexible)
                    else:
                        self._primitive(kafka_type, flexible)
            elif isinstance(kind, EntityField):
                if nullable:
                    raise _LostError  # A nullable struct's marker byte: rare in requests; the reader decides.
                self.entity(kind.type_, flexible)
            else:
                self._primitive(kafka_type, flexible)
        if flexible:
            for _ in range(self._uvarint()):  # Tagged fields: a tag and a size each, skipped whole.
                self._uvarint()
                self._take(self._uvarint())

    def _primitive(self, kafka_type: str, flexible: bool) -> None:
        size = _FIXED_BYTES.get(kafka_type)
        if size is not None:
            self._take(size)
        elif kafka_type in ("string", "bytes", "records"):
            length = self._length(flexible, wide=kafka_type != "string") or 0
            remaining = len(self._frame) - self._at
            if length > remaining:  # The reader would reserve it before finding the frame too short.
                raise _HostileError(f"a {kafka_type} of {length} bytes in {remaining} bytes")
            self._take(length)
        else:
            raise _LostError
