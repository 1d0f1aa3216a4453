"""The transaction coordinator's driver on a real store (a one-replica consensus): it finishes a prepared
transaction (markers, then completion) as after a failover, aborts one past its timeout with its producer
fenced, and any group's leader aborts a transaction hanging open in one of its partitions."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kq.broker.groups_view import GroupsView
from kq.broker.membership import MembershipView
from kq.broker.txn_coordinator import TransactionDriver, TransactionFinisher
from kq.proto import kq_pb2
from kq.proto.limits import TXN_OPEN_PER_PARTITION_MAX
from kq.raft import commands
from kq.raft.results import AppendResult, TransactionResult
from kq.raft.state_machine import apply
from kq.storage import Store
from tests.broker.fake_consensus import FakeConsensus
from tests.raft.helpers import CLOCK_MS, create
from tests.raft.test_transactions import txn_batch


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def parts(tmp_path: Path) -> tuple[Store, FakeConsensus, TransactionDriver, Clock]:
    store = Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)
    consensus = FakeConsensus(store, lambda _index: None)
    clock = Clock()
    finisher = TransactionFinisher(store, consensus, _groups(consensus), None, clock)
    driver = TransactionDriver(store, consensus, _groups(consensus), finisher, clock)
    apply(store, 1, create("t", 2))
    return store, consensus, driver, clock


def _groups(consensus: FakeConsensus) -> GroupsView:
    return GroupsView(0, 1, lambda: MembershipView("1", (), {}, frozenset(), ""), consensus.status)


def _propose(store: Store, command: kq_pb2.Command) -> object:
    return apply(store, store.applied_index() + 1, commands.encode(command))


def _open_transaction(store: Store, now_ms: int, timeout_ms: int = 60_000) -> int:
    """An ONGOING transaction of id "tx" with one record in t-0; its producer id."""
    init = _propose(
        store,
        commands.transaction(
            kq_pb2.InitTransactionCommand(transactional_id="tx", timeout_ms=timeout_ms, now_ms=now_ms)
        ),
    )
    assert isinstance(init, TransactionResult)
    add = kq_pb2.AddToTransactionCommand(
        transactional_id="tx",
        producer_id=init.producer_id,
        producer_epoch=0,
        partitions=[kq_pb2.TxnPartition(topic="t", partition=0)],
        now_ms=now_ms,
    )
    _propose(store, commands.transaction(add))
    appended = _propose(
        store,
        commands.append(
            CLOCK_MS, [commands.partition_append("t", 0, txn_batch(init.producer_id, 0, 0, b"a"))]
        ),
    )
    assert isinstance(appended, AppendResult)
    return init.producer_id


def _state(store: Store) -> kq_pb2.TransactionState:
    with store.read() as reader:
        raw = reader.transaction_state("tx")
    assert raw is not None
    return kq_pb2.TransactionState.FromString(raw)


def _lso(store: Store) -> int:
    with store.read() as reader:
        topic = reader.topic("t")
        assert topic is not None
        state = reader.partition(topic.topic_id, 0)
        assert state is not None
        return reader.last_stable_offset(topic.topic_id, 0, state.log_end_offset, TXN_OPEN_PER_PARTITION_MAX)


def test_a_prepared_transaction_is_finished_by_the_next_round(
    parts: tuple[Store, FakeConsensus, TransactionDriver, Clock],
) -> None:
    """A transaction a previous leader prepared (PREPARE_COMMIT, no markers yet) gets its markers and
    completion from the driver: the LSO moves past it."""
    store, _, driver, clock = parts
    producer_id = _open_transaction(store, clock.now_ms)
    end = kq_pb2.EndTransactionCommand(
        transactional_id="tx", producer_id=producer_id, producer_epoch=0, commit=True, now_ms=clock.now_ms
    )
    _propose(store, commands.transaction(end))
    assert _lso(store) == 0
    assert driver.run_once() == 1
    assert _state(store).phase == kq_pb2.TXN_COMPLETE_COMMIT
    assert _lso(store) == 2  # The record and its marker.
    assert driver.run_once() == 0
    with store.read() as reader:
        assert reader.coordinator_epoch() == 1  # The markers named group 0's term (FakeConsensus: 1).


def test_an_expired_transaction_is_aborted_and_its_producer_fenced(
    parts: tuple[Store, FakeConsensus, TransactionDriver, Clock],
) -> None:
    """Past transaction.timeout.ms the driver aborts: epoch bumped, markers written, state COMPLETE_ABORT."""
    store, _, driver, clock = parts
    _open_transaction(store, clock.now_ms, timeout_ms=5_000)
    assert driver.run_once() == 0
    clock.now_ms += 5_001
    assert driver.run_once() == 1
    state = _state(store)
    assert (state.phase, state.producer_epoch) == (kq_pb2.TXN_COMPLETE_ABORT, 1)
    assert _lso(store) == 2
    with store.read() as reader:
        topic = reader.topic("t")
        assert topic is not None
        assert len(reader.aborted_transactions(topic.topic_id, 0, 0, 2, 10)) == 1


def test_a_transaction_hanging_in_a_partition_is_aborted_by_its_leader(
    parts: tuple[Store, FakeConsensus, TransactionDriver, Clock],
) -> None:
    """Records of a transaction no coordinator will mark (here: never added) hold the LSO until the
    partition's leader aborts them, after TXN_HANGING_ABORT_MS."""
    store, _, driver, clock = parts
    _propose(store, commands.register_producer(1))
    batch = txn_batch(1, 0, 0, b"orphan")
    _propose(store, commands.append(clock.now_ms, [commands.partition_append("t", 1, batch)]))
    assert driver.abort_hanging(older_than_ms=10_000) == 0
    clock.now_ms += 10_001
    assert driver.abort_hanging(older_than_ms=10_000) == 1
    with store.read() as reader:
        topic = reader.topic("t")
        assert topic is not None
        state = reader.partition(topic.topic_id, 1)
        assert state is not None
        assert (
            reader.last_stable_offset(topic.topic_id, 1, state.log_end_offset, 10)
            == state.log_end_offset
            == 2
        )


