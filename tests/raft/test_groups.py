"""Group commands in apply: the rebalance barrier, generations, commit checks, and replay determinism."""

from __future__ import annotations

from pathlib import Path

import pytest

from kq.proto import kq_pb2
from kq.raft import commands
from kq.raft.groups import load
from kq.raft.results import ErrorCode, GroupResult
from kq.raft.state_machine import apply
from kq.storage import Store
from tests.raft.helpers import append, create


class Log:
    """Applies commands to a store with increasing indexes."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.index = 0

    def run(self, command: kq_pb2.Command | bytes) -> GroupResult:
        self.index += 1
        data = command if isinstance(command, bytes) else commands.encode(command)
        result = apply(self.store, self.index, data)
        assert isinstance(result, GroupResult) or isinstance(data, bytes)
        return result  # type: ignore[return-value]

    def state(self, group: str = "g") -> kq_pb2.GroupState:
        with self.store.write() as writer:
            state = load(writer, group)
        assert state is not None
        return state


def member(member_id: str, topics: tuple[str, ...] = ("t",)) -> kq_pb2.GroupMember:
    return kq_pb2.GroupMember(
        member_id=member_id, topics=topics, session_timeout_ms=10_000, rebalance_timeout_ms=30_000
    )


def join(member_id: str, topics: tuple[str, ...] = ("t",)) -> kq_pb2.Command:
    return commands.join_group("g", member(member_id, topics), "range", 1_000)


def commit(member_id: str, generation: int, offset: int = 1) -> kq_pb2.Command:
    entry = kq_pb2.OffsetEntry(topic="t", partition=0, offset=offset)
    return commands.commit_offsets("g", member_id, generation, [entry], 2_000)


@pytest.fixture
def log(tmp_path: Path) -> Log:
    result = Log(Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2))
    result.run(create("t", 6))
    result.run(append("t", 0, b"a", b"b", b"c"))
    return result


def assignment(state: kq_pb2.GroupState) -> dict[str, list[int]]:
    return {m.member_id: [tp.partition for tp in m.assignment] for m in state.members}


def test_first_member_gets_everything_and_a_second_waits_for_the_barrier(log: Log) -> None:
    """Join 1 → stable gen 1 with all partitions; join 2 → rebalancing until 1 rejoins → gen 2, 3/3."""
    assert log.run(join("a")) == GroupResult(ErrorCode.OK, 1, kq_pb2.GROUP_STABLE)
    assert assignment(log.state()) == {"a": [0, 1, 2, 3, 4, 5]}
    assert log.run(join("b")) == GroupResult(ErrorCode.OK, 1, kq_pb2.GROUP_REBALANCING)
    assert log.run(commit("a", 1)).error == ErrorCode.OK  # Commits of the old generation go through.
    assert log.run(join("a")) == GroupResult(ErrorCode.OK, 2, kq_pb2.GROUP_STABLE)
    assert assignment(log.state()) == {"a": [0, 1, 2], "b": [3, 4, 5]}


def test_stale_generation_and_unknown_member_commits_are_rejected(log: Log) -> None:
    """After a rebalance the old generation's commit and a stranger's commit are refused, unwritten."""
    log.run(join("a"))
    log.run(join("b"))
    log.run(join("a"))
    assert log.run(commit("a", 1)).error == ErrorCode.STALE_GENERATION
    assert log.run(commit("zz", 2)).error == ErrorCode.UNKNOWN_MEMBER
    with log.store.read() as reader:
        assert reader.committed_offsets("g") == []
    assert log.run(commit("a", 2, offset=3)).error == ErrorCode.OK
    assert log.run(commit("a", 2, offset=4)).error == ErrorCode.OFFSET_OUT_OF_RANGE  # Beyond the log end.


def test_leaving_or_expiring_moves_partitions_to_the_others(log: Log) -> None:
    """A member that leaves (or is expired) triggers a rebalance the others complete by rejoining."""
    for step in (join("a"), join("b"), join("a"), join("c"), join("a"), join("b")):
        log.run(step)
    assert log.state().phase == kq_pb2.GROUP_STABLE and len(log.state().members) == 3
    assert log.run(commands.leave_group("g", ["c"], 3_000, expired=True)).phase == kq_pb2.GROUP_REBALANCING
    log.run(join("a"))
    assert log.run(join("b")) == GroupResult(ErrorCode.OK, 4, kq_pb2.GROUP_STABLE)
    assert assignment(log.state()) == {"a": [0, 1, 2], "b": [3, 4, 5]}
    log.run(commands.leave_group("g", ["a", "b"], 4_000))
    assert log.state().phase == kq_pb2.GROUP_EMPTY


def test_reset_and_delete_need_an_empty_group(log: Log) -> None:
    """Reset and delete are refused while members are active and allowed once they are gone."""
    log.run(join("a"))
    entry = kq_pb2.OffsetEntry(topic="t", partition=0, offset=0)
    assert log.run(commands.reset_offsets("g", [entry])).error == ErrorCode.GROUP_HAS_MEMBERS
    assert log.run(commands.delete_group("g")).error == ErrorCode.GROUP_HAS_MEMBERS
    assert log.run(commit("", 0)).error == ErrorCode.GROUP_HAS_MEMBERS
    log.run(commands.leave_group("g", ["a"], 5_000))
    assert log.run(commands.reset_offsets("g", [entry])).error == ErrorCode.OK
    assert log.run(commands.delete_group("g")).error == ErrorCode.OK
    with log.store.read() as reader:
        assert reader.group("g") is None and reader.committed_offsets("g") == []


def test_group_log_replays_identically(tmp_path: Path) -> None:
    """Two replicas applying the same group history end byte-identical with the same results."""
    history: list[kq_pb2.Command | bytes] = [create("t", 4), join("a"), join("b"), commit("a", 1), join("a")]
    history += [commit("b", 2)]
    history += [commands.leave_group("g", ["a"], 9, expired=True), join("b", ("t", "u"))]
    stores = [Store.open(tmp_path / name, map_size_bytes=64 * 1024**2) for name in ("left", "right")]
    results = []
    for store in stores:
        replica = Log(store)
        results.append([replica.run(step) for step in history])
    assert results[0] == results[1]
    assert stores[0].dump() == stores[1].dump()


def test_pattern_subscription_matches_existing_topics_in_full(log: Log) -> None:
    """A pattern subscribes to every topic whose whole name matches it, resolved at the rebalance."""
    log.run(create("tx", 2))
    log.run(create("other", 2))
    patterned = kq_pb2.GroupMember(
        member_id="p", topic_pattern="t.*", session_timeout_ms=10_000, rebalance_timeout_ms=30_000
    )
    log.run(commands.join_group("g", patterned, "roundrobin", 1_000))
    owned = {(tp.topic, tp.partition) for tp in log.state().members[0].assignment}
    assert owned == {("t", p) for p in range(6)} | {("tx", 0), ("tx", 1)}
