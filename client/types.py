"""Plain values the client returns: topics, partitions, records, cluster status."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, overload


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic's name, partition count and id."""

    name: str
    partitions: int
    topic_id: int
    created_ms: int


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """A partition's log start (first offset held) and end (offset the next record gets)."""

    partition: int
    log_start_offset: int
    log_end_offset: int
    size_bytes: int = 0
    group: int = 0  # The Raft group that holds it (0 in a cluster of one group).


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """A topic and its partitions as one node sees them."""

    topic: TopicInfo
    partitions: tuple[PartitionOffsets, ...]
    served_by: str
    applied_index: int
    configs: tuple[TopicConfigValue, ...] = ()  # Every config in effect, sorted by name.


@dataclass(frozen=True, slots=True)
class TopicConfigValue:
    """One topic config in effect, by Kafka's name; `is_default` when the topic has no override."""

    name: str
    value: str
    is_default: bool


@dataclass(frozen=True, slots=True)
class ProducerRecord:
    """A record to send (kafka-python's names)."""

    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None
    partition: int | None = None


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where an acknowledged record was written."""

    topic: str
    partition: int
    offset: int
    duplicate: bool = False
    index: int = 0  # Raft index of the entry; pass as min_index to read your writes from a follower.


class ProducedBatch(Sequence[RecordMetadata]):
    """Where a batch's records were written: one `RecordMetadata` a record, built when asked.

    The broker stores a batch's records at consecutive offsets under one Raft index, so five numbers
    say where all of them are. A list of a dataclass a record took about half of a Spark sink
    worker's Python time (4,766 records a request); this is O(1) whatever the batch holds.
    """

    __slots__ = ("base_offset", "duplicate", "partition", "raft_index", "record_count", "topic")

    def __init__(
        self,
        topic: str,
        partition: int,
        base_offset: int,
        record_count: int,
        duplicate: bool,
        raft_index: int,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.base_offset = base_offset
        self.record_count = record_count
        self.duplicate = duplicate
        self.raft_index = raft_index

    def __len__(self) -> int:
        return self.record_count

    @overload
    def __getitem__(self, position: int) -> RecordMetadata: ...

    @overload
    def __getitem__(self, position: slice) -> list[RecordMetadata]: ...

    def __getitem__(self, position: int | slice) -> RecordMetadata | list[RecordMetadata]:
        if isinstance(position, slice):
            return [self._at(at) for at in range(*position.indices(self.record_count))]
        if position < 0:
            position += self.record_count
        if not 0 <= position < self.record_count:
            raise IndexError(f"record {position} of a batch of {self.record_count}")
        return self._at(position)

    def __iter__(self) -> Iterator[RecordMetadata]:
        return (self._at(position) for position in range(self.record_count))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ProducedBatch):
            return self._fields() == other._fields()
        return isinstance(other, Sequence) and list(self) == list(other)

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"ProducedBatch(topic={self.topic!r}, partition={self.partition}, offsets={self.base_offset}"
            f"..{self.base_offset + self.record_count - 1}, duplicate={self.duplicate}, "
            f"raft_index={self.raft_index})"
        )

    def _at(self, position: int) -> RecordMetadata:
        return RecordMetadata(
            self.topic, self.partition, self.base_offset + position, self.duplicate, self.raft_index
        )

    def _fields(self) -> tuple[str, int, int, int, bool, int]:
        return (
            self.topic,
            self.partition,
            self.base_offset,
            self.record_count,
            self.duplicate,
            self.raft_index,
        )


class ConsumerRecord(NamedTuple):
    """A record read from a partition: kafka-python's names, and like kafka-python's a named tuple.

    A tuple because a consumer builds one per record: a frozen dataclass of eight fields took 2.2 us
    to build (each field set through `object.__setattr__`), a named tuple takes a fifth of that.
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    timestamp_type: int  # 0 = CreateTime, 1 = LogAppendTime (as in Kafka).
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class FetchResult:
    """One fetch's records and what the serving node knew."""

    records: tuple[ConsumerRecord, ...]
    log_start_offset: int
    log_end_offset: int
    served_by: str
    applied_index: int
    # Where to read next: past the last record, or further when compaction left offsets without a
    # record there (a compacted topic's offsets have gaps); the fetch offset when nothing was served.
    next_offset: int


