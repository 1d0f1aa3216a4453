"""Kafka's partition administration: DeleteRecords (API 21) and CreatePartitions (API 37).

DeleteRecords trims each partition through its own Raft group (kq's TrimCommand, the one retention
and `kq` DeleteRecords propose), so each partition is answered by the leader of the group that holds
it: elsewhere NOT_LEADER_OR_FOLLOWER, and the client sends it there, as Kafka's produce answers. An
offset of -1 means the high watermark (kq's log end: every stored record is committed); one above it,
or below -1, is OFFSET_OUT_OF_RANGE. Each answer is the partition's new low watermark (its log start).

CreatePartitions grows a topic through group 0 (BrokerService.CreatePartitions, forwarded to its
leader, as CreateTopics is; the other groups' copies follow: broker/topic_sync.py). A count that does
not grow, or is over PARTITIONS_MAX, is INVALID_PARTITIONS; a topic named twice INVALID_REQUEST;
a manual replica assignment INVALID_REPLICA_ASSIGNMENT (every node holds every partition of its
groups: there is nothing to assign). `validate_only` checks without proposing.

ACLs (Kafka's): DeleteRecords needs DELETE on each topic, CreatePartitions ALTER.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from kq.broker.auth import TOPIC
from kq.broker.errors import KqError
from kq.broker.kafka.authorize import TOPIC_AUTHORIZATION_FAILED, ApiKey
from kq.broker.kafka.base import KafkaBase, kafka_code
from kq.broker.kafka.build import build, response_module
from kq.broker.kafka.codes import (
    INVALID_PARTITIONS,
    INVALID_REPLICA_ASSIGNMENT,
    INVALID_REQUEST,
    NONE,
    NOT_CONTROLLER,
    NOT_LEADER_OR_FOLLOWER,
    OFFSET_OUT_OF_RANGE,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from kq.broker.kafka.framing import Request
from kq.broker.kafka.listener import Connection
from kq.proto import kq_pb2
from kq.proto.limits import KAFKA_PARTITIONS_PER_REQUEST_MAX
from kq.raft.validation import topic_name_problem

DELETE_RECORDS, CREATE_PARTITIONS = 21, 37
HIGH_WATERMARK = (
    -1
)  # DeleteRecords' offset meaning "every record" (Kafka's DeleteRecordsRequest.HIGH_WATERMARK).


class AdminApis(KafkaBase):
    """DeleteRecords and CreatePartitions (see the module)."""

    async def delete_records(self, request: Request, connection: Connection) -> Any:
        """Trims each partition below its offset; answers each partition's new low watermark."""
        module = response_module(DELETE_RECORDS, request.api_version)
        wanted = [
            (topic.name, partition.partition_index, partition.offset)
            for topic in request.body.topics
            for partition in topic.partitions
        ]
        if len(wanted) > KAFKA_PARTITIONS_PER_REQUEST_MAX:
            answers = [(INVALID_REQUEST, -1)] * len(wanted)
        else:
            refused = self._refused(connection, ApiKey.DELETE_RECORDS, TOPIC, [name for name, _, _ in wanted])
            answers = list(
                await asyncio.gather(
                    *(
                        _refusal() if name in refused else self._trim(name, partition, offset)
                        for name, partition, offset in wanted
                    )
                )
            )
        by_topic: dict[str, list[Any]] = {}
        for (name, partition, _), (code, low_watermark) in zip(wanted, answers, strict=True):
            by_topic.setdefault(name, []).append(
                build(
                    module.DeleteRecordsPartitionResult,
                    partition_index=partition,
                    low_watermark=low_watermark,
                    error_code=code,
                )
            )
        topics = tuple(
            build(module.DeleteRecordsTopicResult, name=name, partitions=tuple(partitions))
            for name, partitions in by_topic.items()
        )
        return build(module.DeleteRecordsResponse, throttle_time=0, topics=topics)

    async def _trim(self, name: str, partition: int, offset: int) -> tuple[int, int]:
        """(Kafka error code, low watermark) of one partition's DeleteRecords."""
        if topic_name_problem(name) or partition < 0:
            return UNKNOWN_TOPIC_OR_PARTITION, -1
        if offset < HIGH_WATERMARK:
            return OFFSET_OUT_OF_RANGE, -1
        if offset == HIGH_WATERMARK:
            log_end = await self._in_reads(self._log_end, name, partition)
            if log_end is None:
                return UNKNOWN_TOPIC_OR_PARTITION, -1
            offset = log_end
        trim = kq_pb2.DeleteRecordsRequest(topic=name, partition=partition, before_offset=offset)
        try:
            answer = await self._in_workers(self._service.DeleteRecords, trim, None)
        except KqError as error:
            return kafka_code(error, NOT_LEADER_OR_FOLLOWER), -1
        return NONE, answer.log_start_offset

    def _log_end(self, name: str, partition: int) -> int | None:
        """The partition's log end in this process's store (None: no such partition here)."""
        with self._store.read() as reader:
            topic = reader.topic(name)
            state = None if topic is None else reader.partition(topic.topic_id, partition)
            return None if state is None else state.log_end_offset

    async def create_partitions(self, request: Request, connection: Connection) -> Any:
        """Grows each topic to its new count through group 0's leader."""
        module = response_module(CREATE_PARTITIONS, request.api_version)
        body = request.body
        named = Counter(topic.name for topic in body.topics)
        results = []
        for topic in body.topics:
            message: str | None
            if named[topic.name] > 1:
                code, message = INVALID_REQUEST, f"topic {topic.name} is named more than once"
            elif not self._permitted(connection, ApiKey.CREATE_PARTITIONS, TOPIC, topic.name):
                code, message = TOPIC_AUTHORIZATION_FAILED, f"not authorized to ALTER topic {topic.name}"
            elif topic.assignments is not None:
                code, message = INVALID_REPLICA_ASSIGNMENT, "every node holds every partition: no assignment"
            else:
                code, message = await self._grow(topic.name, topic.count, body.validate_only)
            results.append(
                build(
                    module.CreatePartitionsTopicResult,
                    name=topic.name,
                    error_code=code,
                    error_message=message,
                )
            )
        return build(module.CreatePartitionsResponse, throttle_time=0, results=tuple(results))

    async def _grow(self, name: str, count: int, validate_only: bool) -> tuple[int, str | None]:
        """(Kafka error code, message) of one topic's growth to `count` partitions."""
        if topic_name_problem(name):
            return UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name}"
        if count <= 0:
            return INVALID_PARTITIONS, f"a partition count is positive, not {count}"
        grow = kq_pb2.CreatePartitionsRequest(name=name, partitions=count, validate_only=validate_only)
        try:
            await self._on_leader("CreatePartitions", grow)
        except KqError as error:
            code = kafka_code(error, NOT_CONTROLLER)
            # INVALID_REQUEST here is the count's (no growth, or over PARTITIONS_MAX): Kafka's code for it.
            return (INVALID_PARTITIONS if code == INVALID_REQUEST else code), str(error)
        return NONE, None


async def _refusal() -> tuple[int, int]:
    """A partition of a topic the principal may not DELETE: its answer, in the place of a trim."""
    return TOPIC_AUTHORIZATION_FAILED, -1
