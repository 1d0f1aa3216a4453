"""Kafka Fetch and ListOffsets, served by any node from its own store.

Fetch returns the stored RecordBatch v2 bytes as they are (their base offsets were stamped when they
were applied): no record is decoded or encoded on the way out. The first batch may start before the
fetch offset; Kafka clients skip those records, as they do with Kafka. A fetch that finds fewer than
`min_bytes` waits (a coroutine, up to `max_wait`) for an append to one of its partitions, holding a
reader slot of the node (broker/admission.py) while it waits; without a free slot it answers at once.
Fetch sessions (KIP-227) are refused by answering session id 0: clients then send full requests.

Follower fetching (KIP-392): every node holds every partition, so any node serves a Fetch. The leader
(the only node Metadata names) answers a consumer whose `rack_id` (client.rack) is another live,
caught-up node's rack, and not its own, with that node as `preferred_read_replica` and no records
(`preferred_read_replica`, Kafka's RackAwareReplicaSelector); the client then fetches there. A
follower asked for an offset past its own log end asks the leader for its log end: an offset the
leader has is waited for (an empty answer, not OFFSET_OUT_OF_RANGE), since this node only has yet to
apply it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kq.broker.auth import TOPIC
from kq.broker.corruption import CORRUPTION
from kq.broker.errors import KqError, TooManyReadersError
from kq.broker.group_service import first_offset_at
from kq.broker.kafka.authorize import TOPIC_AUTHORIZATION_FAILED, ApiKey
from kq.broker.kafka.base import KafkaBase, KafkaBrokerInfo
from kq.broker.kafka.build import build, response_module
from kq.broker.kafka.codes import (
    INVALID_REQUEST,
    KAFKA_STORAGE_ERROR,
    NONE,
    NOT_LEADER_OR_FOLLOWER,
    OFFSET_OUT_OF_RANGE,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from kq.broker.kafka.framing import Request
from kq.broker.kafka.listener import Connection
from kq.broker.metrics import count_fetched
from kq.broker.service_base import stored_records
from kq.broker.waiters import EVERY, WatchKey, wait_for_wake
from kq.proto import kq_pb2
from kq.proto.limits import (
    FETCH_BYTES_MAX,
    FETCH_WAIT_MS_MAX,
    KAFKA_FETCH_WATCHED_PARTITIONS_MAX,
    KAFKA_LAG_CHECK_TOPICS_MAX,
    KAFKA_MAX_TIMESTAMP_ROWS_MAX,
    KAFKA_PARTITIONS_PER_REQUEST_MAX,
    TXN_ABORTED_PER_FETCH_MAX,
    TXN_OPEN_PER_PARTITION_MAX,
)
from kq.raft.epochs import epoch_at
from kq.raft.validation import topic_name_problem
from kq.storage import CorruptRecordError, StoreReader, TopicMeta

FETCH, LIST_OFFSETS = 1, 2
FETCH_SESSION_ID_NOT_FOUND = 70
READ_COMMITTED = 1  # Fetch's and ListOffsets' isolation_level (0: read_uncommitted).
EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3
NO_PREFERRED_REPLICA = -1
Wanted = list[tuple[str, int, int, int]]  # (topic, partition, fetch offset, partition max bytes)
LeaderEnds = dict[tuple[str, int], int]  # (topic, partition) -> the leader's log end, past this node's


@dataclass(frozen=True, slots=True)
class PartitionRead:
    """What one fetch read of one partition found."""

    topic: str
    partition: int
    error_code: int
    high_watermark: int = -1
    log_start_offset: int = -1
    records: bytes = b""
    record_count: int = 0
    preferred_read_replica: int = NO_PREFERRED_REPLICA
    last_stable_offset: int = -1  # -1: the high watermark (no open transaction, or an error).
    # read_committed: the aborted transactions (producer id, first offset) among the records served.
    aborted: tuple[tuple[int, int], ...] | None = None


class FetchApis(KafkaBase):
    """Kafka's Fetch and ListOffsets over this node's store."""

    async def fetch(self, request: Request, connection: Connection) -> Any:
        """Stored batches of each partition from its fetch offset, long-polling for `min_bytes`."""
        body = request.body
        module = response_module(FETCH, request.api_version)
        if getattr(body, "session_id", 0) != 0:
            return build(
                module.FetchResponse,
                throttle_time=0,
                error_code=FETCH_SESSION_ID_NOT_FOUND,
                session_id=0,
                responses=(),
            )
        wanted = [
            (topic.topic, partition.partition, partition.fetch_offset, partition.partition_max_bytes)
            for topic in body.topics
            for partition in topic.partitions
        ]
        if len(wanted) > KAFKA_PARTITIONS_PER_REQUEST_MAX:
            return build(
                module.FetchResponse, throttle_time=0, error_code=INVALID_REQUEST, session_id=0, responses=()
            )
        refused = self._refused(connection, ApiKey.FETCH, TOPIC, [topic for topic, _, _, _ in wanted])
        denied = [PartitionRead(t, p, TOPIC_AUTHORIZATION_FAILED) for t, p, _, _ in wanted if t in refused]
        wanted = [entry for entry in wanted if entry[0] not in refused]
        epochs = [
            (topic.topic, partition.partition, getattr(partition, "current_leader_epoch", -1))
            for topic in body.topics
            for partition in topic.partitions
            if topic.topic not in refused
        ]
        fenced = await self._in_reads(self._fenced, epochs)  # Fetch v9+ (KIP-320).
        denied += [PartitionRead(t, p, code) for (t, p), code in fenced.items()]
        wanted = [entry for entry in wanted if (entry[0], entry[1]) not in fenced]
        max_bytes = min(body.max_bytes if body.max_bytes > 0 else FETCH_BYTES_MAX, FETCH_BYTES_MAX)
        wait_ms = min(max(int(body.max_wait.total_seconds() * 1000), 0), FETCH_WAIT_MS_MAX)
        rack = str(getattr(body, "rack_id", "") or "")  # Fetch v11+: the consumer's client.rack.
        committed = getattr(body, "isolation_level", 0) == READ_COMMITTED
        reads = await self._fetch_reads(
            wanted, max_bytes, body.min_bytes, wait_ms, connection, rack, committed
        )
        self._count_fetch(reads)
        return self._fetch_response(module, denied + reads)

    async def _fetch_reads(
        self,
        wanted: Wanted,
        max_bytes: int,
        min_bytes: int,
        wait_ms: int,
        connection: Connection,
        rack: str,
        committed: bool,
    ) -> list[PartitionRead]:
        reads = await self._in_reads(self._read_partitions, wanted, max_bytes, {}, committed)
        preferred = self._preferred_replica(rack)
        if preferred != NO_PREFERRED_REPLICA:  # Answered at once, as Kafka does: the client moves there.
            return [
                replace(read, records=b"", record_count=0, preferred_read_replica=preferred)
                if read.error_code == NONE
                else read
                for read in reads
            ]
        behind = await self._leader_ends(wanted, reads)
        if behind:
            self._fetch_totals.lagging += 1
            reads = await self._in_reads(self._read_partitions, wanted, max_bytes, behind, committed)
        deadline = time.monotonic() + wait_ms / 1000
        if not wanted or _found_enough(reads, min_bytes) or self._past(deadline):
            return reads  # A fetch of no partitions has nothing to wait for.
        try:
            with self._readers.admitted(connection.peer):
                while not self._past(deadline):
                    with contextlib.ExitStack() as watches:
                        woken = [watches.enter_context(self._notifier.watching(key)) for key in _keys(wanted)]
                        reads = await self._in_reads(
                            self._read_partitions, wanted, max_bytes, behind, committed
                        )
                        if _found_enough(reads, min_bytes):
                            return reads
                        await _wait_any(woken, deadline - time.monotonic())
        except TooManyReadersError:
            pass  # No slot to wait in: answer what there is now, as a fetch with max_wait 0 would.
        return await self._in_reads(self._read_partitions, wanted, max_bytes, behind, committed)

    def _holds(self, topic: TopicMeta, partition: int) -> bool:
        """Whether this process's group holds the partition (its store holds only a copy of the
        topic otherwise: broker/topic_sync.py)."""
        return self._groups.group_of(topic, partition) == self._groups.group

    def _preferred_replica(self, rack: str) -> int:
        """Where the leader sends a consumer in `rack` (NO_PREFERRED_REPLICA: served here).

        Read after the store read, so every candidate's match index covers every entry that read saw:
        the node holds every offset the client may ask for next (Kafka likewise only prefers a replica
        whose log end is at least the fetch offset)."""
        if not rack or not self._consensus.is_leader():
            return NO_PREFERRED_REPLICA  # A follower serves whatever reaches it: no redirect loops.
        status = self._consensus.status()
        caught_up = {
            broker.broker_id: status.match_indexes.get(broker.node_id, 0)
            for broker in self._settings.brokers
            if status.connected.get(broker.node_id, False)
            and status.match_indexes.get(broker.node_id, 0) >= status.applied_index
        }
        settings = self._settings
        choice = preferred_read_replica(rack, settings.self_broker_id, settings.brokers, caught_up)
        if choice != NO_PREFERRED_REPLICA:
            self._fetch_totals.redirected += 1
        return choice

    async def _leader_ends(self, wanted: Wanted, reads: list[PartitionRead]) -> LeaderEnds:
        """On a follower, the partitions fetched past this node's log end that the leader has (its log
        end, by partition): the offsets exist, this node has not applied them yet. Asks the leader's
        gRPC ListOffsets once per topic, for at most KAFKA_LAG_CHECK_TOPICS_MAX topics; a partition it
        cannot confirm keeps OFFSET_OUT_OF_RANGE (KIP-392 clients then go back to the leader)."""
        past_end = [
            (read.topic, read.partition, offset)
            for (_, _, offset, _), read in zip(wanted, reads, strict=True)
            if read.error_code == OFFSET_OUT_OF_RANGE and offset > read.high_watermark
        ]
        if not past_end or self._consensus.is_leader():
            return {}
        leader = self._consensus.leader_grpc_address()
        if leader is None:
            return {}
        ends: LeaderEnds = {}
        for topic in list(dict.fromkeys(topic for topic, _, _ in past_end))[:KAFKA_LAG_CHECK_TOPICS_MAX]:
            try:
                request = kq_pb2.ListOffsetsRequest(topic=topic)
                answer = await self._forwarder.call(leader, "ListOffsets", request)
            except KqError:
                continue  # Unknown to the leader, or no leader now: the offset stays out of range.
            ends.update(((topic, info.partition), info.log_end_offset) for info in answer.partitions)
        return {
            (topic, partition): ends[(topic, partition)]
            for topic, partition, offset in past_end
            if offset <= ends.get((topic, partition), -1)
        }

    def _count_fetch(self, reads: list[PartitionRead]) -> None:
        totals = self._fetch_totals
        totals.fetches += 1
        totals.records += sum(read.record_count for read in reads)
        totals.record_bytes += sum(len(read.records) for read in reads)

    def _read_partitions(
        self, wanted: Wanted, max_bytes: int, behind: LeaderEnds, committed: bool = False
    ) -> list[PartitionRead]:
        """One read transaction over every wanted partition, within `max_bytes` (but always the first
        batch found, so a consumer makes progress past a batch larger than its limits, as in Kafka);
        `committed`: read_committed, up to each partition's last stable offset."""
        reads = []
        remaining = max_bytes
        with self._store.read() as reader:
            for topic, partition, offset, partition_max_bytes in wanted:
                read = _read_partition(
                    reader,
                    topic,
                    partition,
                    offset,
                    min(partition_max_bytes, remaining),
                    first=remaining == max_bytes,
                    leader_end=behind.get((topic, partition)),
                    holds=self._holds,
                    committed=committed,
                )
                remaining -= len(read.records)
                reads.append(read)
        return reads

    @staticmethod
    def _fetch_response(module: Any, reads: list[PartitionRead]) -> Any:
        by_topic: dict[str, list[Any]] = {}
        for read in reads:
            by_topic.setdefault(read.topic, []).append(
                build(
                    module.PartitionData,
                    partition_index=read.partition,
                    error_code=read.error_code,
                    high_watermark=read.high_watermark,
                    last_stable_offset=read.last_stable_offset
                    if read.last_stable_offset >= 0
                    else read.high_watermark,
                    log_start_offset=read.log_start_offset,
                    aborted_transactions=None
                    if read.aborted is None
                    else tuple(
                        build(module.AbortedTransaction, producer_id=producer_id, first_offset=first_offset)
                        for producer_id, first_offset in read.aborted
                    ),
                    preferred_read_replica=read.preferred_read_replica,
                    records=read.records,
                )
            )
        topics = tuple(
            build(module.FetchableTopicResponse, topic=topic, partitions=tuple(partitions))
            for topic, partitions in by_topic.items()
        )
        return build(module.FetchResponse, throttle_time=0, error_code=NONE, session_id=0, responses=topics)

    # ListOffsets --------------------------------------------------------------------------------

    async def list_offsets(self, request: Request, connection: Connection) -> Any:
        """Each partition's earliest or latest offset, the record with the largest timestamp (-3), or
        the first offset at or after a timestamp."""
        module = response_module(LIST_OFFSETS, request.api_version)
        given = [
            (topic.name, partition.partition_index, partition.timestamp)
            for topic in request.body.topics
            for partition in topic.partitions
        ]
        wanted = given if len(given) <= KAFKA_PARTITIONS_PER_REQUEST_MAX else []
        refused = self._refused(connection, ApiKey.LIST_OFFSETS, TOPIC, [topic for topic, _, _ in wanted])
        epochs = [
            (topic.name, partition.partition_index, getattr(partition, "current_leader_epoch", -1))
            for topic in request.body.topics
            for partition in topic.partitions
            if topic.name not in refused
        ]
        fenced = await self._in_reads(self._fenced, epochs if wanted else [])  # ListOffsets v4+ (KIP-320).
        asked = [w for w in wanted if w[0] not in refused and (w[0], w[1]) not in fenced]
        committed = getattr(request.body, "isolation_level", 0) == READ_COMMITTED
        found = iter(await self._in_reads(self._list_offsets, asked, committed))
        by_topic: dict[str, list[Any]] = {}
        for topic, partition, _ in wanted:
            if topic in refused:
                code, timestamp, offset, epoch = TOPIC_AUTHORIZATION_FAILED, -1, -1, -1
            elif (topic, partition) in fenced:
                code, timestamp, offset, epoch = fenced[(topic, partition)], -1, -1, -1
            else:
                code, timestamp, offset, epoch = next(found)
            by_topic.setdefault(topic, []).append(
                build(
                    module.ListOffsetsPartitionResponse,
                    partition_index=partition,
                    error_code=code,
                    timestamp=timestamp,
                    offset=offset,
                    leader_epoch=epoch,
                )
            )
        topics = tuple(
            build(module.ListOffsetsTopicResponse, name=name, partitions=tuple(partitions))
            for name, partitions in by_topic.items()
        )
        return build(module.ListOffsetsResponse, throttle_time=0, topics=topics)

    def _list_offsets(
        self, wanted: list[tuple[str, int, int]], committed: bool = False
    ) -> list[tuple[int, int, int, int]]:
        """(error code, timestamp, offset, leader epoch) per wanted (topic, partition, timestamp): the
        epoch of the batch holding the offset found (Kafka's), the current one for the log end;
        `committed` (read_committed): LATEST is the last stable offset."""
        with self._store.read() as reader:
            return [
                self._with_epoch(reader, topic, partition, answer)
                for (topic, partition, _), answer in zip(
                    wanted, self._offsets_found(reader, wanted, committed), strict=True
                )
            ]

    def _with_epoch(
        self, reader: StoreReader, topic_name: str, partition: int, answer: tuple[int, int, int]
    ) -> tuple[int, int, int, int]:
        code, timestamp, offset = answer
        topic = reader.topic(topic_name) if code == NONE and offset >= 0 else None
        if topic is None:
            return code, timestamp, offset, -1
        state = reader.partition(topic.topic_id, partition)
        if state is not None and offset >= state.log_end_offset:
            return code, timestamp, offset, self._leader_epoch(self._groups.group)
        return code, timestamp, offset, epoch_at(reader.leader_epochs(topic.topic_id, partition), offset)

    def _offsets_found(
        self, reader: StoreReader, wanted: list[tuple[str, int, int]], committed: bool = False
    ) -> list[tuple[int, int, int]]:
        """(error code, timestamp, offset) per wanted (topic, partition, timestamp)."""
        answers = []
        for topic_name, partition, timestamp in wanted:
            topic = None if topic_name_problem(topic_name) else reader.topic(topic_name)
            state = None if topic is None else reader.partition(topic.topic_id, partition)
            if topic is None or state is None:
                answers.append((UNKNOWN_TOPIC_OR_PARTITION, -1, -1))
            elif not self._holds(topic, partition):
                answers.append((NOT_LEADER_OR_FOLLOWER, -1, -1))
            elif timestamp == EARLIEST:
                answers.append((NONE, -1, state.log_start_offset))
            elif timestamp == LATEST and committed:
                stable = reader.last_stable_offset(
                    topic.topic_id, partition, state.log_end_offset, TXN_OPEN_PER_PARTITION_MAX
                )
                answers.append((NONE, -1, stable))
            elif timestamp == LATEST:
                answers.append((NONE, -1, state.log_end_offset))
            elif timestamp == MAX_TIMESTAMP:
                found = max_timestamp_offset(reader, topic.topic_id, partition, state.log_start_offset)
                answers.append((NONE, *found))
            elif timestamp < 0:
                answers.append((INVALID_REQUEST, -1, -1))
            else:
                found_at = first_offset_at(
                    reader, topic.topic_id, partition, state.log_start_offset, timestamp
                )
                # Kafka answers the found record's own timestamp, and -1/-1 when none is that late.
                answers.append((NONE, -1, -1) if found_at is None else (NONE, found_at[1], found_at[0]))
        return answers


