"""Channels to the nodes, leader discovery, `kq-leader` redirects and retries with backoff.

The policy lives here once, and it asks each failure only two things (client/errors.py): its
leader hint, and whether it is `retriable`. Writes go to the known leader and follow a leader hint
(at most CLIENT_REDIRECTS_MAX hops in a row); a retriable failure is retried across the bootstrap
list with exponential backoff until `retry_timeout_s` passes; anything else is raised at once.
Reads go to any node (or a chosen one) and retry the same way; a stream is reopened after a
retriable failure with a growing backoff.

A produce request goes on an open ProduceStream call to its node when one is idle or can be
opened (`write_produce`): one message on a stream costs both ends about a third of a unary call
(bench/README.md), and each of up to CLIENT_PRODUCE_STREAMS_MAX streams a node carries one request
at a time, so a stream's answer is always its last request's. A node that does not know the method
(an older version) gets unary calls from then on.

Thread-safe: the channel cache, the known leader, the node rotation and the idle streams are
guarded by one lock, held only to read or update them, never during a call. A watchdog thread
(running while requests wait on streams, and a second after) cancels a stream whose request is past
its deadline, which gRPC's blocking stream read cannot be given.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from kq.client.errors import KqClientError, UnavailableError, from_rpc_error
from kq.client.security import MetadataInterceptor, credential_metadata
from kq.client.tls import TlsConfig
from kq.proto import kq_pb2_grpc
from kq.proto.errors import ErrorCode
from kq.proto.limits import (
    CLIENT_BACKOFF_INITIAL_S,
    CLIENT_BACKOFF_MAX_S,
    CLIENT_CHANNELS_MAX,
    CLIENT_PRODUCE_STREAMS_MAX,
    CLIENT_REDIRECTS_MAX,
    CLIENT_RETRY_TIMEOUT_S,
    CLIENT_RPC_TIMEOUT_S,
    CLIENT_STREAM_BACKOFF_MAX_S,
    CLIENT_STREAM_WATCH_IDLE_S,
    CLIENT_STREAM_WATCH_S,
    GRPC_MESSAGE_BYTES_MAX,
    RAFT_GROUPS_MAX,
)

logger = logging.getLogger(__name__)


class ClientClosedError(KqClientError):
    """A call on a client after `close()`."""


class _ProduceStream:
    """One open ProduceStream call to one node, carrying one request at a time."""

    def __init__(self, stub: kq_pb2_grpc.BrokerStub, address: str) -> None:
        self.address = address
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()  # Read by gRPC's feeding thread.
        self._call: Any = stub.ProduceStream(iter(self._requests.get, None))
        self.deadline = 0.0  # While a request waits: when the watchdog cancels it (else 0).
        self.timed_out = False

    def exchange(self, request: Any, timeout_s: float) -> Any:
        """Sends `request` and waits for its answer; raises grpc.RpcError, or StopIteration when the
        node had ended the stream (its time limit) without reading the request."""
        self.deadline = time.monotonic() + timeout_s
        self._requests.put(request)
        try:
            return next(self._call)
        finally:
            self.deadline = 0.0

    def time_out(self) -> None:
        """Ends the request waiting past its deadline (its `exchange` raises)."""
        self.timed_out = True
        self.close()

    def close(self) -> None:
        """Cancels the call and ends the feeding thread's iterator."""
        self._requests.put(None)
        self._call.cancel()


def _watch_streams(connections: weakref.ref[Connections], closing: threading.Event) -> None:
    """The kq-client-streams thread: every CLIENT_STREAM_WATCH_S, times out the overdue requests of a
    client's produce streams; it ends when no request has waited for CLIENT_STREAM_WATCH_IDLE_S (the
    next one starts it again), or the client is closed or gone."""
    idle_since = time.monotonic()
    while not closing.wait(CLIENT_STREAM_WATCH_S):
        alive = connections()
        carry_on = alive.watch_round(idle_since) if alive is not None else None
        del alive
        if carry_on is None:
            return
        idle_since = carry_on


