"""Kafka consumer groups on three real nodes, with real Kafka clients: confluent-kafka (librdkafka),
kafka-python and aiokafka join, rebalance and commit; kafka-python's admin lists, describes and reads
offsets; kq's own client and consumers see the same groups and offsets; wire-level checks of
MEMBER_ID_REQUIRED, NOT_COORDINATOR, static membership and the kq/Kafka protocol exclusion."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from kq.broker.kafka.build import build, request_module
from kq.client import GroupConsumer, KqClient, ProducerRecord
from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for
from tests.kafka.wire import call

pytestmark = pytest.mark.system

WAIT_TIMEOUT_S = 60.0
JOIN, HEARTBEAT, SYNC, OFFSET_COMMIT, DESCRIBE = 11, 12, 14, 8, 15
MEMBER_ID_REQUIRED, NOT_COORDINATOR, FENCED_INSTANCE_ID, INCONSISTENT_GROUP_PROTOCOL = 79, 16, 82, 23
COORDINATOR_NOT_AVAILABLE = 15


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One three-node cluster for the module (each test uses its own groups and topics)."""
    with LocalCluster(Path(tmp_path_factory.mktemp("kafka-groups")) / "cluster") as local:
        local.wait_ready()
        with KqClient(local.bootstrap) as client:
            client.create_topic("six", 6)
            client.send_batch("six", [ProducerRecord(b"v%d" % i, partition=i % 6) for i in range(60)])
        yield local


def request(api_key: int, api_version: int, cls_name: str, **fields: Any) -> Any:
    """A kio request object (or nested struct) of that API and version; missing fields are zero."""
    return build(getattr(request_module(api_key, api_version), cls_name), **fields)


nested = request


def addresses(cluster: LocalCluster) -> tuple[str, str]:
    """The Kafka addresses of the leader and of one follower."""
    leader = str(cluster.wait_ready())
    follower = next(spec for node, spec in cluster.nodes.items() if node != leader)
    return cluster.nodes[leader].kafka_address, follower.kafka_address


