"""`python -m kq.bench.streams`: what many open `FetchStream` consumers cost the cluster (issue 18).

A fresh three-node `kq.deploy.cluster.LocalCluster` gets a topic of `--partitions` partitions. For each
level N of `--streams` (default 0, 100, 1000, 2000), N raw `FetchStream` calls are opened, spread
round-robin over the three nodes and the partitions, `--streams-per-connection` of them on one gRPC
channel (`grpc.use_local_subchannel_pool`, so every channel is its own TCP connection, as separate
client processes would be). Once refusals have settled, for `--duration-s` seconds:

- one-record sends with one request in flight (`KqClient.send`, to the leader): p50/p99 latency;
- then `Producer` throughput: PRODUCER_RECORDS records (at most PRODUCER_S_MAX seconds) through
  `kq.client.Producer` with its defaults, records acknowledged per second;
- streams admitted (still open) and refused (RESOURCE_EXHAUSTED: kq's TOO_MANY_READERS, or gRPC's
  own concurrent-RPC limit), and other failures;
- every node's VmRSS and OS thread count (`bench/procfs.py`), sampled each second;
- ListTopics and ClusterStatus on every node, each with a 2 s deadline, every `PROBE_PERIOD_S`.

After the sends, each admitted stream must reach its partition's log end within `DELIVERY_GRACE_S`
(it started at the log end of when it opened, so it must receive exactly the records sent to its
partition). The streams are then cancelled and their channels closed before the next level. All
streams live on one asyncio loop (grpc.aio) in a background thread; every wait is bounded, and a
level never runs longer than `SCENARIO_TIME_CAP_S`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from kq.bench import procfs
from kq.bench.background import StreamHolder, timed_sends
from kq.bench.compare_kq import FutureTally
from kq.bench.report import percentile
from kq.bench.settings import SCENARIO_TIME_CAP_S
from kq.client import KqClient, Producer
from kq.deploy.cluster import LocalCluster, work_dir
from kq.proto import kq_pb2, kq_pb2_grpc
from kq.proto.errors import ERROR_CODE_METADATA_KEY, ErrorCode
from kq.proto.limits import (
    CLIENT_STATUS_TIMEOUT_S,
    FETCH_RECORDS_MAX,
    GRPC_MESSAGE_BYTES_MAX,
    GRPC_WORKERS_DEFAULT,
    GRPC_WORKERS_MAX,
    GRPC_WORKERS_MIN,
    PARTITIONS_MAX,
)

TOPIC = "bench-streams"
PARTITIONS_DEFAULT = 80
LEVELS_DEFAULT = (0, 100, 1000, 2000)
LEVELS_QUICK = (0, 50)
DURATION_S_DEFAULT = 10.0
DURATION_S_QUICK = 2.0
STREAMS_MAX = 5_000  # Streams of one level: a few thousand sockets and tasks in this one process.
STREAMS_PER_CONNECTION_DEFAULT = 8  # Far below the node's per-connection limit (READERS_PER_CONNECTION_MAX).
PRODUCER_RECORDS = 20_000
PRODUCER_S_MAX = 10.0
VALUE = b"s" * 100
SETTLE_QUIET_S = 1.0  # Refusals come at once; no new one for this long means the rest were admitted.
SETTLE_MAX_S = 10.0
OPEN_TIMEOUT_S = 30.0  # Creating the channels and calls of one level.
PROBE_PERIOD_S = 2.0
PROBE_DEADLINE_S = CLIENT_STATUS_TIMEOUT_S  # "Answers within 2 s".
SAMPLE_PERIOD_S = 1.0
DELIVERY_GRACE_S = 5.0  # After the last send, for the admitted streams to reach the log end.
CLOSE_TIMEOUT_S = 10.0
# A node frees a cancelled stream's reader slot as soon as the cancel reaches it: the next level opens
# after this, so it never finds the last level's slots still taken.
RELEASE_WAIT_S = 1.0
SEND_RETRY_S = 5.0  # All attempts of one timed send, so a stuck send cannot carry a level past its cap.
DURATION_S_MAX = SCENARIO_TIME_CAP_S - SETTLE_MAX_S - DELIVERY_GRACE_S - SEND_RETRY_S - PRODUCER_S_MAX
CHANNEL_OPTIONS = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES_MAX),
]


@dataclass(slots=True)
class StreamState:
    """One consumer stream, written by the asyncio loop's thread only."""

    node_id: str
    partition: int
    next_offset: int
    records: int = 0
    ended: bool = False
    code: str | None = None  # The gRPC status name it ended with.
    kq_code: int | None = None  # The kq ErrorCode number from trailing metadata, if any.


