"""Kafka transactions with real clients on a three-node cluster: commit and abort, read_committed and
read_uncommitted consumers, fencing by a second instance of a transactional id, offsets committed in a
transaction (send_offsets_to_transaction), and aiokafka's transactional producer."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from kio.schema.describe_producers.v0.request import DescribeProducersRequest
from kio.schema.describe_producers.v0.request import TopicRequest as DescribeProducersTopic
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.list_transactions.v1.request import ListTransactionsRequest
from kio.schema.offset_fetch.v7.request import OffsetFetchRequest, OffsetFetchRequestTopic
from kio.schema.offset_fetch.v8.request import OffsetFetchRequest as OffsetFetchRequestV8
from kio.schema.offset_fetch.v8.request import OffsetFetchRequestGroup, OffsetFetchRequestTopics
from kio.schema.types import GroupId, TopicName, TransactionalId
from kio.static.primitive import i32

from kq.cli.main import kq
from kq.deploy.cluster import LocalCluster
from tests.kafka.wire import call

WAIT_S = 60.0


def _topic(cluster: LocalCluster, partitions: int = 2) -> str:
    name = f"txn-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def _producer(cluster: LocalCluster, transactional_id: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": 60_000,
        }
    )


def _consume_all(
    cluster: LocalCluster, topic: str, isolation: str, expected: int, partitions: int = 2
) -> list[bytes]:
    """Every value of the topic a consumer of `isolation` reads, waiting until it read `expected` (or the
    partitions' ends at its LSO / high watermark, with nothing more coming)."""
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[bytes] = []
    at_end: set[int] = set()
    loop = asyncio.new_event_loop()
    deadline = loop.time() + WAIT_S
    try:
        while loop.time() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            error, partition, value = message.error(), message.partition(), message.value()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(error)
                assert partition is not None
                at_end.add(partition)
                if len(values) >= expected and len(at_end) == partitions:
                    break
                continue
            assert value is not None
            values.append(value)
    finally:
        consumer.close()
        loop.close()
    return values


def test_committed_and_aborted_transactions_as_read_committed_and_uncommitted_consumers_see_them(
    kafka_cluster: LocalCluster,
) -> None:
    """A committed transaction's records are seen by both isolation levels; an aborted one's only by
    read_uncommitted; records after an open transaction wait for it (the LSO)."""
    topic = _topic(kafka_cluster)
    producer = _producer(kafka_cluster, f"tx-{uuid.uuid4().hex[:6]}")
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(4):
        producer.produce(topic, f"committed-{i}".encode(), partition=i % 2)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(4):
        producer.produce(topic, f"aborted-{i}".encode(), partition=i % 2)
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"committed-last", partition=0)
    producer.commit_transaction(30)
    committed = _consume_all(kafka_cluster, topic, "read_committed", 5)
    assert sorted(committed) == sorted([f"committed-{i}".encode() for i in range(4)] + [b"committed-last"])
    everything = _consume_all(kafka_cluster, topic, "read_uncommitted", 9)
    assert sorted(everything) == sorted(
        [f"committed-{i}".encode() for i in range(4)]
        + [f"aborted-{i}".encode() for i in range(4)]
        + [b"committed-last"]
    )


def test_a_second_instance_fences_the_first(kafka_cluster: LocalCluster) -> None:
    """init_transactions of a second producer with the same transactional id fences the first: its
    commit fails fatally (PRODUCER_FENCED / INVALID_PRODUCER_EPOCH), and its open records are aborted."""
    topic = _topic(kafka_cluster, 1)
    transactional_id = f"fence-{uuid.uuid4().hex[:6]}"
    first = _producer(kafka_cluster, transactional_id)
    first.init_transactions(30)
    first.begin_transaction()
    first.produce(topic, b"zombie", partition=0)
    first.flush(30)
    second = _producer(kafka_cluster, transactional_id)
    second.init_transactions(30)
    with pytest.raises(KafkaException) as caught:
        first.commit_transaction(30)
    error = caught.value.args[0]
    assert error.fatal() or error.txn_requires_abort(), error
    second.begin_transaction()
    second.produce(topic, b"fresh", partition=0)
    second.commit_transaction(30)
    assert _consume_all(kafka_cluster, topic, "read_committed", 1, partitions=1) == [b"fresh"]


