"""Kafka's cluster and topic APIs: Metadata, DescribeCluster, FindCoordinator, CreateTopics,
DeleteTopics and InitProducerId (the config APIs are in configs.py).

kq has one Raft leader for every partition, so Metadata names it as every partition's leader (and
the controller and every group's coordinator); every node is a replica, and the nodes this one hears
over Raft are the in-sync ones. Leader epochs are -1 (unknown): clients then skip the epoch checks of
KIP-320, whose OffsetForLeaderEpoch API kq does not serve. Writes that reach a follower answer the
code that makes a Kafka client refresh its metadata and go to the leader.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Mapping
from typing import Any

from kq.broker.auth import CLUSTER, TOPIC
from kq.broker.errors import KqError
from kq.broker.kafka.authorize import (
    CLUSTER_AUTHORIZATION_FAILED,
    TOPIC_AUTHORIZATION_FAILED,
    ApiKey,
    access,
    writes_some_topic,
)
from kq.broker.kafka.base import KafkaBase, KafkaBrokerInfo, kafka_code
from kq.broker.kafka.build import build, response_module
from kq.broker.kafka.codes import (
    COORDINATOR_NOT_AVAILABLE,
    INVALID_CONFIG,
    INVALID_PARTITIONS,
    INVALID_REPLICA_ASSIGNMENT,
    INVALID_REPLICATION_FACTOR,
    INVALID_REQUEST,
    INVALID_TOPIC,
    LEADER_NOT_AVAILABLE,
    NONE,
    NOT_CONTROLLER,
    TOPIC_ALREADY_EXISTS,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from kq.broker.kafka.framing import Request
from kq.broker.kafka.listener import Connection
from kq.broker.validation import check_partition_count, check_topic_name
from kq.proto import kq_pb2
from kq.raft.auth import CLUSTER_RESOURCE
from kq.raft.placement import METADATA_GROUP
from kq.raft.topic_config import configs_problem
from kq.raft.validation import partition_count_problem, topic_name_problem
from kq.storage import TopicMeta

METADATA, FIND_COORDINATOR, CREATE_TOPICS, DELETE_TOPICS = 3, 10, 19, 20
INIT_PRODUCER_ID, DESCRIBE_CLUSTER = 22, 60
BROKERS_ENDPOINT = 1  # DescribeCluster v1's endpoint_type: the brokers (not the controllers).
NO_AUTHORIZED_OPERATIONS = -(2**31)  # Kafka's "not requested" value of authorized-operations fields.


class ClusterApis(KafkaBase):
    """Metadata and administration over the Kafka protocol."""

    # Metadata -----------------------------------------------------------------------------------

    async def metadata(self, request: Request, connection: Connection) -> Any:
        """Brokers, the controller, and the requested topics (all when the list is null)."""
        body = request.body
        module = response_module(METADATA, request.api_version)
        names: list[str | None] | None = None
        if body.topics is not None:
            names = [topic.name for topic in body.topics]
        if body.topics is not None and any(name is None for name in names or ()):
            names = await self._in_reads(self._names_of_ids, body.topics)  # v10+: asked by topic id.
        auto_create = (
            bool(getattr(body, "allow_auto_topic_creation", True)) and self._settings.auto_create_topics
        )
        topics = await self._in_reads(self._topics_for_metadata, names)
        leaders = {group: self._leader_broker(group) for group in range(self._groups.count)}
        live = {group: self._live_broker_ids(group) for group in range(self._groups.count)}
        epochs = {group: self._leader_epoch(group) for group in range(self._groups.count)}
        answers = []
        for name, found in topics:
            topic, code = found, NONE
            if names is None and not self._visible(connection, ApiKey.METADATA, TOPIC, name or ""):
                continue  # Listing every topic: those the principal may not DESCRIBE are left out.
            if names is not None and not self._permitted(connection, ApiKey.METADATA, TOPIC, name or ""):
                topic, code = None, TOPIC_AUTHORIZATION_FAILED
            elif topic is None and name is not None and auto_create and topic_name_problem(name) is None:
                if self._permitted(connection, ApiKey.CREATE_TOPICS, TOPIC, name):
                    topic, code = await self._auto_create(name)
                else:
                    code = TOPIC_AUTHORIZATION_FAILED
            elif topic is None:
                code = (
                    INVALID_TOPIC
                    if name is not None and topic_name_problem(name)
                    else UNKNOWN_TOPIC_OR_PARTITION
                )
            answers.append(self._topic_metadata(module, name or "", topic, code, leaders, live, epochs))
        controller = leaders[METADATA_GROUP]
        return build(
            module.MetadataResponse,
            throttle_time=0,
            brokers=tuple(self._broker_metadata(module, broker) for broker in self._brokers()),
            cluster_id=self._settings.cluster_id,
            controller_id=controller.broker_id if controller else -1,
            topics=tuple(answers),
            cluster_authorized_operations=NO_AUTHORIZED_OPERATIONS,
        )

    def _names_of_ids(self, topics: Any) -> list[str | None]:
        """The names of topics a Metadata request names by id (librdkafka's consumer-group members
        do: a ConsumerGroupHeartbeat assigns partitions by topic id); None for an unknown id."""
        with self._store.read() as reader:
            by_id = {topic.topic_id: topic.name for topic in reader.topics()}
        return [
            topic.name
            if topic.name is not None
            else by_id.get(topic.topic_id.int) if getattr(topic, "topic_id", None) is not None else None
            for topic in topics
        ]

    def _topics_for_metadata(
        self, names: list[str | None] | None
    ) -> list[tuple[str | None, TopicMeta | None]]:
        with self._store.read() as reader:
            if names is None:
                return [(topic.name, topic) for topic in reader.topics()]
            return [
                (name, None if name is None or topic_name_problem(name) else reader.topic(name))
                for name in names
            ]

    async def _auto_create(self, name: str) -> tuple[TopicMeta | None, int]:
        """Creates a topic a client asked for by name (Kafka's auto.create.topics.enable)."""
        request = kq_pb2.CreateTopicRequest(name=name, partitions=self._settings.default_partitions)
        try:
            await self._on_leader("CreateTopic", request)
        except KqError as error:
            if kafka_code(error) != TOPIC_ALREADY_EXISTS:
                return None, LEADER_NOT_AVAILABLE  # Retriable: the client asks again (maybe the leader).
        with self._store.read() as reader:
            topic = reader.topic(name)
        return topic, (NONE if topic is not None else LEADER_NOT_AVAILABLE)

    def _topic_metadata(
        self,
        module: Any,
        name: str,
        topic: TopicMeta | None,
        code: int,
        leaders: Mapping[int, KafkaBrokerInfo | None],
        live: Mapping[int, tuple[int, ...]],
        epochs: Mapping[int, int],
    ) -> Any:
        """A topic's metadata: each partition's leader is its group's (raft/placement.py), its
        replicas that group's brokers, its leader epoch that group's Raft term (raft/epochs.py)."""
        if topic is None:
            return build(
                module.MetadataResponseTopic,
                error_code=code,
                name=name,
                partitions=(),
                topic_authorized_operations=NO_AUTHORIZED_OPERATIONS,
            )
        replicas = {
            group: tuple(broker.broker_id for broker in self._group_brokers(group)) for group in leaders
        }
        partitions = []
        for index in range(topic.partitions):
            group = self._groups.group_of(topic, index)
            leader = leaders[group]
            partitions.append(
                build(
                    module.MetadataResponsePartition,
                    error_code=NONE if leader else LEADER_NOT_AVAILABLE,
                    partition_index=index,
                    leader_id=leader.broker_id if leader else -1,
                    leader_epoch=epochs[group],
                    replica_nodes=replicas[group],
                    isr_nodes=live[group],
                    offline_replicas=tuple(r for r in replicas[group] if r not in live[group]),
                )
            )
        return build(
            module.MetadataResponseTopic,
            error_code=NONE,
            name=topic.name,
            topic_id=uuid.UUID(int=topic.topic_id),
            is_internal=False,
            partitions=tuple(partitions),
            topic_authorized_operations=NO_AUTHORIZED_OPERATIONS,
        )

    @staticmethod
    def _broker_metadata(module: Any, broker: KafkaBrokerInfo) -> Any:
        return build(
            module.MetadataResponseBroker,
            node_id=broker.broker_id,
            host=broker.host,
            port=broker.port,
            rack=broker.rack,
        )

    async def describe_cluster(self, request: Request, connection: Connection) -> Any:
        """The brokers and the controller (the Raft leader)."""
        module = response_module(DESCRIBE_CLUSTER, request.api_version)
        leader = self._leader_broker(METADATA_GROUP)
        brokers = tuple(
            build(module.DescribeClusterBroker, broker_id=b.broker_id, host=b.host, port=b.port, rack=b.rack)
            for b in self._brokers()
        )
        return build(
            module.DescribeClusterResponse,
            throttle_time=0,
            error_code=NONE,
            endpoint_type=BROKERS_ENDPOINT,
            cluster_id=self._settings.cluster_id,
            controller_id=leader.broker_id if leader else -1,
            brokers=brokers,
            cluster_authorized_operations=NO_AUTHORIZED_OPERATIONS,
        )

    async def find_coordinator(self, request: Request, connection: Connection) -> Any:
        """A consumer group's coordinator: the leader of its coordinator group (raft/placement.py; the
        Raft leader when the cluster has one group), whose log replicates the group's state."""
        module = response_module(FIND_COORDINATOR, request.api_version)
        key = str(getattr(request.body, "key", "") or "")
        key_type = getattr(request.body, "key_type", 0)
        # A transaction's coordinator is group 0's leader (raft/transactions.py), a group's its group's.
        leader = self._leader_broker(METADATA_GROUP if key_type == 1 else self._groups.coordinator_of(key))
        if key_type not in (0, 1):
            code, message = INVALID_REQUEST, f"unknown coordinator key type {key_type}"
        elif leader is None:
            code, message = COORDINATOR_NOT_AVAILABLE, "no leader is elected right now"
        else:
            return build(
                module.FindCoordinatorResponse,
                error_code=NONE,
                node_id=leader.broker_id,
                host=leader.host,
                port=leader.port,
            )
        return build(
            module.FindCoordinatorResponse,
            error_code=code,
            error_message=message,
            node_id=-1,
            host="",
            port=-1,
        )

    # Topics -------------------------------------------------------------------------------------

    async def create_topics(self, request: Request, connection: Connection) -> Any:
        """Creates each topic through Raft (on the leader, the controller Metadata names)."""
        module = response_module(CREATE_TOPICS, request.api_version)
        results = []
        named = Counter(topic.name for topic in request.body.topics)
        for topic in request.body.topics:
            partitions = (
                topic.num_partitions if topic.num_partitions != -1 else self._settings.default_partitions
            )
            code, message = self._create_problem(topic, partitions)
            if named[topic.name] > 1:  # Kafka refuses every entry of a name given twice.
                code, message = INVALID_REQUEST, f"topic {topic.name} is named more than once"
            elif not self._permitted(connection, ApiKey.CREATE_TOPICS, TOPIC, topic.name):
                code, message = TOPIC_AUTHORIZATION_FAILED, f"not authorized to CREATE topic {topic.name}"
            if code == NONE and not request.body.validate_only:
                code, message = await self._create(topic.name, partitions, topic.configs)
            elif code == NONE:
                code, message = await self._in_reads(self._exists_problem, topic.name)
            results.append(
                build(
                    module.CreatableTopicResult,
                    name=topic.name,
                    error_code=code,
                    error_message=message,
                    num_partitions=partitions if code == NONE else -1,
                    replication_factor=len(self._settings.brokers) if code == NONE else -1,
                    configs=() if code == NONE else None,
                )
            )
        return build(module.CreateTopicsResponse, throttle_time=0, topics=tuple(results))

    def _create_problem(self, topic: Any, partitions: int) -> tuple[int, str | None]:
        problem = topic_name_problem(topic.name)
        if problem:
            return INVALID_TOPIC, problem
        problem = partition_count_problem(partitions)
        if problem:
            return INVALID_PARTITIONS, problem
        if not (
            topic.replication_factor == -1 or 0 < topic.replication_factor <= len(self._settings.brokers)
        ):
            return INVALID_REPLICATION_FACTOR, (
                f"every partition is on all {len(self._settings.brokers)} nodes; replication factor "
                f"must be -1 or 1 to {len(self._settings.brokers)}"
            )
        if topic.assignments and (topic.num_partitions != -1 or topic.replication_factor != -1):
            return INVALID_REQUEST, "a replica assignment and a partition count or replication factor"
        if topic.assignments:  # Kafka's code for an assignment it cannot follow.
            return (
                INVALID_REPLICA_ASSIGNMENT,
                "manual replica assignment is not supported: every broker of a partition's group holds it",
            )
        if any(config.value is None for config in topic.configs):
            return INVALID_CONFIG, "a topic config needs a value"
        problem = configs_problem([kq_pb2.ConfigEntry(name=c.name, value=c.value) for c in topic.configs])
        if problem:
            return INVALID_CONFIG, problem
        return NONE, None

    def _exists_problem(self, name: str) -> tuple[int, str | None]:
        with self._store.read() as reader:
            if reader.topic(name) is not None:
                return TOPIC_ALREADY_EXISTS, f"topic {name} already exists"
        return NONE, None

    async def _create(self, name: str, partitions: int, configs: Any = ()) -> tuple[int, str | None]:
        try:
            check_topic_name(name)
            check_partition_count(partitions)
            entries = [kq_pb2.ConfigEntry(name=c.name, value=c.value or "") for c in configs]
            await self._on_leader(
                "CreateTopic", kq_pb2.CreateTopicRequest(name=name, partitions=partitions, configs=entries)
            )
        except KqError as error:
            return kafka_code(error, NOT_CONTROLLER), str(error)
        return NONE, None

    async def delete_topics(self, request: Request, connection: Connection) -> Any:
        """Deletes each topic and its records through Raft."""
        module = response_module(DELETE_TOPICS, request.api_version)
        results = []
        named = Counter(request.body.topic_names)
        for name in request.body.topic_names:
            if named[name] > 1:  # Kafka refuses every entry of a name given twice.
                results.append(
                    build(
                        module.DeletableTopicResult,
                        name=name,
                        error_code=INVALID_REQUEST,
                        error_message=f"topic {name} is named more than once",
                    )
                )
                continue
            if not self._permitted(connection, ApiKey.DELETE_TOPICS, TOPIC, name):
                results.append(
                    build(
                        module.DeletableTopicResult,
                        name=name,
                        error_code=TOPIC_AUTHORIZATION_FAILED,
                        error_message=f"not authorized to DELETE topic {name}",
                    )
                )
                continue
            try:
                await self._on_leader("DeleteTopic", kq_pb2.DeleteTopicRequest(name=name))
                code, message = NONE, None
            except KqError as error:
                code, message = kafka_code(error, NOT_CONTROLLER), str(error)
                if topic_name_problem(name):
                    code = INVALID_TOPIC
            results.append(
                build(module.DeletableTopicResult, name=name, error_code=code, error_message=message)
            )
        return build(module.DeleteTopicsResponse, throttle_time=0, responses=tuple(results))

    # Producers ----------------------------------------------------------------------------------

    async def init_producer_id(self, request: Request, connection: Connection) -> Any:
        """A new idempotent producer id (allocated through Raft), epoch 0 (a transactional producer's:
        transactions.py)."""
        module = response_module(INIT_PRODUCER_ID, request.api_version)
        if not self._may_produce_idempotently(connection):
            return build(
                module.InitProducerIdResponse,
                throttle_time=0,
                error_code=CLUSTER_AUTHORIZATION_FAILED,
                producer_id=-1,
                producer_epoch=-1,
            )
        try:
            answer = await self._on_leader("RegisterProducer", kq_pb2.RegisterProducerRequest())
        except KqError as error:
            return build(
                module.InitProducerIdResponse,
                throttle_time=0,
                error_code=kafka_code(error, COORDINATOR_NOT_AVAILABLE),
                producer_id=-1,
                producer_epoch=-1,
            )
        return build(
            module.InitProducerIdResponse,
            throttle_time=0,
            error_code=NONE,
            producer_id=answer.producer_id,
            producer_epoch=0,
        )

    def _may_produce_idempotently(self, connection: Connection) -> bool:
        """InitProducerId's rule (authorize.py): WRITE on the cluster, or an ALLOW WRITE on some topic;
        a refusal is logged as the cluster one."""
        principal = connection.principal
        if principal is None:
            return False
        if principal.super_user or writes_some_topic(self._security.state, principal.name):
            return True
        needed = access(ApiKey.INIT_PRODUCER_ID, CLUSTER, CLUSTER_RESOURCE)
        return self._security.denied(principal, [needed]) is None
