"""`python -m kq.bench.scale`: how kq's throughput grows with client processes (issue 37's benchmark).

    python -m kq.bench.scale [--levels 1,2,4,8,16] [--sizes 100,1024] [--partitions 24] [--seconds 10]

For each value size, a fresh `LocalCluster` (three `kq-node` processes on loopback, Kafka listeners
on; `--fresh level` starts one per level instead), and for each level P:

1. a topic of `--partitions` partitions (one per level and run, so each level reads back exactly what
   it wrote);
2. P producer processes (`kq.bench.scale_worker`, confluent-kafka/librdkafka; settings below), each
   proven with one delivered record; after `--warmup-seconds` of producing, the window of `--seconds`
   starts: delivery reports without error inside it are the level's msgs/s (each process's count over
   its own window, summed), payload bytes of those its MB/s (10^6 bytes). After the window each
   producer flushes (bounded) and reports every delivery report it got;
3. the topic's records (ListOffsets on the leader) must equal every delivery report without error:
   each delivered record stored once, none lost, none twice (idempotent producers);
4. with `--consumers` (the default), min(P, partitions) consumer processes, each assigned every P-th
   partition from offset 0 (no group), read the topic up to its end offsets, bounded by
   `--consume-seconds`: records read / (last record's arrival - the start) is the consumers' msgs/s.

CPU is read from /proc (`procfs.tree_cpu_seconds`) at the window's start and end: each node's whole
process tree (utime + stime, children included: a node that later runs worker processes counts
whole), divided by the wall time between the readings, is its cores; the leader (`wait_ready`'s
agreed leader) is marked. The producer processes' CPU ("client cores") and the host's busy share say
whether the clients or the machine were the limit. The same readings are taken around the consume
phase. Every level repeats `--runs` times (each run on its own fresh clusters); the tables give
medians. `--processes N` runs every node as N worker processes (one Raft group each, `kq-node
--processes`), and `--node-arg` passes any other flag to every node, so the scale-out's node options
are measured with the same tool as today's single group.

Producer settings (librdkafka): acks=all, enable.idempotence=true (so at most 5 requests in flight
per connection, retried without duplicates), linger.ms=`--linger-ms` (5: librdkafka's default),
batch.size=`--batch-bytes` (1,000,000: its default), batch.num.messages=10,000 (kq's records per
produce batch, `RECORDS_PER_APPEND_MAX`), no compression, no key (the sticky partitioner spreads
batches over every partition), queue.buffering.max.messages=100,000, message.timeout.ms=30,000.
Consumer settings: fetch.min.bytes=1, max.partition.fetch.bytes=1 MiB, fetch.max.bytes=kq's
`FETCH_BYTES_MAX`, queued.min.messages=1,000,000 (librdkafka's 100,000 paused a fast reader for a
second at a time: `CONSUMER_QUEUED_MESSAGES`), no commits. Kafka Metadata names the Raft leader for
every partition, so all clients talk to the leader today.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import queue
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import click
import confluent_kafka

from kq.bench import procfs
from kq.bench.report import write_json
from kq.bench.scale_report import summarize, tables
from kq.client import KqClient
from kq.deploy.cluster import LocalCluster, work_dir
from kq.deploy.provenance import UNKNOWN, source_commit, source_dirty
from kq.deploy.waiting import WaitTimeoutError
from kq.proto.limits import FETCH_BYTES_MAX, PARTITIONS_MAX, RECORDS_PER_APPEND_MAX

logger = logging.getLogger(__name__)

LEVELS_DEFAULT = "1,2,4,8,16"
SIZES_DEFAULT = "100,1024"
PARTITIONS_DEFAULT = 24  # Enough for 16 consumer processes to share, and for groups to spread later.
SECONDS_DEFAULT = 10.0
WARMUP_SECONDS_DEFAULT = 2.0
LINGER_MS_DEFAULT = 5  # librdkafka's default, spelled out.
BATCH_BYTES_DEFAULT = 1_000_000  # librdkafka's default batch.size, spelled out.
LEVEL_MAX = 64  # Producer processes of one level.
NODES_MAX = 9
PROCESSES_MAX = 64
RUNS_MAX = 20
SECONDS_MAX = 600.0
VALUE_BYTES_MAX = 512 * 1024  # Under librdkafka's message.max.bytes (1,000,000) and kq's RECORD_BYTES_MAX.
QUEUE_MESSAGES_MAX = 100_000  # librdkafka's queue.buffering.max.messages (its default), spelled out.
MESSAGE_TIMEOUT_MS = 30_000  # A record without acknowledgement this long is reported failed.
# A consumer whose local queue holds queued.min.messages of a partition stops fetching it for
# fetch.queue.backoff.ms. At librdkafka's 100,000 a consumer that reads fast waits a second at a time:
# one consumer read 1,000,000 records of 100 B at 204,000/s with it and 626,000/s with 1,000,000 here.
# Memory stays bounded by queued.max.messages.kbytes (its default, 64 MiB).
CONSUMER_QUEUED_MESSAGES = 1_000_000
CONSUMER_QUEUED_KIB = 65_536
READY_TIMEOUT_S = 60.0  # A worker's start and first delivered record (or the consumer's metadata).
GO_TIMEOUT_S = READY_TIMEOUT_S + 30.0  # A ready worker waits this long for the others and the start.
DRAIN_TIMEOUT_S = MESSAGE_TIMEOUT_MS / 1000 + 15.0  # A producer's flush: every report comes by then.
RESULT_GRACE_S = 30.0  # Beyond the window and the drain, for a worker's result line.
EXIT_TIMEOUT_S = 10.0  # A worker that reported (or whose stdin closed) exits by itself within this.
STOP_TIMEOUT_S = 5.0  # After SIGTERM, before SIGKILL.
KILL_TIMEOUT_S = 10.0
ADMIN_TIMEOUT_S = 30.0  # Creating a topic, reading its offsets, a level's leader.
LOG_TAIL_BYTES = 2_000  # Of a failed worker's log, in the error.
MIB = 1024 * 1024


class WorkerError(RuntimeError):
    """A worker process reported an error or ended without its result."""


@dataclass(frozen=True, slots=True)
class ScaleSettings:
    """One invocation's shape (the JSON's `settings`)."""

    levels: tuple[int, ...] = (1, 2, 4, 8, 16)
    sizes: tuple[int, ...] = (100, 1024)
    nodes: int = 3
    partitions: int = PARTITIONS_DEFAULT
    seconds: float = SECONDS_DEFAULT
    warmup_seconds: float = WARMUP_SECONDS_DEFAULT
    consumers: bool = True
    consume_seconds: float = SECONDS_DEFAULT
    runs: int = 1
    fresh: str = "size"  # "size": one cluster per size and run; "level": one per level.
    node_args: tuple[str, ...] = ()
    processes: int = 1  # Worker processes per node (kq-node --processes), one per Raft group.
    linger_ms: int = LINGER_MS_DEFAULT
    batch_bytes: int = BATCH_BYTES_DEFAULT
    base_dir: Path | None = None


def producer_config(bootstrap: str, settings: ScaleSettings) -> dict[str, Any]:
    """librdkafka's producer settings (module docstring), every one that shapes the load spelled out."""
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "max.in.flight.requests.per.connection": 5,
        "linger.ms": settings.linger_ms,
        "batch.size": settings.batch_bytes,
        "batch.num.messages": RECORDS_PER_APPEND_MAX,
        "compression.type": "none",
        "queue.buffering.max.messages": QUEUE_MESSAGES_MAX,
        "message.timeout.ms": MESSAGE_TIMEOUT_MS,
    }


