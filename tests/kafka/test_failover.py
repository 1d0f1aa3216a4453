"""A librdkafka idempotent producer keeps writing while the leader is killed twice: afterwards every
acknowledged record is present exactly once, in order per partition."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kq.deploy.cluster import LocalCluster

pytestmark = pytest.mark.system

RECORDS = 100_000
PARTITIONS = 3
KILLS = 2
TIMEOUT_S = 180.0
RATE_PER_S = 10_000  # Paced so the sending spans both failovers (about ten seconds).


def test_idempotent_producer_survives_two_leader_kills(kafka_cluster: LocalCluster) -> None:
    """No acknowledged record is lost or duplicated across two leader failovers."""
    topic = f"failover-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_cluster.kafka_bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    producer = Producer(
        {
            "bootstrap.servers": kafka_cluster.kafka_bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": int(TIMEOUT_S * 1000),
        }
    )
    acknowledged: dict[int, list[bytes]] = {partition: [] for partition in range(PARTITIONS)}
    failed: list[str] = []
    last_ack = [0.0]

    def delivered(error: object, message: object) -> None:
        if error is not None:
            failed.append(str(error))
        else:
            acknowledged[message.partition()].append(message.value())  # type: ignore[attr-defined]
            last_ack[0] = time.monotonic()

    kills: list[float] = []
    killer = threading.Thread(target=_kill_leaders, args=(kafka_cluster, kills), daemon=True)
    killer.start()
    began = time.monotonic()
    for i in range(RECORDS):
        if i % 1000 == 0:
            time.sleep(max(0.0, began + i / RATE_PER_S - time.monotonic()))
        if i == RECORDS * 9 // 10:
            while killer.is_alive():  # The last tenth goes after both failovers, however slow they are.
                producer.poll(0.1)
        while True:
            try:
                producer.produce(topic, f"{i:08d}".encode(), partition=i % PARTITIONS, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0
    killer.join(TIMEOUT_S)
    assert len(kills) == KILLS and kills[-1] < last_ack[0], "both leaders died while records were in flight"
    assert not failed, failed[:5]
    assert sum(len(values) for values in acknowledged.values()) == RECORDS
    for partition in range(PARTITIONS):
        stored = _read_partition(kafka_cluster, topic, partition, len(acknowledged[partition]))
        assert len(stored) == len(set(stored)), f"partition {partition} holds duplicates"
        assert stored == sorted(stored), f"partition {partition} is out of order"
        assert stored == acknowledged[partition]


def _kill_leaders(cluster: LocalCluster, kills: list[float]) -> None:
    """Kills the leader twice (restarting it after a new leader is elected), a second apart."""
    for _ in range(KILLS):
        time.sleep(1.0)
        leader = cluster.wait_ready()
        cluster.kill_node(leader)
        kills.append(time.monotonic())
        cluster.wait_ready()
        cluster.start_node(leader)
    cluster.wait_ready()


def _read_partition(cluster: LocalCluster, topic: str, partition: int, count: int) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, partition, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        # Everything up to the high watermark: `count` records, and any beyond them (duplicates).
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=TIMEOUT_S)
        next_offset = 0
        while next_offset < max(end, count) and time.monotonic() < deadline:
            for message in consumer.consume(1000, 1.0):
                assert message.error() is None, message.error()
                values.append(message.value() or b"")
                next_offset = (message.offset() or 0) + 1
    finally:
        consumer.close()
    return values
