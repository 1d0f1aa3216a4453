"""Kafka consumer groups on kq: librdkafka consumers share a topic, rebalance when one leaves, commit,
and a later member resumes at the committed offsets, which kq's own client reads too."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from kafka import KafkaConsumer

from kq.client import KqClient
from kq.deploy.cluster import LocalCluster

pytestmark = pytest.mark.system

PARTITIONS = 6
RECORDS = 600
TIMEOUT_S = 60.0


def _consumer(cluster: LocalCluster, group: str) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
        }
    )
    return consumer


def _produce(cluster: LocalCluster, topic: str, start: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": cluster.kafka_bootstrap})
    for i in range(start, start + count):
        producer.produce(topic, f"v{i}".encode(), f"k{i}".encode())
    assert producer.flush(TIMEOUT_S) == 0


def test_three_consumers_share_rebalance_commit_and_resume(kafka_cluster: LocalCluster) -> None:
    """Every partition is assigned once, every record read once; a leave rebalances; commits resume."""
    topic, group = f"grp-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": kafka_cluster.kafka_bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(TIMEOUT_S)
    consumers = [_consumer(kafka_cluster, group) for _ in range(3)]
    for consumer in consumers:
        consumer.subscribe([topic])
    # Records are written once the group is stable: a rebalance before the first commit would hand a
    # partition's records to a second member, which Kafka's at-least-once delivery allows.
    deadline = time.monotonic() + TIMEOUT_S
    while not all(len(c.assignment()) == PARTITIONS // 3 for c in consumers) and time.monotonic() < deadline:
        for consumer in consumers:
            consumer.poll(0.1)
    _produce(kafka_cluster, topic, 0, RECORDS)
    values: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(values) < RECORDS and time.monotonic() < deadline:
        for consumer in consumers:
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                values.append(message.value() or b"")
    assert sorted(values) == sorted(f"v{i}".encode() for i in range(RECORDS))
    assignments = [{(tp.topic, tp.partition) for tp in consumer.assignment()} for consumer in consumers]
    assert sorted(p for a in assignments for _, p in a) == list(range(PARTITIONS))
    for consumer in consumers:
        consumer.commit(asynchronous=False)
    consumers[2].close()
    deadline = time.monotonic() + TIMEOUT_S
    while sum(len(c.assignment()) for c in consumers[:2]) != PARTITIONS and time.monotonic() < deadline:
        for consumer in consumers[:2]:
            consumer.poll(0.1)
    assert sorted(tp.partition for c in consumers[:2] for tp in c.assignment()) == list(range(PARTITIONS))
    for consumer in consumers[:2]:
        consumer.close()
    with KqClient(kafka_cluster.bootstrap) as client:
        committed = client.committed_offsets(group)
    assert sum(committed.values()) == RECORDS  # Each partition's commit is its log end.
    _produce(kafka_cluster, topic, RECORDS, 30)
    later = KafkaConsumer(
        topic,
        bootstrap_servers=kafka_cluster.kafka_bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=int(TIMEOUT_S * 1000),
    )
    resumed = []
    for message in later:
        resumed.append(message.value)
        if len(resumed) == 30:
            break
    later.commit()
    later.close()
    assert sorted(resumed) == sorted(f"v{i}".encode() for i in range(RECORDS, RECORDS + 30))
