"""Building kio response objects without one code path per API version.

kio generates one frozen dataclass per message, version and nested struct, each with exactly the
fields that version has. A handler here names every field any supported version may carry and
`build` keeps those the class has, fills the ones the handler did not name with Kafka's zero value
(0, "", empty, null), and turns milliseconds and error numbers into kio's types. So one handler
serves Metadata v4 to v12, and a field a version lacks is simply not sent.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import uuid
from types import ModuleType
from typing import Any

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode as KafkaErrorCode
from kio.static.constants import EntityType

from kq.broker.kafka import kio_gaps


@functools.cache
def response_module(api_key: int, api_version: int) -> ModuleType:
    """kio's module of the response of one API version (it holds the nested classes too); kio_gaps.py's
    for a version kio lacks."""
    gap = kio_gaps.RESPONSES.get((api_key, api_version))
    return gap if gap is not None else load_payload_module(api_key, api_version, EntityType.response)


@functools.cache
def request_module(api_key: int, api_version: int) -> ModuleType:
    """kio's module of the request of one API version (kio_gaps.py's for a version kio lacks)."""
    gap = kio_gaps.REQUESTS.get((api_key, api_version))
    return gap if gap is not None else load_payload_module(api_key, api_version, EntityType.request)


@functools.cache
def _fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    return tuple(field for field in dataclasses.fields(cls) if not field.name.startswith("__"))


def has_field(cls: type, name: str) -> bool:
    """Whether this version's class has the field."""
    return any(field.name == name for field in _fields(cls))


def build(cls: type, **values: Any) -> Any:
    """An instance of the kio class `cls` from `values`, keeping the fields it has (see the module)."""
    arguments: dict[str, Any] = {}
    for field in _fields(cls):
        kafka_type = field.metadata.get("kafka_type", "")
        if field.name in values:
            arguments[field.name] = _coerce(values[field.name], kafka_type)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            arguments[field.name] = _zero(field, kafka_type)
    return cls(**arguments)


def _coerce(value: Any, kafka_type: str) -> Any:
    if kafka_type.startswith("timedelta") and isinstance(value, int):
        return datetime.timedelta(milliseconds=value)
    if kafka_type == "error_code" and isinstance(value, int) and not isinstance(value, KafkaErrorCode):
        return KafkaErrorCode(value)
    return value


def _zero(field: dataclasses.Field[Any], kafka_type: str) -> Any:
    type_text = str(field.type)
    if type_text.startswith("tuple"):
        return ()
    if "None" in type_text:
        return None
    if kafka_type.startswith("timedelta"):
        return datetime.timedelta(0)
    if kafka_type == "error_code":
        return KafkaErrorCode.none
    if kafka_type == "string":
        return ""
    if kafka_type == "bool":
        return False
    if kafka_type in ("bytes", "records"):
        return b""
    if kafka_type == "uuid":
        return uuid.UUID(int=0)
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(0, datetime.UTC)
    return 0
