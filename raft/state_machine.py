"""The pure, deterministic `apply`: replayed on every node, so no clock, randomness, network or leadership.

Everything chosen once (timestamps, producer ids) was chosen by the proposer and is in the command.
Each command first passes the validation the edge ran (raft/validation.py); user-level rejections
are result codes, identical everywhere. If applying still raises because of an entry's content (a
bug), the write transaction is aborted and every replica records the same rejection
(`RejectedResult`): the entry's index is applied with no other effect, so the log moves on and a
replay does the same. Only an environment fault (disk full, I/O error, out of memory) propagates:
the adapter stops the node (fail-stop) instead of letting replicas diverge.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lmdb

from kq.proto import kq_pb2
from kq.proto.limits import (
    APPEND_DECODE_BATCH_BYTES_MIN,
    ENTRY_BYTES_MAX,
    ENTRY_WORK_MAX,
    MEMBERS_MAX,
    PRODUCER_EXPIRY_ROWS_PER_ENTRY_MAX,
    TOPICS_MAX,
    TRIM_BATCHES_PER_ENTRY_MAX,
)
from kq.proto.records import (
    NO_PRODUCER_ID,
    SEQUENCE_MODULUS,
    BatchHeader,
    WorkBudgetError,
    WorkMeter,
    compacted_batch,
    next_sequence,
    read_header,
    with_log_append_time,
)
from kq.raft import auth, commands, groups, transactions
from kq.raft.results import (
    AppendResult,
    ApplyResult,
    BarrierResult,
    CompactResult,
    ErrorCode,
    ExpiryResult,
    GroupResult,
    KafkaGroupResult,
    MemberResult,
    PartitionAppendResult,
    ProducerResult,
    PurgeResult,
    RejectedResult,
    SkippedResult,
    TopicResult,
    TrimResult,
)
from kq.raft.topic_config import TopicConfig, altered, applied_config_of, decode_overrides, encode_overrides
from kq.raft.validation import append_envelope_problem, append_problem, command_problem
from kq.storage import ProducerAppend, ProducerWindow, Store, StoreWriter
from kq.storage.transactions import OpenTransaction

logger = logging.getLogger(__name__)

# Faults of the machine, not of the entry: the node must stop rather than record a rejection its
# healthy peers would not. lmdb.BadValsizeError (a key too long) is the entry's own fault.
ENVIRONMENT_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    MemoryError,
    lmdb.MapFullError,
    lmdb.DiskError,
    lmdb.PanicError,
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.ReadersFullError,
    lmdb.TlsFullError,
    lmdb.TxnFullError,
    lmdb.MemoryError,
    lmdb.MapResizedError,
    lmdb.ReadonlyError,
    lmdb.InvalidError,
    lmdb.VersionMismatchError,
    lmdb.IncompatibleError,
    lmdb.LockError,
)


class EnvironmentFaultError(Exception):
    """Applying an entry failed because of the machine (disk, memory), not the entry: stop the node."""


@dataclass(frozen=True, slots=True)
class GroupScope:
    """What a Raft group's apply takes for granted about its group: constants of the group, the same
    on all its replicas, so apply stays deterministic (DESIGN.md, "Scale-out").

    `allocates_producer_ids`: the group hands out the idempotent producer ids its appends carry, so an
    append of an id it never allocated is refused (UNKNOWN_PRODUCER). False in every group of a
    cluster of several but group 0: their producers' ids come from group 0, and such a group takes a
    new id at its sequence 0, as a Kafka partition leader does.
    `holds_every_partition`: every partition's log is in this group, so a committed offset past a
    partition's log end is refused here (OFFSET_OUT_OF_RANGE). False in a cluster of several groups:
    a consumer group's coordinator group holds only copies of the other groups' partitions, and the
    edge checks the offset against the node's replica of the partition's group (Kafka's log itself
    never checks it).
    """

    allocates_producer_ids: bool = True
    holds_every_partition: bool = True


SOLE_GROUP = GroupScope()  # A cluster of one Raft group.


def apply(store: Store, index: int, data: bytes | memoryview, scope: GroupScope = SOLE_GROUP) -> ApplyResult:
    """Applies the log entry at Raft `index` in one write transaction that also records `index`.

    An entry at or below the stored applied index was applied before a restart and is skipped. An
    entry that cannot be decoded, fails validation, or raises while applied is rejected alike on
    every replica; an environment fault raises EnvironmentFaultError.
    `scope`: what the group takes for granted (GroupScope).
    """
    try:
        return _apply_checked(store, index, data, scope)
    except ENVIRONMENT_ERRORS as error:
        raise EnvironmentFaultError(f"{type(error).__name__}: {error}") from error
    except commands.NewerCommandError:
        raise
    except Exception as error:  # The entry's content made apply raise: a bug, rejected alike everywhere.
        if type(error) is lmdb.Error:  # An errno LMDB has no class for: EIO when a full disk fails a commit.
            raise EnvironmentFaultError(f"{type(error).__name__}: {error}") from error
        reason = f"{type(error).__name__}: {_first_line(error)}"
        debug = logger.isEnabledFor(logging.DEBUG)
        logger.error("entry %d rejected on this replica as on every other: %s", index, reason, exc_info=debug)
        return _reject(store, index, reason)


def _apply_checked(store: Store, index: int, data: bytes | memoryview, scope: GroupScope) -> ApplyResult:
    problem, command = _decode_and_check(data)
    if problem is not None or command is None:
        return _reject(store, index, problem or "undecodable entry")
    with store.write() as writer:
        if index <= writer.applied_index():
            return SkippedResult(index)
        result = _dispatch(writer, command, index, scope)
        writer.set_applied_index(index)
    return result


def _decode_and_check(
    data: bytes | memoryview,
) -> tuple[str | None, kq_pb2.Command | commands.AppendEntry | None]:
    """The decoded command and why it must be refused (None when it may be applied).

    An append entry in its canonical form is not decoded by protobuf (the hot path): the leader takes
    back the values it encoded the very bytes from (commands.APPEND_ENTRIES), a follower decodes one
    whose batches are all of APPEND_DECODE_BATCH_BYTES_MIN or more with `decode_append` (one copy of
    each, where protobuf's parse makes two; smaller ones parse faster in protobuf's C); both are what
    protobuf would read (the codec's tests), so every replica applies the same appends."""
    if len(data) > ENTRY_BYTES_MAX:
        return f"entry of {len(data)} bytes exceeds {ENTRY_BYTES_MAX}", None
    entry = commands.APPEND_ENTRIES.recall(data)
    if entry is None and len(data) >= APPEND_DECODE_BATCH_BYTES_MIN:
        entry = commands.decode_append(data, APPEND_DECODE_BATCH_BYTES_MIN)
    if entry is not None:
        return append_envelope_problem(len(entry.appends), entry.leader_epoch), entry
    try:
        command = commands.decode(data)
    except commands.UnknownCommandError as error:
        return str(error), None
    if command.WhichOneof("kind") in transactions.TRANSACTION_COMMAND_KINDS:
        return transactions.transaction_problem(command), command
    return command_problem(command), command


def _reject(store: Store, index: int, reason: str) -> ApplyResult:
    """Records `index` as applied with no other effect than counting the rejection."""
    with store.write() as writer:
        if index <= writer.applied_index():
            return SkippedResult(index)
        writer.count_rejected_entry()
        writer.set_applied_index(index)
    return RejectedResult(index, reason)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else "(no message)"


def _dispatch(
    writer: StoreWriter, command: kq_pb2.Command | commands.AppendEntry, index: int, scope: GroupScope
) -> ApplyResult:
    if isinstance(command, commands.AppendEntry):
        return _apply_append(writer, command, index, scope.allocates_producer_ids)
    kind = command.WhichOneof("kind")
    if kind == "append":
        return _apply_append(writer, command.append, index, scope.allocates_producer_ids)
    if kind == "commit_offsets":
        return groups.apply_commit(writer, command.commit_offsets, scope.holds_every_partition)
    if kind == "reset_offsets":
        return groups.apply_reset(writer, command.reset_offsets, scope.holds_every_partition)
    if kind == "create_topic":
        return _apply_create_topic(writer, command.create_topic)
    if kind == "delete_topic":
        return _apply_delete_topic(writer, command.delete_topic)
    if kind == "grow_partitions":
        return _apply_grow_partitions(writer, command.grow_partitions)
    if kind == "trim":
        return _apply_trim(writer, command.trim)
    if kind == "compact":
        return _apply_compact(writer, command.compact)
    if kind == "purge_topic":  # Only a deleted topic's batches (its `purges` row says so).
        return PurgeResult(writer.purge(command.purge_topic.topic_id, TRIM_BATCHES_PER_ENTRY_MAX))
    if kind == "alter_topic_config":
        return _apply_alter_topic_config(writer, command.alter_topic_config)
    if kind == "expire_producers":
        return _apply_expire_producers(writer, command.expire_producers)
    if kind == "expire_transactional_ids":
        return transactions.apply_expire_ids(writer, command.expire_transactional_ids)
    if kind in _GROUP_HANDLERS:
        return _GROUP_HANDLERS[kind](writer, getattr(command, kind))
    if kind == "register_producer":
        return ProducerResult(writer.allocate_producer_id())
    if kind == "barrier":  # A read barrier: committing it is the whole point (broker/kafka/groups.py).
        return BarrierResult(index)
    if kind == "register_member":
        return _apply_register_member(writer, command.register_member)
    if kind == "unregister_member":  # Forgetting an unknown member is no error: a retry after a cut-off.
        writer.delete_member(command.unregister_member.node_id)
        return MemberResult(ErrorCode.OK)
    if kind in auth.AUTH_COMMAND_KINDS:
        return auth.apply_auth(writer, command)
    if kind in transactions.TRANSACTION_COMMAND_KINDS:
        return transactions.apply_transaction(writer, command)
    raise commands.UnknownCommandError(f"no handler for command kind {kind}")


_GROUP_HANDLERS: dict[str, Callable[[StoreWriter, Any], GroupResult | KafkaGroupResult]] = {
    "join_group": groups.apply_join,
    "leave_group": groups.apply_leave,
    "delete_group": groups.apply_delete_group,
    "offset_delete": groups.apply_offset_delete,
    "kafka_join_group": groups.apply_kafka_join,
    "kafka_sync_group": groups.apply_kafka_sync,
    "consumer_heartbeat": groups.apply_consumer_heartbeat,
}


def _apply_register_member(writer: StoreWriter, command: kq_pb2.RegisterMemberCommand) -> MemberResult:
    """Stores a member's addresses (checked by command_problem) unless another member has one of them
    or the table is full; the first registration also records the cluster id."""
    member = command.member
    registered = writer.members()
    addresses = {member.raft_address, member.grpc_address, member.kafka_address} - {""}
    for node_id, raw in registered:
        other = kq_pb2.Member.FromString(raw)
        taken = {other.raft_address, other.grpc_address, other.kafka_address}
        if node_id != member.node_id and addresses & taken:
            return MemberResult(ErrorCode.MEMBERSHIP_REFUSED)
    if len(registered) >= MEMBERS_MAX and member.node_id not in {node_id for node_id, _ in registered}:
        return MemberResult(ErrorCode.MEMBERSHIP_REFUSED)
    writer.put_member(member.node_id, member.SerializeToString(deterministic=True))
    if command.cluster_id and not writer.cluster_id():
        writer.set_cluster_id(command.cluster_id)
    return MemberResult(ErrorCode.OK)


def _apply_create_topic(writer: StoreWriter, command: kq_pb2.CreateTopicCommand) -> TopicResult:
    existing = writer.topic(command.name)
    if existing is not None:
        return TopicResult(ErrorCode.TOPIC_EXISTS, existing)
    if len(writer.topics()) >= TOPICS_MAX:
        return TopicResult(ErrorCode.TOO_MANY_TOPICS)
    if command.topic_id and writer.topic_id_used(command.topic_id):
        return TopicResult(ErrorCode.TOPIC_EXISTS)  # A copy's id is never reused for another topic.
    topic = writer.create_topic(
        command.name, command.partitions, command.created_ms, command.topic_id, command.groups
    )
    if command.configs:  # Checked by command_problem: known names, legal values, each once.
        writer.set_topic_configs(
            topic.topic_id, encode_overrides({entry.name: entry.value for entry in command.configs})
        )
    return TopicResult(ErrorCode.OK, topic)


def _apply_alter_topic_config(writer: StoreWriter, command: kq_pb2.AlterTopicConfigCommand) -> TopicResult:
    """Sets and removes overrides (checked by command_problem); the topic's stored row is replaced."""
    topic = writer.topic(command.topic)
    if topic is None:
        return TopicResult(ErrorCode.UNKNOWN_TOPIC)
    current = decode_overrides(writer.topic_configs(topic.topic_id))
    writer.set_topic_configs(topic.topic_id, encode_overrides(altered(current, command.set, command.remove)))
    return TopicResult(ErrorCode.OK, topic)


def _apply_grow_partitions(writer: StoreWriter, command: kq_pb2.GrowPartitionsCommand) -> TopicResult:
    """Adds empty partitions up to the new count (within PARTITIONS_MAX: command_problem); a count
    that does not grow is INVALID_COMMAND (the edge refuses it first), a copy of another id none."""
    topic = writer.topic(command.topic)
    if topic is None or (command.topic_id and command.topic_id != topic.topic_id):
        return TopicResult(ErrorCode.UNKNOWN_TOPIC)
    if command.partitions <= topic.partitions:
        return TopicResult(ErrorCode.INVALID_COMMAND, topic)
    return TopicResult(ErrorCode.OK, writer.grow_partitions(topic, command.partitions))


def _apply_delete_topic(writer: StoreWriter, command: kq_pb2.DeleteTopicCommand) -> TopicResult:
    topic = writer.topic(command.name)
    if topic is None or (command.topic_id and command.topic_id != topic.topic_id):
        return TopicResult(ErrorCode.UNKNOWN_TOPIC)
    writer.delete_topic(topic, TRIM_BATCHES_PER_ENTRY_MAX)  # The rest: PurgeTopicCommands (retention).
    return TopicResult(ErrorCode.OK, topic)


def _apply_trim(writer: StoreWriter, command: kq_pb2.TrimCommand) -> TrimResult:
    topic = writer.topic(command.topic)
    if topic is None or (command.topic_id and command.topic_id != topic.topic_id):
        return TrimResult(ErrorCode.UNKNOWN_TOPIC)  # Or recreated since retention measured it.
    if command.partition >= topic.partitions:
        return TrimResult(ErrorCode.UNKNOWN_PARTITION)
    state = writer.partition(topic.topic_id, command.partition)
    if state is None:
        return TrimResult(ErrorCode.UNKNOWN_PARTITION)
    if command.before_offset > state.log_end_offset:
        return TrimResult(ErrorCode.OFFSET_OUT_OF_RANGE, state.log_start_offset)
    start = writer.trim(topic.topic_id, command.partition, command.before_offset, TRIM_BATCHES_PER_ENTRY_MAX)
    return TrimResult(ErrorCode.OK, start)


def _apply_expire_producers(writer: StoreWriter, command: kq_pb2.ExpireProducersCommand) -> ExpiryResult:
    """Kafka's producer id expiry (producer.id.expiration.ms, KIP-360) over this group's partitions:
    at most PRODUCER_EXPIRY_ROWS_PER_ENTRY_MAX `producers` rows, from where the last entry stopped,
    judged at the entry's clock and expiration (checked by command_problem) alone, so every replica
    deletes the same windows. An expired producer's next batch there starts afresh: it is accepted
    at any sequence, as by a Kafka leader without state of it (`_check_sequence`)."""
    sweep = writer.expire_producers(command.now_ms, command.expiration_ms, PRODUCER_EXPIRY_ROWS_PER_ENTRY_MAX)
    return ExpiryResult(sweep.looked, sweep.expired, sweep.stamped, sweep.wrapped)


def _apply_compact(writer: StoreWriter, command: kq_pb2.CompactCommand) -> CompactResult:
    """Drops the named records from the named batches (checked by command_problem), oldest batch first.

    Each rewrite is `compacted_batch`, a pure function of the stored batch, so every replica stores the
    same bytes. A batch no longer stored (trimmed) is skipped; so are those past the entry's work
    budget (ENTRY_WORK_MAX, charged as an append entry's: the compactor packs entries within it, so
    only a crafted entry gets there).
    """
    topic = writer.topic(command.topic)
    if topic is None or command.topic_id != topic.topic_id:
        return CompactResult(ErrorCode.UNKNOWN_TOPIC)  # Or created again since the compactor read it.
    if command.partition >= topic.partitions:
        return CompactResult(ErrorCode.UNKNOWN_PARTITION)
    meter = WorkMeter(ENTRY_WORK_MAX)
    rewritten = removed = dropped = freed = skipped = 0
    for done, edit in enumerate(command.batches):
        stored = writer.stored_batch(topic.topic_id, command.partition, edit.base_offset)
        if stored is None:
            skipped += 1
            continue
        try:
            compaction = compacted_batch(stored, frozenset(edit.dropped), meter)
        except WorkBudgetError:
            skipped += len(command.batches) - done
            break
        if not compaction.records_dropped:
            continue  # None of the records named is still there (compacted before).
        freed += writer.rewrite_batch(topic.topic_id, command.partition, edit.base_offset, compaction.data)
        dropped += compaction.records_dropped
        removed += compaction.data is None
        rewritten += compaction.data is not None
    return CompactResult(ErrorCode.OK, rewritten, removed, dropped, freed, skipped)


def _apply_append(
    writer: StoreWriter,
    command: kq_pb2.AppendCommand | commands.AppendEntry,
    index: int,
    allocates_producer_ids: bool,
) -> AppendResult:
    """Applies each produce request of the entry in order, all checked against one work budget.

    The meter (proto/records.py WorkMeter, ENTRY_WORK_MAX) bounds the whole entry's checking: the
    batcher packed the entry within it by the very count, so only a crafted or foreign entry runs out,
    and its appends past the budget are refused (INVALID_COMMAND) at the cost of reading a header.
    """
    meter = WorkMeter(ENTRY_WORK_MAX)
    configs: dict[int, TopicConfig] = {}  # By topic id: an append entry changes no config.
    appends = tuple(
        _apply_partition_append(
            writer, a, meter, (command.timestamp_ms, command.leader_epoch), configs, allocates_producer_ids
        )
        for a in command.appends
    )
    return AppendResult(appends, index, tuple((a.topic, a.partition) for a in command.appends))


def _apply_partition_append(
    writer: StoreWriter,
    append: kq_pb2.PartitionAppend | commands.RecordsAppend,
    meter: WorkMeter,
    stamps: tuple[int, int],
    configs: dict[int, TopicConfig],
    allocates_producer_ids: bool,
) -> PartitionAppendResult:
    """One produce request: checked, its topic's applied configs kept (max.message.bytes, and
    LogAppendTime stamping the entry's leader clock), deduplicated, stored with the entry's leader
    epoch (`stamps`: the entry's leader clock and epoch, both chosen by the proposer)."""
    timestamp_ms, leader_epoch = stamps
    records = append.records  # Read once: each read of the field copies the batch.
    problem = append_problem(append, meter, records=records)  # The very check the edge ran: never an assert.
    if problem is not None:
        return PartitionAppendResult(ErrorCode.INVALID_COMMAND, reason=problem)
    header = read_header(records)  # Checked whole above: the header is sound.
    topic = writer.topic(append.topic)
    if topic is None:
        return PartitionAppendResult(ErrorCode.UNKNOWN_TOPIC)
    if append.partition >= topic.partitions:
        return PartitionAppendResult(ErrorCode.UNKNOWN_PARTITION)
    config = configs.get(topic.topic_id)
    if config is None:  # Read once per topic and entry: most appends of an entry share a few topics.
        config = configs[topic.topic_id] = applied_config_of(writer.topic_configs(topic.topic_id))
    if len(records) > config.max_message_bytes:
        reason = f"a batch of {len(records)} bytes; max.message.bytes is {config.max_message_bytes}"
        return PartitionAppendResult(ErrorCode.MESSAGE_TOO_LARGE, reason=reason)
    idempotent = header.producer_id != NO_PRODUCER_ID
    window: ProducerWindow | None = None
    if idempotent:
        window = writer.producer_window(header.producer_id, topic.topic_id, append.partition)
        verdict = _check_sequence(writer, window, header, allocates_producer_ids)
        if verdict is not None:
            return verdict
    if config.log_append_time:
        records = with_log_append_time(records, timestamp_ms)
    base_offset = writer.append(topic.topic_id, append.partition, records, leader_epoch)
    if idempotent:
        remembered = ProducerAppend(header.base_sequence, header.record_count, base_offset)
        writer.remember_producer_append(
            header.producer_id,
            topic.topic_id,
            append.partition,
            header.producer_epoch,
            remembered,
            window,
            appended_ms=timestamp_ms,
        )
    opened_before = header.is_transactional and writer.open_transaction(
        topic.topic_id, append.partition, header.producer_id
    )
    if header.is_transactional and opened_before is None:
        # The transaction's first records here: the partition's last stable offset stops at them until
        # the transaction's marker (raft/transactions.py).
        opened = OpenTransaction(header.producer_id, base_offset, timestamp_ms, header.producer_epoch)
        writer.open_transaction_at(topic.topic_id, append.partition, opened)
    return PartitionAppendResult(ErrorCode.OK, base_offset)


def _check_sequence(
    writer: StoreWriter, window: ProducerWindow | None, header: BatchHeader, allocates_producer_ids: bool
) -> PartitionAppendResult | None:
    """None when the batch is the producer's next one on the partition; else the duplicate or error result.

    `window` is the producer's window on the partition (None: it never appended there, or its window
    expired). Kafka's rules, with its int32 sequences that wrap from 2**31 - 1 to 0: a producer the
    partition has no state of is accepted at any sequence (KIP-360: Kafka's ProducerAppendInfo
    accepts "any sequence number" when there is no current producer epoch, as after
    producer.id.expiration.ms or a retention that deleted its records; since 2.5 it no longer
    answers UNKNOWN_PRODUCER_ID there); its first batch in a new (higher) epoch starts at sequence
    0; an older epoch is fenced; a retry of one of the last PRODUCER_APPENDS_KEPT appends answers its
    original base offset; a gap is out of order, and a sequence behind those remembered is too old
    to deduplicate.
    """
    if allocates_producer_ids and not writer.producer_id_allocated(header.producer_id):
        return PartitionAppendResult(ErrorCode.UNKNOWN_PRODUCER)
    sequence = header.base_sequence
    if window is None:
        return None
    if header.producer_epoch > window.epoch:
        return None if sequence == 0 else PartitionAppendResult(ErrorCode.OUT_OF_ORDER_SEQUENCE)
    if header.producer_epoch < window.epoch:
        return PartitionAppendResult(ErrorCode.INVALID_PRODUCER_EPOCH)
    if not window.appends:  # Fenced by a transaction marker at this epoch: a new window starts at 0.
        return None if sequence == 0 else PartitionAppendResult(ErrorCode.OUT_OF_ORDER_SEQUENCE)
    last = window.appends[-1]
    expected = next_sequence(last.first_sequence, last.record_count)
    if sequence == expected:
        return None
    for earlier in window.appends:
        if earlier.first_sequence == sequence and earlier.record_count == header.record_count:
            return PartitionAppendResult(ErrorCode.OK, earlier.base_offset, duplicate=True)
    # Ahead of the expected sequence by less than half the sequence space is a gap; the rest is behind.
    if (sequence - expected) % SEQUENCE_MODULUS < SEQUENCE_MODULUS // 2:
        return PartitionAppendResult(ErrorCode.OUT_OF_ORDER_SEQUENCE)
    return PartitionAppendResult(ErrorCode.DUPLICATE_SEQUENCE)
