"""Transactions in apply: the coordinator's states, fencing, markers, the LSO, aborted ranges, pending
offsets, idempotent repeats and replay determinism (raft/transactions.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kq.proto import kq_pb2
from kq.proto.limits import TXN_ABORTED_PER_FETCH_MAX, TXN_OPEN_PER_PARTITION_MAX
from kq.proto.records import (
    CONTROL_COMMIT,
    TRANSACTIONAL_FLAG,
    MalformedBatchError,
    NewRecord,
    assemble_batch,
    check_batch,
    control_batch,
    control_type,
    encode_record,
    parse_batch,
    read_header,
)
from kq.raft import commands, transactions
from kq.raft.results import AppendResult, ErrorCode, GroupResult, KafkaGroupResult, TransactionResult
from kq.raft.state_machine import apply
from kq.storage import Store
from tests.raft.helpers import CLOCK_MS, create

TXN = "txn-1"


def txn_batch(producer_id: int, epoch: int, sequence: int, *values: bytes) -> bytes:
    """A transactional batch of the producer."""
    records = b"".join(encode_record(NewRecord(None, value), i, 0) for i, value in enumerate(values))
    return assemble_batch(
        records,
        len(values),
        CLOCK_MS,
        CLOCK_MS,
        0,
        producer_id,
        epoch,
        sequence,
        attributes=TRANSACTIONAL_FLAG,
    )


class Log:
    """Applies commands to a store with increasing indexes."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.index = 0

    def run(self, command: kq_pb2.Command | bytes) -> object:
        self.index += 1
        data = command if isinstance(command, bytes) else commands.encode(command)
        return apply(self.store, self.index, data)

    def txn(self, command: kq_pb2.Command) -> TransactionResult:
        result = self.run(command)
        assert isinstance(result, TransactionResult), result
        return result

    def produce(
        self, producer_id: int, epoch: int, sequence: int, *values: bytes, partition: int = 0
    ) -> object:
        part = commands.partition_append("t", partition, txn_batch(producer_id, epoch, sequence, *values))
        result = self.run(commands.append(CLOCK_MS, [part]))
        assert isinstance(result, AppendResult)
        return result.appends[0]

    def lso(self, partition: int = 0) -> int:
        with self.store.read() as reader:
            topic = reader.topic("t")
            assert topic is not None
            state = reader.partition(topic.topic_id, partition)
            assert state is not None
            return reader.last_stable_offset(
                topic.topic_id, partition, state.log_end_offset, TXN_OPEN_PER_PARTITION_MAX
            )

    def state(self) -> kq_pb2.TransactionState:
        with self.store.read() as reader:
            raw = reader.transaction_state(TXN)
        assert raw is not None
        return kq_pb2.TransactionState.FromString(raw)


def init(timeout_ms: int = 60_000) -> kq_pb2.Command:
    return commands.transaction(
        kq_pb2.InitTransactionCommand(transactional_id=TXN, timeout_ms=timeout_ms, now_ms=1)
    )


def add(producer_id: int, epoch: int, *partitions: int, groups: tuple[str, ...] = ()) -> kq_pb2.Command:
    named = [kq_pb2.TxnPartition(topic="t", partition=p) for p in partitions]
    return commands.transaction(
        kq_pb2.AddToTransactionCommand(
            transactional_id=TXN,
            producer_id=producer_id,
            producer_epoch=epoch,
            partitions=named,
            groups=groups,
            now_ms=2,
        )
    )


def end(producer_id: int, epoch: int, commit: bool, timed_out: bool = False) -> kq_pb2.Command:
    return commands.transaction(
        kq_pb2.EndTransactionCommand(
            transactional_id=TXN,
            producer_id=producer_id,
            producer_epoch=epoch,
            commit=commit,
            now_ms=3,
            timed_out=timed_out,
        )
    )


def marker(
    producer_id: int,
    epoch: int,
    commit: bool,
    *partitions: int,
    groups: tuple[str, ...] = (),
    coordinator_epoch: int = 0,
) -> kq_pb2.Command:
    named = [kq_pb2.TxnPartition(topic="t", partition=p) for p in partitions]
    return commands.transaction(
        kq_pb2.TransactionMarkerCommand(
            producer_id=producer_id,
            producer_epoch=epoch,
            commit=commit,
            partitions=named,
            groups=groups,
            timestamp_ms=4,
            coordinator_epoch=coordinator_epoch,
        )
    )


