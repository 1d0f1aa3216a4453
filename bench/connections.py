"""`python -m kq.bench.connections`: what many idle client connections cost one kq node (issue 18).

A service with thousands of client processes keeps thousands of gRPC connections open to a node, most
of them idle most of the time. Whether a node can hold them, and what they cost it while they say
nothing, is a question of its front end (sockets, HTTP/2 state, pollers), not of Raft: so this
benchmark holds many connections on one node and measures that node.

A fresh three-node `kq.deploy.cluster.LocalCluster` gets a one-partition topic; the measured node is
the leader (it serves the produce requests, so "does it keep answering" covers writes too). For each
level N of `--connections` (default 0, 1,000, 5,000, 10,000), the benchmark opens (or closes) idle
connections until it holds N to that node: each is its own grpc.aio channel with
`grpc.use_local_subchannel_pool`, so its own TCP connection (as N client processes would have), and
each makes one ClusterStatus call, so the connection is really established (TCP and HTTP/2
handshakes, a first stream served), at most `OPEN_CONCURRENCY` at a time. Then, with every connection
idle:

- **idle** (`--idle-s`, 10 s, after `IDLE_SETTLE_S`): the node's utime+stime (`bench/procfs.py`),
  and at its end the node's VmRSS, OS thread count and open file descriptors (`/proc/PID/fd`: one
  per client connection, plus its own files), and this process's CPU, RSS and descriptors beside them;
- **active** (`--duration-s`, 10 s): one-record sends with one in flight (`KqClient.send`, to the
  leader), p50/p99, and on a separate connection ListTopics and ClusterStatus in turn every
  `PROBE_PERIOD_S`, each with a 2 s deadline: p50/p99 and how many missed the deadline or failed;
  the node's CPU per send (did its work per request grow?) and this process's CPU;
- **recheck**: every held connection makes one more call (ListTopics), `OPEN_CONCURRENCY` at a time:
  connections the node dropped while idle, or cannot serve, show up as failures.

The levels build on each other (the 5,000 of one level are the 1,000 of the level before plus 4,000
new ones), so a run opens each connection once. Open files bound what fits: this process raises its
own soft limit to the hard limit, after the cluster started, so the nodes keep the limit they were
given (as a node started from a shell would); a level that cannot fit in this process's limit or in
the node's (`/proc/PID/limits`) stops the run with a message that says so. All connections live on one
asyncio loop in a background thread; every phase is bounded. The machine's busy share in each phase
is reported beside the figures: on a shared machine, compare levels measured when it is low.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc

from kq.bench import procfs
from kq.bench.background import BackgroundLoop, timed_sends
from kq.bench.report import percentile
from kq.bench.settings import SCENARIO_TIME_CAP_S
from kq.client import KqClient
from kq.deploy.cluster import LocalCluster, work_dir
from kq.proto import kq_pb2, kq_pb2_grpc
from kq.proto.limits import (
    CLIENT_STATUS_TIMEOUT_S,
    GRPC_MESSAGE_BYTES_MAX,
    GRPC_WORKERS_DEFAULT,
    GRPC_WORKERS_MAX,
    GRPC_WORKERS_MIN,
)

T = TypeVar("T")

TOPIC = "bench-connections"
LEVELS_DEFAULT = (0, 1_000, 5_000, 10_000)
LEVELS_QUICK = (0, 200)
# One level's sockets in this one process; below the loopback's ephemeral ports (28,231 by default),
# every connection to the one node needing its own. The open-file limits decide what fits.
CONNECTIONS_MAX = 20_000
IDLE_S_DEFAULT = 10.0
IDLE_S_QUICK = 1.0
DURATION_S_DEFAULT = 10.0
DURATION_S_QUICK = 2.0
PHASE_S_MAX = SCENARIO_TIME_CAP_S  # --idle-s and --duration-s each.
VALUE = b"c" * 100
# First calls in flight while opening or rechecking: fewer than the node's default 64 worker threads
# (metadata calls run on them) and far below its limits on calls in progress, so none is refused.
OPEN_CONCURRENCY = 32
OPEN_RPC_TIMEOUT_S = 10.0  # One connection's first call, its TCP and HTTP/2 handshakes included.
OPEN_TIMEOUT_S = 300.0  # Opening (or rechecking) every connection of one level: 10,000 take ~25 s here.
CLOSE_TIMEOUT_S = 60.0
# After the last open, before idle CPU is measured: the node's accepts and first calls are behind it.
IDLE_SETTLE_S = 2.0
PROBE_PERIOD_S = 0.1
PROBE_DEADLINE_S = CLIENT_STATUS_TIMEOUT_S  # "Answers within 2 s".
SAMPLE_PERIOD_S = 1.0
SEND_RETRY_S = 5.0  # All attempts of one timed send.
WARMUP_SENDS = 10  # Untimed sends before each level's clock (the sender's connection, the leader's caches).
# Open files beyond the connections: each process's own (libraries, the store, logs, Raft peers,
# the prober's and sender's channels), with room to spare.
FDS_SPARE = 500
# A connection left alone stays up for the whole run: gRPC's default would drop a channel idle 30 min.
CLIENT_IDLE_TIMEOUT_MS = 24 * 3600 * 1000
CHANNEL_OPTIONS = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES_MAX),
    ("grpc.client_idle_timeout_ms", CLIENT_IDLE_TIMEOUT_MS),
]
PROBE_METHODS = ("ListTopics", "ClusterStatus")


class OpenFilesError(SystemExit):
    """A level's connections cannot fit in an open-file limit (this process's or the node's)."""


