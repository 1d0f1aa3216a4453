"""Message versions kio lacks, declared in kio's own dataclass form so kio's reader and writer run them.

kio 0.6.5 generates DescribeConfigs from version 1, but Kafka's DescribeConfigsRequest.json and
DescribeConfigsResponse.json start at version 0, which the issue asks kq to serve (Kafka's own admin
tools and older clients send it). Only the schema is written here, field for field from those JSON
files (v0: no IncludeSynonyms in the request; IsDefault instead of ConfigSource, and no Synonyms,
in the response); encoding and decoding stay kio's (`kio.serial`), so nothing of the wire format is
hand-written. `request_module` and `response_module` (build.py, framing.py) look here first.

No `from __future__ import annotations` here: kio reads the field types at run time, as objects.
"""


from dataclasses import dataclass, field
from types import ModuleType
from typing import ClassVar

from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader
from kio.schema.response_header.v0.header import ResponseHeader
from kio.static.constants import EntityType
from kio.static.primitive import i8, i16, i32Timedelta

DESCRIBE_CONFIGS = 32


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeConfigsResource:
    """One resource to describe (DescribeConfigsRequest v0)."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(DESCRIBE_CONFIGS)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    resource_type: i8 = field(metadata={"kafka_type": "int8"})
    resource_name: str = field(metadata={"kafka_type": "string"})
    configuration_keys: tuple[str, ...] | None = field(metadata={"kafka_type": "string"}, default=())


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeConfigsRequest:
    """DescribeConfigsRequest v0: the resources, and nothing else."""

    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(DESCRIBE_CONFIGS)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    resources: tuple[DescribeConfigsResource, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeConfigsResourceResult:
    """One config in a v0 answer: IsDefault where v1 has ConfigSource, no synonyms."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(DESCRIBE_CONFIGS)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    name: str = field(metadata={"kafka_type": "string"})
    value: str | None = field(metadata={"kafka_type": "string"})
    read_only: bool = field(metadata={"kafka_type": "bool"})
    is_default: bool = field(metadata={"kafka_type": "bool"})
    is_sensitive: bool = field(metadata={"kafka_type": "bool"})


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeConfigsResult:
    """One resource's answer (DescribeConfigsResponse v0)."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(DESCRIBE_CONFIGS)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    error_message: str | None = field(metadata={"kafka_type": "string"})
    resource_type: i8 = field(metadata={"kafka_type": "int8"})
    resource_name: str = field(metadata={"kafka_type": "string"})
    configs: tuple[DescribeConfigsResourceResult, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeConfigsResponse:
    """DescribeConfigsResponse v0."""

    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(DESCRIBE_CONFIGS)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    throttle_time: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
    results: tuple[DescribeConfigsResult, ...]


def _module(name: str, *classes: type) -> ModuleType:
    """A module holding `classes` by name, as kio's generated modules hold a version's classes."""
    module = ModuleType(name)
    for cls in classes:
        setattr(module, cls.__name__, cls)
    return module


REQUESTS: dict[tuple[int, int], ModuleType] = {
    (DESCRIBE_CONFIGS, 0): _module(
        "describe_configs_v0_request", DescribeConfigsResource, DescribeConfigsRequest
    )
}
RESPONSES: dict[tuple[int, int], ModuleType] = {
    (DESCRIBE_CONFIGS, 0): _module(
        "describe_configs_v0_response",
        DescribeConfigsResourceResult,
        DescribeConfigsResult,
        DescribeConfigsResponse,
    )
}


def payload(module: ModuleType, kind: EntityType) -> type:
    """The request or response class of a gap module (the one whose `__type__` is `kind`)."""
    found = [value for value in vars(module).values() if getattr(value, "__type__", None) == kind]
    assert len(found) == 1, f"{module.__name__} declares one {kind}"
    return found[0]  # type: ignore[no-any-return]
