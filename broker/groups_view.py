"""What one worker process knows of the cluster's Raft groups: which group holds a partition or
coordinates a consumer group, and who leads each group, with the addresses of the leader's process.

A node with worker processes (broker/workers.py) runs group g in its worker g; that worker knows its
own group's leader from Raft and learns the others' from its sibling workers through the node's
leader board: a directory of small files, one a group (`<node data dir>/groups/leaders/<g>`), each
written by the worker of that group whenever the leader or term it sees changes (atomically, by
rename; runtime state only, never synced: the supervisor empties the directory at start). Reading it
costs a few file reads every LEADER_BOARD_TTL_S, no call between processes.

Addresses follow broker/workers.py: node n's process of group h has node n's addresses in group 0
plus h, so a peer known in this worker's group g is moved by h - g.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kq.broker.consensus import ConsensusStatus, Peer
from kq.broker.membership import MembershipView, peer_of
from kq.broker.workers import broker_id, shifted_peer
from kq.proto import kq_pb2
from kq.proto.limits import LEADER_BOARD_TTL_S
from kq.proto.placement import group_data_dir
from kq.raft.journal import OS_DISK
from kq.raft.placement import METADATA_GROUP, partition_group
from kq.storage import PartitionState, StorageError, Store, StoreReader, TopicMeta


@dataclass(frozen=True, slots=True)
class GroupLeader:
    """A group's leader as this process sees it: its node id ("" unknown) and the group's term."""

    group: int
    leader_id: str
    term: int


class LeaderBoard:
    """The node's leader board (above): this worker publishes its group's leader, reads the others'."""

    def __init__(self, directory: Path, groups: int) -> None:
        self._directory = directory
        self._groups = groups
        self._published: tuple[str, int] | None = None
        self._read_at = float("-inf")
        self._cached: dict[int, GroupLeader] = {}

    def publish(self, group: int, leader_id: str, term: int) -> None:
        """Writes `group`'s leader and term when they changed since the last publication."""
        if self._published == (leader_id, term):
            return
        self._directory.mkdir(parents=True, exist_ok=True)
        OS_DISK.replace(self._directory / str(group), f"{leader_id} {term}\n".encode(), sync=False)
        self._published = (leader_id, term)

    def leaders(self) -> dict[int, GroupLeader]:
        """Every group's leader as published (unknown: "" and term 0), read at most every
        LEADER_BOARD_TTL_S."""
        now = time.monotonic()
        if now - self._read_at >= LEADER_BOARD_TTL_S:
            self._cached = {group: self._read(group) for group in range(self._groups)}
            self._read_at = now
        return self._cached

    def _read(self, group: int) -> GroupLeader:
        try:
            leader_id, term = (self._directory / str(group)).read_text().split()
            return GroupLeader(group, leader_id, int(term))
        except (OSError, ValueError):  # Not published yet, or a torn read of a file being replaced.
            return GroupLeader(group, "", 0)


