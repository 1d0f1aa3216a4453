"""Kafka's consumer-group protocol (KIP-848): ConsumerGroupHeartbeat and ConsumerGroupDescribe.

The Raft leader of the coordinator group coordinates every group, as for classic groups; a follower
answers NOT_COORDINATOR (COORDINATOR_NOT_AVAILABLE while no leader is known).

What is decided where:
- The edge (here) checks a heartbeat as Kafka does (INVALID_REQUEST, UNSUPPORTED_ASSIGNOR, ...),
  turns topic ids into names, stamps the group's session timeout and the clock, and runs the pure
  rules (raft/consumer_groups.py) on a copy of the stored group: an answer that changes nothing (a
  steady member, or an error) is given at once, without a Raft entry. Anything else is proposed as
  one `consumer_heartbeat` command, and apply decides it again on the state it finds (epochs, the
  target assignment, the member's reconciliation), identically on every replica.
- Heartbeats refresh the leader's `GroupCoordinator`, whose timers propose the expiry of a member
  silent for `--group-consumer-session-timeout-ms`, or one that has not revoked its partitions within its
  rebalance timeout (a LeaveGroup(expired) command, as for classic groups).
"""

from __future__ import annotations

import uuid
from typing import Any

from kq.broker.auth import GROUP, TOPIC
from kq.broker.kafka.authorize import GROUP_AUTHORIZATION_FAILED, TOPIC_AUTHORIZATION_FAILED, ApiKey
from kq.broker.kafka.build import build, response_module
from kq.broker.kafka.codes import INVALID_GROUP_ID, INVALID_REQUEST, NONE
from kq.broker.kafka.framing import Request
from kq.broker.kafka.groups import GroupApis, _client_host
from kq.broker.kafka.listener import Connection
from kq.broker.proposals import wall_clock_ms
from kq.proto import kq_pb2
from kq.proto.limits import (
    CLIENT_ID_LENGTH_MAX,
    CONSUMER_ASSIGNORS,
    CONSUMER_OWNED_PARTITIONS_MAX,
    REBALANCE_TIMEOUT_MS_MAX,
    REBALANCE_TIMEOUT_MS_MIN,
)
from kq.raft import commands, consumer_groups
from kq.raft.consumer_groups import (
    GROUP_ID_NOT_FOUND,
    LEAVE_EPOCH,
    LEAVE_STATIC_EPOCH,
    UNSUPPORTED_ASSIGNOR,
    find,
    is_consumer_group,
    pairs,
)
from kq.raft.patterns import pattern_problem
from kq.raft.validation import command_problem, topic_name_problem
from kq.storage import StoreReader

CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE = 68, 69
INVALID_REGULAR_EXPRESSION = 128


def _duration_ms(value: Any) -> int:
    """Milliseconds of a kio i32 duration (a timedelta) or a plain number."""
    total = getattr(value, "total_seconds", None)
    return int(total() * 1000) if total is not None else int(value)