class Member:
    """A confluent-kafka consumer in a group, polled by its own thread; records its assignment."""

    def __init__(self, cluster: LocalCluster, group: str, name: str, **settings: Any) -> None:
        self.name = name
        self.records: list[tuple[int, int]] = []  # (partition, offset) of every record it read.
        self.assigned: set[int] = set()
        self.committed: dict[int, int] = {}
        self.consumer = Consumer(
            {
                "bootstrap.servers": cluster.kafka_bootstrap,
                "group.id": group,
                "client.id": name,
                "session.timeout.ms": 6_000,
                "heartbeat.interval.ms": 500,
                "enable.auto.commit": False,
                "partition.assignment.strategy": "range",
                "log_level": 2,
                **settings,
            }
        )
        self.consumer.subscribe(["six"], on_assign=self._on_assign, on_revoke=self._on_revoke)
        self._running = threading.Event()
        self._running.set()
        self._commits: list[tuple[list[TopicPartition], threading.Event]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        # Where the member resumes: the group's committed offsets (OffsetFetch), read on assignment.
        self.committed = {p.partition: p.offset for p in consumer.committed(partitions, timeout=10)}
        self.assigned = {p.partition for p in partitions}

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self.assigned = set()

    def _run(self) -> None:
        while self._running.is_set():
            message = self.consumer.poll(0.1)
            if message is not None and message.error() is None:
                self.records.append((int(message.partition() or 0), int(message.offset() or 0)))
            if self._commits:  # librdkafka's calls stay on the polling thread.
                offsets, done = self._commits.pop()
                self.consumer.commit(offsets=offsets, asynchronous=False)
                done.set()

    def commit(self, offsets: list[TopicPartition]) -> None:
        """Commits `offsets` (synchronously, from the polling thread)."""
        done = threading.Event()
        self._commits.append((offsets, done))
        assert done.wait(WAIT_TIMEOUT_S), "the commit did not finish"

    def close(self) -> None:
        self._running.clear()
        self._thread.join()
        self.consumer.close()


def _exactly_once(members: list[Member]) -> bool:
    owned = [p for member in members for p in member.assigned]
    return sorted(owned) == list(range(6)) and all(member.assigned for member in members)


def test_confluent_group_shares_partitions_and_rebalances_when_one_leaves(cluster: LocalCluster) -> None:
    """Three librdkafka consumers share 6 partitions, each exactly once; one closes (LeaveGroup) and
    the other two take over its partitions."""
    members = [Member(cluster, "shared", f"c{i}") for i in range(3)]
    try:
        wait_for(lambda: _exactly_once(members), "3 members owning 6 partitions once", WAIT_TIMEOUT_S)
        members[0].close()
        rest = members[1:]
        wait_for(lambda: _exactly_once(rest), "2 members taking over the partitions", WAIT_TIMEOUT_S)
        with KqClient(cluster.bootstrap) as client:
            description = client.describe_group("shared")
        assert description.phase == "stable" and len(description.members) == 2
    finally:
        for member in members[1:]:
            member.close()


def test_consuming_in_a_group_end_to_end(cluster: LocalCluster) -> None:
    """Two librdkafka members read all 60 records between them and commit as they close; records
    produced over Kafka afterwards are all a new member of the group reads: nothing twice, none lost."""
    from confluent_kafka import Producer

    reading = {"auto.offset.reset": "earliest", "enable.auto.commit": True, "auto.commit.interval.ms": 200}
    members = [Member(cluster, "e2e", f"e{i}", **reading) for i in range(2)]
    try:
        every = {(p, o) for p in range(6) for o in range(10)}
        wait_for(
            lambda: {r for m in members for r in m.records} == every,
            "60 records read in the group",
            WAIT_TIMEOUT_S,
        )
    finally:
        for member in members:
            member.close()
    producer = Producer({"bootstrap.servers": cluster.kafka_bootstrap, "enable.idempotence": True})
    for partition in range(6):
        producer.produce("six", b"late", partition=partition)
    assert producer.flush(30) == 0
    late = Member(cluster, "e2e", "late", **reading)
    try:
        wait_for(lambda: len(late.records) >= 6, "the 6 new records read", WAIT_TIMEOUT_S)
        assert sorted(late.records) == [(p, 10) for p in range(6)]
    finally:
        late.close()


def test_commit_resume_and_the_same_offsets_in_kq(cluster: LocalCluster) -> None:
    """Offsets a Kafka consumer commits are what the next one in the group resumes from, what
    `kq groups describe` shows (with lag), and where kq's own consumer of that group starts."""
    first = Member(cluster, "resume", "first")
    try:
        wait_for(lambda: len(first.assigned) == 6, "the only member owning 6 partitions", WAIT_TIMEOUT_S)
        first.commit([TopicPartition("six", p, 7) for p in range(6)])
    finally:
        first.close()
    second = Member(cluster, "resume", "second")
    try:
        wait_for(lambda: len(second.assigned) == 6, "the next member owning 6 partitions", WAIT_TIMEOUT_S)
        assert second.committed == dict.fromkeys(range(6), 7)
    finally:
        second.close()
    with KqClient(cluster.bootstrap) as client:
        description = client.describe_group("resume")
        assert sorted(p.partition for p in description.partitions) == list(range(6))
        assert all(p.committed_offset == 7 and p.lag == p.log_end_offset - 7 for p in description.partitions)
        unread = sum(p.lag for p in description.partitions)
        consumer = GroupConsumer(client, "resume", ["six"], client_id="kq", enable_auto_commit=False)
        records: list[Any] = []

        def read_all() -> bool:
            records.extend(consumer.poll(200))
            return len(records) >= unread

        try:
            wait_for(read_all, "kq reading the records after the committed offsets", WAIT_TIMEOUT_S)
            first_read = {p: min(r.offset for r in records if r.partition == p) for p in range(6)}
            assert first_read == dict.fromkeys(range(6), 7)  # kq resumes where the Kafka consumer committed.
        finally:
            consumer.close()


def test_kafka_python_and_aiokafka_join_commit_and_admin(cluster: LocalCluster) -> None:
    """kafka-python and aiokafka consumers join and commit; kafka-python's admin lists the groups with
    Kafka's state names, describes members and reads committed offsets (kq groups included)."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as AioPartition
    from kafka import KafkaAdminClient, KafkaConsumer
    from kafka import TopicPartition as KpPartition
    from kafka.structs import OffsetAndMetadata

    consumer = KafkaConsumer(
        "six", bootstrap_servers=cluster.kafka_bootstrap, group_id="kp", enable_auto_commit=False
    )
    try:
        wait_for(lambda: _kafka_python_assigned(consumer, 6), "kafka-python join", WAIT_TIMEOUT_S)
        consumer.commit({KpPartition("six", 2): OffsetAndMetadata(5, "", -1)})
        assert consumer.committed(KpPartition("six", 2)) == 5
    finally:
        consumer.close()

    async def aiokafka_member() -> int | None:
        member = AIOKafkaConsumer(
            "six", bootstrap_servers=cluster.kafka_bootstrap, group_id="ak", enable_auto_commit=False
        )
        await member.start()
        try:
            for _ in range(150):
                if len(member.assignment()) == 6:
                    break
                await asyncio.sleep(0.2)
            assert len(member.assignment()) == 6
            await member.commit({AioPartition("six", 4): 9})
            committed = await member.committed(AioPartition("six", 4))
            return None if committed is None else int(committed)
        finally:
            await member.stop()

    assert asyncio.run(aiokafka_member()) == 9
    with KqClient(cluster.bootstrap) as client:
        kq_member = GroupConsumer(client, "kq-own", ["six"], client_id="own")
        kq_member.poll(200)
        admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
        try:
            listed = {group["group_id"]: group for group in admin.list_groups()}
            assert listed["kp"]["group_state"] == "Empty" and listed["kp"]["protocol_type"] == "consumer"
            assert listed["kq-own"]["protocol_type"] == "kq" and listed["kq-own"]["group_state"] == "Stable"
            described = admin.describe_groups(["kq-own", "ak", "nobody"])
            assert [m["client_id"] for m in described["kq-own"]["members"]] == ["own"]
            assert described["nobody"]["group_state"] == "Dead"
            offsets = admin.list_group_offsets("kp")["kp"]
            assert offsets[KpPartition("six", 2)].offset == 5
        finally:
            admin.close()
            kq_member.close()


def _kafka_python_assigned(consumer: Any, count: int) -> bool:
    """Polls a kafka-python consumer once; whether it owns `count` partitions."""
    consumer.poll(200)
    return len(consumer.assignment()) == count


def _join(address: str, group: str, member_id: str = "", instance: str | None = None, **fields: Any) -> Any:
    protocol = nested(
        JOIN, 5, "JoinGroupRequestProtocol", name="range", metadata=fields.pop("metadata", b"m")
    )
    body = request(
        JOIN,
        5,
        "JoinGroupRequest",
        group_id=group,
        session_timeout=datetime.timedelta(seconds=10),
        rebalance_timeout=datetime.timedelta(seconds=10),
        member_id=member_id,
        group_instance_id=instance,
        protocol_type=fields.pop("protocol_type", "consumer"),
        protocols=(protocol,),
    )
    for _ in range(
        20
    ):  # A Kafka client retries COORDINATOR_NOT_AVAILABLE (a commit timed out on a busy machine).
        answer = call(address, body)
        if int(answer.error_code) != COORDINATOR_NOT_AVAILABLE:
            return answer
        time.sleep(0.5)
    return answer


def test_wire_member_id_required_not_coordinator_and_protocol_exclusion(cluster: LocalCluster) -> None:
    """JoinGroup v5 without a member id answers MEMBER_ID_REQUIRED with one; a follower answers
    NOT_COORDINATOR; a Kafka member cannot join a kq group with members; DescribeGroups names it kq."""
    leader, follower = addresses(cluster)
    assert int(_join(follower, "wire").error_code) == NOT_COORDINATOR
    heartbeat = request(HEARTBEAT, 3, "HeartbeatRequest", group_id="wire", generation_id=1, member_id="m")
    assert int(call(follower, heartbeat).error_code) == NOT_COORDINATOR
    first = _join(leader, "wire")
    assert int(first.error_code) == MEMBER_ID_REQUIRED and first.member_id
    joined = _join(leader, "wire", first.member_id)
    assert (int(joined.error_code), joined.generation_id, joined.leader) == (0, 1, first.member_id)
    assert [m.member_id for m in joined.members] == [first.member_id]
    with KqClient(cluster.bootstrap) as client:
        member = GroupConsumer(client, "kq-only", ["six"], client_id="own")
        member.poll(200)
        try:
            refused = _join(leader, "kq-only", _join(leader, "kq-only").member_id)
            assert int(refused.error_code) == INCONSISTENT_GROUP_PROTOCOL
            described = call(leader, request(DESCRIBE, 5, "DescribeGroupsRequest", groups=("kq-only",)))
            group = described.groups[0]
            assert (group.protocol_type, group.group_state, group.protocol_data) == ("kq", "Stable", "range")
        finally:
            member.close()


def test_wire_static_member_rejoins_without_rebalance(cluster: LocalCluster) -> None:
    """A static member (group.instance.id) restarting with no member id takes its old place: the same
    generation and assignment, no rebalance; the old member id is fenced."""
    leader, _ = addresses(cluster)
    old = _join(leader, "static", instance="i1")
    assert int(old.error_code) == 0  # Static members skip MEMBER_ID_REQUIRED.
    assignment = nested(SYNC, 3, "SyncGroupRequestAssignment", member_id=old.member_id, assignment=b"A")
    synced = call(
        leader,
        request(
            SYNC,
            3,
            "SyncGroupRequest",
            group_id="static",
            generation_id=old.generation_id,
            member_id=old.member_id,
            group_instance_id="i1",
            assignments=(assignment,),
        ),
    )
    assert (int(synced.error_code), synced.assignment) == (0, b"A")
    new = _join(leader, "static", instance="i1")
    assert (int(new.error_code), new.generation_id) == (0, old.generation_id)
    assert new.member_id != old.member_id and new.leader == new.member_id
    sync_new = dataclasses.replace(
        request(
            SYNC,
            3,
            "SyncGroupRequest",
            group_id="static",
            generation_id=new.generation_id,
            member_id=new.member_id,
            group_instance_id="i1",
            assignments=(),
        ),
    )
    assert call(leader, sync_new).assignment == b"A"
    stale = request(
        HEARTBEAT,
        3,
        "HeartbeatRequest",
        group_id="static",
        generation_id=old.generation_id,
        member_id=old.member_id,
        group_instance_id="i1",
    )
    assert int(call(leader, stale).error_code) in (FENCED_INSTANCE_ID, 25)
