"""The batcher: requests that wait while entries are in flight travel together in the next entry."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import pytest

from kq.broker import proposals
from kq.broker.consensus import ConsensusStatus
from kq.broker.proposals import AppendOutcome, Batcher
from kq.broker.validation import checked_append
from kq.deploy.waiting import wait_for
from kq.proto import kq_pb2
from kq.proto.compression import ZSTD
from kq.proto.limits import (
    BATCHER_GATHER_BYTES,
    BATCHER_GATHER_REQUESTS,
    ENTRY_WORK_MAX,
    PROPOSALS_IN_FLIGHT_MAX,
)
from kq.proto.records import NewRecord, encode_batch
from kq.raft import commands
from kq.raft.results import ApplyResult
from kq.raft.state_machine import apply
from kq.storage import Store
from tests.raft.helpers import batch, create

WAIT_S = 10.0  # A condition on the batcher thread that has not held by then is a failure.

Callback = Callable[[ApplyResult | None, int], None]


class HeldConsensus:
    """Accepts proposals but commits them only when the test says so."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.held: list[tuple[bytes, Callback]] = []
        self.lock = threading.Lock()

    def propose(self, data: bytes, callback: Callback) -> None:
        with self.lock:
            self.held.append((data, callback))

    def commit_next(self) -> None:
        with self.lock:
            data, callback = self.held.pop(0)
        callback(apply(self.store, self.store.applied_index() + 1, data), 0)

    def is_leader(self) -> bool:
        return True

    def leader_grpc_address(self) -> str | None:
        return None

    def status(self) -> ConsensusStatus:
        return ConsensusStatus("leader", "1", "", 1, 0, 0, {}, True, 0)

    def term(self) -> int:
        return 1


def appends_in(data: bytes) -> int:
    return len(commands.decode(data).append.appends)


def _started(tmp_path: Path) -> tuple[Store, HeldConsensus, Batcher]:
    """A store holding topic "t", a consensus that commits when told, and a started batcher on it."""
    store = Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)
    apply(store, 1, create("t", 1))
    consensus = HeldConsensus(store)
    batcher = Batcher(consensus, lambda: 1_000)
    batcher.start()
    return store, consensus, batcher


def test_requests_queued_behind_full_slots_share_one_entry(tmp_path: Path) -> None:
    """With every slot busy, ten queued requests become one entry; every request gets its own offset."""
    store, consensus, batcher = _started(tmp_path)
    request = checked_append(kq_pb2.ProduceRequest(topic="t", partition=0, records=batch(b"v")))
    first: list[Future[AppendOutcome]] = []
    for slot in range(PROPOSALS_IN_FLIGHT_MAX):  # One at a time: each fills a slot alone.
        first.append(batcher.submit(request))
        proposed = slot + 1
        wait_for(lambda: len(consensus.held) == proposed, "the entry proposed", WAIT_S, poll_s=0.005)  # noqa: B023
    queued = [batcher.submit(request) for _ in range(10)]
    wait_for(lambda: batcher._queue.qsize() == 10, "ten queued appends", WAIT_S, poll_s=0.005)
    consensus.commit_next()
    wait_for(lambda: len(consensus.held) == PROPOSALS_IN_FLIGHT_MAX, "full window", WAIT_S, poll_s=0.005)
    assert appends_in(consensus.held[-1][0]) == 10
    while consensus.held:
        consensus.commit_next()
    offsets = sorted(f.result(timeout=10).result.base_offset for f in first + queued)
    assert offsets == list(range(PROPOSALS_IN_FLIGHT_MAX + 10))
    batcher.stop()
    store.close()


def test_a_request_is_answered_unavailable_when_nothing_commits(tmp_path: Path) -> None:
    """A request whose entry never commits fails (retriably) at its timeout instead of hanging."""
    store = Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)
    batcher = Batcher(HeldConsensus(store), lambda: 1_000)
    batcher.start()
    try:
        asyncio.run(
            batcher.append_async(
                checked_append(kq_pb2.ProduceRequest(topic="t", partition=0, records=batch(b"v"))), 0.05
            )
        )
    except Exception as error:
        assert type(error).__name__ == "UnavailableError"
    else:
        raise AssertionError("expected UnavailableError")
    batcher.stop()
    store.close()


