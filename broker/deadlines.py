"""The deadline of the call a thread or coroutine works for: every wait on a request's path is capped by it.

A gRPC client sets a deadline (`context.time_remaining()` on the server); a Kafka request carries its
own timeout (Produce's and CreateTopics' `timeout_ms`, ...). A wait with a fixed limit (a metadata
read's catch-up, CATCH_UP_WAIT_S; a proposal's commit, PROPOSAL_TIMEOUT_S; a membership change)
that outlived it held a server thread for a caller that had given up: with a 1 s deadline, 2 s of a
worker thread for every retry. So the edge records the call's deadline here when the call starts
(broker/edge.py for gRPC, broker/kafka/apis.py for Kafka requests with a timeout), and each such
wait takes `capped(limit_s)`: the named limit or the time the call has left, whichever is shorter.
When the call's time is what ran out, the wait answers as it does at its own limit (the retriable
NOT_CAUGHT_UP or NOT_COMMITTED: Kafka's REQUEST_TIMED_OUT for a write); the gRPC client has seen
DEADLINE_EXCEEDED by then, and the thread is free.

The deadline is a context variable: the edge sets it in the call's task, and a handler run on a
worker thread gets a copy of that context (EdgeInterceptor runs it in `copy_context().run`), as do
waits handed to a pool through `in_call_context`.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")

# The time.monotonic() by which the current call must be answered; None: the caller set none.
CALL_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("kq_call_deadline", default=None)


@contextmanager
def call_deadline(remaining_s: float | None) -> Iterator[None]:
    """Within the block, the current call has `remaining_s` seconds left (None: no deadline)."""
    token = CALL_DEADLINE.set(None if remaining_s is None else time.monotonic() + max(remaining_s, 0.0))
    try:
        yield
    finally:
        CALL_DEADLINE.reset(token)


def capped(limit_s: float) -> float:
    """`limit_s`, or the seconds the current call has left when fewer (never below 0)."""
    deadline = CALL_DEADLINE.get()
    if deadline is None:
        return limit_s
    return max(0.0, min(limit_s, deadline - time.monotonic()))


def call_expired() -> bool:
    """Whether the current call's deadline has passed (False without one)."""
    deadline = CALL_DEADLINE.get()
    return deadline is not None and time.monotonic() >= deadline


def in_call_context(function: Callable[..., T]) -> Callable[..., T]:
    """`function` bound to a copy of the current context, for a pool thread (the call's deadline
    with it): `loop.run_in_executor` does not carry context variables."""
    context = contextvars.copy_context()

    def run(*args: object) -> T:
        return context.run(function, *args)

    return run
