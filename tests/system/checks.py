"""Reading whole partitions from each node and comparing them: shared by the system tests."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Message

from kq.client import ConsumerRecord, KqClient
from kq.deploy.reading import read_whole_partition


def read_everywhere(
    client: KqClient, topic: str, partitions: int, nodes: list[str]
) -> dict[str, dict[int, list[ConsumerRecord]]]:
    """node -> partition -> records; asserts every node holds identical records at identical offsets."""
    result = {
        node: {p: read_whole_partition(client, topic, p, node) for p in range(partitions)} for node in nodes
    }
    reference = result[nodes[0]]
    for node in nodes[1:]:
        for partition in range(partitions):
            assert result[node][partition] == reference[partition], f"{node} differs on partition {partition}"
    for partition, records in reference.items():
        offsets = [record.offset for record in records]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))) if offsets else True, partition
    return result


def kafka_read(bootstrap: str, topic: str, group: str, count: int, timeout_s: float) -> list[Message]:
    """Up to `count` messages a librdkafka consumer in `group` reads from the earliest offset."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    messages: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(messages) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            messages.append(message)
    consumer.close()
    return messages
