"""Disk bounds on real nodes: a leader near its --max-disk-bytes refuses writes (gRPC, kq's client,
Kafka's wire and librdkafka) while reads, deletions and the rest go on; a follower whose store fills
stops with one line, the majority writes on, and restarted with room it catches up byte for byte.

The bound is the smallest a node takes (64 MiB, whose headroom is 16 MiB), so a few dozen 1 MiB
requests reach it.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import grpc
import pytest
from confluent_kafka import KafkaError, Producer
from kio.schema.produce.v8.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.types import TopicName
from kio.static.primitive import Records, i16, i32, i32Timedelta

from kq.chaos.disk_full import EXIT_ENVIRONMENT_FAULT, fail_stop_problem
from kq.client import KqClient, ProducerRecord, UnavailableError
from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for
from kq.proto import kq_pb2, kq_pb2_grpc
from kq.proto.errors import ErrorCode, code_from_metadata
from kq.proto.limits import GRPC_MESSAGE_BYTES_MAX
from kq.proto.records import NewRecord, encode_batch
from kq.storage import Store
from tests.kafka.wire import call

pytestmark = pytest.mark.system

BOUND = "64MiB"
RECORD_BYTES = 256 * 1024
RECORDS_PER_REQUEST = 4  # 1 MiB a request.
REQUESTS_MAX = 200  # Far past the 48 MiB at which a 64 MiB bound refuses.
WAIT_S = 60.0
KAFKA_STORAGE_ERROR = 56
# What the nodes write (records, topics, offsets); groups and producer ids are left out, nothing else.
LOG_DATABASES = {
    b"topics",
    b"partitions",
    b"records",
    b"record_pieces",
    b"timestamps",
    b"topic_configs",
    b"meta",
}


def big_batch() -> bytes:
    """1 MiB of random records in one RecordBatch v2."""
    return encode_batch([NewRecord(None, os.urandom(RECORD_BYTES)) for _ in range(RECORDS_PER_REQUEST)])


def stub_to(address: str) -> tuple[grpc.Channel, kq_pb2_grpc.BrokerStub]:
    options = [("grpc.max_send_message_length", GRPC_MESSAGE_BYTES_MAX)]
    channel = grpc.insecure_channel(address, options=options)
    return channel, kq_pb2_grpc.BrokerStub(channel)


def fill_until_refused(client: KqClient, topic: str) -> UnavailableError:
    """Produces 1 MiB requests until the leader refuses one for room (an election meanwhile, under this
    much I/O, is retried); that refusal, as kq's client raises it after its retries."""
    for _ in range(REQUESTS_MAX):
        try:
            client.send_batch(
                topic, [ProducerRecord(os.urandom(RECORD_BYTES)) for _ in range(RECORDS_PER_REQUEST)]
            )
        except UnavailableError as error:
            if error.error_code == ErrorCode.STORAGE_FULL:
                return error
    pytest.fail(f"{REQUESTS_MAX} MiB accepted under a bound of {BOUND}")


def kafka_produce_code(address: str, topic: str) -> int:
    """The error code a raw Kafka Produce v8 of one batch to partition 0 is answered with."""
    request = ProduceRequest(
        acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
        topic_data=(
            TopicProduceData(
                name=TopicName(topic),
                partition_data=(PartitionProduceData(index=i32(0), records=Records(big_batch())),),
            ),
        ),
    )
    response = call(address, request)
    return int(response.responses[0].partition_responses[0].error_code)


