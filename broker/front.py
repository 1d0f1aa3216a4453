"""The node's gRPC front end: one asyncio loop (grpc.aio) on its own thread, and two bounded pools.

Why a loop: a call that waits for records (a stream, a long-polling Fetch, a waiting Heartbeat or
JoinGroup) used to hold one of the node's worker threads for its whole wait, so a few dozen
consumers took every thread and the node stopped answering anything else (issue 18). On the loop a
waiting call is a coroutine and a future (`broker/waiters.py`): thousands cost memory, not threads,
and the node's thread count does not depend on how many clients it serves.

What runs where:
- `kq-grpc-loop` runs the grpc.aio server and every handler's coroutine: the edge checks
  (`broker/edge.py`), admission, the waits, writing stream messages.
- `kq-grpc_<n>` (`--grpc-workers`) runs the handlers that are plain functions: everything that
  proposes through Raft and waits for the commit (Produce, topic and group writes) or reads
  metadata. They block a worker thread for a bounded time (PROPOSAL_TIMEOUT_S, CATCH_UP_WAIT_S);
  the edge caps how many such calls may be in progress (UNARY_CALLS_MAX), beyond which it answers
  QUEUE_FULL at once instead of queueing without bound.
- `kq-read_<n>` (READ_WORKERS) runs the record reads of the waiting calls (LMDB read
  transactions), so a burst of streams waking up never queues a produce behind it.

The loop thread starts first (`start_loop`: the node's Raft ticks on it, raft/loop_poller.py);
start builds the server on the loop (grpc.aio binds a server to the loop it is made on) and binds
the port; stop marks the node NOT_SERVING, refuses new calls, lets running ones finish for
SHUTDOWN_GRACE_S and cancels the rest, then joins both pools, so no handler is left running when the
caller closes what they use; `close_loop` ends the loop once nothing else runs on it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent import futures
from typing import Any, Protocol, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kq.broker.auth import Security
from kq.broker.edge import EdgeInterceptor
from kq.broker.waiters import AppliedNotifier
from kq.proto.limits import (
    GRPC_CONCURRENT_RPCS_MAX,
    GRPC_KEEPALIVE_TIME_S,
    GRPC_KEEPALIVE_TIMEOUT_S,
    GRPC_MESSAGE_BYTES_MAX,
    GRPC_PENDING_CALLS_MAX,
    LOOP_CALL_TIMEOUT_S,
    READ_WORKERS,
    SHUTDOWN_GRACE_S,
)

LOOP_THREAD = "kq-grpc-loop"
POLLER_THREAD = "kq-grpc-poll"  # grpc.aio's completion-queue poller, unnamed ("Thread-N (_poll_wrapper)").
WORKER_PREFIX = "kq-grpc"  # The pool's threads are kq-grpc_0, kq-grpc_1, ...
READ_PREFIX = "kq-read"

T = TypeVar("T")
Registration = Callable[[grpc.aio.Server], None]


class Listener(Protocol):
    """Another server on the loop (the Kafka listener): started after gRPC, stopped before it."""

    address: str

    async def start(self) -> int:
        """Binds and serves; the bound port (OSError when it cannot bind)."""

    async def stop(self) -> None:
        """Stops serving and ends every connection."""


class FrontEndError(Exception):
    """The server could not start (its address cannot be bound)."""


class FrontEnd:
    """The gRPC server of one node; constructing it starts nothing, `start()` binds and serves."""

    def __init__(
        self,
        address: str,
        workers: int,
        notifier: AppliedNotifier,
        services: list[Registration],
        listeners: list[Listener] | None = None,
        credentials: grpc.ServerCredentials | None = None,
        security: Security | None = None,
    ) -> None:
        self.address = address
        self._credentials = credentials  # None: plain text (see broker/config.py `ServerTls`).
        self.workers = futures.ThreadPoolExecutor(workers, thread_name_prefix=WORKER_PREFIX)
        self.reads = futures.ThreadPoolExecutor(READ_WORKERS, thread_name_prefix=READ_PREFIX)
        self.edge = EdgeInterceptor(self.workers, security=security)
        self.health = health.aio.HealthServicer()  # type: ignore[attr-defined]  # Set at import, not typed.
        self.port = 0  # Bound by start().
        self._notifier = notifier
        self._services = services
        self.listeners = listeners if listeners is not None else []
        self.listener_ports: list[int] = []  # Bound by start(), in the order of `listeners`.
        self._serving_health: bool | None = None
        self._loop = asyncio.new_event_loop()
        self._stop_requested: asyncio.Event | None = None
        self._loop_running = threading.Event()
        self._serving: futures.Future[None] | None = None  # `_serve` on the loop, while it serves.
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=LOOP_THREAD, daemon=True)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The serving loop (the Raft node ticks on it too: `RaftNode.start_on_loop`)."""
        return self._loop

    def start_loop(self) -> asyncio.AbstractEventLoop:
        """Starts the loop thread, serving nothing yet (`start` serves), and returns its loop; once."""
        if not self._thread.is_alive():
            self._thread.start()
            self._loop_running.wait()
        return self._loop

    def start(self) -> int:
        """Binds the address and serves (starting the loop thread first if need be); the bound port.
        FrontEndError if the address cannot be bound (the loop runs on until `close_loop`)."""
        self.start_loop()
        before = set(threading.enumerate())
        self._serving = asyncio.run_coroutine_threadsafe(self._serve_reporting(), self._loop)
        self._ready.wait()
        for thread in set(threading.enumerate()) - before:
            if thread.name.endswith("(_poll_wrapper)"):
                thread.name = POLLER_THREAD
        if self._failure is not None:
            self._serving = None
            self._close_pools()
            if isinstance(self._failure, FrontEndError) and self.port:
                raise self._failure
            raise FrontEndError(f"cannot serve gRPC on {self.address}: {self._failure}")
        return self.port

    def set_serving(self, serving: bool) -> None:
        """The health service's overall status (from any thread; only a change reaches the loop)."""
        if serving == self._serving_health or not self._thread.is_alive():
            return
        self._serving_health = serving
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        self.call(self.health.set("", status))

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Runs `coroutine` on the loop from another thread and returns its result (bounded wait)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(LOOP_CALL_TIMEOUT_S)

    def stop(self) -> None:
        """Stops serving (see the module docstring) and joins both pools; the loop runs on for what
        else runs on it (the Raft node) until `close_loop`."""
        serving, self._serving = self._serving, None
        if serving is not None and self._stop_requested is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop_requested.set)
            serving.result()
        self._close_pools()

    def close_loop(self) -> None:
        """Ends the loop and joins its thread (after `stop`, and after whatever else ran on it)."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        if not self._loop.is_closed():
            self._loop.close()

    def _close_pools(self) -> None:
        # A cancelled call's function runs on until it returns (a proposal within PROPOSAL_TIMEOUT_S,
        # which the batcher and Raft, still running, complete): the caller's store outlives it.
        self.workers.shutdown(wait=True)
        self.reads.shutdown(wait=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._loop_running.set)
        self._loop.run_forever()

    async def _serve_reporting(self) -> None:
        try:
            await self._serve()
        except BaseException as error:  # Reported to start(); a failure after it is a bug: re-raised.
            if self._ready.is_set():
                raise
            self._failure = error
            self._ready.set()

    async def _serve(self) -> None:
        self._stop_requested = asyncio.Event()
        self._notifier.attach(self._loop)
        server = grpc.aio.server(
            interceptors=[self.edge],
            maximum_concurrent_rpcs=GRPC_CONCURRENT_RPCS_MAX,
            options=[
                ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES_MAX),
                ("grpc.max_send_message_length", GRPC_MESSAGE_BYTES_MAX),
                ("grpc.so_reuseport", 0),
                # Calls accepted but not yet given to a handler: a burst of new streams must wait here,
                # not be cancelled (gRPC's default is far below the readers one node admits).
                ("grpc.server.max_pending_requests", GRPC_PENDING_CALLS_MAX),
                ("grpc.server.max_pending_requests_hard_limit", GRPC_PENDING_CALLS_MAX),
                ("grpc.keepalive_time_ms", int(GRPC_KEEPALIVE_TIME_S * 1000)),
                ("grpc.keepalive_timeout_ms", int(GRPC_KEEPALIVE_TIMEOUT_S * 1000)),
            ],
        )
        for register in self._services:
            register(server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        try:
            if self._credentials is None:
                self.port = server.add_insecure_port(self.address)
            else:
                self.port = server.add_secure_port(self.address, self._credentials)
        except RuntimeError as error:  # grpc.aio raises where the sync server answered port 0.
            raise FrontEndError(str(error)) from error
        if self.port == 0:
            raise FrontEndError("the address is taken or not local")
        await server.start()
        for listener in self.listeners:
            try:
                self.listener_ports.append(await listener.start())
            except OSError as error:
                await server.stop(None)
                raise FrontEndError(f"cannot listen on {listener.address}: {error}") from error
        self._ready.set()
        await self._stop_requested.wait()
        await self.health.enter_graceful_shutdown()
        self._notifier.close()  # Waiting calls answer what they have instead of waiting on.
        for listener in self.listeners:
            await listener.stop()
        await server.stop(SHUTDOWN_GRACE_S)
