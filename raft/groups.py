"""Consumer-group commands inside apply: join, leave/expire, commit, reset, delete.

Kafka clients' groups share this store: the classic protocol's rules are in raft/kafka_groups.py,
the consumer-group protocol's (KIP-848) in raft/consumer_groups.py, wired here (`apply_kafka_join`,
`apply_kafka_sync`, `apply_consumer_heartbeat`, and their branches of leave and commit). A group
with members speaks one protocol: a kq member cannot join a group that has Kafka members, nor the
reverse, nor a classic member a consumer group (and the reverse).

A membership change starts a rebalance (phase REBALANCING): every member must rejoin, committing
first; when all have rejoined (or the leader expired those that did not), the generation advances
and the group's assignor computes the new assignment from the members' subscriptions and the topics
as this replica holds them, so every replica computes the same one.
"""

from __future__ import annotations

from collections.abc import Iterable

from kq.proto import kq_pb2
from kq.proto.limits import ASSIGNMENT_WORK_MAX, GROUP_MEMBERS_MAX, GROUP_STATE_BYTES_MAX, GROUPS_MAX
from kq.raft import consumer_groups, kafka_groups
from kq.raft.assignors import ASSIGNORS, Assignment, Subscriptions
from kq.raft.patterns import matching
from kq.raft.results import ErrorCode, GroupResult, KafkaGroupResult
from kq.storage import StoreWriter, TopicMeta
from kq.storage.offset_details import OffsetDetails


def load(writer: StoreWriter, name: str) -> kq_pb2.GroupState | None:
    """The stored state of group `name`, or None."""
    raw = writer.group(name)
    if raw is None:
        return None
    state = kq_pb2.GroupState()
    state.ParseFromString(raw)
    return state


def _save(writer: StoreWriter, state: kq_pb2.GroupState) -> GroupResult:
    writer.put_group(state.name, state.SerializeToString(deterministic=True))
    return GroupResult(ErrorCode.OK, state.generation, state.phase)


def _new_group(writer: StoreWriter, name: str, assignor: str) -> kq_pb2.GroupState | None:
    if len(writer.groups()) >= GROUPS_MAX:
        return None
    return kq_pb2.GroupState(name=name, generation=0, phase=kq_pb2.GROUP_EMPTY, assignor=assignor)


def offset_details(entry: kq_pb2.OffsetEntry) -> OffsetDetails:
    """The Kafka metadata string and leader epoch an offset entry carries (NO_OFFSET_DETAILS: none)."""
    epoch = entry.leader_epoch if entry.HasField("leader_epoch") else -1
    return OffsetDetails(epoch, entry.metadata)


def ensure_group(writer: StoreWriter, name: str) -> bool:
    """Makes sure group `name` exists (empty, as a commit outside group management makes it); False
    when it does not and the cluster holds its maximum of groups."""
    if writer.group(name) is not None:
        return True
    state = _new_group(writer, name, "")
    if state is None:
        return False
    _save(writer, state)
    return True


def apply_join(writer: StoreWriter, command: kq_pb2.JoinGroupCommand) -> GroupResult:
    """Adds or refreshes a member; a new member or a changed subscription starts a rebalance.

    The command passed raft/validation.py (member id, subscription, pattern, assignor, timeouts).
    A join that would make the group's state or its assignment work exceed its limit is refused.
    """
    state = load(writer, command.group) or _new_group(writer, command.group, command.assignor)
    if state is None:
        return GroupResult(ErrorCode.TOO_MANY_GROUPS)
    if state.protocol_type and state.members:
        return GroupResult(ErrorCode.GROUP_HAS_MEMBERS, state.generation, state.phase)  # Kafka members.
    if state.protocol_type:  # An empty Kafka group becomes a kq group again.
        state.protocol_type = state.protocol = state.leader_member_id = ""
        state.awaiting_sync = False
        _classic(state)
    if not state.members and command.assignor:
        state.assignor = command.assignor  # The first member of an empty group chooses its assignor.
    existing = next((m for m in state.members if m.member_id == command.member.member_id), None)
    if existing is None and len(state.members) >= GROUP_MEMBERS_MAX:
        return GroupResult(ErrorCode.GROUP_FULL, state.generation, state.phase)
    if existing is None:
        existing = state.members.add()
        existing.CopyFrom(command.member)
        changed = True
    else:
        changed = (list(existing.topics), existing.topic_pattern) != (
            list(command.member.topics),
            command.member.topic_pattern,
        )
        assignment = list(existing.assignment)
        existing.CopyFrom(command.member)
        existing.assignment.extend(assignment)
    existing.rejoined = True
    subscriptions = _subscriptions(writer, state)  # One pass of the patterns serves both uses below.
    work = _subscribed_partition_count(writer, subscriptions) * len(state.members)
    if state.ByteSize() > GROUP_STATE_BYTES_MAX or work > ASSIGNMENT_WORK_MAX:
        return GroupResult(ErrorCode.GROUP_FULL, state.generation, state.phase)
    if state.phase != kq_pb2.GROUP_REBALANCING and (changed or state.phase == kq_pb2.GROUP_EMPTY):
        _begin_rebalance(state, command.now_ms, keep=existing.member_id)
    _complete_if_ready(writer, state, subscriptions)
    return _save(writer, state)


