"""Proposing commands and waiting for their results, with bounded waits; plus the leader's batcher.

The batcher packs concurrent produce requests into one Raft entry (group commit). It takes whatever
is queued when a proposal slot is free: under light load an entry carries one request (lowest
latency), under heavy load the queue fills while the slots are busy, so entries grow by themselves
up to ENTRY_BYTES_MAX, APPENDS_PER_ENTRY_MAX appends, or ENTRY_WORK_MAX units of apply's work (each
append's measured by the edge's check, proto/records.py WorkMeter). Its only waits are bounded: for a
slot, for a held request's parts (`hold`), and the gathering moment below.

A request that finds nothing in flight and nothing queued is proposed at once by the thread that
submits it (the serving loop), without the hand-off to `kq-batcher` and back: one thread wake-up
less for every request of a lightly loaded leader (measured: bench/README.md, "Profiles"). Once an
entry is in flight, requests queue, and the batcher packs them as before. A Kafka request of several
partitions submits each apart: it holds the batcher meanwhile (`hold`), so its parts share an entry.
Before packing queued requests the batcher gives the entry a moment to fill (`_gather`: at most
BATCHER_GATHER_WAIT_S, for the requests that may still come, or BATCHER_GATHER_BYTES), so a
producer that keeps a few requests in flight sends them in one entry rather than one an entry.

Threads: the constructor starts none; `start()` starts `kq-batcher`, the only thread that takes from
the queue (`queue.Queue`, its own lock). `_in_flight_changed` (a condition, reentrant) guards
`_in_flight` and `_queued`, which the proposal callbacks on the Raft tick thread also change, and
is held while an entry is handed to the consensus, so entries are proposed in the order requests
were submitted whichever thread proposes them. Submitters (the serving loop) wait on their futures.
`stop()` queues a sentinel: the thread proposes what was queued before it, then returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TypeVar

from kq.broker.consensus import PYSYNCOBJ_SUCCESS, Consensus
from kq.broker.deadlines import capped
from kq.broker.errors import InvalidArgumentError, KqError, ResourceExhaustedError, UnavailableError
from kq.broker.validation import CheckedAppend, check, check_command
from kq.proto import kq_pb2
from kq.proto.errors import ErrorCode
from kq.proto.limits import (
    APPENDS_PER_ENTRY_MAX,
    BATCHER_GATHER_BYTES,
    BATCHER_GATHER_REQUESTS,
    BATCHER_GATHER_WAIT_S,
    BATCHER_HOLD_WAIT_S,
    BATCHER_QUEUE_MAX,
    ENTRY_BYTES_MAX,
    ENTRY_OVERHEAD_BYTES,
    ENTRY_WORK_MAX,
    LEADER_EPOCH_MAX,
    LEADERSHIP_CHECK_S,
    PROPOSAL_TIMEOUT_S,
    PROPOSALS_IN_FLIGHT_MAX,
)
from kq.raft import commands
from kq.raft.results import AppendResult, ApplyResult, PartitionAppendResult, RejectedResult
from kq.raft.validation import append_envelope_problem

logger = logging.getLogger(__name__)

T = TypeVar("T")

THREAD_NAME = "kq-batcher"


def propose_and_wait(consensus: Consensus, command: kq_pb2.Command, timeout_s: float) -> ApplyResult:
    """Checks, proposes one command and waits for its result.

    Raises InvalidArgumentError when the shared validation refuses the command (before proposing)
    or when every replica refused the committed entry, UnavailableError when it does not commit.
    """
    check_command(command)
    future: Future[ApplyResult] = Future()

    def on_result(result: ApplyResult | None, reason: int) -> None:
        if isinstance(result, RejectedResult):
            future.set_exception(refused(result))
        elif reason == PYSYNCOBJ_SUCCESS and result is not None:
            future.set_result(result)
        else:
            future.set_exception(UnavailableError(f"proposal not committed (reason {reason}); retry"))

    consensus.propose(commands.encode(command), on_result)
    return wait_result(future, timeout_s, consensus)


def refused(result: RejectedResult) -> InvalidArgumentError:
    """The error a proposer answers when every replica refused its committed entry."""
    return InvalidArgumentError(
        f"the cluster refused the request (entry {result.index}): {result.reason}", ErrorCode.INVALID_COMMAND
    )


def wait_result(future: Future[T], timeout_s: float, consensus: Consensus) -> T:
    """The proposal's result; UnavailableError at the timeout or as soon as this node stops leading.

    A partitioned leader's proposals cannot commit, so its clients are told at once (within
    LEADERSHIP_CHECK_S) to go elsewhere instead of waiting out the timeout; the write may still
    commit if the partition heals, which idempotent retries make harmless.
    """
    timeout_s = capped(timeout_s)  # Never past the call's deadline (broker/deadlines.py).
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return future.result(timeout=min(LEADERSHIP_CHECK_S, max(deadline - time.monotonic(), 0.0)))
        except TimeoutError:
            _check_still_waiting(deadline, timeout_s, consensus)  # Raises when it is time to give up.


async def wait_async(future: Future[T], timeout_s: float, consensus: Consensus) -> T:
    """`wait_result` for a coroutine on the front-end loop: the same answers, holding no thread.

    The coroutine awaits one loop future, which `future`'s completion sets: directly when it
    completes on the loop itself (the Raft node ticks there, raft/loop_poller.py), else through one
    `call_soon_threadsafe`; a timer on the loop checks the leadership every LEADERSHIP_CHECK_S. (It
    was `wait_for(shield(wrap_future(future)))`: four turns of the loop from the commit to the
    coroutine, each a poll of the selector, where this takes one.)"""
    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()
    waiter: asyncio.Future[T] = loop.create_future()
    timeout_s = capped(timeout_s)  # Never past the call's deadline (broker/deadlines.py).
    deadline = time.monotonic() + timeout_s

    def settle(done: Future[T]) -> None:
        if waiter.done():  # Cancelled (the call ended), or the leadership check gave up first.
            return
        if done.cancelled():
            waiter.cancel()
            return
        error = done.exception()
        if error is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(done.result())

    def on_done(done: Future[T]) -> None:
        if threading.get_ident() == loop_thread:
            settle(done)
        else:
            loop.call_soon_threadsafe(settle, done)

    timer: asyncio.TimerHandle | None = None  # The pending leadership check.

    def check() -> None:
        nonlocal timer
        if waiter.done():
            return
        try:
            _check_still_waiting(deadline, timeout_s, consensus)  # Raises when it is time to give up.
        except UnavailableError as error:
            waiter.set_exception(error)
            return
        timer = loop.call_later(min(LEADERSHIP_CHECK_S, max(deadline - time.monotonic(), 0.0)), check)

    timer = loop.call_later(min(LEADERSHIP_CHECK_S, timeout_s), check)
    future.add_done_callback(on_done)
    try:
        return await waiter
    finally:
        timer.cancel()


def _check_still_waiting(deadline: float, timeout_s: float, consensus: Consensus) -> None:
    """Raises UnavailableError when a waiting proposer must give up: it lost its leadership, or time."""
    if not consensus.is_leader():
        raise UnavailableError("this node lost its leadership; the write may still commit: retry")
    if time.monotonic() >= deadline:
        raise UnavailableError(f"not committed within {timeout_s:.1f} s; it may still commit: retry")


@dataclass(frozen=True, slots=True)
class AppendOutcome:
    """One produce request's result and the Raft index of the entry that carried it."""

    result: PartitionAppendResult
    index: int


