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

So every non-OK status a kq handler answers carries `kq-error-code` (proto/errors.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from kq.broker.errors import KqError, abort_with, abort_with_code
from kq.proto.errors import ErrorCode
from kq.proto.limits import LOG_INTERVAL_S, REASON_CHARS_MAX

logger = logging.getLogger(__name__)


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
    _Interceptor = grpc.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.ServerInterceptor


class EdgeInterceptor(_Interceptor):
    """Wraps every unary-unary and unary-stream handler (kq has no client-streaming RPCs)."""

    def __init__(self, log: RateLimitedLog | None = None) -> None:
        self._log = log or RateLimitedLog(LOG_INTERVAL_S)

    def intercept_service(
        self, continuation: Callable[[Any], Any], handler_call_details: grpc.HandlerCallDetails
    ) -> Any:
        """The handler for this call, wrapped."""
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = str(handler_call_details.method)
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
        return handler

    def _unary(self, method: str, behavior: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def handle(request: Any, context: grpc.ServicerContext) -> Any:
            _refuse_undecodable(request, context)
            try:
                return behavior(request, context)
            except Exception as error:
                self._fail(method, error, context)

        return handle

    def _stream(
        self, method: str, behavior: Callable[[Any, Any], Iterator[Any]]
    ) -> Callable[[Any, Any], Iterator[Any]]:
        def handle(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            _refuse_undecodable(request, context)
            try:
                yield from behavior(request, context)
            except Exception as error:
                self._fail(method, error, context)

        return handle

    def _fail(self, method: str, error: Exception, context: grpc.ServicerContext) -> None:
        """Answers `error`: its own status for a KqError, INTERNAL (and one log line) for a bug."""
        if isinstance(error, KqError):
            abort_with(context, error)
        if _aborted(context):
            raise error  # context.abort() raised it: the status is already set.
        debug = logger.isEnabledFor(logging.DEBUG)
        self._log.report(method, "%s failed: %s: %s", method, type(error).__name__, error, exc_info=debug)
        abort_with_code(context, ErrorCode.INTERNAL_ERROR, "internal error; see the node's log")


def _refuse_undecodable(request: Any, context: grpc.ServicerContext) -> None:
    if isinstance(request, Undecodable):
        abort_with_code(context, ErrorCode.INVALID_REQUEST, f"undecodable request: {request.reason}")


def _aborted(context: grpc.ServicerContext) -> bool:
    """Whether the handler already chose a status (grpc's abort raises a bare Exception)."""
    code = getattr(context, "code", None)
    return callable(code) and code() is not None