@dataclass(frozen=True, slots=True)
class OpenResult:
    """Connections opened (or closed) to reach one level."""

    opened: int
    closed: int
    failed: dict[str, int]  # The first call's gRPC status name -> connections it failed for.
    elapsed_s: float


@dataclass(frozen=True, slots=True)
class RecheckResult:
    """One more call on every held connection, after the level's idle and active phases."""

    ready: int  # Channels in READY before the recheck (the connection never went away).
    answered: int
    failed: dict[str, int]
    elapsed_s: float


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process at the end of the idle phase, and the most it used during the level (opening and
    rechecking included, sampled every SAMPLE_PERIOD_S)."""

    rss_kib: int
    threads: int
    fds: int
    rss_kib_max: int
    threads_max: int
    fds_max: int


@dataclass(frozen=True, slots=True)
class MethodLatency:
    """One probe method on the measured node during the active phase."""

    calls: int
    failures: int  # Not answered within PROBE_DEADLINE_S, or an error.
    p50_ms: float | None
    p99_ms: float | None
    slowest_ms: float | None


@dataclass(frozen=True, slots=True)
class LevelReport:
    """One level of held connections."""

    connections: int
    held: int  # Open and answered, at the end of the level.
    open: OpenResult
    idle_s: float
    node_idle_cpu_s: float  # The measured node's utime + stime during the idle phase.
    node_active_cpu_s: float  # ... and during the active phase (sends and probes).
    client_idle_cpu_s: float  # This process (the connections' other end) during the idle phase.
    client_active_cpu_s: float  # ... and during the active phase.
    # The whole machine's busy share (all CPUs) in each phase: high means something else competed.
    host_busy_idle_percent: float
    host_busy_active_percent: float
    node: ProcessSample
    client: ProcessSample  # This process: the connections' other end, the sender and the prober.
    sends: int
    send_errors: int
    p50_ms: float | None
    p99_ms: float | None
    probes: dict[str, MethodLatency]
    recheck: RecheckResult
    leader_after: str | None  # Who led at the end (the measured node, unless a failover happened).


@dataclass(frozen=True, slots=True)
class ConnectionsSettings:
    """What a run is told."""

    levels: tuple[int, ...] = LEVELS_DEFAULT
    idle_s: float = IDLE_S_DEFAULT
    duration_s: float = DURATION_S_DEFAULT
    grpc_workers: int = GRPC_WORKERS_DEFAULT
    base_dir: Path | None = None


@dataclass(slots=True)
class ConnectionsReport:
    """The whole run."""

    settings: dict[str, Any]
    measured_node: str = ""
    node_open_files_limit: int = 0  # The measured node's soft RLIMIT_NOFILE.
    client_open_files_limit: int = 0  # This process's, after raising it.
    levels: list[LevelReport] = field(default_factory=list)


# Open files -----------------------------------------------------------------------------------------


def open_file_count(pid: int) -> int:
    """The process's open file descriptors (entries of /proc/PID/fd)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def open_files_soft_limit(pid: int) -> int:
    """The process's soft RLIMIT_NOFILE, from /proc/PID/limits (another process's is readable there)."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft = line.split()[3]
            return sys.maxsize if soft == "unlimited" else int(soft)
    raise OSError(f"no 'Max open files' line in /proc/{pid}/limits")


def own_fds_needed(connections: int) -> int:
    """What this process needs open to hold `connections`, at most."""
    return open_file_count(os.getpid()) + connections + FDS_SPARE


def check_own_hard_limit(connections: int) -> None:
    """Fails before anything starts when `connections` cannot fit even at this process's hard limit."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = own_fds_needed(connections)
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise OpenFilesError(
            f"{connections:,} connections need about {needed:,} open files in this process, but its hard "
            f"limit is {hard:,}: raise it (e.g. `ulimit -Hn {needed}` as root, or LimitNOFILE) or ask fewer"
        )