@dataclass(frozen=True, slots=True)
class StreamCounts:
    """How the requested streams of one level fared."""

    requested: int
    admitted: int  # Open after the settle (or ended only by our cancel).
    refused: int  # RESOURCE_EXHAUSTED.
    refused_too_many_readers: int  # Of those: kq's TOO_MANY_READERS (23).
    failed: int  # Ended with any other status before we cancelled.
    admitted_by_node: dict[str, int]
    delivered_caught_up: int  # Admitted streams that reached their partition's log end.
    records_received: int  # By all streams, during the level.


@dataclass(frozen=True, slots=True)
class NodeSample:
    """The most a node used during the level."""

    rss_kib_max: int
    threads_max: int
    cpu_s: float  # utime + stime during the measured seconds.


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """ListTopics and ClusterStatus on one node during the level."""

    calls: int
    failures: int  # Not answered within PROBE_DEADLINE_S, or an error.
    slowest_ms: float


@dataclass(frozen=True, slots=True)
class LevelReport:
    """One level of open streams."""

    streams: int
    elapsed_s: float
    sends: int
    send_errors: int
    client_cpu_s: float  # This process (sender, streams, probes) during the measured seconds.
    p50_ms: float | None
    p99_ms: float | None
    producer_records_per_s: float  # Acknowledged records per second through Producer.
    producer_errors: int
    counts: StreamCounts
    nodes: dict[str, NodeSample]
    probes: dict[str, ProbeResult]


@dataclass(frozen=True, slots=True)
class StreamsSettings:
    """What a run is told."""

    levels: tuple[int, ...] = LEVELS_DEFAULT
    partitions: int = PARTITIONS_DEFAULT
    duration_s: float = DURATION_S_DEFAULT
    streams_per_connection: int = STREAMS_PER_CONNECTION_DEFAULT
    grpc_workers: int = GRPC_WORKERS_DEFAULT
    base_dir: Path | None = None


@dataclass(slots=True)
class StreamsReport:
    """The whole run."""

    settings: dict[str, Any]
    levels: list[LevelReport] = field(default_factory=list)


class NodeSampler(procfs.PeriodicSampler):
    """Keeps each node's largest VmRSS and OS thread count."""

    def __init__(self, pids: dict[str, int]) -> None:
        super().__init__(SAMPLE_PERIOD_S, "bench-streams-nodes")
        self._pids = pids
        self.rss_kib_max = dict.fromkeys(pids, 0)
        self.threads_max = dict.fromkeys(pids, 0)

    def sample(self) -> None:
        """Reads VmRSS and /proc/PID/task of every node."""
        for node_id, pid in self._pids.items():
            try:
                rss_kib = procfs.memory(pid).rss_kib
                threads = procfs.thread_count(pid)
            except (OSError, KeyError):
                continue  # Gone or mid-exit: the harness reports a dead node.
            self.rss_kib_max[node_id] = max(self.rss_kib_max[node_id], rss_kib)
            self.threads_max[node_id] = max(self.threads_max[node_id], threads)