def consumer_config(bootstrap: str) -> dict[str, Any]:
    """librdkafka's consumer settings: assigned partitions, large fetches, nothing committed."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": f"kq-scale-{uuid.uuid4().hex[:8]}",  # Required by librdkafka; never joined.
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "fetch.min.bytes": 1,
        "max.partition.fetch.bytes": MIB,
        "fetch.max.bytes": FETCH_BYTES_MAX,
        "fetch.wait.max.ms": 500,  # librdkafka's default: only a fetch at the end of the data waits.
        "queued.min.messages": CONSUMER_QUEUED_MESSAGES,
        "queued.max.messages.kbytes": CONSUMER_QUEUED_KIB,
        "fetch.queue.backoff.ms": 1000,  # librdkafka's default, spelled out (see CONSUMER_QUEUED_MESSAGES).
        "enable.partition.eof": False,
    }


# Worker processes ---------------------------------------------------------------------------------


class WorkerGroup:
    """The worker processes of one phase (`kq.bench.scale_worker`), started with a JSON spec each and
    spoken to by one JSON line at a time; leaving the `with` block ends every one still running, by
    PID (stdin closed, then SIGTERM, then SIGKILL), on success, error or Ctrl-C alike."""

    def __init__(self, name: str, specs: Sequence[dict[str, Any]], log_dir: Path) -> None:
        self._name = name
        self._specs = list(specs)
        self._log_dir = log_dir
        self._processes: list[subprocess.Popen[str]] = []
        self._logs: list[Path] = []
        self._lines: queue.SimpleQueue[tuple[int, str | None]] = queue.SimpleQueue()

    def __enter__(self) -> WorkerGroup:
        try:
            for number, spec in enumerate(self._specs):
                self._start(number, spec)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def _start(self, number: int, spec: dict[str, Any]) -> None:
        log_path = self._log_dir / f"{self._name}-{number}.log"
        self._logs.append(log_path)
        with open(log_path, "ab") as log:  # The child holds its own descriptor from here on.
            process = subprocess.Popen(
                [sys.executable, "-m", "kq.bench.scale_worker", json.dumps(spec)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        self._processes.append(process)
        assert process.stdout is not None
        threading.Thread(
            target=self._read, args=(number, process.stdout), name=f"scale-{self._name}-{number}", daemon=True
        ).start()

    def _read(self, number: int, stdout: IO[str]) -> None:
        """Passes each line the worker says to the queue, then None at its end of output."""
        for line in stdout:
            self._lines.put((number, line))
        self._lines.put((number, None))

    def pids(self) -> list[int]:
        """Every worker's PID."""
        return [process.pid for process in self._processes]

    def collect(self, key: str, timeout_s: float) -> list[Any]:
        """Waits for a message holding `key` from every worker and returns those values, by worker.

        Raises WorkerError when one reports an error or ends without it, WaitTimeoutError when
        `timeout_s` passes first."""
        values: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        while len(values) < len(self._processes):
            remaining_s = deadline - time.monotonic()
            try:
                number, line = self._lines.get(timeout=max(0.0, remaining_s))
            except queue.Empty:
                missing = [n for n in range(len(self._processes)) if n not in values]
                raise WaitTimeoutError(
                    f"timed out after {timeout_s:.0f} s waiting for '{key}' from {self._name} worker(s) "
                    f"{missing}; logs in {self._log_dir}"
                ) from None
            if line is None and number in values:
                continue  # It said what was awaited and ended, as a worker does after its result.
            message = json.loads(line) if line is not None else None
            if message is None or "error" in message:
                reason = message["error"] if message else f"it ended without a word ({self._exit(number)})"
                raise WorkerError(
                    f"{self._name} worker {number} (PID {self._processes[number].pid}) failed: {reason}; "
                    f"its log ends: {self._log_tail(number)}"
                )
            if key in message:
                values[number] = message[key]
        return [values[number] for number in range(len(self._processes))]

    def _exit(self, number: int) -> str:
        """How a worker whose output ended exited (negative: the signal that ended it)."""
        try:
            return f"exit code {self._processes[number].wait(timeout=EXIT_TIMEOUT_S)}"
        except subprocess.TimeoutExpired:
            return "still running"

    def _log_tail(self, number: int) -> str:
        try:
            return self._logs[number].read_bytes()[-LOG_TAIL_BYTES:].decode(errors="replace").strip()
        except OSError:
            return "(no log)"

    def send(self, message: dict[str, Any]) -> None:
        """One line to every worker."""
        line = json.dumps(message) + "\n"
        for process in self._processes:
            assert process.stdin is not None
            process.stdin.write(line)
            process.stdin.flush()

    def stop(self) -> None:
        """Ends every worker by its PID: stdin closed (a waiting one exits), then SIGTERM, then
        SIGKILL, each wait bounded; reaps them all."""
        for process in self._processes:
            if process.stdin is not None and not process.stdin.closed:
                with contextlib.suppress(OSError):  # It ended already: the pipe is broken.
                    process.stdin.close()
        for grace_s, end in ((EXIT_TIMEOUT_S, None), (STOP_TIMEOUT_S, "terminate"), (KILL_TIMEOUT_S, "kill")):
            running = [process for process in self._processes if process.poll() is None]
            if not running:
                break
            for process in running:
                if end == "terminate":
                    process.terminate()
                elif end == "kill":
                    process.kill()
            deadline = time.monotonic() + grace_s
            for process in running:
                try:
                    process.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    continue  # The next, harder step follows.
        for process in self._processes:
            if process.stdout is not None:
                process.stdout.close()


