"""Membership changes of a cluster whose nodes run worker processes: one change, made in every Raft group.

Each Raft group has voters of its own (PySyncObj's, one instance a group), and node n's replica of
group g is n's worker process g (broker/workers.py). So adding node n to the cluster adds n's process
of group g to group g's voters, for every g, and removing it removes them all.

AddNode and RemoveNode go to the metadata group's leader (group 0's: the cluster's members are part of
the cluster's state). It checks the change as a single group's leader does (`MembershipChanges`: the
new node answers with the id, Raft address and number of groups asked for, a majority stays), then
asks the leader of each other group, 1, 2, ... in order, to make the change in its group alone
(`AddNodeRequest.group`, `RemoveNodeRequest.group`, with that group's addresses: the node's moved by
g), and makes it in group 0 last.

Crash safety: every step can be made twice (adding a voter again, removing one that is gone: no
error, `missing_ok`), and group 0 changes last, so group 0's voters say whether a change is complete.
A change cut short at any point (the leader killed, a group without a leader for
MEMBERSHIP_GROUPS_TIMEOUT_S: UNAVAILABLE) is completed by asking again, which kq's client does on its
own: the retry's walk finds the groups done already and goes on. Until then some groups have the node
and others not. A group that has it may elect it (it is a full voter there); processes of groups that
lack it name its addresses from its registration in group 0, made before the walk
(`GroupsView.process`).

Threads: the gRPC worker thread of the AddNode or RemoveNode call; the walk blocks it, group after
group, for MEMBERSHIP_GROUPS_TIMEOUT_S at most (the client waits MEMBERSHIP_CLIENT_TIMEOUT_S).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import grpc

from kq.broker.deadlines import capped
from kq.broker.errors import InvalidArgumentError, MembershipError, UnavailableError
from kq.broker.groups_view import GroupsView
from kq.broker.membership import MembershipChanges, MembershipView, Probe, node_channel, probe_node
from kq.broker.workers import shifted
from kq.proto import kq_pb2, kq_pb2_grpc
from kq.proto.errors import ErrorCode, code_from_metadata, spec_of
from kq.proto.limits import (
    LEADERSHIP_CHECK_S,
    MEMBER_JOIN_WAIT_S,
    MEMBER_PROBE_TIMEOUT_S,
    MEMBERSHIP_CALL_TIMEOUT_S,
    MEMBERSHIP_GROUPS_TIMEOUT_S,
)
from kq.raft.placement import METADATA_GROUP

logger = logging.getLogger(__name__)

GroupRequest = kq_pb2.AddNodeRequest | kq_pb2.RemoveNodeRequest  # One group's part of a change.
# Sends one group's part of a change to a process: (its gRPC address, the request, a timeout in s).
GroupCall = Callable[[str, GroupRequest, float], None]


def group_call(
    credentials: grpc.ChannelCredentials | None, metadata: tuple[tuple[str, str], ...]
) -> GroupCall:
    """A GroupCall over gRPC with the node's own TLS as a client (None: plain text) and node proof
    (broker/auth.py: a node may change the voters whatever the ACLs say)."""

    def call(address: str, request: GroupRequest, timeout_s: float) -> None:
        with node_channel(address, credentials) as channel:
            stub = kq_pb2_grpc.BrokerStub(channel)
            if isinstance(request, kq_pb2.AddNodeRequest):
                stub.AddNode(request, timeout=timeout_s, metadata=metadata)
            else:
                stub.RemoveNode(request, timeout=timeout_s, metadata=metadata)

    return call


def moved_member(member: kq_pb2.Member, group: int) -> kq_pb2.Member:
    """`member` (a node's addresses, its group 0 process's) as its process of `group`."""
    return kq_pb2.Member(
        node_id=member.node_id,
        raft_address=shifted(member.raft_address, group),
        grpc_address=shifted(member.grpc_address, group),
        kafka_address=shifted(member.kafka_address, group),  # "" (no Kafka listener) stays "".
        rack=member.rack,
    )


class ClusterChanges:
    """AddNode and RemoveNode as this process serves them: the whole cluster's change on the metadata
    group's leader (with several groups: every group, above), or one group's part of it."""

    def __init__(
        self,
        own: MembershipChanges,
        groups: GroupsView,
        call: GroupCall | None = None,
        probe: Probe = probe_node,
    ) -> None:
        """`own`: this process's group's changes; `call`: how to ask another group's leader (None with
        one group); `probe`: asks a node's process for its status (`own`'s probe)."""
        assert not groups.several or call is not None, "several groups: a way to reach their leaders"
        self._own = own
        self._groups = groups
        self._call = call
        self._probe = probe

    def check_scope(self, group: int) -> None:
        """INVALID_REQUEST unless this process may make a change of scope `group` (0: the cluster's,
        for the metadata group's process; g: group g's part, for group g's process, g > 0)."""
        if group == 0 and self._groups.group == METADATA_GROUP:
            return
        if group != 0 and group == self._groups.group:
            return
        if group == 0:
            raise InvalidArgumentError(
                f"membership changes are made on Raft group {METADATA_GROUP}'s processes, not group "
                f"{self._groups.group}'s"
            )
        raise InvalidArgumentError(
            f"this process serves Raft group {self._groups.group}, not group {group} "
            f"(the cluster has {self._groups.count})"
        )

    def add(self, member: kq_pb2.Member, group: int = 0) -> MembershipView:
        """Adds `member` (scope `group`, as `check_scope`); the view of this process's group after."""
        self.check_scope(group)
        if group or not self._groups.several:
            return self._own.add(member)

        def request(other: int) -> GroupRequest:
            moved = moved_member(member, other)
            self._wait_answers(moved, other)  # Its workers start together: group 0's answered.
            return kq_pb2.AddNodeRequest(member=moved, group=other)

        return self._own.add(member, before=lambda: self._everywhere(request, f"added node {member.node_id}"))

    def remove(self, node_id: str, group: int = 0) -> MembershipView:
        """Removes node `node_id` (scope `group`); the view of this process's group after."""
        self.check_scope(group)
        if not self._groups.several:
            return self._own.remove(node_id)
        if group:
            return self._own.remove(node_id, missing_ok=True)

        def request(other: int) -> GroupRequest:
            return kq_pb2.RemoveNodeRequest(node_id=node_id, group=other)

        return self._own.remove(node_id, before=lambda: self._everywhere(request, f"removed node {node_id}"))

    def _everywhere(self, request: Callable[[int], GroupRequest], done: str) -> None:
        """Makes the change in groups 1.. in order, each through its leader (`request(g)`: group g's)."""
        deadline = time.monotonic() + capped(MEMBERSHIP_GROUPS_TIMEOUT_S)  # Within the call's deadline.
        for group in range(1, self._groups.count):
            self._in_group(group, request(group), deadline)
        logger.info("%s in Raft groups 1..%d", done, self._groups.count - 1)

    def _wait_answers(self, member: kq_pb2.Member, group: int) -> None:
        """Waits until the new node's process of `group` answers (its worker may still be starting
        when group 0's answered), MEMBER_JOIN_WAIT_S at most; then UNAVAILABLE."""
        deadline = time.monotonic() + capped(MEMBER_JOIN_WAIT_S)
        while True:
            try:
                self._probe(member.grpc_address, MEMBER_PROBE_TIMEOUT_S)
                return
            except grpc.RpcError as error:
                if time.monotonic() >= deadline:
                    raise UnavailableError(
                        f"node {member.node_id}'s process of Raft group {group} does not answer at "
                        f"{member.grpc_address} ({_status(error).name}); retry once it runs",
                        ErrorCode.LEADER_UNKNOWN,
                    ) from error
            time.sleep(LEADERSHIP_CHECK_S)

    def _in_group(self, group: int, request: GroupRequest, deadline: float) -> None:
        """Sends `request` to `group`'s leader until it is done; retriable failures (no leader, a
        leader that changed or hands over, a pending change) are tried again until `deadline`."""
        assert self._call is not None
        why = "its leader is not known"
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise UnavailableError(
                    f"Raft group {group}'s part of the membership change is not done ({why}); retry: "
                    "the groups done so far stay done",
                    ErrorCode.LEADER_UNKNOWN,
                )
            process = self._groups.leader_process(group)
            if process is not None:
                try:
                    self._call(process.grpc_address, request, min(remaining, MEMBERSHIP_CALL_TIMEOUT_S))
                    return
                except grpc.RpcError as error:
                    why = _retry_reason(error, group)
            time.sleep(LEADERSHIP_CHECK_S)


def _retry_reason(error: grpc.RpcError, group: int) -> str:
    """Why a group's part failed, when it may succeed later; raises MembershipError when it will not."""
    status = _status(error)
    details = (error.details() if isinstance(error, grpc.Call) else "") or status.name
    metadata: Sequence[object] = error.trailing_metadata() if isinstance(error, grpc.Call) else ()
    code = code_from_metadata(metadata)
    if code is not None:
        if spec_of(code).retriable:
            return details
    elif status in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return details  # Its leader died or is busy: the board names the next one soon.
    raise MembershipError(f"Raft group {group} refused its part of the change: {details}")


def _status(error: grpc.RpcError) -> grpc.StatusCode:
    return error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
