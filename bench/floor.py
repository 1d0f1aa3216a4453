"""The floor under one record in flight: what the required stack costs with none of kq's own logic.

    python -m kq.bench.floor [--sends 3000] [--runs 3] [--value-bytes 100]

Issue 17's first and fourth points ask one record in flight to answer in 1 ms at the median and to
cost the three servers at most 1.5x NATS's CPU per message. This benchmark measures how much of kq's
figure the parts it must be built from (CPython, grpc.aio, asyncio sockets, LMDB) take by
themselves, so that a round of work on kq's own code knows what it can win at most.

Three processes on 127.0.0.1 play a cluster's parts with the least code that still does a
replicated write's steps:

- a "leader" reads each ProduceRequest (kq's proto) from a ProduceStream call (grpc.aio: the call
  kq's client uses for one record in flight) or, in the `tcp` front, from a length-prefixed frame
  on a plain socket; sends its records to two "followers" over TCP (asyncio, length-prefixed
  frames); answers once one follower has acknowledged (a majority of three) and reads the other's
  acknowledgement when it comes;
- each follower acknowledges each frame at once;
- with a store (the `+lmdb` variants) each process also writes the record into LMDB in one write
  transaction, opened as kq's store opens it (no sync): the leader before it answers, the
  followers right after they acknowledge, as kq's apply does.

No Raft (terms, log, commit index), no validation, no idempotence, no metrics, no authorization.
The `+raft` variants put stock PySyncObj (the required Raft library, as it comes: its own TCP
transport, which pickles and compresses every message with zlib, its tick thread, no compaction
during a run) in place of the plain replication: every process serves the gRPC front, the leader's
ProduceStream calls a `@replicated` append (which writes LMDB in the `+lmdb` variant) and answers
from its callback; a stream opened on another process is refused FAILED_PRECONDITION, and the
client uses the process that takes it. (kq's transport, raft/wire.py, does without the pickle and
the zlib: about 60 µs of zlib's set-up a send here, which the `+raft` rows include.)
The client is kq's own produce stream (`kq.client.connection._ProduceStream`) sending a batch
encoded by kq's `encode_batch` per send, or, in the `tcp` front, a blocking socket.

Beside the floors, the same run measures the real things the same way: `kq`, a fresh three-node
`LocalCluster` driven by `KqClient.send` to a one-partition topic (compare's one-in-flight
scenario), and `nats`, the comparison's JetStream R3 cluster driven by `js.publish` awaited one at
a time (always 100 B: compare's stream; its CPU figure includes the 20 warm-up publishes that
`NatsSystem.latency` makes before it times, as in compare).

Each round starts fresh processes for each variant, in turn (so a slow minute of the VM falls on
every variant alike); the table gives the medians over rounds of each round's p50, p99, rate, and
CPU per message (utime + stime from /proc, leader and followers apart), and, when `kq` ran, its p50
and server CPU over each other variant's, round by round (the median of the rounds' ratios).
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import grpc
import lmdb
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

from kq.bench.compare_nats import NatsSystem
from kq.bench.nats_cluster import NatsServerMissingError
from kq.bench.procfs import cpu_seconds, own_cpu_seconds
from kq.bench.side_by_side import FULL_COUNTS, LATENCY, CompareSettings
from kq.client import KqClient
from kq.client.connection import _ProduceStream
from kq.deploy.cluster import LOOPBACK_HOST, LocalCluster, free_ports
from kq.proto import kq_pb2, kq_pb2_grpc
from kq.proto.records import NewRecord, encode_batch

# Every message between the floor's processes: payload length, offset, then the payload. An
# acknowledgement (a follower's, the tcp front's answer) is a frame without payload.
FRAME = struct.Struct(">IQ")
FRAME_BYTES_MAX = 1024 * 1024  # A frame larger than this ends the connection (the floor sends ~100 B).
SENDS_MAX = 100_000
WARMUP_SENDS = 300
RUNS_MAX = 20
STORE_MAP_BYTES = 1 << 30  # LMDB map of each process's store: 100,000 sends of 1 KiB fit with room.
START_TIMEOUT_S = 15.0  # For a process to say it listens, and the leader that it reached its followers.
STOP_TIMEOUT_S = 5.0  # After SIGTERM, before SIGKILL.
REPLY_TIMEOUT_S = 10.0  # One send's answer; past it the run fails (nothing here should take long).
READY = "ready"
VARIANTS = (
    "nats",
    "kq",
    "grpc+raft+lmdb",
    "grpc+raft",
    "grpc+lmdb",
    "grpc",
    "tcp+lmdb",
    "tcp",
)
KQ_TOPIC = "floor"
SERVICE = "kq.v1.Broker"  # kq's gRPC service (proto/kq.proto), whose ProduceStream the floors serve.
NATS_LEADER_TIMEOUT_S = 10.0
RAFT_COMPACTION_ENTRIES = 1 << 30  # Stock PySyncObj pickles the object to compact; a run never does.
RAFT_ELECTED_TIMEOUT_S = 15.0  # For the three stock PySyncObj processes to elect a leader.
RAFT_ELECTED_POLL_S = 0.1
RAFT_LEADER_STATE = 2  # PySyncObj's getStatus()["state"] on the leader.
RAFT_FAILED_SENDS_MAX = 20  # In one round: past it the run fails (stock PySyncObj keeps losing its leader).


# The processes ----------------------------------------------------------------------------------


class _Store:
    """One LMDB environment opened as kq's store opens it in its default durability mode."""

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self._environment = lmdb.open(
            str(path), map_size=STORE_MAP_BYTES, subdir=True, sync=False, metasync=False, readahead=False
        )

    def put(self, offset: int, payload: bytes) -> None:
        """Writes one record in its own write transaction."""
        with self._environment.begin(write=True) as transaction:
            transaction.put(offset.to_bytes(8, "big"), payload)


