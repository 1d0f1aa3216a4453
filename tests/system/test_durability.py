"""Three real nodes with --durability=fsync: kill -9 of every node while a producer writes, a restart,
and every acknowledged record is there, once, identical on every node.

A killed process leaves its writes in the page cache, so this cannot show what a power loss does
(tests/raft/test_durability.py simulates one); it shows the mode works end to end and restarts
cleanly, with log compaction (a small --compaction-min-entries) running during the writes.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kq.client import KqClient, ProducerRecord, RecordMetadata
from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for
from tests.system.checks import read_everywhere

pytestmark = pytest.mark.system

WAIT_TIMEOUT_S = 60.0  # Elections and restarts take seconds; this bounds a stuck cluster.
ACKNOWLEDGED_BEFORE_KILL = 300
BATCH_RECORDS = 10
PARTITIONS = 2


def test_fsync_mode_keeps_every_acknowledged_record_through_kill_9_of_every_node(tmp_path: Path) -> None:
    """kill -9 of all three fsync-mode nodes mid-stream, then a restart: nothing acknowledged is lost."""
    node_args = ("--compaction-min-entries", "20")
    with LocalCluster(tmp_path / "cluster", node_args=node_args, durability="fsync") as cluster:
        with KqClient(cluster.bootstrap) as admin:
            admin.create_topic("durable", partitions=PARTITIONS)
        acknowledged: list[tuple[RecordMetadata, bytes]] = []
        stop = threading.Event()

        def produce() -> None:
            with KqClient(cluster.bootstrap, retry_timeout_s=WAIT_TIMEOUT_S) as client:
                sequence = 0
                while not stop.is_set():
                    values = [f"record-{sequence + i}".encode() for i in range(BATCH_RECORDS)]
                    batch = [
                        ProducerRecord(v, partition=(sequence + i) % PARTITIONS) for i, v in enumerate(values)
                    ]
                    try:
                        sent = client.send_batch("durable", batch)
                    except Exception:  # Every node is down: the outcome is unknown, not acknowledged.
                        return
                    acknowledged.extend(zip(sent, values, strict=True))
                    sequence += BATCH_RECORDS

        producer = threading.Thread(target=produce, name="producer")
        producer.start()
        try:
            wait_for(
                lambda: len(acknowledged) >= ACKNOWLEDGED_BEFORE_KILL, "acknowledged records", WAIT_TIMEOUT_S
            )
            stop.set()
            for node_id in cluster.nodes:
                cluster.kill_node(node_id)
            cluster.start()
        finally:
            stop.set()
            producer.join(WAIT_TIMEOUT_S)
        assert not producer.is_alive()
        with KqClient(cluster.bootstrap) as client:
            cluster.wait_applied(max(metadata.index for metadata, _ in acknowledged), list(cluster.nodes))
            held = read_everywhere(client, "durable", PARTITIONS, cluster.bootstrap)
    records = held[cluster.bootstrap[0]]
    stored = {(p, record.offset): record.value for p, partition in records.items() for record in partition}
    lost = [
        value
        for metadata, value in acknowledged
        if stored.get((metadata.partition, metadata.offset)) != value
    ]
    assert lost == [], f"{len(lost)} of {len(acknowledged)} acknowledged records lost"
    values = list(stored.values())
    assert len(values) == len(set(values)), "a record is stored twice"
