"""Kafka transactions (KIP-98, KIP-447) at the edge: AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
TxnOffsetCommit, and InitProducerId with a transactional id.

The transaction coordinator is group 0's leader (FindCoordinator with key_type 1 names its broker); each
request is checked here (ACLs: WRITE on the transactional id, and what Kafka adds per API), then runs
as the coordinator's RPC (broker/transaction_service.py) on group 0's leader, forwarded there from any
other process. The state machine is raft/transactions.py; the markers broker/txn_coordinator.py.

Where kq differs from Kafka: the partition leaders do not verify that a transactional batch's partition
was added to its transaction (KIP-890's verification); a transaction left open in a partition its
coordinator never marks is aborted by that partition's leader after TXN_HANGING_ABORT_MS. TxnOffsetCommit
does not check the consumer's generation (KIP-447's fencing of zombie consumers by generation):
the producer's epoch fences zombie producers.
"""

from __future__ import annotations

import datetime
from typing import Any

from kq.broker.auth import GROUP, TOPIC, TRANSACTIONAL_ID
from kq.broker.errors import KqError
from kq.broker.kafka.authorize import (
    GROUP_AUTHORIZATION_FAILED,
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    ApiKey,
)
from kq.broker.kafka.base import KafkaBase, kafka_code
from kq.broker.kafka.build import build, response_module
from kq.broker.kafka.codes import NONE, NOT_COORDINATOR, NOT_LEADER_OR_FOLLOWER
from kq.broker.kafka.framing import Request
from kq.broker.kafka.groups import OFFSET_METADATA_TOO_LARGE, committed_details
from kq.broker.kafka.listener import Connection
from kq.broker.proposals import wall_clock_ms
from kq.proto import kq_pb2
from kq.proto.limits import (
    DESCRIBED_PRODUCERS_MAX,
    TXN_LIST_MAX,
    TXN_OPEN_PER_PARTITION_MAX,
    TXN_PARTITIONS_MAX,
)
from kq.proto.records import SEQUENCE_MODULUS
from kq.proto.txn_states import STATE_NAMES
from kq.raft.placement import METADATA_GROUP
from kq.raft.transactions import transactional_id_problem
from kq.raft.validation import offset_metadata_problem, topic_name_problem
from kq.storage import ProducerWindow

UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_PRODUCER_EPOCH = 47
INVALID_PRODUCER_ID_MAPPING = 49
INVALID_TRANSACTION_TIMEOUT = 50
INVALID_REQUEST = 42
OPERATION_NOT_ATTEMPTED = 55
EPOCH_MAX = 32_767


def producer_problem(producer_id: int, producer_epoch: int) -> int | None:
    """Kafka's code for a producer id or epoch no producer holds (negative, past int16), or None."""
    if producer_id < 0:
        return INVALID_PRODUCER_ID_MAPPING
    if not 0 <= producer_epoch <= EPOCH_MAX:
        return INVALID_PRODUCER_EPOCH
    return None


