"""Kafka's admin APIs on real nodes, with real clients (confluent-kafka's AdminClient, kafka-python's
KafkaAdminClient) and kq's wire client for what the clients cannot send: the error codes Kafka answers
for an oversized batch, DeleteGroups, OffsetDelete, DeleteRecords, CreatePartitions, DescribeLogDirs,
DescribeTopicPartitions and ElectLeaders.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, ElectionType, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions
from kafka import errors as kafka_errors
from kafka.admin import KafkaAdminClient
from kafka.admin import NewPartitions as KafkaNewPartitions
from kafka.structs import TopicPartition as KafkaTopicPartition

from kq.broker.kafka.build import build, request_module
from kq.client import KqClient, ProducerRecord
from kq.deploy.cluster import LocalCluster
from kq.proto.limits import APPEND_BYTES_MAX, RECORD_BYTES_MAX, RECORDS_PER_APPEND_MAX
from kq.proto.records import NewRecord, encode_batch
from tests.kafka.wire import call

pytestmark = pytest.mark.system

TIMEOUT_S = 30.0


def admin(cluster: LocalCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})


def wait_for(condition: Callable[[], Any], timeout_s: float = TIMEOUT_S) -> Any:
    """`condition()` once it is truthy; fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def leader_address(cluster: LocalCluster, topic: str, partition: int = 0) -> str:
    """The Kafka address of the broker Metadata names as the partition's leader."""
    metadata = admin(cluster).list_topics(topic, timeout=TIMEOUT_S)
    leader = metadata.topics[topic].partitions[partition].leader
    return cluster.nodes[str(leader)].kafka_address


def produce_raw(address: str, topic: str, records: bytes) -> Any:
    """A Produce v9 of one partition's records, sent as is; the partition's response."""
    request = request_module(0, 9)
    body = build(
        request.ProduceRequest,
        transactional_id=None,
        acks=-1,
        timeout=10_000,
        topic_data=(
            build(
                request.TopicProduceData,
                name=topic,
                partition_data=(build(request.PartitionProduceData, index=0, records=records),),
            ),
        ),
    )
    return call(address, body).responses[0].partition_responses[0]


# Error codes as Kafka's -------------------------------------------------------------------------


def test_a_batch_over_the_default_max_message_bytes_is_message_too_large(kafka_cluster: LocalCluster) -> None:
    """A batch over the default max.message.bytes (no override) is MESSAGE_TOO_LARGE for a Kafka
    producer, as an override's limit is; nothing is stored."""
    with KqClient(kafka_cluster.bootstrap) as kq:
        kq.create_topic("big-default", partitions=1)
    producer = Producer(
        {
            "bootstrap.servers": kafka_cluster.kafka_bootstrap,
            "message.max.bytes": 2 * APPEND_BYTES_MAX,
            "enable.idempotence": False,
        }
    )
    errors: list[KafkaError | None] = []
    value = b"x" * (APPEND_BYTES_MAX + 1024)
    producer.produce("big-default", value, partition=0, on_delivery=lambda e, _: errors.append(e))
    assert producer.flush(TIMEOUT_S) == 0
    assert errors[0] is not None and errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE


def test_a_record_over_the_record_size_limit_is_message_too_large(kafka_cluster: LocalCluster) -> None:
    """One record over RECORD_BYTES_MAX in a batch within max.message.bytes is MESSAGE_TOO_LARGE (a
    record too large, as Kafka names it), not INVALID_RECORD; a record of RECORD_BYTES_MAX is stored.
    (A keyless record to a compacted topic stays INVALID_RECORD: test_configs.py.)"""
    with KqClient(kafka_cluster.bootstrap) as kq:
        kq.create_topic("big-record", partitions=1)
    address = leader_address(kafka_cluster, "big-record")
    answer = produce_raw(
        address, "big-record", encode_batch([NewRecord(None, b"x" * (RECORD_BYTES_MAX + 1))])
    )
    assert answer.error_code == 10
    answer = produce_raw(address, "big-record", encode_batch([NewRecord(None, b"x" * RECORD_BYTES_MAX)]))
    assert answer.error_code == 0


