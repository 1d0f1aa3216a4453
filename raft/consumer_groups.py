"""Kafka's consumer-group protocol (KIP-848) inside apply: heartbeats, target assignment, reconciliation.

A consumer group (`GroupState.type` GROUP_TYPE_CONSUMER) lives in the same replicated store as kq's
groups and Kafka's classic groups. Its `generation` is the group epoch; `assignment_epoch` the epoch
of its target assignment; each member carries its member epoch, the partitions it owns
(`assignment`), those it must revoke (`revoking`) and its share of the target (`target`).

What apply decides, as Kafka's group coordinator does (GroupMetadataManager, CurrentAssignmentBuilder):
- A member joining (epoch 0), leaving (-1, -2), changing its subscription or assignor, or the sizes
  of the subscribed topics changing, bumps the group epoch; the target assignment is then computed
  at once, in the same command, by the group's server assignor ("uniform": balanced and sticky;
  "range": Kafka's per-topic ranges), so the assignment epoch always equals the group epoch after a
  command (Kafka's Assigning state never lasts).
- Only the heartbeating member is reconciled (Kafka's rule): it keeps what its target keeps; if it
  owns partitions its target lost, it must revoke them first (UNREVOKED_PARTITIONS, its epoch
  stays); partitions of its target that another member still owns or revokes are withheld
  (UNRELEASED_PARTITIONS) until that member's heartbeat reports them revoked. So a partition is
  owned by one member at a time, and no member stops consuming what it keeps (no stop-the-world).
- The member epoch check: a member may only send its epoch, or its previous epoch with owned
  partitions within its assignment (a lost response); anything else is FENCED_MEMBER_EPOCH.

Why apply computes the assignment (and not the proposing leader): heartbeats of several members are
batched into one Raft entry, so only apply sees them in their committed order; a proposer working
from the state before its entry could give one partition to two members. The cost is bounded: one
command costs at most members x subscribed partitions (ASSIGNMENT_WORK_MAX, as kq's own groups) plus
the topic catalog, and the state stays within GROUP_STATE_BYTES_MAX. Nothing here reads a clock: the
command carries the leader's `now_ms`.

Everything is pure: functions change the loaded `GroupState` in place and return Kafka's error code
(0: applied); raft/groups.py loads and saves the state, and saves nothing when the code is not 0. The
broker's edge runs the same `heartbeat` on a copy of the stored state first: an answer that changes
nothing is given without a Raft entry (a steady member's heartbeat costs no write).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from kq.proto import kq_pb2
from kq.proto.limits import (
    ASSIGNMENT_WORK_MAX,
    CONSUMER_ASSIGNORS,
    CONSUMER_GROUP_MEMBERS_MAX,
    GROUP_STATE_BYTES_MAX,
)
from kq.raft.assignors import Assignment, Subscriptions, assign_range, assign_sticky
from kq.raft.patterns import matching

# Kafka protocol error codes decided here.
NONE = 0
UNKNOWN_MEMBER_ID = 25
GROUP_ID_NOT_FOUND = 69
GROUP_MAX_SIZE_REACHED = 81
FENCED_INSTANCE_ID = 82
FENCED_MEMBER_EPOCH = 110
UNRELEASED_INSTANCE_ID = 111
UNSUPPORTED_ASSIGNOR = 112
STALE_MEMBER_EPOCH = 113

PROTOCOL_TYPE = "consumer"
LEAVE_EPOCH = -1
LEAVE_STATIC_EPOCH = -2

# The group states of ConsumerGroupDescribe and ListGroups (Kafka's ConsumerGroupState).
EMPTY, ASSIGNING, RECONCILING, STABLE = "Empty", "Assigning", "Reconciling", "Stable"

ASSIGNOR_FUNCTIONS = {"uniform": assign_sticky, "range": assign_range}
assert tuple(ASSIGNOR_FUNCTIONS) == CONSUMER_ASSIGNORS

TopicPartition = tuple[str, int]
Catalog = Mapping[str, int]  # Every topic's partition count, by name (this replica's store).


def is_consumer_group(state: kq_pb2.GroupState | None) -> bool:
    """Whether `state` is a KIP-848 consumer group."""
    return state is not None and state.type == kq_pb2.GROUP_TYPE_CONSUMER


def state_name(state: kq_pb2.GroupState) -> str:
    """The consumer group's state as Kafka names it."""
    if not state.members:
        return EMPTY
    if state.assignment_epoch != state.generation:
        return ASSIGNING
    settled = all(
        m.member_epoch == state.assignment_epoch and m.member_state == kq_pb2.CONSUMER_MEMBER_STABLE
        for m in state.members
    )
    return STABLE if settled else RECONCILING


