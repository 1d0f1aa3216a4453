"""Kafka leader epochs (KIP-101, KIP-320) across a leader failover, with librdkafka and raw frames.

Each partition's leader epoch is its Raft group's term: Metadata reports it, each fetched batch
carries the epoch it was appended in, and it rises when a new leader is elected. A confluent-kafka
consumer reading across the failover sees every record once, in order, with no truncation error
(librdkafka validates its position with OffsetForLeaderEpoch when the epoch rises: counted in the
nodes' /metrics). The raw
OffsetForLeaderEpoch frames check Kafka's answers: where an old epoch ends, the current one ending at
the log end, a future one undefined, fencing of an old or unknown current epoch, and a follower's
NOT_LEADER_OR_FOLLOWER.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._acl import AclBinding, AclOperation, AclPermissionType
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType
from confluent_kafka.cimpl import NewTopic
from kio.schema.describe_acls.v3.request import DescribeAclsRequest
from kio.schema.list_offsets.v7.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kio.schema.metadata.v9.request import MetadataRequest, MetadataRequestTopic
from kio.schema.offset_for_leader_epoch.v4.request import (
    OffsetForLeaderEpochRequest,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
)
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i64

from kq.client import KqClient
from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for
from tests.kafka.wire import call
from tests.system.groups import agreed_leaders
from tests.system.test_operate import scrape, total

pytestmark = pytest.mark.system

WAIT_S = 60.0
BEFORE, AFTER = 30, 20  # Records produced before and after the failover.
FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER = 74, 75, 6


def _until(condition: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _metadata_epoch(cluster: LocalCluster, node_id: str, topic: str) -> int:
    request = MetadataRequest(
        topics=(MetadataRequestTopic(name=TopicName(topic)),),
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    response = call(cluster.nodes[node_id].kafka_address, request)
    return int(response.topics[0].partitions[0].leader_epoch)


def _end_offset(cluster: LocalCluster, node_id: str, topic: str, epoch: int, current: int = -1) -> Any:
    request = OffsetForLeaderEpochRequest(
        replica_id=BrokerId(-1),
        topics=(
            OffsetForLeaderTopic(
                topic=TopicName(topic),
                partitions=(
                    OffsetForLeaderPartition(
                        partition=i32(0), current_leader_epoch=i32(current), leader_epoch=i32(epoch)
                    ),
                ),
            ),
        ),
    )
    return call(cluster.nodes[node_id].kafka_address, request).topics[0].partitions[0]


def _produce(cluster: LocalCluster, topic: str, values: range) -> None:
    producer = Producer({"bootstrap.servers": cluster.kafka_bootstrap, "enable.idempotence": True})
    for value in values:
        producer.produce(topic, f"{value:04d}".encode(), partition=0)
    assert producer.flush(WAIT_S) == 0


def _consume(consumer: Consumer, count: int, into: list[Any]) -> None:
    deadline = time.monotonic() + WAIT_S
    while len(into) < count and time.monotonic() < deadline:
        for message in consumer.consume(100, 0.5):
            assert message.error() is None, message.error()
            into.append(message)


def test_epochs_rise_after_a_failover_and_consumers_read_across_it(kafka_cluster: LocalCluster) -> None:
    """Metadata's epoch is the term; records carry the epoch they were appended in; after the leader
    is killed the epoch rises on every node, a consumer reads on without error, and
    OffsetForLeaderEpoch answers where the old epoch ends (where the new one's records start)."""
    topic = f"epochs-{uuid.uuid4().hex[:6]}"
    with KqClient(kafka_cluster.bootstrap) as client:
        client.create_topic(topic, partitions=1)
    _produce(kafka_cluster, topic, range(BEFORE))
    leader = kafka_cluster.wait_ready()
    first = _metadata_epoch(kafka_cluster, leader, topic)
    assert first > 0
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_cluster.kafka_bootstrap,
            "group.id": f"e-{topic}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    read: list[Any] = []
    try:
        _consume(consumer, BEFORE, read)
        assert {message.leader_epoch() for message in read} == {first}

        kafka_cluster.kill_node(leader)
        new_leader = kafka_cluster.wait_ready()
        kafka_cluster.start_node(leader)
        kafka_cluster.wait_ready()
        second = _until(
            lambda: (
                all(_metadata_epoch(kafka_cluster, n, topic) > first for n in kafka_cluster.nodes)
                and _metadata_epoch(kafka_cluster, new_leader, topic)
            ),
            "every node to report the new epoch",
        )
        _produce(kafka_cluster, topic, range(BEFORE, BEFORE + AFTER))
        _consume(consumer, BEFORE + AFTER, read)
    finally:
        consumer.close()
    validations = sum(
        total(
            scrape(spec.http_address),
            "kq_kafka_request_latency_seconds_count",
            request="offset_for_leader_epoch",
        )
        for spec in kafka_cluster.nodes.values()
    )
    assert validations >= 1, "librdkafka validated its position against the new leader's epoch"
    values = [message.value() for message in read]
    assert values == [f"{value:04d}".encode() for value in range(BEFORE + AFTER)]
    assert {message.leader_epoch() for message in read[BEFORE:]} == {second}

    new_leader = kafka_cluster.wait_ready()
    old_end = _end_offset(kafka_cluster, new_leader, topic, first)
    assert (old_end.error_code, old_end.leader_epoch, old_end.end_offset) == (0, first, BEFORE)
    current_end = _end_offset(kafka_cluster, new_leader, topic, second, current=second)
    assert (current_end.error_code, current_end.leader_epoch, current_end.end_offset) == (
        0,
        second,
        BEFORE + AFTER,
    )
    future = _end_offset(kafka_cluster, new_leader, topic, second + 1)
    assert (future.leader_epoch, future.end_offset) == (-1, -1)
    assert (
        _end_offset(kafka_cluster, new_leader, topic, first, current=first).error_code == FENCED_LEADER_EPOCH
    )
    ahead = _end_offset(kafka_cluster, new_leader, topic, first, current=second + 5)
    assert ahead.error_code == UNKNOWN_LEADER_EPOCH
    follower = next(node for node in kafka_cluster.nodes if node != new_leader)
    assert _end_offset(kafka_cluster, follower, topic, first).error_code == NOT_LEADER_OR_FOLLOWER


def test_list_offsets_reports_and_checks_the_leader_epoch(kafka_cluster: LocalCluster) -> None:
    """ListOffsets v4+ answers the epoch of the offset found (the current one at the log end) and
    fences a stale current epoch, as Kafka."""
    topic = f"epochs-lo-{uuid.uuid4().hex[:6]}"
    with KqClient(kafka_cluster.bootstrap) as client:
        client.create_topic(topic, partitions=1)
    _produce(kafka_cluster, topic, range(3))
    leader = kafka_cluster.wait_ready()
    epoch = _metadata_epoch(kafka_cluster, leader, topic)

    def list_offsets(timestamp: int, current: int) -> Any:
        request = ListOffsetsRequest(
            replica_id=BrokerId(-1),
            isolation_level=i8(0),
            topics=(
                ListOffsetsTopic(
                    name=TopicName(topic),
                    partitions=(
                        ListOffsetsPartition(
                            partition_index=i32(0),
                            current_leader_epoch=i32(current),
                            timestamp=i64(timestamp),
                        ),
                    ),
                ),
            ),
        )
        return call(kafka_cluster.nodes[leader].kafka_address, request).topics[0].partitions[0]

    latest = list_offsets(-1, epoch)
    assert (latest.error_code, latest.offset, latest.leader_epoch) == (0, 3, epoch)
    earliest = list_offsets(-2, -1)
    assert (earliest.error_code, earliest.offset, earliest.leader_epoch) == (0, 0, epoch)
    assert list_offsets(-1, epoch - 1).error_code == FENCED_LEADER_EPOCH


def test_each_raft_groups_partitions_carry_that_groups_term(tmp_path: Path) -> None:
    """With two worker processes a node (two Raft groups), each partition reports its own group's
    term, a consumer reads every partition through both groups' processes without a fencing error, and
    each partition's leader answers OffsetForLeaderEpoch for its current epoch with its log end. An
    ACL created through Kafka is described by every broker, the processes of group 1 included (they
    ask group 0's leader: their own stores hold no security rows)."""
    topic, partitions, count = "epochs-groups", 4, 40
    with LocalCluster(tmp_path / "cluster", processes=2) as cluster:
        wait_for(lambda: agreed_leaders(cluster, list(cluster.nodes)), "every group's leader", WAIT_S)
        admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(WAIT_S)
        producer = Producer({"bootstrap.servers": cluster.kafka_bootstrap, "enable.idempotence": True})
        for value in range(count):
            producer.produce(topic, f"{value:04d}".encode(), partition=value % partitions)
        assert producer.flush(WAIT_S) == 0
        request = MetadataRequest(
            topics=(MetadataRequestTopic(name=TopicName(topic)),),
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
        metadata = call(cluster.kafka_bootstrap.split(",")[0], request)
        brokers = {broker.node_id: f"{broker.host}:{broker.port}" for broker in metadata.brokers}
        answers = metadata.topics[0].partitions
        assert all(partition.leader_epoch > 0 for partition in answers)
        assert len({partition.leader_id for partition in answers}) == 2, "both groups hold partitions"

        consumer = Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "epochs-groups"})
        consumer.assign([TopicPartition(topic, partition, 0) for partition in range(partitions)])
        read: list[Any] = []
        try:
            _consume(consumer, count, read)
        finally:
            consumer.close()
        assert sorted(message.value() for message in read) == [f"{v:04d}".encode() for v in range(count)]
        for message in read:
            assert message.leader_epoch() == answers[message.partition()].leader_epoch

        for partition in answers:
            ask = OffsetForLeaderEpochRequest(
                replica_id=BrokerId(-1),
                topics=(
                    OffsetForLeaderTopic(
                        topic=TopicName(topic),
                        partitions=(
                            OffsetForLeaderPartition(
                                partition=partition.partition_index,
                                current_leader_epoch=partition.leader_epoch,
                                leader_epoch=partition.leader_epoch,
                            ),
                        ),
                    ),
                ),
            )
            found = call(brokers[partition.leader_id], ask).topics[0].partitions[0]
            assert (found.error_code, found.leader_epoch, found.end_offset) == (
                0,
                partition.leader_epoch,
                count // partitions,
            )

        binding = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:gus", "*",
                             AclOperation.READ, AclPermissionType.ALLOW)  # fmt: skip
        assert admin.create_acls([binding])[binding].result(WAIT_S) is None
        describe = DescribeAclsRequest(
            resource_type_filter=i8(1), resource_name_filter=None, pattern_type_filter=i8(1),
            principal_filter="User:gus", host_filter=None, operation=i8(1), permission_type=i8(1),
        )  # fmt: skip

        def described_everywhere() -> bool:
            answers = [call(address, describe) for address in brokers.values()]
            return all(
                a.error_code == 0 and [r.resource_name for r in a.resources] == [topic] for a in answers
            )

        assert len(brokers) == 6  # Three nodes, two processes each.
        _until(described_everywhere, "every broker to describe the ACL")
