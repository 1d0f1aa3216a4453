"""The gRPC edge's last line: undecodable requests and unexpected exceptions, answered and logged sanely.

Every handler of the node's server is wrapped by `EdgeInterceptor`:

- Request bytes that do not parse (truncated, wrong wire types, nested too deep for protobuf) would
  make grpc log "Exception deserializing request!" with a traceback and answer INTERNAL. Here the
  deserializer never raises: the handler answers INVALID_REQUEST (INVALID_ARGUMENT) naming the
  problem, and nothing is logged (bad input is the client's business, not the operator's).
- A KqError answers its own code and status (broker/errors.py).
- Any other exception is a bug by definition: the RPC answers INTERNAL_ERROR (INTERNAL) and the node
  logs one line, at most once per LOG_INTERVAL_S per method (with a count of the ones it held back),
  with the traceback only at debug level, so no client can flood the log.

So every non-OK status a kq handler answers carries `kq-error-code` (proto/errors.py). A unary
call's deadline is recorded for its handler (broker/deadlines.py), so no wait outlives it.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from kq.broker.auth import CURRENT_PRINCIPAL, REQUIREMENTS, Security, current_principal
from kq.broker.corruption import CORRUPTION
from kq.broker.deadlines import call_deadline
from kq.broker.errors import KqError, abort_async, abort_with
from kq.broker.metrics import GRPC_REQUEST_LATENCY, observe_latency
from kq.proto.errors import ErrorCode
from kq.proto.limits import LOG_INTERVAL_S, REASON_CHARS_MAX, UNARY_CALLS_MAX
from kq.storage import CorruptRecordError

logger = logging.getLogger(__name__)
HEALTH_METHOD_PREFIX = "/grpc.health.v1.Health/"
# Coroutine handlers counted with the plain-function calls against `unary_calls_max`: each holds what
# a worker's call holds (a request waiting for its commit) without holding a thread.
COUNTED_COROUTINES = frozenset({"Produce", "ProduceMany"})
# Request streams, and the unary method each of their messages stands for: a message is authorized,
# counted and timed as a call of that method would be.
MESSAGE_METHODS = {"ProduceStream": "Produce"}


@dataclass(frozen=True, slots=True)
class Undecodable:
    """Stands for a request whose bytes did not parse; the handler answers INVALID_ARGUMENT."""

    reason: str


class RateLimitedLog:
    """One log line per key per interval; the next line says how many were held back."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._next_s: dict[str, float] = {}  # Bounded by the number of methods of the server.
        self._held: dict[str, int] = {}

    def report(self, key: str, message: str, *args: object, exc_info: bool = False) -> bool:
        """Logs `message` for `key` unless one was logged within the interval; whether it logged."""
        now = self._clock()
        with self._lock:
            if now < self._next_s.get(key, 0.0):
                self._held[key] = self._held.get(key, 0) + 1
                return False
            self._next_s[key] = now + self._interval_s
            held = self._held.pop(key, 0)
        suffix = f" ({held} more since the last line)" if held else ""
        logger.error(message + suffix, *args, exc_info=exc_info)
        return True