class Prober:
    """Calls ListTopics and ClusterStatus on every node every PROBE_PERIOD_S in a thread."""

    def __init__(self, addresses: dict[str, str]) -> None:
        self._channels = {n: grpc.insecure_channel(a, options=CHANNEL_OPTIONS) for n, a in addresses.items()}
        self._stubs = {n: kq_pb2_grpc.BrokerStub(c) for n, c in self._channels.items()}
        self._calls = dict.fromkeys(addresses, 0)
        self._failures = dict.fromkeys(addresses, 0)
        self._slowest_s = dict.fromkeys(addresses, 0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-streams-probe", daemon=True)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=PROBE_PERIOD_S + 4 * PROBE_DEADLINE_S * len(self._stubs))
        for channel in self._channels.values():
            channel.close()

    def results(self) -> dict[str, ProbeResult]:
        """What the probes saw per node."""
        return {
            n: ProbeResult(self._calls[n], self._failures[n], round(self._slowest_s[n] * 1000, 2))
            for n in self._stubs
        }

    def probe_once(self) -> None:
        """Both calls on every node, each with PROBE_DEADLINE_S."""
        for node_id, stub in self._stubs.items():
            calls: tuple[tuple[Any, Any], ...] = (
                (stub.ListTopics, kq_pb2.ListTopicsRequest()),
                (stub.ClusterStatus, kq_pb2.ClusterStatusRequest()),
            )
            for method, request in calls:
                started = time.monotonic()
                try:
                    method(request, timeout=PROBE_DEADLINE_S)
                except grpc.RpcError:
                    self._failures[node_id] += 1
                took = time.monotonic() - started
                self._calls[node_id] += 1
                self._slowest_s[node_id] = max(self._slowest_s[node_id], took)

    def _run(self) -> None:
        self.probe_once()
        while not self._stop.wait(PROBE_PERIOD_S):  # A probing period, not synchronization.
            self.probe_once()


class StreamLoop(StreamHolder):
    """An asyncio loop in a background thread holding the consumer streams of one level."""

    def __init__(self) -> None:
        super().__init__("bench-streams-aio", CLOSE_TIMEOUT_S)
        self.states: list[StreamState] = []
        self.last_end = time.monotonic()

    def open(self, states: list[StreamState], addresses: dict[str, str], per_channel: int) -> None:
        """Opens one stream per state, `per_channel` of the same node's streams on one channel."""
        self.states = states
        self.run(self._open(addresses, per_channel), OPEN_TIMEOUT_S, "opening the streams")

    async def _open(self, addresses: dict[str, str], per_channel: int) -> None:
        by_node: dict[str, list[StreamState]] = {}
        for state in self.states:
            by_node.setdefault(state.node_id, []).append(state)
        for node_id, states in by_node.items():
            for first in range(0, len(states), per_channel):
                channel = grpc.aio.insecure_channel(addresses[node_id], options=CHANNEL_OPTIONS)
                self._channels.append(channel)
                stub = kq_pb2_grpc.BrokerStub(channel)
                for state in states[first : first + per_channel]:
                    self._tasks.append(asyncio.ensure_future(self._consume(stub, state)))

    async def _consume(self, stub: kq_pb2_grpc.BrokerStub, state: StreamState) -> None:
        request = kq_pb2.FetchRequest(
            topic=TOPIC,
            partition=state.partition,
            offset=state.next_offset,
            max_records=FETCH_RECORDS_MAX,
            max_bytes=1024 * 1024,
            as_batches=True,
        )
        call: Any = stub.FetchStream(request)
        self._calls.append(call)
        try:
            async for response in call:
                for batch in response.batches:
                    end = batch.base_offset + batch.record_count
                    if end > state.next_offset:
                        state.records += end - max(batch.base_offset, state.next_offset)
                        state.next_offset = end
        except grpc.aio.AioRpcError as error:
            state.code = error.code().name
            trailing: Any = error.trailing_metadata() or ()
            for key, value in trailing:
                if key == ERROR_CODE_METADATA_KEY:
                    state.kq_code = int(value)
        except asyncio.CancelledError:
            state.code = grpc.StatusCode.CANCELLED.name
        else:
            state.code = grpc.StatusCode.OK.name
        state.ended = True
        self.last_end = time.monotonic()

    def ended_count(self) -> int:
        """Streams that have ended so far."""
        return self.run(self._ended(), CLOSE_TIMEOUT_S, "counting the ended streams")

    async def _ended(self) -> int:
        return sum(state.ended for state in self.states)


def settle(streams: StreamLoop, deadline: float) -> None:
    """Waits until no stream has ended for SETTLE_QUIET_S (refusals come at once), at most SETTLE_MAX_S."""
    started = time.monotonic()
    limit = min(deadline, started + SETTLE_MAX_S)
    while time.monotonic() < limit:
        streams.ended_count()  # A round trip through the loop: its callbacks have run.
        if time.monotonic() - max(streams.last_end, started) >= SETTLE_QUIET_S:
            return
        time.sleep(0.1)


def run_level(
    cluster: LocalCluster,
    client: KqClient,
    sender: KqClient,
    settings: StreamsSettings,
    count: int,
    streams: StreamLoop,
) -> LevelReport:
    """Opens `count` streams, measures for the duration, checks delivery, cancels them."""
    started = time.monotonic()
    deadline = started + SCENARIO_TIME_CAP_S
    addresses = {node_id: spec.grpc_address for node_id, spec in cluster.nodes.items()}
    node_ids = sorted(addresses)
    ends = {p: o.log_end_offset for p, o in sender.list_offsets(TOPIC).items()}
    states = [
        StreamState(node_ids[i % len(node_ids)], i % settings.partitions, ends[i % settings.partitions])
        for i in range(count)
    ]
    streams.open(states, addresses, settings.streams_per_connection)
    settle(streams, deadline)
    pids = cluster.pids()
    with NodeSampler(pids) as sampler, Prober(addresses) as prober:
        cpu_before, client_cpu_before = procfs.cpu_seconds_each(pids), procfs.own_cpu_seconds()
        measure_until = min(
            time.monotonic() + settings.duration_s, deadline - DELIVERY_GRACE_S - SEND_RETRY_S
        )
        measured_from = time.monotonic()
        latencies, send_errors = timed_sends(sender, TOPIC, VALUE, max(0.0, measure_until - measured_from))
        elapsed_s = time.monotonic() - measured_from
        throughput, producer_errors = producer_throughput(sender)
        cpu_after, client_cpu_after = procfs.cpu_seconds_each(pids), procfs.own_cpu_seconds()
    ends = {p: o.log_end_offset for p, o in sender.list_offsets(TOPIC).items()}
    snapshot = list(streams.states)

    def open_ones() -> list[StreamState]:
        return [s for s in snapshot if not s.ended]

    grace_until = min(time.monotonic() + DELIVERY_GRACE_S, deadline)
    while time.monotonic() < grace_until and any(s.next_offset < ends[s.partition] for s in open_ones()):
        time.sleep(0.1)
    streams.ended_count()
    counts = stream_counts(snapshot, ends)
    streams.close()
    time.sleep(RELEASE_WAIT_S)  # Bounded: the documented time for a node to free a cancelled stream's slot.
    return LevelReport(
        streams=count,
        elapsed_s=round(elapsed_s, 2),
        sends=len(latencies),
        send_errors=send_errors,
        client_cpu_s=round(client_cpu_after - client_cpu_before, 2),
        p50_ms=round(percentile(latencies, 50), 2) if latencies else None,
        p99_ms=round(percentile(latencies, 99), 2) if latencies else None,
        producer_records_per_s=round(throughput),
        producer_errors=producer_errors,
        counts=counts,
        nodes={
            n: NodeSample(
                sampler.rss_kib_max[n], sampler.threads_max[n], round(cpu_after[n] - cpu_before[n], 2)
            )
            for n in sorted(sampler.rss_kib_max)
        },
        probes=prober.results(),
    )


def producer_throughput(client: KqClient) -> tuple[float, int]:
    """Records per second `Producer` (its defaults) gets acknowledged, and how many sends were not
    (failed, or unresolved when the flush ran out of time)."""
    tally = FutureTally()
    producer = Producer(client)
    started = time.monotonic()
    stop_at = started + PRODUCER_S_MAX
    try:
        for number in range(PRODUCER_RECORDS):
            if number % 1_000 == 0 and time.monotonic() >= stop_at:
                break
            tally.watch(producer.send(TOPIC, VALUE))
        with contextlib.suppress(TimeoutError):  # Counted below as not acknowledged.
            producer.flush(timeout_s=max(0.0, stop_at - time.monotonic()) + SEND_RETRY_S)
        elapsed_s = time.monotonic() - started
    finally:
        producer.close(timeout_s=SEND_RETRY_S)
    return tally.acked / elapsed_s, tally.sent - tally.acked


def stream_counts(states: Sequence[StreamState], ends: dict[int, int]) -> StreamCounts:
    """Sorts the streams of a level into admitted, refused and failed (read before they are cancelled)."""
    refused = [s for s in states if s.ended and s.code == grpc.StatusCode.RESOURCE_EXHAUSTED.name]
    failed = [s for s in states if s.ended and s.code != grpc.StatusCode.RESOURCE_EXHAUSTED.name]
    admitted = [s for s in states if not s.ended]
    by_node: dict[str, int] = {}
    for state in admitted:
        by_node[state.node_id] = by_node.get(state.node_id, 0) + 1
    return StreamCounts(
        requested=len(states),
        admitted=len(admitted),
        refused=len(refused),
        refused_too_many_readers=sum(s.kq_code == ErrorCode.TOO_MANY_READERS for s in refused),
        failed=len(failed),
        admitted_by_node=dict(sorted(by_node.items())),
        delivered_caught_up=sum(s.next_offset >= ends[s.partition] for s in admitted),
        records_received=sum(s.records for s in states),
    )


def run(settings: StreamsSettings) -> StreamsReport:
    """Starts the cluster, runs every level, stops every node by PID."""
    described = asdict(settings)
    described["levels"] = list(settings.levels)
    described["base_dir"] = str(settings.base_dir) if settings.base_dir is not None else None
    report = StreamsReport(settings=described)
    node_args = ("--grpc-workers", str(settings.grpc_workers))
    with (
        work_dir(settings.base_dir, "kq-bench-streams-") as base,
        LocalCluster(base / "cluster", node_args=node_args) as cluster,
        KqClient(cluster.bootstrap, retry_timeout_s=SEND_RETRY_S, rpc_timeout_s=SEND_RETRY_S) as sender,
        KqClient(cluster.bootstrap) as client,
    ):
        cluster.wait_ready()
        sender.create_topic(TOPIC, settings.partitions)  # The sender reads the offsets next: its own write.
        streams = StreamLoop()
        print(f"{HEADER}\n{RULE}", flush=True)
        try:
            for count in settings.levels:
                level = run_level(cluster, client, sender, settings, count, streams)
                report.levels.append(level)
                print(render_row(level), flush=True)
        finally:
            streams.stop_loop()
    return report


HEADER = (
    "| streams | admitted | refused | failed | caught up | sends | p50 ms | p99 ms | Producer rec/s "
    "| RSS MiB (max per node) | threads (max per node) | node CPU s | client CPU s "
    "| probes slowest ms / failed |"
)
RULE = "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|---|"


def render_row(level: LevelReport) -> str:
    """One table row."""
    c = level.counts
    rss = " / ".join(f"{n.rss_kib_max / 1024:.0f}" for n in level.nodes.values())
    threads = " / ".join(str(n.threads_max) for n in level.nodes.values())
    cpu = " / ".join(f"{n.cpu_s:.1f}" for n in level.nodes.values())
    slowest = max((p.slowest_ms for p in level.probes.values()), default=0.0)
    probe_failures = sum(p.failures for p in level.probes.values())
    probe_calls = sum(p.calls for p in level.probes.values())
    p50 = f"{level.p50_ms:.2f}" if level.p50_ms is not None else "-"
    p99 = f"{level.p99_ms:.2f}" if level.p99_ms is not None else "-"
    return (
        f"| {level.streams:,} | {c.admitted:,} | {c.refused:,} | {c.failed:,} | {c.delivered_caught_up:,} "
        f"| {level.sends:,} | {p50} | {p99} | {level.producer_records_per_s:,.0f} "
        f"| {rss} | {threads} | {cpu} | {level.client_cpu_s:.1f} "
        f"| {slowest:.0f} / {probe_failures} of {probe_calls} |"
    )


def render(report: StreamsReport) -> str:
    """The whole table."""
    return "\n".join([HEADER, RULE, *(render_row(level) for level in report.levels)])


def parse_args(argv: Sequence[str] | None) -> tuple[StreamsSettings, Path | None]:
    """The settings and the JSON path from the command line."""
    parser = argparse.ArgumentParser(prog="python -m kq.bench.streams", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="levels 0,50 and 2 s each: a smoke run")
    parser.add_argument("--streams", help="comma-separated stream counts (default 0,100,1000,2000)")
    parser.add_argument("--partitions", type=int, default=PARTITIONS_DEFAULT)
    parser.add_argument("--duration-s", type=float, help=f"seconds measured per level ({DURATION_S_DEFAULT})")
    parser.add_argument("--streams-per-connection", type=int, default=STREAMS_PER_CONNECTION_DEFAULT)
    parser.add_argument("--grpc-workers", type=int, default=GRPC_WORKERS_DEFAULT, help="of every node")
    parser.add_argument("--base-dir", type=Path, help="node data (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    levels: tuple[int, ...] = LEVELS_QUICK if args.quick else LEVELS_DEFAULT
    if args.streams:
        levels = tuple(int(part) for part in args.streams.split(","))
    duration_s = args.duration_s or (DURATION_S_QUICK if args.quick else DURATION_S_DEFAULT)
    if not all(0 <= level <= STREAMS_MAX for level in levels):
        parser.error(f"--streams: each count in 0..{STREAMS_MAX}")
    if not 1 <= args.partitions <= PARTITIONS_MAX:
        parser.error(f"--partitions: 1..{PARTITIONS_MAX}")
    if not 0 < duration_s <= DURATION_S_MAX:
        parser.error(f"--duration-s: above 0, at most {DURATION_S_MAX}")
    if not 1 <= args.streams_per_connection <= STREAMS_MAX:
        parser.error("--streams-per-connection: at least 1")
    if not GRPC_WORKERS_MIN <= args.grpc_workers <= GRPC_WORKERS_MAX:
        parser.error(f"--grpc-workers: {GRPC_WORKERS_MIN}..{GRPC_WORKERS_MAX}")
    settings = StreamsSettings(
        levels, args.partitions, duration_s, args.streams_per_connection, args.grpc_workers, args.base_dir
    )
    return settings, args.json


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark, prints the table, writes the JSON if asked."""
    settings, json_path = parse_args(argv)
    report = run(settings)
    print()
    print(render(report))
    if json_path is not None:
        json_path.write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