def find(state: kq_pb2.GroupState, member_id: str) -> kq_pb2.GroupMember | None:
    """The member of `state` with that id, or None."""
    return next((m for m in state.members if m.member_id == member_id), None)


def pairs(partitions: Iterable[kq_pb2.TopicPartition]) -> list[TopicPartition]:
    """(topic, partition) pairs, sorted."""
    return sorted((tp.topic, tp.partition) for tp in partitions)


def heartbeat(state: kq_pb2.GroupState, command: kq_pb2.ConsumerHeartbeatCommand, catalog: Catalog) -> int:
    """Applies one ConsumerGroupHeartbeat to `state` (new, or loaded); Kafka's error code.

    The command passed raft/validation.py (ids, subscription, assignor, counts)."""
    if state.type != kq_pb2.GROUP_TYPE_CONSUMER:
        if state.members or command.member_epoch != 0:
            # Kafka: only a joining heartbeat creates a consumer group, and not over a classic (or kq)
            # group with members ("Group g is not a consumer group." / "Group g not found.").
            return GROUP_ID_NOT_FOUND
        _adopt(state)
    if command.member_epoch in (LEAVE_EPOCH, LEAVE_STATIC_EPOCH):
        return _leave(state, command, catalog)
    member = find(state, command.member.member_id)
    if command.member_epoch == 0:
        member, bumped, code = _joining(state, member, command)
        if code != NONE:
            return code
        assert member is not None
    else:
        if member is None or member.static_left:
            return UNKNOWN_MEMBER_ID
        instance_id = command.member.group_instance_id
        if instance_id and member.group_instance_id and instance_id != member.group_instance_id:
            return FENCED_INSTANCE_ID
        code = _epoch_code(member, command)
        if code != NONE:
            return code
        bumped = False
    bumped = _update(member, command) or bumped
    sizes = _sizes(state, catalog)
    if bumped or sizes != [(s.topic, s.partitions) for s in state.subscribed_sizes]:
        _new_target(state, catalog, sizes)
    _reconcile(state, member, command)
    return GROUP_MAX_SIZE_REACHED if state.ByteSize() > GROUP_STATE_BYTES_MAX else NONE


def _joining(
    state: kq_pb2.GroupState, member: kq_pb2.GroupMember | None, command: kq_pb2.ConsumerHeartbeatCommand
) -> tuple[kq_pb2.GroupMember | None, bool, int]:
    """A member joining (epoch 0): (the member, whether the group epoch must move, Kafka's code).

    A static member's new instance (its group_instance_id, a new member id) takes the place of the
    old one if that left with epoch -2, keeping its partitions, epoch and target (KIP-848's static
    membership: no rebalance); while the old one is still a member it is UNRELEASED_INSTANCE_ID."""
    instance_id = command.member.group_instance_id
    holder = None
    if instance_id:
        holder = next((m for m in state.members if m.group_instance_id == instance_id), None)
    if holder is not None and holder.member_id != command.member.member_id:
        if not holder.static_left or member is not None:
            return None, False, UNRELEASED_INSTANCE_ID
        holder.member_id = command.member.member_id
        holder.static_left = False
        return holder, False, NONE
    if member is None:
        if len(state.members) >= CONSUMER_GROUP_MEMBERS_MAX:
            return None, False, GROUP_MAX_SIZE_REACHED
        member = state.members.add(member_id=command.member.member_id)
        _restart(member)
        return member, True, NONE
    _restart(member)  # A member rejoining owns nothing (its request said so).
    return member, False, NONE


def remove_members(state: kq_pb2.GroupState, member_ids: Iterable[str], catalog: Catalog) -> bool:
    """Removes members (leaving or expired): their partitions are free, the others get a new target.
    False when none of them is in the group."""
    leaving = set(member_ids)
    remaining = [m for m in state.members if m.member_id not in leaving]
    if len(remaining) == len(state.members):
        return False
    del state.members[:]
    state.members.extend(remaining)
    _new_target(state, catalog, _sizes(state, catalog))
    return True


