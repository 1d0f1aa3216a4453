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
from kq.broker.kafka.listener import Connection, FrameStream, KafkaListener
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


class _Transport(asyncio.Transport):
    """What FrameStream calls on its transport, recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def test_an_idle_connection_holds_no_buffer_and_a_busy_one_is_paused_when_full() -> None:
    """Between requests a connection keeps no receive buffer (10,000 idle Kafka connections cost what
    they did); bytes arriving get one; a buffer full of unread frames pauses reading until the reader
    takes them, and everything arrives in order."""

    async def scenario() -> None:
        async def serve(_stream: FrameStream) -> None:
            return None

        stream = FrameStream(serve)
        transport = _Transport()
        stream.connection_made(transport)

        def feed(data: bytes) -> int:
            """Gives the stream what it takes of `data` before it pauses reading; how much that was."""
            fed = 0
            while fed < len(data) and not transport.paused:
                into = stream.get_buffer(-1)
                taken = min(len(into), len(data) - fed)
                into[:taken] = data[fed : fed + taken]
                stream.buffer_updated(taken)
                fed += taken
            return fed

        waiting = asyncio.ensure_future(stream.read_size())
        await asyncio.sleep(0)
        assert len(stream._buffer) == 0  # Waiting for a request: nothing held.
        feed(struct.pack(">i", 3) + b"abc")
        assert await waiting == 3 and await stream.read_body(3) == b"abc"
        data = b"".join(struct.pack(">i", 1000) + bytes([n]) * 1000 for n in range(40))
        fed = feed(data)
        assert transport.paused and fed <= KAFKA_RECEIVE_BUFFER_BYTES  # Full: reading stopped.

        async def feeder() -> None:
            nonlocal fed
            while fed < len(data):
                fed += feed(data[fed:])
                await asyncio.sleep(0)

        feeding = asyncio.ensure_future(feeder())
        for n in range(40):
            assert await asyncio.wait_for(stream.read_size(), WAIT_S) == 1000
            assert await stream.read_body(1000) == bytes([n]) * 1000
        await feeding
        waiting = asyncio.ensure_future(stream.read_size())
        await asyncio.sleep(0)
        assert len(stream._buffer) == 0
        waiting.cancel()

    asyncio.run(scenario())
