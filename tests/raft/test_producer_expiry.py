"""Producer id expiry in apply (Kafka's producer.id.expiration.ms, KIP-360): a window idle for the
expiration at the entry's clock, with no open transaction there, is deleted; a bounded number of rows
per entry, resuming where the last entry stopped; old rows without a time are stamped, not expired;
replicas and replays agree. Idle transactional ids expire alike (transactional.id.expiration.ms)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from kq.proto import kq_pb2
from kq.proto.records import TRANSACTIONAL_FLAG, NewRecord, assemble_batch, encode_record
from kq.raft import commands, state_machine, transactions
from kq.raft.results import (
    AppendResult,
    ApplyResult,
    ErrorCode,
    ExpiryResult,
    SkippedResult,
    TransactionResult,
)
from kq.raft.state_machine import apply
from kq.raft.validation import command_problem
from kq.storage import ProducerAppend, Store
from tests.raft.helpers import batch, create

EXPIRATION_MS = 86_400_000  # Kafka's default producer.id.expiration.ms.
START_MS = 1_700_000_000_000


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)


class Log:
    """Applies encoded entries to a store with increasing indexes, remembering the results."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.index = 0
        self.results: list[ApplyResult] = []

    def run(self, data: bytes | kq_pb2.Command) -> ApplyResult:
        self.index += 1
        encoded = data if isinstance(data, bytes) else commands.encode(data)
        result = apply(self.store, self.index, encoded)
        self.results.append(result)
        return result

    def produce(self, partition: int, producer_id: int, sequence: int, at_ms: int) -> AppendResult:
        """An idempotent batch of one record, appended by an entry whose leader clock is `at_ms`."""
        part = commands.partition_append("t", partition, batch(b"v", producer=(producer_id, 0, sequence)))
        result = self.run(commands.append(at_ms, [part]))
        assert isinstance(result, AppendResult)
        return result

    def expire(self, now_ms: int, expiration_ms: int = EXPIRATION_MS) -> ExpiryResult:
        result = self.run(commands.expire_producers(now_ms, expiration_ms))
        assert isinstance(result, ExpiryResult)
        return result

    def window_time(self, partition: int, producer_id: int) -> int | None:
        """The window's last append time; -1 when the partition has no window of the producer."""
        with self.store.read() as reader:
            window = reader.producer_window(producer_id, 1, partition)
        return -1 if window is None else window.last_append_ms


def setup(store: Store, producers: int = 2) -> Log:
    """Topic t (id 1, two partitions) and producer ids 1..`producers`."""
    log = Log(store)
    log.run(create("t", 2))
    for _ in range(producers):
        log.run(commands.register_producer(1))
    return log


def test_a_window_idle_for_the_expiration_goes_and_a_recent_one_stays(store: Store) -> None:
    """Expiry counts from each window's last append (the entry's leader clock), per partition: at
    exactly the expiration it goes (Kafka's `>=`), a millisecond before it stays."""
    log = setup(store)
    log.produce(0, 1, 0, START_MS)
    log.produce(1, 1, 0, START_MS + 10)
    log.produce(0, 2, 0, START_MS + 5)
    assert log.window_time(0, 1) == START_MS
    first = log.expire(START_MS + EXPIRATION_MS - 1)
    assert (first.looked, first.expired, first.wrapped) == (3, 0, True)
    second = log.expire(START_MS + EXPIRATION_MS)
    assert (second.looked, second.expired, second.wrapped) == (3, 1, True)
    assert log.window_time(0, 1) == -1
    assert log.window_time(1, 1) == START_MS + 10
    assert log.window_time(0, 2) == START_MS + 5
    third = log.expire(START_MS + 10 + EXPIRATION_MS)
    assert (third.looked, third.expired) == (2, 2)
    with store.read() as reader:
        assert not reader.has_producer_windows()


