"""The consumer-group RPCs of the Broker service (a mixin of BrokerService)."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from typing import Any

import grpc

from kq.broker.auth import GROUP, current_principal
from kq.broker.consensus import Consensus, Peer
from kq.broker.errors import (
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    RebalanceError,
    UnavailableError,
    error_for_code,
)
from kq.broker.groups import GroupCoordinator
from kq.broker.groups_view import GroupsView
from kq.broker.proposals import propose_and_wait, wall_clock_ms
from kq.broker.service_base import ServiceBase, stored_records
from kq.broker.validation import check, check_group_name, check_topic_name
from kq.broker.waiters import METADATA, AppliedNotifier
from kq.proto import kq_pb2
from kq.proto.errors import ErrorCode
from kq.proto.limits import (
    HEARTBEAT_WAIT_MS_MAX,
    JOIN_WAIT_S,
    MEMBER_ID_PREFIX_MAX,
    PROPOSAL_TIMEOUT_S,
    REBALANCE_TIMEOUT_MS_DEFAULT,
    SESSION_TIMEOUT_MS_DEFAULT,
    WAIT_RECHECK_S,
)
from kq.raft import commands
from kq.raft.results import ApplyResult, GroupResult
from kq.raft.validation import assignor_problem, member_problem, offsets_problem
from kq.storage import PartitionState, StoreReader, TopicMeta

NEW_MEMBER_PLACEHOLDER = "new-member"


class GroupRpcs(ServiceBase):
    """Join, heartbeat, leave, commit, fetch offsets, list, describe (with lag), reset, delete."""

    _coordinator: GroupCoordinator
    _consensus: Consensus
    _notifier: AppliedNotifier
    _node: Peer

    def _propose_group(self, command: kq_pb2.Command, group: str) -> GroupResult:
        result: ApplyResult = propose_and_wait(self._consensus, command, PROPOSAL_TIMEOUT_S)
        assert isinstance(result, GroupResult), f"a group command answered {result!r}"
        error = error_for_code(result.error, group)
        if error is not None:
            raise error
        return result

    def _group_state(self, reader: StoreReader, group: str) -> kq_pb2.GroupState | None:
        raw = reader.group(group)
        if raw is None:
            return None
        state = kq_pb2.GroupState()
        state.ParseFromString(raw)
        return state

    async def JoinGroup(
        self, request: kq_pb2.JoinGroupRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> kq_pb2.JoinGroupResponse:
        """Joins (or rejoins) a group and waits until the rebalance gives this member its partitions.

        A coroutine: the proposals and reads run on worker threads, the wait on none (a reader slot).
        """
        member = await self._in_workers(self._join, request)
        deadline = time.monotonic() + min(member.rebalance_timeout_ms / 1000, JOIN_WAIT_S)

        async def step(last: bool) -> kq_pb2.JoinGroupResponse | None:
            return await self._in_workers(self._join_step, request, member, last)

        return await self._until_answered(context.peer(), step, lambda: METADATA, deadline, WAIT_RECHECK_S)

    def _join(self, request: kq_pb2.JoinGroupRequest) -> kq_pb2.GroupMember:
        """Checks a join and proposes it; the member (with its id) that joined."""
        self._require_leader(self._groups.coordinator_of(request.group))  # First: a follower may lack topics.
        member = _checked_member(request, self._store_topics())
        if request.member_id:
            with self._store.read() as reader:
                state = self._group_state(reader, request.group)
            if state is None or all(m.member_id != request.member_id for m in state.members):
                raise RebalanceError(
                    f"unknown member of group {request.group}: join again without a member id",
                    ErrorCode.UNKNOWN_MEMBER,
                )
        else:
            member.member_id = _new_member_id(request.client_id)
        self._coordinator.heard_from(request.group, member.member_id)
        command = commands.join_group(request.group, member, request.assignor, wall_clock_ms())
        self._propose_group(command, request.group)
        return member

    def _join_step(
        self, request: kq_pb2.JoinGroupRequest, member: kq_pb2.GroupMember, last: bool
    ) -> kq_pb2.JoinGroupResponse | None:
        """The answer to a join once its group is stable (or, if `last`, that it is still rebalancing);
        None to wait for the group to change."""
        self._coordinator.heard_from(request.group, member.member_id)
        with self._store.read() as reader:
            applied_index = reader.applied_index()
            state = self._group_state(reader, request.group)
        mine = (
            None
            if state is None
            else next((m for m in state.members if m.member_id == member.member_id), None)
        )
        if state is None or mine is None:
            raise RebalanceError(
                f"member {member.member_id} left group {request.group} while joining: join again",
                ErrorCode.UNKNOWN_MEMBER,
            )
        if state.phase == kq_pb2.GROUP_REBALANCING and not mine.rejoined:
            # Another member's change began a new rebalance after ours: a waiting joiner rejoins.
            self._propose_group(
                commands.join_group(request.group, member, "", wall_clock_ms()), request.group
            )
            return None
        if state.phase == kq_pb2.GROUP_STABLE:
            return kq_pb2.JoinGroupResponse(
                member_id=member.member_id,
                generation=state.generation,
                assignment=mine.assignment,
                assignor=state.assignor,
                index=applied_index,
                session_timeout_ms=member.session_timeout_ms,
            )
        if last:
            # Bounded: the member learns its id and joins again with it (never a second identity).
            return kq_pb2.JoinGroupResponse(
                member_id=member.member_id, generation=state.generation, index=applied_index, rebalancing=True
            )
        return None

    def _store_topics(self) -> set[str]:
        with self._store.read() as reader:
            return {topic.name for topic in reader.topics()}

    async def Heartbeat(
        self, request: kq_pb2.HeartbeatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> kq_pb2.HeartbeatResponse:
        """Keeps a member alive; answers at once when its group starts rebalancing (long-poll).

        A coroutine, like JoinGroup: reads on worker threads, the wait on none.
        """
        check_group_name(request.group)
        if request.wait_ms > HEARTBEAT_WAIT_MS_MAX:
            raise InvalidArgumentError(f"wait_ms is at most {HEARTBEAT_WAIT_MS_MAX}")
        self._require_leader(self._groups.coordinator_of(request.group))

        async def step(last: bool) -> kq_pb2.HeartbeatResponse | None:
            return await self._in_workers(self._heartbeat_step, request, last)

        deadline = time.monotonic() + request.wait_ms / 1000
        return await self._until_answered(context.peer(), step, lambda: METADATA, deadline, WAIT_RECHECK_S)

    def _heartbeat_step(
        self, request: kq_pb2.HeartbeatRequest, last: bool
    ) -> kq_pb2.HeartbeatResponse | None:
        """The answer once the group rebalances, the wait is over (`last`) or this node stopped leading;
        None to wait on."""
        self._coordinator.heard_from(request.group, request.member_id)
        with self._store.read() as reader:
            state = self._group_state(reader, request.group)
        if state is None or all(m.member_id != request.member_id for m in state.members):
            raise RebalanceError(f"unknown member of group {request.group}: rejoin", ErrorCode.UNKNOWN_MEMBER)
        rebalancing = state.phase == kq_pb2.GROUP_REBALANCING or state.generation != request.generation
        if rebalancing or last or not self._consensus.is_leader():
            return kq_pb2.HeartbeatResponse(generation=state.generation, rebalancing=rebalancing)
        return None

    def LeaveGroup(
        self, request: kq_pb2.LeaveGroupRequest, context: grpc.ServicerContext
    ) -> kq_pb2.LeaveGroupResponse:
        """Removes a member at once (its partitions move without waiting for its session to expire)."""
        check_group_name(request.group)
        self._require_leader(self._groups.coordinator_of(request.group))
        command = commands.leave_group(request.group, [request.member_id], wall_clock_ms())
        with contextlib.suppress(RebalanceError, NotFoundError):  # Already gone: leaving is idempotent.
            self._propose_group(command, request.group)
        return kq_pb2.LeaveGroupResponse()

    def CommitOffsets(
        self, request: kq_pb2.CommitOffsetsRequest, context: grpc.ServicerContext
    ) -> kq_pb2.CommitOffsetsResponse:
        """Commits offsets for the member's generation (or for a group without members)."""
        check_group_name(request.group)
        check(offsets_problem(list(request.offsets)))
        self._require_leader(self._groups.coordinator_of(request.group))
        if request.member_id:
            self._coordinator.heard_from(request.group, request.member_id)
        command = commands.commit_offsets(
            request.group, request.member_id, request.generation, request.offsets, wall_clock_ms()
        )
        self._propose_group(command, request.group)
        return kq_pb2.CommitOffsetsResponse(index=self._store.applied_index())

    def FetchOffsets(
        self, request: kq_pb2.FetchOffsetsRequest, context: grpc.ServicerContext
    ) -> kq_pb2.FetchOffsetsResponse:
        """The group's committed offsets (all, or for the given partitions), from this node's store."""
        check_group_name(request.group)
        self._require_coordinator_replica(request.group)
        self._catch_up(request.min_index)
        wanted = {(tp.topic, tp.partition) for tp in request.partitions}
        with self._store.read() as reader:
            names = {topic.topic_id: topic.name for topic in reader.topics()}
            offsets = [
                kq_pb2.OffsetEntry(topic=names[topic_id], partition=partition, offset=offset)
                for topic_id, partition, offset, _ in reader.committed_offsets(request.group)
                if topic_id in names and (not wanted or (names[topic_id], partition) in wanted)
            ]
            return kq_pb2.FetchOffsetsResponse(offsets=offsets, applied_index=reader.applied_index())

    def ListGroups(
        self, request: kq_pb2.ListGroupsRequest, context: grpc.ServicerContext
    ) -> kq_pb2.ListGroupsResponse:
        """Every group with its phase, generation and member count: every group to a principal with
        DESCRIBE on the cluster, else those it may DESCRIBE (as Kafka's ListGroups)."""
        self._catch_up(request.min_index)
        summaries = []
        principal = current_principal()
        every_group = self._security.lists_every_group(principal)
        with self._store.read() as reader:
            for name, _ in reader.groups():
                if not every_group and not self._security.visible(principal, GROUP, [name]):
                    continue
                state = self._group_state(reader, name)
                assert state is not None
                summaries.append(
                    kq_pb2.GroupSummary(
                        name=name, phase=state.phase, generation=state.generation, members=len(state.members)
                    )
                )
        return kq_pb2.ListGroupsResponse(groups=summaries)

    def DescribeGroup(
        self, request: kq_pb2.DescribeGroupRequest, context: grpc.ServicerContext
    ) -> kq_pb2.DescribeGroupResponse:
        """The group's members and, per partition, committed offset, log end and lag."""
        check_group_name(request.group)
        self._require_coordinator_replica(request.group)
        self._catch_up(request.min_index)
        with self._store.read() as reader:
            state = self._group_state(reader, request.group)
            if state is None:
                raise NotFoundError(f"unknown group {request.group}", ErrorCode.UNKNOWN_GROUP)
            state.assignor = state.assignor or "range"  # What the group will use when it has members.
            return kq_pb2.DescribeGroupResponse(
                group=state,
                partitions=partition_lags(reader, state, self._groups.partition_states),
                served_by=self._node.node_id,
                applied_index=reader.applied_index(),
            )

    def ResetOffsets(
        self, request: kq_pb2.ResetOffsetsRequest, context: grpc.ServicerContext
    ) -> kq_pb2.ResetOffsetsResponse:
        """Moves a group without active members to earliest, latest, an offset or a timestamp."""
        check_group_name(request.group)
        if not request.topics:
            raise InvalidArgumentError("name at least one topic to reset")
        self._require_leader(self._groups.coordinator_of(request.group))
        with self._store.read() as reader:
            offsets = [
                entry
                for topic in request.topics
                for entry in _reset_targets(reader, topic, request, self._groups)
            ]
        self._propose_group(commands.reset_offsets(request.group, offsets), request.group)
        return kq_pb2.ResetOffsetsResponse(offsets=offsets, index=self._store.applied_index())

    def DeleteGroup(
        self, request: kq_pb2.DeleteGroupRequest, context: grpc.ServicerContext
    ) -> kq_pb2.DeleteGroupResponse:
        """Deletes a group without active members and its committed offsets."""
        check_group_name(request.group)
        self._require_leader(self._groups.coordinator_of(request.group))
        self._propose_group(commands.delete_group(request.group), request.group)
        return kq_pb2.DeleteGroupResponse(index=self._store.applied_index())