@dataclass(frozen=True, slots=True)
class FetchedBatches:
    """One fetch's stored RecordBatch v2 batches as served (not yet checked or decoded: see
    `client.decode_batches`), and what the serving node knew."""

    batches: tuple[bytes, ...]
    log_start_offset: int
    log_end_offset: int
    served_by: str
    applied_index: int


@dataclass(frozen=True, slots=True)
class PeerState:
    """A member as one node sees it."""

    node_id: str
    grpc_address: str
    connected: bool  # The node answering is connected to it over Raft.
    raft_address: str = ""
    kafka_address: str = ""  # "": no Kafka listener.
    rack: str = ""
    match_index: int = 0  # The leader's match index for it (0: not heard, or not asked of the leader).


@dataclass(frozen=True, slots=True)
class GroupLeaderInfo:
    """One Raft group's leader as a node sees it ("" while unknown): a cluster of nodes with worker
    processes has one group per process (DESIGN.md, "Scale-out")."""

    group: int
    leader_id: str
    leader_address: str
    term: int


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One node's view of the cluster (`kq cluster status`)."""

    address: str
    node_id: str
    role: str
    leader_id: str
    leader_address: str
    term: int
    commit_index: int
    applied_index: int
    ready: bool
    raft_log_entries: int
    peers: tuple[PeerState, ...] = field(default=())
    raft_address: str = ""
    cluster_id: str = ""
    group: int = 0  # The Raft group of the process that answered.
    group_leaders: tuple[GroupLeaderInfo, ...] = ()  # Every group's leader (one entry: one group).


def group_leaders(statuses: Sequence[NodeStatus | Exception]) -> tuple[GroupLeaderInfo, ...]:
    """Every Raft group's leader, as the first node that answered sees them; () in a cluster of one
    group, whose leader each node's status names (`kq cluster status`, the console)."""
    seen = next((s for s in statuses if isinstance(s, NodeStatus) and len(s.group_leaders) > 1), None)
    return seen.group_leaders if seen is not None else ()


@dataclass(frozen=True, slots=True)
class GroupAssignment:
    """What joining a group gave this member."""

    member_id: str
    generation: int
    partitions: tuple[tuple[str, int], ...]
    assignor: str
    session_timeout_ms: int


@dataclass(frozen=True, slots=True)
class GroupMemberInfo:
    """One member of a group as the cluster holds it."""

    member_id: str
    client_id: str
    subscription: tuple[str, ...]  # Topics, or the one pattern.
    partitions: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """A group's position on one partition; without a committed offset the lag counts from the log start."""

    topic: str
    partition: int
    member_id: str
    committed_offset: int | None
    log_end_offset: int
    lag: int
    log_start_offset: int = 0  # Above committed_offset when retention trimmed past the commit.

    @property
    def below_log_start(self) -> bool:
        """The committed offset names records retention has deleted: a consumer resumes at the start."""
        return self.committed_offset is not None and self.committed_offset < self.log_start_offset


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """A group: phase (empty, rebalancing, stable), generation, members and per-partition lag."""

    name: str
    phase: str
    generation: int
    assignor: str
    members: tuple[GroupMemberInfo, ...]
    partitions: tuple[PartitionLag, ...]
    served_by: str

    @property
    def total_lag(self) -> int:
        """Records the group has yet to consume, over all its partitions."""
        return sum(p.lag for p in self.partitions)


@dataclass(frozen=True, slots=True)
class GroupSummary:
    """A line of `list_groups`."""

    name: str
    phase: str
    generation: int
    members: int