class ConsumerGroupApis(GroupApis):
    """ConsumerGroupHeartbeat and ConsumerGroupDescribe (see the module), beside the classic group APIs."""

    # ConsumerGroupHeartbeat ---------------------------------------------------------------------

    async def consumer_group_heartbeat(self, request: Request, connection: Connection) -> Any:
        """One heartbeat of a consumer-group member: joins, leaves, acknowledges revocations and gets
        the member's epoch and assignment (sent when it changed, or when the member (re)joined)."""
        body = request.body
        module = response_module(CONSUMER_GROUP_HEARTBEAT, request.api_version)
        member_id = body.member_id or ""
        if request.api_version == 0 and not member_id and body.member_epoch == 0:
            member_id = str(uuid.uuid4())  # v0: the coordinator names a new member (v1+: the client).

        def answer(code: int, epoch: int = -1, assignment: Any = None, message: str | None = None) -> Any:
            return build(
                module.ConsumerGroupHeartbeatResponse,
                throttle_time=0,
                error_code=code,
                error_message=message,
                member_id=member_id or None,
                member_epoch=epoch,
                heartbeat_interval=self._settings.consumer_heartbeat_interval_ms,
                assignment=assignment,
            )

        code, message = self._coordinator_code(body.group_id), None
        if code == NONE:
            code, message = self._heartbeat_request_code(body, member_id)
        if code == NONE and body.subscribed_topic_names:
            refused = self._refused(
                connection, ApiKey.CONSUMER_GROUP_HEARTBEAT, TOPIC, body.subscribed_topic_names
            )
            if refused:
                code, message = TOPIC_AUTHORIZATION_FAILED, "not authorized to describe subscribed topics"
        if code != NONE:
            return answer(code, message=message)
        command = await self._in_reads(self._heartbeat_command, request, connection, member_id)
        problem = command_problem(command)
        if problem is not None:
            regex = _regex(body)
            bad_pattern = regex is not None and pattern_problem(regex) is not None
            return answer(INVALID_REGULAR_EXPRESSION if bad_pattern else INVALID_REQUEST, message=problem)
        heartbeat = command.consumer_heartbeat
        before = await self._group(body.group_id)
        code, after = await self._in_reads(self._dry_run, before, heartbeat)
        if code == NONE and (after is None or after != before):
            code = await self._kafka_result(command)
            after = await self._group(body.group_id) if code == NONE else None
        if code != NONE:
            return answer(code, message=_messages.get(code))
        if heartbeat.member_epoch in (LEAVE_EPOCH, LEAVE_STATIC_EPOCH):
            return answer(NONE, heartbeat.member_epoch)
        self._coordinator.heard_from(body.group_id, member_id)
        now = None if after is None else find(after, member_id)
        if now is None:  # Expired or removed between the entry and this read: it rejoins.
            return answer(consumer_groups.UNKNOWN_MEMBER_ID)
        then = None if before is None else find(before, member_id)
        owned = pairs(heartbeat.owned) if heartbeat.owned_set else None
        send = (
            heartbeat.member_epoch == 0
            or then is None
            or pairs(then.assignment) != pairs(now.assignment)
            or (owned is not None and owned != pairs(now.assignment))
        )
        assignment = await self._in_reads(self._assignment, module, now) if send else None
        return answer(NONE, now.member_epoch, assignment)

    def _heartbeat_request_code(self, body: Any, member_id: str) -> tuple[int, str | None]:
        """Kafka's checks of a heartbeat before anything else (its throwIfConsumerGroupHeartbeat...)."""
        epoch = body.member_epoch
        if not body.group_id:
            return INVALID_REQUEST, "GroupId can't be empty."
        if topic_name_problem(body.group_id, "group"):
            return INVALID_GROUP_ID, None
        if not member_id:
            return INVALID_REQUEST, "MemberId can't be empty."
        if epoch < LEAVE_STATIC_EPOCH:
            return INVALID_REQUEST, "MemberEpoch is invalid."
        if epoch == LEAVE_STATIC_EPOCH and not body.instance_id:
            return INVALID_REQUEST, "InstanceId can't be null when leaving as a static member."
        if body.server_assignor is not None and body.server_assignor not in CONSUMER_ASSIGNORS:
            return UNSUPPORTED_ASSIGNOR, f"ServerAssignor {body.server_assignor} is not supported."
        if epoch == 0:
            if _duration_ms(body.rebalance_timeout) == -1:
                return INVALID_REQUEST, "RebalanceTimeoutMs must be provided in first request."
            if body.subscribed_topic_names is None and _regex(body) is None:
                return (
                    INVALID_REQUEST,
                    "SubscribedTopicNames or SubscribedTopicRegex must be set in first request.",
                )
            if body.topic_partitions:
                return INVALID_REQUEST, "TopicPartitions must be empty when (re-)joining."
        if body.topic_partitions is not None and len(body.topic_partitions) > CONSUMER_OWNED_PARTITIONS_MAX:
            return INVALID_REQUEST, "too many owned partitions"
        if _regex(body) is not None and body.subscribed_topic_names:
            return INVALID_REQUEST, "subscribe with topic names or a regular expression, not both"
        return NONE, None

    def _heartbeat_command(self, request: Request, connection: Connection, member_id: str) -> kq_pb2.Command:
        """The command a heartbeat proposes: topic ids become names (unknown ones are left out)."""
        body = request.body
        rebalance_ms = _duration_ms(body.rebalance_timeout)
        client_id = (request.client_id or "").encode()[:CLIENT_ID_LENGTH_MAX].decode(errors="ignore")
        subscription_set = body.subscribed_topic_names is not None or _regex(body) is not None
        member = kq_pb2.GroupMember(
            member_id=member_id,
            client_id=client_id,
            client_host=_client_host(connection),
            group_instance_id=body.instance_id or "",
            rack_id=body.rack_id or "",
            server_assignor=body.server_assignor or "",
            session_timeout_ms=self._settings.consumer_session_timeout_ms,
            rebalance_timeout_ms=(
                0
                if rebalance_ms < 0
                else min(max(rebalance_ms, REBALANCE_TIMEOUT_MS_MIN), REBALANCE_TIMEOUT_MS_MAX)
            ),
            topics=sorted(set(body.subscribed_topic_names or ())),
            topic_pattern=_regex(body) or "",
        )
        owned = None
        if body.topic_partitions is not None:
            with self._store.read() as reader:
                names = _topic_names(reader)
            owned = [
                kq_pb2.TopicPartition(topic=names[topic.topic_id.int], partition=partition)
                for topic in body.topic_partitions
                if topic.topic_id is not None and topic.topic_id.int in names
                for partition in topic.partitions
                if partition >= 0
            ]
        return commands.consumer_heartbeat(
            body.group_id, member, body.member_epoch, wall_clock_ms(), subscription_set, owned
        )

    def _dry_run(
        self, state: kq_pb2.GroupState | None, command: kq_pb2.ConsumerHeartbeatCommand
    ) -> tuple[int, kq_pb2.GroupState | None]:
        """The pure rules on a copy of the stored group (a new one if none): Kafka's code, the group after."""
        copy = kq_pb2.GroupState(name=command.group, phase=kq_pb2.GROUP_EMPTY)
        if state is not None:
            copy.CopyFrom(state)
        with self._store.read() as reader:
            catalog = {topic.name: topic.partitions for topic in reader.topics()}
        return consumer_groups.heartbeat(copy, command, catalog), copy

    def _assignment(self, module: Any, member: kq_pb2.GroupMember) -> Any:
        """The member's owned partitions as a heartbeat answers them (by topic id)."""
        with self._store.read() as reader:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in pairs(member.assignment):
                by_topic.setdefault(topic, []).append(partition)
            topics = []
            for name, partitions in by_topic.items():
                meta = reader.topic(name)
                if meta is not None:
                    topics.append(
                        build(
                            module.TopicPartitions,
                            topic_id=uuid.UUID(int=meta.topic_id),
                            partitions=partitions,
                        )
                    )
        return build(module.Assignment, topic_partitions=tuple(topics))

    # ConsumerGroupDescribe ----------------------------------------------------------------------

    async def consumer_group_describe(self, request: Request, connection: Connection) -> Any:
        """Each consumer group's epochs, assignor and members (their assignment and target)."""
        module = response_module(CONSUMER_GROUP_DESCRIBE, request.api_version)
        described = []
        for name in request.body.group_ids:
            code = self._coordinator_code(name) or (
                INVALID_GROUP_ID if topic_name_problem(name, "group") else NONE
            )
            if code == NONE and not self._permitted(connection, ApiKey.CONSUMER_GROUP_DESCRIBE, GROUP, name):
                code = GROUP_AUTHORIZATION_FAILED
            state = await self._group(name) if code == NONE else None
            if code == NONE and not is_consumer_group(state):
                code = GROUP_ID_NOT_FOUND
            described.append(await self._in_reads(self._described_consumer_group, module, name, code, state))
        return build(module.ConsumerGroupDescribeResponse, throttle_time=0, groups=tuple(described))

    def _described_consumer_group(
        self, module: Any, name: str, code: int, state: kq_pb2.GroupState | None
    ) -> Any:
        if code != NONE or state is None:
            message = f"Group {name} not found." if code == GROUP_ID_NOT_FOUND else None
            return build(
                module.DescribedGroup, error_code=code, error_message=message, group_id=name, members=()
            )
        with self._store.read() as reader:
            ids = {topic.name: topic.topic_id for topic in reader.topics()}

        def assignment(partitions: Any) -> Any:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in pairs(partitions):
                by_topic.setdefault(topic, []).append(partition)
            return build(
                module.Assignment,
                topic_partitions=tuple(
                    build(
                        module.TopicPartitions,
                        topic_id=uuid.UUID(int=ids[topic]),
                        topic_name=topic,
                        partitions=tuple(parts),
                    )
                    for topic, parts in by_topic.items()
                    if topic in ids
                ),
            )

        members = tuple(
            build(
                module.Member,
                member_id=m.member_id,
                instance_id=m.group_instance_id or None,
                rack_id=m.rack_id or None,
                member_epoch=m.member_epoch,
                client_id=m.client_id,
                client_host=m.client_host,
                subscribed_topic_names=tuple(m.topics),
                subscribed_topic_regex=m.topic_pattern or None,
                assignment=assignment(list(m.assignment) + list(m.revoking)),
                target_assignment=assignment(m.target),
                member_type=1,  # The consumer protocol (0: a classic member of a consumer group).
            )
            for m in state.members
        )
        return build(
            module.DescribedGroup,
            error_code=NONE,
            group_id=name,
            group_state=consumer_groups.state_name(state),
            group_epoch=state.generation,
            assignment_epoch=state.assignment_epoch,
            assignor_name=state.assignor,
            members=members,
        )


_messages = {
    consumer_groups.FENCED_MEMBER_EPOCH: "The member epoch is not the member's.",
    consumer_groups.UNKNOWN_MEMBER_ID: "The member is not in the group.",
    GROUP_ID_NOT_FOUND: "The group is not a consumer group.",
    consumer_groups.UNRELEASED_INSTANCE_ID: "The instance id is still used by another member.",
}


def _regex(body: Any) -> str | None:
    """The heartbeat's subscribed regex; None when unchanged, in v0 (which has none), or "" (librdkafka
    sends "" beside its topic names)."""
    return getattr(body, "subscribed_topic_regex", None) or None


def _topic_names(reader: StoreReader) -> dict[int, str]:
    return {topic.topic_id: topic.name for topic in reader.topics()}