# CPU readings -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CpuReading:
    """CPU seconds so far of each node's process tree and of the clients, the host's counters, and when."""

    at: float  # time.monotonic()
    nodes: dict[str, float]
    clients: float
    host: procfs.HostCpu


def read_cpu(node_pids: dict[str, int], client_pids: Sequence[int]) -> CpuReading:
    """One reading. A client that already ended counts nothing (its failure is reported elsewhere)."""
    clients = 0.0
    for pid in client_pids:
        try:
            clients += procfs.cpu_seconds(pid)
        except OSError:
            continue
    nodes = {node: procfs.tree_cpu_seconds(pid) for node, pid in node_pids.items()}
    return CpuReading(time.monotonic(), nodes, clients, procfs.host_cpu())


def cpu_between(before: CpuReading, after: CpuReading) -> dict[str, Any]:
    """Cores used between two readings: per node, by the clients together, and the host's busy share."""
    wall_s = max(after.at - before.at, 1e-9)
    return {
        "cpu_wall_s": wall_s,
        "node_cores": {node: (after.nodes[node] - before.nodes[node]) / wall_s for node in before.nodes},
        "client_cores": (after.clients - before.clients) / wall_s,
        "host_busy": after.host.busy_fraction_since(before.host),
    }


def _sleep_until(moment: float) -> None:
    """Waits for a moment on the monotonic clock: a measurement's timing, not a synchronization."""
    time.sleep(max(0.0, moment - time.monotonic()))