def safe_deserializer(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """`deserializer`, but returning Undecodable instead of raising."""
    if deserializer is None:
        return None

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as error:  # DecodeError, RecursionError, ...: all mean "bad bytes".
            text = str(error).strip().splitlines()
            return Undecodable(f"{type(error).__name__}: {text[0][:REASON_CHARS_MAX] if text else ''}")

    return deserialize


if TYPE_CHECKING:
    _Interceptor = grpc.aio.ServerInterceptor[Any, Any]
    _Context = grpc.aio.ServicerContext[Any, Any]
else:
    _Interceptor = grpc.aio.ServerInterceptor
    _Context = grpc.aio.ServicerContext


class EdgeInterceptor(_Interceptor):
    """Wraps every handler of the node's asyncio server (broker/front.py); runs on its loop.

    A handler that is a coroutine function runs on the loop. One that is a plain function (it
    proposes and waits for the commit, or reads metadata: work that blocks) runs on `workers`; it
    must not touch its context (that belongs to the loop). Those calls in progress are capped at
    `unary_calls_max` (a count kept on the loop, so no lock), together with the coroutine calls of
    COUNTED_COROUTINES: one more is answered QUEUE_FULL at once instead of queueing without bound.
    Streams must be coroutine functions that write with `context.write`. A request stream (one of
    MESSAGE_METHODS) is authenticated when it opens, and each of its messages is checked, authorized
    and counted as a call of its unary method while the handler works on it (until it asks for the
    next), so an idle stream holds no call.
    """

    def __init__(
        self,
        workers: Executor,
        log: RateLimitedLog | None = None,
        unary_calls_max: int = UNARY_CALLS_MAX,
        security: Security | None = None,
    ) -> None:
        self._workers = workers
        self._security = security  # Who may call what (broker/auth.py); None: every call is allowed.
        self._log = log or RateLimitedLog(LOG_INTERVAL_S)
        self._unary_calls_max = unary_calls_max
        self.unary_calls = 0  # Plain-function calls in progress (on the loop only).
        # Method -> (its handler, wrapped): a call's handler is wrapped once, not on every call. At
        # most one entry per method the server has (an unknown method has no handler to keep).
        self._wrapped: dict[str, tuple[Any, Any]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        """The handler for this call, wrapped."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = str(handler_call_details.method)
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, method: str, handler: Any) -> Any:
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary),
                request_deserializer=safe_deserializer(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(method, handler.unary_stream),
                request_deserializer=safe_deserializer(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._request_stream(method, handler.stream_stream),
                request_deserializer=safe_deserializer(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        return handler

    def _unary(self, method: str, behavior: Callable[[Any, Any], Any]) -> Callable[[Any, _Context], Any]:
        name = method.rsplit("/", 1)[-1]  # The latency label: one of the server's own method names.
        if inspect.iscoroutinefunction(behavior):
            counted = name in COUNTED_COROUTINES

            async def handle_on_loop(request: Any, context: _Context) -> Any:
                started_s = time.monotonic()
                await _refuse_undecodable(request, context)
                await self._admit(method, request, context)
                if counted:
                    await self._take_call(context)
                try:
                    with call_deadline(context.time_remaining()):  # Caps its waits (broker/deadlines.py).
                        return await behavior(request, context)
                except Exception as error:
                    await self._fail(method, error, context)
                finally:
                    if counted:
                        self.unary_calls -= 1
                    observe_latency(GRPC_REQUEST_LATENCY, name, started_s)

            return handle_on_loop

        async def handle_in_pool(request: Any, context: _Context) -> Any:
            started_s = time.monotonic()
            await _refuse_undecodable(request, context)
            await self._admit(method, request, context)
            await self._take_call(context)
            try:
                with call_deadline(context.time_remaining()):  # Caps its waits (broker/deadlines.py).
                    return await asyncio.get_running_loop().run_in_executor(
                        self._workers, contextvars.copy_context().run, behavior, request, context
                    )
            except Exception as error:
                await self._fail(method, error, context)
            finally:
                self.unary_calls -= 1
                observe_latency(GRPC_REQUEST_LATENCY, name, started_s)

        return handle_in_pool

    async def _take_call(self, context: _Context) -> None:
        """Counts one more call in progress, or answers QUEUE_FULL at once when `unary_calls_max` are."""
        if self.unary_calls >= self._unary_calls_max:
            await abort_async(
                context,
                ErrorCode.QUEUE_FULL,
                f"this node has its maximum of {self._unary_calls_max} calls in progress; retry later",
            )
        self.unary_calls += 1

    def _stream(self, method: str, behavior: Callable[[Any, Any], Any]) -> Callable[[Any, _Context], Any]:
        if not inspect.iscoroutinefunction(behavior):
            raise TypeError(f"{method}: a stream handler must be a coroutine function using context.write")

        async def handle(request: Any, context: _Context) -> None:
            await _refuse_undecodable(request, context)
            await self._admit(method, request, context)
            try:
                await behavior(request, context)
            except Exception as error:
                await self._fail(method, error, context)

        return handle

    def _request_stream(
        self, method: str, behavior: Callable[[Any, Any], Any]
    ) -> Callable[[AsyncIterator[Any], _Context], Any]:
        name = method.rsplit("/", 1)[-1]
        unary = MESSAGE_METHODS.get(name)
        if unary is None or not inspect.iscoroutinefunction(behavior):
            raise TypeError(f"{method}: a request stream must be a coroutine function of MESSAGE_METHODS")
        unary_method = method[: -len(name)] + unary

        async def handle(requests: AsyncIterator[Any], context: _Context) -> None:
            await self._admit(method, None, context)
            try:
                await behavior(self._messages(unary_method, requests, context), context)
            except Exception as error:
                await self._fail(method, error, context)

        return handle

    async def _messages(
        self, method: str, requests: AsyncIterator[Any], context: _Context
    ) -> AsyncIterator[Any]:
        """A request stream's messages, each checked and authorized as a call of `method`, and counted
        as a call in progress from when it is handed out until the handler asks for the next."""
        name = method.rsplit("/", 1)[-1]
        stream = aiter(requests)
        started_s: float | None = None  # The message in progress: when it was handed out.
        try:
            while True:
                if started_s is not None:
                    self.unary_calls -= 1
                    observe_latency(GRPC_REQUEST_LATENCY, name, started_s)
                    started_s = None
                try:
                    request = await anext(stream)
                except StopAsyncIteration:
                    return
                await _refuse_undecodable(request, context)
                await self._authorize(method, request, context)
                await self._take_call(context)
                started_s = time.monotonic()
                yield request
        finally:
            if started_s is not None:
                self.unary_calls -= 1

    async def _admit(self, method: str, request: Any, context: _Context) -> None:
        """Authenticates the call and checks what its method needs (broker/auth.py): UNAUTHENTICATED or
        PERMISSION_DENIED, before the handler runs. Sets the call's CURRENT_PRINCIPAL. The health
        service answers everyone (load balancers and probes hold no credentials; it tells nothing else)."""
        security = self._security
        if security is None or not security.enabled or method.startswith(HEALTH_METHOD_PREFIX):
            return  # Every call is allowed: its principal stays the default, User:ANONYMOUS.
        principal = security.authenticate(list(context.invocation_metadata() or ()), context.auth_context())
        if principal is None:
            await abort_async(
                context,
                ErrorCode.UNAUTHENTICATED,
                "this node requires a client certificate of its CA or a valid token (--token)",
            )
            return
        CURRENT_PRINCIPAL.set(principal)
        if request is not None:
            await self._authorize(method, request, context)

    async def _authorize(self, method: str, request: Any, context: _Context) -> None:
        """PERMISSION_DENIED unless the call's principal may do what `method` needs for `request`."""
        security = self._security
        if security is None or not security.enabled:
            return
        needs = REQUIREMENTS.get(method.rsplit("/", 1)[-1])
        if needs is not None:
            principal = current_principal()
            denied = security.denied(principal, needs(request))
            if denied is not None:
                await abort_async(
                    context, ErrorCode.PERMISSION_DENIED, f"{principal.name} may not {denied.describe()}"
                )

    async def _fail(self, method: str, error: Exception, context: _Context) -> None:
        """Answers `error`: its own status for a KqError, INTERNAL (and one log line) for a bug."""
        if isinstance(error, grpc.aio.AbortError):
            raise error  # context.abort() raised it: the status is already set.
        if isinstance(error, KqError):
            await abort_with(context, error)
        if isinstance(error, CorruptRecordError):  # Met by a read that did not name the partition.
            topic_id, partition, _ = error.batch or (-1, -1, -1)
            await abort_with(context, CORRUPTION.error(error, f"topic id {topic_id}", partition))
        debug = logger.isEnabledFor(logging.DEBUG)
        self._log.report(method, "%s failed: %s: %s", method, type(error).__name__, error, exc_info=debug)
        await abort_async(context, ErrorCode.INTERNAL_ERROR, "internal error; see the node's log")


async def _refuse_undecodable(request: Any, context: _Context) -> None:
    if isinstance(request, Undecodable):
        await abort_async(context, ErrorCode.INVALID_REQUEST, f"undecodable request: {request.reason}")