def test_offsets_sent_to_a_transaction_are_committed_with_it(kafka_cluster: LocalCluster) -> None:
    """A consume-transform-produce step: the input offsets sent to the transaction are the group's
    committed offsets once it commits, and stay as they were when it aborts."""
    source, sink = _topic(kafka_cluster, 1), _topic(kafka_cluster, 1)
    group = f"ctp-{uuid.uuid4().hex[:6]}"
    producer = _producer(kafka_cluster, f"ctp-{uuid.uuid4().hex[:6]}")
    producer.init_transactions(30)
    consumer = Consumer({"bootstrap.servers": kafka_cluster.kafka_bootstrap, "group.id": group})
    metadata = consumer.consumer_group_metadata()

    def step(offset: int, commit: bool) -> None:
        producer.begin_transaction()
        producer.produce(sink, f"out-{offset}".encode(), partition=0)
        committed = TopicPartition(source, 0, offset, f"meta-{offset}", offset // 2)
        producer.send_offsets_to_transaction([committed], metadata, 30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)

    def committed() -> tuple[int, str | None, int | None]:
        found = consumer.committed([TopicPartition(source, 0)], 30)[0]
        return int(found.offset), found.metadata, found.leader_epoch

    step(5, commit=True)
    assert committed() == (5, "meta-5", 2)  # Kafka's metadata and leader epoch are kept with it.
    step(9, commit=False)
    assert committed() == (5, "meta-5", 2)
    step(12, commit=True)
    assert committed() == (12, "meta-12", 6)
    consumer.commit(offsets=[TopicPartition(source, 0, 0, "plain")], asynchronous=False)
    assert committed() == (0, "plain", None)  # OffsetCommit keeps metadata too; no epoch: none.
    consumer.close()
    assert _consume_all(kafka_cluster, sink, "read_committed", 2, partitions=1) == [b"out-5", b"out-12"]


def _member(settings: dict[str, str], topic: str) -> Consumer:
    """A group member subscribed to `topic`, returned once it owns a partition."""
    consumer = Consumer({"auto.offset.reset": "earliest", **settings})
    consumer.subscribe([topic])
    deadline = time.monotonic() + WAIT_S
    while not consumer.assignment():
        assert time.monotonic() < deadline, "the member got no partition"
        consumer.poll(0.2)
    return consumer


def test_a_zombie_consumer_s_offsets_are_fenced(kafka_cluster: LocalCluster) -> None:
    """KIP-447 through librdkafka: the group metadata of a consumer that was a member sends its member
    id and generation with TxnOffsetCommit; once it left the group (its partitions would be another
    member's), offsets sent with that metadata are refused and the transaction cannot commit, while
    the metadata of the member that holds the group now is taken."""
    source = _topic(kafka_cluster, 1)
    group = f"zombie-{uuid.uuid4().hex[:6]}"
    settings = {"bootstrap.servers": kafka_cluster.kafka_bootstrap, "group.id": group}
    first = _member(settings, source)
    stale = first.consumer_group_metadata()
    first.close()  # Leaves the group: its metadata is a zombie's now.
    producer = _producer(kafka_cluster, f"zombie-{uuid.uuid4().hex[:6]}")
    producer.init_transactions(30)
    producer.begin_transaction()
    with pytest.raises(KafkaException) as refused:
        producer.send_offsets_to_transaction([TopicPartition(source, 0, 3)], stale, 30)
    assert refused.value.args[0].txn_requires_abort(), refused.value.args[0]
    producer.abort_transaction(30)
    second = _member(settings, source)
    producer.begin_transaction()
    producer.send_offsets_to_transaction([TopicPartition(source, 0, 4)], second.consumer_group_metadata(), 30)
    producer.commit_transaction(30)
    assert second.committed([TopicPartition(source, 0)], 30)[0].offset == 4
    second.close()


def test_an_older_instance_of_a_static_consumer_is_fenced(kafka_cluster: LocalCluster) -> None:
    """A static consumer (group.instance.id) restarted: the newer instance takes the instance's place
    under a new member id, and offsets sent with the older instance's group metadata are refused with
    FENCED_INSTANCE_ID (librdkafka sends the instance id in TxnOffsetCommit v3), so its transaction
    must abort; the newer instance's are committed."""
    source = _topic(kafka_cluster, 1)
    group = f"static-{uuid.uuid4().hex[:6]}"
    settings = {
        "bootstrap.servers": kafka_cluster.kafka_bootstrap,
        "group.id": group,
        "group.instance.id": "worker-1",
    }
    first = _member(settings, source)
    stale = first.consumer_group_metadata()
    first.close()  # A static member does not leave on close: the instance keeps its place.
    second = _member(settings, source)  # The restarted instance: a new member id for "worker-1".
    producer = _producer(kafka_cluster, f"static-{uuid.uuid4().hex[:6]}")
    producer.init_transactions(30)
    producer.begin_transaction()
    with pytest.raises(KafkaException) as refused:
        producer.send_offsets_to_transaction([TopicPartition(source, 0, 3)], stale, 30)
    error = refused.value.args[0]
    assert error.code() == KafkaError.FENCED_INSTANCE_ID and error.txn_requires_abort(), error
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.send_offsets_to_transaction([TopicPartition(source, 0, 4)], second.consumer_group_metadata(), 30)
    producer.commit_transaction(30)
    assert second.committed([TopicPartition(source, 0)], 30)[0].offset == 4
    second.close()


def test_aiokafka_transactional_producer_commits_and_aborts(kafka_cluster: LocalCluster) -> None:
    """aiokafka's transactional producer: a committed batch is read, an aborted one is not."""
    topic = _topic(kafka_cluster, 1)

    async def run() -> list[Any]:
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_cluster.kafka_bootstrap, transactional_id=f"aio-{uuid.uuid4().hex[:6]}"
        )
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait(topic, b"kept", partition=0)
            await producer.begin_transaction()
            await producer.send_and_wait(topic, b"dropped", partition=0)
            await producer.abort_transaction()
            async with producer.transaction():
                await producer.send_and_wait(topic, b"kept-too", partition=0)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=kafka_cluster.kafka_bootstrap,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
        )
        await consumer.start()
        values: list[Any] = []
        try:
            async with asyncio.timeout(WAIT_S):
                while len(values) < 2:
                    batch = await consumer.getmany(timeout_ms=1000)
                    values += [record.value for records in batch.values() for record in records]
        finally:
            await consumer.stop()
        return values

    assert asyncio.run(run()) == [b"kept", b"kept-too"]