def _checked_member(request: kq_pb2.JoinGroupRequest, topics: set[str]) -> kq_pb2.GroupMember:
    """The member a join request describes, with defaults; rejects what apply would refuse."""
    check_group_name(request.group)
    member = kq_pb2.GroupMember(
        member_id=request.member_id,
        client_id=request.client_id,
        topics=request.topics,
        topic_pattern=request.topic_pattern,
        session_timeout_ms=request.session_timeout_ms or SESSION_TIMEOUT_MS_DEFAULT,
        rebalance_timeout_ms=request.rebalance_timeout_ms or REBALANCE_TIMEOUT_MS_DEFAULT,
    )
    probe = kq_pb2.GroupMember()
    probe.CopyFrom(member)
    probe.member_id = probe.member_id or NEW_MEMBER_PLACEHOLDER  # The leader chooses it after this check.
    check(member_problem(probe) or assignor_problem(request.assignor))
    for topic in request.topics:
        if topic not in topics:
            raise NotFoundError(f"unknown topic {topic}")
    return member


def _new_member_id(client_id: str) -> str:
    """A fresh member id: the client id (shortened) and a random suffix, as Kafka makes them."""
    return f"{client_id[:MEMBER_ID_PREFIX_MAX] or 'member'}-{uuid.uuid4().hex[:12]}"


