"""Kafka's classic group protocol in apply: barrier, protocol and leader choice, sync, commits, static
members, kq/Kafka exclusion, and (hypothesis) random commands that never raise and replay identically."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kq.proto import kq_pb2
from kq.proto.limits import (
    GROUP_PROTOCOLS_MAX,
    MEMBER_ASSIGNMENT_BYTES_MAX,
    MEMBER_ID_LENGTH_MAX,
    MEMBER_METADATA_BYTES_MAX,
    PROTOCOL_NAME_LENGTH_MAX,
)
from kq.raft import commands, kafka_groups
from kq.raft.groups import load
from kq.raft.results import ApplyResult, ErrorCode, GroupResult, KafkaGroupResult, RejectedResult
from kq.raft.state_machine import apply
from kq.raft.validation import command_problem
from kq.storage import Store
from tests.raft.helpers import append, create

MAP_BYTES = 64 * 1024**2
OK = kafka_groups.NONE


class Log:
    """Applies commands to a store with increasing indexes."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.index = 0

    def run(self, command: kq_pb2.Command | bytes) -> ApplyResult:
        self.index += 1
        data = command if isinstance(command, bytes) else commands.encode(command)
        return apply(self.store, self.index, data)

    def code(self, command: kq_pb2.Command) -> int:
        result = self.run(command)
        assert isinstance(result, KafkaGroupResult), result
        return result.kafka_error

    def state(self, group: str = "g") -> kq_pb2.GroupState:
        with self.store.write() as writer:
            state = load(writer, group)
        assert state is not None
        return state


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    store = Store.open(tmp_path / "store", map_size_bytes=MAP_BYTES)
    result = Log(store)
    result.run(create("t", 6))
    result.run(append("t", 0, b"a", b"b", b"c"))
    yield result
    store.close()


def member(
    member_id: str, protocols: tuple[tuple[str, bytes], ...] = (("range", b"m"),), instance: str = ""
) -> kq_pb2.GroupMember:
    return kq_pb2.GroupMember(
        member_id=member_id,
        client_id="c",
        client_host="/127.0.0.1",
        group_instance_id=instance,
        session_timeout_ms=10_000,
        rebalance_timeout_ms=30_000,
        protocols=[kq_pb2.KafkaProtocol(name=name, metadata=data) for name, data in protocols],
    )


def join(
    member_id: str,
    protocols: tuple[tuple[str, bytes], ...] = (("range", b"m"),),
    instance: str = "",
    new: bool = False,
    protocol_type: str = "consumer",
) -> kq_pb2.Command:
    return commands.kafka_join_group("g", member(member_id, protocols, instance), protocol_type, 1_000, new)


def sync(member_id: str, generation: int, **assignments: bytes) -> kq_pb2.Command:
    given_ = [kq_pb2.KafkaAssignment(member_id=m, assignment=a) for m, a in assignments.items()]
    return commands.kafka_sync_group("g", member_id, generation, given_)


def commit(member_id: str, generation: int, offset: int = 1) -> kq_pb2.Command:
    entry = kq_pb2.OffsetEntry(topic="t", partition=0, offset=offset)
    return commands.commit_offsets("g", member_id, generation, [entry], 2_000, kafka=True)


