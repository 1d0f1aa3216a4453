"""Kafka's consumer-group protocol (KIP-848) on kq with librdkafka's `group.protocol=consumer`: three
members share a topic, one leaves and one joins; each partition is owned by one member at a time
(the on_assign/on_revoke callbacks, timed, never overlap), every record is consumed, and the
committed offsets survive the members. ConsumerGroupDescribe, ListGroups and DescribeGroups show the
group; a classic member cannot join it while it has members."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.consumer_group_describe.v1.request import ConsumerGroupDescribeRequest as DescribeRequest
from kio.schema.consumer_group_heartbeat.v0.request import ConsumerGroupHeartbeatRequest as HeartbeatRequestV0
from kio.schema.consumer_group_heartbeat.v0.request import TopicPartitions as HeartbeatTopicV0
from kio.schema.consumer_group_heartbeat.v1.request import ConsumerGroupHeartbeatRequest as HeartbeatRequest
from kio.schema.consumer_group_heartbeat.v1.request import TopicPartitions as HeartbeatTopic
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
from kio.schema.list_groups.v5.request import ListGroupsRequest
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i32, i32Timedelta

from kq.client import KqClient
from kq.deploy.cluster import LocalCluster
from tests.kafka.wire import call

pytestmark = pytest.mark.system

PARTITIONS = 6
RECORDS = 300
TIMEOUT_S = 90.0
# The module's --group-consumer-heartbeat-interval-ms: a member learns a new assignment at its next
# heartbeat, so at Kafka's 5 s default each rebalance here took 10-20 s.
HEARTBEAT_INTERVAL_MS = 1_000

Event = tuple[float, str, str, tuple[int, ...]]  # (monotonic s, member, "assign" | "revoke", partitions)


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The Kafka tests' three nodes (tests/kafka/conftest.py), members heartbeating every 1 s."""
    heartbeat = ("--group-consumer-heartbeat-interval-ms", str(HEARTBEAT_INTERVAL_MS))
    with LocalCluster(tmp_path_factory.mktemp("kafka") / "cluster", node_args=heartbeat) as local:
        yield local


@dataclass
class Member:
    """One librdkafka consumer of the group, its records and its rebalance callbacks' events."""

    name: str
    consumer: Consumer
    events: list[Event]
    owned: set[int] = field(default_factory=set)
    values: list[bytes] = field(default_factory=list)

    def poll(self) -> None:
        message = self.consumer.poll(0.05)
        if message is None or message.error() is not None:
            return
        self.values.append(message.value() or b"")
        with contextlib.suppress(KafkaException):  # During a failover: a later commit covers it.
            self.consumer.commit(message=message, asynchronous=False)

    def commit_positions(self) -> None:
        """Commits what it consumed (retrying while a coordinator moves)."""
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                self.consumer.commit(asynchronous=False)
                return
            except KafkaException as error:
                if error.args[0].code() == KafkaError._NO_OFFSET or time.monotonic() > deadline:
                    return
                self.consumer.poll(0.1)


