"""Issue 18's acceptance on real nodes: many FetchStream consumers at once, and consumers that never read.

Every stream is a raw `FetchStream` call (kq.proto stubs on grpc.aio) on one asyncio loop in a
background thread, as `kq.bench.streams` opens them: `STREAMS_PER_CHANNEL` of one node's streams
share a channel, and every channel is its own TCP connection (`grpc.use_local_subchannel_pool`), as
separate client processes would be. Each consumer checks what it is pushed: from the offset it asked
for on, every record exactly once and in order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from kq.bench import procfs
from kq.bench.background import StreamHolder
from kq.client import KqClient, ProducerRecord
from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for
from kq.proto import kq_pb2, kq_pb2_grpc
from kq.proto.errors import LEADER_METADATA_KEY, ErrorCode, code_from_metadata, metadata_value
from kq.proto.limits import (
    FETCH_RECORDS_MAX,
    GRPC_MESSAGE_BYTES_MAX,
)
from kq.proto.records import NewRecord, encode_batch, parse_batch

pytestmark = pytest.mark.system

T = TypeVar("T")

# Many consumers at once (acceptance 1).
TOPIC = "many-streams"
PARTITIONS = 20
STREAMS_PER_NODE = 500  # On the leader and as many on a follower.
STREAMS_PER_CHANNEL = 8
CALL_S_MAX = 2.0  # Every produce, redirect, ListTopics and ClusterStatus while the streams are open.
LOAD_S = 5.0  # How long the other calls must keep answering beside the open streams.
OPEN_TIMEOUT_S = 30.0  # Creating every channel and call.
LIVE_TIMEOUT_S = 30.0  # Every stream to deliver its first record (all of them admitted and serving).
DELIVERY_TIMEOUT_S = 15.0  # After the last produce, every stream to reach its partition's log end.
LOOP_TIMEOUT_S = 10.0  # One hand-off to the streams' loop, and closing every stream.

# A consumer that never reads (acceptance 2).
STUCK_TOPIC = "stuck"
STUCK_STREAMS = 4  # Each on a connection of its own, never read from.
STUCK_RECORD_BYTES = 64 * 1024
STUCK_RECORDS_PER_REQUEST = 16  # 1 MiB per produce request.
STUCK_REQUESTS = 256  # 256 MiB produced to the unread streams' partition.
STUCK_PRODUCE_S_MAX = 5.0  # One 1 MiB produce, replicated on this shared machine.
READER_CHECK_EVERY = 16  # Requests between two checks that the reading consumer has caught up.
READER_CATCH_UP_S = 15.0  # For the reading consumer to reach what was produced so far.
# The leader's heap (RssAnon; VmRSS also counts the reclaimable pages of mapped files, LMDB's map and
# the Raft journal, which grow with the data: +300-350 MiB measured) may grow by at most this while
# the unread streams are open: a base for taking the data beside one reading consumer (measured with
# no unread stream: 38 MiB, the same for 128 and 256 MiB produced) and a bounded cost per unread
# stream (its message waiting to be written, gRPC's buffers; measured: 6.5-9 MiB). A node that kept
# what it could not send would grow by up to STUCK_STREAMS x 256 MiB.
HEAP_GROWTH_BASE_MIB = 48
HEAP_GROWTH_PER_UNREAD_STREAM_MIB = 12
ANON_GROWTH_MIB_MAX = HEAP_GROWTH_BASE_MIB + STUCK_STREAMS * HEAP_GROWTH_PER_UNREAD_STREAM_MIB
MEMORY_SAMPLE_S = 0.1
COMPACTION_LOG_MIB = 4
UNREAD_CALL_TIMEOUT_S = 120.0  # Only a hung node lets an unread stream's call reach it.

CHANNEL_OPTIONS = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES_MAX),
]
STREAM_BYTES_MAX = 1024 * 1024  # max_bytes of each stream's responses.


@dataclass(slots=True)
class StreamConsumer:
    """One FetchStream consumer; written by the streams' loop thread only."""

    address: str
    partition: int
    start: int  # The offset it asked for: the partition's log end when it opened.
    keep_values: bool = True  # False: (offset, None) per record, without decoding the batch.
    received: list[tuple[int, bytes | None]] = field(default_factory=list)
    next_offset: int = 0
    ended: str | None = None  # How the stream ended, if it did before we cancelled it.

    def __post_init__(self) -> None:
        self.next_offset = self.start

    def take(self, base_offset: int, values: Sequence[bytes | None]) -> None:
        """The records of one pushed batch: those below `start` are skipped (a batch may begin
        before the offset asked for); from `start` on each is kept, so a duplicate, a gap or a
        reordering shows in `received`."""
        for position, value in enumerate(values):
            offset = base_offset + position
            if offset >= self.start:
                self.received.append((offset, value))
                self.next_offset = max(self.next_offset, offset + 1)