def max_timestamp_offset(reader: StoreReader, topic_id: int, partition: int, start: int) -> tuple[int, int]:
    """(timestamp, offset) of the record with the largest timestamp (KIP-734), (-1, -1) without one.

    As Kafka (3.8+, KAFKA-16310) does, the answer comes from batch headers: the batch with the largest
    maxTimestamp (the earliest of those sharing it; one seek in the store's `timestamps` index), then
    the first record of that batch, at or after the log start, whose timestamp equals it. Only that
    one batch is decoded, so the cost is bounded by one batch whatever the partition holds. In a
    LogAppendTime batch every record reads as maxTimestamp, so that is its first record. A header
    whose maxTimestamp no record carries (clients differ) answers the batch's last offset, as Kafka
    did before 3.8 (its index kept the batch's last offset).
    """
    found = reader.max_timestamp(topic_id, partition, start, KAFKA_MAX_TIMESTAMP_ROWS_MAX)
    if found is None:
        return -1, -1
    timestamp_ms, base_offset = found
    batch = reader.batches(topic_id, partition, base_offset, 1)[0]
    for record in stored_records(batch):
        offset = batch.base_offset + record.offset_delta
        if offset >= start and record.timestamp_ms == timestamp_ms:
            return timestamp_ms, offset
    return timestamp_ms, batch.next_offset - 1