def _member(cluster: LocalCluster, group: str, topic: str, name: str, events: list[Event]) -> Member:
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "client.id": name,
        }
    )
    member = Member(name, consumer, events)

    def on_assign(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
        events.append((time.monotonic(), name, "assign", tuple(sorted(tp.partition for tp in partitions))))
        member.owned |= {tp.partition for tp in partitions}

    def on_revoke(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
        events.append((time.monotonic(), name, "revoke", tuple(sorted(tp.partition for tp in partitions))))
        member.owned -= {tp.partition for tp in partitions}

    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
    return member


def _produce(cluster: LocalCluster, topic: str, start: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": cluster.kafka_bootstrap})
    for i in range(start, start + count):
        producer.produce(topic, f"v{i}".encode(), f"k{i}".encode(), partition=i % PARTITIONS)
    assert producer.flush(TIMEOUT_S) == 0


def _poll_until(members: list[Member], done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        for member in members:
            member.poll()


def _wait_for_commits(cluster: LocalCluster, members: list[Member], group: str, total: int) -> None:
    """Polls and commits until the group's commits add up to ``total``: a commit sent with the epoch a
    heartbeat had just replaced fails (STALE_MEMBER_EPOCH, as Kafka answers), so the partition's next
    owner reads those records again and commits them (at least once); the union of records seen can
    be whole before that happens."""

    def committed() -> int:
        for member in members:
            member.commit_positions()
        with KqClient(cluster.bootstrap) as client:
            return sum(client.committed_offsets(group).values())

    _poll_until(members, lambda: committed() == total, f"the commits adding up to {total}")


def _owners_never_overlap(events: list[Event]) -> None:
    """Per partition, the members' ownership intervals (assign .. revoke) are disjoint in time."""
    owner: dict[int, str] = {}
    for _, name, kind, partitions in sorted(events):
        for partition in partitions:
            if kind == "assign":
                assert partition not in owner, f"{partition} given to {name} while {owner[partition]} owns it"
                owner[partition] = name
            else:
                assert owner.pop(partition, None) == name, (partition, name, events)


def _all_owned(members: list[Member]) -> bool:
    owned = [p for member in members for p in member.owned]
    return sorted(owned) == list(range(PARTITIONS))


def test_consumer_protocol_members_leave_join_and_own_each_partition_alone(
    kafka_cluster: LocalCluster,
) -> None:
    """Three members, one leaves, one joins: every record consumed, one owner at a time, offsets kept."""
    topic, group = f"cg-{uuid.uuid4().hex[:8]}", f"cg-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": kafka_cluster.kafka_bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(TIMEOUT_S)
    _produce(kafka_cluster, topic, 0, RECORDS)
    events: list[Event] = []
    members = [_member(kafka_cluster, group, topic, name, events) for name in ("a", "b", "c")]
    _poll_until(
        members,
        lambda: _all_owned(members) and all(len(m.owned) == 2 for m in members),
        "three members owning two partitions each",
    )
    members[1].consumer.close()  # b leaves (a heartbeat with epoch -1).
    left = [members[0], members[2]]
    _poll_until(left, lambda: _all_owned(left), "a and c owning every partition")
    joining = _member(kafka_cluster, group, topic, "d", events)
    now = [*left, joining]
    _poll_until(
        now, lambda: _all_owned(now) and all(len(m.owned) == 2 for m in now), "a, c and d owning two each"
    )
    _produce(kafka_cluster, topic, RECORDS, RECORDS)
    everyone = [*members, joining]
    _poll_until(now, lambda: len({v for m in everyone for v in m.values}) == 2 * RECORDS, "every record")
    assert {v for m in everyone for v in m.values} == {f"v{i}".encode() for i in range(2 * RECORDS)}
    _wait_for_commits(kafka_cluster, now, group, 2 * RECORDS)
    _owners_never_overlap(events)
    with KqClient(kafka_cluster.bootstrap) as client:
        described = client.describe_group(group)
    assert described.assignor == "uniform" and len(described.members) == 3  # kq's own view of it.
    for member in now:
        member.consumer.close()
    with KqClient(kafka_cluster.bootstrap) as client:
        committed = client.committed_offsets(group)
    assert sum(committed.values()) == 2 * RECORDS  # Each partition's commit is its log end.
    later = Consumer(
        {
            "bootstrap.servers": kafka_cluster.kafka_bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
        }
    )
    offsets = later.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=TIMEOUT_S)
    later.close()
    assert sum(tp.offset for tp in offsets) == 2 * RECORDS


def test_describe_list_and_classic_members(kafka_cluster: LocalCluster) -> None:
    """ConsumerGroupDescribe and ListGroups show a consumer group; a classic member is refused."""
    topic, group = f"cd-{uuid.uuid4().hex[:8]}", f"cd-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": kafka_cluster.kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(TIMEOUT_S)
    events: list[Event] = []
    member = _member(kafka_cluster, group, topic, "a", events)
    _poll_until([member], lambda: len(member.owned) == 2, "the member owning both partitions")
    described = admin.describe_consumer_groups([group])[group].result(TIMEOUT_S)
    assert str(described.state).lower().endswith("stable"), described.state
    assert [m.client_id for m in described.members] == ["a"]
    assert sorted(tp.partition for tp in described.members[0].assignment.topic_partitions) == [0, 1]
    listed = admin.list_consumer_groups().result(TIMEOUT_S)
    assert group in {g.group_id for g in listed.valid}
    addresses = [node.kafka_address for node in kafka_cluster.nodes.values()]
    types: dict[str, set[str]] = {}
    for kind in ("consumer", "classic"):  # ListGroups v5 filters by type (each node lists what it leads).
        answers = [call(a, ListGroupsRequest(states_filter=(), types_filter=(kind,))) for a in addresses]
        types[kind] = {g.group_id for answer in answers for g in answer.groups}
    assert group in types["consumer"] and group not in types["classic"]
    classic_view = [
        call(a, DescribeGroupsRequest(groups=(GroupId(group),), include_authorized_operations=False))
        for a in addresses
    ]
    shown = [g for answer in classic_view for g in answer.groups if g.error_code == 0]
    assert [(g.group_state, g.protocol_type, len(g.members)) for g in shown] == [("Stable", "consumer", 1)]
    classic = Consumer(
        {
            "bootstrap.servers": kafka_cluster.kafka_bootstrap,
            "group.id": group,
            "group.protocol": "classic",
            "session.timeout.ms": 6000,
        }
    )
    errors: list[KafkaError] = []
    classic.subscribe([topic])
    deadline = time.monotonic() + TIMEOUT_S
    while not errors and time.monotonic() < deadline:
        member.poll()
        try:
            message = classic.poll(0.1)
        except KafkaException as error:
            errors.append(error.args[0])
            continue
        failure = None if message is None else message.error()
        if failure is not None:
            errors.append(failure)
    classic.close()
    assert errors and errors[0].code() == KafkaError.INCONSISTENT_GROUP_PROTOCOL, errors
    member.consumer.close()


def test_fuzzed_heartbeats_keep_nodes_up_and_partitions_single_owned(kafka_cluster: LocalCluster) -> None:
    """Structured random ConsumerGroupHeartbeats (odd epochs, ids, owned partitions, assignors,
    patterns) and ConsumerGroupDescribes to every node: no node dies or logs a traceback, and the
    group never shows one partition in two members' assignments."""
    topic, group = f"cf-{uuid.uuid4().hex[:8]}", f"cf-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": kafka_cluster.kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(TIMEOUT_S)
    found_id = admin.describe_topics(TopicCollection([topic]))[topic].result(TIMEOUT_S).topic_id
    most, least = found_id.get_most_significant_bits(), found_id.get_least_significant_bits()
    topic_id = uuid.UUID(int=((most % 2**64) << 64) | (least % 2**64))
    addresses = [node.kafka_address for node in kafka_cluster.nodes.values()]
    texts = st.sampled_from(["", "a", "b", "c", "x" * 300, "bad/name", topic])

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        owned = data.draw(
            st.none()
            | st.lists(
                st.builds(
                    HeartbeatTopic,
                    topic_id=st.sampled_from([topic_id, uuid.uuid4()]),
                    partitions=st.lists(st.integers(-1, 6).map(i32), max_size=4).map(tuple),
                ),
                max_size=2,
            ).map(tuple)
        )
        request: Any = HeartbeatRequest(
            group_id=GroupId(data.draw(st.sampled_from([group, group, "", "bad/group"]))),
            member_id=data.draw(st.sampled_from(["a", "b", "c", "", "x" * 300])),
            member_epoch=i32(data.draw(st.integers(-3, 8))),
            instance_id=data.draw(st.none() | texts),
            rack_id=data.draw(st.none() | texts),
            rebalance_timeout=i32Timedelta.parse(
                datetime.timedelta(milliseconds=data.draw(st.sampled_from([-1, 0, 30_000, 2**31 - 1])))
            ),
            subscribed_topic_names=data.draw(
                st.none() | st.lists(texts.map(TopicName), max_size=3).map(tuple)
            ),
            subscribed_topic_regex=data.draw(st.none() | st.sampled_from(["", "cf-.*", "(a+)+", "["])),
            server_assignor=data.draw(st.none() | st.sampled_from(["uniform", "range", "sticky", ""])),
            topic_partitions=owned,
        )
        if data.draw(st.booleans()):  # v0: the same fields but the regex (and member ids the broker makes).
            fields = {f.name: getattr(request, f.name) for f in dataclasses.fields(HeartbeatRequestV0)}
            request = HeartbeatRequestV0(**{**fields, "topic_partitions": _v0_owned(owned)})
        address = data.draw(st.sampled_from(addresses))
        with contextlib.suppress(OSError):  # A connection the broker closes is fine: the node matters.
            call(address, request, timeout_s=10.0)

    one()
    join = HeartbeatRequest(
        group_id=GroupId(f"{group}-interval"),
        member_id=uuid.uuid4().hex,
        member_epoch=i32(0),
        instance_id=None,
        rack_id=None,
        rebalance_timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        subscribed_topic_names=(TopicName(topic),),
        subscribed_topic_regex=None,
        server_assignor=None,
        topic_partitions=(),
    )
    answered = [call(address, join) for address in addresses]  # The coordinator's answer: the interval.
    assert [a.heartbeat_interval for a in answered if a.error_code == 0] == [
        datetime.timedelta(milliseconds=HEARTBEAT_INTERVAL_MS)
    ]
    for node_id in kafka_cluster.nodes:
        assert kafka_cluster.running(node_id)
        log = kafka_cluster.log_path(node_id).read_text(errors="replace")
        assert "CRITICAL" not in log and "Traceback" not in log, f"node {node_id}'s log: {log[-2000:]}"
    describe = DescribeRequest(group_ids=(GroupId(group),), include_authorized_operations=False)
    for address in addresses:
        described = call(address, describe)
        for found in described.groups:
            held = [
                (t.topic_name, p)
                for m in found.members
                for t in m.assignment.topic_partitions
                for p in t.partitions
            ]
            assert len(held) == len(set(held)), held


def _v0_owned(owned: tuple[HeartbeatTopic, ...] | None) -> tuple[HeartbeatTopicV0, ...] | None:
    if owned is None:
        return None
    return tuple(HeartbeatTopicV0(topic_id=t.topic_id, partitions=t.partitions) for t in owned)


def test_regex_subscription_is_assigned_matching_topics(kafka_cluster: LocalCluster) -> None:
    """A member subscribing by pattern (SubscribedTopicRegex, RE2 on kq) is assigned the matching topics."""
    prefix = f"rx{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": kafka_cluster.kafka_bootstrap})
    names = [f"{prefix}-a", f"{prefix}-b", f"other{prefix}"]
    for future in admin.create_topics([NewTopic(name, 2, 1) for name in names]).values():
        future.result(TIMEOUT_S)
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_cluster.kafka_bootstrap,
            "group.id": f"{prefix}-g",
            "group.protocol": "consumer",
        }
    )
    consumer.subscribe([f"^{prefix}-.*"])
    deadline = time.monotonic() + TIMEOUT_S
    while len(consumer.assignment()) < 4 and time.monotonic() < deadline:
        consumer.poll(0.1)
    assigned = sorted((tp.topic, tp.partition) for tp in consumer.assignment())
    consumer.close()
    assert assigned == [(name, p) for name in names[:2] for p in range(2)]