class StreamLoop(StreamHolder):
    """An asyncio loop in a background thread holding FetchStream consumers (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__("test-streams-aio", LOOP_TIMEOUT_S)
        self._decoded: dict[tuple[str, int, int], tuple[bytes, list[bytes | None]]] = {}
        self.consumers: list[StreamConsumer] = []

    def open(self, topic: str, consumers: Sequence[StreamConsumer], per_channel: int) -> None:
        """Opens one stream per consumer, `per_channel` of the same node's consumers on one channel."""
        self.run(self._open(topic, consumers, per_channel), OPEN_TIMEOUT_S, "opening the streams")

    async def _open(self, topic: str, consumers: Sequence[StreamConsumer], per_channel: int) -> None:
        by_address: dict[str, list[StreamConsumer]] = {}
        for consumer in consumers:
            by_address.setdefault(consumer.address, []).append(consumer)
        for address, group in by_address.items():
            for first in range(0, len(group), per_channel):
                channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
                self._channels.append(channel)
                stub = kq_pb2_grpc.BrokerStub(channel)
                for consumer in group[first : first + per_channel]:
                    self.consumers.append(consumer)
                    self._tasks.append(asyncio.ensure_future(self._consume(stub, topic, consumer)))

    async def _consume(self, stub: kq_pb2_grpc.BrokerStub, topic: str, consumer: StreamConsumer) -> None:
        request = kq_pb2.FetchRequest(
            topic=topic,
            partition=consumer.partition,
            offset=consumer.start,
            max_records=FETCH_RECORDS_MAX,
            max_bytes=STREAM_BYTES_MAX,
            as_batches=True,
        )
        call: Any = stub.FetchStream(request)
        self._calls.append(call)
        try:
            async for response in call:
                for batch in response.batches:
                    consumer.take(batch.base_offset, self._values(topic, consumer, batch))
        except grpc.aio.AioRpcError as error:
            kq_code = code_from_metadata(tuple(error.trailing_metadata() or ()))  # aio's Metadata: pairs.
            consumer.ended = f"{error.code().name} (kq {kq_code!r}): {error.details()}"
        except asyncio.CancelledError:
            consumer.ended = "cancelled"  # Our own cancel, at the end of the test.
        else:
            consumer.ended = "OK: the node ended the stream"

    def _values(self, topic: str, consumer: StreamConsumer, batch: kq_pb2.RecordBatch) -> list[bytes | None]:
        """The batch's record values; each distinct batch is decoded once, however many streams get it."""
        if not consumer.keep_values:
            return [None] * batch.record_count
        key = (topic, consumer.partition, batch.base_offset)
        cached = self._decoded.get(key)
        if cached is not None and cached[0] == batch.data:
            return cached[1]
        values = [record.value for record in parse_batch(batch.data)]
        self._decoded[key] = (batch.data, values)
        return values

    def snapshot(self) -> list[tuple[int, str | None]]:
        """(next offset, how it ended) of every consumer, read on the loop's thread."""
        return self.run(self._snapshot(), LOOP_TIMEOUT_S, "reading the streams' positions")

    async def _snapshot(self) -> list[tuple[int, str | None]]:
        return [(consumer.next_offset, consumer.ended) for consumer in self.consumers]