def commit_problem(state: kq_pb2.GroupState, command: kq_pb2.CommitOffsetsCommand) -> int:
    """Kafka's OffsetCommit rules for a consumer group: 0 when the offsets may be written.

    An empty member id (generation -1 on the wire) commits outside the group, which only a group
    without members allows; otherwise the member must be in the group and send its member epoch
    (STALE_MEMBER_EPOCH, as ConsumerGroup.validateOffsetCommit)."""
    if not command.member_id:
        return UNKNOWN_MEMBER_ID if state.members else NONE
    member = find(state, command.member_id)
    if member is None:
        return UNKNOWN_MEMBER_ID
    if command.generation != member.member_epoch:
        return STALE_MEMBER_EPOCH
    return NONE


def group_assignor(state: kq_pb2.GroupState) -> str:
    """The assignor the members ask for most (ties: by name), else Kafka's default (the first)."""
    asked = Counter(m.server_assignor for m in state.members if m.server_assignor in ASSIGNOR_FUNCTIONS)
    if not asked:
        return CONSUMER_ASSIGNORS[0]
    return min(asked, key=lambda name: (-asked[name], name))


def _adopt(state: kq_pb2.GroupState) -> None:
    """A group without members (new, or a classic one emptied) becomes a consumer group, offsets kept."""
    state.type = kq_pb2.GROUP_TYPE_CONSUMER
    state.protocol_type = PROTOCOL_TYPE
    state.protocol = state.leader_member_id = ""
    state.awaiting_sync = False
    state.phase = kq_pb2.GROUP_EMPTY
    state.assignment_epoch = state.generation
    state.assignor = CONSUMER_ASSIGNORS[0]


def _leave(state: kq_pb2.GroupState, command: kq_pb2.ConsumerHeartbeatCommand, catalog: Catalog) -> int:
    """A member leaving (-1), or a static member leaving for now (-2: it keeps its partitions until
    its instance returns or its session expires); UNKNOWN_MEMBER_ID when the group does not hold it."""
    member = find(state, command.member.member_id)
    if member is None:
        return UNKNOWN_MEMBER_ID
    if command.member_epoch == LEAVE_STATIC_EPOCH and member.group_instance_id:
        member.static_left = True
        return NONE
    remove_members(state, [member.member_id], catalog)
    return NONE


def _restart(member: kq_pb2.GroupMember) -> None:
    """A member (re)joining at epoch 0: nothing owned, nothing to revoke."""
    member.member_epoch = member.previous_member_epoch = 0
    member.member_state = kq_pb2.CONSUMER_MEMBER_STABLE
    del member.assignment[:]
    del member.revoking[:]
    member.revoking_since_ms = 0
    member.static_left = False


def _epoch_code(member: kq_pb2.GroupMember, command: kq_pb2.ConsumerHeartbeatCommand) -> int:
    """Kafka's member epoch check: its epoch, or its previous one with owned partitions it was given."""
    received = command.member_epoch
    if received == member.member_epoch:
        return NONE
    if received == member.previous_member_epoch and received < member.member_epoch:
        owned = set(pairs(command.owned))
        if set(pairs(member.assignment)) >= owned:
            return NONE
    return FENCED_MEMBER_EPOCH


def _update(member: kq_pb2.GroupMember, command: kq_pb2.ConsumerHeartbeatCommand) -> bool:
    """Takes the member's settings from its heartbeat; True when its subscription or assignor changed."""
    given = command.member
    if given.rebalance_timeout_ms:
        member.rebalance_timeout_ms = given.rebalance_timeout_ms
    member.session_timeout_ms = given.session_timeout_ms
    member.client_id = given.client_id
    member.client_host = given.client_host
    if given.group_instance_id:
        member.group_instance_id = given.group_instance_id
    if given.rack_id:
        member.rack_id = given.rack_id
    changed = False
    if given.server_assignor and given.server_assignor != member.server_assignor:
        member.server_assignor = given.server_assignor
        changed = True
    if command.subscription_set:
        subscription = (sorted(set(given.topics)), given.topic_pattern)
        if subscription != (list(member.topics), member.topic_pattern):
            del member.topics[:]
            member.topics.extend(subscription[0])
            member.topic_pattern = given.topic_pattern
            changed = True
    return changed


