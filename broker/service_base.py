"""What every Broker RPC shares: the node's parts, leader check, read-your-writes wait, error mapping."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor
from typing import Any, TypeVar

from kq.broker.admission import PRODUCE_STREAM_LIMITS, ReaderAdmission
from kq.broker.auth import Security
from kq.broker.consensus import Consensus, Peer
from kq.broker.deadlines import capped, in_call_context
from kq.broker.errors import InvalidArgumentError, NotFoundError, NotLeaderError, UnavailableError
from kq.broker.group_membership import ClusterChanges
from kq.broker.groups import GroupCoordinator
from kq.broker.groups_view import GroupsView
from kq.broker.membership import Membership
from kq.broker.proposals import Batcher, wall_clock_ms
from kq.broker.storage_guard import StorageGuard
from kq.broker.waiters import AppliedNotifier, WatchKey, wait_for_wake
from kq.proto.errors import ErrorCode
from kq.proto.limits import CATCH_UP_WAIT_S, RAFT_GROUPS_MAX, REPLICA_CATCH_UP_POLL_S
from kq.proto.records import WireRecord, parse_batch
from kq.raft.topic_config import ConfigParser
from kq.storage import Store, StoredBatch, StoreReader, TopicMeta

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ServiceBase:
    """The state every RPC uses, wired once in `broker.main`."""

    def __init__(
        self,
        node: Peer,
        membership: Membership,
        store: Store,
        consensus: Consensus,
        batcher: Batcher,
        notifier: AppliedNotifier,
        coordinator: GroupCoordinator,
        readers: ReaderAdmission,
        workers: Executor,
        reads: Executor,
        topic_defaults: Mapping[str, str] | None = None,
        storage_guard: StorageGuard | None = None,
        membership_changes: ClusterChanges | None = None,
        security: Security | None = None,
        groups: GroupsView | None = None,
    ) -> None:
        self._node = node
        # The cluster's Raft groups as this process serves them (broker/groups_view.py); one group
        # unless the node runs worker processes.
        self._groups = groups or GroupsView(0, 1, lambda: membership.view, consensus.status)
        # This node's defaults of the leader-run topic configs (`--topic-default`, raft/topic_config.py).
        self._topic_defaults: Mapping[str, str] = dict(topic_defaults or {})
        self._topic_configs = ConfigParser(self._topic_defaults)  # Parsed once per stored overrides.
        self._membership = membership  # The members as this node knows them (broker/membership.py).
        self._membership_changes = membership_changes  # AddNode, RemoveNode; None: no Raft node here.
        # Authentication and ACLs (broker/auth.py); None: off, every call allowed.
        self._security = security or Security(store, False, (), "", wall_clock_ms)
        self._store = store
        self._consensus = consensus
        self._batcher = batcher
        self._notifier = notifier
        self._coordinator = coordinator
        self._readers = readers  # Slots for calls that wait (broker/admission.py).
        self._produce_streams = ReaderAdmission(PRODUCE_STREAM_LIMITS)  # Slots for open ProduceStream calls.
        self._workers = workers  # Blocking work of coroutine handlers: proposals, group reads.
        self._reads = reads  # Record reads of coroutine handlers.
        # The leader's disk bound (broker/storage_guard.py); None: writes are never refused for room.
        self._storage_guard = storage_guard
        # Stream reads on the read pool now, by what they read (loop only; one per waiting stream at most).
        self._reads_in_flight: dict[tuple[str, int, int, int, int, int], asyncio.Future[Any]] = {}

    async def _in_workers(self, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)` on a worker thread (it may block: a proposal, a catch-up wait), with the
        call's deadline (broker/deadlines.py)."""
        return await asyncio.get_running_loop().run_in_executor(
            self._workers, functools.partial(in_call_context(function), *args)
        )

    async def _in_reads(self, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)` on a read thread (an LMDB read transaction, a catch-up wait), with the
        call's deadline."""
        return await asyncio.get_running_loop().run_in_executor(
            self._reads, functools.partial(in_call_context(function), *args)
        )

    async def _until_answered(
        self,
        peer: str,
        step: Callable[[bool], Awaitable[T | None]],
        key: Callable[[], WatchKey],
        deadline: float,
        recheck_s: float,
    ) -> T:
        """A long-poll: `step(last)` until it answers; `last` is True past `deadline` (or when the node
        stops), and then it must answer.

        Between tries it waits, with no thread, for an entry concerning `key()` (or `recheck_s`): only
        then does the call hold one of `peer`'s reader slots (broker/admission.py), so a call that
        answers at once is never refused for want of one. The wait is registered before each try, so
        an entry applied during the try is not missed (broker/waiters.py).
        """
        answer = await step(self._past(deadline))
        if answer is not None:
            return answer
        with self._readers.admitted(peer):
            while True:
                with self._notifier.watching(key()) as woken:
                    answer = await step(self._past(deadline))
                    if answer is not None:
                        return answer
                    await wait_for_wake(woken, min(deadline - time.monotonic(), recheck_s))

    def _past(self, deadline: float) -> bool:
        return time.monotonic() >= deadline or self._notifier.closed

    def _catch_up(self, min_index: int, wait_s: float | None = None) -> None:
        """Read-your-writes for metadata reads: wait until `min_index` is applied, at most `wait_s`
        (None: CATCH_UP_WAIT_S) and never past the call's deadline (broker/deadlines.py), else
        UNAVAILABLE (NOT_CAUGHT_UP)."""
        limit_s = CATCH_UP_WAIT_S if wait_s is None else wait_s
        if min_index and not self._notifier.wait_until(min_index, capped(limit_s)):
            raise UnavailableError(
                f"node {self._node.node_id} has not applied index {min_index} yet; retry",
                ErrorCode.NOT_CAUGHT_UP,
            )

    def _catch_up_groups(self, min_indexes: Mapping[int, int]) -> None:
        """`_catch_up` for reads of several groups' partitions (ListOffsets, DescribeTopic): waits
        until this node's replica of each group named has applied its index (this process's own
        group through its notifier; a sibling's store, another process's, polled every
        REPLICA_CATCH_UP_POLL_S), CATCH_UP_WAIT_S in all and never past the call's deadline, else
        NOT_CAUGHT_UP. A group the cluster does not have (a client's stale view) is ignored."""
        if len(min_indexes) > RAFT_GROUPS_MAX:
            raise InvalidArgumentError(f"group_min_indexes names more than {RAFT_GROUPS_MAX} groups")
        deadline = time.monotonic() + capped(CATCH_UP_WAIT_S)
        for group, index in sorted(min_indexes.items()):
            if group == self._groups.group:
                self._catch_up(index, max(0.0, deadline - time.monotonic()))
            elif group < self._groups.count and index:
                while (self._groups.replica_applied(group) or 0) < index:
                    if time.monotonic() >= deadline or self._notifier.closed:
                        raise UnavailableError(
                            f"node {self._node.node_id}'s replica of Raft group {group} has not applied "
                            f"index {index} yet; retry",
                            ErrorCode.NOT_CAUGHT_UP,
                        )
                    time.sleep(REPLICA_CATCH_UP_POLL_S)

    def _require_leader(self, group: int | None = None) -> None:
        """Unless this process leads `group` (None: its own group), NotLeaderError naming the process
        that does (`kq-leader`), or UnavailableError while it is unknown. Writes to the cluster's state
        need group 0 (METADATA_GROUP), a partition's its group, a consumer group's its coordinator."""
        if group is None or group == self._groups.group:
            if self._consensus.is_leader():
                return
            leader = self._consensus.leader_grpc_address()
        else:
            process = self._groups.leader_process(group)
            leader = process.grpc_address if process is not None else None
        if leader is None:
            raise UnavailableError("no leader is elected right now; retry", ErrorCode.LEADER_UNKNOWN)
        raise NotLeaderError(leader)

    def _require_partition_leader(self, topic: TopicMeta, partition: int) -> None:
        """`_require_leader` for the group that holds the partition."""
        self._require_leader(self._groups.group_of(topic, partition))

    def _require_replica(self, topic: TopicMeta, partition: int) -> None:
        """For a read: unless this process holds the partition's group, NotLeaderError naming this
        node's process that does (a replica: reads are served by followers too)."""
        self._require_group_replica(self._groups.group_of(topic, partition))

    def _require_coordinator_replica(self, group_name: str) -> None:
        """`_require_replica` for a consumer group's reads (its coordinator group holds its state)."""
        self._require_group_replica(self._groups.coordinator_of(group_name))

    def _require_group_replica(self, group: int) -> None:
        if group != self._groups.group:
            process = self._groups.process(self._node.node_id, group)
            assert process is not None, "this node is a member of its own view"
            raise NotLeaderError(process.grpc_address)

    def _require_room(self, incoming_bytes: int, counted: bool = True) -> None:
        """On the leader, before proposing a write that grows the store: STORAGE_FULL when the store
        is, or with `incoming_bytes` would be, within its headroom of full (deletes, trims and small
        bounded writes never ask). Not `counted`: only whether so much would still fit."""
        if self._storage_guard is not None:
            self._storage_guard.check(incoming_bytes, counted)

    def _partition_topic(self, reader: StoreReader, name: str) -> TopicMeta:
        """`_topic` for a partition's read or write: a topic this group's copy lacks while group 0 has
        it (created moments ago: broker/topic_sync.py copies it within a round) is UNAVAILABLE,
        retriable, not NOT_FOUND."""
        topic = reader.topic(name)
        if topic is not None:
            return topic
        if self._groups.known_to_group0(name):
            message = f"topic {name} is not in group {self._groups.group}'s copy yet; retry"
            raise UnavailableError(message, ErrorCode.NOT_CAUGHT_UP)
        raise NotFoundError(f"unknown topic {name}")

    @staticmethod
    def _topic(reader: StoreReader, name: str) -> TopicMeta:
        topic = reader.topic(name)
        if topic is None:
            raise NotFoundError(f"unknown topic {name}")
        return topic


def stored_records(batch: StoredBatch) -> list[WireRecord]:
    """A stored batch's records, decoded (apply checked the batch with these limits when appending it)."""
    records = parse_batch(batch.data)
    assert len(records) == batch.record_count, "a stored batch and its count disagree"
    return records
