"""Group calls of `KqClient` (a mixin): membership, offsets and the admin queries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from kq.client.connection import Connections
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
    """Consumer-group calls; `KqClient` provides `_connections`, `_saw`, `_index_of`, `_coordinator`
    and `_group_leader_addresses`. A consumer group's calls go to its coordinator group (a Raft
    group, by a hash of its name: kq.proto.placement; group 0 in a cluster of one group), with that
    group's read-your-writes index."""

    _connections: Connections

    def _saw(self, index: int, group: int = 0) -> None:
        raise NotImplementedError

    def _index_of(self, group: int) -> int:
        raise NotImplementedError

    def _coordinator(self, group_name: str) -> int:
        raise NotImplementedError

    def _group_leader_addresses(self) -> list[tuple[int, str | None]]:
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
        coordinator = self._coordinator(group)
        response = self._connections.write("JoinGroup", request, group=coordinator)
        while response.rebalancing:  # Others have yet to rejoin: wait again under the id given.
            request.member_id = response.member_id
            response = self._connections.write("JoinGroup", request, group=coordinator)
        self._saw(response.index, coordinator)
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
        return bool(self._connections.write("Heartbeat", request, group=self._coordinator(group)).rebalancing)

    def leave_group(self, group: str, member_id: str) -> None:
        """Leaves at once, so the member's partitions move without waiting for its session to expire."""
        request = kq_pb2.LeaveGroupRequest(group=group, member_id=member_id)
        self._connections.write("LeaveGroup", request, group=self._coordinator(group))

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
        coordinator = self._coordinator(group)
        self._saw(self._connections.write("CommitOffsets", request, group=coordinator).index, coordinator)

    def committed_offsets(
        self, group: str, partitions: Iterable[tuple[str, int]] = (), node: str | None = None
    ) -> dict[tuple[str, int], int]:
        """The group's committed offsets (for the given partitions, or all)."""
        coordinator = self._coordinator(group)
        request = kq_pb2.FetchOffsetsRequest(
            group=group,
            partitions=[kq_pb2.TopicPartition(topic=t, partition=p) for t, p in partitions],
            min_index=self._index_of(coordinator),
        )
        response = self._connections.read("FetchOffsets", request, node, group=coordinator)
        self._saw(response.applied_index, coordinator)
        return {(entry.topic, entry.partition): entry.offset for entry in response.offsets}

    def list_groups(self, node: str | None = None) -> list[GroupSummary]:
        """Every group with its phase, generation and member count (from each Raft group's leader when
        the cluster has several: each coordinates its own consumer groups)."""
        addresses = [(0, node)] if node is not None else self._group_leader_addresses()
        found: dict[str, GroupSummary] = {}
        for group, address in addresses:
            response = self._connections.read(
                "ListGroups", kq_pb2.ListGroupsRequest(min_index=self._index_of(group)), address
            )
            for g in response.groups:
                found[g.name] = GroupSummary(g.name, PHASES[g.phase], g.generation, g.members)
        return [found[name] for name in sorted(found)]

    def describe_group(self, group: str, node: str | None = None) -> GroupDescription:
        """The group's members and per-partition committed offset, log end and lag."""
        coordinator = self._coordinator(group)
        request = kq_pb2.DescribeGroupRequest(group=group, min_index=self._index_of(coordinator))
        response = self._connections.read("DescribeGroup", request, node, group=coordinator)
        self._saw(response.applied_index, coordinator)
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
        coordinator = self._coordinator(group)
        response = self._connections.write("ResetOffsets", request, group=coordinator)
        self._saw(response.index, coordinator)
        return {(entry.topic, entry.partition): entry.offset for entry in response.offsets}

    def delete_group(self, group: str) -> None:
        """Deletes a group without active members and its committed offsets."""
        coordinator = self._coordinator(group)
        request = kq_pb2.DeleteGroupRequest(group=group)
        self._saw(self._connections.write("DeleteGroup", request, group=coordinator).index, coordinator)


def _entries(offsets: Iterable[tuple[tuple[str, int], int]]) -> list[kq_pb2.OffsetEntry]:
    return [kq_pb2.OffsetEntry(topic=t, partition=p, offset=o) for (t, p), o in sorted(offsets)]
