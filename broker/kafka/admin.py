"""Kafka's partition administration: DeleteRecords (API 21).

DeleteRecords trims each partition through its own Raft group (kq's TrimCommand, the one retention
and `kq` DeleteRecords propose), so each partition is answered by the leader of the group that holds
it: elsewhere NOT_LEADER_OR_FOLLOWER, and the client sends it there, as Kafka's produce answers. An
offset of -1 means the high watermark (kq's log end: every stored record is committed); one above it,
or below -1, is OFFSET_OUT_OF_RANGE. Each answer is the partition's new low watermark (its log start).

ACLs (Kafka's): DeleteRecords needs DELETE on each topic.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kq.broker.auth import TOPIC
from kq.broker.errors import KqError
from kq.broker.kafka.authorize import TOPIC_AUTHORIZATION_FAILED, ApiKey
from kq.broker.kafka.base import (
    INVALID_REQUEST,
    NONE,
    NOT_LEADER_OR_FOLLOWER,
    OFFSET_OUT_OF_RANGE,
    UNKNOWN_TOPIC_OR_PARTITION,
    KafkaBase,
    kafka_code,
)
from kq.broker.kafka.build import build, response_module
from kq.broker.kafka.framing import Request
from kq.broker.kafka.listener import Connection
from kq.proto import kq_pb2
from kq.proto.limits import KAFKA_PARTITIONS_PER_REQUEST_MAX
from kq.raft.validation import topic_name_problem

DELETE_RECORDS = 21
HIGH_WATERMARK = (
    -1
)  # DeleteRecords' offset meaning "every record" (Kafka's DeleteRecordsRequest.HIGH_WATERMARK).


class AdminApis(KafkaBase):
    """DeleteRecords (see the module)."""

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


async def _refusal() -> tuple[int, int]:
    """A partition of a topic the principal may not DELETE: its answer, in the place of a trim."""
    return TOPIC_AUTHORIZATION_FAILED, -1
