"""Kafka's classic consumer-group protocol inside apply: join, sync, leave and commit rules.

A Kafka group is a group whose `protocol_type` is not empty (Kafka clients send "consumer"). It
lives in the same replicated store as kq's own groups, with the same phases, generations, rebalance
barrier, expiry and committed offsets; what differs is who assigns. kq's groups are assigned inside
apply; a Kafka group's leader member (the first member to join, kept while it stays) computes the
assignment in the client and sends it in its SyncGroup, and apply only stores the opaque bytes.

Phases as Kafka names them: EMPTY is Empty; REBALANCING is PreparingRebalance until every member
has rejoined, then the generation advances, the protocol and the leader are chosen and the group
awaits its leader's SyncGroup (`awaiting_sync`: CompletingRebalance); STABLE is Stable.

Everything here is pure and deterministic: functions change the loaded `GroupState` in place and
return Kafka's error code (0: applied); raft/groups.py loads and saves the state, and saves nothing
when the code is not 0. Commands passed raft/validation.py first (ids, protocols, bytes, counts), so
each step is bounded by GROUP_MEMBERS_MAX x GROUP_PROTOCOLS_MAX; the saved state stays within
GROUP_STATE_BYTES_MAX.
"""

from __future__ import annotations

from collections.abc import Iterable

from kq.proto import kq_pb2
from kq.proto.limits import GROUP_MEMBERS_MAX, GROUP_STATE_BYTES_MAX
from kq.raft import consumer_groups

# Kafka protocol error codes decided here (kio.schema.errors.ErrorCode names them all).
NONE = 0
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
UNKNOWN_MEMBER_ID = 25
REBALANCE_IN_PROGRESS = 27
GROUP_MAX_SIZE_REACHED = 81
FENCED_INSTANCE_ID = 82

# The state names of Kafka's DescribeGroups and ListGroups.
EMPTY, PREPARING, COMPLETING, STABLE, DEAD = (
    "Empty",
    "PreparingRebalance",
    "CompletingRebalance",
    "Stable",
    "Dead",
)


def state_name(state: kq_pb2.GroupState) -> str:
    """The group's state as Kafka names it (kq's own groups and consumer groups too)."""
    if state.type == kq_pb2.GROUP_TYPE_CONSUMER:
        return consumer_groups.state_name(state)
    if state.phase == kq_pb2.GROUP_STABLE:
        return STABLE
    if state.phase == kq_pb2.GROUP_REBALANCING:
        return COMPLETING if state.awaiting_sync else PREPARING
    return EMPTY


def find(state: kq_pb2.GroupState, member_id: str) -> kq_pb2.GroupMember | None:
    """The member of `state` with that id, or None."""
    return next((m for m in state.members if m.member_id == member_id), None)


def join(state: kq_pb2.GroupState, command: kq_pb2.KafkaJoinGroupCommand) -> int:
    """Applies a Kafka member's JoinGroup to `state`; Kafka's error code.

    A new member, changed protocols, or the leader rejoining a stable group begins a rebalance
    (Kafka does the same: the leader rejoins when it sees new partitions). A known member rejoining
    with the same protocols otherwise changes nothing and gets the current generation. A static
    member (group_instance_id) that comes back without a member id replaces its old member id; if
    the group is stable and its protocols are unchanged, without a rebalance (KIP-345).
    """
    joining = command.member
    if state.members and state.protocol_type != command.protocol_type:
        return INCONSISTENT_GROUP_PROTOCOL  # Also a Kafka client joining a kq group with members.
    if not state.members:
        _adopt(state, command.protocol_type)
    member = find(state, joining.member_id)
    if joining.group_instance_id:
        static = next((m for m in state.members if m.group_instance_id == joining.group_instance_id), None)
        if static is not None and static.member_id != joining.member_id:
            if not command.new_member_id:
                return FENCED_INSTANCE_ID  # An older instance, still using the id it was replaced under.
            unchanged = _same_protocols(static.protocols, joining.protocols)
            _replace_id(state, static, joining.member_id)
            member = static
            if state.phase == kq_pb2.GROUP_STABLE and unchanged:
                _refresh(member, joining)
                return _within_size(state)
    if member is not None and member.group_instance_id != joining.group_instance_id:
        return FENCED_INSTANCE_ID
    if not _supported(state, joining):
        return INCONSISTENT_GROUP_PROTOCOL
    return _join_member(state, member, command)


def _join_member(
    state: kq_pb2.GroupState, member: kq_pb2.GroupMember | None, command: kq_pb2.KafkaJoinGroupCommand
) -> int:
    """Adds or refreshes the (known, supported) member and moves the rebalance on."""
    joining = command.member
    existed = member is not None
    if member is None:
        if len(state.members) >= GROUP_MEMBERS_MAX:
            return GROUP_MAX_SIZE_REACHED
        member = state.members.add()
        member.CopyFrom(joining)
        changed = True
    else:
        changed = not _same_protocols(member.protocols, joining.protocols)
        _refresh(member, joining)
    member.rejoined = True
    problem = _within_size(state)
    if problem != NONE:
        return problem
    preparing = state.phase == kq_pb2.GROUP_REBALANCING and not state.awaiting_sync
    stable = state.phase == kq_pb2.GROUP_STABLE
    leader_rejoins_stable = stable and member.member_id == state.leader_member_id
    empty = state.phase == kq_pb2.GROUP_EMPTY
    if not preparing and (changed or not existed or leader_rejoins_stable or empty):
        begin_rebalance(state, command.now_ms, keep=member.member_id)
    complete_if_ready(state)
    return NONE


