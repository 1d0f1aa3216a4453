"""Three real nodes: writes through any node, identical reads from every node, failover, snapshot catch-up."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from kq.client import KqClient, ProducerRecord, RecordMetadata
from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for
from tests.system.checks import read_everywhere

pytestmark = pytest.mark.system

RECORDS = 10_000
BATCH_RECORDS = 500
WAIT_TIMEOUT_S = 60.0  # Elections and compaction take seconds; this bounds a stuck cluster.


def test_produce_through_a_follower_and_read_identical_records_from_every_node(cluster: LocalCluster) -> None:
    """A topic created via a follower takes 10,000 records; all three nodes return them identically."""
    leader = cluster.wait_ready()
    follower = next(node for node in cluster.nodes if node != leader)
    with KqClient([cluster.nodes[follower].grpc_address]) as client:  # Only a follower: must be redirected.
        client.create_topic("events", partitions=3)
        sent: list[RecordMetadata] = []
        for start in range(0, RECORDS, BATCH_RECORDS):
            batch = [
                ProducerRecord(
                    f"value-{i}".encode(), key=f"key-{i % 97}".encode(), headers=(("n", str(i).encode()),)
                )
                for i in range(start, start + BATCH_RECORDS)
            ]
            sent += client.send_batch("events", batch)
    assert len(sent) == RECORDS
    with KqClient(cluster.bootstrap) as client:
        cluster.wait_applied(max(m.index for m in sent), list(cluster.nodes))
        held = read_everywhere(client, "events", 3, cluster.bootstrap)
    records = [record for partition in held[cluster.bootstrap[0]].values() for record in partition]
    assert sorted(record.value or b"" for record in records) == sorted(
        f"value-{i}".encode() for i in range(RECORDS)
    )
    by_value = {record.value: record for record in records}
    for metadata, i in zip(sent, range(RECORDS), strict=True):
        record = by_value[f"value-{i}".encode()]
        assert (record.partition, record.offset) == (metadata.partition, metadata.offset)
        assert record.key == f"key-{i % 97}".encode() and record.headers == (("n", str(i).encode()),)


def test_leader_kill_under_load_loses_and_duplicates_nothing(cluster: LocalCluster) -> None:
    """kill -9 of the leader mid-stream: the producer carries on; every acknowledged record is there once."""
    with KqClient(cluster.bootstrap) as admin:
        admin.create_topic("stream", partitions=2)
    acknowledged: list[RecordMetadata] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def produce() -> None:
        with KqClient(cluster.bootstrap) as client:
            sequence = 0
            while not stop.is_set() and sequence < 20_000:
                batch = [
                    ProducerRecord(f"{sequence + i}".encode(), partition=(sequence + i) % 2)
                    for i in range(10)
                ]
                try:
                    acknowledged.extend(client.send_batch("stream", batch))
                except Exception as error:  # The client must ride out the failover by itself.
                    failures.append(error)
                    return
                sequence += 10

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        wait_for(lambda: len(acknowledged) >= 500, "records acknowledged before the kill", WAIT_TIMEOUT_S)
        old_leader = cluster.wait_ready()
        cluster.kill_node(old_leader)
        killed_at = len(acknowledged)
        after_kill = killed_at + 1_000
        wait_for(
            lambda: len(acknowledged) >= after_kill or bool(failures), "writes after the kill", WAIT_TIMEOUT_S
        )
        new_leader = cluster.leader_id()
        assert new_leader is not None and new_leader != old_leader
    finally:
        stop.set()
        producer.join(timeout=60)
    assert not failures, failures
    cluster.start_node(old_leader)
    cluster.wait_ready()
    with KqClient(cluster.bootstrap) as client:
        cluster.wait_applied(max(m.index for m in acknowledged), list(cluster.nodes))
        held = read_everywhere(client, "stream", 2, cluster.bootstrap)
    for partition in (0, 1):
        values = [int(record.value or b"") for record in held[cluster.bootstrap[0]][partition]]
        assert len(values) == len(set(values)), f"duplicate record in partition {partition}"
        assert values == sorted(values), f"partition {partition} is out of send order"
        acked = {int(m.offset): m for m in acknowledged if m.partition == partition}
        offsets = {
            record.offset: int(record.value or b"") for record in held[cluster.bootstrap[0]][partition]
        }
        assert set(acked) <= set(offsets), "an acknowledged offset is missing"


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "mutual-tls"])
def test_wiped_follower_catches_up_from_a_snapshot(tmp_path: Path, tls: bool) -> None:
    """A follower wiped while the leader compacted its log comes back through a snapshot, identical;
    with TLS the store copy crosses the Raft transport's mutual TLS (raft/transport.py)."""
    cluster = LocalCluster(
        tmp_path / "cluster",
        node_args=("--compaction-min-entries", "50"),
        tls_dir=tmp_path / "certs" if tls else None,
    )
    try:
        cluster.start()
        leader = cluster.wait_ready()
        follower = next(node for node in cluster.nodes if node != leader)
        cluster.stop_node(follower)
        with KqClient(cluster.bootstrap, tls=cluster.tls) as client:
            client.create_topic("compacted", partitions=2)
            sent = [client.send("compacted", f"v{i}".encode(), partition=i % 2) for i in range(300)]
            leader_address = cluster.nodes[leader].grpc_address
            wait_for(
                lambda: client.node_status(leader_address).raft_log_entries < 200, "leader log compaction"
            , WAIT_TIMEOUT_S)
        shutil.rmtree(cluster.nodes[follower].data_dir)
        cluster.start_node(follower)
        cluster.wait_applied(sent[-1].index, list(cluster.nodes), timeout_s=60)
        with KqClient(cluster.bootstrap, tls=cluster.tls) as client:
            held = read_everywhere(client, "compacted", 2, cluster.bootstrap)
        assert sum(len(records) for records in held[cluster.nodes[follower].grpc_address].values()) == 300
        log = (cluster.base_dir / f"node{follower}.log").read_text()
        assert "store restored from snapshot" in log, "the follower must have caught up through a snapshot"
    finally:
        cluster.stop()