def test_an_expired_producer_is_accepted_at_any_sequence_and_deduplicated_again(store: Store) -> None:
    """KIP-360: a partition without state of the producer takes its next batch at whatever sequence it
    continues with (Kafka no longer answers UNKNOWN_PRODUCER_ID there); from then on its window works
    as before: a retry is a duplicate, a gap out of order."""
    log = setup(store, producers=1)
    for sequence in range(3):
        log.produce(0, 1, sequence, START_MS)
    log.expire(START_MS + EXPIRATION_MS)
    assert log.window_time(0, 1) == -1
    later = START_MS + EXPIRATION_MS + 1
    resumed = log.produce(0, 1, 3, later)
    assert resumed.appends[0].error == ErrorCode.OK and not resumed.appends[0].duplicate
    retry = log.produce(0, 1, 3, later)
    assert retry.appends[0].duplicate and retry.appends[0].base_offset == resumed.appends[0].base_offset
    assert log.produce(0, 1, 9, later).appends[0].error == ErrorCode.OUT_OF_ORDER_SEQUENCE
    assert log.window_time(0, 1) == later


def _txn_batch(producer_id: int) -> bytes:
    record = encode_record(NewRecord(None, b"v"), 0, 0)
    return assemble_batch(record, 1, 1, 1, 0, producer_id, 0, 0, attributes=TRANSACTIONAL_FLAG)


def test_an_open_transaction_keeps_its_window_and_its_marker_restarts_the_clock(store: Store) -> None:
    """A producer with an open transaction in the partition keeps its window however old (Kafka keeps
    a producer with an ongoing transaction); the marker stamps the window with its entry's clock, and
    the window expires the expiration after the marker."""
    log = setup(store, producers=1)
    appended = log.run(commands.append(START_MS, [commands.partition_append("t", 0, _txn_batch(1))]))
    assert isinstance(appended, AppendResult) and appended.appends[0].error == ErrorCode.OK
    kept = log.expire(START_MS + 10 * EXPIRATION_MS)
    assert (kept.looked, kept.expired) == (1, 0)
    marked_ms = START_MS + 11 * EXPIRATION_MS
    log.run(
        commands.transaction(
            kq_pb2.TransactionMarkerCommand(
                producer_id=1,
                producer_epoch=0,
                commit=True,
                partitions=[kq_pb2.TxnPartition(topic="t", partition=0)],
                timestamp_ms=marked_ms,
            )
        )
    )
    assert log.window_time(0, 1) == marked_ms
    assert log.expire(marked_ms + EXPIRATION_MS - 1).expired == 0
    assert log.expire(marked_ms + EXPIRATION_MS).expired == 1
    assert log.window_time(0, 1) == -1


