"""Waking the calls that wait for applied entries: threads (a condition) and coroutines (futures).

The apply thread (the thread Raft ticks on: the serving loop itself in a node process, `kq-raft-tick`
for an in-process RaftNode) calls `AppliedNotifier.notify` after each applied entry, with its result,
and after a snapshot restore. Two kinds of waiter listen:

- A worker thread that needs an index applied before it reads (read-your-writes, `wait_until`)
  waits on a condition; there are at most `--grpc-workers` of them.
- A coroutine on the serving loop (a stream, a long-polling Fetch, a waiting Heartbeat or JoinGroup)
  holds no thread while it waits: it registers a future under a key (`watching`) BEFORE it reads,
  then awaits the future if the read found nothing. An entry applied after the registration wakes
  it, one applied before it is visible to the read, so no wake-up is lost.

The apply thread never touches a future. It records what changed (the highest index, the
partitions an append entry touched, whether another kind of entry came) under a lock and, if no
drain is pending, schedules one with a single `call_soon_threadsafe`: however fast entries apply,
the loop runs at most one drain per turn, and each drain wakes only the futures whose key changed.
So a stream on a partition nobody writes costs nothing while others are written. While no coroutine
watches at all (a follower nobody reads from), the apply thread records nothing and never wakes the
loop: that wake-up (a write to the loop's self-pipe, then a turn of the loop) cost a third of a
follower's apply thread per entry (bench/README.md, "Profiles"). The count of watchers is kept
under the same lock, so a watcher registered after an entry's check reads what that entry wrote.

Keys: a partition `(topic, partition)` is woken by appends to it and by every other kind of entry
(a topic deleted, records trimmed); `METADATA` (group waits) by every entry that is not an append;
`EVERY` (a read waiting to catch up to an index) by every entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from kq.raft.results import AppendResult, ApplyResult

PartitionKey = tuple[str, int]
WatchKey = PartitionKey | Literal["metadata", "every"]
METADATA: WatchKey = "metadata"
EVERY: WatchKey = "every"


class AppliedNotifier:
    """What the apply thread tells the node's waiters; see the module docstring."""

    def __init__(self, applied_index: int) -> None:
        self._changed = threading.Condition()  # Guards every field below but the loop-only ones.
        self._applied_index = applied_index
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None  # The loop's thread (set with `_loop`).
        self._drain_pending = False
        self._touched: set[PartitionKey] = set()  # At most every partition of the cluster.
        self._other_entry = False  # A non-append entry (or a restore) since the last drain.
        self._watchers = 0  # Futures registered by `watching` (set on the loop, read by the apply thread).
        # Serving loop only: the futures of the waiting coroutines, by key. Each waiting coroutine
        # has one future here at a time, so the map is bounded by the node's admitted waiters.
        self._futures: dict[WatchKey, set[asyncio.Future[None]]] = {}
        self.closed = False  # Set on the loop when the node stops serving: waiters stop waiting.

    # The apply thread ---------------------------------------------------------------------------

    def notify(self, index: int, result: ApplyResult | None = None) -> None:
        """After entry `index` applied with `result` (None: a snapshot restore, which changes all)."""
        with self._changed:
            self._applied_index = max(self._applied_index, index)
            self._changed.notify_all()
            if not self._watchers:
                return  # Nobody on the loop waits; a watcher that registers later reads this entry.
            if isinstance(result, AppendResult):
                self._touched.update(result.partitions)
            else:
                self._other_entry = True
            if self._loop is None or self._drain_pending:
                return
            self._drain_pending = True
            loop = self._loop
        if threading.get_ident() == self._loop_thread:
            loop.call_soon(self._drain)  # Raft ticks on this loop: no wake-up through its self-pipe.
            return
        with contextlib.suppress(RuntimeError):  # The loop closed (the node stopped): nobody is left to wake.
            loop.call_soon_threadsafe(self._drain)

    # Worker threads -----------------------------------------------------------------------------

    def wait_until(self, index: int, timeout_s: float) -> bool:
        """Waits until `index` is applied, at most `timeout_s`; whether it is."""
        with self._changed:
            return self._changed.wait_for(lambda: self._applied_index >= index, timeout=timeout_s)

    def applied_index(self) -> int:
        """The highest index applied so far."""
        with self._changed:
            return self._applied_index

    # The serving loop ---------------------------------------------------------------------------

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wakes coroutines on `loop` from now on (called on the loop, before the server starts)."""
        with self._changed:
            self._loop = loop
            self._loop_thread = threading.get_ident()

    @contextmanager
    def watching(self, key: WatchKey) -> Iterator[asyncio.Future[None]]:
        """A future done by the next entry that concerns `key` (or by `close`); on the loop only.

        Register before reading what the wait is for; await the future (with a timeout) only if the
        read found nothing. The future is forgotten when the block ends.
        """
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.closed:
            future.set_result(None)
        futures = self._futures.setdefault(key, set())
        futures.add(future)
        with self._changed:
            self._watchers += 1
        try:
            yield future
        finally:
            with self._changed:
                self._watchers -= 1
            futures.discard(future)
            if not futures and self._futures.get(key) is futures:
                del self._futures[key]

    def close(self) -> None:
        """The node stops serving (on the loop only): every waiter is woken, and none waits again."""
        self.closed = True
        self._wake_all()

    def _wake_all(self) -> None:
        for futures in self._futures.values():
            _wake(futures)

    def _drain(self) -> None:
        """On the loop: wakes the futures of what changed since the last drain."""
        with self._changed:
            self._drain_pending = False
            touched, self._touched = self._touched, set()
            other, self._other_entry = self._other_entry, False
        if other:
            self._wake_all()
            return
        _wake(self._futures.get(EVERY, ()))
        for key in touched:
            _wake(self._futures.get(key, ()))


def _wake(futures: set[asyncio.Future[None]] | tuple[()]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)


async def wait_for_wake(future: asyncio.Future[None], timeout_s: float) -> None:
    """Awaits a `watching` future for at most `timeout_s` (the future itself is never cancelled)."""
    if timeout_s > 0 and not future.done():
        await asyncio.wait((future,), timeout=timeout_s)