def test_entries_are_packed_within_the_work_budget(tmp_path: Path) -> None:
    """Dense batches (a few KB each, most of an entry's work budget) queued behind full slots travel one
    an entry, while small ones queued with them share one: the batcher packs by the work the edge
    measured, so apply never refuses an entry it built for its work."""
    store = Store.open(tmp_path / "store", map_size_bytes=256 * 1024**2)
    apply(store, 1, create("t", 1))
    consensus = HeldConsensus(store)
    batcher = Batcher(consensus, lambda: 1_000)
    batcher.start()
    headers = tuple(("h", b"") for _ in range(10))
    dense = encode_batch([NewRecord(None, b"x", headers)] * 10_000, ZSTD, base_timestamp_ms=1_000)
    heavy = checked_append(kq_pb2.ProduceRequest(topic="t", partition=0, records=dense))
    light = checked_append(kq_pb2.ProduceRequest(topic="t", partition=0, records=batch(b"v")))
    assert ENTRY_WORK_MAX // 2 < heavy.work <= ENTRY_WORK_MAX
    futures = []
    for slot in range(PROPOSALS_IN_FLIGHT_MAX):
        futures.append(batcher.submit(light))
        proposed = slot + 1
        wait_for(lambda: len(consensus.held) == proposed, "the entry proposed", WAIT_S, poll_s=0.005)  # noqa: B023
    futures += [batcher.submit(heavy) for _ in range(3)]
    wait_for(lambda: batcher._queue.qsize() == 3, "three queued heavy appends", WAIT_S, poll_s=0.005)
    futures += [batcher.submit(light) for _ in range(5)]
    wait_for(lambda: batcher._queue.qsize() == 8, "five light ones behind them", WAIT_S, poll_s=0.005)
    sizes: list[int] = []
    while len(sizes) < PROPOSALS_IN_FLIGHT_MAX + 3:
        wait_for(lambda: bool(consensus.held), "an entry proposed", WAIT_S, poll_s=0.005)
        sizes.append(appends_in(consensus.held[0][0]))
        consensus.commit_next()
    outcomes = [f.result(timeout=10) for f in futures]
    # The slots' light ones, each heavy one alone; the last heavy one carries the light ones.
    assert sizes == [1] * PROPOSALS_IN_FLIGHT_MAX + [1, 1, 6]
    assert all(o.result.error == 0 for o in outcomes)
    batcher.stop()
    store.close()


def test_a_request_with_nothing_ahead_is_proposed_by_its_submitter_and_order_holds(tmp_path: Path) -> None:
    """With nothing in flight or queued, submit proposes at once on the calling thread (the batcher
    thread is not even started here); the next requests queue behind it and reach the consensus after
    it, in order, once the batcher runs."""
    store = Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)
    apply(store, 1, create("t", 1))
    consensus = HeldConsensus(store)
    batcher = Batcher(consensus, lambda: 1_000)
    produce = [kq_pb2.ProduceRequest(topic="t", partition=0, records=batch(v)) for v in (b"a", b"b", b"c")]
    requests = [checked_append(request) for request in produce]
    futures = [batcher.submit(requests[0])]
    assert len(consensus.held) == 1, "the first request was not proposed by its submitter"
    futures += [batcher.submit(request) for request in requests[1:]]
    assert len(consensus.held) == 1, "requests behind an entry in flight must queue for the batcher"
    batcher.start()
    consensus.commit_next()
    wait_for(lambda: len(consensus.held) == 1, "the queued requests proposed", WAIT_S, poll_s=0.005)
    assert appends_in(consensus.held[0][0]) == 2
    consensus.commit_next()
    offsets = [future.result(timeout=WAIT_S).result.base_offset for future in futures]
    assert offsets == [0, 1, 2]
    batcher.stop()
    store.close()


def test_a_request_queued_behind_a_submitter_s_entry_waits_for_its_slot(tmp_path: Path) -> None:
    """kq-batcher, idle with a slot free, takes the next queued request only to wait for a slot: a
    submitter that found nothing ahead took the free one meanwhile, and an entry proposed beside it
    would be past PROPOSALS_IN_FLIGHT_MAX."""
    store, consensus, batcher = _started(tmp_path)  # Its thread waits for a request, the slots free.
    request = checked_append(kq_pb2.ProduceRequest(topic="t", partition=0, records=batch(b"v")))
    futures = [batcher.submit(request) for _ in range(PROPOSALS_IN_FLIGHT_MAX)]  # By their submitter.
    futures.append(batcher.submit(request))  # Queued: kq-batcher takes it.
    wait_for(lambda: batcher._queue.qsize() == 0, "the batcher to take it", WAIT_S, poll_s=0.005)
    time.sleep(0.05)
    assert len(consensus.held) == PROPOSALS_IN_FLIGHT_MAX
    consensus.commit_next()
    wait_for(lambda: len(consensus.held) == PROPOSALS_IN_FLIGHT_MAX, "the queued entry", WAIT_S, poll_s=0.005)
    while consensus.held:
        consensus.commit_next()
    assert [f.result(timeout=WAIT_S).result.base_offset for f in futures] == list(range(len(futures)))
    batcher.stop()
    store.close()


