"""Follower fetching (KIP-392): racks in the configuration and in Metadata, the leader's choice of a
preferred read replica, a follower serving and waiting rather than refusing, and librdkafka with
client.rack reading every record from the follower of its rack (real nodes, racks a, b and c)."""

from __future__ import annotations

import datetime
import re
import signal
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.list_offsets.v7.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i32Timedelta, i64

from kq.broker.config import ConfigError, parse_peers
from kq.broker.kafka.base import KafkaBrokerInfo
from kq.broker.kafka.fetch import LATEST, NO_PREFERRED_REPLICA, _read_partition, preferred_read_replica
from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for
from kq.proto.records import NewRecord, encode_batch, parse_batch, read_header, split_batches
from kq.storage import Store
from tests.kafka.wire import call, decode_response, read_frame, request_frame

TIMEOUT_S = 30.0
RACKS = ("a", "b", "c")
RECORDS = 60
OFFSET_OUT_OF_RANGE = 1
PAUSED_RECORDS = 300  # Written while a follower is paused: it applies them after it reads a fetch.


def _brokers(*racks: str | None) -> tuple[KafkaBrokerInfo, ...]:
    return tuple(
        KafkaBrokerInfo(i + 1, str(i + 1), "127.0.0.1", 9092 + i, f"127.0.0.1:{9100 + i}", rack)
        for i, rack in enumerate(racks)
    )


def test_selection_follows_kafkas_rack_aware_selector() -> None:
    """No client rack, an unknown rack, or the leader's own rack: served by the leader; else the most
    caught-up live node of that rack (the lowest id among equals), and none that is not caught up."""
    brokers = _brokers("a", "b", "c", "b")
    caught_up = {2: 40, 3: 40, 4: 40}
    assert preferred_read_replica("", 1, brokers, caught_up) == NO_PREFERRED_REPLICA
    assert preferred_read_replica("z", 1, brokers, caught_up) == NO_PREFERRED_REPLICA
    assert preferred_read_replica("a", 1, brokers, caught_up) == NO_PREFERRED_REPLICA
    assert preferred_read_replica("c", 1, brokers, caught_up) == 3
    assert preferred_read_replica("b", 1, brokers, caught_up) == 2
    assert preferred_read_replica("b", 1, brokers, {2: 39, 4: 40}) == 4
    assert preferred_read_replica("c", 1, brokers, {2: 40}) == NO_PREFERRED_REPLICA
    assert preferred_read_replica("b", 2, brokers, caught_up) == NO_PREFERRED_REPLICA  # Its own rack.
    assert preferred_read_replica("a", 2, _brokers(None, None, None), caught_up) == NO_PREFERRED_REPLICA


def test_peers_take_an_optional_rack_suffix() -> None:
    """`id=raft=grpc[=kafka][@rack]`: specs without a rack parse as before; bad racks are refused, and
    so is a rack for this node that its --rack contradicts."""
    peers = parse_peers("1=h:1=h:2=h:3@a,2=h:4=h:5@b-2,3=h:6=h:7=h:8", "1", "a")
    found = [(peer.node_id, peer.kafka_address, peer.rack) for peer in peers]
    assert found == [("2", "", "b-2"), ("3", "h:8", "")]
    for bad in ("2=h:4=h:5@", "2=h:4=h:5@b c", "2=h:4=h:5@" + "r" * 65, "2=h:4=h:5@a@b"):
        with pytest.raises(ConfigError):
            parse_peers(bad, "1")
    with pytest.raises(ConfigError, match="--rack"):
        parse_peers("1=h:1=h:2@a", "1", "b")


def test_a_lagging_follower_answers_empty_for_an_offset_the_leader_has(tmp_path: Path) -> None:
    """Past this node's log end: out of range, unless the leader's log end covers the offset, which
    then answers empty without an error (the follower has yet to apply it; the fetch waits for it)."""
    store = Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)
    with store.write() as writer:
        writer.create_topic("t", 1, 0)
        writer.append(1, 0, encode_batch([NewRecord(None, b"v", (), 5)] * 2))
    with store.read() as reader:
        assert _read_partition(reader, "t", 0, 3, 1 << 20, True).error_code == OFFSET_OUT_OF_RANGE
        lagging = _read_partition(reader, "t", 0, 3, 1 << 20, True, leader_end=3)
        assert (lagging.error_code, lagging.records, lagging.high_watermark) == (0, b"", 2)
        beyond = _read_partition(reader, "t", 0, 4, 1 << 20, True, leader_end=3)
        assert beyond.error_code == OFFSET_OUT_OF_RANGE
        served = _read_partition(reader, "t", 0, 0, 1 << 20, True, leader_end=3)
        assert (served.error_code, served.record_count) == (0, 2)