@contextmanager
def stream_loop() -> Iterator[StreamLoop]:
    """A StreamLoop whose streams are cancelled and whose loop stops however the test ends."""
    streams = StreamLoop()
    try:
        yield streams
    finally:
        try:
            streams.close()
        finally:
            streams.stop_loop()


def ended_streams(streams: StreamLoop) -> list[str]:
    """One line per stream that ended by itself (refused, failed or ended by the node)."""
    return [
        f"{consumer.address} partition {consumer.partition}: {ended}"
        for consumer, (_, ended) in zip(streams.consumers, streams.snapshot(), strict=True)
        if ended is not None
    ]


def wait_delivered(streams: StreamLoop, ends: dict[int, int], what: str, timeout_s: float) -> None:
    """Waits until every stream has been pushed its partition's records up to `ends`; fails at once
    when a stream has ended (a refused stream never delivers)."""

    def behind() -> list[str]:
        lines = []
        for consumer, (next_offset, ended) in zip(streams.consumers, streams.snapshot(), strict=True):
            assert ended is None, (
                f"a stream ended while open: {consumer.address} {consumer.partition}: {ended}"
            )
            if next_offset < ends[consumer.partition]:
                lines.append(
                    f"{consumer.address} p{consumer.partition} at {next_offset} of {ends[consumer.partition]}"
                )
        return lines

    wait_for(
        lambda: not behind(),
        what,
        timeout_s,
        poll_s=0.2,
        last_state=lambda: f"{len(behind())} streams behind, e.g. {behind()[:3]}",
    )


@dataclass(slots=True)
class Produced:
    """What the test produced, per partition: (offset, value) in offset order."""

    by_partition: dict[int, list[tuple[int, bytes | None]]] = field(default_factory=dict)

    def add(self, partition: int, offset: int, value: bytes) -> None:
        self.by_partition.setdefault(partition, []).append((offset, value))

    def ends(self, starts: dict[int, int]) -> dict[int, int]:
        """Each partition's log end after what was produced."""
        return {
            p: max([start, *(offset + 1 for offset, _ in self.by_partition.get(p, []))])
            for p, start in starts.items()
        }


class Calls:
    """Calls on the leader and one follower while the streams are open: each must answer within
    CALL_S_MAX (its gRPC deadline), and how long each kind took is kept for the report."""

    def __init__(self, leader: str, follower: str, client: KqClient) -> None:
        self.leader, self.follower = leader, follower
        self._client = client  # Bootstrapped with the leader only.
        self._channels = {address: grpc.insecure_channel(address) for address in (leader, follower)}
        self._stubs = {
            address: kq_pb2_grpc.BrokerStub(channel) for address, channel in self._channels.items()
        }
        self.took_s: dict[str, list[float]] = {}

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()

    def timed(self, kind: str, address: str, call: Callable[[], T]) -> T:
        """`call()`, which must answer within CALL_S_MAX."""
        started = time.monotonic()
        try:
            result = call()
        except grpc.RpcError as error:
            took_s = time.monotonic() - started
            raise AssertionError(f"{kind} on {address} failed after {took_s:.2f} s: {error}") from error
        self.record(kind, address, time.monotonic() - started)
        return result

    def record(self, kind: str, address: str, took_s: float) -> None:
        """One call's time, which must be below CALL_S_MAX."""
        self.took_s.setdefault(kind, []).append(took_s)
        assert took_s < CALL_S_MAX, f"{kind} on {address} took {took_s:.2f} s"

    def summary(self) -> str:
        """Calls and the slowest answer, per kind."""
        return ", ".join(
            f"{kind} {len(took)} (slowest {max(took) * 1000:.0f} ms)" for kind, took in self.took_s.items()
        )

    def produce_to_leader(self, partition: int, value: bytes) -> int:
        """One record through KqClient to the leader; its offset."""
        record = ProducerRecord(value, partition=partition)
        (metadata,) = self.timed("produce", self.leader, lambda: self._client.send_batch(TOPIC, [record]))
        return metadata.offset

    def produce_via_follower(self, partition: int, value: bytes) -> int:
        """A produce sent to the follower: it answers NOT_LEADER naming the leader, which takes it.
        The record's offset."""
        request = kq_pb2.ProduceRequest(
            topic=TOPIC, partition=partition, records=encode_batch([NewRecord(None, value)])
        )
        started = time.monotonic()
        try:
            self._stubs[self.follower].Produce(request, timeout=CALL_S_MAX)
        except grpc.RpcError as error:
            trailing = error.trailing_metadata()
            assert code_from_metadata(trailing) == ErrorCode.NOT_LEADER, f"the follower answered {error}"
        else:
            raise AssertionError("a follower accepted a produce")
        self.record("redirect", self.follower, time.monotonic() - started)
        hint = metadata_value(trailing, LEADER_METADATA_KEY)
        assert hint == self.leader, f"the follower named {hint} as leader, not {self.leader}"
        response = self.timed(
            "redirected produce", hint, lambda: self._stubs[hint].Produce(request, timeout=CALL_S_MAX)
        )
        return int(response.base_offset)

    def probe(self, address: str, node_id: str) -> None:
        """ListTopics and ClusterStatus on one node: they answer, and say the right things."""
        stub = self._stubs[address]
        topics = self.timed(
            "ListTopics", address, lambda: stub.ListTopics(kq_pb2.ListTopicsRequest(), timeout=CALL_S_MAX)
        )
        assert TOPIC in [topic.name for topic in topics.topics]
        status = self.timed(
            "ClusterStatus",
            address,
            lambda: stub.ClusterStatus(kq_pb2.ClusterStatusRequest(), timeout=CALL_S_MAX),
        )
        assert status.node_id == node_id