def apply_leave(writer: StoreWriter, command: kq_pb2.LeaveGroupCommand) -> GroupResult:
    """Removes members (leaving or expired); the others rebalance."""
    state = load(writer, command.group)
    if state is None:
        return GroupResult(ErrorCode.UNKNOWN_GROUP)
    if consumer_groups.is_consumer_group(state):
        if not consumer_groups.remove_members(state, command.member_ids, _catalog(writer)):
            return GroupResult(ErrorCode.UNKNOWN_MEMBER, state.generation, state.phase)
        return _save(writer, state)
    leaving = set(command.member_ids)
    remaining = [m for m in state.members if m.member_id not in leaving]
    if len(remaining) == len(state.members):
        return GroupResult(ErrorCode.UNKNOWN_MEMBER, state.generation, state.phase)
    del state.members[:]
    state.members.extend(remaining)
    if state.protocol_type:
        kafka_groups.after_leave(state, leaving, command.now_ms)
        return _save(writer, state)
    if state.phase == kq_pb2.GROUP_STABLE:
        _begin_rebalance(state, command.now_ms, keep=None)
    _complete_if_ready(writer, state)
    return _save(writer, state)


def transactional_commit_problem(
    writer: StoreWriter, group: str, member_id: str, generation: int, instance_id: str
) -> ErrorCode:
    """KIP-447's fencing of a TxnOffsetCommit (raft/transactions.py): OK without a member id (a client
    before TxnOffsetCommit v3, or one without the consumer's group metadata, as Kafka accepts); else
    the member must be in the group (UNKNOWN_MEMBER) at this generation (STALE_GENERATION: a classic
    group's generation, a consumer group's member epoch; Kafka's ILLEGAL_GENERATION for both here). A
    zombie whose partitions moved to another member is refused, so the transaction cannot commit.

    In a classic group a named `instance_id` (group.instance.id) is checked first, as Kafka's
    `ClassicGroup.validateMember`: held by another member id, the sender is an older instance of a
    static member (FENCED_INSTANCE_ID); held by none, UNKNOWN_MEMBER. A consumer group checks the
    member and its epoch alone (Kafka's `ConsumerGroup.validateOffsetCommit`)."""
    if not member_id:
        return ErrorCode.OK
    state = load(writer, group)
    if state is None:
        return ErrorCode.STALE_GENERATION  # No generation exists: Kafka's ILLEGAL_GENERATION.
    consumer_group = consumer_groups.is_consumer_group(state)
    if instance_id and not consumer_group:
        holder = next((m for m in state.members if m.group_instance_id == instance_id), None)
        if holder is None:
            return ErrorCode.UNKNOWN_MEMBER
        if holder.member_id != member_id:
            return ErrorCode.FENCED_INSTANCE_ID
    member = kafka_groups.find(state, member_id)
    if member is None:
        return ErrorCode.UNKNOWN_MEMBER
    current = member.member_epoch if consumer_group else state.generation
    return ErrorCode.OK if generation == current else ErrorCode.STALE_GENERATION