def test_a_batch_over_the_broker_record_count_is_record_list_too_large(kafka_cluster: LocalCluster) -> None:
    """A batch within max.message.bytes but over RECORDS_PER_APPEND_MAX records (a broker limit, not
    the topic's) is RECORD_LIST_TOO_LARGE (18); one within it is stored."""
    with KqClient(kafka_cluster.bootstrap) as kq:
        kq.create_topic("many-records", partitions=1)
    address = leader_address(kafka_cluster, "many-records")
    records = [NewRecord(None, b"") for _ in range(RECORDS_PER_APPEND_MAX + 1)]
    answer = produce_raw(address, "many-records", encode_batch(records))
    assert answer.error_code == 18
    answer = produce_raw(address, "many-records", encode_batch(records[:-1]))
    assert answer.error_code == 0 and answer.base_offset == 0


def test_topic_requests_refuse_duplicates_and_assignments_as_kafka(kafka_cluster: LocalCluster) -> None:
    """CreateTopics and DeleteTopics answer INVALID_REQUEST for every entry of a name given twice (and
    create or delete nothing); a manual replica assignment is INVALID_REPLICA_ASSIGNMENT, and one
    given with a partition count INVALID_REQUEST."""
    address = kafka_cluster.kafka_bootstrap.split(",")[0]
    create = request_module(19, 5)

    def topic(name: str, partitions: int = 1, assignments: tuple[Any, ...] = ()) -> Any:
        return build(
            create.CreatableTopic,
            name=name,
            num_partitions=partitions,
            replication_factor=-1,
            assignments=assignments,
            configs=(),
        )

    assignment = (build(create.CreatableReplicaAssignment, partition_index=0, broker_ids=(1, 2, 3)),)
    body = build(
        create.CreateTopicsRequest,
        timeout=10_000,
        validate_only=False,
        topics=(
            topic("twice"),
            topic("twice"),
            topic("assigned", -1, assignment),
            topic("both", 1, assignment),
        ),
    )
    codes = [(result.name, result.error_code) for result in call(address, body).topics]
    assert codes == [("twice", 42), ("twice", 42), ("assigned", 39), ("both", 42)]
    with KqClient(kafka_cluster.bootstrap) as kq:
        assert not {"twice", "assigned", "both"} & {info.name for info in kq.list_topics()}
        kq.create_topic("deleted-twice", partitions=1)
    delete = request_module(20, 4)
    body = build(delete.DeleteTopicsRequest, timeout=10_000, topic_names=("deleted-twice", "deleted-twice"))
    assert [result.error_code for result in call(address, body).responses] == [42, 42]
    with KqClient(kafka_cluster.bootstrap) as kq:
        assert "deleted-twice" in {info.name for info in kq.list_topics()}


# DeleteGroups and OffsetDelete ------------------------------------------------------------------


def joined_consumer(cluster: LocalCluster, group: str, topic: str) -> Consumer:
    """A confluent-kafka consumer of `topic` in `group`, once it has its assignment."""
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])

    def assigned() -> bool:
        consumer.poll(0.2)
        return bool(consumer.assignment())

    wait_for(assigned)
    return consumer