class TransactionApis(KafkaBase):
    """Kafka's transaction APIs over the coordinator's RPCs."""

    async def _coordinator_call(self, method: str, request: Any) -> tuple[int, Any]:
        """(Kafka error code, response) of the coordinator's RPC; NOT_COORDINATOR when group 0's leader
        moved, so the client looks its coordinator up again."""
        try:
            return NONE, await self._on_leader(method, request)
        except KqError as error:
            return kafka_code(error, NOT_COORDINATOR), None

    async def init_transactional_producer(self, request: Request, connection: Connection) -> Any:
        """InitProducerId with a transactional id: its producer id and a new epoch (fencing older ones)."""
        module = response_module(ApiKey.INIT_PRODUCER_ID, request.api_version)
        body = request.body
        code, answer = NONE, None
        if not self._permitted(connection, ApiKey.INIT_PRODUCER_ID, TRANSACTIONAL_ID, body.transactional_id):
            code = TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        elif not 0 <= body.transaction_timeout.total_seconds() * 1000 < 2**32:
            code = INVALID_TRANSACTION_TIMEOUT
        else:
            timeout_ms = int(body.transaction_timeout.total_seconds() * 1000)
            call = kq_pb2.InitTransactionRequest(
                transactional_id=body.transactional_id, timeout_ms=timeout_ms
            )
            code, answer = await self._coordinator_call("InitTransaction", call)
        return build(
            module.InitProducerIdResponse,
            throttle_time=0,
            error_code=code,
            producer_id=answer.producer_id if answer is not None else -1,
            producer_epoch=answer.producer_epoch if answer is not None else -1,
        )

    async def add_partitions_to_txn(self, request: Request, connection: Connection) -> Any:
        """AddPartitionsToTxn v0-3: the partitions join the transaction, all or none (a partition the
        principal may not WRITE fails the others with OPERATION_NOT_ATTEMPTED, as Kafka answers)."""
        module = response_module(ApiKey.ADD_PARTITIONS_TO_TXN, request.api_version)
        body = request.body
        wanted = [(topic.name, int(p)) for topic in body.v3_and_below_topics for p in topic.partitions]
        transactional_id = body.v3_and_below_transactional_id
        codes: dict[tuple[str, int], int]
        if not self._permitted(connection, ApiKey.ADD_PARTITIONS_TO_TXN, TRANSACTIONAL_ID, transactional_id):
            codes = dict.fromkeys(wanted, TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        elif len(wanted) > TXN_PARTITIONS_MAX:
            codes = dict.fromkeys(wanted, INVALID_REQUEST)
        elif producer_problem(body.v3_and_below_producer_id, body.v3_and_below_producer_epoch) is not None:
            problem = producer_problem(body.v3_and_below_producer_id, body.v3_and_below_producer_epoch)
            codes = dict.fromkeys(wanted, problem or INVALID_REQUEST)
        elif any(p < 0 for _, p in wanted):
            codes = {
                (t, p): UNKNOWN_TOPIC_OR_PARTITION if p < 0 else OPERATION_NOT_ATTEMPTED for t, p in wanted
            }
        else:
            refused = self._refused(connection, ApiKey.ADD_PARTITIONS_TO_TXN, TOPIC, [t for t, _ in wanted])
            if refused:
                codes = {
                    (t, p): TOPIC_AUTHORIZATION_FAILED if t in refused else OPERATION_NOT_ATTEMPTED
                    for t, p in wanted
                }
            else:
                call = kq_pb2.AddToTransactionRequest(
                    transactional_id=transactional_id,
                    producer_id=body.v3_and_below_producer_id,
                    producer_epoch=body.v3_and_below_producer_epoch,
                    partitions=[kq_pb2.TxnPartition(topic=t, partition=p) for t, p in wanted],
                )
                code, _ = await self._coordinator_call("AddToTransaction", call)
                codes = dict.fromkeys(wanted, code)
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition), code in codes.items():
            result = build(
                module.AddPartitionsToTxnPartitionResult, partition_index=partition, partition_error_code=code
            )
            by_topic.setdefault(topic, []).append(result)
        results = tuple(
            build(module.AddPartitionsToTxnTopicResult, name=name, results_by_partition=tuple(partitions))
            for name, partitions in by_topic.items()
        )
        return build(
            module.AddPartitionsToTxnResponse, throttle_time=0, results_by_topic_v3_and_below=results
        )

    async def add_offsets_to_txn(self, request: Request, connection: Connection) -> Any:
        """AddOffsetsToTxn: the consumer group's offsets (TxnOffsetCommit) join the transaction."""
        module = response_module(ApiKey.ADD_OFFSETS_TO_TXN, request.api_version)
        body = request.body
        if not self._permitted(
            connection, ApiKey.ADD_OFFSETS_TO_TXN, TRANSACTIONAL_ID, body.transactional_id
        ):
            code = TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        elif not self._permitted(connection, ApiKey.ADD_OFFSETS_TO_TXN, GROUP, body.group_id):
            code = GROUP_AUTHORIZATION_FAILED
        elif producer_problem(body.producer_id, body.producer_epoch) is not None:
            code = producer_problem(body.producer_id, body.producer_epoch) or INVALID_REQUEST
        else:
            call = kq_pb2.AddToTransactionRequest(
                transactional_id=body.transactional_id,
                producer_id=body.producer_id,
                producer_epoch=body.producer_epoch,
                groups=[body.group_id],
            )
            code, _ = await self._coordinator_call("AddToTransaction", call)
        return build(module.AddOffsetsToTxnResponse, throttle_time=0, error_code=code)

    async def end_txn(self, request: Request, connection: Connection) -> Any:
        """EndTxn: commits or aborts (authorized in KafkaApis.answer: WHOLE)."""
        module = response_module(ApiKey.END_TXN, request.api_version)
        body = request.body
        problem = producer_problem(body.producer_id, body.producer_epoch)
        if problem is not None:
            return build(module.EndTxnResponse, throttle_time=0, error_code=problem)
        call = kq_pb2.EndTransactionRequest(
            transactional_id=body.transactional_id,
            producer_id=body.producer_id,
            producer_epoch=body.producer_epoch,
            commit=bool(body.committed),
        )
        code, _ = await self._coordinator_call("EndTransaction", call)
        return build(module.EndTxnResponse, throttle_time=0, error_code=code)

    async def txn_offset_commit(self, request: Request, connection: Connection) -> Any:
        """TxnOffsetCommit: the group's offsets, committed when the transaction commits."""
        module = response_module(ApiKey.TXN_OFFSET_COMMIT, request.api_version)
        body = request.body
        wanted = [
            (topic.name, int(p.partition_index), int(p.committed_offset))
            for topic in body.topics
            for p in topic.partitions
        ]
        codes: dict[tuple[str, int], int]
        if not self._permitted(connection, ApiKey.TXN_OFFSET_COMMIT, TRANSACTIONAL_ID, body.transactional_id):
            codes = {(t, p): TRANSACTIONAL_ID_AUTHORIZATION_FAILED for t, p, _ in wanted}
        elif not self._permitted(connection, ApiKey.TXN_OFFSET_COMMIT, GROUP, body.group_id):
            codes = {(t, p): GROUP_AUTHORIZATION_FAILED for t, p, _ in wanted}
        elif producer_problem(body.producer_id, body.producer_epoch) is not None:
            problem = producer_problem(body.producer_id, body.producer_epoch)
            codes = {(t, p): problem or INVALID_REQUEST for t, p, _ in wanted}
        elif any(p < 0 for _, p, _ in wanted):
            codes = {
                (t, p): UNKNOWN_TOPIC_OR_PARTITION if p < 0 else OPERATION_NOT_ATTEMPTED for t, p, _ in wanted
            }
        else:
            refused = self._refused(connection, ApiKey.TXN_OFFSET_COMMIT, TOPIC, [t for t, _, _ in wanted])
            details = committed_details(body)
            allowed = [(t, p, o) for t, p, o in wanted if t not in refused]
            code = NONE
            if allowed:
                call = kq_pb2.TxnCommitOffsetsRequest(
                    transactional_id=body.transactional_id,
                    producer_id=body.producer_id,
                    producer_epoch=body.producer_epoch,
                    group=body.group_id,
                    offsets=[_offset_entry(t, p, o, details) for t, p, o in allowed],
                    # KIP-447 (v3+): the consumer's member id, generation and instance, checked in apply.
                    member_id=getattr(body, "member_id", "") or "",
                    generation=int(getattr(body, "generation_id", -1)),
                    group_instance_id=getattr(body, "group_instance_id", None) or "",
                )
                if any(offset_metadata_problem(entry) for entry in call.offsets):
                    code = OFFSET_METADATA_TOO_LARGE
                else:
                    code, _ = await self._coordinator_call("TxnCommitOffsets", call)
            codes = {(t, p): TOPIC_AUTHORIZATION_FAILED if t in refused else code for t, p, _ in wanted}
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition), code in codes.items():
            by_topic.setdefault(topic, []).append(
                build(module.TxnOffsetCommitResponsePartition, partition_index=partition, error_code=code)
            )
        topics = tuple(
            build(module.TxnOffsetCommitResponseTopic, name=name, partitions=tuple(partitions))
            for name, partitions in by_topic.items()
        )
        return build(module.TxnOffsetCommitResponse, throttle_time=0, topics=topics)