def test_entries_keep_the_order_of_submission_whoever_proposes_them(tmp_path: Path) -> None:
    """Requests submitted one after another while a committer thread commits entries at random moments
    (a request finding nothing in flight is proposed by its submitter, the rest by kq-batcher once a
    slot frees): every request gets its offset in the order it was submitted, and the requests that
    waited shared entries."""
    store, consensus, batcher = _started(tmp_path)
    request = checked_append(kq_pb2.ProduceRequest(topic="t", partition=0, records=batch(b"v")))
    done = threading.Event()
    entries: list[int] = []

    def commit() -> None:
        rng = random.Random(3)
        while not done.is_set() or consensus.held:
            if consensus.held:
                entries.append(appends_in(consensus.held[0][0]))
                consensus.commit_next()
            time.sleep(rng.choice((0, 0, 0.0005, 0.002)))

    committer = threading.Thread(target=commit, daemon=True)
    committer.start()
    futures = []
    for number in range(2_000):
        futures.append(batcher.submit(request))
        if number % 7 == 0:
            time.sleep(0.0003)
    offsets = [f.result(timeout=WAIT_S).result.base_offset for f in futures]
    done.set()
    committer.join(WAIT_S)
    assert offsets == list(range(2_000))
    assert sum(entries) == 2_000 and len(entries) < 2_000  # Some waited and shared an entry.
    batcher.stop()
    store.close()


def test_a_held_request_s_parts_share_one_entry_and_a_hold_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Kafka request of several partitions submits each apart; held (`Batcher.hold`), the first is
    not proposed alone but with the rest once released, in one entry; a hold never released delays
    what waits by BATCHER_HOLD_WAIT_S at most."""
    store, consensus, batcher = _started(tmp_path)
    request = checked_append(kq_pb2.ProduceRequest(topic="t", partition=0, records=batch(b"v")))
    monkeypatch.setattr(proposals, "BATCHER_HOLD_WAIT_S", WAIT_S)
    release = batcher.hold()
    parts = [batcher.submit(request) for _ in range(3)]
    time.sleep(0.05)
    assert consensus.held == []  # Not the first part alone.
    release()
    release()  # Once: a second call does nothing.
    wait_for(lambda: len(consensus.held) == 1, "one entry", WAIT_S, poll_s=0.005)
    assert appends_in(consensus.held[0][0]) == 3
    consensus.commit_next()
    assert [f.result(timeout=WAIT_S).result.base_offset for f in parts] == [0, 1, 2]
    monkeypatch.setattr(proposals, "BATCHER_HOLD_WAIT_S", 0.05)
    batcher.hold()  # Never released.
    late = batcher.submit(request)
    wait_for(lambda: len(consensus.held) == 1, "the entry after the bound", WAIT_S, poll_s=0.005)
    consensus.commit_next()
    assert late.result(timeout=WAIT_S).result.base_offset == 3
    batcher.stop()
    store.close()


def test_queued_requests_gather_until_enough_wait_and_no_longer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind an entry in flight, kq-batcher waits for as many requests as may come: those queued and
    those the commit just answered (each client answered may send its next), BATCHER_GATHER_REQUESTS
    at most. It packs them as soon as the last arrives (not at the bound), and a request that waits
    alone waits for the bound at most."""
    monkeypatch.setattr(proposals, "BATCHER_GATHER_WAIT_S", WAIT_S)  # Only the count can end it early.
    store, consensus, batcher = _started(tmp_path)
    request = checked_append(kq_pb2.ProduceRequest(topic="t", partition=0, records=batch(b"v")))
    futures = [batcher.submit(request)]  # Nothing ahead: proposed at once.
    futures += [batcher.submit(request) for _ in range(BATCHER_GATHER_REQUESTS - 1)]  # Queued behind it.
    consensus.commit_next()  # One answered, three queued: it waits for one more (four at most).
    wait_for(lambda: batcher._gathering, "the batcher gathering", WAIT_S, poll_s=0.005)
    time.sleep(0.05)
    assert consensus.held == [], "proposed before enough requests queued"
    started = time.monotonic()
    futures.append(batcher.submit(request))  # The last one needed: the entry goes at once.
    wait_for(lambda: len(consensus.held) == 1, "the gathered entry", WAIT_S / 2, poll_s=0.005)
    assert time.monotonic() - started < WAIT_S / 2
    assert appends_in(consensus.held[0][0]) == BATCHER_GATHER_REQUESTS
    monkeypatch.setattr(proposals, "BATCHER_GATHER_WAIT_S", 0.05)
    futures.append(batcher.submit(request))  # Queued behind the gathered entry, and none follows.
    consensus.commit_next()
    wait_for(lambda: len(consensus.held) == 1, "the lone request after the bound", WAIT_S, poll_s=0.005)
    assert appends_in(consensus.held[0][0]) == 1
    monkeypatch.setattr(proposals, "BATCHER_GATHER_WAIT_S", WAIT_S)
    futures.append(batcher.submit(request))
    consensus.commit_next()  # One answered, one queued: it waits for one more, not for four.
    wait_for(lambda: batcher._gathering, "the batcher gathering", WAIT_S, poll_s=0.005)
    futures.append(batcher.submit(request))
    wait_for(lambda: len(consensus.held) == 1, "the entry of two", WAIT_S / 2, poll_s=0.005)
    assert appends_in(consensus.held[0][0]) == 2
    consensus.commit_next()
    offsets = [future.result(timeout=WAIT_S).result.base_offset for future in futures]
    assert offsets == list(range(len(futures)))
    batcher.stop()
    store.close()