def test_delete_groups_and_offset_delete_answer_as_kafka(kafka_cluster: LocalCluster) -> None:
    """OffsetDelete forgets a group's offsets of a topic no member subscribes to and answers
    GROUP_SUBSCRIBED_TO_TOPIC for one an active member does (kafka-python); DeleteGroups answers
    NON_EMPTY_GROUP while the group has a member, deletes it once empty, and GROUP_ID_NOT_FOUND for an
    unknown group (confluent-kafka and kafka-python)."""
    with KqClient(kafka_cluster.bootstrap) as kq:
        kq.create_topic("og-a", partitions=1)
        kq.create_topic("og-b", partitions=1)
        for topic in ("og-a", "og-b"):
            kq.send_batch(topic, [ProducerRecord(b"v", partition=0)] * 3)
    consumer = joined_consumer(kafka_cluster, "og-group", "og-a")
    consumer.commit(offsets=[TopicPartition("og-a", 0, 2), TopicPartition("og-b", 0, 3)], asynchronous=False)
    python_admin = KafkaAdminClient(bootstrap_servers=kafka_cluster.kafka_bootstrap)
    try:
        answers = python_admin.delete_group_offsets(
            "og-group", [KafkaTopicPartition("og-a", 0), KafkaTopicPartition("og-b", 0)]
        )
        assert answers[KafkaTopicPartition("og-a", 0)] is kafka_errors.GroupSubscribedToTopicError
        assert answers[KafkaTopicPartition("og-b", 0)] is kafka_errors.NoError
        committed = python_admin.list_group_offsets("og-group")["og-group"]
        assert set(committed) == {KafkaTopicPartition("og-a", 0)}

        client = admin(kafka_cluster)
        future = client.delete_consumer_groups(["og-group"])["og-group"]
        with pytest.raises(KafkaException) as refused:
            future.result(TIMEOUT_S)
        assert refused.value.args[0].code() == KafkaError.NON_EMPTY_GROUP
        consumer.close()
        client.delete_consumer_groups(["og-group"])["og-group"].result(TIMEOUT_S)
        assert not python_admin.list_group_offsets("og-group").get("og-group")
        answers_by_group = dict(python_admin.delete_groups(["og-group", "never-there"]))
        assert answers_by_group == {"og-group": "GroupIdNotFoundError", "never-there": "GroupIdNotFoundError"}
    finally:
        python_admin.close()


# DeleteRecords ----------------------------------------------------------------------------------


def test_delete_records_trims_each_partition_to_its_offset(kafka_cluster: LocalCluster) -> None:
    """DeleteRecords answers each partition's new low watermark (-1: the high watermark), refuses an
    offset past the high watermark (OFFSET_OUT_OF_RANGE), and is NOT_LEADER_OR_FOLLOWER on a node
    that does not lead the partition (confluent-kafka, kafka-python, the wire)."""
    with KqClient(kafka_cluster.bootstrap) as kq:
        kq.create_topic("trimmed", partitions=2)
        kq.send_batch("trimmed", [ProducerRecord(b"v", partition=p) for p in (0, 1) for _ in range(5)])
    client = admin(kafka_cluster)
    futures = client.delete_records([TopicPartition("trimmed", 0, 3), TopicPartition("trimmed", 1, -1)])
    by_partition = {tp.partition: future.result(TIMEOUT_S) for tp, future in futures.items()}
    assert by_partition[0].low_watermark == 3 and by_partition[1].low_watermark == 5
    with KqClient(kafka_cluster.bootstrap) as kq:
        starts = {p: offsets.log_start_offset for p, offsets in kq.list_offsets("trimmed").items()}
    assert starts == {0: 3, 1: 5}
    too_far = client.delete_records([TopicPartition("trimmed", 0, 6)])
    with pytest.raises(KafkaException) as refused:
        next(iter(too_far.values())).result(TIMEOUT_S)
    assert refused.value.args[0].code() == KafkaError.OFFSET_OUT_OF_RANGE

    python_admin = KafkaAdminClient(bootstrap_servers=kafka_cluster.kafka_bootstrap)
    try:
        answer = python_admin.delete_records({KafkaTopicPartition("trimmed", 0): 4})
        assert answer[KafkaTopicPartition("trimmed", 0)]["low_watermark"] == 4
    finally:
        python_admin.close()

    leader = leader_address(kafka_cluster, "trimmed")
    follower = next(
        spec.kafka_address for spec in kafka_cluster.nodes.values() if spec.kafka_address != leader
    )
    request = request_module(21, 2)
    body = build(
        request.DeleteRecordsRequest,
        timeout=10_000,
        topics=(
            build(
                request.DeleteRecordsTopic,
                name="trimmed",
                partitions=(build(request.DeleteRecordsPartition, partition_index=0, offset=5),),
            ),
        ),
    )
    assert call(follower, body).topics[0].partitions[0].error_code == 6
    assert call(leader, body).topics[0].partitions[0].low_watermark == 5