TRANSACTIONAL_ID_NOT_FOUND = 105


class TransactionAdminApis(KafkaBase):
    """DescribeTransactions, ListTransactions (the coordinator's: group 0's leader) and
    DescribeProducers (each partition's leader), as kafka-transactions.sh and AdminClient use them."""

    def _coordinates(self) -> bool:
        """Whether this process is the transaction coordinator (group 0's leader)."""
        return self._groups.group == METADATA_GROUP and self._consensus.is_leader()

    def _states(
        self, transactional_ids: list[str] | None
    ) -> list[tuple[str, kq_pb2.TransactionState | None]]:
        with self._store.read() as reader:
            if transactional_ids is None:
                rows = reader.transaction_states(TXN_LIST_MAX)
                return [(name, kq_pb2.TransactionState.FromString(raw)) for name, raw in rows]
            found = [  # A name kq cannot hold (empty, too long) is no id's: unknown, not read.
                (name, None if transactional_id_problem(name) else reader.transaction_state(name))
                for name in transactional_ids
            ]
        return [
            (name, None if raw is None else kq_pb2.TransactionState.FromString(raw)) for name, raw in found
        ]

    async def describe_transactions(self, request: Request, connection: Connection) -> Any:
        """Each named transactional id's state, partitions, producer and timeout."""
        module = response_module(ApiKey.DESCRIBE_TRANSACTIONS, request.api_version)
        names = list(request.body.transactional_ids)[:TXN_LIST_MAX]
        states = await self._in_reads(self._states, names) if self._coordinates() else []
        found = dict(states)
        answers = []
        for name in names:
            state = found.get(name)
            code = NONE
            if not self._permitted(connection, ApiKey.DESCRIBE_TRANSACTIONS, TRANSACTIONAL_ID, name):
                code = TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            elif not self._coordinates():
                code = NOT_COORDINATOR
            elif state is None:
                code = TRANSACTIONAL_ID_NOT_FOUND
            answers.append(_described(module, name, state if code == NONE else None, code))
        return build(module.DescribeTransactionsResponse, throttle_time=0, transaction_states=tuple(answers))

    async def list_transactions(self, request: Request, connection: Connection) -> Any:
        """The transactions this broker coordinates (none unless it is group 0's leader), filtered by
        state, producer id and (v1) how long they have run; ids the principal may not DESCRIBE are left
        out, as Kafka does."""
        module = response_module(ApiKey.LIST_TRANSACTIONS, request.api_version)
        body = request.body
        wanted_states = set(body.state_filters)
        unknown = tuple(name for name in body.state_filters if name not in STATE_NAMES.values())
        producers = set(body.producer_id_filters)
        older_than_ms = int(getattr(body, "duration_filter", -1))
        now_ms = wall_clock_ms()
        listed = []
        for name, state in await self._in_reads(self._states, None) if self._coordinates() else []:
            assert state is not None
            state_name = STATE_NAMES.get(state.phase, "Unknown")
            if (wanted_states and state_name not in wanted_states) or (
                producers and state.producer_id not in producers
            ):
                continue
            if older_than_ms >= 0 and (
                state.phase != kq_pb2.TXN_ONGOING or now_ms - state.started_ms < older_than_ms
            ):
                continue
            if not self._visible(connection, ApiKey.LIST_TRANSACTIONS, TRANSACTIONAL_ID, name):
                continue
            listed.append(
                build(
                    module.TransactionState,
                    transactional_id=name,
                    producer_id=state.producer_id,
                    transaction_state=state_name,
                )
            )
        return build(
            module.ListTransactionsResponse,
            throttle_time=0,
            error_code=NONE,
            unknown_state_filters=unknown,
            transaction_states=tuple(listed),
        )

    async def describe_producers(self, request: Request, connection: Connection) -> Any:
        """Each partition's active producers: epoch, last sequence and timestamp, and the first offset
        of an open transaction; asked of the partition's leader."""
        module = response_module(ApiKey.DESCRIBE_PRODUCERS, request.api_version)
        wanted = [(topic.name, int(p)) for topic in request.body.topics for p in topic.partition_indexes]
        refused = self._refused(connection, ApiKey.DESCRIBE_PRODUCERS, TOPIC, [t for t, _ in wanted])
        allowed = [(t, p) for t, p in wanted if t not in refused][:TXN_PARTITIONS_MAX]
        found = dict(zip(allowed, await self._in_reads(self._producers_of, allowed), strict=True))
        by_topic: dict[str, list[Any]] = {}
        for topic, partition in wanted:
            code, producers = (
                (TOPIC_AUTHORIZATION_FAILED, [])
                if topic in refused
                else found.get((topic, partition), (INVALID_REQUEST, []))
            )
            states = tuple(
                build(
                    module.ProducerState,
                    producer_id=producer_id,
                    producer_epoch=epoch,
                    last_sequence=last_sequence,
                    last_timestamp=last_ms,
                    coordinator_epoch=0,
                    current_txn_start_offset=start,
                )
                for producer_id, epoch, last_sequence, last_ms, start in producers
            )
            by_topic.setdefault(topic, []).append(
                build(
                    module.PartitionResponse,
                    partition_index=partition,
                    error_code=code,
                    active_producers=states,
                )
            )
        topics = tuple(
            build(module.TopicResponse, name=name, partitions=tuple(partitions))
            for name, partitions in by_topic.items()
        )
        return build(module.DescribeProducersResponse, throttle_time=0, topics=topics)

    def _producers_of(
        self, wanted: list[tuple[str, int]]
    ) -> list[tuple[int, list[tuple[int, int, int, int, int]]]]:
        """(error code, [(producer id, epoch, last sequence, last append time, open transaction's
        first offset or -1)]) per wanted partition, from this process's store (NOT_LEADER_OR_FOLLOWER
        unless it leads the partition's group). The time is the leader clock of the producer's last
        append or marker there, from which producer.id.expiration.ms counts (-1: a row from before
        rows carried it, until the next expiry sweep stamps it)."""
        answers: list[tuple[int, list[tuple[int, int, int, int, int]]]] = []
        with self._store.read() as reader:
            for name, partition in wanted:
                topic = None if topic_name_problem(name) or partition < 0 else reader.topic(name)
                if topic is None or partition >= topic.partitions:
                    answers.append((UNKNOWN_TOPIC_OR_PARTITION, []))
                    continue
                if (
                    self._groups.group_of(topic, partition) != self._groups.group
                    or not self._consensus.is_leader()
                ):
                    answers.append((NOT_LEADER_OR_FOLLOWER, []))
                    continue
                opened = {
                    t.producer_id: t.first_offset
                    for t in reader.open_transactions(topic.topic_id, partition, TXN_OPEN_PER_PARTITION_MAX)
                }
                producers = [
                    (
                        producer_id,
                        window.epoch,
                        _last_sequence(window),
                        -1 if window.last_append_ms is None else window.last_append_ms,
                        opened.get(producer_id, -1),
                    )
                    for producer_id, window in reader.producer_windows(
                        topic.topic_id, partition, DESCRIBED_PRODUCERS_MAX
                    )
                ]
                answers.append((NONE, producers))
        return answers