def partition_lags(
    reader: StoreReader,
    state: kq_pb2.GroupState,
    logs: Callable[[StoreReader, TopicMeta], list[tuple[int, PartitionState | None]]] | None = None,
) -> list[kq_pb2.PartitionLag]:
    """Per partition of every topic the group owns or committed to: committed offset, log end, lag.

    Without a committed offset the lag counts from the log start (what an `earliest` consumer has left).
    `logs` reads a topic's partitions (GroupsView.partition_states: each from this node's replica of
    its group); None: from `reader`. A partition not there yet is left out.
    """
    topics = {topic.topic_id: topic for topic in reader.topics()}
    committed = {(t, p): offset for t, p, offset, _ in reader.committed_offsets(state.name) if t in topics}
    owners = {(tp.topic, tp.partition): m.member_id for m in state.members for tp in m.assignment}
    names = {topic_id for topic_id, _ in committed} | {
        topic.topic_id for topic in topics.values() if any(t == topic.name for t, _ in owners)
    }
    result = []
    for topic_id in sorted(names, key=lambda i: topics[i].name):
        topic = topics[topic_id]
        states = logs(reader, topic) if logs is not None else None
        for partition in range(topic.partitions):
            log = reader.partition(topic_id, partition) if states is None else states[partition][1]
            if log is None:
                continue
            offset = committed.get((topic_id, partition))
            start = log.log_start_offset if offset is None else max(offset, log.log_start_offset)
            result.append(
                kq_pb2.PartitionLag(
                    topic=topic.name,
                    partition=partition,
                    member_id=owners.get((topic.name, partition), ""),
                    has_committed=offset is not None,
                    committed_offset=offset or 0,
                    log_end_offset=log.log_end_offset,
                    # Another group's replica here may lag the commits (workers): never below 0.
                    lag=max(0, log.log_end_offset - start),
                    log_start_offset=log.log_start_offset,
                )
            )
    return result