def test_gather_bytes_are_packed_without_waiting_for_the_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Queued requests of BATCHER_GATHER_BYTES are packed at once: such an entry spends most of its cost
    on its bytes, and waiting for the count would only delay them."""
    monkeypatch.setattr(proposals, "BATCHER_GATHER_WAIT_S", WAIT_S)
    store, consensus, batcher = _started(tmp_path)
    small = checked_append(kq_pb2.ProduceRequest(topic="t", partition=0, records=batch(b"v")))
    values = [bytes(100_000)] * (BATCHER_GATHER_BYTES // 100_000 + 1)
    large = checked_append(kq_pb2.ProduceRequest(topic="t", partition=0, records=batch(*values)))
    futures = [batcher.submit(small), batcher.submit(large)]
    started = time.monotonic()
    consensus.commit_next()
    wait_for(lambda: len(consensus.held) == 1, "the large request's entry", WAIT_S / 2, poll_s=0.005)
    assert time.monotonic() - started < WAIT_S / 2
    consensus.commit_next()
    assert [future.result(timeout=WAIT_S).result.base_offset for future in futures] == [0, 1]
    batcher.stop()
    store.close()


def test_a_request_sent_after_the_last_commit_is_not_kept_waiting_for_its_own_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that waits for each answer sends its next request once answered: that request, queued
    since the commit, is all its client sends, so the entry goes without waiting for more (a Kafka
    request of three partitions, held while they queue, after a commit of one)."""
    monkeypatch.setattr(proposals, "BATCHER_GATHER_WAIT_S", WAIT_S)  # Only the count can end it early.
    store, consensus, batcher = _started(tmp_path)
    request = checked_append(kq_pb2.ProduceRequest(topic="t", partition=0, records=batch(b"v")))
    futures = [batcher.submit(request)]  # Nothing ahead: proposed at once.
    consensus.commit_next()  # Its client is answered, and sends its next: three partitions.
    release = batcher.hold()
    futures += [batcher.submit(request) for _ in range(3)]
    started = time.monotonic()
    release()
    wait_for(lambda: len(consensus.held) == 1, "the request's entry", WAIT_S / 2, poll_s=0.005)
    assert time.monotonic() - started < WAIT_S / 2
    assert appends_in(consensus.held[0][0]) == 3
    consensus.commit_next()
    assert [f.result(timeout=WAIT_S).result.base_offset for f in futures] == [0, 1, 2, 3]
    batcher.stop()
    store.close()
