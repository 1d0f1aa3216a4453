"""The leader's producer expiry loop (broker/producer_expiry.py) against a real store: it proposes
nothing while no producer is remembered, proposes sweeps with its clock and expiration until one
reaches the table's end, counts what they expired, and stops after PRODUCER_EXPIRY_ENTRIES_PER_CHECK_MAX."""

from __future__ import annotations

from pathlib import Path

import pytest

from kq.broker import producer_expiry
from kq.broker.metrics import PRODUCER_WINDOWS_EXPIRED
from kq.broker.producer_expiry import ProducerExpiry
from kq.proto import kq_pb2
from kq.raft import commands, state_machine
from kq.raft.state_machine import apply
from kq.storage import Store
from tests.broker.fake_consensus import FakeConsensus
from tests.raft.helpers import batch, create

START_MS = 1_700_000_000_000
EXPIRATION_MS = 60_000


def store_with_producers(path: Path, producers: int) -> Store:
    """Topic t, `producers` producer ids, each with a window on partition 0 appended at START_MS."""
    store = Store.open(path, map_size_bytes=64 * 1024**2)
    entries = [create("t", 1)] + [commands.encode(commands.register_producer(1)) for _ in range(producers)]
    for producer_id in range(1, producers + 1):
        part = commands.partition_append("t", 0, batch(b"v", producer=(producer_id, 0, 0)))
        entries.append(commands.encode(commands.append(START_MS, [part])))
    for index, entry in enumerate(entries, start=1):
        apply(store, index, entry)
    return store


def windows(store: Store) -> int:
    with store.read() as reader:
        return len(reader.producer_windows(1, 0, 1_000))


def test_nothing_is_proposed_without_producers_and_nothing_expires_early(tmp_path: Path) -> None:
    """An empty table: no entry at all. Windows younger than the expiration: one sweep, nothing gone."""
    empty = Store.open(tmp_path / "empty", map_size_bytes=64 * 1024**2)
    consensus = FakeConsensus(empty, lambda index: None)
    assert ProducerExpiry(empty, consensus, lambda: START_MS, EXPIRATION_MS, 1.0).run_once() == 0
    assert consensus.proposals == 0
    store = store_with_producers(tmp_path / "young", 3)
    consensus = FakeConsensus(store, lambda index: None)
    expiry = ProducerExpiry(store, consensus, lambda: START_MS + EXPIRATION_MS - 1, EXPIRATION_MS, 1.0)
    assert expiry.run_once() == 0
    assert consensus.proposals == 1 and windows(store) == 3


def test_sweeps_are_proposed_until_the_table_end_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five idle windows, two rows an entry: three entries (the last reaches the end), five expired,
    the metric up by five."""
    monkeypatch.setattr(state_machine, "PRODUCER_EXPIRY_ROWS_PER_ENTRY_MAX", 2)
    store = store_with_producers(tmp_path / "store", 5)
    consensus = FakeConsensus(store, lambda index: None)
    counted = PRODUCER_WINDOWS_EXPIRED._value.get()
    expiry = ProducerExpiry(store, consensus, lambda: START_MS + EXPIRATION_MS, EXPIRATION_MS, 1.0)
    assert expiry.run_once() == 5
    assert consensus.proposals == 3 and windows(store) == 0
    assert PRODUCER_WINDOWS_EXPIRED._value.get() == counted + 5


def test_one_check_proposes_at_most_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With one row an entry and two entries a check, a table of four rows takes two checks."""
    monkeypatch.setattr(state_machine, "PRODUCER_EXPIRY_ROWS_PER_ENTRY_MAX", 1)
    monkeypatch.setattr(producer_expiry, "PRODUCER_EXPIRY_ENTRIES_PER_CHECK_MAX", 2)
    store = store_with_producers(tmp_path / "store", 4)
    consensus = FakeConsensus(store, lambda index: None)
    expiry = ProducerExpiry(store, consensus, lambda: START_MS + EXPIRATION_MS, EXPIRATION_MS, 1.0)
    assert expiry.run_once() == 2 and windows(store) == 2
    assert expiry.run_once() == 2 and windows(store) == 0
    assert consensus.proposals == 4


def test_group_0_also_forgets_idle_transactional_ids(tmp_path: Path) -> None:
    """With a transactional id expiration (group 0's loop), the same check proposes id sweeps: an id
    idle for it is forgotten; without one (any other group) ids are left alone."""
    store = Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)
    init = kq_pb2.InitTransactionCommand(transactional_id="tx", timeout_ms=60_000, now_ms=START_MS)
    apply(store, 1, commands.encode(commands.transaction(init)))
    consensus = FakeConsensus(store, lambda index: None)
    clock = lambda: START_MS + EXPIRATION_MS  # noqa: E731
    ProducerExpiry(store, consensus, clock, EXPIRATION_MS, 1.0).run_once()
    assert consensus.proposals == 0  # No producer window, and this group coordinates no transactions.
    ProducerExpiry(store, consensus, clock, EXPIRATION_MS, 1.0, EXPIRATION_MS).run_once()
    assert consensus.proposals == 1
    with store.read() as reader:
        assert reader.transaction_count() == 0