def _reset_targets(
    reader: StoreReader, name: str, request: kq_pb2.ResetOffsetsRequest, groups: GroupsView
) -> list[kq_pb2.OffsetEntry]:
    """The offset each partition of topic `name` is reset to, from this node's replica of the
    partition's group (`groups`: this process's view of them)."""
    check_topic_name(name)
    topic = reader.topic(name)
    if topic is None:
        raise NotFoundError(f"unknown topic {name}")
    entries = []
    for partition in range(topic.partitions):
        with groups.replica_reader(reader, groups.group_of(topic, partition)) as replica:
            log = None if replica is None else replica.partition(topic.topic_id, partition)
            if replica is None or log is None:
                raise UnavailableError(f"{name}/{partition} is not on this node yet; retry")
            offset = _reset_target(replica, topic, partition, log, request)
        entries.append(kq_pb2.OffsetEntry(topic=name, partition=partition, offset=offset))
    return entries


def _reset_target(
    reader: StoreReader,
    topic: TopicMeta,
    partition: int,
    log: PartitionState,
    request: kq_pb2.ResetOffsetsRequest,
) -> int:
    """One partition's reset offset, read from the replica that holds it."""
    if request.target == kq_pb2.RESET_EARLIEST:
        return log.log_start_offset
    if request.target == kq_pb2.RESET_LATEST:
        return log.log_end_offset
    if request.target == kq_pb2.RESET_OFFSET:
        if not log.log_start_offset <= request.offset <= log.log_end_offset:
            raise OutOfRangeError(
                f"offset {request.offset} is outside {topic.name}/{partition}: "
                f"{log.log_start_offset}..{log.log_end_offset}"
            )
        return request.offset
    found = first_offset_at(reader, topic.topic_id, partition, log.log_start_offset, request.timestamp_ms)
    return log.log_end_offset if found is None else found[0]


def first_offset_at(
    reader: StoreReader, topic_id: int, partition: int, start: int, timestamp_ms: int
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record whose timestamp is at or after `timestamp_ms` (a scan),
    or None."""
    offset = start
    while True:
        batches = reader.batches(topic_id, partition, offset, 4 * 1024 * 1024)
        if not batches:
            return None
        for batch in batches:
            for record in stored_records(batch):
                record_offset = batch.base_offset + record.offset_delta
                if record_offset >= start and record.timestamp_ms >= timestamp_ms:
                    return record_offset, record.timestamp_ms
        offset = batches[-1].next_offset