def _end_streams(
    idle: dict[str, list[_ProduceStream]], busy: set[_ProduceStream], closing: threading.Event
) -> None:
    """Closes every produce stream of a client and stops its watchdog (close(), or the client's end)."""
    for stream in [*busy, *(stream for streams in idle.values() for stream in streams)]:
        stream.close()
    idle.clear()
    closing.set()


class Connections:
    """One gRPC channel per node address (at most CLIENT_CHANNELS_MAX), and the call policy."""

    def __init__(
        self,
        bootstrap: Sequence[str],
        retry_timeout_s: float = CLIENT_RETRY_TIMEOUT_S,
        rpc_timeout_s: float = CLIENT_RPC_TIMEOUT_S,
        tls: TlsConfig | None = None,
        token: str | None = None,
        secret: str | None = None,
    ) -> None:
        if not bootstrap:
            raise ValueError("bootstrap needs at least one host:port")
        self.bootstrap = tuple(bootstrap)
        self.retry_timeout_s = retry_timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self._credentials = tls.channel_credentials() if tls is not None else None
        # Credentials sent with every call (broker/auth.py): a bearer token, or the cluster secret's proof.
        pairs = credential_metadata(token, secret)
        self._interceptors = (MetadataInterceptor(pairs),) if pairs else ()
        self._lock = threading.Lock()
        # Address -> (channel, stub), least recently used first. Leader hints can name addresses
        # outside the bootstrap list, so the cache is bounded.
        self._channels: OrderedDict[str, tuple[grpc.Channel, kq_pb2_grpc.BrokerStub]] = OrderedDict()
        # The leader's address of each Raft group the client wrote to (group 0: the cluster's state, and
        # a cluster's only group); at most RAFT_GROUPS_MAX (a cluster's groups are fewer).
        self._leaders: dict[int, str] = {}
        self._rotation = itertools.cycle(self.bootstrap)
        self._closed = False
        self._idle_streams: dict[str, list[_ProduceStream]] = {}  # By address; bounded as below.
        self._busy_streams: set[_ProduceStream] = set()
        # Open streams by address (at most CLIENT_PRODUCE_STREAMS_MAX; an address leaves at 0).
        self._stream_counts: dict[str, int] = {}
        # Nodes that answered ProduceStream UNIMPLEMENTED (an address leaves with its channel).
        self._unary_only: set[str] = set()
        self._watchdog: threading.Thread | None = None
        self._closing = threading.Event()
        # A client dropped without close() still ends its streams (and so gRPC's feeding threads)
        # and its watchdog, which holds it only weakly.
        self._end_streams = weakref.finalize(
            self, _end_streams, self._idle_streams, self._busy_streams, self._closing
        )

    def stub(self, address: str) -> kq_pb2_grpc.BrokerStub:
        """The (cached) stub for `address`."""
        with self._lock:
            if self._closed:
                raise ClientClosedError("the client is closed")
            cached = self._channels.get(address)
            if cached is not None:
                self._channels.move_to_end(address)
                return cached[1]
            options = [
                ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES_MAX),
                ("grpc.max_send_message_length", GRPC_MESSAGE_BYTES_MAX),
                ("grpc.initial_reconnect_backoff_ms", 50),
                ("grpc.max_reconnect_backoff_ms", 500),
                ("grpc.enable_retries", 0),
            ]
            if self._credentials is None:
                channel = grpc.insecure_channel(address, options=options)
            else:
                channel = grpc.secure_channel(address, self._credentials, options=options)
            if self._interceptors:
                channel = grpc.intercept_channel(channel, *self._interceptors)
            stub = kq_pb2_grpc.BrokerStub(channel)
            self._channels[address] = (channel, stub)
            self._evict_beyond_bound()
            return stub

    def _evict_beyond_bound(self) -> None:
        """Closes the least recently used channels to non-bootstrap nodes while over the bound.

        A call still running on an evicted channel fails as cancelled, which is retriable.
        """
        for address in list(self._channels):
            if len(self._channels) <= CLIENT_CHANNELS_MAX:
                return
            if address not in self.bootstrap:
                self._channels.pop(address)[0].close()
                self._unary_only.discard(address)
                for stream in self._idle_streams.pop(address, ()):
                    self._count_closed(address)
                    stream.close()

    def close(self) -> None:
        """Closes every channel; later calls raise ClientClosedError."""
        with self._lock:
            self._closed = True
            self._end_streams()
            for channel, _ in self._channels.values():
                channel.close()
            self._channels.clear()
            watchdog = self._watchdog
        if watchdog is not None and watchdog is not threading.current_thread():
            watchdog.join()  # It wakes on `_closing` at once.

    @property
    def leader(self) -> str | None:
        """The address that last answered a write to group 0 (the cluster's state; a cluster's only
        group), if no failure since made it doubtful."""
        return self.leader_of(0)

    def leader_of(self, group: int) -> str | None:
        """The address that last answered a write to Raft group `group`, if not made doubtful since."""
        with self._lock:
            return self._leaders.get(group)

    def _set_leader(self, address: str, group: int = 0) -> None:
        with self._lock:
            if group in self._leaders or len(self._leaders) < RAFT_GROUPS_MAX:
                self._leaders[group] = address

    def _forget_leader(self, address: str, group: int = 0) -> None:
        """Forgets `address` as `group`'s leader, unless another thread learned a newer one meanwhile."""
        with self._lock:
            if self._leaders.get(group) == address:
                del self._leaders[group]

    def _next_address(self) -> str:
        with self._lock:
            return next(self._rotation)

    def _call(self, address: str, method: str, request: Any, timeout_s: float) -> Any:
        """One attempt of `method` on `address`; a failure is raised as its KqClientError."""
        try:
            return getattr(self.stub(address), method)(request, timeout=timeout_s)
        except grpc.RpcError as error:
            raise from_rpc_error(error, address) from None

    def write(self, method: str, request: Any, timeout_s: float | None = None, group: int = 0) -> Any:
        """Calls `method` on the leader of Raft group `group` (0: the cluster's state, and a cluster's
        only group; a partition's write goes to its group, a consumer group's to its coordinator
        group), following redirects and retrying retriable failures; each attempt may take
        `timeout_s` (default: the client's RPC timeout)."""
        return self._write(
            method, lambda address, timeout: self._call(address, method, request, timeout), timeout_s, group
        )

    def write_produce(self, request: Any, group: int = 0) -> Any:
        """`write("Produce", request, group=group)`, each attempt on a ProduceStream when one is idle
        or can be opened."""
        return self._write(
            "Produce", lambda address, timeout: self._produce(address, request, timeout), group=group
        )

    def _write(
        self,
        method: str,
        attempt: Callable[[str, float], Any],
        timeout_s: float | None = None,
        group: int = 0,
    ) -> Any:
        deadline = time.monotonic() + self.retry_timeout_s
        address = self.leader_of(group) or self.leader or self._next_address()
        hops, backoff_s = 0, CLIENT_BACKOFF_INITIAL_S
        while True:
            try:
                response = attempt(address, timeout_s or self.rpc_timeout_s)
            except KqClientError as error:
                if error.leader_hint is not None and hops < CLIENT_REDIRECTS_MAX:
                    logger.debug("%s redirected from %s to %s", method, address, error.leader_hint)
                    address, hops = error.leader_hint, hops + 1
                    continue
                if not error.retriable:
                    raise
                if time.monotonic() + backoff_s >= deadline:
                    raise UnavailableError(
                        f"{method} failed on every node for {self.retry_timeout_s:.0f} s; last: {error}",
                        error_code=error.error_code,
                        status=error.status,
                    ) from error
                logger.debug("%s on %s failed (%s); retrying", method, address, type(error).__name__)
                self._forget_leader(address, group)  # Failed retriably: down, deposed, or never the leader.
                time.sleep(backoff_s)
                backoff_s, hops = min(backoff_s * 2, CLIENT_BACKOFF_MAX_S), 0
                address = self._next_address()
                continue
            self._set_leader(address, group)
            return response

    def _produce(self, address: str, request: Any, timeout_s: float) -> Any:
        """One attempt of a produce request on `address`: on a stream if one is idle or can be opened,
        else a unary call; a failure is raised as its KqClientError, as the unary call's would be."""
        stream = self._take_stream(address)
        if stream is None:
            return self._call(address, "Produce", request, timeout_s)
        try:
            response = stream.exchange(request, timeout_s)
        except StopIteration:  # The node ended the stream before reading this request: never proposed.
            self._drop_stream(stream)
            return self._call(address, "Produce", request, timeout_s)
        except grpc.RpcError as error:
            self._drop_stream(stream)
            if stream.timed_out:
                raise UnavailableError(
                    f"{address} did not answer in time", status=grpc.StatusCode.DEADLINE_EXCEEDED
                ) from None
            refused = from_rpc_error(error, address)
            if refused.error_code == ErrorCode.TOO_MANY_READERS:  # The node's stream slots are taken.
                return self._call(address, "Produce", request, timeout_s)
            if error.code() == grpc.StatusCode.UNIMPLEMENTED:  # An older node: nothing was proposed.
                with self._lock:
                    self._unary_only.add(address)
                return self._call(address, "Produce", request, timeout_s)
            raise refused from None
        with self._lock:
            self._busy_streams.discard(stream)
            if self._closed:
                stream.close()
            else:
                self._idle_streams.setdefault(address, []).append(stream)
        return response

    def _take_stream(self, address: str) -> _ProduceStream | None:
        """An idle stream to `address`, else a new one if it has fewer than CLIENT_PRODUCE_STREAMS_MAX,
        else None."""
        with self._lock:
            if self._closed or address in self._unary_only:
                return None
            idle = self._idle_streams.get(address)
            if idle:
                stream = idle.pop()
                self._busy_streams.add(stream)
                self._watch()
                return stream
            if self._stream_counts.get(address, 0) >= CLIENT_PRODUCE_STREAMS_MAX:
                return None
            self._stream_counts[address] = self._stream_counts.get(address, 0) + 1
        try:
            stream = _ProduceStream(self.stub(address), address)
        except BaseException:
            with self._lock:
                self._count_closed(address)
            raise
        with self._lock:
            self._busy_streams.add(stream)
            self._watch()
        return stream

    def _drop_stream(self, stream: _ProduceStream) -> None:
        """Forgets a stream that failed or ended, and closes it."""
        with self._lock:
            self._busy_streams.discard(stream)
            self._count_closed(stream.address)
        stream.close()

    def _count_closed(self, address: str) -> None:
        """One stream to `address` fewer (called holding `_lock`)."""
        left = self._stream_counts[address] - 1
        if left:
            self._stream_counts[address] = left
        else:
            del self._stream_counts[address]

    def watch_round(self, idle_since: float) -> float | None:
        """The watchdog's round: times out the streams whose request is past its deadline. Returns
        since when no request has waited (now, if one waits), or None once none has for
        CLIENT_STREAM_WATCH_IDLE_S: the watchdog then ends, and is forgotten."""
        now = time.monotonic()
        with self._lock:
            if self._busy_streams:
                idle_since = now
            elif now - idle_since >= CLIENT_STREAM_WATCH_IDLE_S:
                self._watchdog = None
                return None
            overdue = [s for s in self._busy_streams if s.deadline and now >= s.deadline]
        for stream in overdue:
            stream.time_out()
        return idle_since

    def _watch(self) -> None:
        """Starts the watchdog unless it runs (called holding `_lock`, with a stream taken)."""
        if self._watchdog is None:
            self._watchdog = threading.Thread(
                target=_watch_streams,
                args=(weakref.ref(self), self._closing),
                name="kq-client-streams",
                daemon=True,
            )
            self._watchdog.start()

    def read(
        self,
        method: str,
        request: Any,
        node: str | None = None,
        timeout_s: float | None = None,
        retry_timeout_s: float | None = None,
        group: int | None = None,
    ) -> Any:
        """Calls `method` on `node`, or on any node (moving on after a retriable failure); `group`: the
        Raft group whose data it reads (a partition's), first tried at that group's known leader.

        A process that does not hold the read's group names one that does (a `kq-leader` hint: its
        node's process of that group, with worker processes): the call follows it, at most
        CLIENT_REDIRECTS_MAX times. `retry_timeout_s` bounds all attempts of this call (default: the
        client's); past it, the last failure is raised.
        """
        deadline = time.monotonic() + (self.retry_timeout_s if retry_timeout_s is None else retry_timeout_s)
        address = node or (self.leader_of(group) if group is not None else None) or self.leader
        address = address or self._next_address()
        backoff_s, hops = CLIENT_BACKOFF_INITIAL_S, 0
        while True:
            try:
                return self._call(address, method, request, timeout_s or self.rpc_timeout_s)
            except KqClientError as error:
                if error.leader_hint is not None and hops < CLIENT_REDIRECTS_MAX:
                    address, hops = error.leader_hint, hops + 1
                    continue
                if not error.retriable or time.monotonic() + backoff_s >= deadline:
                    raise
                time.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, CLIENT_BACKOFF_MAX_S)
                if node is None:
                    address = self._next_address()

    def stream(
        self, method: str, next_request: Callable[[], Any], node: str | None = None, group: int | None = None
    ) -> Iterator[Any]:
        """The responses of a server stream from `node` or any node, forever: whenever the stream ends
        it is opened again with `next_request()` (which carries on from where the last one was).

        A retriable failure (a node holding its maximum of readers, a node down) is retried on the
        next bootstrap node (unless `node` is pinned), after a backoff that doubles while attempts end
        without a response, up to CLIENT_STREAM_BACKOFF_MAX_S; any other failure is raised. The call
        is cancelled when the caller stops iterating, so the node frees the stream's reader slot soon.
        A `kq-leader` hint (a process that holds the stream's `group`) is followed as `read` does.
        """
        address = node or (self.leader_of(group) if group is not None else None) or self.leader
        address = address or self._next_address()
        backoff_s, hops = CLIENT_BACKOFF_INITIAL_S, 0
        while True:
            call = getattr(self.stub(address), method)(next_request())
            error: KqClientError | None = None
            try:
                for response in call:
                    backoff_s, hops = CLIENT_BACKOFF_INITIAL_S, 0
                    yield response
            except grpc.RpcError as rpc_error:
                error = from_rpc_error(rpc_error, address)
            finally:
                call.cancel()
            if error is not None:
                if error.leader_hint is not None and hops < CLIENT_REDIRECTS_MAX:
                    address, hops = error.leader_hint, hops + 1
                    continue
                hops = 0
                if not error.retriable:
                    raise error from None
                logger.debug("%s on %s failed (%s); reopening", method, address, type(error).__name__)
                if node is None:
                    address = self._next_address()
            # Also after the node ended the stream (its time limit): a stream that keeps ending
            # without a response must not turn into a busy loop.
            time.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, CLIENT_STREAM_BACKOFF_MAX_S)

    def call_each(
        self, method: str, request: Any, timeout_s: float, addresses: Sequence[str] | None = None
    ) -> list[tuple[str, Any | KqClientError]]:
        """Calls `method` once on every node of `addresses` (default: the bootstrap nodes): (address,
        response or error)."""
        results: list[tuple[str, Any | KqClientError]] = []
        for address in self.bootstrap if addresses is None else addresses:
            try:
                results.append((address, self._call(address, method, request, timeout_s)))
            except KqClientError as error:
                results.append((address, error))
        return results
