"""Producer id expiry through a real node: an idle idempotent producer disappears from DescribeProducers
once `--producer-id-expiration-ms` passes (the leader's `kq-producer-expiry` sweeps every
`--producer-id-expiration-check-interval-ms`), and its next batch, whose sequence continues where it
stood, is accepted as Kafka (KIP-360) accepts a producer the partition has no state of.

Apply's decision itself, with explicit clocks, is tests/raft/test_producer_expiry.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from kio.schema.describe_producers.v0.request import DescribeProducersRequest
from kio.schema.describe_producers.v0.request import TopicRequest as DescribeProducersTopic
from kio.schema.types import TopicName
from kio.static.primitive import i32

from kq.client import KqClient
from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for
from tests.kafka.wire import call

pytestmark = pytest.mark.system

EXPIRATION_MS = 5_000  # Long enough for the first check below to see the producer listed.
WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    base: Path = tmp_path_factory.mktemp("producer-expiry") / "cluster"
    flags = [
        "--producer-id-expiration-ms",
        str(EXPIRATION_MS),
        "--producer-id-expiration-check-interval-ms",
        "200",
    ]
    with LocalCluster(base, 1, node_args=flags) as local:
        local.wait_ready()
        yield local


def listed_producers(cluster: LocalCluster, topic: str) -> list[tuple[int, int]]:
    """(producer id, last timestamp) of each producer DescribeProducers at the leader lists for
    partition 0."""
    leader = cluster.nodes[cluster.wait_ready()].kafka_address
    request = DescribeProducersRequest(
        topics=(DescribeProducersTopic(name=TopicName(topic), partition_indexes=(i32(0),)),)
    )
    answer: Any = call(leader, request)
    partition = answer.topics[0].partitions[0]
    assert partition.error_code == 0
    return [(int(p.producer_id), int(p.last_timestamp)) for p in partition.active_producers]


def test_an_idle_producer_expires_and_its_next_batch_is_accepted(cluster: LocalCluster) -> None:
    """An idempotent producer writes 3 batches, is listed, goes idle past the expiration and is no
    longer listed; the same producer then writes again (sequence 3, not 0) and every record is read
    back once."""
    topic = f"expiry-{uuid.uuid4().hex[:8]}"
    with KqClient(cluster.bootstrap) as client:
        client.create_topic(topic, 1)
    producer = Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "enable.idempotence": True, "linger.ms": 0}
    )
    for number in range(3):
        producer.produce(topic, b"before-%d" % number, partition=0)
        assert producer.flush(30) == 0
    before_ms = int(time.time() * 1000)
    [(producer_id, last_ms)] = listed_producers(cluster, topic)
    assert before_ms - 60_000 < last_ms <= before_ms  # The last append's leader clock (one machine).
    wait_for(lambda: not listed_producers(cluster, topic), "the idle producer expired", WAIT_S)
    failures: list[str] = []
    producer.produce(
        topic,
        b"after",
        partition=0,
        on_delivery=lambda error, _: failures.append(str(error)) if error else None,
    )
    assert producer.flush(30) == 0 and not failures
    assert [listed[0] for listed in listed_producers(cluster, topic)] == [producer_id]
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([topic])
        values: list[bytes] = []
        wait_for(lambda: _read_into(consumer, values) >= 4, "the four records read back", WAIT_S)
    finally:
        consumer.close()
    assert values == [b"before-0", b"before-1", b"before-2", b"after"]


def _read_into(consumer: Consumer, values: list[bytes]) -> int:
    message = consumer.poll(0.5)
    if message is not None and message.error() is None:
        values.append(message.value() or b"")
    return len(values)