def _subscriptions(state: kq_pb2.GroupState, catalog: Catalog) -> Subscriptions:
    """Each member's existing subscribed topics: its names, or the topics its pattern matches in full
    (RE2, validated at the edge; members sharing a pattern share one pass over the names)."""
    names = sorted(catalog)
    by_pattern: dict[str, frozenset[str]] = {}
    result: Subscriptions = {}
    for member in state.members:
        if member.topic_pattern:
            if member.topic_pattern not in by_pattern:
                by_pattern[member.topic_pattern] = matching(member.topic_pattern, names)
            result[member.member_id] = by_pattern[member.topic_pattern]
        else:
            result[member.member_id] = frozenset(t for t in member.topics if t in catalog)
    return result


def _sizes(state: kq_pb2.GroupState, catalog: Catalog) -> list[tuple[str, int]]:
    """The subscribed topics' partition counts, in name order, within the assignment work budget:
    topics past it (members x partitions > ASSIGNMENT_WORK_MAX) wait, the same ones on every replica."""
    wanted = frozenset().union(*_subscriptions(state, catalog).values()) if state.members else frozenset()
    sizes, total = [], 0
    for topic in sorted(wanted):
        total += catalog[topic]
        if total * max(len(state.members), 1) > ASSIGNMENT_WORK_MAX:
            break
        sizes.append((topic, catalog[topic]))
    return sizes


def _new_target(state: kq_pb2.GroupState, catalog: Catalog, sizes: Sequence[tuple[str, int]]) -> None:
    """Bumps the group epoch and computes the target assignment at it (the group's server assignor)."""
    state.generation += 1
    state.phase = kq_pb2.GROUP_STABLE if state.members else kq_pb2.GROUP_EMPTY
    state.assignor = group_assignor(state)
    del state.subscribed_sizes[:]
    state.subscribed_sizes.extend(kq_pb2.TopicSize(topic=t, partitions=n) for t, n in sizes)
    subscriptions = _subscriptions(state, catalog)
    previous: Assignment = {m.member_id: pairs(m.target) for m in state.members}
    target = ASSIGNOR_FUNCTIONS[state.assignor](subscriptions, dict(sizes), previous)
    for member in state.members:
        del member.target[:]
        member.target.extend(kq_pb2.TopicPartition(topic=t, partition=p) for t, p in target[member.member_id])
    state.assignment_epoch = state.generation


def _reconcile(
    state: kq_pb2.GroupState, member: kq_pb2.GroupMember, command: kq_pb2.ConsumerHeartbeatCommand
) -> None:
    """Moves the heartbeating member toward its target (Kafka's CurrentAssignmentBuilder)."""
    if member.member_state == kq_pb2.CONSUMER_MEMBER_UNREVOKED_PARTITIONS:
        if not command.owned_set or set(pairs(command.owned)) & set(pairs(member.revoking)):
            return  # Still owns some of what it must revoke: it waits, and so do their next owners.
        del member.revoking[:]  # Revoked: they are free for their new owners.
        member.revoking_since_ms = 0
    elif (
        member.member_epoch == state.assignment_epoch and member.member_state == kq_pb2.CONSUMER_MEMBER_STABLE
    ):
        return
    owned = set(pairs(member.assignment))
    target = set(pairs(member.target))
    revoke = owned - target
    keep = owned & target
    if revoke:
        _set(member.assignment, keep)
        _set(member.revoking, revoke)
        member.revoking_since_ms = command.now_ms
        member.member_state = kq_pb2.CONSUMER_MEMBER_UNREVOKED_PARTITIONS
        return
    held = _held_by_others(state, member.member_id)
    given = {tp for tp in target - owned if tp not in held}
    _set(member.assignment, keep | given)
    released = given == target - owned
    member.member_state = (
        kq_pb2.CONSUMER_MEMBER_STABLE if released else kq_pb2.CONSUMER_MEMBER_UNRELEASED_PARTITIONS
    )
    if member.member_epoch != state.assignment_epoch:
        member.previous_member_epoch = member.member_epoch
        member.member_epoch = state.assignment_epoch


def _held_by_others(state: kq_pb2.GroupState, member_id: str) -> set[TopicPartition]:
    """The partitions other members own or are still revoking."""
    held: set[TopicPartition] = set()
    for other in state.members:
        if other.member_id != member_id:
            held.update(pairs(other.assignment))
            held.update(pairs(other.revoking))
    return held


def _set(
    field: RepeatedCompositeFieldContainer[kq_pb2.TopicPartition], partitions: Iterable[TopicPartition]
) -> None:
    del field[:]
    field.extend(kq_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(partitions))
