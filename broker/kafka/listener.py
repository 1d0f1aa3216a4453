"""The Kafka listener: an asyncio TCP server on the node's front-end loop (`kq-grpc-loop`).

Each connection is served by one coroutine that reads a frame, answers it, and reads the next, so
responses leave in request order, as Kafka requires (a Kafka broker also handles one request per
connection at a time). A frame's size is checked against the configured limit before its body is
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
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from kq.broker.auth import Principal
from kq.broker.edge import RateLimitedLog
from kq.proto.limits import (
    KAFKA_AUTHENTICATION_S,
    KAFKA_CONNECTIONS_MAX,
    KAFKA_IDLE_CONNECTION_S,
    KAFKA_UNAUTHENTICATED_FRAME_BYTES_MAX,
    LOG_INTERVAL_S,
)

if TYPE_CHECKING:
    from kq.broker.kafka.sasl import SaslSession

logger = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
Answer = Callable[[bytes, "Connection"], Awaitable[bytes | None]]


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


def certificate_common_name(peer_certificate: Any) -> str:
    """The subject common name of a verified peer certificate (ssl's getpeercert() dict), or ""."""
    if not isinstance(peer_certificate, dict):
        return ""
    for relative_name in peer_certificate.get("subject", ()):
        for key, value in relative_name:
            if key == "commonName" and isinstance(value, str):
                return value
    return ""


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
        self._server = await asyncio.start_server(
            self._serve, host, int(port), reuse_address=True, limit=64 * 1024, ssl=self._ssl
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

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer_name = writer.get_extra_info("peername")
        peer = f"kafka:{peer_name[0]}:{peer_name[1]}" if isinstance(peer_name, tuple) else "kafka:?"
        if len(self._connections) >= KAFKA_CONNECTIONS_MAX:
            self._log.report(
                "connections", "refusing %s: %d Kafka connections open", peer, KAFKA_CONNECTIONS_MAX
            )
            writer.close()
            return
        self._connections.add(task)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = Connection(peer, certificate_common_name(writer.get_extra_info("peercert")))
        if self._on_connect is not None:
            self._on_connect(connection)
        try:
            await self._requests(reader, writer, connection)
        except CloseConnectionError as error:
            self._log.report("close", "closing Kafka connection %s: %s", peer, error)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass  # The client went away, or sent nothing for KAFKA_IDLE_CONNECTION_S.
        except asyncio.CancelledError:
            pass  # stop(): ending here (not re-raising) keeps asyncio's stream callback from logging it.
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: Connection
    ) -> None:
        while True:
            frame = await self._read_frame(reader, connection)
            response = await self._answer(frame, connection)
            del frame
            if response is not None:
                writer.write(response)
                await writer.drain()
            if connection.close_reason is not None:
                raise CloseConnectionError(connection.close_reason)

    async def _read_frame(self, reader: asyncio.StreamReader, connection: Connection) -> bytes:
        """The next request frame. An authenticated connection may be idle for KAFKA_IDLE_CONNECTION_S
        (TimeoutError) between frames; one not yet authenticated has small frames and a deadline."""
        if connection.principal is not None:
            async with asyncio.timeout(KAFKA_IDLE_CONNECTION_S):
                (size,) = _SIZE.unpack(await reader.readexactly(_SIZE.size))
            if not 0 < size <= self._frame_bytes_max:
                raise CloseConnectionError(
                    f"a frame of {size} bytes (the limit is {self._frame_bytes_max}, --kafka-frame-bytes-max)"
                )
            return await reader.readexactly(size)
        frame_bytes_max = min(self._frame_bytes_max, KAFKA_UNAUTHENTICATED_FRAME_BYTES_MAX)
        try:
            async with asyncio.timeout(connection.connected_s + KAFKA_AUTHENTICATION_S - time.monotonic()):
                (size,) = _SIZE.unpack(await reader.readexactly(_SIZE.size))
                if not 0 < size <= frame_bytes_max:
                    raise CloseConnectionError(
                        f"a frame of {size} bytes before authentication (the limit is {frame_bytes_max})"
                    )
                return await reader.readexactly(size)
        except TimeoutError:
            raise CloseConnectionError(f"not authenticated within {KAFKA_AUTHENTICATION_S:.0f} s") from None
