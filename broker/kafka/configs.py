"""Kafka's config APIs: DescribeConfigs, IncrementalAlterConfigs and AlterConfigs, for topics and brokers.

Topic configs are kq's own (raft/topic_config.py: Kafka's names, replicated through Raft): these
handlers read them from this node's store and change them with the same `AlterTopicConfig` call the
gRPC API has, on the leader (forwarded from a follower). A value kq does not accept answers
INVALID_CONFIG with the reason and changes nothing. Broker configs are the node's flags: read-only,
and an attempt to change one answers INVALID_REQUEST.
"""

from __future__ import annotations

from typing import Any

from kq.broker.auth import CLUSTER, TOPIC
from kq.broker.errors import KqError
from kq.broker.kafka.authorize import DENIED_CODE, ApiKey
from kq.broker.kafka.base import KafkaBase, kafka_code
from kq.broker.kafka.build import build, response_module
from kq.broker.kafka.codes import (
    INVALID_CONFIG,
    INVALID_REQUEST,
    INVALID_TOPIC,
    NONE,
    NOT_CONTROLLER,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from kq.broker.kafka.framing import Request
from kq.broker.kafka.listener import Connection
from kq.proto import kq_pb2
from kq.proto.errors import ErrorCode
from kq.proto.limits import APPEND_BYTES_MAX
from kq.raft.auth import CLUSTER_RESOURCE
from kq.raft.topic_config import CLEANUP_POLICY, CONFIGS, configs_problem, decode_overrides
from kq.raft.validation import topic_name_problem

DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 33, 44
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
# DescribeConfigs config_source values (Kafka's ConfigSource).
TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
# Kafka's ConfigType values, by ConfigDef's type names.
CONFIG_TYPE = {"boolean": 1, "string": 2, "int": 3, "long": 5, "double": 6, "list": 7}
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3  # IncrementalAlterConfigs operations.

Config = tuple[str, str, str, bool, int, bool, str | None]  # name, value, type, default, source, r/o, doc


class ConfigApis(KafkaBase):
    """DescribeConfigs, IncrementalAlterConfigs and AlterConfigs."""

    async def describe_configs(self, request: Request, connection: Connection) -> Any:
        """Every config of each topic (its overrides and the defaults) or of this broker."""
        module = response_module(DESCRIBE_CONFIGS, request.api_version)
        results = []
        for resource in request.body.resources:
            denied = self._config_denial(connection, ApiKey.DESCRIBE_CONFIGS, resource)
            configs = (
                None
                if denied is not None
                else await self._in_reads(self._configs_of, resource.resource_type, resource.resource_name)
            )
            code, message = (
                (NONE, None) if configs is not None else (UNKNOWN_TOPIC_OR_PARTITION, "unknown resource")
            )
            if denied is not None:
                code, message = denied
            wanted = resource.configuration_keys  # Null or empty: all of them (kafka-python sends []).
            entries = tuple(
                build(
                    module.DescribeConfigsResourceResult,
                    name=name,
                    value=value,
                    read_only=read_only,
                    is_default=is_default,
                    config_source=source,
                    is_sensitive=False,
                    synonyms=(),
                    config_type=CONFIG_TYPE[kind],
                    documentation=documentation,
                )
                for name, value, kind, is_default, source, read_only, documentation in configs or ()
                if not wanted or name in wanted
            )
            results.append(
                build(
                    module.DescribeConfigsResult,
                    error_code=code,
                    error_message=message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=entries,
                )
            )
        return build(module.DescribeConfigsResponse, throttle_time=0, results=tuple(results))

    def _configs_of(self, resource_type: int, name: str) -> list[Config] | None:
        """A resource's configs (None: no such resource); on the read pool."""
        if resource_type == TOPIC_RESOURCE:
            if topic_name_problem(name):
                return None
            with self._store.read() as reader:
                topic = reader.topic(name)
                if topic is None:
                    return None
                values = self._service.config_values(reader, topic)
            configs: list[Config] = [
                (
                    value.name,
                    value.value,
                    CONFIGS[value.name].kind,
                    value.is_default,
                    DEFAULT_CONFIG if value.is_default else TOPIC_CONFIG,
                    False,
                    CONFIGS[value.name].documentation,
                )
                for value in values
            ]
            majority = str(len(self._settings.brokers) // 2 + 1)
            configs.append(("compression.type", "producer", "string", True, DEFAULT_CONFIG, True, None))
            configs.append(("min.insync.replicas", majority, "int", True, DEFAULT_CONFIG, True, None))
            return sorted(configs)
        if resource_type == BROKER_RESOURCE:
            if name not in ("", str(self._settings.self_broker_id)):
                return None
            fixed = {
                "broker.id": (str(self._settings.self_broker_id), "int"),
                "num.partitions": (str(self._settings.default_partitions), "int"),
                "auto.create.topics.enable": (str(self._settings.auto_create_topics).lower(), "boolean"),
                "message.max.bytes": (str(APPEND_BYTES_MAX), "int"),
                "default.replication.factor": (str(len(self._settings.brokers)), "int"),
            }
            return [
                (key, value, kind, False, STATIC_BROKER_CONFIG, True, None)
                for key, (value, kind) in sorted(fixed.items())
            ]
        return None

    def _config_denial(
        self, connection: Connection, api_key: ApiKey, resource: Any
    ) -> tuple[int, str] | None:
        """(error code, message) when the principal may not use `api_key` on a config resource: a topic,
        or a broker (the cluster: kq has no per-broker ACLs); None when it may, or when the resource
        type has no configs (the handler answers that)."""
        if resource.resource_type == TOPIC_RESOURCE:
            resource_type, name = TOPIC, resource.resource_name
        elif resource.resource_type == BROKER_RESOURCE:
            resource_type, name = CLUSTER, CLUSTER_RESOURCE
        else:
            return None
        if self._permitted(connection, api_key, resource_type, name):
            return None
        return DENIED_CODE[resource_type], f"not authorized to {api_key.name} {resource.resource_name!r}"

    async def incremental_alter_configs(self, request: Request, connection: Connection) -> Any:
        """SET and DELETE any topic config; APPEND and SUBTRACT the list one (cleanup.policy)."""
        return await self._alter_resources(request, connection, INCREMENTAL_ALTER_CONFIGS, incremental=True)

    async def alter_configs(self, request: Request, connection: Connection) -> Any:
        """Replaces a topic's overrides with the given ones (those not named go back to the default)."""
        return await self._alter_resources(request, connection, ALTER_CONFIGS, incremental=False)

    async def _alter_resources(
        self, request: Request, connection: Connection, api_key: int, incremental: bool
    ) -> Any:
        """Both alter APIs' answer: each resource changed in turn, one result each (their response
        classes differ only in name)."""
        module = response_module(api_key, request.api_version)
        responses = []
        for resource in request.body.resources:
            denied = self._config_denial(connection, ApiKey(api_key), resource)
            code, message = (
                denied
                if denied is not None
                else await self._alter(resource, request.body.validate_only, incremental)
            )
            responses.append(_alter_response(module, resource, code, message))
        answer = module.IncrementalAlterConfigsResponse if incremental else module.AlterConfigsResponse
        return build(answer, throttle_time=0, responses=tuple(responses))

    async def _alter(self, resource: Any, validate_only: bool, incremental: bool) -> tuple[int, str | None]:
        """(Kafka error code, message) of one resource's change."""
        if resource.resource_type == BROKER_RESOURCE:
            return INVALID_REQUEST, "broker configs are the node's flags; kq does not change them at run time"
        if resource.resource_type != TOPIC_RESOURCE:
            return INVALID_REQUEST, f"resource type {resource.resource_type} has no configs in kq"
        name = resource.resource_name
        name_problem = topic_name_problem(name)
        if name_problem:
            return INVALID_TOPIC, name_problem
        current = await self._in_reads(self._overrides, name)
        if current is None:
            return UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name}"
        changes = (
            _incremental_changes(resource.configs, current)
            if incremental
            else _full_changes(resource.configs, current)
        )
        if isinstance(changes, str):
            return INVALID_CONFIG, changes
        set_configs, removed = changes
        entries = [kq_pb2.ConfigEntry(name=key, value=value) for key, value in set_configs.items()]
        problem = configs_problem(entries, removed)
        if problem is not None:
            return INVALID_CONFIG, problem
        if not entries and not removed:
            return NONE, None
        alter = kq_pb2.AlterTopicConfigRequest(
            name=name, set=entries, remove=removed, validate_only=validate_only
        )
        try:
            await self._on_leader("AlterTopicConfig", alter)
        except KqError as error:
            code = kafka_code(error, NOT_CONTROLLER)
            return (INVALID_CONFIG if error.code == ErrorCode.INVALID_REQUEST else code), str(error)
        return NONE, None

    def _overrides(self, name: str) -> dict[str, str] | None:
        """The topic's stored overrides, None when it does not exist (on the read pool)."""
        with self._store.read() as reader:
            topic = reader.topic(name)
            return None if topic is None else decode_overrides(reader.topic_configs(topic.topic_id))


def _incremental_changes(configs: Any, current: dict[str, str]) -> tuple[dict[str, str], list[str]] | str:
    """IncrementalAlterConfigs' operations as (set, removed), or why they cannot apply."""
    set_configs: dict[str, str] = {}
    removed: list[str] = []
    for config in configs:
        operation = config.config_operation
        if operation == DELETE:
            if config.name not in CONFIGS:
                return f"unknown topic config {config.name[:64]!r}"
            if config.name in current:
                removed.append(config.name)
            continue
        if config.value is None:
            return f"{config.name}: a value is required"
        if operation == SET:
            set_configs[config.name] = config.value
        elif operation in (APPEND, SUBTRACT):
            if config.name not in CONFIGS or CONFIGS[config.name].kind != "list":
                return f"{config.name} is not a list config: APPEND and SUBTRACT apply to {CLEANUP_POLICY}"
            items = [
                item.strip() for item in current.get(config.name, CONFIGS[config.name].default).split(",")
            ]
            given = [item.strip() for item in config.value.split(",")]
            if operation == APPEND:
                items += [item for item in given if item not in items]
            else:
                items = [item for item in items if item not in given]
            set_configs[config.name] = ",".join(items)
        else:
            return f"unknown config operation {operation}"
    return set_configs, removed


def _full_changes(configs: Any, current: dict[str, str]) -> tuple[dict[str, str], list[str]] | str:
    """AlterConfigs' replacement as (set, removed): the given configs, and every other override removed."""
    set_configs: dict[str, str] = {}
    for config in configs:
        if config.value is None:
            return f"{config.name}: a value is required"
        set_configs[config.name] = config.value
    return set_configs, [name for name in current if name not in set_configs]


def _alter_response(module: Any, resource: Any, code: int, message: str | None) -> Any:
    return build(
        module.AlterConfigsResourceResponse,
        error_code=code,
        error_message=message,
        resource_type=resource.resource_type,
        resource_name=resource.resource_name,
    )
