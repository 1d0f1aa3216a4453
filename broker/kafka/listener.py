"""The Kafka listener: an asyncio TCP server on the node's front-end loop (`kq-grpc-loop`).

Each connection is served by one coroutine that reads a frame, answers it, and reads the next, so
responses leave in request order, as Kafka requires (a Kafka broker also handles one request per
connection at a time). Produce requests are *pipelined*: once a request's batches are all in the
batcher's queue (`Connection.queued`; broker/kafka/produce.py calls it, for a request of several
partitions once each partition's append queued or ended), the next frame is read while it waits
for its commit, so the
requests a producer keeps in flight (librdkafka and Java: 5) can share a Raft entry instead of
taking one each; each request still reaches the batcher after the one before it (the order of a
connection's appends, which idempotent sequences rely on, is the order sent), and the answers leave
in request order (`_Pipeline`). Any other request waits until every earlier answer is written.
A frame's size is checked against the configured limit before its body is
read; a frame that cannot be answered (no size, over the limit, an unknown API, undecodable bytes)
closes that connection only, with one log line per reason per interval. The handlers
(`broker/kafka/apis.py`) run on the same loop; what blocks (proposals, LMDB reads) they hand to the
front end's pools.

Each connection has a principal (`Connection.principal`, broker/kafka/apis.py binds it): from SASL
on a `--kafka-sasl` listener, else from a verified client certificate, else User:ANONYMOUS while
`--auth` is off. Until it has one, its frames are bounded by KAFKA_UNAUTHENTICATED_FRAME_BYTES_MAX
and it must authenticate within KAFKA_AUTHENTICATION_S of connecting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from kq.broker.auth import Principal
from kq.broker.edge import RateLimitedLog
from kq.broker.kafka.sasl import SaslSession
from kq.proto.limits import (
    KAFKA_AUTHENTICATION_S,
    KAFKA_CONNECTIONS_MAX,
    KAFKA_IDLE_CONNECTION_S,
    KAFKA_PIPELINED_BYTES_MAX,
    KAFKA_PIPELINED_PRODUCES_MAX,
    KAFKA_RECEIVE_BUFFER_BYTES,
    KAFKA_UNAUTHENTICATED_FRAME_BYTES_MAX,
    LOG_INTERVAL_S,
)

logger = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
_PRODUCE = b"\x00\x00"  # A Produce request's first two bytes: its API key (0, a big-endian int16).
Answer = Callable[[bytes | memoryview, "Connection"], Coroutine[Any, Any, bytes | None]]


class CloseConnectionError(Exception):
    """A request the broker cannot answer: the connection is closed (the message says why)."""


class Connection:
    """One client connection: its peer address (for per-connection limits and logs), the common name
    of its verified client certificate, and who it is once known."""

    def __init__(self, peer: str, common_name: str = "") -> None:
        self.peer = peer
        self.common_name = common_name  # "": no client certificate (plain text, or none asked for).
        self.connected_s = time.monotonic()
        self.principal: Principal | None = None  # Bound by KafkaApis.connected or by SASL.
        self.sasl: SaslSession | None = None  # On a --kafka-sasl listener.
        self.close_reason: str | None = None  # Set by a handler: closed after its response is sent.
        # The pipelined Produce request being handed to the batcher: resolved by `queued` (or when
        # its handler returns), then the listener reads the next frame.
        self.submitted: asyncio.Future[None] | None = None

    def queued(self) -> None:
        """Called by Produce once its request's every batch is in the batcher's queue: the listener
        may read the next request, whose appends then queue behind these."""
        if self.submitted is not None and not self.submitted.done():
            self.submitted.set_result(None)


def certificate_common_name(peer_certificate: Any) -> str:
    """The subject common name of a verified peer certificate (ssl's getpeercert() dict), or ""."""
    if not isinstance(peer_certificate, dict):
        return ""
    for relative_name in peer_certificate.get("subject", ()):
        for key, value in relative_name:
            if key == "commonName" and isinstance(value, str):
                return value
    return ""


class _Pipeline:
    """A connection's pipelined Produce requests not yet answered, oldest first. Each answer is
    written as soon as it and every older one are done (a done callback: no task of its own), so
    responses leave in request order. A request that failed (CloseConnectionError, a bug) or asked
    to close the connection closes the stream; the reader then raises its failure."""

    def __init__(self, stream: FrameStream, connection: Connection) -> None:
        self._stream = stream
        self._connection = connection
        self._tasks: deque[tuple[asyncio.Task[bytes | None], int]] = deque()
        self.bytes = 0  # The frames of the requests not yet answered.
        self._failure: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None  # The reader, waiting for an answer to leave.

    def __len__(self) -> int:
        return len(self._tasks)

    def add(self, task: asyncio.Task[bytes | None], size: int) -> None:
        self._tasks.append((task, size))
        self.bytes += size
        task.add_done_callback(self._done)

    def _done(self, _task: asyncio.Task[bytes | None]) -> None:
        answers: list[bytes] = []  # Those done together (one entry's) leave in one write.
        while self._tasks and self._tasks[0][0].done():
            task, size = self._tasks.popleft()
            self.bytes -= size
            error = asyncio.CancelledError() if task.cancelled() else task.exception()  # Retrieved always.
            if self._failure is not None:
                continue  # The connection is closing: no answer after the first failure.
            if error is None:
                response = task.result()
                if response is not None:
                    answers.append(response)
                if self._connection.close_reason is not None:
                    error = CloseConnectionError(self._connection.close_reason)
            if error is not None:
                self._failure = error
        if answers:
            self._stream.write(answers[0] if len(answers) == 1 else b"".join(answers))
        if self._failure is not None:
            self._stream.close()  # After the answers before the failure.
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def shrunk(self) -> None:
        """Returns once an answer left (at once when none is pending)."""
        if self._tasks:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter

    async def emptied(self) -> None:
        """Returns once every pipelined request is answered; raises a failure among them."""
        while self._tasks:
            await self.shrunk()
        self.raise_failure()

    def raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def cancel(self) -> None:
        for task, _ in self._tasks:
            task.cancel()


class FrameStream(asyncio.BufferedProtocol):
    """One client connection's bytes: request frames read with as few copies as the socket allows,
    responses written with the transport's flow control. One coroutine (the listener's) reads and
    writes; the loop calls the protocol methods.

    asyncio's StreamReader gathered every byte into one growing bytearray and cut each frame out
    with a slice and a `bytes()` (three copies of a produce request's batches, and a shift of what
    followed). Here the socket writes into this connection's buffer of KAFKA_RECEIVE_BUFFER_BYTES
    (`get_buffer`): a frame found whole there is copied out once; a larger one gets a buffer of its
    own size that the socket then fills directly, and is handed on as a read-only view of it (kio
    reads views). What waits for the reader stays bounded: the buffer, or the one frame whose size
    the reader accepted; with no room left, reading pauses until the reader takes a frame. A
    connection waiting for its next request holds no buffer (allocated when bytes arrive), so idle
    connections cost what they did with StreamReader.
    """

    def __init__(self, serve: Callable[[FrameStream], Coroutine[Any, Any, None]]) -> None:
        self._serve = serve
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()  # KAFKA_RECEIVE_BUFFER_BYTES while bytes are in it or arriving.
        self._start = 0  # Received bytes not yet read are _buffer[_start:_end].
        self._end = 0
        self._large: bytearray | None = None  # A frame larger than the buffer, being received into.
        self._large_filled = 0
        self._waiter: asyncio.Future[None] | None = None  # The reader, waiting for bytes.
        self._eof = False
        self._lost: BaseException | None = None  # Set when the connection is gone.
        self._reading_paused = False
        self._writing_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._closed: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    # The loop's calls ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        loop = asyncio.get_running_loop()
        self._closed = loop.create_future()
        self._task = loop.create_task(self._serve(self))

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._large is not None:
            return memoryview(self._large)[self._large_filled :]
        if not self._buffer:
            self._buffer = bytearray(KAFKA_RECEIVE_BUFFER_BYTES)
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == len(self._buffer):  # Full at the end: what is unread moves to the front.
            unread = self._end - self._start
            with memoryview(self._buffer) as view:  # A view copies once (bytearray's own slice set twice).
                view[:unread] = view[self._start : self._end]
            self._start, self._end = 0, unread
        return memoryview(self._buffer)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._large is not None:
            self._large_filled += nbytes
            if self._large_filled == len(self._large):  # Whole: nothing more is read until it is taken.
                self._pause_reading()
        else:
            self._end += nbytes
            if self._start == 0 and self._end == len(self._buffer):  # No room: the reader frees some.
                self._pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        self._eof = True
        self._wake()
        return None  # The transport closes itself.

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = exc or ConnectionResetError("the connection closed")
        self._eof = True
        self._wake()
        for future in (self._drained, self._closed):
            if future is not None and not future.done():
                future.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # The reader's calls (the listener's coroutine) --------------------------------------------------

    async def read_size(self) -> int:
        """The next frame's size prefix (a signed 32-bit big-endian int, as Kafka writes it)."""
        if self._start == self._end:  # Nothing received: the buffer goes until bytes arrive.
            self._buffer = bytearray()
            self._start = self._end = 0
        while self._end - self._start < _SIZE.size:
            await self._wait_for_bytes(_SIZE.size)
        (size,) = _SIZE.unpack_from(self._buffer, self._start)
        self._start += _SIZE.size
        return int(size)

    async def read_body(self, size: int) -> bytes | memoryview:
        """The next `size` bytes: the frame whose size `read_size` gave and the caller accepted."""
        if size + _SIZE.size <= KAFKA_RECEIVE_BUFFER_BYTES:
            while self._end - self._start < size:
                await self._wait_for_bytes(size)
            with memoryview(self._buffer) as view:
                frame = bytes(view[self._start : self._start + size])
            self._start += size
            return frame
        large = bytearray(size)
        unread = self._end - self._start
        with memoryview(large) as into, memoryview(self._buffer) as buffered:
            into[:unread] = buffered[self._start : self._end]
        self._start = self._end = 0
        self._large, self._large_filled = large, unread
        try:
            while self._large_filled < size:
                await self._wait_for_bytes(size)
        finally:
            self._large = None
        return memoryview(large).toreadonly()

    def write(self, data: bytes) -> None:
        if self.transport is not None and self._lost is None:
            self.transport.write(data)

    async def drain(self) -> None:
        """Returns once the transport's write buffer is below its high mark (raises if the
        connection is gone)."""
        if self._lost is not None:
            raise ConnectionResetError("the connection closed")
        if self._writing_paused:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained
            if self._lost is not None:
                raise ConnectionResetError("the connection closed")

    def get_extra_info(self, name: str) -> Any:
        return None if self.transport is None else self.transport.get_extra_info(name)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def wait_closed(self) -> None:
        if self._closed is not None:
            await self._closed

    # Inside ---------------------------------------------------------------------------------------

    async def _wait_for_bytes(self, wanted: int) -> None:
        """Waits for more bytes; IncompleteReadError at the end of the stream before `wanted`."""
        if self._eof:
            raise asyncio.IncompleteReadError(b"", wanted)
        if self._reading_paused:
            self._reading_paused = False
            if self.transport is not None:
                self.transport.resume_reading()
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()


class KafkaListener:
    """Accepts Kafka clients on `address`; `start` and `stop` run on the loop."""

    def __init__(
        self,
        address: str,
        answer: Answer,
        frame_bytes_max: int,
        on_stop: Callable[[], Awaitable[None]] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        on_connect: Callable[[Connection], None] | None = None,
    ) -> None:
        self.address = address
        self._on_connect = on_connect  # Binds a new connection's principal (KafkaApis.connected).
        self._ssl = ssl_context  # None: plain text (Kafka's PLAINTEXT); else SSL clients only.
        self._on_stop = on_stop
        self.port = 0  # Bound by start().
        self._answer = answer
        self._frame_bytes_max = frame_bytes_max
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._log = RateLimitedLog(LOG_INTERVAL_S)

    async def start(self) -> int:
        """Binds the address and accepts connections; the bound port. OSError when it cannot bind."""
        host, _, port = self.address.rpartition(":")
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: FrameStream(self._serve), host, int(port), reuse_address=True, ssl=self._ssl
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        """Stops accepting, closes every connection and waits for their coroutines to end."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        if self._on_stop is not None:
            await self._on_stop()

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._connections)

    async def _serve(self, stream: FrameStream) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer_name = stream.get_extra_info("peername")
        peer = f"kafka:{peer_name[0]}:{peer_name[1]}" if isinstance(peer_name, tuple) else "kafka:?"
        if len(self._connections) >= KAFKA_CONNECTIONS_MAX:
            self._log.report(
                "connections", "refusing %s: %d Kafka connections open", peer, KAFKA_CONNECTIONS_MAX
            )
            stream.close()
            return
        self._connections.add(task)
        sock = stream.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = Connection(peer, certificate_common_name(stream.get_extra_info("peercert")))
        if self._on_connect is not None:
            self._on_connect(connection)
        try:
            await self._requests(stream, connection)
        except CloseConnectionError as error:
            self._log.report("close", "closing Kafka connection %s: %s", peer, error)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass  # The client went away, or sent nothing for KAFKA_IDLE_CONNECTION_S.
        except asyncio.CancelledError:
            pass  # stop(): ending here (not re-raising) keeps asyncio's stream callback from logging it.
        finally:
            self._connections.discard(task)
            stream.close()
            with contextlib.suppress(Exception):
                await stream.wait_closed()

    async def _requests(self, stream: FrameStream, connection: Connection) -> None:
        pipeline = _Pipeline(stream, connection)
        try:
            while True:
                frame = await self._read_frame(stream, connection)
                if connection.principal is not None and frame[:2] == _PRODUCE:
                    await self._pipelined(frame, connection, stream, pipeline)
                    continue
                await pipeline.emptied()
                response = await self._answer(frame, connection)
                del frame
                if response is not None:
                    stream.write(response)
                    await stream.drain()
                if connection.close_reason is not None:
                    raise CloseConnectionError(connection.close_reason)
        except (asyncio.IncompleteReadError, ConnectionError):
            pipeline.raise_failure()  # A pipelined request's failure closed the stream: that is why.
            raise
        finally:
            pipeline.cancel()

    async def _pipelined(
        self, frame: bytes | memoryview, connection: Connection, stream: FrameStream, pipeline: _Pipeline
    ) -> None:
        """Starts answering a Produce request and returns once its batches are queued (or it is
        answered), leaving the answer to `pipeline`; then, while the connection holds
        KAFKA_PIPELINED_PRODUCES_MAX requests or KAFKA_PIPELINED_BYTES_MAX of their frames, waits
        for the oldest to be answered."""
        loop = asyncio.get_running_loop()
        submitted: asyncio.Future[None] = loop.create_future()
        connection.submitted = submitted
        task = loop.create_task(self._answer(frame, connection))

        def answered(_task: asyncio.Task[bytes | None]) -> None:  # Answered, or failed, before queueing.
            if not submitted.done():
                submitted.set_result(None)

        task.add_done_callback(answered)
        pipeline.add(task, len(frame))
        del frame
        try:
            await submitted
        finally:
            connection.submitted = None
        await stream.drain()
        while len(pipeline) >= KAFKA_PIPELINED_PRODUCES_MAX or pipeline.bytes >= KAFKA_PIPELINED_BYTES_MAX:
            await pipeline.shrunk()
        pipeline.raise_failure()

    async def _read_frame(self, stream: FrameStream, connection: Connection) -> bytes | memoryview:
        """The next request frame. An authenticated connection may be idle for KAFKA_IDLE_CONNECTION_S
        (TimeoutError) between frames; one not yet authenticated has small frames and a deadline."""
        if connection.principal is not None:
            async with asyncio.timeout(KAFKA_IDLE_CONNECTION_S):
                size = await stream.read_size()
            if not 0 < size <= self._frame_bytes_max:
                raise CloseConnectionError(
                    f"a frame of {size} bytes (the limit is {self._frame_bytes_max}, --kafka-frame-bytes-max)"
                )
            return await stream.read_body(size)
        frame_bytes_max = min(self._frame_bytes_max, KAFKA_UNAUTHENTICATED_FRAME_BYTES_MAX)
        try:
            async with asyncio.timeout(connection.connected_s + KAFKA_AUTHENTICATION_S - time.monotonic()):
                size = await stream.read_size()
                if not 0 < size <= frame_bytes_max:
                    raise CloseConnectionError(
                        f"a frame of {size} bytes before authentication (the limit is {frame_bytes_max})"
                    )
                return await stream.read_body(size)
        except TimeoutError:
            raise CloseConnectionError(f"not authenticated within {KAFKA_AUTHENTICATION_S:.0f} s") from None
