"""Kafka transactions in apply (KIP-98): the coordinator's state machine and the partitions' markers.

Where the state lives (DESIGN.md, "Transactions"): each transactional id's state (producer id and
epoch, phase, partitions, consumer groups) in the coordinator's group, group 0, beside the consumer
groups and their offsets; a partition's open transactions and aborted ranges in the partition's
group. A transaction that spans groups is a sequence of replicated steps, each safe to crash after:

1. `end_transaction` makes it PREPARE_COMMIT (or PREPARE_ABORT) in group 0: the outcome is decided.
2. `transaction_marker` in each group that holds one of its partitions (group 0 too, for the offsets
   it committed): a control batch per partition, idempotent (a partition without the producer's open
   transaction writes nothing), so the coordinator's driver repeats it after any crash or failover.
3. `complete_transaction` makes it COMPLETE_COMMIT (or COMPLETE_ABORT) in group 0.

Everything here is pure and deterministic: clocks are the proposer's (`now_ms`), ids come from the
store, no network; every rejection is a result code. `transaction_problem` is the one validation of
the commands, run by the edge before proposing and by apply before applying.
"""

from __future__ import annotations

from kq.proto import kq_pb2
from kq.proto.limits import (
    OFFSETS_PER_COMMIT_MAX,
    TRANSACTIONAL_ID_BYTES_MAX,
    TRANSACTIONAL_IDS_MAX,
    TXN_GROUPS_MAX,
    TXN_ID_EXPIRY_ROWS_PER_ENTRY_MAX,
    TXN_PARTITIONS_MAX,
    TXN_PENDING_OFFSETS_MAX,
    TXN_TIMEOUT_MS_MAX,
    TXN_TIMEOUT_MS_MIN,
)
from kq.proto.records import control_batch
from kq.raft import groups
from kq.raft.results import ErrorCode, ExpiryResult, TransactionResult
from kq.raft.validation import (
    group_instance_id_problem,
    member_id_problem,
    offsets_problem,
    topic_name_problem,
)
from kq.storage import StoreWriter
from kq.storage.transactions import AbortedTransaction, PendingOffset

TRANSACTION_COMMAND_KINDS = frozenset(
    {
        "init_transaction",
        "add_to_transaction",
        "end_transaction",
        "complete_transaction",
        "transaction_marker",
        "txn_commit_offsets",
    }
)
PRODUCER_EPOCH_MAX = (
    32_767  # Kafka's epochs are int16; an id whose epoch would pass it gets a new producer id.
)
_INT64_MAX = 2**63 - 1
EMPTY, ONGOING = kq_pb2.TXN_EMPTY, kq_pb2.TXN_ONGOING
PREPARE_COMMIT, PREPARE_ABORT = kq_pb2.TXN_PREPARE_COMMIT, kq_pb2.TXN_PREPARE_ABORT
COMPLETE_COMMIT, COMPLETE_ABORT = kq_pb2.TXN_COMPLETE_COMMIT, kq_pb2.TXN_COMPLETE_ABORT
PREPARED = (PREPARE_COMMIT, PREPARE_ABORT)
IDLE = (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT)  # No transaction in progress: the id may expire.


# Validation (the edge and apply) --------------------------------------------------------------


def transactional_id_problem(transactional_id: str) -> str | None:
    """Why `transactional_id` is not one kq keeps, or None."""
    if not transactional_id:
        return "a transactional id is empty"
    if len(transactional_id.encode(errors="surrogatepass")) > TRANSACTIONAL_ID_BYTES_MAX:
        return f"a transactional id is longer than {TRANSACTIONAL_ID_BYTES_MAX} bytes"
    return None


def timeout_problem(timeout_ms: int) -> str | None:
    """Why a transaction.timeout.ms is refused (Kafka's INVALID_TRANSACTION_TIMEOUT), or None."""
    if not TXN_TIMEOUT_MS_MIN <= timeout_ms <= TXN_TIMEOUT_MS_MAX:
        return (
            f"transaction.timeout.ms must be {TXN_TIMEOUT_MS_MIN} to {TXN_TIMEOUT_MS_MAX}, not {timeout_ms}"
        )
    return None


