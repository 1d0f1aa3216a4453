"""What the many-clients benchmarks (bench/streams.py, bench/connections.py) and their system test
share: an asyncio loop on a thread of its own that holds thousands of grpc.aio calls, and
one-in-flight timed sends."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import grpc

from kq.client import KqClient

LOOP_STOP_TIMEOUT_S = 10.0

T = TypeVar("T")


class BackgroundLoop:
    """An asyncio loop running on a daemon thread named `name`, driven from the benchmark's thread."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float, what: str) -> T:
        """Runs a coroutine on the loop and waits at most `timeout_s` for it (then cancels it)."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"{what} took longer than {timeout_s} s") from None

    def stop_loop(self) -> None:
        """Stops the loop and joins its thread (bounded); closes the loop once the thread is gone."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=LOOP_STOP_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()


class StreamHolder(BackgroundLoop):
    """A BackgroundLoop holding grpc.aio streams: their channels, calls and consuming tasks, which
    subclasses append to on the loop, and `close` cancels and closes together."""

    def __init__(self, name: str, close_timeout_s: float) -> None:
        super().__init__(name)
        self._close_timeout_s = close_timeout_s
        self._channels: list[grpc.aio.Channel] = []
        self._calls: list[Any] = []
        self._tasks: list[asyncio.Task[None]] = []

    def close(self) -> None:
        """Cancels every stream and closes every channel (bounded)."""
        self.run(self._close(), self._close_timeout_s, "closing the streams")

    async def _close(self) -> None:
        for call in self._calls:
            call.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self._close_timeout_s / 2)
        for channel in self._channels:
            await channel.close(None)
        self._calls, self._tasks, self._channels = [], [], []


def timed_sends(
    sender: KqClient, topic: str, value: bytes, duration_s: float, warmup: int = 0
) -> tuple[list[float], int]:
    """`warmup` untimed sends, then one-record sends with one in flight for `duration_s`: the
    latencies in ms and the errors (counted, never hidden)."""
    errors = 0
    for _ in range(warmup):
        try:
            sender.send(topic, value)
        except Exception:  # Counted, as the timed ones are.
            errors += 1
    latencies: list[float] = []
    until = time.monotonic() + duration_s
    while time.monotonic() < until:
        sent = time.perf_counter()
        try:
            sender.send(topic, value)
        except Exception:  # Counted: the benchmark reports errors, never hides them.
            errors += 1
            continue
        latencies.append((time.perf_counter() - sent) * 1000)
    return latencies, errors
