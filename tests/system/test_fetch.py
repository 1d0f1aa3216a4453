"""Batch-format fetch and the pushed stream on real nodes: offsets inside batches, new records pushed."""

from __future__ import annotations

import threading
import time

import pytest

from kq.client import ConsumerRecord, KqClient, ProducerRecord
from kq.deploy.cluster import LocalCluster

pytestmark = pytest.mark.system


def test_fetch_from_inside_a_batch_returns_exactly_the_asked_records(cluster: LocalCluster) -> None:
    """A fetch starting mid-batch skips the batch's earlier records and stops at max_records."""
    with KqClient(cluster.bootstrap) as client:
        client.create_topic("inside", partitions=1)
        sent_ms = time.time_ns() // 1_000_000
        client.send_batch("inside", [ProducerRecord(f"{i}".encode(), key=b"k") for i in range(10)])
        client.send_batch("inside", [ProducerRecord(f"{i}".encode()) for i in range(10, 20)])
        for node in cluster.bootstrap:
            result = client.fetch("inside", 0, 7, max_records=5, node=node, wait_ms=5_000)
            assert [(r.offset, r.value) for r in result.records] == [
                (o, f"{o}".encode()) for o in range(7, 12)
            ]
            assert result.records[0].key == b"k" and result.records[-1].key is None
            # CreateTime: the client stamps a record sent without a timestamp, as Kafka clients do.
            assert result.records[0].timestamp_type == 0 and result.records[0].timestamp_ms >= sent_ms
            # The node serves the first batch whole (it holds 3 records from offset 7, at least 2):
            # cut at max_records, or all of it with whole_batches, whose next fetch starts at 10.
            cut = client.fetch("inside", 0, 7, max_records=2, node=node)
            whole = client.fetch("inside", 0, 7, max_records=2, node=node, whole_batches=True)
            assert ([r.offset for r in cut.records], cut.next_offset) == ([7, 8], 9)
            assert ([r.offset for r in whole.records], whole.next_offset) == ([7, 8, 9], 10)


def test_stream_pushes_records_produced_after_it_started(cluster: LocalCluster) -> None:
    """A FetchStream reader receives records as they are produced, in order, without polling."""
    received: list[ConsumerRecord] = []
    with KqClient(cluster.bootstrap) as client:
        client.create_topic("pushed", partitions=1)
        client.send_batch("pushed", [ProducerRecord(b"old")])
        follower = next(n.grpc_address for i, n in cluster.nodes.items() if i != cluster.wait_ready())

        def read() -> None:
            with KqClient(cluster.bootstrap) as reader:
                for record in reader.stream("pushed", 0, 1, node=follower):
                    received.append(record)
                    if len(received) == 30:
                        return

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        for i in range(3):
            client.send_batch("pushed", [ProducerRecord(f"{i}-{j}".encode()) for j in range(10)])
            time.sleep(0.1)
        thread.join(timeout=30)
    assert [r.offset for r in received] == list(range(1, 31))
    assert received[0].value == b"0-0" and received[-1].value == b"2-9"
