"""Retention on a real three-node cluster: the leader trims by time and by size, every node agrees.

The clock is not injected here: the records carry timestamps hours in the past (a Kafka producer may
set any CreateTime), so retention.ms of an hour expires them at the leader's next round, which
`--retention-check-ms 200` makes come quickly. tests/broker/test_retention.py drives the decision
itself with any clock.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kq.client import GroupConsumer, KqClient, OffsetOutOfRangeError
from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for
from tests.system.checks import kafka_read

pytestmark = pytest.mark.system

HOUR_MS = 3_600_000
WAIT_S = 30.0  # A round every 0.2 s: a trim not seen by then is a failure.


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    base: Path = tmp_path_factory.mktemp("retention") / "cluster"
    with LocalCluster(base, node_args=["--retention-check-ms", "200"]) as local:
        local.wait_ready()
        yield local


def produce(cluster: LocalCluster, topic: str, values: list[bytes], timestamp_ms: int) -> None:
    """One Kafka batch per value (a flush each), all at `timestamp_ms`, acks=all."""
    producer = Producer({"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all", "linger.ms": 0})
    for value in values:
        producer.produce(topic, value, partition=0, timestamp=timestamp_ms)
        assert producer.flush(10) == 0


def starts(client: KqClient, cluster: LocalCluster, topic: str) -> set[int]:
    """Partition 0's log start as each node sees it."""
    return {client.describe_topic(topic, node).partitions[0].log_start_offset for node in cluster.bootstrap}


def test_records_older_than_retention_ms_are_trimmed_on_every_node(cluster: LocalCluster) -> None:
    """Ten records three hours old and five fresh ones under retention.ms of an hour: the old ten go
    everywhere; a read below the new start is out of range, and a Kafka consumer starting from the
    earliest offset reads exactly the fresh five."""
    now_ms = int(time.time() * 1000)
    with KqClient(cluster.bootstrap) as client:
        client.create_topic("aged", 1, {"retention.ms": str(HOUR_MS)})
        produce(cluster, "aged", [b"old-%d" % i for i in range(10)], now_ms - 3 * HOUR_MS)
        produce(cluster, "aged", [b"new-%d" % i for i in range(5)], now_ms)
        wait_for(
            lambda: starts(client, cluster, "aged") == {10}, "the old prefix trimmed on all nodes", WAIT_S
        )
        with pytest.raises(OffsetOutOfRangeError):
            client.fetch("aged", 0, 0)
    values = [m.value() for m in kafka_read(cluster.kafka_bootstrap, "aged", "aged-reader", 5, WAIT_S)]
    assert values == [b"new-%d" % i for i in range(5)]


def test_retention_bytes_keeps_the_newest_batches_within_the_bound(cluster: LocalCluster) -> None:
    """Twenty batches of about 1 KiB under retention.bytes of 5 KiB: every node keeps the same newest
    batches, at least 5 KiB and at most one batch more (Kafka's rule), and the log end is unchanged."""
    with KqClient(cluster.bootstrap) as client:
        client.create_topic("sized", 1, {"retention.bytes": str(5 * 1024)})
        produce(cluster, "sized", [bytes([i]) * 1024 for i in range(20)], int(time.time() * 1000))

        def settled() -> bool:
            views = [client.describe_topic("sized", node).partitions[0] for node in cluster.bootstrap]
            return (
                len({(v.log_start_offset, v.size_bytes) for v in views}) == 1
                and views[0].log_start_offset > 0
            )

        wait_for(settled, "the same trimmed prefix on every node", WAIT_S)
        time.sleep(1.0)  # Five more rounds: nothing else is due.
        partition = client.describe_topic("sized").partitions[0]
        batch_bytes = partition.size_bytes // (partition.log_end_offset - partition.log_start_offset)
        assert partition.log_end_offset == 20
        assert 5 * 1024 <= partition.size_bytes < 5 * 1024 + batch_bytes + 1
        first = client.fetch("sized", 0, partition.log_start_offset).records[0]
        assert first.value == bytes([partition.log_start_offset]) * 1024


def test_a_group_member_below_the_log_start_resets_to_it(cluster: LocalCluster) -> None:
    """A member read two of ten old records; retention then trims all ten. Its next polls meet
    OUT_OF_RANGE and, with auto_offset_reset="earliest", move it to the new log start, from where it
    reads the fresh records (Kafka's consumer does the same)."""
    now_ms = int(time.time() * 1000)
    with KqClient(cluster.bootstrap) as client:
        client.create_topic("regrouped", 1)
        produce(cluster, "regrouped", [b"old-%d" % i for i in range(10)], now_ms - 3 * HOUR_MS)
        consumer = GroupConsumer(client, "regroup", ["regrouped"], enable_auto_commit=False)
        try:
            first: list[bytes | None] = []
            deadline = time.monotonic() + WAIT_S
            while not first and time.monotonic() < deadline:
                first = [r.value for r in consumer.poll(timeout_ms=500, max_records=2)]
            assert first == [b"old-0", b"old-1"]
            client.alter_topic_config("regrouped", {"retention.ms": str(HOUR_MS)})
            wait_for(lambda: starts(client, cluster, "regrouped") == {10}, "the old records trimmed", WAIT_S)
            produce(cluster, "regrouped", [b"new-%d" % i for i in range(3)], now_ms)
            later: list[bytes | None] = []
            deadline = time.monotonic() + WAIT_S
            while len(later) < 3 and time.monotonic() < deadline:
                later += [r.value for r in consumer.poll(timeout_ms=500)]
            assert later == [b"new-%d" % i for i in range(3)]
            assert consumer.position("regrouped", 0) == 13
        finally:
            consumer.close()