class GroupsView:
    """The groups as this process serves them: its own group, their count, placement and leaders."""

    def __init__(
        self,
        group: int,
        count: int,
        view: Callable[[], MembershipView],
        status: Callable[[], ConsensusStatus],
        board: LeaderBoard | None = None,
        stores: LocalStores | None = None,
    ) -> None:
        assert count == 1 or (board is not None and stores is not None), "several groups: board, stores"
        self.group = group  # The group this process is the replica of.
        self.count = count  # The cluster's groups (1: one group, no workers).
        self._view = view
        self._status = status
        self._board = board
        self._stores = stores  # This node's replicas of the other groups, to read (LocalStores).

    @property
    def several(self) -> bool:
        """Whether the cluster has more than one group (nodes with worker processes)."""
        return self.count > 1

    def group_of(self, topic: TopicMeta, partition: int) -> int:
        """The group that holds a partition: by the group count its topic was created with
        (raft/placement.py; 1: group 0, whatever the cluster's count is now)."""
        return partition_group(topic.topic_id, partition, topic.groups) if topic.groups > 1 else 0

    def coordinator_of(self, group_name: str) -> int:
        """The group that coordinates a consumer group: group 0, for every consumer group (DESIGN.md,
        "Scale-out": spreading them needs a coordinator count fixed for the cluster's life, as
        Kafka's `__consumer_offsets` partitions, so that a group never moves away from its offsets)."""
        return METADATA_GROUP

    def leader(self, group: int) -> GroupLeader:
        """`group`'s leader: from Raft for this process's own group, from the board for the others."""
        if group == self.group:
            status = self._status()
            return GroupLeader(group, status.leader_id, status.term)
        assert self._board is not None
        return self._board.leaders().get(group, GroupLeader(group, "", 0))

    def leaders(self) -> list[GroupLeader]:
        """Every group's leader, by group."""
        return [self.leader(group) for group in range(self.count)]

    def process(self, node_id: str, group: int) -> Peer | None:
        """Node `node_id`'s process of `group` (its addresses): a voter of this process's group, else
        a member registered in group 0 (a node whose addition reached some groups before this one:
        broker/group_membership.py registers it in group 0 first); None for neither."""
        peer = self._view().member(node_id)
        if peer is not None:
            return shifted_peer(peer, group - self.group)
        registered = self._registered(node_id)
        return None if registered is None else shifted_peer(registered, group)

    def _registered(self, node_id: str) -> Peer | None:
        """Node `node_id`'s addresses (group 0's) as registered in this node's replica of group 0."""
        if self.group == METADATA_GROUP:
            view = self._view()
            if node_id not in view.registered:
                return None
            return next((peer for peer in view.known.values() if peer.node_id == node_id), None)
        store = None if self._stores is None else self._stores.store(METADATA_GROUP)
        if store is None:
            return None
        with store.read() as reader:
            raw = dict(reader.members()).get(node_id)
        return None if raw is None else peer_of(kq_pb2.Member.FromString(raw))

    def leader_process(self, group: int) -> Peer | None:
        """The process leading `group` (None while its leader is unknown)."""
        leader = self.leader(group)
        return self.process(leader.leader_id, group) if leader.leader_id else None

    def partition_states(self, own: StoreReader, topic: TopicMeta) -> list[tuple[int, PartitionState | None]]:
        """Each partition's group and log state on this node's replica of that group (None: that
        replica does not hold the topic yet); `own` is this process's read transaction."""
        owners = [self.group_of(topic, partition) for partition in range(topic.partitions)]
        states: dict[int, PartitionState | None] = {}
        for group in sorted(set(owners)):
            mine = [partition for partition, owner in enumerate(owners) if owner == group]
            with self.replica_reader(own, group) as reader:
                held = reader is not None and _holds(reader, topic)
                states.update(
                    (partition, reader.partition(topic.topic_id, partition) if held and reader else None)
                    for partition in mine
                )
        return [(owners[partition], states[partition]) for partition in range(topic.partitions)]

    def partition_state(self, own: StoreReader, topic: TopicMeta, partition: int) -> PartitionState | None:
        """One partition's log state on this node's replica of its group (as `partition_states`)."""
        with self.replica_reader(own, self.group_of(topic, partition)) as reader:
            if reader is None or not _holds(reader, topic):
                return None
            return reader.partition(topic.topic_id, partition)

    @contextlib.contextmanager
    def replica_reader(self, own: StoreReader, group: int) -> Iterator[StoreReader | None]:
        """A read transaction on this node's replica of `group` (`own` for this process's group; None
        while that replica's store is not readable yet)."""
        if group == self.group or self._stores is None:
            yield own
            return
        store = self._stores.store(group)
        if store is None:
            yield None
            return
        with store.read() as reader:
            yield reader

    def replica_applied(self, group: int) -> int | None:
        """The index this node's replica of another `group` has applied (None: not readable yet)."""
        store = None if self._stores is None else self._stores.store(group)
        return None if store is None else store.applied_index()

    def copied_everywhere(self, topic: TopicMeta) -> bool:
        """Whether this node's replica of every other group holds `topic` (by id, with at least its
        partitions): its copies are in place (broker/topic_sync.py). True with one group."""
        for group in range(self.count):
            if group == self.group:
                continue
            found = self._replica_topic(group, topic.name)
            if found is None or found[0] != topic.topic_id or found[1] < topic.partitions:
                return False
        return True

    def known_to_group0(self, name: str) -> bool:
        """Whether this node's replica of group 0 holds a topic of this name (another group's process
        that lacks it: its copy is on its way, not an unknown topic)."""
        return self.group != METADATA_GROUP and self._replica_topic(METADATA_GROUP, name) is not None

    def _replica_topic(self, group: int, name: str) -> tuple[int, int] | None:
        """(id, partitions) of topic `name` in this node's replica of another group (None: none there,
        or that replica not readable yet)."""
        store = None if self._stores is None else self._stores.store(group)
        if store is None:
            return None
        with store.read() as reader:
            topic = reader.topic(name)
        return None if topic is None else (topic.topic_id, topic.partitions)

    def close(self) -> None:
        """Closes the other groups' stores this process opened to read."""
        if self._stores is not None:
            self._stores.close()

    def broker_id(self, node_id: str, group: int) -> int:
        """The Kafka broker id of node `node_id`'s process of `group` (an integer node id)."""
        return broker_id(int(node_id), group) if self.several else int(node_id)


def _holds(reader: StoreReader, topic: TopicMeta) -> bool:
    """Whether a replica's store holds `topic` itself (the same id: not one recreated since)."""
    held = reader.topic(topic.name)
    return held is not None and held.topic_id == topic.topic_id


class LocalStores:
    """This node's replicas of the other groups, to read: LMDB lets other processes read an environment
    beside its writer, so a worker answers a topic's offsets (ListOffsets, DescribeTopic), a consumer
    group's lag or reset targets from the node's own replicas (`GroupsView.replica_reader`), without a
    call to its siblings. Each sibling's store is opened read-only on first use (None until its worker
    created it: such partitions read as not there yet) and kept open until `close()`."""

    def __init__(self, node_dir: Path, map_size_bytes: int) -> None:
        self._node_dir = node_dir
        self._map_size_bytes = map_size_bytes
        self._opened: dict[int, Store] = {}
        self._lock = threading.Lock()  # Read threads open siblings' stores concurrently.

    def store(self, group: int) -> Store | None:
        """This node's replica of `group`, opened to read (None: not readable yet)."""
        with self._lock:
            store = self._opened.get(group)
            if store is None:
                path = group_data_dir(self._node_dir, group) / "store"
                try:
                    store = Store.open_reader(path, self._map_size_bytes)
                except StorageError:
                    return None
                self._opened[group] = store
            return store

    def close(self) -> None:
        """Closes the siblings' stores this process opened."""
        with self._lock:
            for store in self._opened.values():
                store.close()
            self._opened.clear()