# One level ----------------------------------------------------------------------------------------


def _produce_phase(
    cluster: LocalCluster, settings: ScaleSettings, size: int, level: int, topic: str, log_dir: Path
) -> dict[str, Any]:
    """P producers: ready, warm-up, the measured window with CPU read at both ends, then the drain."""
    spec = {
        "role": "produce",
        "topic": topic,
        "value_bytes": size,
        "config": producer_config(cluster.kafka_bootstrap, settings),
        "ready_timeout_s": READY_TIMEOUT_S,
        "go_timeout_s": GO_TIMEOUT_S,
        "drain_timeout_s": DRAIN_TIMEOUT_S,
    }
    node_pids = cluster.pids()
    with WorkerGroup(f"{topic}-producer", [spec] * level, log_dir) as workers:
        workers.collect("ready", READY_TIMEOUT_S)
        start = time.monotonic() + settings.warmup_seconds
        end = start + settings.seconds
        workers.send({"start": start, "end": end})
        _sleep_until(start)
        before = read_cpu(node_pids, workers.pids())
        _sleep_until(end)
        after = read_cpu(node_pids, workers.pids())
        results = workers.collect("result", settings.seconds + DRAIN_TIMEOUT_S + RESULT_GRACE_S)
    rate = sum(r["window_delivered"] / r["window_s"] for r in results if r["window_s"] > 0)
    return {
        "producers": level,
        "msgs_per_s": rate,
        "mb_per_s": rate * size / 1e6,
        "window_s": max(r["window_s"] for r in results),
        "window_delivered": sum(r["window_delivered"] for r in results),
        "window_failed": sum(r["window_failed"] for r in results),
        "produced": sum(r["produced"] for r in results),
        "delivered": sum(r["delivered"] for r in results),
        "failed": sum(r["failed"] for r in results),
        "undelivered": sum(r["undelivered"] for r in results),
        "first_error": next((r["first_error"] for r in results if r["first_error"]), ""),
        "workers": results,
        "pids": workers.pids(),
        **cpu_between(before, after),
    }


