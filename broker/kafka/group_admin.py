"""Kafka's consumer-group administration: DeleteGroups (API 42) and OffsetDelete (API 47).

Both are answered by the leader of the group's coordinator group (else NOT_COORDINATOR, and the
client looks the coordinator up again), and both go through Raft: DeleteGroups proposes kq's
DeleteGroupCommand (the one `kq groups delete` proposes), OffsetDelete an OffsetDeleteCommand. The
answers are Kafka's: NON_EMPTY_GROUP for a group with members, GROUP_ID_NOT_FOUND for an unknown one,
GROUP_SUBSCRIBED_TO_TOPIC for a partition of a topic an active member subscribes to (Kafka reads a
consumer group's subscriptions from its members' protocol metadata; so does kq). A group of another
protocol type with members is NON_EMPTY_GROUP as a whole, as Kafka answers it.

ACLs (Kafka's): DeleteGroups needs DELETE on each group; OffsetDelete DELETE on the group and READ
on each topic.
"""

from __future__ import annotations

import struct
from typing import Any

from kq.broker.auth import GROUP, TOPIC
from kq.broker.errors import KqError
from kq.broker.kafka.authorize import GROUP_AUTHORIZATION_FAILED, TOPIC_AUTHORIZATION_FAILED, ApiKey
from kq.broker.kafka.build import build, response_module
from kq.broker.kafka.codes import (
    INVALID_GROUP_ID,
    INVALID_REQUEST,
    NONE,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from kq.broker.kafka.framing import Request
from kq.broker.kafka.groups import GroupApis
from kq.broker.kafka.listener import Connection
from kq.proto import kq_pb2
from kq.proto.errors import ErrorCode
from kq.proto.limits import OFFSETS_PER_COMMIT_MAX
from kq.raft import commands
from kq.raft.results import GroupResult
from kq.raft.validation import topic_name_problem

DELETE_GROUPS, OFFSET_DELETE = 42, 47
NON_EMPTY_GROUP = 68  # Kafka's error codes of these APIs.
GROUP_ID_NOT_FOUND = 69
GROUP_SUBSCRIBED_TO_TOPIC = 86
CONSUMER_PROTOCOL_TYPE = "consumer"
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


class GroupAdminApis(GroupApis):
    """DeleteGroups and OffsetDelete (see the module)."""

    async def delete_groups(self, request: Request, connection: Connection) -> Any:
        """Deletes each group without members, and its committed offsets, through Raft."""
        module = response_module(DELETE_GROUPS, request.api_version)
        results = []
        for name in request.body.groups_names:
            code = self._coordinator_code(name) or (
                INVALID_GROUP_ID if topic_name_problem(name, "group") else NONE
            )
            if code == NONE and not self._permitted(connection, ApiKey.DELETE_GROUPS, GROUP, name):
                code = GROUP_AUTHORIZATION_FAILED
            if code == NONE:
                code = await self._group_command(commands.delete_group(name))
            results.append(build(module.DeletableGroupResult, group_id=name, error_code=code))
        return build(module.DeleteGroupsResponse, throttle_time=0, results=tuple(results))

    async def _group_command(self, command: kq_pb2.Command) -> int:
        """Proposes a command answered by a GroupResult: Kafka's error code either way."""
        try:
            result = await self._propose(command)
        except KqError as error:
            return self._error_code(error)
        assert isinstance(result, GroupResult), f"a group command answered {result!r}"
        return _GROUP_CODES.get(result.error, INVALID_REQUEST)

    async def offset_delete(self, request: Request, connection: Connection) -> Any:
        """Forgets the group's committed offsets of the named partitions, but those of topics an active
        member subscribes to (GROUP_SUBSCRIBED_TO_TOPIC)."""
        body = request.body
        module = response_module(OFFSET_DELETE, request.api_version)
        group = body.group_id
        wanted = [(topic.name, p.partition_index) for topic in body.topics for p in topic.partitions]
        code = self._coordinator_code(group) or (
            INVALID_GROUP_ID if topic_name_problem(group, "group") else NONE
        )
        if code == NONE and not self._permitted(connection, ApiKey.OFFSET_DELETE, GROUP, group):
            code = GROUP_AUTHORIZATION_FAILED
        if code == NONE and len(wanted) > OFFSETS_PER_COMMIT_MAX:
            code = INVALID_REQUEST
        codes: dict[tuple[str, int], int] = {}
        if code == NONE:
            code, codes = await self._delete_offsets(connection, group, wanted)
        topics = tuple(
            build(
                module.OffsetDeleteResponseTopic,
                name=topic.name,
                partitions=tuple(
                    build(
                        module.OffsetDeleteResponsePartition,
                        partition_index=p.partition_index,
                        error_code=codes.get((topic.name, p.partition_index), NONE),
                    )
                    for p in topic.partitions
                ),
            )
            for topic in body.topics
        )
        return build(
            module.OffsetDeleteResponse,
            error_code=code,
            throttle_time=0,
            topics=topics if code == NONE else (),
        )

    async def _delete_offsets(
        self, connection: Connection, group: str, wanted: list[tuple[str, int]]
    ) -> tuple[int, dict[tuple[str, int], int]]:
        """(the group's code, each partition's code) of an OffsetDelete this process coordinates."""
        state = await self._group(group)
        if state is None:
            return GROUP_ID_NOT_FOUND, {}
        if state.members and state.protocol_type and state.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return NON_EMPTY_GROUP, {}
        subscribed = _subscribed_topics(state)
        refused = self._refused(connection, ApiKey.OFFSET_DELETE, TOPIC, {name for name, _ in wanted})
        known = await self._in_reads(self._known_partitions, wanted)
        codes: dict[tuple[str, int], int] = {}
        deleted = []
        for name, partition in wanted:
            if name in refused:
                codes[name, partition] = TOPIC_AUTHORIZATION_FAILED
            elif (name, partition) not in known:
                codes[name, partition] = UNKNOWN_TOPIC_OR_PARTITION
            elif subscribed is None or name in subscribed:
                codes[name, partition] = GROUP_SUBSCRIBED_TO_TOPIC
            else:
                deleted.append(kq_pb2.TopicPartition(topic=name, partition=partition))
        if deleted:
            command = commands.offset_delete(group, deleted, state.generation, state.phase)
            code = await self._group_command(command)
            if code != NONE:
                return code, {}
        return NONE, codes

    def _known_partitions(self, wanted: list[tuple[str, int]]) -> set[tuple[str, int]]:
        """The (topic, partition) pairs among `wanted` that exist."""
        with self._store.read() as reader:
            found = set()
            for name, partition in wanted:
                topic = None if topic_name_problem(name) else reader.topic(name)
                if topic is not None and 0 <= partition < topic.partitions:
                    found.add((name, partition))
            return found


_GROUP_CODES: dict[ErrorCode, int] = {
    ErrorCode.OK: NONE,
    ErrorCode.UNKNOWN_GROUP: GROUP_ID_NOT_FOUND,
    ErrorCode.GROUP_HAS_MEMBERS: NON_EMPTY_GROUP,
    # OffsetDelete: the group changed since the edge read its subscriptions; the client retries.
    ErrorCode.STALE_GENERATION: REBALANCE_IN_PROGRESS,
}


def _subscribed_topics(state: kq_pb2.GroupState) -> set[str] | None:
    """The topics the group's members subscribe to; None when some member's subscription is unknown
    (a pattern, unreadable metadata): Kafka then counts every topic as subscribed."""
    topics: set[str] = set()
    for member in state.members:
        if not state.protocol_type:  # A kq group: its members' own subscriptions.
            if member.topic_pattern:
                return None
            topics.update(member.topics)
            continue
        metadata = next((p.metadata for p in member.protocols if p.name == state.protocol), None)
        named = None if metadata is None else subscription_topics(metadata)
        if named is None:
            return None
        topics.update(named)
    return topics


def subscription_topics(metadata: bytes) -> list[str] | None:
    """The topics of a Kafka ConsumerProtocolSubscription (every version starts with its int16 version
    and its topics as an int32 count of int16-length strings); None when the bytes do not hold that."""
    try:
        position = _INT16.size
        (count,) = _INT32.unpack_from(metadata, position)
        position += _INT32.size
        if not 0 <= count <= (len(metadata) - position) // _INT16.size:
            return None
        topics = []
        for _ in range(count):
            (length,) = _INT16.unpack_from(metadata, position)
            position += _INT16.size
            if not 0 <= length <= len(metadata) - position:
                return None
            topics.append(metadata[position : position + length].decode())
            position += length
    except (struct.error, UnicodeDecodeError):
        return None
    return topics