def produce_round(calls: Calls, produced: Produced, round_number: int, node_ids: tuple[str, str]) -> None:
    """One record to the leader and one through the follower's redirect, each to its own partition,
    then ListTopics and ClusterStatus on both nodes."""
    partition = round_number % PARTITIONS
    value = f"leader-{round_number}".encode()
    produced.add(partition, calls.produce_to_leader(partition, value), value)
    partition = (round_number + PARTITIONS // 2) % PARTITIONS
    value = f"follower-{round_number}".encode()
    produced.add(partition, calls.produce_via_follower(partition, value), value)
    calls.probe(calls.leader, node_ids[0])
    calls.probe(calls.follower, node_ids[1])


def open_consumers(streams: StreamLoop, addresses: Sequence[str], starts: dict[int, int]) -> None:
    """STREAMS_PER_NODE consumers on each address, spread round-robin over the partitions."""
    consumers = [
        StreamConsumer(address, i % PARTITIONS, starts[i % PARTITIONS])
        for address in addresses
        for i in range(STREAMS_PER_NODE)
    ]
    streams.open(TOPIC, consumers, STREAMS_PER_CHANNEL)


def check_every_record_once_in_order(streams: StreamLoop, produced: Produced) -> None:
    """Each consumer got exactly the records produced to its partition since it opened."""
    wrong = []
    for consumer in streams.consumers:
        expected = [
            item for item in produced.by_partition.get(consumer.partition, []) if item[0] >= consumer.start
        ]
        if consumer.received != expected:
            wrong.append(
                f"{consumer.address} p{consumer.partition}: {consumer.received[:5]} vs {expected[:5]}"
            )
    assert not wrong, f"{len(wrong)} streams got other records than produced, e.g. {wrong[:3]}"


def test_many_streams_on_leader_and_follower_while_other_calls_answer(tmp_path: Path) -> None:
    """STREAMS_PER_NODE streams on the leader and as many on a follower: produce (direct and through
    the follower's redirect), ListTopics and ClusterStatus on both nodes answer within 2 s the whole
    time, and every stream receives exactly its partition's new records, each once and in order."""
    with LocalCluster(tmp_path / "c", size=3) as cluster:
        leader_id = cluster.wait_ready()
        follower_id = min(node_id for node_id in cluster.nodes if node_id != leader_id)
        leader = cluster.nodes[leader_id].grpc_address
        follower = cluster.nodes[follower_id].grpc_address
        with KqClient([leader], retry_timeout_s=CALL_S_MAX, rpc_timeout_s=CALL_S_MAX) as client:
            client.create_topic(TOPIC, PARTITIONS)
            # One record per partition first, so "from the log end" is not "from 0".
            client.send_batch(TOPIC, [ProducerRecord(b"before", partition=p) for p in range(PARTITIONS)])
            starts = {p: offsets.log_end_offset for p, offsets in client.list_offsets(TOPIC).items()}
            client.list_offsets(TOPIC, node=follower)  # Read-your-writes: the follower has them too.
            produced = Produced()
            calls = Calls(leader, follower, client)
            try:
                with stream_loop() as streams:
                    open_consumers(streams, [leader, follower], starts)
                    # A first record on every partition: once each stream has it, all are serving.
                    for partition in range(PARTITIONS):
                        value = f"first-{partition}".encode()
                        (metadata,) = client.send_batch(TOPIC, [ProducerRecord(value, partition=partition)])
                        produced.add(partition, metadata.offset, value)
                    wait_delivered(streams, produced.ends(starts), "every stream to deliver", LIVE_TIMEOUT_S)
                    load_until = time.monotonic() + LOAD_S
                    round_number = 0
                    while time.monotonic() < load_until:
                        produce_round(calls, produced, round_number, (leader_id, follower_id))
                        round_number += 1
                    assert not ended_streams(streams), ended_streams(streams)[:5]
                    wait_delivered(
                        streams, produced.ends(starts), "every record delivered", DELIVERY_TIMEOUT_S
                    )
                    check_every_record_once_in_order(streams, produced)
                    print(
                        f"\n{len(streams.consumers)} streams; {round_number} rounds in {LOAD_S} s: "
                        f"{calls.summary()}"
                    )
            finally:
                calls.close()


class MemoryPeak(procfs.PeriodicSampler):
    """The largest VmRSS and RssAnon of one process, sampled every MEMORY_SAMPLE_S."""

    def __init__(self, pid: int) -> None:
        super().__init__(MEMORY_SAMPLE_S, "test-memory-peak")
        self._pid = pid
        self.rss_kib_max = 0
        self.anon_kib_max = 0

    def sample(self) -> None:
        """Reads /proc/PID/status."""
        memory = procfs.memory(self._pid)
        self.rss_kib_max = max(self.rss_kib_max, memory.rss_kib)
        self.anon_kib_max = max(self.anon_kib_max, memory.anon_kib)


class UnreadStreams:
    """FetchStream calls from offset 0 that are never read: each on a connection of its own, so HTTP/2
    flow control stops the node from sending once that connection's windows are full."""

    def __init__(self, address: str, count: int) -> None:
        self._channels = [grpc.insecure_channel(address, options=CHANNEL_OPTIONS) for _ in range(count)]
        request = kq_pb2.FetchRequest(topic=STUCK_TOPIC, partition=0, offset=0, max_bytes=STREAM_BYTES_MAX)
        self.calls: list[Any] = [
            kq_pb2_grpc.BrokerStub(channel).FetchStream(request, timeout=UNREAD_CALL_TIMEOUT_S)
            for channel in self._channels
        ]

    def close(self) -> None:
        for call in self.calls:
            call.cancel()
        for channel in self._channels:
            channel.close()


def stuck_payload(request_number: int) -> list[ProducerRecord]:
    """One 1 MiB produce request's records."""
    value = request_number.to_bytes(4, "big") * (STUCK_RECORD_BYTES // 4)
    return [ProducerRecord(value, partition=0) for _ in range(STUCK_RECORDS_PER_REQUEST)]


def reader_reaches(streams: StreamLoop, offset: int) -> None:
    """Waits until the reading consumer has been pushed every record below `offset`."""
    wait_delivered(streams, {0: offset}, f"the reading consumer to reach offset {offset}", READER_CATCH_UP_S)


@dataclass(slots=True)
class Production:
    """STUCK_REQUESTS produce requests beside the unread streams, and what the leader used meanwhile."""

    records: int
    elapsed_s: float
    slowest_s: float
    peak: MemoryPeak


def produce_beside_unread_streams(
    client: KqClient, streams: StreamLoop, pid: int, records: int
) -> Production:
    """Produces STUCK_REQUESTS MiB, checking every READER_CHECK_EVERY requests that the reading
    consumer has caught up, while sampling the leader's memory."""
    started = time.monotonic()
    slowest_s = 0.0
    with MemoryPeak(pid) as peak:
        for request_number in range(1, STUCK_REQUESTS + 1):
            sent = time.monotonic()
            records += len(client.send_batch(STUCK_TOPIC, stuck_payload(request_number)))
            slowest_s = max(slowest_s, time.monotonic() - sent)
            if request_number % READER_CHECK_EVERY == 0:
                reader_reaches(streams, records)
        reader_reaches(streams, records)
    return Production(records, time.monotonic() - started, slowest_s, peak)


def resumes_without_loss(call: Any, records: int) -> None:
    """Reads an unread stream at last: from offset 0 on, every record up to `records`, in order."""
    next_offset = 0
    for response in call:
        for batch in response.batches:
            assert batch.base_offset == next_offset, f"offset {batch.base_offset} where {next_offset} was due"
            next_offset += batch.record_count
        if next_offset >= records:
            assert next_offset == records
            return
    raise AssertionError(f"an unread stream ended at offset {next_offset} of {records}")


def test_streams_that_never_read_cost_the_node_bounded_memory(tmp_path: Path) -> None:
    """STUCK_STREAMS streams whose clients never read, on the leader, while STUCK_REQUESTS MiB are
    produced to their partition: the leader's heap grows by less than ANON_GROWTH_MIB_MAX, every
    produce answers, a reading consumer on the same node receives every record as it goes, and each
    unread stream, read at last, resumes where it stopped and delivers every record."""
    # A small Raft log in RAM (--compaction-log-mib), so the heap's growth is not the log's.
    node_args = ("--compaction-log-mib", str(COMPACTION_LOG_MIB))
    with LocalCluster(tmp_path / "c", size=3, node_args=node_args) as cluster:
        leader_id = cluster.wait_ready()
        leader = cluster.nodes[leader_id].grpc_address
        pid = cluster.pid(leader_id)
        assert pid is not None
        retry_s = STUCK_PRODUCE_S_MAX
        with (
            KqClient([leader], retry_timeout_s=retry_s, rpc_timeout_s=retry_s) as client,
            stream_loop() as streams,
        ):
            client.create_topic(STUCK_TOPIC, partitions=1)
            streams.open(STUCK_TOPIC, [StreamConsumer(leader, 0, 0, keep_values=False)], 1)
            records = len(client.send_batch(STUCK_TOPIC, stuck_payload(0)))
            reader_reaches(streams, records)
            before = procfs.memory(pid)
            unread = UnreadStreams(leader, STUCK_STREAMS)
            try:
                production = produce_beside_unread_streams(client, streams, pid, records)
                (reader,) = streams.consumers
                assert [offset for offset, _ in reader.received] == list(range(production.records))
                anon_growth_mib = (production.peak.anon_kib_max - before.anon_kib) / 1024
                rss_growth_mib = (production.peak.rss_kib_max - before.rss_kib) / 1024
                print(
                    f"\n{STUCK_REQUESTS} MiB in {production.elapsed_s:.1f} s, slowest produce "
                    f"{production.slowest_s:.2f} s; leader RssAnon {before.anon_kib // 1024} MiB + "
                    f"{anon_growth_mib:.1f} MiB at most, VmRSS {before.rss_kib // 1024} MiB + "
                    f"{rss_growth_mib:.1f} MiB at most"
                )
                assert production.slowest_s < STUCK_PRODUCE_S_MAX
                assert anon_growth_mib < ANON_GROWTH_MIB_MAX
                for call in unread.calls:
                    resumes_without_loss(call, production.records)
            finally:
                unread.close()
