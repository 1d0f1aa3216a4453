"""Group calls of `KqClient` (a mixin): membership, offsets and the admin queries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from kq.client.calls import Calls
from kq.client.types import GroupAssignment, GroupDescription, GroupMemberInfo, GroupSummary, PartitionLag
from kq.proto import kq_pb2

PHASES = {kq_pb2.GROUP_EMPTY: "empty", kq_pb2.GROUP_REBALANCING: "rebalancing", kq_pb2.GROUP_STABLE: "stable"}
RESET_TARGETS = {
    "earliest": kq_pb2.RESET_EARLIEST,
    "latest": kq_pb2.RESET_LATEST,
    "offset": kq_pb2.RESET_OFFSET,
    "timestamp": kq_pb2.RESET_TIMESTAMP,
}


class GroupsApi:
    """Consumer-group calls; `KqClient` provides `_connections`, `_saw` and `_index_seen`. Consumer
    groups live in Raft group 0 (DESIGN.md, "Scale-out"): their calls go where the cluster's state's
    do, with group 0's read-your-writes index."""

    _connections: Calls
    _index_seen: int

    def _saw(self, index: int, group: int = 0) -> None:
        raise NotImplementedError

    def join_group(
        self,
        group: str,
        *,
        topics: Sequence[str] = (),
        pattern: str = "",
        member_id: str = "",
        client_id: str = "",
        assignor: str = "",
        session_timeout_ms: int = 0,
        rebalance_timeout_ms: int = 0,
    ) -> GroupAssignment:
        """Joins (or rejoins) a group; returns once the group's rebalance gave this member its partitions."""
        request = kq_pb2.JoinGroupRequest(
            group=group,
            member_id=member_id,
            client_id=client_id,
            topics=topics,
            topic_pattern=pattern,
            assignor=assignor,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
        )
        response = self._connections.write("JoinGroup", request)
        while response.rebalancing:  # Others have yet to rejoin: wait again under the id given.
            request.member_id = response.member_id
            response = self._connections.write("JoinGroup", request)
        self._saw(response.index)
        return GroupAssignment(
            response.member_id,
            response.generation,
            tuple((tp.topic, tp.partition) for tp in response.assignment),
            response.assignor,
            response.session_timeout_ms,
        )

    def heartbeat(self, group: str, member_id: str, generation: int, wait_ms: int = 0) -> bool:
        """Keeps the member alive; True when the group is rebalancing (the member must rejoin)."""
        request = kq_pb2.HeartbeatRequest(
            group=group, member_id=member_id, generation=generation, wait_ms=wait_ms
        )
        return bool(self._connections.write("Heartbeat", request).rebalancing)

    def leave_group(self, group: str, member_id: str) -> None:
        """Leaves at once, so the member's partitions move without waiting for its session to expire."""
        self._connections.write("LeaveGroup", kq_pb2.LeaveGroupRequest(group=group, member_id=member_id))

    def commit_offsets(
        self, group: str, offsets: Mapping[tuple[str, int], int], member_id: str = "", generation: int = 0
    ) -> None:
        """Commits the next offset to read per (topic, partition), for this member's generation.

        Without a member id the group must have no active members (a consumer outside group
        management). A stale generation raises RebalanceError.
        """
        request = kq_pb2.CommitOffsetsRequest(
            group=group, member_id=member_id, generation=generation, offsets=_entries(offsets.items())
        )
        self._saw(self._connections.write("CommitOffsets", request).index)

    def committed_offsets(
        self, group: str, partitions: Iterable[tuple[str, int]] = (), node: str | None = None
    ) -> dict[tuple[str, int], int]:
        """The group's committed offsets (for the given partitions, or all)."""
        request = kq_pb2.FetchOffsetsRequest(
            group=group,
            partitions=[kq_pb2.TopicPartition(topic=t, partition=p) for t, p in partitions],
            min_index=self._index_seen,
        )
        response = self._connections.read("FetchOffsets", request, node)
        self._saw(response.applied_index)
        return {(entry.topic, entry.partition): entry.offset for entry in response.offsets}

    def list_groups(self, node: str | None = None) -> list[GroupSummary]:
        """Every group with its phase, generation and member count."""
        response = self._connections.read(
            "ListGroups", kq_pb2.ListGroupsRequest(min_index=self._index_seen), node
        )
        return [GroupSummary(g.name, PHASES[g.phase], g.generation, g.members) for g in response.groups]

    def describe_group(self, group: str, node: str | None = None) -> GroupDescription:
        """The group's members and per-partition committed offset, log end and lag."""
        request = kq_pb2.DescribeGroupRequest(group=group, min_index=self._index_seen)
        response = self._connections.read("DescribeGroup", request, node)
        self._saw(response.applied_index)
        state = response.group
        members = tuple(
            GroupMemberInfo(
                m.member_id,
                m.client_id,
                tuple(m.topics) or (m.topic_pattern,),
                tuple((tp.topic, tp.partition) for tp in m.assignment),
            )
            for m in state.members
        )
        lags = tuple(
            PartitionLag(
                p.topic,
                p.partition,
                p.member_id,
                p.committed_offset if p.has_committed else None,
                p.log_end_offset,
                p.lag,
                p.log_start_offset,
            )
            for p in response.partitions
        )
        return GroupDescription(
            state.name,
            PHASES[state.phase],
            state.generation,
            state.assignor,
            members,
            lags,
            response.served_by,
        )

    def reset_offsets(
        self, group: str, topics: Sequence[str], to: str, *, offset: int = 0, timestamp_ms: int = 0
    ) -> dict[tuple[str, int], int]:
        """Moves a group without active members to `to` (earliest, latest, offset, timestamp)."""
        if to not in RESET_TARGETS:
            raise ValueError(f"reset target must be one of {', '.join(RESET_TARGETS)}")
        request = kq_pb2.ResetOffsetsRequest(
            group=group, topics=topics, target=RESET_TARGETS[to], offset=offset, timestamp_ms=timestamp_ms
        )
        response = self._connections.write("ResetOffsets", request)
        self._saw(response.index)
        return {(entry.topic, entry.partition): entry.offset for entry in response.offsets}

    def delete_group(self, group: str) -> None:
        """Deletes a group without active members and its committed offsets."""
        self._saw(self._connections.write("DeleteGroup", kq_pb2.DeleteGroupRequest(group=group)).index)


def _entries(offsets: Iterable[tuple[tuple[str, int], int]]) -> list[kq_pb2.OffsetEntry]:
    return [kq_pb2.OffsetEntry(topic=t, partition=p, offset=o) for (t, p), o in sorted(offsets)]
