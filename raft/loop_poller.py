"""PySyncObj's poller interface, movable onto an asyncio event loop: the Raft node on the serving loop.

PySyncObj reads its sockets (kq's peer transport, raft/transport.py, and the pipe that wakes it for a
proposal) through a poller object: `subscribe(fd, callback, mask)`, `unsubscribe(fd)` and
`poll(timeout)`, which waits for events and calls each socket's callback; `doTick` polls once after
its Raft work. `SwitchablePoller` keeps every subscription and, until `attach`, hands them to
PySyncObj's own `PollPoller`: a node ticked by its own thread (`RaftNode.start`) runs as it always
did. `attach(loop, on_event)` moves every subscription onto `loop` (`add_reader`/`add_writer`); from
then on `poll` returns at once, the loop calls each socket's callback when it is ready and then
`on_event()`, with which the node asks for a tick (`RaftNode.start_on_loop`). Everything after
`attach` runs on the loop's thread: subscriptions change only inside those callbacks and ticks.

Why: on the leader, a request crossed from the serving loop to the tick thread (a pipe write, then
that thread's wake-up and a wait for the GIL) and its answer crossed back (the loop's self-pipe, the
same waits): bench/README.md, "Sixth round", has the timeline. One thread for both does neither.

Events: a mask's READ becomes a reader, WRITE a writer. asyncio has no error interest: an error or
hang-up on a socket makes it readable (epoll reports it to every registered interest), and the
socket's callback then sees the failure in its `recv`, as it does after PySyncObj's ERROR event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from pysyncobj.poller import POLL_EVENT_TYPE, createPoller

EventCallback = Callable[[int, int], None]

_READ = POLL_EVENT_TYPE.READ
_WRITE = POLL_EVENT_TYPE.WRITE


class SwitchablePoller:
    """PySyncObj's poller; see the module docstring."""

    def __init__(self, poller_type: str = "auto") -> None:
        self._own: Any = createPoller(poller_type)  # PySyncObj's PollPoller (or SelectPoller).
        self._subscriptions: dict[int, tuple[EventCallback, int]] = {}  # fd -> (callback, mask).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_event: Callable[[], None] = _nothing

    @property
    def attached(self) -> bool:
        """Whether the subscriptions live on an asyncio loop."""
        return self._loop is not None

    def subscribe(self, descriptor: int, callback: EventCallback, mask: int) -> None:
        """PySyncObj's `subscribe`: (re)subscribes `descriptor` with `mask` (READ, WRITE, ERROR)."""
        self._subscriptions[descriptor] = (callback, mask)
        if self._loop is None:
            self._own.subscribe(descriptor, callback, mask)
        else:
            self._register(self._loop, descriptor, mask)

    def unsubscribe(self, descriptor: int) -> None:
        """PySyncObj's `unsubscribe` (before the descriptor is closed)."""
        self._subscriptions.pop(descriptor, None)
        if self._loop is None:
            self._own.unsubscribe(descriptor)
        else:
            self._loop.remove_reader(descriptor)
            self._loop.remove_writer(descriptor)

    def poll(self, timeout_s: float) -> None:
        """PySyncObj's `poll`: waits up to `timeout_s` and runs the ready callbacks; attached, the loop
        does both, so this returns at once."""
        if self._loop is None:
            self._own.poll(timeout_s)

    def attach(self, loop: asyncio.AbstractEventLoop, on_event: Callable[[], None]) -> None:
        """Moves every subscription onto `loop` (call it on the loop's thread); `on_event()` runs
        after each socket callback the loop makes."""
        assert self._loop is None, "attached twice"
        self._loop, self._on_event = loop, on_event
        for descriptor, (_callback, mask) in self._subscriptions.items():
            self._own.unsubscribe(descriptor)
            self._register(loop, descriptor, mask)

    def _register(self, loop: asyncio.AbstractEventLoop, descriptor: int, mask: int) -> None:
        if mask & _READ:
            loop.add_reader(descriptor, self._ready, descriptor, _READ)
        else:
            loop.remove_reader(descriptor)
        if mask & _WRITE:
            loop.add_writer(descriptor, self._ready, descriptor, _WRITE)
        else:
            loop.remove_writer(descriptor)

    def _ready(self, descriptor: int, event: int) -> None:
        subscription = self._subscriptions.get(descriptor)
        if subscription is not None:
            subscription[0](descriptor, event)
        self._on_event()


def _nothing() -> None:
    pass
