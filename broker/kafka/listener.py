"""The Kafka listener: an asyncio TCP server on the node's front-end loop (`kq-grpc-loop`).

Each connection is served by one coroutine that reads a frame, answers it, and reads the next, so
responses leave in request order, as Kafka requires (a Kafka broker also handles one request per
connection at a time). A frame's size is checked against the configured limit before its body is
read; a frame that cannot be answered (no size, over the limit, an unknown API, undecodable bytes)
closes that connection only, with one log line per reason per interval. The handlers
(`broker/kafka/apis.py`) run on the same loop; what blocks (proposals, LMDB reads) they hand to the
front end's pools.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable

from kq.broker.edge import RateLimitedLog
from kq.proto.limits import KAFKA_CONNECTIONS_MAX, KAFKA_IDLE_CONNECTION_S, LOG_INTERVAL_S

logger = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
Answer = Callable[[bytes, "Connection"], Awaitable[bytes | None]]


class CloseConnectionError(Exception):
    """A request the broker cannot answer: the connection is closed (the message says why)."""


class Connection:
    """One client connection: its peer address (for per-connection limits and logs)."""

    def __init__(self, peer: str) -> None:
        self.peer = peer


class KafkaListener:
    """Accepts Kafka clients on `address`; `start` and `stop` run on the loop."""

    def __init__(
        self,
        address: str,
        answer: Answer,
        frame_bytes_max: int,
        on_stop: Callable[[], Awaitable[None]] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.address = address
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
        try:
            await self._requests(reader, writer, Connection(peer))
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
            async with asyncio.timeout(KAFKA_IDLE_CONNECTION_S):
                (size,) = _SIZE.unpack(await reader.readexactly(_SIZE.size))
            if not 0 < size <= self._frame_bytes_max:
                raise CloseConnectionError(
                    f"a frame of {size} bytes (the limit is {self._frame_bytes_max}, --kafka-frame-bytes-max)"
                )
            frame = await reader.readexactly(size)
            response = await self._answer(frame, connection)
            del frame
            if response is not None:
                writer.write(response)
                await writer.drain()