def test_each_entry_looks_at_a_bounded_number_of_rows_and_the_next_resumes(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a bound of 3 rows an entry, 7 windows take three entries (3, 3, 1 rows); the last reaches
    the table's end and the next sweep starts again at the first row."""
    monkeypatch.setattr(state_machine, "PRODUCER_EXPIRY_ROWS_PER_ENTRY_MAX", 3)
    log = setup(store, producers=4)
    for producer_id in range(1, 5):
        log.produce(0, producer_id, 0, START_MS)
        if producer_id < 4:
            log.produce(1, producer_id, 0, START_MS + EXPIRATION_MS)  # Stays in the first sweep.
    now = START_MS + EXPIRATION_MS
    sweeps = [log.expire(now) for _ in range(3)]
    assert [(s.looked, s.wrapped) for s in sweeps] == [(3, False), (3, False), (1, True)]
    assert sum(s.expired for s in sweeps) == 4
    again = log.expire(now + EXPIRATION_MS)  # From the first row again: partition 1's three windows.
    assert (again.looked, again.expired, again.wrapped) == (3, 3, True)
    empty = log.expire(now + EXPIRATION_MS)
    assert (empty.looked, empty.expired, empty.wrapped) == (0, 0, True)


def test_the_store_bound_holds_for_a_direct_sweep(store: Store) -> None:
    """The store's sweep itself: `rows_max` rows at most, the cursor kept between transactions."""
    with store.write() as writer:
        for producer_id in range(1, 6):
            writer.remember_producer_append(
                producer_id, 1, 0, 0, ProducerAppend(0, 1, producer_id), None, appended_ms=0
            )
    looked = []
    for _ in range(3):
        with store.write() as writer:
            sweep = writer.expire_producers(10, 10, 2)
            looked.append((sweep.looked, sweep.expired, sweep.wrapped))
    assert looked == [(2, 2, False), (2, 2, False), (1, 1, True)]


_OLD_ROW = struct.Struct(">HBIIQ")  # A row of a kq from before the time: epoch, count 1, one append.


def test_an_old_row_without_a_time_is_stamped_by_the_first_sweep_not_expired(store: Store) -> None:
    """A `producers` row written before rows carried their time reads unstamped; the first sweep gives
    it the entry's clock instead of expiring it (an upgrade never drops every producer at once); it
    expires the expiration after that sweep, and the window's appends are kept meanwhile."""
    log = setup(store, producers=1)
    log.produce(0, 1, 0, START_MS)
    with store.write() as writer:  # The very row an older kq wrote: no trailing time.
        key = struct.pack(">QIQ", 1, 0, 1)
        writer._transaction.put(key, _OLD_ROW.pack(0, 1, 0, 1, 0), db=writer._producers)
    with store.read() as reader:
        window = reader.producer_window(1, 1, 0)
    assert window is not None and window.last_append_ms is None
    assert window.appends == (ProducerAppend(0, 1, 0),)
    sweep_ms = START_MS + 100 * EXPIRATION_MS
    stamped = log.expire(sweep_ms)
    assert (stamped.looked, stamped.stamped, stamped.expired) == (1, 1, 0)
    assert log.window_time(0, 1) == sweep_ms
    retry = log.produce(0, 1, 0, sweep_ms)  # The old row's append is still remembered.
    assert retry.appends[0].duplicate
    assert log.expire(sweep_ms + EXPIRATION_MS - 1).expired == 0
    assert log.expire(sweep_ms + EXPIRATION_MS).expired == 1


def test_replicas_and_replays_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two stores fed the same log (appends, sweeps over a small bound) end byte-identical with the
    same results; applying the log again skips every entry and changes nothing."""
    monkeypatch.setattr(state_machine, "PRODUCER_EXPIRY_ROWS_PER_ENTRY_MAX", 2)
    entries: list[bytes] = [create("t", 2)]
    entries += [commands.encode(commands.register_producer(1)) for _ in range(3)]
    for producer_id in range(1, 4):
        for partition in range(2):
            stamp = START_MS + producer_id * 1_000 + partition
            part = commands.partition_append("t", partition, batch(b"v", producer=(producer_id, 0, 0)))
            entries.append(commands.encode(commands.append(stamp, [part])))
    for now in (START_MS, START_MS + 2_500, START_MS + 2_500, START_MS + 2_500, START_MS + 9_000):
        entries.append(commands.encode(commands.expire_producers(now, 2_000)))
    left, right = (Store.open(tmp_path / name, map_size_bytes=64 * 1024**2) for name in ("left", "right"))
    results = [[apply(replica, i + 1, entry) for i, entry in enumerate(entries)] for replica in (left, right)]
    assert results[0] == results[1]
    assert left.dump() == right.dump()
    before = left.dump()
    replayed = [apply(left, i + 1, entry) for i, entry in enumerate(entries)]
    assert all(isinstance(result, SkippedResult) for result in replayed)
    assert left.dump() == before
    assert sum(r.expired for r in results[0] if isinstance(r, ExpiryResult)) > 0


@pytest.mark.parametrize(
    ("now_ms", "expiration_ms", "refused"),
    [(0, 1, False), (START_MS, EXPIRATION_MS, False), (0, 0, True), (5, -1, True), (-1, 1, True)],
)
def test_the_edge_refuses_an_expiry_apply_would_not_take(
    now_ms: int, expiration_ms: int, refused: bool
) -> None:
    """producer.id.expiration.ms is at least 1 (Kafka's bound) and the clock not before 1970; apply
    rejects such an entry as the edge's validation does (the same function)."""
    command = commands.expire_producers(now_ms, expiration_ms)
    assert (command_problem(command) is not None) == refused


def _init(transactional_id: str, now_ms: int) -> kq_pb2.Command:
    return commands.transaction(
        kq_pb2.InitTransactionCommand(transactional_id=transactional_id, timeout_ms=60_000, now_ms=now_ms)
    )


def _add(transactional_id: str, producer_id: int, now_ms: int) -> kq_pb2.Command:
    return commands.transaction(
        kq_pb2.AddToTransactionCommand(
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=0,
            partitions=[kq_pb2.TxnPartition(topic="t", partition=0)],
            now_ms=now_ms,
        )
    )


TXN_EXPIRATION_MS = 604_800_000  # Kafka's default transactional.id.expiration.ms.


def test_an_idle_transactional_id_is_forgotten_and_one_in_progress_kept(store: Store) -> None:
    """transactional.id.expiration.ms: an id with no transaction in progress, unchanged for the
    expiration, goes (its next InitProducerId gets a new producer id, as in Kafka); an id whose
    transaction is ONGOING stays however old; a millisecond early nothing goes."""
    log = setup(store, producers=0)
    idle = log.run(_init("idle", START_MS))
    busy = log.run(_init("busy", START_MS))
    assert isinstance(idle, TransactionResult) and isinstance(busy, TransactionResult)
    log.run(_add("busy", busy.producer_id, START_MS))
    early = log.run(commands.expire_transactional_ids(START_MS + TXN_EXPIRATION_MS - 1, TXN_EXPIRATION_MS))
    assert isinstance(early, ExpiryResult) and (early.looked, early.expired, early.wrapped) == (2, 0, True)
    due = log.run(commands.expire_transactional_ids(START_MS + TXN_EXPIRATION_MS, TXN_EXPIRATION_MS))
    assert isinstance(due, ExpiryResult) and (due.looked, due.expired) == (2, 1)
    with store.read() as reader:
        assert reader.transaction_state("idle") is None
        assert reader.transaction_state("busy") is not None
    again = log.run(_init("idle", START_MS + TXN_EXPIRATION_MS))
    assert isinstance(again, TransactionResult) and again.error == ErrorCode.OK
    assert again.producer_id not in (idle.producer_id, busy.producer_id) and again.producer_epoch == 0


def test_transactional_id_sweeps_are_bounded_and_resume(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ids an entry: five idle ids take three entries (2, 2, 1), all forgotten; replicas agree."""
    monkeypatch.setattr(transactions, "TXN_ID_EXPIRY_ROWS_PER_ENTRY_MAX", 2)
    log = setup(store, producers=0)
    for number in range(5):
        log.run(_init(f"id-{number}", START_MS))
    now = START_MS + TXN_EXPIRATION_MS
    sweeps = [log.run(commands.expire_transactional_ids(now, TXN_EXPIRATION_MS)) for _ in range(3)]
    assert [(s.looked, s.expired, s.wrapped) for s in sweeps if isinstance(s, ExpiryResult)] == [
        (2, 2, False),
        (2, 2, False),
        (1, 1, True),
    ]
    with store.read() as reader:
        assert reader.transaction_count() == 0


@pytest.mark.parametrize(("now_ms", "expiration_ms", "refused"), [(0, 1, False), (0, 0, True), (-1, 5, True)])
def test_the_edge_refuses_an_id_expiry_apply_would_not_take(
    now_ms: int, expiration_ms: int, refused: bool
) -> None:
    """transactional.id.expiration.ms is at least 1; the clock not before 1970."""
    command = commands.expire_transactional_ids(now_ms, expiration_ms)
    assert (command_problem(command) is not None) == refused