def apply_commit(
    writer: StoreWriter, command: kq_pb2.CommitOffsetsCommand, check_log_end: bool = True
) -> GroupResult | KafkaGroupResult:
    """Stores offsets from a current member (or from outside group management for an empty group).
    `check_log_end`: refuse an offset past its partition's log end (this store holds every log)."""
    state = load(writer, command.group)
    if command.kafka:
        return _apply_kafka_commit(writer, state, command, check_log_end)
    if command.member_id:
        if state is None:
            return GroupResult(ErrorCode.UNKNOWN_GROUP)
        if not any(m.member_id == command.member_id for m in state.members):
            return GroupResult(ErrorCode.UNKNOWN_MEMBER, state.generation, state.phase)
        if command.generation != state.generation:
            return GroupResult(ErrorCode.STALE_GENERATION, state.generation, state.phase)
    else:
        if state is not None and state.members:
            return GroupResult(ErrorCode.GROUP_HAS_MEMBERS, state.generation, state.phase)
        state = state or _new_group(writer, command.group, "")
        if state is None:
            return GroupResult(ErrorCode.TOO_MANY_GROUPS)
    error = _write_offsets(writer, command.group, command.offsets, command.now_ms, check_log_end)
    if error != ErrorCode.OK:
        return GroupResult(error, state.generation, state.phase)
    return _save(writer, state)


def _apply_kafka_commit(
    writer: StoreWriter,
    state: kq_pb2.GroupState | None,
    command: kq_pb2.CommitOffsetsCommand,
    check_log_end: bool,
) -> KafkaGroupResult:
    """A Kafka client's OffsetCommit: Kafka's rules (raft/kafka_groups.py), Kafka's error codes."""
    if state is not None and consumer_groups.is_consumer_group(state):
        code = consumer_groups.commit_problem(state, command)
    else:
        code = kafka_groups.commit_problem(state, command)
    if code != kafka_groups.NONE:
        return KafkaGroupResult(code, *_position(state))
    state = state or _new_group(writer, command.group, "")
    if state is None:
        return KafkaGroupResult(kafka_groups.GROUP_MAX_SIZE_REACHED)
    error = _write_offsets(writer, command.group, command.offsets, command.now_ms, check_log_end)
    if error != ErrorCode.OK:
        code = kafka_groups.OFFSET_OUT_OF_RANGE
        if error != ErrorCode.OFFSET_OUT_OF_RANGE:
            code = kafka_groups.UNKNOWN_TOPIC_OR_PARTITION
        return KafkaGroupResult(code, state.generation, state.phase)
    _save(writer, state)
    return KafkaGroupResult(kafka_groups.NONE, state.generation, state.phase)


def apply_kafka_join(writer: StoreWriter, command: kq_pb2.KafkaJoinGroupCommand) -> KafkaGroupResult:
    """A Kafka client's JoinGroup (raft/kafka_groups.py); the state is saved only when it applied."""
    state = load(writer, command.group) or _new_group(writer, command.group, "")
    if state is None:
        return KafkaGroupResult(kafka_groups.GROUP_MAX_SIZE_REACHED)
    if consumer_groups.is_consumer_group(state):
        if state.members:  # Kafka: a classic member cannot join a consumer group with members.
            return KafkaGroupResult(kafka_groups.INCONSISTENT_GROUP_PROTOCOL, state.generation, state.phase)
        _classic(state)  # An empty consumer group becomes a classic group, offsets kept.
    code = kafka_groups.join(state, command)
    if code == kafka_groups.NONE:
        _save(writer, state)
    return KafkaGroupResult(code, state.generation, state.phase)


def apply_kafka_sync(writer: StoreWriter, command: kq_pb2.KafkaSyncGroupCommand) -> KafkaGroupResult:
    """A Kafka group leader's SyncGroup: the generation's assignments, stored as the leader sent them."""
    state = load(writer, command.group)
    if state is None or not state.protocol_type or consumer_groups.is_consumer_group(state):
        return KafkaGroupResult(kafka_groups.UNKNOWN_MEMBER_ID, *_position(state))
    code = kafka_groups.sync(state, command)
    if code == kafka_groups.NONE:
        _save(writer, state)
    return KafkaGroupResult(code, state.generation, state.phase)