def complete(producer_id: int, epoch: int, commit: bool) -> kq_pb2.Command:
    return commands.transaction(
        kq_pb2.CompleteTransactionCommand(
            transactional_id=TXN, producer_id=producer_id, producer_epoch=epoch, commit=commit, now_ms=5
        )
    )


def offsets(
    producer_id: int, epoch: int, offset: int, member_id: str = "", generation: int = -1, instance: str = ""
) -> kq_pb2.Command:
    entry = kq_pb2.OffsetEntry(topic="t", partition=1, offset=offset)
    return commands.transaction(
        kq_pb2.TxnCommitOffsetsCommand(
            transactional_id=TXN,
            producer_id=producer_id,
            producer_epoch=epoch,
            group="g",
            offsets=[entry],
            commit_ms=6,
            member_id=member_id,
            generation=generation,
            group_instance_id=instance,
        )
    )


@pytest.fixture
def log(tmp_path: Path) -> Log:
    result = Log(Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2))
    result.run(create("t", 2))
    return result


def test_init_gives_a_producer_id_and_bumps_its_epoch_for_each_new_instance(log: Log) -> None:
    """The first InitProducerId of an id allocates a producer id at epoch 0; each later one bumps it."""
    first = log.txn(init())
    assert first.error == ErrorCode.OK and first.producer_epoch == 0
    second = log.txn(init())
    assert (second.producer_id, second.producer_epoch) == (first.producer_id, 1)
    assert log.state().phase == kq_pb2.TXN_EMPTY


def test_a_committed_transaction_holds_the_lso_until_its_marker_and_then_commits_its_offsets(
    log: Log,
) -> None:
    """Records of an open transaction stop the LSO at its first offset; the COMMIT marker writes a
    control batch, moves the LSO to the end and makes the pending group offsets committed."""
    pid = log.txn(init()).producer_id
    assert log.txn(add(pid, 0, 0, groups=("g",))).error == ErrorCode.OK
    assert log.produce(pid, 0, 0, b"a", b"b").error == ErrorCode.OK  # type: ignore[attr-defined]
    assert log.txn(offsets(pid, 0, 7)).error == ErrorCode.OK
    assert log.lso() == 0
    with log.store.read() as reader:
        assert reader.committed_offsets("g") == []
    assert log.txn(end(pid, 0, commit=True)).error == ErrorCode.OK
    assert log.state().phase == kq_pb2.TXN_PREPARE_COMMIT
    written = log.txn(marker(pid, 0, True, 0, 1, groups=("g",)))
    assert written.written == 1  # Partition 1 holds none of its records: no marker there.
    assert log.lso() == 3
    assert log.txn(marker(pid, 0, True, 0, 1, groups=("g",))).written == 0  # A repeat writes nothing.
    assert log.lso() == 3
    assert log.txn(complete(pid, 0, True)).error == ErrorCode.OK
    assert log.state().phase == kq_pb2.TXN_COMPLETE_COMMIT
    with log.store.read() as reader:
        topic = reader.topic("t")
        assert topic is not None
        assert [(row[1], row[2]) for row in reader.committed_offsets("g")] == [(1, 7)]
        batches = reader.batches(topic.topic_id, 0, 0, 1 << 20)
        control = batches[-1].data
        assert read_header(control).is_control and read_header(control).base_offset == 2
        assert control_type(parse_batch(control)[0].key) == CONTROL_COMMIT
        assert reader.aborted_transactions(topic.topic_id, 0, 0, 3, TXN_ABORTED_PER_FETCH_MAX) == []


def test_an_aborted_transaction_is_recorded_as_a_range_and_drops_its_offsets(log: Log) -> None:
    """The ABORT marker records [first offset, marker offset] for read_committed fetches; pending
    offsets are dropped."""
    pid = log.txn(init()).producer_id
    log.txn(add(pid, 0, 0, groups=("g",)))
    log.produce(pid, 0, 0, b"a")
    log.txn(offsets(pid, 0, 9))
    log.txn(end(pid, 0, commit=False))
    assert log.txn(end(pid, 0, commit=True)).error == ErrorCode.INVALID_TXN_STATE
    assert log.txn(end(pid, 0, commit=False)).error == ErrorCode.CONCURRENT_TRANSACTIONS
    log.txn(marker(pid, 0, False, 0, groups=("g",)))
    log.txn(complete(pid, 0, False))
    assert log.txn(end(pid, 0, commit=False)).error == ErrorCode.OK  # A retry after completion.
    with log.store.read() as reader:
        topic = reader.topic("t")
        assert topic is not None
        aborted = reader.aborted_transactions(topic.topic_id, 0, 0, 2, TXN_ABORTED_PER_FETCH_MAX)
        assert [(a.producer_id, a.first_offset, a.last_offset) for a in aborted] == [(pid, 0, 1)]
        assert reader.committed_offsets("g") == []
        assert reader.pending_offsets(pid, 10) == []