def _consume_phase(
    cluster: LocalCluster,
    settings: ScaleSettings,
    level: int,
    topic: str,
    ends: dict[int, int],
    log_dir: Path,
) -> dict[str, Any]:
    """min(P, partitions) consumers, each every P-th partition from offset 0 up to `ends`."""
    count = min(level, settings.partitions)
    specs = [
        {
            "role": "consume",
            "topic": topic,
            "ends": {str(p): end for p, end in sorted(ends.items()) if p % count == number},
            "config": consumer_config(cluster.kafka_bootstrap),
            "ready_timeout_s": READY_TIMEOUT_S,
            "go_timeout_s": GO_TIMEOUT_S,
        }
        for number in range(count)
    ]
    node_pids = cluster.pids()
    with WorkerGroup(f"{topic}-consumer", specs, log_dir) as workers:
        workers.collect("ready", READY_TIMEOUT_S)
        before = read_cpu(node_pids, workers.pids())
        workers.send({"start": before.at, "end": before.at + settings.consume_seconds})
        results = workers.collect("result", settings.consume_seconds + RESULT_GRACE_S)
        after = read_cpu(node_pids, workers.pids())
    records = sum(r["records"] for r in results)
    payload_bytes = sum(r["bytes"] for r in results)
    elapsed_s = max((r["last_at"] for r in results), default=0.0) - before.at
    rate = records / elapsed_s if records and elapsed_s > 0 else 0.0
    return {
        "consumers": count,
        "records": records,
        "bytes": payload_bytes,
        "elapsed_s": elapsed_s,
        "msgs_per_s": rate,
        "mb_per_s": payload_bytes / elapsed_s / 1e6 if records and elapsed_s > 0 else 0.0,
        "complete": all(r["complete"] for r in results),
        "errors": sum(r["errors"] for r in results),
        "first_error": next((r["first_error"] for r in results if r["first_error"]), ""),
        "pids": workers.pids(),
        **cpu_between(before, after),
    }


def measure_level(
    cluster: LocalCluster, settings: ScaleSettings, run: int, size: int, level: int, log_dir: Path
) -> dict[str, Any]:
    """One run of one level on a running cluster: a new topic, the producers, then the consumers.

    Each phase records the agreed leader before it (`leader`, whose CPU the tables show first) and
    after it (`leader_after`): on an overloaded machine an election can move the leader mid-phase, and
    the CPU split then reads differently (the report says so)."""
    leader = cluster.wait_ready(timeout_s=ADMIN_TIMEOUT_S)
    topic = f"scale-r{run}-{size}b-p{level}"
    with KqClient(cluster.bootstrap, retry_timeout_s=ADMIN_TIMEOUT_S) as admin:
        admin.create_topic(topic, settings.partitions)
        produce = _produce_phase(cluster, settings, size, level, topic, log_dir)
        produce["leader"] = leader
        produce["leader_after"] = cluster.wait_ready(timeout_s=ADMIN_TIMEOUT_S)
        # The leader has applied every entry it or an earlier leader acknowledged.
        offsets = admin.list_offsets(topic, node=cluster.nodes[produce["leader_after"]].grpc_address)
    ends = {partition: offset.log_end_offset for partition, offset in offsets.items()}
    produce["stored"] = sum(offset.log_end_offset - offset.log_start_offset for offset in offsets.values())
    record: dict[str, Any] = {
        "run": run,
        "size": size,
        "level": level,
        "topic": topic,
        "leader": leader,
        "node_pids": cluster.pids(),
        "produce": produce,
    }
    if settings.consumers:
        consume_leader = cluster.wait_ready(timeout_s=ADMIN_TIMEOUT_S)
        record["consume"] = _consume_phase(cluster, settings, level, topic, ends, log_dir)
        record["consume"]["leader"] = consume_leader
        record["consume"]["leader_after"] = cluster.wait_ready(timeout_s=ADMIN_TIMEOUT_S)
    logger.info(
        "run %d, %d B, %d producer(s): %s msgs/s, %.1f MB/s, leader %s cores %.2f%s",
        run,
        size,
        level,
        f"{produce['msgs_per_s']:,.0f}",
        produce["mb_per_s"],
        leader,
        produce["node_cores"][leader],
        f"; {record['consume']['msgs_per_s']:,.0f} msgs/s read" if settings.consumers else "",
    )
    return record


# Runs ---------------------------------------------------------------------------------------------


