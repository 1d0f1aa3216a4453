"""AppliedNotifier on a real asyncio loop: the apply thread wakes the loop only while a coroutine
watches, and a watcher is woken by entries that concern its key (broker/waiters.py)."""

from __future__ import annotations

import asyncio
import threading

from kq.broker.waiters import EVERY, AppliedNotifier
from kq.raft.results import AppendResult

WAKE_TIMEOUT_S = 5.0  # Bounds a broken test only: a wake-up comes within one turn of the loop.


class CountingLoop:
    """Stands in front of a loop's `call_soon_threadsafe` to count the apply thread's wake-ups."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.wakeups = 0

    def call_soon_threadsafe(self, callback: object, *args: object) -> object:
        self.wakeups += 1
        return self.loop.call_soon_threadsafe(callback, *args)  # type: ignore[arg-type]


def append_result(index: int, partition: tuple[str, int]) -> AppendResult:
    return AppendResult(appends=(), index=index, partitions=(partition,))


def apply_on_thread(notifier: AppliedNotifier, index: int, partition: tuple[str, int]) -> None:
    """Runs `notify` as the apply thread does: on a thread of its own."""
    thread = threading.Thread(target=notifier.notify, args=(index, append_result(index, partition)))
    thread.start()
    thread.join()


def test_no_watcher_no_wakeup_then_a_watcher_is_woken_by_its_partition_only() -> None:
    async def scenario() -> None:
        counting = CountingLoop(asyncio.get_running_loop())
        notifier = AppliedNotifier(0)
        notifier.attach(counting)  # type: ignore[arg-type]
        apply_on_thread(notifier, 1, ("t", 0))
        assert counting.wakeups == 0, "nobody watched, yet the apply thread woke the loop"
        assert notifier.applied_index() == 1  # Threads waiting on the condition still see it.

        with notifier.watching(("t", 1)) as other, notifier.watching(("t", 0)) as mine:
            apply_on_thread(notifier, 2, ("t", 0))
            await asyncio.wait_for(mine, WAKE_TIMEOUT_S)
            assert counting.wakeups == 1
            assert not other.done(), "an append to t/0 woke a watcher of t/1"
        apply_on_thread(notifier, 3, ("t", 0))
        assert counting.wakeups == 1, "the watchers left, yet the apply thread woke the loop"

    asyncio.run(scenario())


def test_a_watcher_of_every_entry_is_woken_and_close_wakes_the_rest() -> None:
    async def scenario() -> None:
        notifier = AppliedNotifier(0)
        notifier.attach(asyncio.get_running_loop())
        with notifier.watching(EVERY) as every, notifier.watching(("t", 5)) as idle:
            apply_on_thread(notifier, 1, ("u", 0))
            await asyncio.wait_for(every, WAKE_TIMEOUT_S)
            assert not idle.done()
            notifier.close()
            assert idle.done()

    asyncio.run(scenario())