def _producer_problem(producer_id: int, producer_epoch: int) -> str | None:
    if not 0 <= producer_id <= _INT64_MAX:
        return f"producer id {producer_id} is out of range"
    if producer_epoch > PRODUCER_EPOCH_MAX:
        return f"producer epoch {producer_epoch} is above {PRODUCER_EPOCH_MAX}"
    return None


def _members_problem(partitions: list[kq_pb2.TxnPartition], names: list[str]) -> str | None:
    if len(partitions) > TXN_PARTITIONS_MAX:
        return f"a transaction holds at most {TXN_PARTITIONS_MAX} partitions"
    if len(names) > TXN_GROUPS_MAX:
        return f"a transaction commits offsets for at most {TXN_GROUPS_MAX} groups"
    for partition in partitions:
        problem = topic_name_problem(partition.topic)
        if problem is not None:
            return problem
    for name in names:
        problem = topic_name_problem(name, "group")
        if problem is not None:
            return problem
    return None


def transaction_problem(command: kq_pb2.Command) -> str | None:
    """Why a transaction command must not be applied, or None (the edge and apply run this)."""
    kind = command.WhichOneof("kind")
    if kind == "init_transaction":
        init = command.init_transaction
        return transactional_id_problem(init.transactional_id) or timeout_problem(init.timeout_ms)
    if kind == "add_to_transaction":
        add = command.add_to_transaction
        return (
            transactional_id_problem(add.transactional_id)
            or _producer_problem(add.producer_id, add.producer_epoch)
            or _members_problem(list(add.partitions), list(add.groups))
        )
    if kind in ("end_transaction", "complete_transaction"):
        end = getattr(command, kind)
        return transactional_id_problem(end.transactional_id) or _producer_problem(
            end.producer_id, end.producer_epoch
        )
    if kind == "transaction_marker":
        marker = command.transaction_marker
        if marker.HasField("opened_at") and marker.opened_at < 0:
            return f"a marker's opened_at is an offset, not {marker.opened_at}"
        return _producer_problem(marker.producer_id, marker.producer_epoch) or _members_problem(
            list(marker.partitions), list(marker.groups)
        )
    if kind == "txn_commit_offsets":
        commit = command.txn_commit_offsets
        return (
            transactional_id_problem(commit.transactional_id)
            or _producer_problem(commit.producer_id, commit.producer_epoch)
            or topic_name_problem(commit.group, "group")
            or offsets_problem(list(commit.offsets))
            or (member_id_problem(commit.member_id) if commit.member_id else None)
            or group_instance_id_problem(commit.group_instance_id)
        )
    return f"{kind} is not a transaction command"


# Apply ------------------------------------------------------------------------------------------


def apply_transaction(writer: StoreWriter, command: kq_pb2.Command) -> TransactionResult:
    """Applies one transaction command (checked by transaction_problem)."""
    kind = command.WhichOneof("kind")
    if kind == "init_transaction":
        return _init(writer, command.init_transaction)
    if kind == "add_to_transaction":
        return _add(writer, command.add_to_transaction)
    if kind == "end_transaction":
        return _end(writer, command.end_transaction)
    if kind == "complete_transaction":
        return _complete(writer, command.complete_transaction)
    if kind == "transaction_marker":
        return _marker(writer, command.transaction_marker)
    return _commit_offsets(writer, command.txn_commit_offsets)


def load_state(writer: StoreWriter, transactional_id: str) -> kq_pb2.TransactionState | None:
    """The stored state of a transactional id, or None."""
    raw = writer.transaction_state(transactional_id)
    return None if raw is None else kq_pb2.TransactionState.FromString(raw)


def _save(writer: StoreWriter, transactional_id: str, state: kq_pb2.TransactionState) -> TransactionResult:
    writer.put_transaction_state(transactional_id, state.SerializeToString(deterministic=True))
    return TransactionResult(ErrorCode.OK, state.producer_id, state.producer_epoch)


def _refused(error: ErrorCode, state: kq_pb2.TransactionState | None) -> TransactionResult:
    if state is None:
        return TransactionResult(error)
    return TransactionResult(error, state.producer_id, state.producer_epoch)