def test_transactions_and_producers_are_described_as_kafka_transactions_sh_asks(
    kafka_cluster: LocalCluster,
) -> None:
    """DescribeTransactions and ListTransactions at the coordinator and DescribeProducers at the
    partition's leader show an open transaction (Ongoing, its partition, its first offset) and then its
    completion; an unknown id is TRANSACTIONAL_ID_NOT_FOUND; other brokers list none."""
    topic = _topic(kafka_cluster, 1)
    transactional_id = f"described-{uuid.uuid4().hex[:6]}"
    producer = _producer(kafka_cluster, transactional_id)
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"open", partition=0)
    producer.flush(30)
    leader = kafka_cluster.nodes[kafka_cluster.wait_ready()].kafka_address
    described: Any = call(
        leader,
        DescribeTransactionsRequest(
            transactional_ids=(TransactionalId(transactional_id), TransactionalId("nobody"))
        ),
    )
    state, unknown = described.transaction_states
    assert (state.error_code, state.transaction_state) == (0, "Ongoing")
    assert [(t.topic, tuple(t.partitions)) for t in state.topics] == [(topic, (0,))]
    assert unknown.error_code == 105
    listed = [
        call(node.kafka_address, ListTransactionsRequest(state_filters=("Ongoing",), producer_id_filters=()))
        for node in kafka_cluster.nodes.values()
    ]
    names = [s.transactional_id for answer in listed for s in answer.transaction_states]
    assert names.count(transactional_id) == 1
    request = DescribeProducersRequest(
        topics=(DescribeProducersTopic(name=TopicName(topic), partition_indexes=(i32(0),)),)
    )
    partition = call(leader, request).topics[0].partitions[0]
    assert partition.error_code == 0
    [mine] = [p for p in partition.active_producers if p.producer_id == state.producer_id]
    assert mine.current_txn_start_offset >= 0
    bootstrap = ["--bootstrap", ",".join(kafka_cluster.bootstrap)]
    shown = CliRunner().invoke(kq, [*bootstrap, "transactions", "describe", transactional_id])
    assert shown.exit_code == 0 and "state Ongoing" in shown.stdout and f"{topic}-0" in shown.stdout
    producer.commit_transaction(30)
    described = call(
        leader, DescribeTransactionsRequest(transactional_ids=(TransactionalId(transactional_id),))
    )
    assert described.transaction_states[0].transaction_state == "CompleteCommit"
    listed_json = CliRunner().invoke(kq, [*bootstrap, "transactions", "list", "--format", "json"])
    rows = {row["transactional_id"]: row for row in json.loads(listed_json.stdout)}
    assert rows[transactional_id]["state"] == "CompleteCommit"
    unknown_id = CliRunner().invoke(kq, [*bootstrap, "transactions", "describe", "nobody"])
    assert unknown_id.exit_code != 0 and "unknown transactional id nobody" in unknown_id.output