@contextmanager
def _cluster(settings: ScaleSettings, directory: Path, keep: bool) -> Iterator[LocalCluster]:
    """A fresh cluster in `directory`, its nodes stopped by PID afterwards; the directory (node data
    and logs, workers' logs) is removed afterwards unless `keep`."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        with LocalCluster(
            directory, size=settings.nodes, node_args=settings.node_args, processes=settings.processes
        ) as cluster:
            cluster.wait_ready(timeout_s=ADMIN_TIMEOUT_S)
            yield cluster
    finally:
        if not keep:
            shutil.rmtree(directory, ignore_errors=True)


def run_levels(
    settings: ScaleSettings,
    base_dir: Path,
    keep: bool,
    measured: Callable[[list[dict[str, Any]]], object] = lambda records: None,
) -> list[dict[str, Any]]:
    """Every run of every size and level, each size (or level, `fresh="level"`) on a fresh cluster;
    `measured` is given the records so far after each level (the command writes its JSON then, so a
    run cut short still leaves what it measured)."""
    records: list[dict[str, Any]] = []
    for run in range(1, settings.runs + 1):
        for size in settings.sizes:
            groups = (
                [[level] for level in settings.levels] if settings.fresh == "level" else [settings.levels]
            )
            for levels in groups:
                directory = base_dir / f"run{run}-{size}b" / ("-".join(map(str, levels)))
                with _cluster(settings, directory, keep) as cluster:
                    for level in levels:
                        records.append(measure_level(cluster, settings, run, size, level, directory))
                        measured(records)
    return records


# The command --------------------------------------------------------------------------------------


def parse_counts(value: str, low: int, high: int, what: str) -> tuple[int, ...]:
    """A comma-separated list of integers in [low, high], duplicates dropped, in order; click.BadParameter
    on anything else."""
    try:
        counts = tuple(dict.fromkeys(int(part) for part in value.split(",") if part.strip()))
    except ValueError:
        raise click.BadParameter(f"{what}: comma-separated integers, e.g. 1,2,4") from None
    if not counts or any(not low <= count <= high for count in counts):
        raise click.BadParameter(f"{what}: each between {low} and {high}")
    return counts


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return "unknown CPU"


def _meta(started: float, load_at_start: tuple[float, float, float]) -> dict[str, Any]:
    """Where, when and with what the numbers were taken. KQ_SOURCE_COMMIT, when set, names the commit:
    whoever shipped a tree outside its checkout (the offline bundle, bench/device_scale.sh) says which
    one it is, since git would answer for whatever checkout surrounds it, or not at all."""
    shipped = os.environ.get("KQ_SOURCE_COMMIT")
    commit = shipped or source_commit()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)),
        "started_at_unix": started,
        "duration_s": time.time() - started,
        "command": " ".join(["python -m kq.bench.scale", *map(shlex.quote, sys.argv[1:])]),
        "git_commit": commit,
        "git_dirty": None if shipped or commit == UNKNOWN else source_dirty(),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "load_average_start": list(load_at_start),
        "load_average_end": list(os.getloadavg()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
    }


def build_document(
    meta: dict[str, Any], settings: ScaleSettings, records: list[dict[str, Any]], complete: bool = True
) -> dict[str, Any]:
    """The JSON report: meta, settings, the per-run level records, the summary rows and the tables;
    `complete` is False in the copies written while levels remain."""
    summary = summarize(records)
    settings_document = asdict(settings)
    settings_document["base_dir"] = str(settings.base_dir) if settings.base_dir is not None else None
    settings_document["producer_config"] = producer_config("", settings)
    settings_document["consumer_config"] = consumer_config("")
    return {
        "complete": complete,
        "meta": meta,
        "settings": settings_document,
        "levels": records,
        "summary": summary,
        "tables": tables(summary),
    }


def _heading(size: int, settings: ScaleSettings) -> str:
    processes = f" of {settings.processes} processes" if settings.processes > 1 else ""
    return (
        f"{size} B values, {settings.nodes} nodes{processes}, {settings.partitions} partitions, "
        f"{settings.seconds:g} s per level after {settings.warmup_seconds:g} s warm-up, "
        f"median of {settings.runs} run(s)"
    )


@click.command(context_settings={"show_default": True})
@click.option("--levels", default=LEVELS_DEFAULT, help="Producer processes per level, comma-separated.")
@click.option("--sizes", default=SIZES_DEFAULT, help="Value sizes in bytes, comma-separated.")
@click.option("--nodes", type=click.IntRange(1, NODES_MAX), default=3)
@click.option("--partitions", type=click.IntRange(1, PARTITIONS_MAX), default=PARTITIONS_DEFAULT)
@click.option("--seconds", type=click.FloatRange(0.5, SECONDS_MAX), default=SECONDS_DEFAULT, help="Window.")
@click.option("--warmup-seconds", type=click.FloatRange(0, SECONDS_MAX), default=WARMUP_SECONDS_DEFAULT)
@click.option(
    "--consumers/--no-consumers",
    default=True,
    help="After each level's producers, min(P, partitions) consumer processes read back what they wrote.",
)
@click.option(
    "--consume-seconds",
    type=click.FloatRange(0.5, SECONDS_MAX),
    default=None,
    help="Bound of the read-back. [default: --seconds]",
)
@click.option("--runs", type=click.IntRange(1, RUNS_MAX), default=1, help="Repetitions; tables give medians.")
@click.option(
    "--fresh",
    type=click.Choice(["size", "level"]),
    default="size",
    help="A fresh cluster per size (and run), or per level.",
)
@click.option("--linger-ms", type=click.IntRange(0, 1000), default=LINGER_MS_DEFAULT)
@click.option(
    "--batch-bytes", type=click.IntRange(1024, 1_000_000), default=BATCH_BYTES_DEFAULT, help="batch.size."
)
@click.option(
    "--node-arg",
    "node_args",
    multiple=True,
    help="Extra kq-node flag for every node, verbatim (repeat for each word, e.g. --node-arg=--grpc-workers "
    "--node-arg=128).",
)
@click.option(
    "--processes",
    type=click.IntRange(1, PROCESSES_MAX),
    default=1,
    help="Worker processes per node (kq-node --processes: one per Raft group; the harness gives each its "
    "ports). Node cores count a node's whole process tree.",
)
@click.option(
    "--quick", is_flag=True, help="One level of one producer, 100 B, 4 partitions, 2 s: a smoke run."
)
@click.option(
    "--json",
    "output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="JSON result file. [default: bench/results/scale-<timestamp>.json]",
)
@click.option(
    "--base-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep node data and logs (and the workers' logs) here instead of a temporary directory.",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning"]), default="info")
def main(
    levels: str,
    sizes: str,
    nodes: int,
    partitions: int,
    seconds: float,
    warmup_seconds: float,
    consumers: bool,
    consume_seconds: float | None,
    runs: int,
    fresh: str,
    linger_ms: int,
    batch_bytes: int,
    node_args: tuple[str, ...],
    processes: int,
    quick: bool,
    output: Path | None,
    base_dir: Path | None,
    log_level: str,
) -> None:
    """P producer processes (librdkafka, acks=all) per level against a fresh kq cluster, then P consumers:
    msgs/s, MB/s and CPU cores per node process (see the module docstring)."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = ScaleSettings(
        levels=parse_counts(levels, 1, LEVEL_MAX, "--levels"),
        sizes=parse_counts(sizes, 1, VALUE_BYTES_MAX, "--sizes"),
        nodes=nodes,
        partitions=partitions,
        seconds=seconds,
        warmup_seconds=warmup_seconds,
        consumers=consumers,
        consume_seconds=consume_seconds if consume_seconds is not None else seconds,
        runs=runs,
        fresh=fresh,
        node_args=node_args,
        processes=processes,
        linger_ms=linger_ms,
        batch_bytes=batch_bytes,
        base_dir=base_dir,
    )
    if quick:
        settings = replace(
            settings, levels=(1,), sizes=(100,), partitions=4, seconds=2.0, warmup_seconds=1.0, runs=1
        )
        settings = replace(settings, consume_seconds=consume_seconds or 30.0)
    started, load_at_start = time.time(), os.getloadavg()
    stamp = time.strftime("scale-%Y%m%d-%H%M%S", time.localtime(started))

    def write(records: list[dict[str, Any]], complete: bool = False) -> Path:
        document = build_document(_meta(started, load_at_start), settings, records, complete)
        return write_json(document, output, stamp)

    with work_dir(base_dir, "kq-scale-") as directory:
        records = run_levels(settings, directory, base_dir is not None, write)
    path = write(records, complete=True)
    document = json.loads(path.read_text())
    for size in settings.sizes:
        click.echo(f"\n{_heading(size, settings)}\n\n{document['tables'][str(size)]}")
    click.echo(f"\nresults: {path}")


if __name__ == "__main__":
    main()