def _init(writer: StoreWriter, command: kq_pb2.InitTransactionCommand) -> TransactionResult:
    """InitProducerId: a new id's producer id at epoch 0; a known one's epoch bumped (fencing older
    instances), once any transaction of it is complete: an open one is aborted first (its epoch bumped
    now, so the old instance is fenced at once) and the caller retries (CONCURRENT_TRANSACTIONS)."""
    state = load_state(writer, command.transactional_id)
    if state is None:
        if writer.transaction_count() >= TRANSACTIONAL_IDS_MAX:
            return TransactionResult(ErrorCode.TRANSACTION_LIMIT_REACHED)
        state = kq_pb2.TransactionState(
            producer_id=writer.allocate_producer_id(), producer_epoch=0, phase=EMPTY
        )
    elif state.phase == ONGOING:
        _bump_epoch(writer, state)
        state.phase = PREPARE_ABORT
        state.updated_ms = command.now_ms
        _save(writer, command.transactional_id, state)
        return _refused(ErrorCode.CONCURRENT_TRANSACTIONS, state)
    elif state.phase in PREPARED:
        return _refused(ErrorCode.CONCURRENT_TRANSACTIONS, state)
    else:
        _bump_epoch(writer, state)
        state.phase = EMPTY
    state.timeout_ms = command.timeout_ms
    state.updated_ms = command.now_ms
    del state.partitions[:]
    del state.groups[:]
    return _save(writer, command.transactional_id, state)


def _bump_epoch(writer: StoreWriter, state: kq_pb2.TransactionState) -> None:
    """The next epoch of the id; past int16's range, a new producer id at epoch 0 (as Kafka does)."""
    if state.producer_epoch >= PRODUCER_EPOCH_MAX:
        state.producer_id = writer.allocate_producer_id()
        state.producer_epoch = 0
    else:
        state.producer_epoch += 1


def _owner_problem(
    state: kq_pb2.TransactionState | None, producer_id: int, producer_epoch: int
) -> ErrorCode | None:
    """Whether the request comes from the id's current producer: Kafka's mapping and fencing codes."""
    if state is None or state.producer_id != producer_id:
        return ErrorCode.INVALID_PRODUCER_ID_MAPPING
    if state.producer_epoch != producer_epoch:
        return ErrorCode.PRODUCER_FENCED
    return None


def _add(writer: StoreWriter, command: kq_pb2.AddToTransactionCommand) -> TransactionResult:
    """AddPartitionsToTxn / AddOffsetsToTxn: the transaction is ONGOING and holds these too."""
    state = load_state(writer, command.transactional_id)
    problem = _owner_problem(state, command.producer_id, command.producer_epoch)
    if problem is not None or state is None:
        return _refused(problem or ErrorCode.INVALID_PRODUCER_ID_MAPPING, state)
    if state.phase in PREPARED:
        return _refused(ErrorCode.CONCURRENT_TRANSACTIONS, state)
    if state.phase != ONGOING:
        state.phase = ONGOING
        state.started_ms = command.now_ms
        del state.partitions[:]
        del state.groups[:]
    partitions = {(p.topic, p.partition) for p in state.partitions} | {
        (p.topic, p.partition) for p in command.partitions
    }
    names = set(state.groups) | set(command.groups)
    if len(partitions) > TXN_PARTITIONS_MAX or len(names) > TXN_GROUPS_MAX:
        return _refused(ErrorCode.TRANSACTION_LIMIT_REACHED, state)
    del state.partitions[:]
    state.partitions.extend(kq_pb2.TxnPartition(topic=t, partition=p) for t, p in sorted(partitions))
    del state.groups[:]
    state.groups.extend(sorted(names))
    state.updated_ms = command.now_ms
    return _save(writer, command.transactional_id, state)


