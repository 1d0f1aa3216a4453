"""Kafka's OffsetForLeaderEpoch (KIP-101, KIP-320): where a leader epoch ends in a partition's log.

A consumer that fetched records of epoch E and then sees the partition's epoch rise in Metadata (a
failover) asks the new leader where E ends; an end below its position means the log was truncated
under it. kq's epochs are its groups' Raft terms, stamped in each batch and recorded per partition at
append (raft/epochs.py); this answers from the leader's store with Kafka's rule (`end_offset_for`).

Answered by the partition's group leader only (NOT_LEADER_OR_FOLLOWER elsewhere, as Kafka: a
follower's store may not hold the newest epoch's first batch yet); a current leader epoch the client
sends is checked as Fetch checks it (FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH). Needs DESCRIBE on the
topic (TOPIC_AUTHORIZATION_FAILED per partition), as Kafka asks of consumers; kq has no CLUSTER_ACTION
for replica requests, so a request with a replica id is treated as a consumer's.
"""

from __future__ import annotations

from typing import Any

from kq.broker.auth import TOPIC
from kq.broker.kafka.authorize import TOPIC_AUTHORIZATION_FAILED, ApiKey
from kq.broker.kafka.base import KafkaBase
from kq.broker.kafka.build import build, response_module
from kq.broker.kafka.codes import NONE, NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION
from kq.broker.kafka.framing import Request
from kq.broker.kafka.listener import Connection
from kq.proto.limits import KAFKA_PARTITIONS_PER_REQUEST_MAX
from kq.raft.epochs import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET, end_offset_for
from kq.raft.validation import topic_name_problem

OFFSET_FOR_LEADER_EPOCH = 23
Answer = tuple[int, int, int]  # error code, leader epoch, end offset


class EpochApis(KafkaBase):
    """OffsetForLeaderEpoch."""

    async def offset_for_leader_epoch(self, request: Request, connection: Connection) -> Any:
        """Each partition's end offset of the requested epoch, and the epoch that answers it."""
        module = response_module(OFFSET_FOR_LEADER_EPOCH, request.api_version)
        wanted = [
            (topic.topic, partition.partition, partition.current_leader_epoch, partition.leader_epoch)
            for topic in request.body.topics
            for partition in topic.partitions
        ]
        if len(wanted) > KAFKA_PARTITIONS_PER_REQUEST_MAX:
            wanted = []
        names = [topic for topic, _, _, _ in wanted]
        refused = self._refused(connection, ApiKey.OFFSET_FOR_LEADER_EPOCH, TOPIC, names)
        asked = [entry for entry in wanted if entry[0] not in refused]
        fenced = await self._in_reads(self._fenced, [(t, p, current) for t, p, current, _ in asked])
        found = await self._in_reads(self._end_offsets, [e for e in asked if (e[0], e[1]) not in fenced])
        by_topic: dict[str, list[Any]] = {}
        for topic, partition, _, _ in wanted:
            if topic in refused:
                answer: Answer = (TOPIC_AUTHORIZATION_FAILED, UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
            elif (topic, partition) in fenced:
                answer = (fenced[(topic, partition)], UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
            else:
                answer = found[(topic, partition)]
            code, epoch, end_offset = answer
            by_topic.setdefault(topic, []).append(
                build(
                    module.EpochEndOffset,
                    error_code=code,
                    partition=partition,
                    leader_epoch=epoch,
                    end_offset=end_offset,
                )
            )
        topics = tuple(
            build(module.OffsetForLeaderTopicResult, topic=name, partitions=tuple(partitions))
            for name, partitions in by_topic.items()
        )
        return build(module.OffsetForLeaderEpochResponse, throttle_time=0, topics=topics)

    def _end_offsets(self, wanted: list[tuple[str, int, int, int]]) -> dict[tuple[str, int], Answer]:
        """(error code, epoch, end offset) per (topic, partition), from this process's store; on the
        read pool."""
        undefined = (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
        leads = self._consensus.is_leader()
        current = self._leader_epoch(self._groups.group)
        answers: dict[tuple[str, int], Answer] = {}
        with self._store.read() as reader:
            for name, partition, _, requested in wanted:
                topic = None if topic_name_problem(name) else reader.topic(name)
                state = None if topic is None else reader.partition(topic.topic_id, partition)
                if topic is None or state is None:
                    answers[(name, partition)] = (UNKNOWN_TOPIC_OR_PARTITION, *undefined)
                elif not leads or self._groups.group_of(topic, partition) != self._groups.group:
                    answers[(name, partition)] = (NOT_LEADER_OR_FOLLOWER, *undefined)
                else:
                    epochs = reader.leader_epochs(topic.topic_id, partition)
                    found = end_offset_for(epochs, current, requested, state.log_end_offset)
                    answers[(name, partition)] = (NONE, *found)
        return answers