def test_a_leader_near_its_bound_refuses_writes_and_takes_them_again_after_a_deletion(tmp_path: Path) -> None:
    """Every node at 64 MiB: Produce is refused with RESOURCE_EXHAUSTED and STORAGE_FULL before any
    node fills (none stops), so is CreateTopic; kq's client raises StorageFullError, a raw Kafka Produce
    gets KAFKA_STORAGE_ERROR (56), and librdkafka reports it; reads still work on every node; deleting
    the topic that filled the store (a write that frees space) is accepted, and then writes are too."""
    with LocalCluster(tmp_path / "cluster", node_args=["--max-disk-bytes", BOUND]) as cluster:
        cluster.wait_ready()
        with KqClient(cluster.bootstrap, retry_timeout_s=2.0) as client:
            client.create_topic("fill", 1)
            client.create_topic("kept", 1)
            client.send("kept", b"before")
            fill_until_refused(client, "fill")
            with pytest.raises(UnavailableError) as unsent:
                client.send("kept", b"refused")
            assert unsent.value.error_code == ErrorCode.STORAGE_FULL
            for node in cluster.bootstrap:  # Reads go on, on every node.
                assert [r.value for r in client.fetch("kept", 0, 0, node=node).records] == [b"before"]
        leader = cluster.wait_ready()
        channel, stub = stub_to(cluster.nodes[leader].grpc_address)
        with channel:
            for rpc, request in (
                ("Produce", kq_pb2.ProduceRequest(topic="kept", partition=0, records=big_batch())),
                ("CreateTopic", kq_pb2.CreateTopicRequest(name="more", partitions=1)),
            ):
                with pytest.raises(grpc.RpcError) as caught:
                    getattr(stub, rpc)(request, timeout=WAIT_S)
                assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value
                assert code_from_metadata(caught.value.trailing_metadata()) == ErrorCode.STORAGE_FULL
                details = caught.value.details() or ""
                assert "--max-disk-bytes" in details and "\n" not in details
        kafka_address = cluster.nodes[leader].kafka_address
        assert kafka_produce_code(kafka_address, "kept") == KAFKA_STORAGE_ERROR
        producer = Producer(
            {"bootstrap.servers": cluster.kafka_bootstrap, "retries": 0, "acks": "all", "linger.ms": 0}
        )
        reports: list[KafkaError | None] = []
        # A leader elected since the fill (an election under this much I/O) has not refused yet, so it
        # keeps no resume margin and takes a small write while room is left above its headroom: each
        # accepted write takes some of that room, and the next is refused (REQUESTS_MAX bounds it).
        for _ in range(REQUESTS_MAX):
            value = os.urandom(RECORD_BYTES)
            producer.produce("kept", value, partition=0, on_delivery=lambda error, _: reports.append(error))
            assert producer.flush(WAIT_S) == 0
            if reports[-1] is not None:
                break
        error = reports[-1]
        assert error is not None and error.code() == KafkaError.KAFKA_STORAGE_ERROR, reports

        with KqClient(cluster.bootstrap) as client:
            client.delete_topic("fill")
            assert client.send("kept", b"after").offset == 1  # STORAGE_FULL is retried until it passes.
        assert all(cluster.running(node) for node in cluster.nodes), "a node stopped"


def test_a_follower_whose_store_fills_stops_with_one_line_and_catches_up_byte_identical(
    tmp_path: Path,
) -> None:
    """One follower restarted with a 64 MiB bound (the others have none): filled past it, it exits 70
    with one line saying its store is full, and nothing else; the others go on acknowledging; restarted
    without the bound it catches up, and the three stores then hold the same bytes."""
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        leader = cluster.start()
        follower = next(node for node in cluster.nodes if node != leader)
        cluster.stop_node(follower)
        cluster.set_node_args(follower, ["--max-disk-bytes", BOUND])
        cluster.start_node(follower)
        cluster.wait_ready()
        log_offset = cluster.log_path(follower).stat().st_size
        with KqClient(cluster.bootstrap) as client:
            client.create_topic("fill", 1)
            for _ in range(REQUESTS_MAX):
                client.send_batch("fill", [ProducerRecord(os.urandom(RECORD_BYTES)) for _ in range(4)])
                if not cluster.running(follower):
                    break
            wait_for(lambda: not cluster.running(follower), f"follower {follower} to stop", WAIT_S)
            log_text = cluster.log_path(follower).read_bytes()[log_offset:].decode(errors="replace")
            assert cluster.exit_code(follower) == EXIT_ENVIRONMENT_FAULT
            assert fail_stop_problem(log_text, cluster.exit_code(follower)) is None, log_text[-2000:]
            assert "the store is full" in log_text and "--max-disk-bytes" in log_text
            cluster.kill_node(follower)  # It ended by itself: the harness forgets it.
            after = client.send("fill", b"without the follower")  # The majority acknowledges.
            cluster.set_node_args(follower, [])
            cluster.start_node(follower)
            cluster.wait_ready()
            cluster.wait_applied(after.index, list(cluster.nodes))
            applied = max(
                status.applied_index for status in cluster.statuses().values() if status is not None
            )
            cluster.wait_applied(applied, list(cluster.nodes))  # Every node at the same index when stopped.
    finally:
        cluster.stop()
    dumps = []
    for spec in cluster.nodes.values():
        store = Store.open(spec.data_dir / "store")
        dumps.append([row for row in store.dump() if row[0] in LOG_DATABASES])
        store.close()
    assert dumps[0] and dumps[0] == dumps[1] == dumps[2], "the nodes' stores differ"