class _Frames(asyncio.Protocol):
    """Length-prefixed frames in from a connection; `on_frame(offset, payload)` for each."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        while len(buffer) >= FRAME.size:
            length, offset = FRAME.unpack_from(buffer)
            if length > FRAME_BYTES_MAX:
                raise ValueError(f"a frame of {length} bytes")
            end = FRAME.size + length
            if len(buffer) < end:
                return
            payload = bytes(buffer[FRAME.size : end])
            del buffer[:end]
            self.on_frame(offset, payload)

    def on_frame(self, offset: int, payload: bytes) -> None:
        raise NotImplementedError


class _Follower(_Frames):
    """Acknowledges each frame at once, then stores it (when a store is given)."""

    def __init__(self, store: _Store | None) -> None:
        super().__init__()
        self._store = store

    def on_frame(self, offset: int, payload: bytes) -> None:
        assert self.transport is not None
        self.transport.write(FRAME.pack(0, offset))
        if self._store is not None:
            self._store.put(offset, payload)


class _Acks(_Frames):
    """A follower's acknowledgements, read on the leader: the first for an offset settles its wait."""

    def __init__(self, waiting: dict[int, asyncio.Future[None]]) -> None:
        super().__init__()
        self._waiting = waiting

    def on_frame(self, offset: int, payload: bytes) -> None:
        waiter = self._waiting.pop(offset, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Replicas:
    """The leader's two follower connections: `replicate` returns once one has acknowledged."""

    def __init__(self, store: _Store | None) -> None:
        self._store = store
        self._writers: list[asyncio.Transport] = []
        self._waiting: dict[int, asyncio.Future[None]] = {}
        self._next = 0

    async def connect(self, ports: list[int]) -> None:
        loop = asyncio.get_running_loop()
        for port in ports:
            transport, _ = await loop.create_connection(lambda: _Acks(self._waiting), LOOPBACK_HOST, port)
            assert isinstance(transport, asyncio.Transport)
            self._writers.append(transport)

    async def replicate(self, payload: bytes) -> int:
        offset = self._next
        self._next += 1
        waiter = asyncio.get_running_loop().create_future()
        self._waiting[offset] = waiter
        frame = FRAME.pack(len(payload), offset) + payload
        for writer in self._writers:
            writer.write(frame)
        await waiter
        if self._store is not None:
            self._store.put(offset, payload)
        return offset


async def _serve_grpc(port: int, handler: Callable[..., Any]) -> None:
    """Serves `handler` as kq's ProduceStream (every other call of kq's service answers UNIMPLEMENTED)
    on `port`, says it is ready, and serves until the process ends."""
    method = grpc.stream_stream_rpc_method_handler(
        handler,
        request_deserializer=kq_pb2.ProduceRequest.FromString,
        response_serializer=kq_pb2.ProduceResponse.SerializeToString,
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"ProduceStream": method}),)
    )
    server.add_insecure_port(f"{LOOPBACK_HOST}:{port}")
    await server.start()
    print(READY, flush=True)
    await server.wait_for_termination()