def apply_consumer_heartbeat(
    writer: StoreWriter, command: kq_pb2.ConsumerHeartbeatCommand
) -> KafkaGroupResult:
    """A consumer-group member's heartbeat (KIP-848, raft/consumer_groups.py); saved only when it applied."""
    state = load(writer, command.group) or _new_group(writer, command.group, "")
    if state is None:
        return KafkaGroupResult(kafka_groups.GROUP_MAX_SIZE_REACHED)
    code = consumer_groups.heartbeat(state, command, _catalog(writer))
    if code == kafka_groups.NONE:
        _save(writer, state)
    return KafkaGroupResult(code, state.generation, state.phase)


def _catalog(writer: StoreWriter) -> dict[str, int]:
    """Every topic's partition count, by name: what a consumer group's assignment is computed from."""
    return {topic.name: topic.partitions for topic in writer.topics()}


def _classic(state: kq_pb2.GroupState) -> None:
    """An empty group leaves the consumer-group protocol (its epochs and sizes go; offsets stay)."""
    state.type = kq_pb2.GROUP_TYPE_CLASSIC
    state.assignment_epoch = 0
    del state.subscribed_sizes[:]


def _position(state: kq_pb2.GroupState | None) -> tuple[int, int]:
    return (0, 0) if state is None else (state.generation, state.phase)


def apply_reset(
    writer: StoreWriter, command: kq_pb2.ResetOffsetsCommand, check_log_end: bool = True
) -> GroupResult:
    """Sets offsets of a group without active members (`check_log_end`: as `apply_commit`)."""
    state = load(writer, command.group) or _new_group(writer, command.group, "")
    if state is None:
        return GroupResult(ErrorCode.TOO_MANY_GROUPS)
    if state.members:
        return GroupResult(ErrorCode.GROUP_HAS_MEMBERS, state.generation, state.phase)
    error = _write_offsets(writer, command.group, command.offsets, 0, check_log_end)
    if error != ErrorCode.OK:
        return GroupResult(error, state.generation, state.phase)
    return _save(writer, state)


def apply_delete_group(writer: StoreWriter, command: kq_pb2.DeleteGroupCommand) -> GroupResult:
    """Deletes a group without active members, with its committed offsets."""
    state = load(writer, command.group)
    if state is None:
        return GroupResult(ErrorCode.UNKNOWN_GROUP)
    if state.members:
        return GroupResult(ErrorCode.GROUP_HAS_MEMBERS, state.generation, state.phase)
    writer.delete_group(command.group)
    return GroupResult(ErrorCode.OK, state.generation, state.phase)


def apply_offset_delete(writer: StoreWriter, command: kq_pb2.OffsetDeleteCommand) -> GroupResult:
    """Forgets the group's committed offsets of the named partitions (Kafka's OffsetDelete), unless
    the group has members and is no longer where the edge saw it (STALE_GENERATION): the edge checked
    that no member subscribes to their topics then. A topic that does not exist is skipped."""
    state = load(writer, command.group)
    if state is None:
        return GroupResult(ErrorCode.UNKNOWN_GROUP)
    if state.members and (state.generation, state.phase) != (command.generation, command.phase):
        return GroupResult(ErrorCode.STALE_GENERATION, state.generation, state.phase)
    for entry in command.partitions:
        topic = writer.topic(entry.topic)
        if topic is not None:
            writer.delete_offset(command.group, topic.topic_id, entry.partition)
    return GroupResult(ErrorCode.OK, state.generation, state.phase)


def _write_offsets(
    writer: StoreWriter,
    group: str,
    offsets: Iterable[kq_pb2.OffsetEntry],
    commit_time_ms: int,
    check_log_end: bool,
) -> ErrorCode:
    """Checks every offset against the topics (and the log ends, when `check_log_end`), then writes
    them all (or none)."""
    resolved = []
    for entry in offsets:
        topic = writer.topic(entry.topic)
        if topic is None:
            return ErrorCode.UNKNOWN_TOPIC
        state = writer.partition(topic.topic_id, entry.partition)
        if state is None:
            return ErrorCode.UNKNOWN_PARTITION
        if check_log_end and entry.offset > state.log_end_offset:
            return ErrorCode.OFFSET_OUT_OF_RANGE
        resolved.append((topic.topic_id, entry.partition, entry.offset, offset_details(entry)))
    for topic_id, partition, offset, details in resolved:
        writer.commit_offset(group, topic_id, partition, offset, commit_time_ms, details)
    return ErrorCode.OK