def test_join_barrier_leader_and_sync(log: Log) -> None:
    """a alone: generation 1, leader a, awaiting sync; b joins → preparing until a rejoins → generation 2;
    the leader's sync stores each member's bytes and makes the group stable."""
    assert log.code(join("a")) == OK
    state = log.state()
    assert (state.generation, state.leader_member_id, state.protocol) == (1, "a", "range")
    assert kafka_groups.state_name(state) == kafka_groups.COMPLETING
    assert log.code(sync("a", 1, a=b"A")) == OK
    assert kafka_groups.state_name(log.state()) == kafka_groups.STABLE
    assert log.code(join("b")) == OK
    assert kafka_groups.state_name(log.state()) == kafka_groups.PREPARING
    assert log.code(commit("a", 1)) == OK  # The old generation commits while preparing.
    assert log.code(join("a")) == OK
    state = log.state()
    assert (state.generation, state.leader_member_id, state.awaiting_sync) == (2, "a", True)
    assert log.code(commit("a", 2)) == kafka_groups.REBALANCE_IN_PROGRESS  # Awaiting the leader's sync.
    assert log.code(sync("b", 2)) == OK  # A follower's sync changes nothing.
    assert log.state().awaiting_sync
    assert log.code(sync("a", 1, a=b"x")) == kafka_groups.ILLEGAL_GENERATION
    assert log.code(sync("a", 2, a=b"A2", b=b"B2")) == OK
    state = log.state()
    assert [(m.member_id, m.kafka_assignment) for m in state.members] == [("a", b"A2"), ("b", b"B2")]
    assert log.code(commit("b", 2)) == OK
    assert log.code(commit("b", 1)) == kafka_groups.ILLEGAL_GENERATION
    assert log.code(commit("z", 2)) == kafka_groups.UNKNOWN_MEMBER_ID
    assert log.code(commit("", 0)) == kafka_groups.UNKNOWN_MEMBER_ID  # Simple commits need no members.


def test_protocol_is_the_leaders_first_that_everyone_supports(log: Log) -> None:
    """Leader prefers sticky then range; b supports only range → range; c with neither is refused."""
    log.run(join("a", (("sticky", b"1"), ("range", b"2"))))
    log.run(join("b", (("range", b"3"),)))
    log.run(join("a", (("sticky", b"1"), ("range", b"2"))))
    state = log.state()
    assert (state.protocol, state.leader_member_id) == ("range", "a")
    assert log.code(join("c", (("roundrobin", b""),))) == kafka_groups.INCONSISTENT_GROUP_PROTOCOL
    assert log.code(join("c", (("range", b""),), protocol_type="connect")) == (
        kafka_groups.INCONSISTENT_GROUP_PROTOCOL
    )


def test_a_leaving_leader_hands_over_and_the_last_leave_empties(log: Log) -> None:
    """Leader a leaves: b (the first left) leads the next generation; b leaves: Empty, offsets stay."""
    log.run(join("a"))
    log.run(join("b"))
    log.run(join("a"))
    log.run(sync("a", 2))
    log.run(commit("a", 2))
    assert log.run(commands.leave_group("g", ["a"], 3_000)) == GroupResult(
        ErrorCode.OK, 2, kq_pb2.GROUP_REBALANCING
    )
    assert log.code(join("b")) == OK  # b must rejoin before the next generation.
    state = log.state()
    assert (state.leader_member_id, state.awaiting_sync, state.generation) == ("b", True, 3)
    log.run(commands.leave_group("g", ["b"], 4_000, expired=True))
    state = log.state()
    assert (kafka_groups.state_name(state), state.protocol_type, len(state.members)) == (
        "Empty",
        "consumer",
        0,
    )
    assert log.code(commit("", 0)) == OK  # Outside group management, now that it is empty.


def test_known_member_rejoining_unchanged_keeps_the_generation(log: Log) -> None:
    """A non-leader rejoining a stable group with the same metadata starts no rebalance; the leader does."""
    log.run(join("a"))
    log.run(join("b"))
    log.run(join("a"))
    log.run(sync("a", 2, a=b"A", b=b"B"))
    assert log.code(join("b")) == OK
    assert (log.state().generation, kafka_groups.state_name(log.state())) == (2, "Stable")
    assert log.code(join("b", (("range", b"changed"),))) == OK
    assert kafka_groups.state_name(log.state()) == "PreparingRebalance"