def test_a_leader_kill_keeps_the_group_and_its_owners(kafka_cluster: LocalCluster) -> None:
    """The group's state is replicated: after the coordinator (the leader) is killed, the members go on
    under the new leader with their epochs and partitions, a fourth joins, every record is consumed,
    no partition has two owners at a time, and the commits add up."""
    topic, group = f"ck-{uuid.uuid4().hex[:8]}", f"ck-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": kafka_cluster.kafka_bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(TIMEOUT_S)
    _produce(kafka_cluster, topic, 0, RECORDS)
    events: list[Event] = []
    members = [_member(kafka_cluster, group, topic, name, events) for name in ("a", "b", "c")]
    _poll_until(members, lambda: _all_owned(members) and all(len(m.owned) == 2 for m in members), "three")
    leader = kafka_cluster.wait_ready()
    kafka_cluster.kill_node(leader)
    kafka_cluster.wait_ready()
    kafka_cluster.start_node(leader)
    kafka_cluster.wait_ready()
    members.append(_member(kafka_cluster, group, topic, "d", events))
    _produce(kafka_cluster, topic, RECORDS, RECORDS)
    _poll_until(
        members,
        lambda: _all_owned(members)
        and all(len(m.owned) <= 2 for m in members)
        and len({v for m in members for v in m.values}) == 2 * RECORDS,
        "four members in balance, every record consumed",
    )
    _owners_never_overlap(events)
    _wait_for_commits(kafka_cluster, members, group, 2 * RECORDS)
    for member in members:
        member.consumer.close()
    with KqClient(kafka_cluster.bootstrap) as client:
        committed = client.committed_offsets(group)
    assert sum(committed.values()) == 2 * RECORDS
