"""The batching Producer on three real nodes: a leader kill mid-stream keeps every partition exact."""

from __future__ import annotations

import threading
import time

import pytest

from kq.client import KqClient, Producer
from kq.deploy.cluster import LocalCluster
from tests.system.checks import read_everywhere

pytestmark = pytest.mark.system


def test_producer_keeps_order_and_exactly_once_through_a_leader_kill(cluster: LocalCluster) -> None:
    """Records sent while the leader dies are all acknowledged, once each, in send order per partition."""
    with KqClient(cluster.bootstrap) as client:
        client.create_topic("piped", partitions=4)
        producer = Producer(client, linger_ms=2, batch_size=16 * 1024, max_in_flight=4)
        futures = []
        killer = threading.Timer(0.5, lambda: cluster.kill_node(cluster.wait_ready()))
        killer.start()
        deadline = time.monotonic() + 60
        for i in range(20_000):
            futures.append(producer.send("piped", f"{i}".encode(), partition=i % 4))
            if i % 1_000 == 0:
                time.sleep(0.05)  # Spread the stream over the kill.
            assert time.monotonic() < deadline
        producer.flush(timeout_s=120)
        producer.close()
        killer.join()
        metadata = [future.result() for future in futures]
        nodes = [node.grpc_address for node_id, node in cluster.nodes.items() if cluster.running(node_id)]
        held = read_everywhere(client, "piped", 4, nodes)
    for partition in range(4):
        values = [int(r.value or b"") for r in held[nodes[0]][partition]]
        assert values == list(range(partition, 20_000, 4)), f"partition {partition} is not exact and in order"
        offsets = [m.offset for i, m in enumerate(metadata) if i % 4 == partition]
        assert offsets == [r.offset for r in held[nodes[0]][partition]]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_round_trip_through_every_node(shared_cluster: LocalCluster, codec: str) -> None:
    """Batches sent compressed are stored compressed and read back identically from every node."""
    cluster, topic = shared_cluster, f"squeezed-{codec}"
    with KqClient(cluster.bootstrap) as client:
        client.create_topic(topic, partitions=2)
        with Producer(client, linger_ms=5, compression=codec) as producer:
            futures = [
                producer.send(topic, f"value-{i}".encode() * 20, key=f"k{i}".encode(), partition=i % 2)
                for i in range(2_000)
            ]
        assert all(future.result().offset >= 0 for future in futures)
        nodes = cluster.bootstrap
        held = read_everywhere(client, topic, 2, nodes)
        described = client.describe_topic(topic)
    for partition in range(2):
        values = [r.value for r in held[nodes[0]][partition]]
        assert values == [f"value-{i}".encode() * 20 for i in range(partition, 2_000, 2)]
    stored = sum(p.size_bytes for p in described.partitions)
    assert stored < 2_000 * 100, "the stored batches should be compressed"