@pytest.fixture
def racked(tmp_path: Path) -> Iterator[LocalCluster]:
    """Three nodes in racks a, b and c, stopped by PID at the end (which logs their fetch totals)."""
    with LocalCluster(tmp_path / "cluster", racks=RACKS) as cluster:
        yield cluster


def _topic(cluster: LocalCluster) -> str:
    name = f"ff-{uuid.uuid4().hex[:10]}"
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap, client_id="kq-test")
    try:
        admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])
    finally:
        admin.close()
    return name


def _produce(bootstrap: str, topic: str, count: int, tag: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, f"{tag}-{i}".encode(), partition=0)
    assert producer.flush(TIMEOUT_S) == 0


def _fetch(
    address: str, topic: str, offset: int, rack: str = "", wait_ms: int = 0
) -> tuple[int, int, list[int]]:
    """(error code, preferred read replica, offsets of the records at or after `offset`) from one
    node's Fetch v12 for partition 0."""
    return _fetched(call(address, _fetch_request(topic, offset, rack, wait_ms), timeout_s=TIMEOUT_S), offset)


def _fetch_request(topic: str, offset: int, rack: str = "", wait_ms: int = 0) -> FetchRequest:
    return FetchRequest(
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=wait_ms)),
        min_bytes=i32(1),
        topics=(
            FetchTopic(
                topic=TopicName(topic),
                partitions=(
                    FetchPartition(
                        partition=i32(0), fetch_offset=i64(offset), partition_max_bytes=i32(1 << 20)
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id=rack,
    )


def _fetched(response: Any, offset: int) -> tuple[int, int, list[int]]:
    (partition,) = response.responses[0].partitions
    offsets = []
    for batch in split_batches(partition.records or b""):
        base_offset = read_header(batch).base_offset
        offsets += [base_offset + record.offset_delta for record in parse_batch(batch)]
    return partition.error_code, partition.preferred_read_replica, [o for o in offsets if o >= offset]


def _log_end(address: str, topic: str) -> int:
    """A node's log end for partition 0 (ListOffsets LATEST: no record is fetched, so the fetch totals
    count only what the tests fetch)."""
    request = ListOffsetsRequest(
        replica_id=BrokerId(-1),
        isolation_level=i8(0),
        topics=(
            ListOffsetsTopic(
                name=TopicName(topic),
                partitions=(ListOffsetsPartition(partition_index=i32(0), timestamp=i64(LATEST)),),
            ),
        ),
    )
    response: Any = call(address, request)
    (partition,) = response.topics[0].partitions
    assert partition.error_code == 0
    return int(partition.offset)


def _fetch_totals(cluster: LocalCluster, node_id: str) -> dict[str, int]:
    """The fetch totals the node logged when it stopped."""
    found = re.findall(
        rf"node {node_id} served (\d+) Kafka fetches: (\d+) records \(\d+ bytes\); (\d+) answered with a "
        r"preferred read replica; (\d+) past",
        cluster.log_path(node_id).read_text(),
    )
    assert found, f"node {node_id} logged no fetch totals"
    fetches, records, redirected, lagging = (int(value) for value in found[-1])
    return {"fetches": fetches, "records": records, "redirected": redirected, "lagging": lagging}


@pytest.mark.system
def test_a_consumer_with_client_rack_reads_everything_from_its_follower(racked: LocalCluster) -> None:
    """Metadata lists each node's rack; the leader answers a fetch from another node's rack with that
    node as preferred read replica, and librdkafka with that client.rack then reads every record from
    it: the follower's logged totals show it served them, the leader's that it served none of them."""
    leader = racked.wait_ready()
    follower = next(node_id for node_id in racked.nodes if node_id != leader)
    rack = RACKS[int(follower) - 1]
    topic = _topic(racked)
    metadata = call(
        racked.nodes[follower].kafka_address,
        MetadataRequest(
            topics=(MetadataRequestTopic(topic_id=None, name=TopicName(topic)),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        ),
    )
    assert {(b.node_id, b.rack) for b in metadata.brokers} == {(1, "a"), (2, "b"), (3, "c")}
    _produce(racked.kafka_bootstrap, topic, RECORDS, "r")
    for spec in racked.nodes.values():
        wait_for(lambda: _log_end(spec.kafka_address, topic) == RECORDS, f"node {spec.node_id}", TIMEOUT_S)  # noqa: B023
    leader_address = racked.nodes[leader].kafka_address
    wait_for(
        lambda: _fetch(leader_address, topic, 0, rack) == (0, int(follower), []),
        f"the leader to prefer node {follower} for rack {rack}",
        TIMEOUT_S,
    )
    own_rack = RACKS[int(leader) - 1]
    assert _fetch(leader_address, topic, 0, own_rack) == (0, -1, list(range(RECORDS)))  # Served there.
    consumer = Consumer(
        {
            "bootstrap.servers": racked.kafka_bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "client.rack": rack,
        }
    )
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline_polls = int(TIMEOUT_S)
        while len(values) < RECORDS and deadline_polls:
            message = consumer.poll(1.0)
            deadline_polls -= message is None
            if message is not None:
                assert message.error() is None, message.error()
                values.append(message.value())  # type: ignore[arg-type]
    finally:
        consumer.close()
    assert values == [f"r-{i}".encode() for i in range(RECORDS)]
    racked.stop()
    on_leader = _fetch_totals(racked, leader)
    on_follower = _fetch_totals(racked, follower)
    assert on_leader["records"] == RECORDS  # Only the own-rack fetch above: the consumer got none here.
    assert on_leader["redirected"] >= 2  # The wire fetch and the consumer's first fetch.
    assert on_follower["records"] >= RECORDS  # All of them (a batch fetched twice would count twice).
    other = next(node_id for node_id in racked.nodes if node_id not in (leader, follower))
    assert _fetch_totals(racked, other)["records"] == 0


@pytest.mark.system
def test_a_follower_serves_fetches_and_waits_for_what_the_leader_has(racked: LocalCluster) -> None:
    """A Kafka Fetch sent to a follower is served there (not NOT_LEADER_OR_FOLLOWER); an offset the
    leader has but the follower has not applied yet is waited for and served, never refused; an
    offset past every node's log end is OFFSET_OUT_OF_RANGE."""
    leader = racked.wait_ready()
    follower = next(node_id for node_id in racked.nodes if node_id != leader)
    address = racked.nodes[follower].kafka_address
    topic = _topic(racked)
    _produce(racked.kafka_bootstrap, topic, 3, "first")
    wait_for(lambda: _log_end(address, topic) == 3, "the follower to apply", TIMEOUT_S)
    assert _fetch(address, topic, 0, "z") == (0, -1, [0, 1, 2])
    end = 3
    for round_number in range(5):
        _produce(racked.kafka_bootstrap, topic, 2, f"round{round_number}")  # Answered once committed.
        error_code, preferred, offsets = _fetch(address, topic, end + 1, wait_ms=10_000)  # At once.
        assert (error_code, preferred) == (0, -1)
        assert offsets[:1] == [end + 1]
        end += 2
    assert _fetch(address, topic, end + 1)[0] == OFFSET_OUT_OF_RANGE


@pytest.mark.system
def test_a_paused_follower_waits_for_records_it_has_not_applied(tmp_path: Path) -> None:
    """A follower paused while 300 records commit gets a Fetch for the last one as it resumes: past
    its own log end, it asks the leader, waits for the records to be applied and serves them (before,
    it answered OFFSET_OUT_OF_RANGE). Elections wait 1.2-1.5 s (the most PySyncObj's 1.5 s connection
    timeout allows), so the pause (one produce) elects no one."""
    node_args = ("--election-timeout-min-ms", "1200", "--election-timeout-max-ms", "1500")
    with LocalCluster(tmp_path / "cluster", racks=RACKS, node_args=node_args) as cluster:
        leader = cluster.wait_ready()
        follower = next(node_id for node_id in cluster.nodes if node_id != leader)
        address = cluster.nodes[follower].kafka_address
        leader_bootstrap = cluster.nodes[leader].kafka_address
        topic = _topic(cluster)
        _produce(leader_bootstrap, topic, 3, "first")
        wait_for(lambda: _log_end(address, topic) == 3, "the follower to apply", TIMEOUT_S)
        host, _, port = address.rpartition(":")
        cluster.signal_node(follower, signal.SIGSTOP)
        try:
            _produce(leader_bootstrap, topic, PAUSED_RECORDS, "p" * 2000)  # Committed by the other two.
            with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
                request = _fetch_request(topic, 2 + PAUSED_RECORDS, wait_ms=10_000)  # The last one.
                sock.sendall(request_frame(request))  # Into the paused node's socket buffer.
                cluster.signal_node(follower, signal.SIGCONT)
                _, response = decode_response(read_frame(sock), 1, 12)
        finally:
            cluster.signal_node(follower, signal.SIGCONT)
        error_code, preferred, offsets = _fetched(response, 2 + PAUSED_RECORDS)
        assert (error_code, preferred, offsets[:1]) == (0, -1, [2 + PAUSED_RECORDS])
        cluster.stop()
    _fetch_totals(cluster, follower)  # Logged; whether the wait was needed depends on the threads' race.
