"""The Kafka listener's frame reader (broker/kafka/listener.py FrameStream), in process: frames of every
size class (inside the connection's buffer, across its end, larger than it: read straight into their
own buffer), pipelined and cut at arbitrary points by the sender, reach `answer` whole and in order;
a client that sends more than it reads is paused, not buffered without bound; the end of the stream
mid-frame closes only that connection."""

from __future__ import annotations

import asyncio
import hashlib
import random
import struct

from kq.broker.auth import Principal
from kq.broker.kafka.listener import Connection, KafkaListener
from kq.proto.limits import KAFKA_RECEIVE_BUFFER_BYTES

WAIT_S = 10.0
SIZES = (
    1,
    17,
    KAFKA_RECEIVE_BUFFER_BYTES - 5,
    KAFKA_RECEIVE_BUFFER_BYTES - 4,  # With its size prefix, exactly the buffer.
    KAFKA_RECEIVE_BUFFER_BYTES - 3,
    KAFKA_RECEIVE_BUFFER_BYTES,
    3 * KAFKA_RECEIVE_BUFFER_BYTES + 1,
    700_000,
)


async def _digest(frame: bytes | memoryview, connection: Connection) -> bytes:
    """Answers each frame with its length and SHA-256, so the client checks what arrived."""
    connection.principal = Principal("User:tester", False)
    assert isinstance(frame, (bytes, memoryview)) and (isinstance(frame, bytes) or frame.readonly)
    answer = struct.pack(">i", len(frame)) + hashlib.sha256(frame).digest()
    return struct.pack(">i", len(answer)) + answer


async def _with_listener(scenario: object) -> None:
    listener = KafkaListener("127.0.0.1:0", _digest, 4 * 1024 * 1024, on_connect=lambda _connection: None)
    port = await listener.start()
    try:
        await scenario(port)  # type: ignore[operator]
    finally:
        await listener.stop()


def test_frames_of_every_size_cut_anywhere_arrive_whole_and_in_order() -> None:
    rng = random.Random(40)
    payloads = [rng.randbytes(size) for size in SIZES for _ in range(2)]
    rng.shuffle(payloads)

    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        stream = b"".join(struct.pack(">i", len(p)) + p for p in payloads)
        position = 0
        while position < len(stream):  # Cut at random points, some inside size prefixes.
            step = rng.choice((1, 3, 5, 1000, 20_000, 300_000))
            writer.write(stream[position : position + step])
            await writer.drain()
            position += step
        for payload in payloads:
            (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), WAIT_S))
            answer = await asyncio.wait_for(reader.readexactly(size), WAIT_S)
            assert answer == struct.pack(">i", len(payload)) + hashlib.sha256(payload).digest()
        writer.close()

    asyncio.run(_with_listener(scenario))


def test_a_client_that_does_not_read_its_answers_is_paused_not_buffered() -> None:
    """Pipelined frames of buffer size with no answer read: the listener stops reading (the client's
    writes back up) rather than taking everything in; once the client reads, every answer comes."""
    count = 400
    payload = bytes(KAFKA_RECEIVE_BUFFER_BYTES - 4)

    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        frame = struct.pack(">i", len(payload)) + payload
        writes = asyncio.ensure_future(_write_all(writer, frame, count))
        await asyncio.sleep(0.5)
        for _ in range(count):
            (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), WAIT_S))
            await asyncio.wait_for(reader.readexactly(size), WAIT_S)
        await asyncio.wait_for(writes, WAIT_S)
        writer.close()

    asyncio.run(_with_listener(scenario))


async def _write_all(writer: asyncio.StreamWriter, frame: bytes, count: int) -> None:
    for _ in range(count):
        writer.write(frame)
        await writer.drain()


def test_the_end_of_the_stream_inside_a_large_frame_closes_that_connection_only() -> None:
    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(struct.pack(">i", 1) + b"a")  # Its answer binds a principal: large frames may come.
        (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), WAIT_S))
        await reader.readexactly(size)
        writer.write(struct.pack(">i", 500_000) + bytes(100_000))
        await writer.drain()
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(1), WAIT_S) == b""
        writer.close()
        other_reader, other_writer = await asyncio.open_connection("127.0.0.1", port)
        other_writer.write(struct.pack(">i", 3) + b"abc")
        (size,) = struct.unpack(">i", await asyncio.wait_for(other_reader.readexactly(4), WAIT_S))
        assert (await other_reader.readexactly(size))[:4] == struct.pack(">i", 3)
        other_writer.close()

    asyncio.run(_with_listener(scenario))
