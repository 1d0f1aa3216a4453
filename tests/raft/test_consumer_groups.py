"""Kafka's consumer-group protocol (KIP-848) in apply: epochs, target assignment, cooperative
reconciliation (a partition changes owner only after its revocation), fencing, leaving, the
classic/consumer exclusion, commits by member epoch, and (hypothesis) random heartbeats that never
raise, replay identically and never give one partition to two members."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kq.proto import kq_pb2
from kq.proto.limits import CONSUMER_SESSION_TIMEOUT_MS
from kq.raft import commands, consumer_groups
from kq.raft.consumer_groups import pairs
from kq.raft.results import RejectedResult
from kq.raft.state_machine import apply
from kq.raft.validation import command_problem
from kq.storage import Store
from tests.raft.helpers import append, create
from tests.raft.test_groups_kafka import MAP_BYTES, Log, join, member

OK = consumer_groups.NONE
Owned = list[tuple[str, int]] | None


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    store = Store.open(tmp_path / "store", map_size_bytes=MAP_BYTES)
    result = Log(store)
    result.run(create("t", 6))
    result.run(append("t", 0, b"a", b"b", b"c"))
    yield result
    store.close()


def beat(
    member_id: str,
    epoch: int,
    owned: Owned = None,
    topics: tuple[str, ...] | None = None,
    assignor: str = "",
    instance: str = "",
    group: str = "g",
) -> kq_pb2.Command:
    member = kq_pb2.GroupMember(
        member_id=member_id,
        client_id="c",
        client_host="/127.0.0.1",
        group_instance_id=instance,
        session_timeout_ms=CONSUMER_SESSION_TIMEOUT_MS,
        rebalance_timeout_ms=30_000 if epoch == 0 else 0,
        server_assignor=assignor,
        topics=topics or (),
    )
    listed = None if owned is None else [kq_pb2.TopicPartition(topic=t, partition=p) for t, p in owned]
    return commands.consumer_heartbeat(group, member, epoch, 1_000, topics is not None, listed)


def mine(log: Log, member_id: str) -> kq_pb2.GroupMember:
    found = consumer_groups.find(log.state(), member_id)
    assert found is not None
    return found


def settle(log: Log, member_ids: list[str], rounds: int = 6) -> None:
    """Every member heartbeats with what it owns, a few rounds: the group reconciles fully."""
    for _ in range(rounds):
        for member_id in member_ids:
            current = mine(log, member_id)
            assert log.code(beat(member_id, current.member_epoch, pairs(current.assignment))) == OK
    check_disjoint(log.state())


def check_disjoint(state: kq_pb2.GroupState) -> None:
    held: list[tuple[str, int]] = []
    for each in state.members:
        held += pairs(each.assignment) + pairs(each.revoking)
    assert len(held) == len(set(held)), held


def test_members_join_and_reconcile_cooperatively(log: Log) -> None:
    """A joiner bumps the group epoch; others revoke first, and only then does it get their partitions."""
    assert log.code(beat("a", 0, [], topics=("t",))) == OK
    state = log.state()
    assert state.type == kq_pb2.GROUP_TYPE_CONSUMER and state.generation == state.assignment_epoch == 1
    assert pairs(mine(log, "a").assignment) == [("t", p) for p in range(6)]
    assert mine(log, "a").member_epoch == 1
    assert consumer_groups.state_name(log.state()) == consumer_groups.STABLE
    assert log.code(beat("b", 0, [], topics=("t",))) == OK
    b = mine(log, "b")
    assert b.member_epoch == 2 and not b.assignment and len(b.target) == 3  # All still owned by a.
    assert b.member_state == kq_pb2.CONSUMER_MEMBER_UNRELEASED_PARTITIONS
    assert consumer_groups.state_name(log.state()) == consumer_groups.RECONCILING
    assert log.code(beat("a", 1, [("t", p) for p in range(6)])) == OK
    a = mine(log, "a")
    assert a.member_state == kq_pb2.CONSUMER_MEMBER_UNREVOKED_PARTITIONS and a.member_epoch == 1
    assert len(a.assignment) == 3 and len(a.revoking) == 3
    assert log.code(beat("b", 2, [])) == OK
    assert not mine(log, "b").assignment  # a has not revoked yet.
    assert log.code(beat("a", 1, pairs(a.assignment))) == OK  # Revoked.
    assert mine(log, "a").member_epoch == 2 and not mine(log, "a").revoking
    assert log.code(beat("b", 2, [])) == OK
    assert pairs(mine(log, "b").assignment) == pairs(mine(log, "b").target)
    assert consumer_groups.state_name(log.state()) == consumer_groups.STABLE
    check_disjoint(log.state())


def test_leave_frees_partitions_and_three_members_balance(log: Log) -> None:
    """Three members share six partitions two each; one leaves, the other two take its share."""
    for member_id in ("a", "b", "c"):
        assert log.code(beat(member_id, 0, [], topics=("t",))) == OK
    settle(log, ["a", "b", "c"])
    assert [len(m.assignment) for m in log.state().members] == [2, 2, 2]
    assert log.code(beat("b", -1)) == OK
    settle(log, ["a", "c"])
    assert sorted(len(m.assignment) for m in log.state().members) == [3, 3]
    assert log.code(beat("b", -1)) == consumer_groups.UNKNOWN_MEMBER_ID


def test_epochs_fence_and_unknown_members(log: Log) -> None:
    """A wrong epoch is FENCED_MEMBER_EPOCH; the previous epoch with owned partitions it was given is not."""
    assert log.code(beat("a", 0, [], topics=("t",))) == OK
    assert log.code(beat("a", 5, [])) == consumer_groups.FENCED_MEMBER_EPOCH
    assert log.code(beat("zz", 1, [])) == consumer_groups.UNKNOWN_MEMBER_ID
    assert log.code(beat("b", 0, [], topics=("t",))) == OK
    settle(log, ["a", "b"])
    a = mine(log, "a")
    assert log.code(beat("a", a.previous_member_epoch, pairs(a.assignment))) == OK
    assert log.code(beat("a", a.previous_member_epoch, [("t", p) for p in range(6)])) == (
        consumer_groups.FENCED_MEMBER_EPOCH
    )


def test_assignors_and_unknown_topics(log: Log) -> None:
    """The group's assignor is the members' choice ("range": contiguous); unknown topics assign nothing."""
    assert log.code(beat("a", 0, [], topics=("t", "nope"), assignor="range")) == OK
    assert log.code(beat("b", 0, [], topics=("t",), assignor="range")) == OK
    state = log.state()
    assert state.assignor == "range"
    assert pairs(mine(log, "a").target) == [("t", 0), ("t", 1), ("t", 2)]
    assert [(s.topic, s.partitions) for s in state.subscribed_sizes] == [("t", 6)]


def test_static_instance_ids(log: Log) -> None:
    """An instance id held by a live member is UNRELEASED_INSTANCE_ID to another; a mismatch fences; a
    static member leaving with -2 keeps its partitions for its next instance, without a new epoch."""
    assert log.code(beat("a", 0, [], topics=("t",), instance="i1")) == OK
    assert log.code(beat("c", 0, [], topics=("t",))) == OK
    settle(log, ["a", "c"])
    assert log.code(beat("b", 0, [], topics=("t",), instance="i1")) == consumer_groups.UNRELEASED_INSTANCE_ID
    a = mine(log, "a")
    assert log.code(beat("a", a.member_epoch, [], instance="i2")) == consumer_groups.FENCED_INSTANCE_ID
    epoch = log.state().generation
    assert log.code(beat("a", -2, instance="i1")) == OK
    assert mine(log, "a").static_left and pairs(mine(log, "a").assignment) == pairs(a.assignment)
    assert log.code(beat("a", a.member_epoch, [])) == consumer_groups.UNKNOWN_MEMBER_ID
    settle(log, ["c"])
    assert len(mine(log, "c").assignment) == 3  # a's partitions stay a's while it is away.
    assert log.code(beat("b", 0, [], topics=("t",), instance="i1")) == OK
    b = mine(log, "b")
    assert consumer_groups.find(log.state(), "a") is None and log.state().generation == epoch
    assert pairs(b.assignment) == pairs(a.assignment) and b.member_epoch == a.member_epoch
    settle(log, ["b", "c"])


def test_classic_and_consumer_groups_exclude_each_other(log: Log) -> None:
    """A classic group with members is GROUP_ID_NOT_FOUND to a heartbeat, a consumer group with members
    INCONSISTENT_GROUP_PROTOCOL to a JoinGroup; empty groups change protocol, offsets kept."""
    assert log.code(join("x")) == OK
    assert log.code(beat("a", 0, [], topics=("t",))) == consumer_groups.GROUP_ID_NOT_FOUND
    assert log.code(beat("a", 0, [], topics=("t",), group="h")) == OK
    assert log.code(classic_join("x", "h")) == 23
    assert log.code(commands.commit_offsets("h", "a", 7, [offset(2)], 5, kafka=True)) == (
        consumer_groups.STALE_MEMBER_EPOCH
    )
    assert log.code(commands.commit_offsets("h", "a", 1, [offset(2)], 5, kafka=True)) == OK
    assert log.code(beat("a", -1, group="h")) == OK
    assert log.code(classic_join("x", "h")) == OK
    state = log.state("h")
    assert state.type == kq_pb2.GROUP_TYPE_CLASSIC and state.protocol_type == "consumer"


def classic_join(member_id: str, group: str) -> kq_pb2.Command:
    return commands.kafka_join_group(group, member(member_id), "consumer", 1_000, False)


def offset(value: int) -> kq_pb2.OffsetEntry:
    return kq_pb2.OffsetEntry(topic="t", partition=0, offset=value)


def test_expiry_through_leave_group_reassigns(log: Log) -> None:
    """The coordinator's LeaveGroup(expired) removes a consumer member; the rest get a new target."""
    for member_id in ("a", "b"):
        assert log.code(beat(member_id, 0, [], topics=("t",))) == OK
    settle(log, ["a", "b"])
    epoch = log.state().generation
    result = log.run(commands.leave_group("g", ["b"], 9, expired=True))
    assert not isinstance(result, RejectedResult)
    assert log.state().generation == epoch + 1
    settle(log, ["a"])
    assert len(mine(log, "a").assignment) == 6


