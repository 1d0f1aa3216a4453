"""Kafka's request and response frames, encoded and decoded by `kio` (generated from Kafka's schemas).

A frame on the wire is `size int32` then `size` bytes. A request's bytes start with its header:

    request_api_key      int16
    request_api_version  int16
    correlation_id       int32
    client_id            nullable string (int16 length, even in flexible versions)
    tagged fields        header v2 only (the request's version is flexible)

then the request body of that API and version. A response is `correlation_id int32`, tagged fields
when the response header is v1 (a flexible version; never for ApiVersions, whose response header is
always v0 so that a client can read it before it knows which versions the broker speaks), then the
body. `kio` knows which header each (API, version) uses and encodes and decodes every body,
tagged fields included; this module only joins the pieces and turns every decoding failure into one
exception type, so that the listener can answer or close without ever failing on a client's bytes.
One response is written without kio, on the hot path: Produce's (broker/kafka/produce.py, a
`WrittenResponse`), byte for byte kio's.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import struct
import typing
from dataclasses import dataclass
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i32
from kio.static.protocol import RequestPayload, ResponsePayload

from kq.broker.kafka import kio_gaps
from kq.broker.kafka.array_bounds import array_length_problem
from kq.proto.limits import KAFKA_SCHEMAS_KEPT

_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id: the same in every header version.
_SIZE = struct.Struct(">i")
NO_TAGGED_FIELDS = b"\x00"  # A flexible header's or struct's tagged fields: none (a varint count of 0).
PREFIX_BYTES = _PREFIX.size


class FrameError(ValueError):
    """A request that cannot be decoded: the message says why, in one line."""


@dataclass(frozen=True, slots=True)
class RequestPrefix:
    """What every request header starts with, readable before the API and version are known good."""

    api_key: int
    api_version: int
    correlation_id: int


@dataclass(frozen=True, slots=True)
class Request:
    """One decoded request: its header fields and its body (a kio dataclass of that API and version)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str
    body: Any  # A kio RequestPayload; Any so handlers read their version's fields without casts.


def read_prefix(frame: bytes | memoryview) -> RequestPrefix:
    """The API key, version and correlation id at the start of `frame`; FrameError if it is shorter."""
    if len(frame) < PREFIX_BYTES:
        raise FrameError(f"a request of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id = _PREFIX.unpack_from(frame, 0)
    return RequestPrefix(api_key, api_version, correlation_id)


@functools.lru_cache(maxsize=KAFKA_SCHEMAS_KEPT)
def request_schema(api_key: int, api_version: int) -> type[RequestPayload] | None:
    """kio's request class for this API and version (or kio_gaps.py's), or None when there is none.
    Kept (KAFKA_SCHEMAS_KEPT): kio's index found it in ~6 µs, once for every request."""
    gap = kio_gaps.REQUESTS.get((api_key, api_version))
    if gap is not None:
        return kio_gaps.payload(gap, EntityType.request)
    try:
        return load_request_schema(api_key, api_version)
    except Exception:  # kio raises its own index errors, and import errors for gaps: all mean "none".
        return None


def decode_request(frame: bytes | memoryview, schema: type[RequestPayload]) -> Request:
    """The request in `frame` (its header, then a body of `schema`); FrameError when it does not parse.

    Bytes after the body are ignored, as Kafka's own parser does: librdkafka 2.x sends three extra
    bytes after some Metadata v12 requests.
    """
    prefix = read_prefix(frame)
    undecodable = f"undecodable {schema.__name__} v{prefix.api_version}"
    try:
        header, header_bytes = entity_reader(schema.__header_schema__)(frame, 0)
    except Exception as error:  # kio's native reader raises several types for malformed input.
        raise FrameError(f"{undecodable}: {_first_line(error)}") from error
    hostile = array_length_problem(frame, header_bytes, schema)
    if hostile is not None:  # Checked before the reader: it would reserve the array's room and abort.
        raise FrameError(f"{undecodable}: {hostile}")
    try:
        body, _ = entity_reader(schema)(frame, header_bytes)
    except Exception as error:
        raise FrameError(f"{undecodable}: {_first_line(error)}") from error
    null = null_array(body)
    if null is not None:
        raise FrameError(f"undecodable {schema.__name__} v{prefix.api_version}: {null} is a null array")
    return Request(prefix.api_key, prefix.api_version, prefix.correlation_id, header.client_id or "", body)


def null_array(entity: Any, path: str = "") -> str | None:
    """The first array field of `entity` (nested entities included) that is null though its schema
    does not allow null, or None. kio reads a -1 length as None for every array, nullable or not; a
    handler would meet a None where Kafka's schema promises a list (a fuzzed IncrementalAlterConfigs
    crashed that way), so the decoder refuses it, for every API at once."""
    entity_type = type(entity)
    for name, nullable in _array_fields(entity_type):
        value = getattr(entity, name)
        if value is None:
            if not nullable:
                return f"{path}{name}"
            continue
        # kio's arrays hold one type: of entities (walked), or of primitives (the first one says).
        if value and _is_entity(value[0]):
            for item in value:
                found = null_array(item, f"{path}{name}[].")
                if found is not None:
                    return found
    for name in _field_names(entity_type):
        value = getattr(entity, name)
        if _is_entity(value):
            found = null_array(value, f"{path}{name}.")
            if found is not None:
                return found
    return None


def _is_entity(value: Any) -> bool:
    """`dataclasses.is_dataclass(value)` of a value that is not a class (a kio entity instance)."""
    return not isinstance(value, type) and hasattr(type(value), "__dataclass_fields__")


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}  # By kio entity class: a fixed set.


