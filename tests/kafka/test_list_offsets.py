"""ListOffsets MAX_TIMESTAMP (-3, KIP-734): the record with the largest timestamp, found from the
store's timestamp index and one decoded batch; on the store alone, then from every node of a cluster."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka.admin import KafkaAdminClient, NewTopic
from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest
from kio.schema.list_offsets.v7.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i64

from kq.broker.kafka.fetch import MAX_TIMESTAMP, max_timestamp_offset
from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for
from kq.proto.records import NewRecord, encode_batch
from kq.storage import Store
from tests.kafka.wire import call
from tests.storage.test_timestamp_index import batch_at, with_header

TIMEOUT_S = 30.0
UNKNOWN_TOPIC_OR_PARTITION = 3


def _store_with(tmp_path: Path, *batches: bytes) -> tuple[Store, int]:
    store = Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)
    with store.write() as writer:
        topic_id = writer.create_topic("t", 1, 0).topic_id
        for batch in batches:
            writer.append(topic_id, 0, batch)
    return store, topic_id


def _answer(store: Store, topic_id: int) -> tuple[int, int]:
    with store.read() as reader:
        state = reader.partition(topic_id, 0)
        assert state is not None
        return max_timestamp_offset(reader, topic_id, 0, state.log_start_offset)


def test_empty_partition_answers_no_record(tmp_path: Path) -> None:
    """No batch: -1/-1, as Kafka answers for an empty log."""
    store, topic_id = _store_with(tmp_path)
    assert _answer(store, topic_id) == (-1, -1)


def test_first_record_with_the_largest_timestamp(tmp_path: Path) -> None:
    """Inside the winning batch, the first record carrying its maxTimestamp; an equal later batch loses."""
    store, topic_id = _store_with(tmp_path, batch_at(10, 20), batch_at(15, 30, 30, 5), batch_at(30))
    assert _answer(store, topic_id) == (30, 3)


def test_header_no_record_carries_answers_the_batch_last_offset(tmp_path: Path) -> None:
    """A client's header maxTimestamp that no record has: that timestamp, at the batch's last offset."""
    store, topic_id = _store_with(tmp_path, batch_at(10), batch_at(20, 21, header_ms=40))
    assert _answer(store, topic_id) == (40, 2)


def test_log_append_time_batch_answers_its_first_record(tmp_path: Path) -> None:
    """Every record of a LogAppendTime batch reads as its maxTimestamp: the first one is the answer."""
    appended = with_header(encode_batch([NewRecord(None, b"v", (), 5) for _ in range(3)]), 90, True)
    store, topic_id = _store_with(tmp_path, batch_at(50), appended)
    assert _answer(store, topic_id) == (90, 1)


def test_records_trimmed_away_are_not_answered(tmp_path: Path) -> None:
    """A batch straddling the log start still counts (whole, as a Kafka segment does), but an offset
    below the start is never answered: its last offset is."""
    store, topic_id = _store_with(tmp_path, batch_at(10, 30, 20), batch_at(25))
    with store.write() as writer:
        writer.trim(topic_id, 0, 2, 10)
    assert _answer(store, topic_id) == (30, 2)
    with store.write() as writer:
        writer.trim(topic_id, 0, 3, 10)
    assert _answer(store, topic_id) == (25, 3)


def _list_max_timestamp(
    address: str, topic: str, partitions: int, timestamp: int = MAX_TIMESTAMP
) -> list[tuple[int, int, int]]:
    """(error code, timestamp, offset) per partition from one node's ListOffsets v7 (timestamp -3 unless
    another is given)."""
    request = ListOffsetsRequest(
        replica_id=BrokerId(-1),
        isolation_level=i8(0),
        topics=(
            ListOffsetsTopic(
                name=TopicName(topic),
                partitions=tuple(
                    ListOffsetsPartition(
                        partition_index=i32(index), current_leader_epoch=i32(-1), timestamp=i64(timestamp)
                    )
                    for index in range(partitions)
                ),
            ),
        ),
    )
    response: Any = call(address, request)
    (answer,) = response.topics
    return [(p.error_code, p.timestamp, p.offset) for p in answer.partitions]


@pytest.mark.system
def test_every_node_answers_max_timestamp_to_a_kafka_request(kafka_cluster: LocalCluster) -> None:
    """librdkafka writes records with chosen timestamps; ListOffsets v7 asking -3 answers the first
    record with the largest one on every node (each reads its own store), -1/-1 on an empty partition."""
    kafka_cluster.wait_ready()
    topic = f"ts-{uuid.uuid4().hex[:10]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_cluster.kafka_bootstrap, client_id="kq-test")
    try:
        admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    finally:
        admin.close()
    producer = Producer({"bootstrap.servers": kafka_cluster.kafka_bootstrap, "linger.ms": 5})
    for timestamp_ms in (1_000, 3_000, 2_000, 3_000, 2_500):
        producer.produce(topic, b"v", partition=0, timestamp=timestamp_ms)
        if timestamp_ms == 2_000:
            assert producer.flush(TIMEOUT_S) == 0  # The second 3,000 goes in a later batch.
    assert producer.flush(TIMEOUT_S) == 0
    expected = [(0, 3_000, 1), (0, -1, -1)]
    for spec in kafka_cluster.nodes.values():
        address = spec.kafka_address
        wait_for(
            lambda: _list_max_timestamp(address, topic, 2) == expected,  # noqa: B023 (called at once)
            f"node {spec.node_id} to answer {expected}",
            TIMEOUT_S,
        )
    unknown = _list_max_timestamp(kafka_cluster.nodes["1"].kafka_address, f"{topic}-none", 1)
    assert unknown == [(UNKNOWN_TOPIC_OR_PARTITION, -1, -1)]
    # By timestamp: the first record at or after it, with that record's own timestamp (not the one
    # asked for), and -1/-1 when no record is that late (kafka-python's own suite found both wrong).
    address = kafka_cluster.nodes["1"].kafka_address
    assert _list_max_timestamp(address, topic, 1, 1_500) == [(0, 3_000, 1)]
    assert _list_max_timestamp(address, topic, 1, 2_001) == [(0, 3_000, 1)]
    assert _list_max_timestamp(address, topic, 1, 3_001) == [(0, -1, -1)]


def test_a_transaction_coordinator_is_the_metadata_group_s_leader(kafka_cluster: LocalCluster) -> None:
    """FindCoordinator for a transactional id names the broker of group 0's leader (the transaction
    coordinator) from any node; an unknown key type is INVALID_REQUEST."""
    leader = kafka_cluster.wait_ready()
    for node in kafka_cluster.nodes.values():
        response: Any = call(node.kafka_address, FindCoordinatorRequest(key="tx", key_type=i8(1)))
        assert response.error_code == 0
        assert str(response.node_id) == leader
    response = call(kafka_cluster.nodes["1"].kafka_address, FindCoordinatorRequest(key="tx", key_type=i8(7)))
    assert response.error_code == 42