def test_a_deposed_coordinator_s_late_marker_does_nothing_to_the_next_transaction(log: Log) -> None:
    """A coordinator (group 0's term 3) read the first transaction as prepared, then lost group 0; the
    next one (term 4) wrote its markers and completed it, and the producer's second transaction (same
    producer id and epoch) wrote to the partition. The deposed coordinator's marker arriving now names
    the older epoch and writes nothing: it would have committed the second transaction's records,
    which its producer then aborts. A marker of no coordinator (0: a hanging transaction's abort by
    the partition's leader) is not fenced."""
    pid = log.txn(init()).producer_id
    log.txn(add(pid, 0, 0, groups=("g",)))
    log.produce(pid, 0, 0, b"first")
    log.txn(offsets(pid, 0, 5))
    log.txn(end(pid, 0, commit=True))
    assert log.txn(marker(pid, 0, True, 0, groups=("g",), coordinator_epoch=4)).written == 1
    log.txn(complete(pid, 0, True))
    log.txn(add(pid, 0, 0, groups=("g",)))
    log.produce(pid, 0, 1, b"second")  # Offset 2, after the first's record and marker.
    log.txn(offsets(pid, 0, 9))
    assert log.lso() == 2
    late = log.txn(marker(pid, 0, True, 0, groups=("g",), coordinator_epoch=3))
    assert (late.error, late.written) == (ErrorCode.INVALID_TXN_STATE, 0)
    assert log.lso() == 2
    with log.store.read() as reader:
        assert [row.offset for row in reader.pending_offsets(pid, 10)] == [9]  # Not committed by it.
        assert reader.coordinator_epoch() == 4
    log.txn(end(pid, 0, commit=False))
    assert log.txn(marker(pid, 0, False, 0, groups=("g",), coordinator_epoch=4)).written == 1
    log.txn(complete(pid, 0, False))
    with log.store.read() as reader:
        topic = reader.topic("t")
        assert topic is not None
        aborted = reader.aborted_transactions(topic.topic_id, 0, 0, 10, TXN_ABORTED_PER_FETCH_MAX)
        assert [(a.first_offset, a.last_offset) for a in aborted] == [(2, 3)]
        assert [row[2] for row in reader.committed_offsets("g")] == [5]
    log.txn(add(pid, 0, 0))
    log.produce(pid, 0, 2, b"hanging")
    assert log.txn(marker(pid, 0, False, 0)).written == 1  # Epoch 0: no coordinator's, never fenced.
    assert log.lso() == 6


def test_offsets_from_a_consumer_that_lost_its_generation_are_refused(log: Log) -> None:
    """KIP-447: a TxnOffsetCommit naming its consumer (member id and generation) is taken only from a
    member of the group at the group's generation; a zombie (rebalanced away, or no longer a member)
    gets STALE_GENERATION or UNKNOWN_MEMBER (Kafka's ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID) and its
    offsets never become pending; a commit naming no member is not checked (clients before v3)."""
    pid = log.txn(init()).producer_id
    log.txn(add(pid, 0, 0, groups=("g",)))
    with_member = kq_pb2.GroupMember(
        member_id="m1", topics=["t"], session_timeout_ms=10_000, rebalance_timeout_ms=30_000
    )
    joined = log.run(commands.join_group("g", with_member, "range", 6))
    assert isinstance(joined, GroupResult) and joined.error == ErrorCode.OK
    generation = joined.generation
    assert log.txn(offsets(pid, 0, 4, "m1", generation + 1)).error == ErrorCode.STALE_GENERATION
    assert log.txn(offsets(pid, 0, 4, "m1", -1)).error == ErrorCode.STALE_GENERATION
    assert log.txn(offsets(pid, 0, 4, "zombie", generation)).error == ErrorCode.UNKNOWN_MEMBER
    with log.store.read() as reader:
        assert reader.pending_offsets(pid, 10) == []
    assert log.txn(offsets(pid, 0, 5, "m1", generation)).error == ErrorCode.OK
    assert log.txn(offsets(pid, 0, 6)).error == ErrorCode.OK  # No member named: not checked.
    with log.store.read() as reader:
        assert [row.offset for row in reader.pending_offsets(pid, 10)] == [6]
    unknown_group = kq_pb2.TxnCommitOffsetsCommand(
        transactional_id=TXN,
        producer_id=pid,
        producer_epoch=0,
        group="h",
        offsets=[kq_pb2.OffsetEntry(topic="t", partition=1, offset=1)],
        member_id="m1",
        generation=1,
    )
    log.txn(add(pid, 0, groups=("h",)))
    assert log.txn(commands.transaction(unknown_group)).error == ErrorCode.STALE_GENERATION