def test_static_member_replaced_without_rebalance_and_old_instance_fenced(log: Log) -> None:
    """KIP-345: instance i1 comes back under a new id with the same metadata: stable, same generation,
    its assignment and leadership kept; the old id is fenced; changed metadata rebalances."""
    log.run(join("a", instance="i1", new=True))
    log.run(sync("a", 1, a=b"A"))
    assert log.code(join("a2", instance="i1", new=True)) == OK
    state = log.state()
    assert (state.generation, kafka_groups.state_name(state), state.leader_member_id) == (1, "Stable", "a2")
    assert [(m.member_id, m.kafka_assignment) for m in state.members] == [("a2", b"A")]
    assert log.code(join("a", instance="i1")) == kafka_groups.FENCED_INSTANCE_ID
    assert log.code(join("a3", (("range", b"new"),), instance="i1", new=True)) == OK
    state = log.state()
    assert ([m.member_id for m in state.members], state.generation) == (["a3"], 2)


def test_kq_and_kafka_members_never_share_a_group(log: Log) -> None:
    """A Kafka join into a kq group with members is INCONSISTENT_GROUP_PROTOCOL, the reverse
    GROUP_HAS_MEMBERS; once empty, either kind may take the group over, offsets kept."""
    kq_member = kq_pb2.GroupMember(
        member_id="k", topics=["t"], session_timeout_ms=10_000, rebalance_timeout_ms=30_000
    )
    assert log.run(commands.join_group("g", kq_member, "range", 1)).error == ErrorCode.OK  # type: ignore[union-attr]
    assert log.code(join("a")) == kafka_groups.INCONSISTENT_GROUP_PROTOCOL
    log.run(commands.commit_offsets("g", "k", 1, [kq_pb2.OffsetEntry(topic="t", partition=0, offset=2)], 2))
    log.run(commands.leave_group("g", ["k"], 3))
    assert log.code(join("a")) == OK
    kq_member.member_id = "k2"
    assert log.run(commands.join_group("g", kq_member, "range", 4)).error == ErrorCode.GROUP_HAS_MEMBERS  # type: ignore[union-attr]
    with log.store.read() as reader:
        assert [offset for _, _, offset, _ in reader.committed_offsets("g")] == [2]


def test_commit_to_unknown_partition_or_beyond_the_end(log: Log) -> None:
    """Offsets are checked against the topics in apply: Kafka's codes, nothing written."""
    assert log.code(commit("", 0, offset=99)) == kafka_groups.OFFSET_OUT_OF_RANGE
    bad = commands.commit_offsets("g", "", 0, [kq_pb2.OffsetEntry(topic="u", partition=0)], 1, kafka=True)
    assert log.code(bad) == kafka_groups.UNKNOWN_TOPIC_OR_PARTITION
    with log.store.read() as reader:
        assert reader.committed_offsets("g") == []


def test_shared_validation_refuses_out_of_limit_fields() -> None:
    """Every new field has a named limit, checked by the function the edge and apply share."""
    too_long_id = join("x" * (MEMBER_ID_LENGTH_MAX + 1))
    too_many = join("a", tuple((f"p{i}", b"") for i in range(GROUP_PROTOCOLS_MAX + 1)))
    big_metadata = join("a", (("range", b"x" * (MEMBER_METADATA_BYTES_MAX + 1)),))
    long_name = join("a", (("p" * (PROTOCOL_NAME_LENGTH_MAX + 1), b""),))
    repeated = join("a", (("range", b""), ("range", b"")))
    no_type = join("a", protocol_type="")
    bad_instance = join("a", instance="not/legal")
    big_assignment = sync("a", 1, a=b"x" * (MEMBER_ASSIGNMENT_BYTES_MAX + 1))
    for command in (
        too_long_id,
        too_many,
        big_metadata,
        long_name,
        repeated,
        no_type,
        bad_instance,
        big_assignment,
    ):
        assert command_problem(command) is not None
    assert command_problem(join("a", instance="i-1.x")) is None


# Hypothesis: random Kafka group commands --------------------------------------------------------