def _begin_rebalance(state: kq_pb2.GroupState, now_ms: int, keep: str | None) -> None:
    """Every member but `keep` must rejoin before the next generation."""
    state.phase = kq_pb2.GROUP_REBALANCING
    state.phase_started_ms = now_ms
    for member in state.members:
        member.rejoined = member.member_id == keep


def _complete_if_ready(
    writer: StoreWriter, state: kq_pb2.GroupState, subscriptions: Subscriptions | None = None
) -> None:
    """Advances the generation with a new assignment once every member has rejoined.

    `subscriptions` are the members' topics if the caller already resolved them for this state.
    """
    if state.phase != kq_pb2.GROUP_REBALANCING or not all(m.rejoined for m in state.members):
        return
    state.generation += 1
    if not state.members:
        state.phase = kq_pb2.GROUP_EMPTY
        return
    if subscriptions is None:
        subscriptions = _subscriptions(writer, state)
    partitions = _subscribed_partitions(writer, subscriptions, len(state.members))
    previous: Assignment = {
        m.member_id: [(tp.topic, tp.partition) for tp in m.assignment] for m in state.members
    }
    assignor = ASSIGNORS.get(state.assignor or "range", ASSIGNORS["range"])
    assignment = assignor(subscriptions, partitions, previous)
    for member in state.members:
        del member.assignment[:]
        member.assignment.extend(
            kq_pb2.TopicPartition(topic=t, partition=p) for t, p in assignment[member.member_id]
        )
    state.phase = kq_pb2.GROUP_STABLE


def _subscriptions(writer: StoreWriter, state: kq_pb2.GroupState) -> Subscriptions:
    """Each member's topics: its list, or the existing topics its pattern matches in full.

    Patterns were validated at the edge and run on RE2: linear time per topic name, so one pattern
    costs at most (topics x PATTERN_PROGRAM_SIZE_MAX x TOPIC_NAME_LENGTH_MAX) steps. Members sharing
    a pattern share one pass over the names.
    """
    names = [t.name for t in writer.topics()]
    by_pattern: dict[str, frozenset[str]] = {}
    result: Subscriptions = {}
    for member in state.members:
        if member.topic_pattern:
            if member.topic_pattern not in by_pattern:
                by_pattern[member.topic_pattern] = matching(member.topic_pattern, names)
            result[member.member_id] = by_pattern[member.topic_pattern]
        else:
            result[member.member_id] = frozenset(member.topics)
    return result


def _subscribed_partitions(writer: StoreWriter, subscriptions: Subscriptions, members: int) -> dict[str, int]:
    """Partition count of each subscribed topic, by name, within the group's assignment budget.

    Topics created after members joined (a pattern's new matches) can push a group past
    ASSIGNMENT_WORK_MAX; then the topics that fit, in name order, are assigned and the rest wait
    (the same choice on every replica), so a rebalance stays bounded in time inside apply.
    """
    partitions: dict[str, int] = {}
    total = 0
    for topic in _subscribed_topics(writer, subscriptions):
        total += topic.partitions
        if total * max(members, 1) > ASSIGNMENT_WORK_MAX:
            break
        partitions[topic.name] = topic.partitions
    return partitions


def _subscribed_topics(writer: StoreWriter, subscriptions: Subscriptions) -> list[TopicMeta]:
    """The existing topics any member subscribes to, in name order."""
    wanted = frozenset().union(*subscriptions.values()) if subscriptions else frozenset()
    return [topic for topic in writer.topics() if topic.name in wanted]


def _subscribed_partition_count(writer: StoreWriter, subscriptions: Subscriptions) -> int:
    """Partitions of all subscribed topics: times the members, what a rebalance costs the assignor."""
    return sum(topic.partitions for topic in _subscribed_topics(writer, subscriptions))