def test_offsets_from_an_older_instance_of_a_static_member_are_fenced(log: Log) -> None:
    """A classic group's static member (group.instance.id) replaced by a newer instance: offsets sent
    with the older instance's member id and that instance id answer FENCED_INSTANCE_ID (Kafka's
    `ClassicGroup.validateMember`), an instance no member holds UNKNOWN_MEMBER, and the current
    instance's are taken. The member check alone would have said UNKNOWN_MEMBER, which a client
    reads as "rejoin", not "another instance of you is running"."""
    pid = log.txn(init()).producer_id
    log.txn(add(pid, 0, 0, groups=("g",)))

    def static_join(member_id: str) -> KafkaGroupResult:
        member = kq_pb2.GroupMember(
            member_id=member_id,
            group_instance_id="i1",
            session_timeout_ms=10_000,
            rebalance_timeout_ms=30_000,
            protocols=[kq_pb2.KafkaProtocol(name="range", metadata=b"m")],
        )
        result = log.run(commands.kafka_join_group("g", member, "consumer", 6, True))
        assert isinstance(result, KafkaGroupResult) and result.kafka_error == 0, result
        return result

    static_join("old")
    generation = static_join("new").generation  # The newer instance takes "i1" from "old".
    assert log.txn(offsets(pid, 0, 4, "old", generation, "i1")).error == ErrorCode.FENCED_INSTANCE_ID
    assert log.txn(offsets(pid, 0, 4, "new", generation, "i2")).error == ErrorCode.UNKNOWN_MEMBER
    with log.store.read() as reader:
        assert reader.pending_offsets(pid, 10) == []
    assert log.txn(offsets(pid, 0, 5, "new", generation, "i1")).error == ErrorCode.OK
    assert log.txn(offsets(pid, 0, 6, "new", generation)).error == ErrorCode.OK  # No instance named.
    with log.store.read() as reader:
        assert [row.offset for row in reader.pending_offsets(pid, 10)] == [6]
    illegal = offsets(pid, 0, 7, "new", generation, "not an id")
    assert transactions.transaction_problem(illegal) is not None


def test_a_hanging_abort_closes_only_the_transaction_its_leader_read(log: Log) -> None:
    """A partition leader's abort of a hanging transaction names the first offset it read open
    (`opened_at`): proposed after that transaction was marked and the producer's next one opened there
    (the same producer id and epoch), it writes nothing; naming the open one, it aborts it. A negative
    offset is refused by the shared validation."""
    pid = log.txn(init()).producer_id
    log.txn(add(pid, 0, 0))
    log.produce(pid, 0, 0, b"next")  # Offset 0: the transaction open now.
    hanging = kq_pb2.TransactionMarkerCommand(
        producer_id=pid,
        producer_epoch=0,
        commit=False,
        partitions=[kq_pb2.TxnPartition(topic="t", partition=0)],
        timestamp_ms=4,
        opened_at=7,  # The one the leader read (since marked).
    )
    assert log.txn(commands.transaction(hanging)).written == 0
    assert log.lso() == 0
    hanging.opened_at = 0
    assert log.txn(commands.transaction(hanging)).written == 1
    assert log.lso() == 2
    hanging.opened_at = -1
    assert transactions.transaction_problem(commands.transaction(hanging)) is not None