def _end(writer: StoreWriter, command: kq_pb2.EndTransactionCommand) -> TransactionResult:
    """EndTxn: ONGOING becomes PREPARE_COMMIT or PREPARE_ABORT; a retry of a decided end answers as the
    first did (CONCURRENT_TRANSACTIONS while its markers are written, then OK); the other outcome is
    INVALID_TXN_STATE. `timed_out`: the coordinator's abort of an expired transaction, with the epoch
    bumped so its producer is fenced; a no-op unless that very transaction is still ONGOING."""
    state = load_state(writer, command.transactional_id)
    problem = _owner_problem(state, command.producer_id, command.producer_epoch)
    if command.timed_out:
        if problem is not None or state is None or state.phase != ONGOING:
            return _refused(ErrorCode.OK, state)  # Ended, or fenced, since the driver looked.
        _bump_epoch(writer, state)
        state.phase = PREPARE_ABORT
        state.updated_ms = command.now_ms
        return _save(writer, command.transactional_id, state)
    if problem is not None or state is None:
        return _refused(problem or ErrorCode.INVALID_PRODUCER_ID_MAPPING, state)
    commit = command.commit
    if state.phase == ONGOING:
        state.phase = PREPARE_COMMIT if commit else PREPARE_ABORT
        state.updated_ms = command.now_ms
        return _save(writer, command.transactional_id, state)
    if state.phase == (PREPARE_COMMIT if commit else PREPARE_ABORT):
        return _refused(ErrorCode.CONCURRENT_TRANSACTIONS, state)
    if state.phase == (COMPLETE_COMMIT if commit else COMPLETE_ABORT):
        return _refused(ErrorCode.OK, state)
    return _refused(ErrorCode.INVALID_TXN_STATE, state)


def _complete(writer: StoreWriter, command: kq_pb2.CompleteTransactionCommand) -> TransactionResult:
    """The coordinator's last step once every marker is written; a no-op unless that very transaction
    is still prepared with that outcome (a repeat after a failover)."""
    state = load_state(writer, command.transactional_id)
    prepared = PREPARE_COMMIT if command.commit else PREPARE_ABORT
    if (
        state is None
        or state.producer_id != command.producer_id
        or state.producer_epoch != command.producer_epoch
        or state.phase != prepared
    ):
        return _refused(ErrorCode.OK, state)
    state.phase = COMPLETE_COMMIT if command.commit else COMPLETE_ABORT
    state.updated_ms = command.now_ms
    del state.partitions[:]
    del state.groups[:]
    return _save(writer, command.transactional_id, state)


def _marker(writer: StoreWriter, command: kq_pb2.TransactionMarkerCommand) -> TransactionResult:
    """A control batch in each named partition where the producer's transaction is open (its epoch not
    newer than the marker's), which closes it there (an ABORT also records its range); then the
    transaction's pending offsets of the named groups, committed or dropped. What this group does not
    hold (another group's partition, no pending offsets) is nothing to do: a repeat writes nothing.
    `opened_at` (a partition leader's abort of a hanging transaction) closes only the transaction open
    at that first offset, the one the leader read.

    `coordinator_epoch` (group 0's term when the coordinator read the transaction as prepared; 0: a
    marker of no coordinator, a partition leader's abort of a hanging transaction) fences deposed
    coordinators, as Kafka's does: a marker naming an older epoch than one applied here before is
    refused whole. A newer coordinator finishes every prepared transaction again (markers in each of its
    groups first), and the producer's next transaction, which keeps the same producer id and epoch,
    starts only once that one completed: so a deposed coordinator's late marker would act on that
    next transaction, and the newer coordinator's markers for its own transaction are written anyway.
    INVALID_TXN_STATE (the transaction moved on without it): the deposed coordinator stops there."""
    if command.coordinator_epoch:
        if command.coordinator_epoch < writer.coordinator_epoch():
            return TransactionResult(ErrorCode.INVALID_TXN_STATE, command.producer_id, command.producer_epoch)
        writer.raise_coordinator_epoch(command.coordinator_epoch)
    written = 0
    for named in command.partitions:
        topic = writer.topic(named.topic)
        if topic is None or named.partition >= topic.partitions:
            continue
        opened = writer.open_transaction(topic.topic_id, named.partition, command.producer_id)
        if opened is None or opened.producer_epoch > command.producer_epoch:
            continue
        if command.HasField("opened_at") and opened.first_offset != command.opened_at:
            continue  # Not the hanging transaction its leader read: that one was marked meanwhile.
        batch = control_batch(
            command.producer_id,
            command.producer_epoch,
            command.commit,
            command.coordinator_epoch,
            command.timestamp_ms,
        )
        marker_offset = writer.append(topic.topic_id, named.partition, batch, command.leader_epoch)
        writer.close_transaction(topic.topic_id, named.partition, command.producer_id)
        writer.fence_producer(
            command.producer_id, topic.topic_id, named.partition, command.producer_epoch, command.timestamp_ms
        )
        if not command.commit:
            aborted = AbortedTransaction(command.producer_id, opened.first_offset, marker_offset)
            writer.add_aborted_transaction(topic.topic_id, named.partition, aborted)
        written += 1
    if command.groups:
        named_groups = set(command.groups)
        pending = [
            row
            for row in writer.pending_offsets(command.producer_id, TXN_PENDING_OFFSETS_MAX)
            if row.group in named_groups
        ]
        if command.commit:
            for row in pending:
                writer.commit_offset(
                    row.group, row.topic_id, row.partition, row.offset, row.commit_time_ms, row.details
                )
        writer.delete_pending_offsets(command.producer_id, pending)
    return TransactionResult(ErrorCode.OK, command.producer_id, command.producer_epoch, written)


