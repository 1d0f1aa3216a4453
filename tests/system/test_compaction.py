"""Compaction and retention on a real three-node cluster, and a wiped follower that catches up after both.

One topic is compacted (`cleanup.policy=compact`): twenty keys each written ten times through a Kafka
producer, five deleted with tombstones three hours old (past `delete.retention.ms` of an hour, so
compaction drops them) and five with fresh ones (kept). Another topic loses its old prefix to
retention. A follower is stopped before any of it, wiped, and started again once the leader's Raft
log was compacted past it, so it comes back through a snapshot of the store. Every node then serves
the same records, a Kafka consumer reads the newest value per key across the gaps, and the three LMDB
stores, opened after the nodes stop, hold the same bytes.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kq.client import KqClient
from kq.deploy.cluster import LocalCluster
from kq.deploy.reading import read_whole_partition
from kq.deploy.waiting import wait_for
from kq.storage import Store
from tests.system.checks import kafka_read

pytestmark = pytest.mark.system

HOUR_MS = 3_600_000
WAIT_S = 60.0
KEYS = 20
ROUNDS = 10
LOG_DATABASES = {b"topics", b"partitions", b"records", b"record_pieces", b"timestamps", b"topic_configs"}
NODE_ARGS = (
    "--compaction-check-ms",
    "200",
    "--retention-check-ms",
    "200",
    "--compaction-min-entries",
    "50",
    "--compaction-min-time-s",
    "1",
)


def expected_kv() -> list[tuple[bytes, bytes | None]]:
    """(key, value) of what a compacted "kv" keeps, in offset order: k10..k19's last values, then the
    fresh tombstones of k5..k9 (the old tombstones of k0..k4 and every older value are gone)."""
    return [(b"k%d" % k, b"v%d-%d" % (k, ROUNDS - 1)) for k in range(10, KEYS)] + [
        (b"k%d" % k, None) for k in range(5, 10)
    ]


def held(client: KqClient, topic: str, node: str) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for r in read_whole_partition(client, topic, 0, node)]


def test_compaction_and_trims_replicate_and_survive_a_wiped_follower(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster", node_args=NODE_ARGS)
    try:
        cluster.start()
        leader = cluster.wait_ready()
        follower = next(node for node in cluster.nodes if node != leader)
        running = [cluster.nodes[n].grpc_address for n in cluster.nodes if n != follower]
        cluster.stop_node(follower)
        now_ms = int(time.time() * 1000)
        with KqClient(cluster.bootstrap) as client:
            client.create_topic(
                "kv",
                1,
                {
                    "cleanup.policy": "compact",
                    "delete.retention.ms": str(HOUR_MS),
                    "min.cleanable.dirty.ratio": "0.01",
                },
            )
            client.create_topic("aged", 1, {"retention.ms": str(HOUR_MS)})
            producer = Producer({"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all", "linger.ms": 5})
            for round_ in range(ROUNDS):
                for k in range(KEYS):
                    producer.produce("kv", b"v%d-%d" % (k, round_), key=b"k%d" % k, partition=0)
                producer.flush(10)
            for k in range(10):
                old = now_ms - 3 * HOUR_MS if k < 5 else now_ms
                producer.produce("kv", None, key=b"k%d" % k, partition=0, timestamp=old)
                producer.flush(10)
            for i in range(15):
                producer.produce(
                    "aged", b"a%d" % i, partition=0, timestamp=now_ms - (3 * HOUR_MS if i < 10 else 0)
                )
                producer.flush(10)
            assert producer.flush(10) == 0

            def settled() -> bool:  # On both running nodes: kv compacted, aged trimmed.
                return all(
                    [(key, value) for _, key, value in held(client, "kv", node)] == expected_kv()
                    and client.list_offsets("aged", node)[0].log_start_offset == 10
                    for node in running
                )

            wait_for(settled, "kv compacted and aged trimmed on the running nodes", WAIT_S)
            leader_address = cluster.nodes[leader].grpc_address

            def log_compacted() -> bool:  # Entries dropped: the wiped follower needs a snapshot.
                status = client.node_status(leader_address)
                return status.raft_log_entries < status.applied_index - 10

            wait_for(log_compacted, "the leader's Raft log compacted past the stopped follower", WAIT_S)
            index = client.node_status(leader_address).applied_index
        shutil.rmtree(cluster.nodes[follower].data_dir)
        cluster.start_node(follower)
        cluster.wait_applied(index, list(cluster.nodes), timeout_s=WAIT_S)
        log = cluster.log_path(follower).read_text()
        assert "store restored from snapshot" in log, "the follower must have caught up through a snapshot"
        with KqClient(cluster.bootstrap) as client:
            views = {
                node: (held(client, "kv", node), held(client, "aged", node)) for node in cluster.bootstrap
            }
            reference = views[cluster.bootstrap[0]]
            assert all(view == reference for view in views.values()), "nodes serve different records"
            assert [offset for offset, _, _ in reference[1]] == list(range(10, 15))
            offsets = [offset for offset, _, _ in reference[0]]
            assert offsets == sorted(offsets) and offsets[-1] == KEYS * ROUNDS + 9  # The last tombstone.
        messages = kafka_read(cluster.kafka_bootstrap, "kv", "kv-reader", len(expected_kv()), WAIT_S)
        assert [(m.key(), m.value()) for m in messages] == expected_kv()
    finally:
        cluster.stop()
    dumps = []
    for spec in cluster.nodes.values():  # What compaction and trims write; groups churned at the end.
        store = Store.open(spec.data_dir / "store")
        dumps.append([row for row in store.dump() if row[0] in LOG_DATABASES])
        store.close()
    assert dumps[0] and dumps[0] == dumps[1] == dumps[2], "the nodes' stores differ"