def test_a_new_instance_fences_the_old_one_and_aborts_its_open_transaction(log: Log) -> None:
    """InitProducerId during an open transaction bumps the epoch and prepares the abort; the old
    epoch is fenced at the coordinator and, after the marker, at the partition."""
    pid = log.txn(init()).producer_id
    log.txn(add(pid, 0, 0))
    log.produce(pid, 0, 0, b"a")
    again = log.txn(init())
    assert again.error == ErrorCode.CONCURRENT_TRANSACTIONS and again.producer_epoch == 1
    assert log.state().phase == kq_pb2.TXN_PREPARE_ABORT
    assert log.txn(add(pid, 0, 1)).error == ErrorCode.PRODUCER_FENCED
    log.txn(marker(pid, 1, False, 0))
    log.txn(complete(pid, 1, False))
    assert log.produce(pid, 0, 1, b"zombie").error == ErrorCode.INVALID_PRODUCER_EPOCH  # type: ignore[attr-defined]
    fresh = log.txn(init())
    assert (fresh.error, fresh.producer_epoch) == (ErrorCode.OK, 2)
    log.txn(add(pid, 2, 0))
    assert log.produce(pid, 2, 0, b"new").error == ErrorCode.OK  # type: ignore[attr-defined]


def test_a_timed_out_transaction_is_aborted_with_its_epoch_bumped(log: Log) -> None:
    """The coordinator's abort of an expired transaction fences its producer (epoch + 1)."""
    pid = log.txn(init()).producer_id
    log.txn(add(pid, 0, 0))
    assert log.txn(end(pid, 0, commit=False, timed_out=True)).producer_epoch == 1
    assert log.txn(end(pid, 0, commit=True)).error == ErrorCode.PRODUCER_FENCED
    assert log.txn(end(pid, 0, commit=False, timed_out=True)).error == ErrorCode.OK  # A repeat: no-op.
    assert log.state().producer_epoch == 1


def test_offsets_need_the_group_added_and_an_ongoing_transaction(log: Log) -> None:
    """TxnOffsetCommit for a group the transaction did not add is INVALID_TXN_STATE; an unknown
    producer id is INVALID_PRODUCER_ID_MAPPING."""
    pid = log.txn(init()).producer_id
    assert log.txn(offsets(pid, 0, 1)).error == ErrorCode.INVALID_TXN_STATE
    log.txn(add(pid, 0, 0))
    assert log.txn(offsets(pid, 0, 1)).error == ErrorCode.INVALID_TXN_STATE
    assert log.txn(offsets(pid + 1, 0, 1)).error == ErrorCode.INVALID_PRODUCER_ID_MAPPING


def test_replaying_the_same_transaction_commands_gives_equal_stores(tmp_path: Path) -> None:
    """Determinism: two stores applying the same entries hold the same bytes."""
    dumps = []
    for name in ("a", "b"):
        log = Log(Store.open(tmp_path / name, map_size_bytes=64 * 1024**2))
        log.run(create("t", 2))
        pid = log.txn(init()).producer_id
        log.txn(add(pid, 0, 0, 1, groups=("g",)))
        log.produce(pid, 0, 0, b"a")
        log.produce(pid, 0, 0, b"b", partition=1)
        log.txn(offsets(pid, 0, 3))
        log.txn(end(pid, 0, commit=False))
        log.txn(marker(pid, 0, False, 0, 1, groups=("g",)))
        log.txn(complete(pid, 0, False))
        dumps.append(log.store.dump())
    assert dumps[0] == dumps[1]


def test_validation_refuses_bad_ids_timeouts_and_a_producer_s_control_batch() -> None:
    """The shared checks: empty or long ids, timeouts out of bounds; control batches only from apply."""
    assert transactions.transaction_problem(init(timeout_ms=10)) is not None
    command = init()
    command.init_transaction.transactional_id = ""
    assert transactions.transaction_problem(command) is not None
    command.init_transaction.transactional_id = "x" * 300
    assert transactions.transaction_problem(command) is not None
    assert transactions.transaction_problem(init()) is None
    with pytest.raises(MalformedBatchError, match="control batch"):
        check_batch(control_batch(1, 0, True, 0, 1), 10, 10, 1 << 20, 100, 1 << 20)
    parse_batch(control_batch(1, 0, True, 0, 1))  # A stored marker parses.
    check_batch(txn_batch(1, 0, 0, b"a"), 10, 10, 1 << 20, 100, 1 << 20)