def raise_own_soft_limit() -> int:
    """Raises this process's soft open-file limit to its hard limit; returns the new soft limit."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return open_files_soft_limit(os.getpid())


def check_fits(connections: int, held: int, node_pid: int) -> None:
    """Fails with a clear message when `connections` (of which `held` are open) cannot fit a limit."""
    more = max(0, connections - held)
    own_limit = open_files_soft_limit(os.getpid())
    own_needed = open_file_count(os.getpid()) + more + FDS_SPARE
    if own_needed > own_limit:
        raise OpenFilesError(
            f"{connections:,} connections need about {own_needed:,} open files in this process; "
            f"its limit is {own_limit:,}"
        )
    node_limit = open_files_soft_limit(node_pid)
    node_needed = open_file_count(node_pid) + more + FDS_SPARE
    if node_needed > node_limit:
        raise OpenFilesError(
            f"{connections:,} connections need about {node_needed:,} open files in the node "
            f"(PID {node_pid}), but its soft limit is {node_limit:,} (inherited from the shell that "
            f"started the benchmark): `ulimit -n {node_needed}` first; under systemd, LimitNOFILE"
        )


# Measuring ------------------------------------------------------------------------------------------


class ProcessSampler(procfs.PeriodicSampler):
    """Keeps the largest VmRSS, OS thread count and open descriptor count of one process."""

    def __init__(self, pid: int, name: str) -> None:
        super().__init__(SAMPLE_PERIOD_S, name)
        self._pid = pid
        self.rss_kib_max = 0
        self.threads_max = 0
        self.fds_max = 0

    def sample(self) -> None:
        """Reads /proc/PID/status, /proc/PID/task and /proc/PID/fd."""
        try:
            rss_kib, threads, fds = read_process(self._pid)
        except (OSError, KeyError):
            return  # Gone or mid-exit: the level reports a dead node through its failed calls.
        self.rss_kib_max = max(self.rss_kib_max, rss_kib)
        self.threads_max = max(self.threads_max, threads)
        self.fds_max = max(self.fds_max, fds)

    def at(self, reading: tuple[int, int, int]) -> ProcessSample:
        """One `read_process` reading (rss KiB, threads, fds) with the maxima so far."""
        rss_kib, threads, fds = reading
        return ProcessSample(
            rss_kib,
            threads,
            fds,
            max(self.rss_kib_max, rss_kib),
            max(self.threads_max, threads),
            max(self.fds_max, fds),
        )


def read_process(pid: int) -> tuple[int, int, int]:
    """VmRSS in KiB, OS threads and open file descriptors of one process, now."""
    return procfs.memory(pid).rss_kib, procfs.thread_count(pid), open_file_count(pid)


class Prober:
    """Calls ListTopics and ClusterStatus in turn on one node every PROBE_PERIOD_S, in a thread."""

    def __init__(self, address: str) -> None:
        self._channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        stub = kq_pb2_grpc.BrokerStub(self._channel)
        self._calls: dict[str, tuple[Any, Any]] = {
            "ListTopics": (stub.ListTopics, kq_pb2.ListTopicsRequest()),
            "ClusterStatus": (stub.ClusterStatus, kq_pb2.ClusterStatusRequest()),
        }
        self._latencies_ms: dict[str, list[float]] = {method: [] for method in PROBE_METHODS}
        self._failures = dict.fromkeys(PROBE_METHODS, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-connections-probe", daemon=True)

    def __enter__(self) -> Prober:
        # Untimed: the prober's own connection is set up before the first measured call (if this one
        # fails, the measured calls will too, and say so).
        with contextlib.suppress(grpc.RpcError):
            self._calls["ClusterStatus"][0](kq_pb2.ClusterStatusRequest(), timeout=PROBE_DEADLINE_S)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=PROBE_PERIOD_S + 2 * PROBE_DEADLINE_S)
        self._channel.close()

    def results(self) -> dict[str, MethodLatency]:
        """p50/p99 of the answered calls per method, and the failures."""
        results = {}
        for method, latencies in self._latencies_ms.items():
            failures = self._failures[method]
            results[method] = MethodLatency(
                len(latencies) + failures,
                failures,
                round(percentile(latencies, 50), 2) if latencies else None,
                round(percentile(latencies, 99), 2) if latencies else None,
                round(max(latencies), 2) if latencies else None,
            )
        return results

    def _run(self) -> None:
        turn = 0
        while not self._stop.wait(PROBE_PERIOD_S):  # A probing period, not synchronization.
            method = PROBE_METHODS[turn % len(PROBE_METHODS)]
            turn += 1
            call, request = self._calls[method]
            started = time.perf_counter()
            try:
                call(request, timeout=PROBE_DEADLINE_S)
            except grpc.RpcError:
                self._failures[method] += 1
                continue
            self._latencies_ms[method].append((time.perf_counter() - started) * 1000)


# The connections ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Connection:
    """One idle client connection: its channel and a stub on it (touched on the loop's thread only)."""

    channel: grpc.aio.Channel
    stub: kq_pb2_grpc.BrokerAsyncStub


class ConnectionLoop(BackgroundLoop):
    """An asyncio loop in a background thread holding every idle connection of the run."""

    def __init__(self, address: str) -> None:
        super().__init__("bench-connections-aio")
        self._address = address
        self._held: list[Connection] = []

    @property
    def held(self) -> int:
        """Connections open and answered so far (read from another thread: a list's length)."""
        return len(self._held)

    def resize(self, count: int) -> OpenResult:
        """Opens or closes connections until `count` are held."""
        started = time.monotonic()
        if count < self.held:
            closed = self.held - count
            self.run(self._close(self._held[count:]), CLOSE_TIMEOUT_S, f"closing {closed:,} connections")
            del self._held[count:]
            return OpenResult(0, closed, {}, round(time.monotonic() - started, 2))
        before = self.held
        failed = self.run(
            self._open(count - before), OPEN_TIMEOUT_S, f"opening {count - before:,} connections"
        )
        return OpenResult(self.held - before, 0, failed, round(time.monotonic() - started, 2))

    async def _open(self, count: int) -> dict[str, int]:
        failed: dict[str, int] = {}
        semaphore = asyncio.Semaphore(OPEN_CONCURRENCY)
        await asyncio.gather(*(self._open_one(semaphore, failed) for _ in range(count)))
        return failed

    async def _open_one(self, semaphore: asyncio.Semaphore, failed: dict[str, int]) -> None:
        async with semaphore:
            channel = grpc.aio.insecure_channel(self._address, options=CHANNEL_OPTIONS)
            stub = kq_pb2_grpc.BrokerStub(channel)
            try:
                await stub.ClusterStatus(kq_pb2.ClusterStatusRequest(), timeout=OPEN_RPC_TIMEOUT_S)
            except grpc.aio.AioRpcError as error:
                failed[error.code().name] = failed.get(error.code().name, 0) + 1
                await channel.close(None)
                return
            self._held.append(Connection(channel, stub))

    def recheck(self) -> RecheckResult:
        """One ListTopics on every held connection; the ones that fail are closed and let go."""
        started = time.monotonic()
        ready, failed = self.run(self._recheck(), OPEN_TIMEOUT_S, f"rechecking {self.held:,} connections")
        return RecheckResult(ready, self.held, failed, round(time.monotonic() - started, 2))

    async def _recheck(self) -> tuple[int, dict[str, int]]:
        ready = sum(
            c.channel.get_state(try_to_connect=False) == grpc.ChannelConnectivity.READY for c in self._held
        )
        semaphore = asyncio.Semaphore(OPEN_CONCURRENCY)
        answers = await asyncio.gather(*(self._call_once(semaphore, c) for c in self._held))
        failed: dict[str, int] = {}
        for code in answers:
            if code is not None:
                failed[code] = failed.get(code, 0) + 1
        broken = [c for c, code in zip(self._held, answers, strict=True) if code is not None]
        self._held = [c for c, code in zip(self._held, answers, strict=True) if code is None]
        await self._close(broken)
        return ready, failed

    @staticmethod
    async def _call_once(semaphore: asyncio.Semaphore, connection: Connection) -> str | None:
        async with semaphore:
            try:
                await connection.stub.ListTopics(kq_pb2.ListTopicsRequest(), timeout=OPEN_RPC_TIMEOUT_S)
            except grpc.aio.AioRpcError as error:
                return str(error.code().name)
            return None

    @staticmethod
    async def _close(connections: Sequence[Connection]) -> None:
        await asyncio.gather(*(c.channel.close(None) for c in connections))

    def stop(self) -> None:
        """Closes every connection (bounded), stops the loop and its thread."""
        try:
            self.run(self._close(self._held), CLOSE_TIMEOUT_S, "closing every connection")
        finally:
            self._held = []
            self.stop_loop()


# A level --------------------------------------------------------------------------------------------


def run_level(
    cluster: LocalCluster,
    sender: KqClient,
    connections: ConnectionLoop,
    settings: ConnectionsSettings,
    count: int,
    node_id: str,
) -> LevelReport:
    """Holds `count` connections to the node, measures it idle and active, rechecks every connection."""
    node_pid = cluster.pids()[node_id]
    check_fits(count, connections.held, node_pid)
    with (
        ProcessSampler(node_pid, "bench-connections-node") as node_sampler,
        ProcessSampler(os.getpid(), "bench-connections-client") as client_sampler,
    ):
        opened = connections.resize(count)
        time.sleep(IDLE_SETTLE_S)  # A measurement choice (let the opening end), not synchronization.
        cpu_before, host_before = procfs.cpu_seconds(node_pid), procfs.host_cpu()
        client_cpu_before = procfs.own_cpu_seconds()
        idle_from = time.monotonic()
        time.sleep(settings.idle_s)  # The idle phase: nothing but the held connections.
        node_idle_cpu_s = procfs.cpu_seconds(node_pid) - cpu_before
        client_idle_cpu_s = procfs.own_cpu_seconds() - client_cpu_before
        idle_s = time.monotonic() - idle_from
        host_idle = procfs.host_cpu()
        node_idle, client_idle = read_process(node_pid), read_process(os.getpid())
        node_cpu_active_from, client_cpu_active_from = procfs.cpu_seconds(node_pid), procfs.own_cpu_seconds()
        with Prober(cluster.nodes[node_id].grpc_address) as prober:
            latencies, send_errors = timed_sends(sender, TOPIC, VALUE, settings.duration_s, WARMUP_SENDS)
        node_active_cpu_s = procfs.cpu_seconds(node_pid) - node_cpu_active_from
        client_active_cpu_s = procfs.own_cpu_seconds() - client_cpu_active_from
        host_active = procfs.host_cpu()
        recheck = connections.recheck()
    return LevelReport(
        connections=count,
        held=connections.held,
        open=opened,
        idle_s=round(idle_s, 2),
        node_idle_cpu_s=round(node_idle_cpu_s, 2),
        node_active_cpu_s=round(node_active_cpu_s, 2),
        client_idle_cpu_s=round(client_idle_cpu_s, 2),
        client_active_cpu_s=round(client_active_cpu_s, 2),
        host_busy_idle_percent=round(100 * host_idle.busy_fraction_since(host_before), 1),
        host_busy_active_percent=round(100 * host_active.busy_fraction_since(host_idle), 1),
        node=node_sampler.at(node_idle),
        client=client_sampler.at(client_idle),
        sends=len(latencies),
        send_errors=send_errors,
        p50_ms=round(percentile(latencies, 50), 2) if latencies else None,
        p99_ms=round(percentile(latencies, 99), 2) if latencies else None,
        probes=prober.results(),
        recheck=recheck,
        leader_after=cluster.leader_id(),
    )


def run(settings: ConnectionsSettings) -> ConnectionsReport:
    """Starts the cluster, runs every level on its leader, stops every node by PID."""
    check_own_hard_limit(max(settings.levels))
    described = asdict(settings)
    described["levels"] = list(settings.levels)
    described["base_dir"] = str(settings.base_dir) if settings.base_dir is not None else None
    report = ConnectionsReport(settings=described)
    node_args = ("--grpc-workers", str(settings.grpc_workers))
    with (
        work_dir(settings.base_dir, "kq-bench-connections-") as base,
        LocalCluster(base / "cluster", node_args=node_args) as cluster,
        KqClient(cluster.bootstrap, retry_timeout_s=SEND_RETRY_S, rpc_timeout_s=SEND_RETRY_S) as sender,
    ):
        node_id = cluster.wait_ready()
        # Raised only now: the nodes started with the limit this process was given, as from a shell.
        report.client_open_files_limit = raise_own_soft_limit()
        report.node_open_files_limit = open_files_soft_limit(cluster.pids()[node_id])
        report.measured_node = node_id
        sender.create_topic(TOPIC, 1)
        connections = ConnectionLoop(cluster.nodes[node_id].grpc_address)
        print(
            f"measuring node {node_id} (the leader), open-file limit {report.node_open_files_limit:,}\n"
            f"{HEADER}\n{RULE}",
            flush=True,
        )
        try:
            for count in settings.levels:
                level = run_level(cluster, sender, connections, settings, count, node_id)
                report.levels.append(level)
                print(render_row(level), flush=True)
        finally:
            connections.stop()
    return report


# Output ---------------------------------------------------------------------------------------------

HEADER = (
    "| connections | held | open s | node fds | node RSS MiB | node threads | node idle CPU % "
    "| ListTopics p50 / p99 ms | ClusterStatus p50 / p99 ms | probes failed | sends | produce p50 ms "
    "| produce p99 ms | node CPU ms / send | recheck ok / failed | client RSS MiB "
    "| host busy % idle / active |"
)
RULE = "|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---|---:|---|"


def _ms(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def render_row(level: LevelReport) -> str:
    """One table row."""
    idle_cpu_percent = 100 * level.node_idle_cpu_s / level.idle_s if level.idle_s > 0 else 0.0
    # The node's active CPU over its sends (probes included: they are few and alike at every level).
    cpu_per_send_ms = 1000 * level.node_active_cpu_s / max(1, level.sends)
    probes = {m: f"{_ms(p.p50_ms)} / {_ms(p.p99_ms)}" for m, p in level.probes.items()}
    probe_failures = sum(p.failures for p in level.probes.values())
    probe_calls = sum(p.calls for p in level.probes.values())
    recheck_failed = sum(level.recheck.failed.values())
    open_failed = sum(level.open.failed.values())
    held = f"{level.held:,}" + (f" ({open_failed:,} failed)" if open_failed else "")
    return (
        f"| {level.connections:,} | {held} | {level.open.elapsed_s:.1f} | {level.node.fds:,} "
        f"| {level.node.rss_kib / 1024:.0f} | {level.node.threads} | {idle_cpu_percent:.1f} "
        f"| {probes['ListTopics']} | {probes['ClusterStatus']} | {probe_failures} of {probe_calls} "
        f"| {level.sends:,} | {_ms(level.p50_ms)} | {_ms(level.p99_ms)} | {cpu_per_send_ms:.2f} "
        f"| {level.recheck.answered:,} / {recheck_failed:,} | {level.client.rss_kib / 1024:.0f} "
        f"| {level.host_busy_idle_percent:.0f} / {level.host_busy_active_percent:.0f} |"
    )


def render(report: ConnectionsReport) -> str:
    """The whole table."""
    return "\n".join([HEADER, RULE, *(render_row(level) for level in report.levels)])


def parse_args(argv: Sequence[str] | None) -> tuple[ConnectionsSettings, Path | None]:
    """The settings and the JSON path from the command line."""
    parser = argparse.ArgumentParser(
        prog="python -m kq.bench.connections", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="levels 0,200; 1 s idle, 2 s active")
    parser.add_argument("--connections", help="comma-separated connection counts (default 0,1000,5000,10000)")
    parser.add_argument("--idle-s", type=float, help=f"seconds measured idle per level ({IDLE_S_DEFAULT})")
    parser.add_argument("--duration-s", type=float, help=f"seconds of sends, probes ({DURATION_S_DEFAULT})")
    parser.add_argument("--grpc-workers", type=int, default=GRPC_WORKERS_DEFAULT, help="of every node")
    parser.add_argument("--base-dir", type=Path, help="node data (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    levels: tuple[int, ...] = LEVELS_QUICK if args.quick else LEVELS_DEFAULT
    if args.connections:
        levels = tuple(int(part) for part in args.connections.split(","))
    idle_s = args.idle_s or (IDLE_S_QUICK if args.quick else IDLE_S_DEFAULT)
    duration_s = args.duration_s or (DURATION_S_QUICK if args.quick else DURATION_S_DEFAULT)
    if not levels or not all(0 <= level <= CONNECTIONS_MAX for level in levels):
        parser.error(f"--connections: each count in 0..{CONNECTIONS_MAX}")
    if not 0 < idle_s <= PHASE_S_MAX:
        parser.error(f"--idle-s: above 0, at most {PHASE_S_MAX}")
    if not 0 < duration_s <= PHASE_S_MAX:
        parser.error(f"--duration-s: above 0, at most {PHASE_S_MAX}")
    if not GRPC_WORKERS_MIN <= args.grpc_workers <= GRPC_WORKERS_MAX:
        parser.error(f"--grpc-workers: {GRPC_WORKERS_MIN}..{GRPC_WORKERS_MAX}")
    return ConnectionsSettings(levels, idle_s, duration_s, args.grpc_workers, args.base_dir), args.json


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