def _field_names(entity_type: type) -> tuple[str, ...]:
    """An entity class's field names, found once per class (`dataclasses.fields` builds them each call)."""
    names = _FIELD_NAMES.get(entity_type)
    if names is None:
        names = _FIELD_NAMES[entity_type] = tuple(field.name for field in dataclasses.fields(entity_type))
    return names


_ARRAY_FIELDS: dict[type, tuple[tuple[str, bool], ...]] = {}  # By kio entity class: a fixed set.


def _array_fields(entity_type: type) -> tuple[tuple[str, bool], ...]:
    """An entity class's array fields: (name, whether the schema allows null), computed once per class."""
    cached = _ARRAY_FIELDS.get(entity_type)
    if cached is not None:
        return cached
    hints = typing.get_type_hints(entity_type)
    fields = []
    for field in dataclasses.fields(entity_type):
        hint = hints[field.name]
        arguments = typing.get_args(hint)
        nullable = type(None) in arguments
        if typing.get_origin(hint) is tuple or any(typing.get_origin(a) is tuple for a in arguments):
            fields.append((field.name, nullable))
    _ARRAY_FIELDS[entity_type] = tuple(fields)
    return _ARRAY_FIELDS[entity_type]


@dataclass(frozen=True, slots=True)
class WrittenResponse:
    """A response body a handler wrote itself, byte for byte what kio writes for it (produce.py's
    Produce response, the hot path: kio's classes and writer cost ~60 µs a response, this ~5), which
    `encode_response` frames as it is."""

    flexible: bool  # Its header is v1: tagged fields (none) after the correlation id.
    body: bytes


def encode_response(correlation_id: int, response: ResponsePayload | WrittenResponse) -> bytes:
    """The whole response frame (size prefix, header for the response's version, body)."""
    if isinstance(response, WrittenResponse):
        header = _SIZE.pack(correlation_id) + (NO_TAGGED_FIELDS if response.flexible else b"")
        return _SIZE.pack(len(header) + len(response.body)) + header + response.body
    header_schema = type(response).__header_schema__
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    entity_writer(header_schema)(buffer, header_schema(correlation_id=i32(correlation_id)))
    entity_writer(type(response))(buffer, response)
    frame = buffer.getbuffer()
    _SIZE.pack_into(frame, 0, len(frame) - _SIZE.size)
    return bytes(frame)


@functools.lru_cache(maxsize=KAFKA_SCHEMAS_KEPT)
def response_schema(api_key: int, api_version: int) -> type[ResponsePayload]:
    """kio's response class for an API and version the broker serves (it or kio_gaps.py has every one);
    kept, as `request_schema`."""
    gap = kio_gaps.RESPONSES.get((api_key, api_version))
    if gap is not None:
        return kio_gaps.payload(gap, EntityType.response)
    return load_response_schema(api_key, api_version)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:200]