def _commit_offsets(writer: StoreWriter, command: kq_pb2.TxnCommitOffsetsCommand) -> TransactionResult:
    """TxnOffsetCommit: offsets of a group the ONGOING transaction added (AddOffsetsToTxn), pending
    until its marker, from the group's current member when one is named (KIP-447: `groups.
    transactional_commit_problem`). The group is created as an offset commit outside group management
    creates it."""
    state = load_state(writer, command.transactional_id)
    problem = _owner_problem(state, command.producer_id, command.producer_epoch)
    if problem is not None or state is None:
        return _refused(problem or ErrorCode.INVALID_PRODUCER_ID_MAPPING, state)
    if state.phase != ONGOING or command.group not in state.groups:
        return _refused(ErrorCode.INVALID_TXN_STATE, state)
    fenced = groups.transactional_commit_problem(
        writer, command.group, command.member_id, command.generation, command.group_instance_id
    )
    if fenced != ErrorCode.OK:
        return _refused(fenced, state)
    resolved: list[PendingOffset] = []
    for entry in command.offsets:
        topic = writer.topic(entry.topic)
        if topic is None or entry.partition >= topic.partitions:
            return _refused(ErrorCode.UNKNOWN_TOPIC if topic is None else ErrorCode.UNKNOWN_PARTITION, state)
        details = groups.offset_details(entry)
        resolved.append(
            PendingOffset(
                command.group, topic.topic_id, entry.partition, entry.offset, command.commit_ms, details
            )
        )
    pending = writer.pending_offsets(command.producer_id, TXN_PENDING_OFFSETS_MAX + 1)
    keys = {(row.group, row.topic_id, row.partition) for row in pending + resolved}
    if len(keys) > TXN_PENDING_OFFSETS_MAX or len(resolved) > OFFSETS_PER_COMMIT_MAX:
        return _refused(ErrorCode.TRANSACTION_LIMIT_REACHED, state)
    if not groups.ensure_group(writer, command.group):
        return _refused(ErrorCode.TOO_MANY_GROUPS, state)
    for row in resolved:
        writer.put_pending_offset(command.producer_id, row)
    return _refused(ErrorCode.OK, state)


def apply_expire_ids(writer: StoreWriter, command: kq_pb2.ExpireTransactionalIdsCommand) -> ExpiryResult:
    """Kafka's transactional.id.expiration.ms: forgets each id with no transaction in progress whose
    state last changed (`updated_ms`) `expiration_ms` or more before the entry's `now_ms` (checked by
    command_problem), looking at TXN_ID_EXPIRY_ROWS_PER_ENTRY_MAX ids from where the last entry
    stopped. An id in progress (ONGOING, PREPARE_*) stays however old: its transaction times out or
    completes first. A forgotten id's next InitProducerId gets a new producer id, as in Kafka."""
    rows, wrapped = writer.sweep_transaction_states(TXN_ID_EXPIRY_ROWS_PER_ENTRY_MAX)
    expired = 0
    for transactional_id, raw in rows:
        state = kq_pb2.TransactionState.FromString(raw)
        if state.phase in IDLE and command.now_ms - state.updated_ms >= command.expiration_ms:
            writer.delete_transaction_state(transactional_id)
            expired += 1
    return ExpiryResult(len(rows), expired, 0, wrapped)