member_ids = st.sampled_from(["a", "b", "c", "", "x" * (MEMBER_ID_LENGTH_MAX + 1)])
protocol_lists = st.lists(
    st.tuples(st.sampled_from(["range", "sticky", "roundrobin", ""]), st.binary(max_size=8)), max_size=3
)


@st.composite
def kafka_commands(draw: st.DrawFn) -> kq_pb2.Command:
    kind = draw(st.sampled_from(["join", "join", "sync", "leave", "commit", "kq_join"]))
    group = draw(st.sampled_from(["g", "g", "h", ""]))
    if kind == "join":
        joining = member(
            draw(member_ids), tuple(draw(protocol_lists)), draw(st.sampled_from(["", "i1", "i/2"]))
        )
        joining.session_timeout_ms = draw(st.sampled_from([0, 10_000]))
        if draw(st.booleans()):
            joining.kafka_assignment = b"sneaky"
        protocol_type = draw(st.sampled_from(["consumer", "connect", ""]))
        return commands.kafka_join_group(
            group, joining, protocol_type, draw(st.integers(0, 10)), draw(st.booleans())
        )
    if kind == "sync":
        assignments = [
            kq_pb2.KafkaAssignment(member_id=draw(member_ids), assignment=draw(st.binary(max_size=8)))
            for _ in range(draw(st.integers(0, 3)))
        ]
        return commands.kafka_sync_group(group, draw(member_ids), draw(st.integers(0, 4)), assignments)
    if kind == "leave":
        return commands.leave_group(group, draw(st.lists(member_ids, max_size=2)), 5, draw(st.booleans()))
    if kind == "commit":
        entry = kq_pb2.OffsetEntry(
            topic="t", partition=draw(st.integers(0, 7)), offset=draw(st.integers(0, 5))
        )
        return commands.commit_offsets(
            group, draw(member_ids), draw(st.integers(0, 4)), [entry], 6, kafka=True
        )
    kq_member = kq_pb2.GroupMember(
        member_id=draw(member_ids), topics=["t"], session_timeout_ms=10_000, rebalance_timeout_ms=30_000
    )
    return commands.join_group(group, kq_member, "range", 7)


@contextmanager
def stores(count: int) -> Iterator[list[Store]]:
    with tempfile.TemporaryDirectory() as directory:
        opened = [Store.open(Path(directory) / str(i), map_size_bytes=MAP_BYTES) for i in range(count)]
        try:
            yield opened
        finally:
            for store in opened:
                store.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(kafka_commands(), min_size=1, max_size=25))
def test_random_kafka_group_commands_never_raise_and_replicas_agree(fuzzed: list[kq_pb2.Command]) -> None:
    """Two replicas apply the same random commands: identical results and bytes; only what the shared
    validation refuses is rejected (so apply never raised), and each group stays within its invariants."""
    with stores(2) as (left, right):
        setup = [create("t", 3), append("t", 0, b"a", b"b")]
        for store in (left, right):
            for index, data in enumerate(setup, start=1):
                apply(store, index, data)
        for index, command in enumerate(fuzzed, start=len(setup) + 1):
            data = commands.encode(command)
            results = [apply(store, index, data) for store in (left, right)]
            assert results[0] == results[1]
            refused = command_problem(command)
            assert isinstance(results[0], RejectedResult) == (refused is not None), (results[0], refused)
        assert left.dump() == right.dump()
        with left.read() as reader:
            assert reader.rejected_entries() == sum(command_problem(c) is not None for c in fuzzed)
            for _, raw in reader.groups():
                state = kq_pb2.GroupState()
                state.ParseFromString(raw)
                ids = [m.member_id for m in state.members]
                assert len(ids) == len(set(ids))
                if state.members and state.protocol_type and state.phase != kq_pb2.GROUP_REBALANCING:
                    assert state.leader_member_id in ids
                if state.awaiting_sync or (state.phase == kq_pb2.GROUP_STABLE and state.protocol_type):
                    assert state.protocol and state.leader_member_id in ids