# CreatePartitions -------------------------------------------------------------------------------


def test_create_partitions_grows_a_topic_and_refuses_what_does_not_grow(kafka_cluster: LocalCluster) -> None:
    """CreatePartitions grows a topic (confluent-kafka; validate_only changes nothing), again
    (kafka-python), and answers INVALID_PARTITIONS for a count that does not grow, UNKNOWN_TOPIC_OR_PARTITION
    for an unknown topic; the old partition keeps its records and the new ones take writes."""
    with KqClient(kafka_cluster.bootstrap) as kq:
        kq.create_topic("growing", partitions=1)
        kq.send_batch("growing", [ProducerRecord(b"old", partition=0)] * 2)
    client = admin(kafka_cluster)
    client.create_partitions([NewPartitions("growing", 3)], validate_only=True)["growing"].result(TIMEOUT_S)
    assert len(client.list_topics("growing", timeout=TIMEOUT_S).topics["growing"].partitions) == 1
    client.create_partitions([NewPartitions("growing", 3)])["growing"].result(TIMEOUT_S)
    assert len(client.list_topics("growing", timeout=TIMEOUT_S).topics["growing"].partitions) == 3
    for count, expected in ((3, KafkaError.INVALID_PARTITIONS), (2, KafkaError.INVALID_PARTITIONS)):
        with pytest.raises(KafkaException) as refused:
            client.create_partitions([NewPartitions("growing", count)])["growing"].result(TIMEOUT_S)
        assert refused.value.args[0].code() == expected
    with pytest.raises(KafkaException) as unknown:
        client.create_partitions([NewPartitions("no-such-topic", 2)])["no-such-topic"].result(TIMEOUT_S)
    assert unknown.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART

    python_admin = KafkaAdminClient(bootstrap_servers=kafka_cluster.kafka_bootstrap)
    try:
        python_admin.create_partitions({"growing": KafkaNewPartitions(total_count=4)})
    finally:
        python_admin.close()
    with KqClient(kafka_cluster.bootstrap) as kq:
        wait_for(lambda: len(kq.list_offsets("growing")) == 4)
        assert kq.send("growing", b"new", partition=3).offset == 0
        assert {p: o.log_end_offset for p, o in kq.list_offsets("growing").items()} == {
            0: 2,
            1: 0,
            2: 0,
            3: 1,
        }

    # Sent to a broker that does not lead group 0: forwarded to the one that does.
    controller = leader_address(kafka_cluster, "growing")
    follower = next(
        spec.kafka_address for spec in kafka_cluster.nodes.values() if spec.kafka_address != controller
    )
    request = request_module(37, 3)
    body = build(
        request.CreatePartitionsRequest,
        timeout=10_000,
        validate_only=False,
        topics=(build(request.CreatePartitionsTopic, name="growing", count=5, assignments=None),),
    )
    assert [result.error_code for result in call(follower, body).results] == [0]
    with KqClient(kafka_cluster.bootstrap) as kq:
        assert len(kq.list_offsets("growing")) == 5


# DescribeLogDirs, DescribeTopicPartitions, ElectLeaders ------------------------------------------