def preferred_read_replica(
    client_rack: str, self_broker_id: int, brokers: Sequence[KafkaBrokerInfo], caught_up: Mapping[int, int]
) -> int:
    """The broker a consumer in `client_rack` should fetch from instead of this one, or -1 to be served
    here: Kafka's RackAwareReplicaSelector over kq's replicas (every node).

    No rack, no node in that rack, or this node in it: served here. Otherwise the node of that rack
    that holds the most (`caught_up`: broker id -> Raft match index, only live nodes holding what
    this one served), the lowest id among equals; none such: served here.
    """
    same_rack = [broker.broker_id for broker in brokers if client_rack and broker.rack == client_rack]
    if not same_rack or self_broker_id in same_rack:
        return NO_PREFERRED_REPLICA
    candidates = [broker_id for broker_id in same_rack if broker_id in caught_up]
    if not candidates:
        return NO_PREFERRED_REPLICA
    return min(candidates, key=lambda broker_id: (-caught_up[broker_id], broker_id))


def _read_partition(
    reader: StoreReader,
    topic_name: str,
    partition: int,
    offset: int,
    max_bytes: int,
    first: bool,
    leader_end: int | None = None,
    holds: Callable[[TopicMeta, int], bool] = lambda _topic, _partition: True,
    committed: bool = False,
) -> PartitionRead:
    """One partition's read. `leader_end`: on a follower, the leader's log end when `offset` is past
    this node's: an offset up to it answers empty (it will be applied here) rather than out of range.
    `holds(topic, partition)`: whether this process's group holds the partition (else
    NOT_LEADER_OR_FOLLOWER: the client asks Metadata again and goes to one of that group's brokers)."""
    topic = None if topic_name_problem(topic_name) else reader.topic(topic_name)
    state = None if topic is None else reader.partition(topic.topic_id, partition)
    if topic is None or state is None:
        return PartitionRead(topic_name, partition, UNKNOWN_TOPIC_OR_PARTITION)
    if not holds(topic, partition):
        return PartitionRead(topic_name, partition, NOT_LEADER_OR_FOLLOWER)
    stable = reader.last_stable_offset(
        topic.topic_id, partition, state.log_end_offset, TXN_OPEN_PER_PARTITION_MAX
    )
    read = PartitionRead(
        topic_name,
        partition,
        NONE,
        state.log_end_offset,
        state.log_start_offset,
        last_stable_offset=stable,
        aborted=() if committed else None,
    )
    if leader_end is not None and state.log_end_offset < offset <= leader_end:
        return read
    if not state.log_start_offset <= offset <= state.log_end_offset:
        return PartitionRead(
            topic_name, partition, OFFSET_OUT_OF_RANGE, state.log_end_offset, state.log_start_offset
        )
    end = stable if committed else state.log_end_offset  # read_committed stops at the LSO.
    if offset >= end or (max_bytes <= 0 and not first):
        return read
    try:
        batches = reader.batches(topic.topic_id, partition, offset, max(max_bytes, 1))
    except CorruptRecordError as error:  # This node's copy is damaged: the client retries elsewhere.
        CORRUPTION.found(error, topic_name, partition)
        return PartitionRead(
            topic_name, partition, KAFKA_STORAGE_ERROR, state.log_end_offset, state.log_start_offset
        )
    if committed:  # A batch is wholly below the LSO or not (the LSO is a transaction's first batch).
        batches = [batch for batch in batches if batch.base_offset < end]
    count_fetched(topic_name, batches)
    aborted = None
    if committed and batches:
        found = reader.aborted_transactions(
            topic.topic_id, partition, offset, batches[-1].next_offset, TXN_ABORTED_PER_FETCH_MAX
        )
        aborted = tuple((row.producer_id, row.first_offset) for row in found)
    return PartitionRead(
        topic_name,
        partition,
        NONE,
        state.log_end_offset,
        state.log_start_offset,
        b"".join(batch.data for batch in batches),
        sum(batch.record_count for batch in batches),
        last_stable_offset=stable,
        aborted=aborted if committed else None,
    )


def _found_enough(reads: list[PartitionRead], min_bytes: int) -> bool:
    """Whether to answer now: enough bytes, or an error the client must see."""
    found = sum(len(read.records) for read in reads)
    return found >= max(min_bytes, 1) or any(read.error_code != NONE for read in reads)


def _keys(wanted: list[tuple[str, int, int, int]]) -> list[WatchKey]:
    """What a waiting fetch watches: its partitions, or every append when it names many."""
    if len(wanted) > KAFKA_FETCH_WATCHED_PARTITIONS_MAX:
        return [EVERY]
    return list(dict.fromkeys((topic, partition) for topic, partition, _, _ in wanted))


async def _wait_any(woken: list[Any], timeout_s: float) -> None:
    """Returns when any of the futures is woken, or after `timeout_s`."""
    if len(woken) == 1:
        await wait_for_wake(woken[0], timeout_s)
        return
    await asyncio.wait(woken, timeout=max(timeout_s, 0.0), return_when=asyncio.FIRST_COMPLETED)
