"""The Kafka listener's treatment of connections without a principal, in process (loopback sockets, a
stub `answer`): the authentication deadline, the smaller frame limit before authentication, and
closing after a response that asks for it."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable

import pytest

from kq.broker.auth import Principal
from kq.broker.kafka import listener as listener_module
from kq.broker.kafka.listener import Connection, KafkaListener
from kq.proto.limits import KAFKA_UNAUTHENTICATED_FRAME_BYTES_MAX

DEADLINE_S = 0.3
WAIT_S = 5.0


async def _stub(frame: bytes | memoryview, connection: Connection) -> bytes:
    """Answers "ok"; b"login" binds a principal, b"bye" asks for the connection to close."""
    if frame == b"login":
        connection.principal = Principal("User:tester", False)
    if frame == b"bye":
        connection.close_reason = "asked to"
    return struct.pack(">i", 2) + b"ok"


def _run(scenario: Callable[[int], Awaitable[None]]) -> None:
    async def main() -> None:
        listener = KafkaListener("127.0.0.1:0", _stub, 1024 * 1024, on_connect=lambda _connection: None)
        port = await listener.start()
        try:
            await scenario(port)
        finally:
            await listener.stop()

    asyncio.run(main())


async def _call(writer: asyncio.StreamWriter, reader: asyncio.StreamReader, payload: bytes) -> bytes:
    writer.write(struct.pack(">i", len(payload)) + payload)
    await writer.drain()
    (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), WAIT_S))
    return await asyncio.wait_for(reader.readexactly(size), WAIT_S)


async def _closed(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(1), WAIT_S) == b""


@pytest.fixture(autouse=True)
def _short_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listener_module, "KAFKA_AUTHENTICATION_S", DEADLINE_S)


def test_a_connection_that_does_not_authenticate_in_time_is_closed() -> None:
    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await _call(writer, reader, b"hello") == b"ok"  # Requests are answered meanwhile.
        assert await _closed(reader)  # Then the deadline passes.
        writer.close()

    _run(scenario)


def test_an_authenticated_connection_outlives_the_deadline_and_may_send_big_frames() -> None:
    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await _call(writer, reader, b"login") == b"ok"
        await asyncio.sleep(DEADLINE_S * 2)  # The thing under test: time passing.
        assert await _call(writer, reader, b"x" * (KAFKA_UNAUTHENTICATED_FRAME_BYTES_MAX + 1)) == b"ok"
        writer.close()

    _run(scenario)


def test_a_big_frame_before_authentication_closes_the_connection() -> None:
    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(struct.pack(">i", KAFKA_UNAUTHENTICATED_FRAME_BYTES_MAX + 1))
        await writer.drain()
        assert await _closed(reader)
        writer.close()

    _run(scenario)


def test_a_handler_can_close_the_connection_after_its_response() -> None:
    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await _call(writer, reader, b"bye") == b"ok"
        assert await _closed(reader)
        writer.close()

    _run(scenario)
