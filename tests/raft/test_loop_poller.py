"""SwitchablePoller: PySyncObj's poller until attached, an asyncio loop's readers and writers after."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator

import pytest
from pysyncobj.poller import POLL_EVENT_TYPE

from kq.deploy.waiting import wait_for
from kq.raft.loop_poller import SwitchablePoller

READ, WRITE, ERROR = POLL_EVENT_TYPE.READ, POLL_EVENT_TYPE.WRITE, POLL_EVENT_TYPE.ERROR
WAIT_S = 5.0


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    left, right = socket.socketpair()
    left.setblocking(False)
    try:
        yield left, right
    finally:
        left.close()
        right.close()


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    running = asyncio.new_event_loop()
    thread = threading.Thread(target=running.run_forever, name="test-loop", daemon=True)
    thread.start()
    try:
        yield running
    finally:
        running.call_soon_threadsafe(running.stop)
        thread.join()
        running.close()


def on_loop(loop: asyncio.AbstractEventLoop, call: Callable[[], None]) -> None:
    """Runs `call` on the loop's thread and waits for it."""

    async def run() -> None:
        call()

    asyncio.run_coroutine_threadsafe(run(), loop).result(WAIT_S)


def test_before_attach_poll_runs_the_callbacks_as_pysyncobj_does(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    left, right = pair
    poller = SwitchablePoller()
    events: list[tuple[int, int]] = []
    poller.subscribe(left.fileno(), lambda fd, event: events.append((fd, event)), READ | ERROR)
    poller.poll(0)
    assert events == []
    right.send(b"x")
    poller.poll(WAIT_S)
    assert events == [(left.fileno(), READ)]
    poller.unsubscribe(left.fileno())
    events.clear()
    poller.poll(0)
    assert events == [] and not poller.attached


def test_attached_the_loop_runs_each_callback_then_on_event(
    pair: tuple[socket.socket, socket.socket], loop: asyncio.AbstractEventLoop
) -> None:
    """Subscriptions made before attach move onto the loop; later ones go there directly; a mask
    without WRITE drops the writer; unsubscribe drops both; poll no longer waits."""
    left, right = pair
    poller = SwitchablePoller()
    log: list[str] = []
    threads: set[int] = set()

    def callback(fd: int, event: int) -> None:
        threads.add(threading.get_ident())
        if event == READ:
            left.recv(64)
        log.append("read" if event == READ else "write")

    poller.subscribe(left.fileno(), callback, READ | ERROR)
    on_loop(loop, lambda: poller.attach(loop, lambda: log.append("tick")))
    assert poller.attached
    poller.poll(WAIT_S)  # Returns at once: the loop polls.
    right.send(b"x")
    wait_for(lambda: log[:2] == ["read", "tick"], "the read callback, then on_event", WAIT_S)
    on_loop(loop, lambda: poller.subscribe(left.fileno(), callback, READ | WRITE | ERROR))
    wait_for(lambda: "write" in log, "the writer (the socket is writable)", WAIT_S)
    on_loop(loop, lambda: poller.subscribe(left.fileno(), callback, READ | ERROR))
    on_loop(loop, log.clear)
    on_loop(loop, lambda: None)  # A turn of the loop: no writer left to fire.
    assert "write" not in log
    on_loop(loop, lambda: poller.unsubscribe(left.fileno()))
    right.send(b"y")
    on_loop(loop, lambda: None)
    assert log == []
    assert threads and threading.get_ident() not in threads  # Only ever on the loop's thread.


def test_a_peer_hang_up_reaches_the_callback_as_a_read(
    pair: tuple[socket.socket, socket.socket], loop: asyncio.AbstractEventLoop
) -> None:
    """asyncio has no error interest: a closed peer makes the socket readable, and recv says so."""
    left, right = pair
    poller = SwitchablePoller()
    received: list[bytes] = []

    def callback(fd: int, event: int) -> None:
        if not received:
            received.append(left.recv(64))
            poller.unsubscribe(fd)

    poller.subscribe(left.fileno(), callback, READ | ERROR)
    on_loop(loop, lambda: poller.attach(loop, lambda: None))
    right.close()
    wait_for(lambda: received == [b""], "the end of the stream", WAIT_S)
