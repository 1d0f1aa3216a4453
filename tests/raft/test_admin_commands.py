"""The admin commands of Kafka's admin APIs in apply: OffsetDelete (a group's offsets of some
partitions, refused alike when a group with members moved on) and a topic's partitions grown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kq.proto import kq_pb2
from kq.raft import commands
from kq.raft.results import ApplyResult, ErrorCode, GroupResult, TopicResult
from kq.raft.state_machine import apply
from kq.storage import Store
from tests.raft.helpers import append, create

MAP_BYTES = 64 * 1024**2


class Log:
    """Applies encoded commands to a store with increasing indexes."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.index = 0

    def run(self, command: kq_pb2.Command | bytes) -> ApplyResult:
        self.index += 1
        data = command if isinstance(command, bytes) else commands.encode(command)
        return apply(self.store, self.index, data)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    store = Store.open(tmp_path / "store", map_size_bytes=MAP_BYTES)
    try:
        yield Log(store)
    finally:
        store.close()


def committed(log: Log, group: str) -> set[tuple[int, int]]:
    with log.store.read() as reader:
        return {(topic_id, partition) for topic_id, partition, _, _ in reader.committed_offsets(group)}


def test_offset_delete_forgets_the_named_offsets_unless_a_group_with_members_moved(log: Log) -> None:
    """OffsetDelete removes exactly the named partitions' offsets (an unknown topic is skipped); with
    members, a generation or phase other than the group's is STALE_GENERATION and deletes nothing; an
    unknown group is UNKNOWN_GROUP."""
    log.run(create("a", 2))
    log.run(append("a", 0, b"x", b"y"))
    log.run(append("a", 1, b"x"))
    entries = [kq_pb2.OffsetEntry(topic="a", partition=p, offset=1) for p in (0, 1)]
    log.run(commands.commit_offsets("g", "", 0, entries, 5))
    assert committed(log, "g") == {(1, 0), (1, 1)}
    gone = [kq_pb2.TopicPartition(topic="a", partition=0), kq_pb2.TopicPartition(topic="nope", partition=0)]
    result = log.run(commands.offset_delete("g", gone, 0, 0))
    assert isinstance(result, GroupResult) and result.error == ErrorCode.OK
    assert committed(log, "g") == {(1, 1)}
    missing = log.run(commands.offset_delete("other", gone, 0, 0))
    assert isinstance(missing, GroupResult) and missing.error == ErrorCode.UNKNOWN_GROUP

    member = kq_pb2.GroupMember(
        member_id="m1", topics=["a"], session_timeout_ms=10_000, rebalance_timeout_ms=30_000
    )
    joined = log.run(commands.join_group("g", member, "range", 6))
    assert isinstance(joined, GroupResult)
    rest = [kq_pb2.TopicPartition(topic="a", partition=1)]
    stale = log.run(commands.offset_delete("g", rest, joined.generation + 1, joined.phase))
    assert isinstance(stale, GroupResult) and stale.error == ErrorCode.STALE_GENERATION
    assert committed(log, "g") == {(1, 1)}
    current = log.run(commands.offset_delete("g", rest, joined.generation, joined.phase))
    assert isinstance(current, GroupResult) and current.error == ErrorCode.OK
    assert committed(log, "g") == set()


def test_grow_partitions_adds_empty_partitions_and_refuses_what_does_not_grow(log: Log) -> None:
    """A grow adds empty partitions after the existing ones (their records stay); a count that does
    not grow is INVALID_COMMAND and a copy's grow of another id UNKNOWN_TOPIC, both changing nothing."""
    log.run(create("t", 2))
    log.run(append("t", 1, b"x", b"y"))
    grown = log.run(commands.grow_partitions("t", 4))
    assert isinstance(grown, TopicResult) and grown.error == ErrorCode.OK
    assert grown.topic is not None and grown.topic.partitions == 4
    same = log.run(commands.grow_partitions("t", 4))
    assert isinstance(same, TopicResult) and same.error == ErrorCode.INVALID_COMMAND
    other = log.run(commands.grow_partitions("t", 9, topic_id=77))
    assert isinstance(other, TopicResult) and other.error == ErrorCode.UNKNOWN_TOPIC
    with log.store.read() as reader:
        topic = reader.topic("t")
        assert topic is not None and topic.partitions == 4
        ends = [reader.partition(topic.topic_id, p) for p in range(5)]
    assert [None if end is None else end.log_end_offset for end in ends] == [0, 2, 0, 0, None]