async def _serve_tcp(port: int, protocol: Callable[[], asyncio.Protocol]) -> None:
    """Serves `protocol` on `port`, says it is ready, and serves until the process ends."""
    server = await asyncio.get_running_loop().create_server(protocol, LOOPBACK_HOST, port)
    print(READY, flush=True)
    await server.serve_forever()


class _GrpcFront:
    """A gRPC front: each ProduceStream request's records go to `append`, which returns their offset
    once replicated; a stream is refused FAILED_PRECONDITION when `leads()` says this process does
    not (checked once a stream)."""

    def __init__(self, append: Callable[[bytes], Awaitable[int]], leads: Callable[[], bool]) -> None:
        self._append = append
        self._leads = leads

    async def produce_stream(
        self, requests: AsyncIterator[kq_pb2.ProduceRequest], context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        if not self._leads():
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not the leader")
        async for request in requests:
            offset = await self._append(request.records)
            await context.write(
                kq_pb2.ProduceResponse(partition=request.partition, base_offset=offset, index=offset + 1)
            )


class _TcpFront(_Frames):
    """The leader's plain front: each client frame is replicated, then answered with its offset."""

    def __init__(self, replicas: _Replicas) -> None:
        super().__init__()
        self._replicas = replicas
        self._answering: set[asyncio.Task[None]] = set()  # Held, so that none is collected mid-way.

    def on_frame(self, offset: int, payload: bytes) -> None:
        task = asyncio.get_running_loop().create_task(self._answer(payload))
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    async def _answer(self, payload: bytes) -> None:
        offset = await self._replicas.replicate(payload)
        assert self.transport is not None
        self.transport.write(FRAME.pack(0, offset))


class _RaftLog(SyncObj):  # type: ignore[misc]  # PySyncObj is untyped.
    """Stock PySyncObj with one replicated call: append a record (to LMDB when a store is given)."""

    def __init__(self, port: int, peers: list[int], store: _Store | None) -> None:
        # Set before SyncObj's constructor, which leaves the attributes it finds out of its snapshots.
        self._store = store
        self._next = 0
        conf = SyncObjConf(
            appendEntriesUseBatch=False,  # As kq's node: batching adds a wait per commit.
            logCompactionMinEntries=RAFT_COMPACTION_ENTRIES,
            logCompactionMinTime=RAFT_COMPACTION_ENTRIES,
        )
        super().__init__(f"{LOOPBACK_HOST}:{port}", [f"{LOOPBACK_HOST}:{peer}" for peer in peers], conf)

    @replicated  # type: ignore[untyped-decorator]  # PySyncObj is untyped.
    def append(self, payload: bytes) -> int:
        offset = self._next
        self._next += 1
        if self._store is not None:
            self._store.put(offset, payload)
        return offset

    def leads(self) -> bool:
        return bool(self.getStatus()["state"] == RAFT_LEADER_STATE)

    async def append_async(self, payload: bytes) -> int:
        """`append` through the log; its offset once committed and applied here."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()

        def settle(result: int, error: int) -> None:  # On PySyncObj's tick thread.
            loop.call_soon_threadsafe(_settle, done, result, error)

        self.append(payload, callback=settle)
        return await done


def _settle(done: asyncio.Future[int], result: int, error: int) -> None:
    """Ends an append's wait with PySyncObj's answer (on the serving loop)."""
    if done.done():
        return
    if error == FAIL_REASON.SUCCESS:
        done.set_result(result)
    else:
        done.set_exception(RuntimeError(f"PySyncObj failed the append: {error}"))


async def _serve_raft(port: int, raft_port: int, peers: list[int], store: _Store | None) -> None:
    """A stock PySyncObj process with a gRPC front."""
    log = _RaftLog(raft_port, peers, store)
    try:
        await _serve_grpc(port, _GrpcFront(log.append_async, log.leads).produce_stream)
    finally:
        log.destroy()


async def _serve(
    role: str, port: int, followers: list[int], front: str, store_dir: Path | None, raft_port: int | None
) -> None:
    """One process's part, until it is terminated."""
    store = _Store(store_dir) if store_dir is not None else None
    if role == "raft":
        assert raft_port is not None
        await _serve_raft(port, raft_port, followers, store)
    elif role == "follower":
        await _serve_tcp(port, lambda: _Follower(store))
    else:
        replicas = _Replicas(store)
        await replicas.connect(followers)
        if front == "grpc":
            await _serve_grpc(port, _GrpcFront(replicas.replicate, lambda: True).produce_stream)
        else:
            await _serve_tcp(port, lambda: _TcpFront(replicas))


# The run ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Round:
    """One variant's figures in one round."""

    p50_ms: float
    p99_ms: float
    msgs_per_s: float
    leader_cpu_us: float  # Per message.
    followers_cpu_us: float  # Both followers together, per message.
    client_cpu_us: float
    failed: int = 0  # Sends answered with an error (see Timing).

    @property
    def server_cpu_us(self) -> float:
        return self.leader_cpu_us + self.followers_cpu_us


def _start(arguments: list[str]) -> subprocess.Popen[str]:
    """Starts one part and waits until it says it is ready; stops it if it does not."""
    process = subprocess.Popen(
        [sys.executable, "-m", "kq.bench.floor", *arguments], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
    if not ready or process.stdout.readline().strip() != READY:
        _stop(process)
        raise RuntimeError(f"a floor process ({' '.join(arguments)}) did not start")
    return process


def _stop(process: subprocess.Popen[str]) -> None:
    """Stops one part by its PID."""
    process.terminate()
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def _cluster(variant: str, base: Path) -> Iterator[list[tuple[str, subprocess.Popen[str]]]]:
    """The three processes of one variant; yields each one's front address with it, the leader first
    where the variant decides (plain replication), else in start order."""
    parts = variant.split("+")
    stores = [["--store-dir", str(base / f"{variant}-{n}")] if "lmdb" in parts else [] for n in range(3)]
    started: list[tuple[str, subprocess.Popen[str]]] = []
    try:
        if "raft" in parts:
            ports = free_ports(6)
            for n in range(3):
                peers = [
                    argument
                    for peer in ports[3:]
                    if peer != ports[3 + n]
                    for argument in ("--follower", str(peer))
                ]
                arguments = ["--role", "raft", "--port", str(ports[n]), "--raft-port", str(ports[3 + n])]
                arguments += [*peers, *stores[n]]
                started.append((f"{LOOPBACK_HOST}:{ports[n]}", _start(arguments)))
        else:
            leader_port, *follower_ports = free_ports(3)
            for port, store_arguments in zip(follower_ports, stores[1:], strict=True):
                process = _start(["--role", "follower", "--port", str(port), *store_arguments])
                started.append((f"{LOOPBACK_HOST}:{port}", process))
            followers = [argument for port in follower_ports for argument in ("--follower", str(port))]
            arguments = ["--role", "leader", "--port", str(leader_port), "--front", parts[0], *followers]
            started.insert(0, (f"{LOOPBACK_HOST}:{leader_port}", _start([*arguments, *stores[0]])))
        yield started
    finally:
        for _, process in started:
            _stop(process)


def _leader_sender(
    addresses: list[str], payload: bytes, warmup_sends: int
) -> tuple[int, Generator[None, None, None]]:
    """A gRPC sender to whichever of `addresses` takes a ProduceStream (the stock Raft variant's
    leader), with its position, once it has answered `warmup_sends` (at least one: it proves the
    leader) in a row: a first election may still be followed by a second while the last process
    starts."""
    deadline = time.monotonic() + RAFT_ELECTED_TIMEOUT_S
    while time.monotonic() < deadline:
        for position, address in enumerate(addresses):
            sender = _grpc_sender(address, payload)
            try:
                for _ in range(warmup_sends):
                    next(sender)
            except grpc.RpcError:
                sender.close()
                continue
            return position, sender
        time.sleep(RAFT_ELECTED_POLL_S)
    raise RuntimeError(f"no stock PySyncObj leader within {RAFT_ELECTED_TIMEOUT_S} s")


def _grpc_sender(address: str, payload: bytes) -> Generator[None, None, None]:
    """Sends through kq's produce stream; each `next` is one round trip."""
    channel = grpc.insecure_channel(address)
    stream = _ProduceStream(kq_pb2_grpc.BrokerStub(channel), address)
    try:
        while True:
            batch = encode_batch([NewRecord(None, payload)])
            stream.exchange(kq_pb2.ProduceRequest(topic="floor", partition=0, records=batch), REPLY_TIMEOUT_S)
            yield
    finally:
        stream.close()
        channel.close()


def _tcp_sender(address: str, payload: bytes) -> Generator[None, None, None]:
    """Sends frames on a blocking socket; each `next` is one round trip."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), REPLY_TIMEOUT_S) as connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            batch = encode_batch([NewRecord(None, payload)])
            connection.sendall(FRAME.pack(len(batch), 0) + batch)
            answer = b""
            while len(answer) < FRAME.size:
                chunk = connection.recv(FRAME.size - len(answer))
                if not chunk:
                    raise ConnectionError("the leader closed the connection")
                answer += chunk
            yield


@dataclass(frozen=True, slots=True)
class Timing:
    """The timed sends of one round: each answered one's round trip, and the seconds they all took."""

    latencies_ms: list[float]
    elapsed_s: float
    failed: int  # Sends answered with an error (then sent again, or left: NATS's), not in latencies_ms.


Timed = Callable[[int], Timing]  # Makes this many timed sends.


def _timed(send: Callable[[], bool], sends: int) -> Timing:
    """Calls `send` (True if answered, False if it failed) `sends` times."""
    latencies_ms = []
    failed = 0
    started = time.perf_counter()
    for _ in range(sends):
        sent = time.perf_counter_ns()
        if send():
            latencies_ms.append((time.perf_counter_ns() - sent) / 1e6)
        else:
            failed += 1
    return Timing(latencies_ms, time.perf_counter() - started, failed)


class _RaftSends:
    """Sends to stock PySyncObj's leader; a send that fails (the library discarded it: a new leader
    was elected) is counted, and the next goes to the leader found anew (one untimed send finds it).
    At most RAFT_FAILED_SENDS_MAX fail in one round. `leader` is the first leader's position: the
    CPU split of a round with a new leader keeps the first one's process as "leader"."""

    def __init__(self, addresses: list[str], payload: bytes) -> None:
        self._addresses = addresses
        self._payload = payload
        self.leader, self._sender = _leader_sender(addresses, payload, WARMUP_SENDS)
        self._failed = 0

    def send(self) -> bool:
        try:
            next(self._sender)
            return True
        except grpc.RpcError:
            self._failed += 1
            if self._failed > RAFT_FAILED_SENDS_MAX:
                raise
            self._sender.close()
            _, self._sender = _leader_sender(self._addresses, self._payload, 1)
            return False

    def close(self) -> None:
        self._sender.close()


@contextmanager
def _system(variant: str, value_bytes: int, base: Path) -> Iterator[tuple[list[int], Timed]]:
    """One variant started and warmed up: its server PIDs, leader first, and its timed sends."""
    payload = os.urandom(value_bytes)
    if variant == "kq":
        with LocalCluster(base / "kq") as cluster:
            leader = cluster.wait_ready()
            pids = cluster.pids()
            with KqClient(cluster.bootstrap) as client:
                client.create_topic(KQ_TOPIC, 1)
                for _ in range(WARMUP_SENDS):
                    client.send(KQ_TOPIC, payload, partition=0)
                ordered = [pids[leader], *(pid for node, pid in pids.items() if node != leader)]
                yield (
                    ordered,
                    lambda sends: _timed(lambda: bool(client.send(KQ_TOPIC, payload, partition=0)), sends),
                )
        return
    if variant == "nats":
        with NatsSystem(CompareSettings(counts=FULL_COUNTS), base / "nats") as nats:
            nats.latency(WARMUP_SENDS)
            servers = nats.server_pids()
            leader = nats._run(nats._stream_leader(LATENCY), NATS_LEADER_TIMEOUT_S)

            def timed(sends: int) -> Timing:
                sample = nats.latency(sends)
                return Timing(list(sample.latencies_ms), sample.elapsed_s, sample.errors)

            yield [servers[leader], *(pid for name, pid in servers.items() if name != leader)], timed
        return
    with _cluster(variant, base) as started:
        addresses = [address for address, _ in started]
        part_pids = [process.pid for _, process in started]
        if "raft" in variant.split("+"):
            raft = _RaftSends(addresses, payload)  # Warmed up.
            part_pids.insert(0, part_pids.pop(raft.leader))
            try:
                yield part_pids, lambda sends: _timed(raft.send, sends)
            finally:
                raft.close()
            return
        sender = (_grpc_sender if variant.startswith("grpc") else _tcp_sender)(addresses[0], payload)
        try:
            for _ in range(WARMUP_SENDS):
                next(sender)
            yield part_pids, lambda sends: _timed(lambda: next(sender) is None, sends)
        finally:
            sender.close()


def measure(variant: str, sends: int, value_bytes: int, base: Path) -> Round:
    """One round of one variant on fresh processes."""
    with _system(variant, value_bytes, base) as (pids, timed):
        cpu_before = [cpu_seconds(pid) for pid in pids]
        client_before = own_cpu_seconds()
        timing = timed(sends)
        client_s = own_cpu_seconds() - client_before
        used = [cpu_seconds(pid) - before for pid, before in zip(pids, cpu_before, strict=True)]
    latencies_ms = sorted(timing.latencies_ms)
    if not latencies_ms:
        raise RuntimeError(f"{variant}: no send was answered")
    count = len(latencies_ms)
    return Round(
        p50_ms=statistics.median(latencies_ms),
        p99_ms=latencies_ms[min(count - 1, int(count * 0.99))],
        msgs_per_s=count / timing.elapsed_s,
        leader_cpu_us=used[0] / count * 1e6,
        followers_cpu_us=sum(used[1:]) / count * 1e6,
        client_cpu_us=client_s / count * 1e6,
        failed=timing.failed,
    )


def run(variants: tuple[str, ...], sends: int, runs: int, value_bytes: int) -> dict[str, list[Round]]:
    """`runs` rounds, each measuring every variant in turn on fresh processes."""
    results: dict[str, list[Round]] = {variant: [] for variant in variants}
    with tempfile.TemporaryDirectory(prefix="kq-floor-") as base:
        for number in range(runs):
            for variant in variants:
                results[variant].append(measure(variant, sends, value_bytes, Path(base) / str(number)))
    return results


def table(results: dict[str, list[Round]]) -> str:
    """A markdown table of the medians over rounds (the range in brackets for the rate)."""
    lines = [
        "| variant | p50 ms | p99 ms | msgs/s | server CPU µs/msg | leader | followers | client CPU µs/msg |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for variant, rounds in results.items():

        def median(field: str) -> float:
            return float(statistics.median(getattr(r, field) for r in rounds))  # noqa: B023  # Used at once.

        rates = [r.msgs_per_s for r in rounds]
        lines.append(
            f"| {variant} | {median('p50_ms'):.2f} | {median('p99_ms'):.2f} | {median('msgs_per_s'):,.0f} "
            f"({min(rates):,.0f}..{max(rates):,.0f}) | {median('server_cpu_us'):,.0f} "
            f"| {median('leader_cpu_us'):,.0f} | {median('followers_cpu_us'):,.0f} "
            f"| {median('client_cpu_us'):,.0f} |"
        )
    lines.extend(_ratio_lines(results))
    for variant, rounds in results.items():
        if any(r.failed for r in rounds):
            per_round = ", ".join(str(r.failed) for r in rounds)
            lines.append(f"\n{variant}: sends answered with an error, by round: {per_round} (not timed)")
    return "\n".join(lines)


def _ratio_lines(results: dict[str, list[Round]]) -> list[str]:
    """kq against each other variant of the same run, round by round: the median of each round's kq
    figure over that round's figure of the variant (issue 40's point 2 compares p50 and server CPU
    with the `grpc+raft+lmdb` floor "in the same run"). Rounds taken in pairs follow the machine's
    minutes together, where two sets of medians can each land in a different minute (or, for stock
    PySyncObj, a different mode: bench/README.md); the rounds' ratios are listed too."""
    ours = results.get("kq")
    if not ours:
        return []
    lines: list[str] = []
    for variant, rounds in results.items():
        if variant == "kq" or len(rounds) != len(ours):
            continue
        pairs = list(zip(ours, rounds, strict=True))
        lines.append(
            f"\nkq / {variant}, the median of the rounds' ratios: p50 "
            f"{_ratios([(mine.p50_ms, theirs.p50_ms) for mine, theirs in pairs])}, server CPU "
            f"{_ratios([(mine.server_cpu_us, theirs.server_cpu_us) for mine, theirs in pairs])}"
        )
    return lines


def _ratios(pairs: list[tuple[float, float]]) -> str:
    """The median of the pairs' ratios and the ratios; a pair whose second figure is 0 (a run too short
    for /proc's 10 ms CPU ticks) has none, and with none at all the figure reads "-"."""
    ratios = [mine / theirs for mine, theirs in pairs if theirs > 0]
    if not ratios:
        return "-"
    return f"{statistics.median(ratios):.2f}x ({', '.join(f'{ratio:.2f}' for ratio in ratios)})"


@click.command()
@click.option("--sends", type=click.IntRange(1, SENDS_MAX), default=3000, show_default=True)
@click.option("--runs", type=click.IntRange(1, RUNS_MAX), default=3, show_default=True)
@click.option("--value-bytes", type=click.IntRange(1, FRAME_BYTES_MAX // 2), default=100, show_default=True)
@click.option("--variants", default=",".join(VARIANTS), show_default=True, help="Comma-separated.")
@click.option("--role", type=click.Choice(["leader", "follower", "raft"]), hidden=True)
@click.option("--port", type=int, hidden=True)
@click.option("--follower", "followers", type=int, multiple=True, hidden=True)
@click.option("--front", type=click.Choice(["grpc", "tcp"]), default="grpc", hidden=True)
@click.option("--store-dir", type=click.Path(path_type=Path), hidden=True)
@click.option("--raft-port", type=int, hidden=True)
def main(
    sends: int,
    runs: int,
    value_bytes: int,
    variants: str,
    role: str | None,
    port: int | None,
    followers: tuple[int, ...],
    front: str,
    store_dir: Path | None,
    raft_port: int | None,
) -> None:
    """Measures one record in flight through the stack alone (see the module docstring)."""
    if role is not None:  # One of the three processes (started by `run`).
        if port is None or (role == "raft") != (raft_port is not None):
            raise click.UsageError("--role needs --port, and --raft-port with raft only")
        asyncio.run(_serve(role, port, list(followers), front, store_dir, raft_port))
        return
    chosen = tuple(v.strip() for v in variants.split(",") if v.strip())
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown or not chosen:
        raise click.BadParameter(f"choose from {', '.join(VARIANTS)}", param_hint="--variants")
    click.echo(f"one record in flight of {value_bytes} B, {sends} sends after {WARMUP_SENDS}, {runs} rounds")
    try:
        click.echo(table(run(chosen, sends, runs, value_bytes)))
    except NatsServerMissingError as error:  # The `nats` variant without the bench extra.
        raise click.ClickException(f"{error} (or leave out the nats variant: --variants)") from None


if __name__ == "__main__":
    main()