@dataclass(slots=True)
class _Pending:
    append: commands.RecordsAppend
    size_bytes: int
    work: int  # What apply's check of it costs (proto/records.py WorkMeter units).
    future: Future[AppendOutcome]


class Batcher:
    """Groups produce requests into Raft entries on the leader."""

    def __init__(
        self, consensus: Consensus, clock_ms: Callable[[], int], term: Callable[[], int] = lambda: 0
    ) -> None:
        self._consensus = consensus
        self._clock_ms = clock_ms
        # The leader's Raft term, read as each entry is built: the Kafka leader epoch of its batches
        # (raft/epochs.py; 0: none, as the in-process tests' fakes have no term).
        self._term = term
        self._queue: queue.Queue[_Pending | None] = queue.Queue(maxsize=BATCHER_QUEUE_MAX)
        self._in_flight: dict[int, float] = {}  # Proposal number -> monotonic deadline.
        self._queued = 0  # Requests put in the queue and not proposed yet (the carry included).
        self._queued_bytes = 0  # Their size_bytes and work, under _in_flight_changed like `_queued`.
        self._queued_work = 0
        self._in_flight_changed = threading.Condition()  # Reentrant: a callback may run inside propose.
        self._proposal_number = 0
        self._carry: _Pending | None = None
        self._stopping = False  # Read and written by the kq-batcher thread only.
        self._stopping_requested = False  # Set by stop(), under _in_flight_changed.
        self._holds = 0  # Requests whose parts are being queued (`hold`): no part is proposed alone.
        self._gathering = False  # kq-batcher waits for requests to join the next entry (`_gather`).
        self._gather_target = 0  # The requests it waits for (`_gather`).
        self._answered = 0  # Requests the entry that committed last carried.
        self._arrived = 0  # Requests queued since that commit (some of them its clients' next).
        self._thread: threading.Thread | None = None

    def queue_depth(self) -> int:
        """Requests waiting in the queue for the batcher thread (approximate; any thread)."""
        return self._queue.qsize()

    def start(self) -> None:
        """Starts the kq-batcher thread."""
        assert self._thread is None, "started twice"
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    async def append_async(
        self, checked: CheckedAppend, timeout_s: float, queued: Callable[[], None] | None = None
    ) -> AppendOutcome:
        """Queues one produce request and waits for its result, on the serving loop: no thread waits.
        `queued` is called once the request is in the queue (a Kafka connection then reads its next
        request: broker/kafka/listener.py, "pipelined")."""
        future = self.submit(checked)
        if queued is not None:
            queued()
        return await wait_async(future, timeout_s, self._consensus)

    def submit(self, checked: CheckedAppend) -> Future[AppendOutcome]:
        """Queues one produce request; its future resolves when the entry carrying it is applied.
        ResourceExhaustedError when the queue is full."""
        pending = _Pending(checked.append, commands.append_size(checked.append), checked.work, Future())
        assert pending.size_bytes + ENTRY_OVERHEAD_BYTES <= ENTRY_BYTES_MAX, "the edge checks request size"
        assert pending.work <= ENTRY_WORK_MAX, "the edge checked it against an entry's budget"
        with self._in_flight_changed:
            if not self._in_flight and not self._queued and not self._holds and not self._stopping_requested:
                self._propose([pending], queued=False)  # Nothing ahead: no hand-off to the batcher thread.
                return pending.future
            try:
                self._queue.put_nowait(pending)
            except queue.Full as error:
                raise ResourceExhaustedError("produce queue is full; retry later") from error
            self._queued += 1
            self._arrived += 1
            self._queued_bytes += pending.size_bytes
            self._queued_work += pending.work
            if self._gathering and self._gathered():
                self._in_flight_changed.notify()
        return pending.future

    def hold(self) -> Callable[[], None]:
        """Holds back the submitter's proposal of a request found alone, until the returned release is
        called (once; later calls do nothing): a Kafka Produce request of several partitions submits
        each partition apart, and the first, finding nothing ahead, took an entry by itself, the
        rest the next (two or three entries a request, each a Raft round on every node). Held, they
        queue, and kq-batcher packs them (with whatever else waits) into one entry at the release."""
        with self._in_flight_changed:
            self._holds += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._in_flight_changed:
                if not released:
                    released = True
                    self._holds -= 1
                    self._in_flight_changed.notify()

        return release

    def stop(self) -> None:
        """Stops the kq-batcher thread after proposing the requests already queued (call it once no
        request arrives any more). Waits at most PROPOSAL_TIMEOUT_S for a proposal slot to free."""
        with self._in_flight_changed:
            self._stopping_requested = True  # From now on every request goes through the queue.
        if self._thread is None or not self._thread.is_alive():
            return
        with contextlib.suppress(queue.Full):  # A full queue drains while the thread runs.
            self._queue.put(None, timeout=PROPOSAL_TIMEOUT_S)
        self._thread.join(timeout=PROPOSAL_TIMEOUT_S)

    def _run(self) -> None:
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            self._propose(batch, queued=True)

    def _take_batch(self) -> list[_Pending] | None:
        """The next entry's requests: once one is queued, a slot free, the request's parts queued
        (`hold`) and the entry given its moment (`_gather`), what is queued, within the entry limits;
        None to stop. The slot is waited for after the first request is taken, not before: a
        submitter may have taken a free slot meanwhile (a request with nothing ahead), and the entry
        would have gone beside it, past PROPOSALS_IN_FLIGHT_MAX."""
        first = self._carry if self._carry is not None else None if self._stopping else self._queue.get()
        self._carry = None
        if first is None:
            return None
        self._wait_for_slot()
        self._wait_for_release()
        self._gather()
        batch, size_bytes, work = [first], first.size_bytes + ENTRY_OVERHEAD_BYTES, first.work
        while len(batch) < APPENDS_PER_ENTRY_MAX:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._stopping = True  # Propose what was taken, then stop.
                break
            if size_bytes + item.size_bytes > ENTRY_BYTES_MAX or work + item.work > ENTRY_WORK_MAX:
                self._carry = item  # It starts the next entry.
                break
            batch.append(item)
            size_bytes += item.size_bytes
            work += item.work
        return batch

    def _wait_for_release(self) -> None:
        """Waits while a request's parts are being queued (`hold`), at most BATCHER_HOLD_WAIT_S: the
        rest of them then join the entry this thread is packing."""
        deadline = time.monotonic() + BATCHER_HOLD_WAIT_S
        with self._in_flight_changed:
            while self._holds and (left := deadline - time.monotonic()) > 0:
                self._in_flight_changed.wait(timeout=left)

    def _gather(self) -> None:
        """Waits, at most BATCHER_GATHER_WAIT_S, until the next entry holds what may still come for it
        (`_gathered`). Only requests that queued behind an entry in flight get here: a Kafka
        producer keeps up to 5 requests in flight on a connection and sends the next as answers come
        back; packed at once, whatever arrived during the last round took an entry (1.75 requests an
        entry under librdkafka with 16 KiB batches), and every entry costs each node a Raft round.
        It waits for the requests queued and for those the last commit's clients may still send (a
        client answered may send its next; one waiting for its answer sends nothing): as many as that
        commit answered, less those queued since it (a client that waits for each answer has sent its
        next already: that request is all that comes), BATCHER_GATHER_REQUESTS at most; submitters
        wake it once they are there."""
        deadline = time.monotonic() + BATCHER_GATHER_WAIT_S
        with self._in_flight_changed:
            coming = max(0, self._answered - self._arrived)
            self._gather_target = min(BATCHER_GATHER_REQUESTS, self._queued + coming)
            self._gathering = True
            try:
                while not self._gathered() and (left := deadline - time.monotonic()) > 0:
                    self._in_flight_changed.wait(timeout=left)
            finally:
                self._gathering = False

    def _gathered(self) -> bool:
        """Whether the queued requests (the one taken included) make an entry worth proposing now:
        the gathering's target, or BATCHER_GATHER_BYTES or half an entry's work (an entry that large
        spends most of its cost on its records, and their producer sends the next request much
        later). Called under `_in_flight_changed`."""
        return (
            self._queued >= self._gather_target
            or self._queued_bytes >= BATCHER_GATHER_BYTES
            or 2 * self._queued_work >= ENTRY_WORK_MAX
            or self._stopping_requested
        )

    def _wait_for_slot(self) -> None:
        """Blocks while PROPOSALS_IN_FLIGHT_MAX entries are uncommitted; forgets ones past their deadline."""
        with self._in_flight_changed:
            while True:
                now = time.monotonic()
                for number, deadline in list(self._in_flight.items()):
                    if deadline <= now:  # Its callback never came (lost leadership): free the slot.
                        del self._in_flight[number]
                if len(self._in_flight) < PROPOSALS_IN_FLIGHT_MAX:
                    return
                self._in_flight_changed.wait(timeout=min(self._in_flight.values()) - now)

    def _propose(self, batch: list[_Pending], queued: bool) -> None:
        """Hands `batch` to the consensus as one entry: the batcher thread's requests (`queued`), or a
        submitter's that found nothing ahead of it. Holds `_in_flight_changed` from taking the slot to
        the hand-off, so entries reach the consensus in the order their requests were submitted; the
        entry is built and encoded before (queued requests still count in `_queued` meanwhile)."""
        epoch = min(self._term(), LEADER_EPOCH_MAX)
        try:  # Each append passed append_problem at the edge; the envelope is checked as apply checks it.
            check(append_envelope_problem(len(batch), epoch))
        except InvalidArgumentError as error:
            with self._in_flight_changed:
                self._unqueue(batch, queued)
            for pending in batch:
                pending.future.set_exception(error)
            return
        # Encoded without protobuf, each batch copied once (raft/commands.py encode_append), and
        # remembered, so apply on this node takes these very values back (APPEND_ENTRIES).
        data = commands.APPEND_ENTRIES.encoded(self._clock_ms(), [pending.append for pending in batch], epoch)
        with self._in_flight_changed:
            self._proposal_number += 1
            number = self._proposal_number
            self._in_flight[number] = time.monotonic() + PROPOSAL_TIMEOUT_S
            self._unqueue(batch, queued)

            def on_result(result: ApplyResult | None, reason: int) -> None:
                with self._in_flight_changed:
                    self._in_flight.pop(number, None)
                    self._answered, self._arrived = len(batch), 0
                    self._in_flight_changed.notify()
                if reason == PYSYNCOBJ_SUCCESS and isinstance(result, AppendResult):
                    assert len(result.appends) == len(batch)
                    for pending, outcome in zip(batch, result.appends, strict=True):
                        pending.future.set_result(AppendOutcome(outcome, result.index))
                    return
                error: KqError = UnavailableError(f"entry not committed (reason {reason}); retry")
                if isinstance(result, RejectedResult):
                    error = refused(result)
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(error)

            self._consensus.propose(data, on_result)

    def _unqueue(self, batch: list[_Pending], queued: bool) -> None:
        """Counts the batcher thread's requests (`queued`) as no longer queued; under `_in_flight_changed`."""
        if queued:
            self._queued -= len(batch)
            self._queued_bytes -= sum(pending.size_bytes for pending in batch)
            self._queued_work -= sum(pending.work for pending in batch)


def wall_clock_ms() -> int:
    """Milliseconds since the epoch: the leader stamps it into commands (apply never reads a clock)."""
    return time.time_ns() // 1_000_000