class _LateFinisher:
    """The driver's finisher, run only after `before` (what happened between the driver's read of the
    transactions and its finishing of one: here EndTxn's own finishing and the client's next steps)."""

    def __init__(self, inner: TransactionFinisher, before: Callable[[], None]) -> None:
        self._inner = inner
        self._before = before

    def finish(self, *args: Any) -> bool:
        self._before()
        return self._inner.finish(*args)


def test_a_round_that_read_a_transaction_before_its_end_finished_leaves_the_next_one_alone(
    parts: tuple[Store, FakeConsensus, TransactionDriver, Clock],
) -> None:
    """The driver reads a transaction as PREPARE_COMMIT; before it writes the markers, EndTxn's own
    finishing completes that transaction and the producer opens its next one (same epoch) in the same
    partition. The driver's late round must write nothing: a COMMIT marker of the first transaction
    would close the second's open records as committed, and the second's ABORT would then find nothing
    open (a read_committed consumer would read records its producer aborted)."""
    store, consensus, _, clock = parts
    producer_id = _open_transaction(store, clock.now_ms)
    end = kq_pb2.EndTransactionCommand(
        transactional_id="tx", producer_id=producer_id, producer_epoch=0, commit=True, now_ms=clock.now_ms
    )
    _propose(store, commands.transaction(end))
    finisher = TransactionFinisher(store, consensus, _groups(consensus), None, clock)

    def end_finished_and_next_opened() -> None:
        finisher.finish("tx")  # EndTxn's handler: markers and completion.
        assert _state(store).phase == kq_pb2.TXN_COMPLETE_COMMIT
        add = kq_pb2.AddToTransactionCommand(
            transactional_id="tx",
            producer_id=producer_id,
            producer_epoch=0,
            partitions=[kq_pb2.TxnPartition(topic="t", partition=0)],
            now_ms=clock.now_ms,
        )
        _propose(store, commands.transaction(add))
        batch = txn_batch(producer_id, 0, 1, b"b")
        _propose(store, commands.append(CLOCK_MS, [commands.partition_append("t", 0, batch)]))

    late = _LateFinisher(finisher, end_finished_and_next_opened)
    TransactionDriver(store, consensus, _groups(consensus), late, clock).run_once()  # type: ignore[arg-type]
    assert _state(store).phase == kq_pb2.TXN_ONGOING
    assert _lso(store) == 2  # The second transaction's record (offset 2) is still open: not committed.
    end = kq_pb2.EndTransactionCommand(
        transactional_id="tx", producer_id=producer_id, producer_epoch=0, commit=False, now_ms=clock.now_ms
    )
    _propose(store, commands.transaction(end))
    finisher.finish("tx")
    with store.read() as reader:
        topic = reader.topic("t")
        assert topic is not None
        aborted = reader.aborted_transactions(topic.topic_id, 0, 0, 10, 10)
    assert [(row.producer_id, row.first_offset) for row in aborted] == [(producer_id, 2)]