def test_validation_refuses_malformed_heartbeats() -> None:
    """The shared validation: epochs below -2, unknown assignors, kq-only fields, names."""
    assert command_problem(beat("a", 0, [], topics=("t",))) is None
    assert command_problem(beat("a", -3)) is not None
    assert command_problem(beat("a", 0, [], topics=("t",), assignor="sticky")) is not None
    assert command_problem(beat("", 0, [], topics=("t",))) is not None
    assert command_problem(beat("a", 0, [], topics=("bad/name",))) is not None
    sneaky = beat("a", 1, [])
    sneaky.consumer_heartbeat.member.member_epoch = 3
    assert command_problem(sneaky) is not None


# Hypothesis: random heartbeats ------------------------------------------------------------------

member_ids = st.sampled_from(["a", "b", "c", "d"])
instances = st.sampled_from(["", "", "i1", "i2"])


@st.composite
def heartbeats(draw: st.DrawFn) -> kq_pb2.Command:
    kinds = ["beat", "beat", "beat", "join", "leave", "expire", "commit", "classic", "hostile"]
    kind = draw(st.sampled_from(kinds))
    member_id = draw(member_ids)
    if kind == "hostile":
        return hostile(draw)
    if kind == "join":
        topics = tuple(draw(st.lists(st.sampled_from(["t", "u", "none"]), max_size=2)))
        assignor = draw(st.sampled_from(["", "uniform", "range"]))
        return beat(member_id, 0, [], topics=topics, assignor=assignor, instance=draw(instances))
    if kind == "leave":
        return beat(member_id, draw(st.sampled_from([-1, -2])), instance=draw(instances))
    if kind == "expire":
        return commands.leave_group("g", [member_id], 5, expired=True)
    if kind == "commit":
        return commands.commit_offsets("g", member_id, draw(st.integers(0, 6)), [offset(1)], 6, kafka=True)
    if kind == "classic":
        return join(member_id)
    owned = draw(st.lists(st.tuples(st.sampled_from(["t", "u"]), st.integers(0, 5)), max_size=6, unique=True))
    return beat(member_id, draw(st.integers(-3, 6)), draw(st.sampled_from([None, owned])))