def sync(state: kq_pb2.GroupState, command: kq_pb2.KafkaSyncGroupCommand) -> int:
    """Stores the leader's assignments for its generation; the group becomes stable.

    Only the leader's SyncGroup is proposed; a SyncGroup that finds the group already stable at its
    generation (a retry) changes nothing.
    """
    member = find(state, command.member_id)
    if member is None:
        return UNKNOWN_MEMBER_ID
    if command.generation != state.generation:
        return ILLEGAL_GENERATION
    if state.phase == kq_pb2.GROUP_REBALANCING and not state.awaiting_sync:
        return REBALANCE_IN_PROGRESS
    if state.phase != kq_pb2.GROUP_REBALANCING or command.member_id != state.leader_member_id:
        return NONE
    given = {assignment.member_id: assignment.assignment for assignment in command.assignments}
    for each in state.members:
        each.kafka_assignment = given.get(each.member_id, b"")
    state.phase = kq_pb2.GROUP_STABLE
    state.awaiting_sync = False
    return _within_size(state)


def after_leave(state: kq_pb2.GroupState, removed: Iterable[str], now_ms: int) -> None:
    """What members leaving (or expiring) does to a Kafka group: the rest rebalance."""
    if state.leader_member_id in set(removed):
        state.leader_member_id = ""  # The next generation's leader is chosen when it completes.
    if state.phase == kq_pb2.GROUP_STABLE or state.awaiting_sync:
        begin_rebalance(state, now_ms, keep=None)
    complete_if_ready(state)


def commit_problem(state: kq_pb2.GroupState | None, command: kq_pb2.CommitOffsetsCommand) -> int:
    """Kafka's OffsetCommit rules: Kafka's error code, or 0 when the offsets may be written.

    An empty member id (generation -1 on the wire) commits outside group management, which only a
    group without members allows; otherwise the member must be in the group at its generation, and
    a group awaiting its leader's SyncGroup answers REBALANCE_IN_PROGRESS (the member learned its
    generation but not its partitions yet).
    """
    if not command.member_id:
        return UNKNOWN_MEMBER_ID if state is not None and state.members else NONE
    if state is None or find(state, command.member_id) is None:
        return UNKNOWN_MEMBER_ID
    if command.generation != state.generation:
        return ILLEGAL_GENERATION
    if state.phase == kq_pb2.GROUP_REBALANCING and state.awaiting_sync:
        return REBALANCE_IN_PROGRESS
    return NONE


def begin_rebalance(state: kq_pb2.GroupState, now_ms: int, keep: str | None) -> None:
    """Every member but `keep` must rejoin before the next generation."""
    state.phase = kq_pb2.GROUP_REBALANCING
    state.awaiting_sync = False
    state.phase_started_ms = now_ms
    for member in state.members:
        member.rejoined = member.member_id == keep


def complete_if_ready(state: kq_pb2.GroupState) -> None:
    """Ends the join phase once every member rejoined: the next generation, its leader and protocol.

    The leader stays if it is still a member, else it is the first member (the earliest joined); the
    protocol is the first of the leader's that every member supports (the joins kept that set
    non-empty). The assignments wait for the leader's SyncGroup.
    """
    if state.phase != kq_pb2.GROUP_REBALANCING or state.awaiting_sync:
        return
    if not all(member.rejoined for member in state.members):
        return
    state.generation += 1
    if not state.members:
        state.phase = kq_pb2.GROUP_EMPTY
        state.protocol = ""
        state.leader_member_id = ""
        return
    leader = find(state, state.leader_member_id) or state.members[0]
    state.leader_member_id = leader.member_id
    common = _common_protocols(state.members)
    state.protocol = next(
        (p.name for p in leader.protocols if p.name in common),
        leader.protocols[0].name if leader.protocols else "",
    )
    for member in state.members:
        member.kafka_assignment = b""
    state.awaiting_sync = True


def _adopt(state: kq_pb2.GroupState, protocol_type: str) -> None:
    """An empty group (a new one, or any group without members) becomes a Kafka group of that type."""
    state.protocol_type = protocol_type
    state.protocol = ""
    state.leader_member_id = ""
    state.awaiting_sync = False


def _supported(state: kq_pb2.GroupState, joining: kq_pb2.GroupMember) -> bool:
    """Whether the joiner offers a protocol every other member supports (Kafka's check)."""
    others = [m for m in state.members if m.member_id != joining.member_id]
    if not others:
        return True
    common = _common_protocols(others)
    return any(protocol.name in common for protocol in joining.protocols)


def _common_protocols(members: Iterable[kq_pb2.GroupMember]) -> set[str]:
    common: set[str] | None = None
    for member in members:
        names = {protocol.name for protocol in member.protocols}
        common = names if common is None else common & names
    return common or set()


def _same_protocols(left: Iterable[kq_pb2.KafkaProtocol], right: Iterable[kq_pb2.KafkaProtocol]) -> bool:
    return [(p.name, p.metadata) for p in left] == [(p.name, p.metadata) for p in right]


def _refresh(member: kq_pb2.GroupMember, joining: kq_pb2.GroupMember) -> None:
    """The member's settings and protocols from its join; its assignment and id stay."""
    member.client_id = joining.client_id
    member.client_host = joining.client_host
    member.session_timeout_ms = joining.session_timeout_ms
    member.rebalance_timeout_ms = joining.rebalance_timeout_ms
    del member.protocols[:]
    member.protocols.extend(joining.protocols)


def _replace_id(state: kq_pb2.GroupState, member: kq_pb2.GroupMember, member_id: str) -> None:
    """A static member's new instance takes over its entry (and its leadership) under a new id."""
    if state.leader_member_id == member.member_id:
        state.leader_member_id = member_id
    member.member_id = member_id


def _within_size(state: kq_pb2.GroupState) -> int:
    return GROUP_MAX_SIZE_REACHED if state.ByteSize() > GROUP_STATE_BYTES_MAX else NONE