def test_describe_log_dirs_names_each_nodes_data_directory_and_partition_sizes(
    kafka_cluster: LocalCluster,
) -> None:
    """DescribeLogDirs (kafka-python): each broker answers one log dir, its data directory, with each
    partition's stored size (the store's count) and offset lag 0."""
    with KqClient(kafka_cluster.bootstrap) as kq:
        kq.create_topic("sized", partitions=2)
        index = kq.send_batch("sized", [ProducerRecord(b"v" * 100, partition=0)] * 3)[-1].index
        kafka_cluster.wait_applied(index, list(kafka_cluster.nodes))
        size_bytes = kq.list_offsets("sized")[0].size_bytes
    python_admin = KafkaAdminClient(bootstrap_servers=kafka_cluster.kafka_bootstrap)
    try:
        answers = python_admin.describe_log_dirs()
    finally:
        python_admin.close()
    assert sorted(answer["broker"] for answer in answers) == [1, 2, 3]
    for answer in answers:
        (log_dir,) = answer["log_dirs"]
        assert log_dir["error_code"] == 0
        assert Path(log_dir["log_dir"]) == kafka_cluster.store_path(str(answer["broker"])).resolve().parent
        sized = next(topic for topic in log_dir["topics"] if topic["name"] == "sized")
        by_partition = {
            p["partition_index"]: (p["partition_size"], p["offset_lag"]) for p in sized["partitions"]
        }
        assert by_partition == {0: (size_bytes, 0), 1: (0, 0)} and size_bytes > 300


def test_describe_topic_partitions_pages_by_cursor(kafka_cluster: LocalCluster) -> None:
    """DescribeTopicPartitions (kafka-python) lists the named topics' partitions by name, at most the
    request's limit a page, with a cursor to the next page; an unknown topic is UNKNOWN_TOPIC_OR_PARTITION."""
    with KqClient(kafka_cluster.bootstrap) as kq:
        kq.create_topic("paged-a", partitions=3)
        kq.create_topic("paged-b", partitions=2)
    python_admin = KafkaAdminClient(bootstrap_servers=kafka_cluster.kafka_bootstrap)
    try:
        seen: list[tuple[str, int]] = []
        cursor = None
        pages = 0
        while True:
            page = python_admin.describe_topic_partitions(
                ["paged-b", "paged-a"], response_partition_limit=2, cursor=cursor
            )
            pages += 1
            for topic in page["topics"]:
                assert topic["error_code"] == 0
                for partition in topic["partitions"]:
                    assert partition["leader_id"] in (1, 2, 3) and len(partition["replica_nodes"]) == 3
                    seen.append((topic["name"], partition["partition_index"]))
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == [("paged-a", 0), ("paged-a", 1), ("paged-a", 2), ("paged-b", 0), ("paged-b", 1)]
        assert pages == 3
        unknown = python_admin.describe_topic_partitions(["never-made"])
        assert [topic["error_code"] for topic in unknown["topics"]] == [3]
    finally:
        python_admin.close()


def test_elect_leaders_answers_election_not_needed_for_raft_group_leaders(
    kafka_cluster: LocalCluster,
) -> None:
    """ElectLeaders (confluent-kafka and kafka-python): a partition led by its Raft group's leader (one
    group: nothing to balance) is ELECTION_NOT_NEEDED, preferred or unclean; an unknown partition is
    UNKNOWN_TOPIC_OR_PARTITION."""
    with KqClient(kafka_cluster.bootstrap) as kq:
        kq.create_topic("elected", partitions=2)
    client = admin(kafka_cluster)
    for election_type in (ElectionType.PREFERRED, ElectionType.UNCLEAN):
        wanted = [TopicPartition("elected", 0), TopicPartition("elected", 1), TopicPartition("elected", 7)]
        results = client.elect_leaders(election_type, wanted).result(TIMEOUT_S)
        codes = {tp.partition: (error.code() if error is not None else None) for tp, error in results.items()}
        assert codes == {
            0: KafkaError.ELECTION_NOT_NEEDED,
            1: KafkaError.ELECTION_NOT_NEEDED,
            7: KafkaError.UNKNOWN_TOPIC_OR_PART,
        }
    python_admin = KafkaAdminClient(bootstrap_servers=kafka_cluster.kafka_bootstrap)
    try:
        answer = python_admin.elect_leaders(0, {"elected": [0, 1]})  # ELECTION_NOT_NEEDED is no error there.
    finally:
        python_admin.close()
    (result,) = answer.replica_election_results
    assert [(p.partition_id, p.error_code) for p in result.partition_result] == [(0, 84), (1, 84)]