def test_require_stable_answers_unstable_while_a_transaction_holds_the_offset(
    kafka_cluster: LocalCluster,
) -> None:
    """OffsetFetch with require_stable (what a read_committed consumer sends) answers
    UNSTABLE_OFFSET_COMMIT for a partition whose offset an open transaction committed, and the offset
    once the transaction commits; without require_stable the offset before the transaction."""
    source = _topic(kafka_cluster, 1)
    group = f"stable-{uuid.uuid4().hex[:6]}"
    producer = _producer(kafka_cluster, f"stable-{uuid.uuid4().hex[:6]}")
    producer.init_transactions(30)
    consumer = Consumer({"bootstrap.servers": kafka_cluster.kafka_bootstrap, "group.id": group})
    leader = kafka_cluster.nodes[kafka_cluster.wait_ready()].kafka_address

    def fetched(stable: bool) -> tuple[int, int]:
        request = OffsetFetchRequest(
            group_id=GroupId(group),
            topics=(OffsetFetchRequestTopic(name=TopicName(source), partition_indexes=(i32(0),)),),
            require_stable=stable,
        )
        partition = call(leader, request).topics[0].partitions[0]
        return int(partition.error_code), int(partition.committed_offset)

    producer.begin_transaction()
    producer.produce(source, b"x", partition=0)
    producer.send_offsets_to_transaction(
        [TopicPartition(source, 0, 4)], consumer.consumer_group_metadata(), 30
    )
    assert fetched(stable=True) == (88, -1)
    assert fetched(stable=False) == (0, -1)
    producer.commit_transaction(30)
    assert fetched(stable=True) == (0, 4)
    consumer.close()


def test_offset_fetch_v8_answers_a_group_error_with_no_partitions(kafka_cluster: LocalCluster) -> None:
    """A v8 OffsetFetch sent to a node that does not coordinate the group answers the group's error
    (NOT_COORDINATOR) and no partitions, as Kafka does: never offsets of -1 with NONE, which a client
    reads as "nothing committed" (the chaos exactly-once checker read a final offset so)."""
    source = _topic(kafka_cluster, 1)
    leader = kafka_cluster.wait_ready()
    follower = next(spec for node_id, spec in kafka_cluster.nodes.items() if node_id != leader)
    request = OffsetFetchRequestV8(
        groups=(
            OffsetFetchRequestGroup(
                group_id=GroupId(f"v8-{uuid.uuid4().hex[:6]}"),
                topics=(OffsetFetchRequestTopics(name=TopicName(source), partition_indexes=(i32(0),)),),
            ),
        ),
        require_stable=False,
    )
    group = call(follower.kafka_address, request).groups[0]
    assert int(group.error_code) == 16  # NOT_COORDINATOR
    assert group.topics == ()
