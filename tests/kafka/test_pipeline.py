"""The Kafka listener's pipelined Produce requests (broker/kafka/listener.py `_Pipeline`), in process
with a scripted `answer`: the next frame is read only once the request before it has queued its
batches (so a connection's appends keep the order sent), answers leave in request order whatever
order they finish in, any other request waits for every earlier answer, the pipeline's depth is
bounded, and a request that fails closes the connection after the answers before it. Then a real
idempotent producer with many small requests in flight: every record once, in the order sent."""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import Awaitable, Callable

from confluent_kafka import Producer
from kafka import KafkaProducer

from kq.broker.auth import Principal
from kq.broker.kafka.listener import CloseConnectionError, Connection, KafkaListener
from kq.deploy.cluster import LocalCluster
from kq.proto.limits import KAFKA_PIPELINED_PRODUCES_MAX
from tests.kafka.test_clients import _consume_confluent, _topic

WAIT_S = 10.0


def _frame(api_key: int, number: int) -> bytes:
    """A frame whose API key is `api_key` (0: Produce), numbered in its body."""
    body = struct.pack(">hi", api_key, number)
    return struct.pack(">i", len(body)) + body


class Script:
    """`answer` for the listener: records when each request started and queued, and holds each
    request's answer until the test releases it."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.release: dict[int, asyncio.Event] = {}
        self.fail: set[int] = set()

    def gate(self, number: int) -> asyncio.Event:
        return self.release.setdefault(number, asyncio.Event())

    async def answer(self, frame: bytes | memoryview, connection: Connection) -> bytes | None:
        connection.principal = Principal("User:tester", False)
        api_key, number = struct.unpack(">hi", bytes(frame))
        self.events.append(("start", number))
        if api_key == 0:
            await asyncio.sleep(0)  # Queued after a turn of the loop, as an append checked on a worker.
            self.events.append(("queued", number))
            connection.queued()
            await self.gate(number).wait()
        if number in self.fail:
            raise CloseConnectionError(f"request {number} failed")
        self.events.append(("answered", number))
        answer = struct.pack(">i", number)
        return struct.pack(">i", len(answer)) + answer


async def _with_listener(script: Script, scenario: Callable[[int], Awaitable[None]]) -> None:
    listener = KafkaListener("127.0.0.1:0", script.answer, 1024 * 1024, on_connect=lambda _connection: None)
    port = await listener.start()
    try:
        await asyncio.wait_for(scenario(port), WAIT_S * 3)
    finally:
        await listener.stop()


async def _answers(reader: asyncio.StreamReader, count: int) -> list[int]:
    numbers = []
    for _ in range(count):
        await asyncio.wait_for(reader.readexactly(4), WAIT_S)
        numbers.append(struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), WAIT_S))[0])
    return numbers


async def _connected(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection whose first request (ApiVersions, answered alone) bound its principal, as
    KafkaApis.connected would: the Produce frames after it are pipelined."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_frame(18, 0))
    assert await _answers(reader, 1) == [0]
    return reader, writer


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT_S):
        while not condition():
            await asyncio.sleep(0.01)


def test_produce_requests_overlap_queue_in_order_and_answer_in_order() -> None:
    """Five Produce requests (after a first, unpipelined, that binds the principal): each starts only
    after the one before it queued; all five wait at once; released last first, they answer first
    to last."""
    script = Script()

    async def scenario(port: int) -> None:
        reader, writer = await _connected(port)
        writer.write(b"".join(_frame(0, n) for n in range(1, 6)))
        await _until(lambda: ("queued", 5) in script.events)
        assert not [e for e in script.events if e[0] == "answered" and e[1] > 0]  # All five waiting.
        for number in range(5, 0, -1):
            script.gate(number).set()
            await asyncio.sleep(0.01)
        assert await _answers(reader, 5) == [1, 2, 3, 4, 5]
        order = [e for e in script.events if e[0] in ("start", "queued") and e[1] > 0]
        assert order == [(kind, n) for n in range(1, 6) for kind in ("start", "queued")]
        writer.close()

    asyncio.run(_with_listener(script, scenario))


def test_another_request_waits_for_every_earlier_answer() -> None:
    """A Metadata request after two waiting Produce requests starts only once both are answered, and
    its answer follows theirs."""
    script = Script()

    async def scenario(port: int) -> None:
        reader, writer = await _connected(port)
        writer.write(_frame(0, 1) + _frame(0, 2) + _frame(3, 3))
        await _until(lambda: ("queued", 2) in script.events)
        await asyncio.sleep(0.05)
        assert ("start", 3) not in script.events
        script.gate(2).set()
        await asyncio.sleep(0.05)
        assert ("start", 3) not in script.events  # 1 still waits.
        script.gate(1).set()
        assert await _answers(reader, 3) == [1, 2, 3]
        assert script.events.index(("answered", 1)) < script.events.index(("start", 3))
        writer.close()

    asyncio.run(_with_listener(script, scenario))


def test_the_pipeline_holds_at_most_its_depth() -> None:
    """Requests that queue and never finish: the listener reads KAFKA_PIPELINED_PRODUCES_MAX of them,
    then the next only once the oldest is answered."""
    script = Script()
    count = KAFKA_PIPELINED_PRODUCES_MAX + 3

    async def scenario(port: int) -> None:
        reader, writer = await _connected(port)
        writer.write(b"".join(_frame(0, n) for n in range(1, count + 1)))
        depth = KAFKA_PIPELINED_PRODUCES_MAX
        await _until(lambda: ("queued", depth) in script.events)
        await asyncio.sleep(0.1)
        assert ("start", depth + 1) not in script.events
        script.gate(1).set()
        await _until(lambda: ("queued", depth + 1) in script.events)
        assert ("start", depth + 2) not in script.events
        for number in range(2, count + 1):
            script.gate(number).set()
        assert await _answers(reader, count) == list(range(1, count + 1))
        writer.close()

    asyncio.run(_with_listener(script, scenario))


def test_a_failed_pipelined_request_closes_the_connection_after_the_answers_before_it() -> None:
    """Request 2 of three fails: 1's answer arrives, then the connection closes; 3's never comes."""
    script = Script()
    script.fail.add(2)

    async def scenario(port: int) -> None:
        reader, writer = await _connected(port)
        writer.write(_frame(0, 1) + _frame(0, 2) + _frame(0, 3))
        await _until(lambda: ("queued", 3) in script.events)
        for number in (3, 2, 1):
            script.gate(number).set()
        assert await _answers(reader, 1) == [1]
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b""  # Closed: nothing after 1's answer.
        writer.close()

    asyncio.run(_with_listener(script, scenario))


def test_a_producer_s_pipelined_requests_land_in_the_order_sent(kafka_cluster: LocalCluster) -> None:
    """librdkafka, 5 requests in flight, gzip: every tenth record is 200 KB of random hex (~110 KB
    compressed), a request of its own whose batch is checked on a worker thread (a compressed one over
    PRODUCE_CHECK_ON_LOOP_BYTES_MAX), and the small ones between are checked on the loop, so a
    request read before the one ahead of it had queued would overtake it.
    The partition holds every record once, in the order sent. Not idempotent: its sequence numbers
    would have the node refuse a request that overtook another and the producer send it again,
    hiding the reordering this checks."""
    topic = _topic(kafka_cluster)
    producer = Producer(
        {
            "bootstrap.servers": kafka_cluster.kafka_bootstrap,
            "enable.idempotence": False,
            "acks": "all",
            "compression.type": "gzip",
            "batch.size": 4096,
            "linger.ms": 0,
            "max.in.flight.requests.per.connection": 5,
        }
    )
    rng = random.Random(7)
    values = [
        f"{i:06d}".encode() + (rng.randbytes(100_000).hex().encode() if i % 10 == 0 else b"x" * 200)
        for i in range(600)
    ]
    for value in values:
        producer.produce(topic, value, partition=0)
        producer.poll(0)
    assert producer.flush(WAIT_S * 3) == 0
    messages = _consume_confluent(kafka_cluster, topic, len(values))
    assert [m.value()[:6] for m in messages] == [v[:6] for v in values]  # type: ignore[attr-defined]
    assert [m.value() for m in messages] == values  # type: ignore[attr-defined]


def test_a_producer_s_pipelined_requests_of_several_partitions_land_in_the_order_sent(
    kafka_cluster: LocalCluster,
) -> None:
    """kafka-python sends one request a node, holding a batch of each ready partition: such a request
    lets the next one be read once every partition's batches queued. Its large gzip batches (checked
    on a worker) beside small ones (on the loop) in the same and the next requests: each partition
    holds its records once, in the order sent."""
    topic = _topic(kafka_cluster, 3)
    producer = KafkaProducer(
        bootstrap_servers=kafka_cluster.kafka_bootstrap,
        acks="all",
        compression_type="gzip",
        batch_size=4096,
        linger_ms=1,
        max_in_flight_requests_per_connection=5,
        retries=0,
    )
    rng = random.Random(11)
    values = [
        f"{i:06d}".encode() + (rng.randbytes(100_000).hex().encode() if i % 7 == 0 else b"x" * 200)
        for i in range(300)
    ]
    futures = [producer.send(topic, value, partition=i % 3) for i, value in enumerate(values)]
    producer.flush(WAIT_S * 3)
    for future in futures:
        future.get(WAIT_S)
    producer.close()
    for partition in range(3):
        sent = [v for i, v in enumerate(values) if i % 3 == partition]
        messages = _consume_confluent(kafka_cluster, topic, len(sent), partition)
        assert [m.value()[:6] for m in messages] == [v[:6] for v in sent]  # type: ignore[attr-defined]
        assert [m.value() for m in messages] == sent  # type: ignore[attr-defined]