def hostile(draw: st.DrawFn) -> kq_pb2.Command:
    """A heartbeat command with odd values anywhere: what validation must refuse, or apply survive."""
    text = st.sampled_from(["", "a", "t", "u", "bad/name", "x" * 300, "é", "(a+)+", "[", ".*"])
    command = beat(draw(text), draw(st.integers(-(2**31), 2**31 - 1)), group=draw(text))
    heartbeat = command.consumer_heartbeat
    heartbeat.subscription_set = draw(st.booleans())
    heartbeat.owned_set = draw(st.booleans())
    heartbeat.owned.extend(
        kq_pb2.TopicPartition(topic=draw(text), partition=draw(st.integers(0, 2**32 - 1)))
        for _ in range(draw(st.integers(0, 3)))
    )
    member = heartbeat.member
    member.topics.extend(draw(st.lists(text, max_size=3)))
    member.topic_pattern = draw(text)
    member.server_assignor = draw(st.sampled_from(["", "uniform", "range", "sticky", "x" * 300]))
    member.group_instance_id = draw(text)
    member.rack_id = draw(text)
    member.session_timeout_ms = draw(st.sampled_from([0, 1, CONSUMER_SESSION_TIMEOUT_MS, 2**32 - 1]))
    member.rebalance_timeout_ms = draw(st.sampled_from([0, 1, 30_000, 2**32 - 1]))
    if draw(st.booleans()):
        member.member_epoch = draw(st.integers(0, 2**32 - 1))
        member.target.add(topic="t", partition=0)
    return command


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(heartbeats(), min_size=1, max_size=40))
def test_random_heartbeats_never_raise_replicas_agree_and_never_share_a_partition(
    fuzzed: list[kq_pb2.Command],
) -> None:
    """Two replicas apply the same random commands: identical results and bytes, only what validation
    refuses is rejected, and no partition is ever held by two members (owned or being revoked)."""
    with tempfile.TemporaryDirectory() as directory:
        left, right = (Store.open(Path(directory) / name, map_size_bytes=MAP_BYTES) for name in "lr")
        try:
            setup = [create("t", 4), create("u", 2), append("t", 0, b"a", b"b")]
            for store in (left, right):
                for index, data in enumerate(setup, start=1):
                    apply(store, index, data)
            for index, command in enumerate(fuzzed, start=len(setup) + 1):
                data = commands.encode(command)
                results = [apply(store, index, data) for store in (left, right)]
                assert results[0] == results[1]
                refused = command_problem(command)
                assert isinstance(results[0], RejectedResult) == (refused is not None), (results[0], refused)
                with left.read() as reader:
                    raw = reader.group("g")
                if raw is not None:
                    state = kq_pb2.GroupState.FromString(raw)
                    check_disjoint(state)
                    if consumer_groups.is_consumer_group(state):
                        assert state.assignment_epoch == state.generation
            assert left.dump() == right.dump()
        finally:
            left.close()
            right.close()


def test_a_steady_heartbeat_changes_nothing(log: Log) -> None:
    """What the edge relies on to answer without a Raft entry: on a settled group, a member's heartbeat
    (with or without its owned partitions) leaves the state byte-identical."""
    for member_id in ("a", "b"):
        assert log.code(beat(member_id, 0, [], topics=("t",))) == OK
    settle(log, ["a", "b"])
    state = log.state()
    catalog = {"t": 6}
    for owned in (None, pairs(mine(log, "a").assignment)):
        copy = kq_pb2.GroupState()
        copy.CopyFrom(state)
        command = beat("a", mine(log, "a").member_epoch, owned).consumer_heartbeat
        assert consumer_groups.heartbeat(copy, command, catalog) == OK
        assert copy.SerializeToString(deterministic=True) == state.SerializeToString(deterministic=True)