def _last_sequence(window: ProducerWindow) -> int:
    if not window.appends:
        return -1
    last = window.appends[-1]
    return (last.first_sequence + last.record_count - 1) % SEQUENCE_MODULUS


def _described(module: Any, name: str, state: kq_pb2.TransactionState | None, code: int) -> Any:
    """One DescribeTransactions answer: the state, or the error alone."""
    partitions: dict[str, list[int]] = {}
    for named in state.partitions if state is not None else ():
        partitions.setdefault(named.topic, []).append(named.partition)
    return build(
        module.TransactionState,
        error_code=code,
        transactional_id=name,
        transaction_state=STATE_NAMES.get(state.phase, "Unknown") if state is not None else "",
        transaction_timeout=state.timeout_ms if state is not None else 0,
        transaction_start_time=datetime.datetime.fromtimestamp(
            (state.started_ms if state is not None and state.phase == kq_pb2.TXN_ONGOING else 0) / 1000,
            datetime.UTC,
        ),
        producer_id=state.producer_id if state is not None else -1,
        producer_epoch=state.producer_epoch if state is not None else -1,
        topics=tuple(build(module.TopicData, topic=t, partitions=tuple(p)) for t, p in partitions.items()),
    )


def _offset_entry(
    topic: str, partition: int, offset: int, details: dict[tuple[str, int], tuple[str, int]]
) -> kq_pb2.OffsetEntry:
    """A TxnOffsetCommit offset with its metadata and leader epoch (when it has one)."""
    metadata, epoch = details.get((topic, partition), ("", -1))
    entry = kq_pb2.OffsetEntry(topic=topic, partition=partition, offset=max(offset, 0), metadata=metadata)
    if epoch >= 0:
        entry.leader_epoch = epoch
    return entry
