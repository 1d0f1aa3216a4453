"""Channels to the nodes, leader discovery, `kq-leader` redirects and retries with backoff.

The policy lives here once: writes go to the known leader, follow redirects (at most
REDIRECTS_MAX hops in a row), and retry UNAVAILABLE / DEADLINE_EXCEEDED across the bootstrap list
with exponential backoff until `retry_timeout_s` passes. Reads go to any node (or a chosen one).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import grpc

from kq.client.errors import KqClientError, UnavailableError, from_rpc_error
from kq.proto import kq_pb2_grpc

logger = logging.getLogger(__name__)

LEADER_METADATA_KEY = "kq-leader"
REDIRECTS_MAX = 5
BACKOFF_INITIAL_S = 0.05
BACKOFF_MAX_S = 0.25  # Retries during an election are cheap; a short cap finds the new leader sooner.
RPC_TIMEOUT_S = 10.0  # One attempt; the server answers a stuck proposal within 5 s.
RETRY_TIMEOUT_S = 30.0  # All attempts of one call.
MESSAGE_BYTES_MAX = 8 * 1024 * 1024
# CANCELLED: a node shutting down cancels the calls it had queued; this client never cancels its own.
_RETRIABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.CANCELLED,
)

Response = TypeVar("Response")


def _leader_from(error: grpc.RpcError) -> str | None:
    metadata: Any = error.trailing_metadata() or ()
    for key, value in metadata:
        if key == LEADER_METADATA_KEY:
            return str(value)
    return None


class Connections:
    """One gRPC channel per node address, and the call policy."""

    def __init__(
        self,
        bootstrap: Sequence[str],
        retry_timeout_s: float = RETRY_TIMEOUT_S,
        rpc_timeout_s: float = RPC_TIMEOUT_S,
    ) -> None:
        if not bootstrap:
            raise ValueError("bootstrap needs at least one host:port")
        self.bootstrap = tuple(bootstrap)
        self.retry_timeout_s = retry_timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, kq_pb2_grpc.BrokerStub] = {}
        self._leader: str | None = None
        self._rotation = itertools.cycle(self.bootstrap)

    def stub(self, address: str) -> kq_pb2_grpc.BrokerStub:
        """The (cached) stub for `address`."""
        with self._lock:
            stub = self._stubs.get(address)
            if stub is None:
                channel = grpc.insecure_channel(
                    address,
                    options=[
                        ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
                        ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
                        ("grpc.initial_reconnect_backoff_ms", 50),
                        ("grpc.max_reconnect_backoff_ms", 500),
                        ("grpc.enable_retries", 0),
                    ],
                )
                self._channels[address] = channel
                stub = self._stubs[address] = kq_pb2_grpc.BrokerStub(channel)
            return stub

    def close(self) -> None:
        """Closes every channel."""
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
            self._stubs.clear()

    def _next_address(self) -> str:
        with self._lock:
            return next(self._rotation)

    def write(self, method: str, request: Any) -> Any:
        """Calls `method` on the leader, following redirects and retrying retriable failures."""
        deadline = time.monotonic() + self.retry_timeout_s
        address = self._leader or self._next_address()
        hops, backoff_s = 0, BACKOFF_INITIAL_S
        while True:
            try:
                response = getattr(self.stub(address), method)(request, timeout=self.rpc_timeout_s)
                self._leader = address
                return response
            except grpc.RpcError as error:
                code = error.code()
                leader = _leader_from(error) if code == grpc.StatusCode.FAILED_PRECONDITION else None
                if leader is not None and hops < REDIRECTS_MAX:
                    logger.debug("%s redirected from %s to %s", method, address, leader)
                    address, hops = leader, hops + 1
                    continue
                if code not in _RETRIABLE and leader is None:
                    raise from_rpc_error(error, address) from None
                if time.monotonic() + backoff_s >= deadline:
                    raise UnavailableError(
                        f"{method} failed on every node for {self.retry_timeout_s:.0f} s; last: "
                        f"{from_rpc_error(error, address)}"
                    ) from None
                logger.debug("%s on %s failed with %s; retrying", method, address, code)
                self._leader = None
                time.sleep(backoff_s)
                backoff_s, hops = min(backoff_s * 2, BACKOFF_MAX_S), 0
                address = self._next_address()

    def read(self, method: str, request: Any, node: str | None = None, timeout_s: float | None = None) -> Any:
        """Calls `method` on `node`, or on any node (moving on when one is unreachable)."""
        deadline = time.monotonic() + self.retry_timeout_s
        address = node or self._leader or self._next_address()
        backoff_s = BACKOFF_INITIAL_S
        while True:
            try:
                return getattr(self.stub(address), method)(request, timeout=timeout_s or self.rpc_timeout_s)
            except grpc.RpcError as error:
                code = error.code()
                if code not in _RETRIABLE or time.monotonic() + backoff_s >= deadline:
                    raise from_rpc_error(error, address) from None
                time.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, BACKOFF_MAX_S)
                if node is None:
                    address = self._next_address()

    def stream(self, method: str, request: Any, node: str | None = None) -> Iterator[Any]:
        """A server stream from `node` or any node; ends quietly when the stream ends or breaks."""
        address = node or self._leader or self._next_address()
        try:
            yield from getattr(self.stub(address), method)(request)
        except grpc.RpcError as error:
            if error.code() not in _RETRIABLE:
                raise from_rpc_error(error, address) from None
            time.sleep(BACKOFF_INITIAL_S)

    def call_each(self, method: str, request: Any, timeout_s: float) -> list[tuple[str, Any | KqClientError]]:
        """Calls `method` once on every bootstrap node: (address, response or error)."""
        results: list[tuple[str, Any | KqClientError]] = []
        for address in self.bootstrap:
            try:
                results.append((address, getattr(self.stub(address), method)(request, timeout=timeout_s)))
            except grpc.RpcError as error:
                results.append((address, from_rpc_error(error, address)))
        return results
