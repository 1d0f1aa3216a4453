"""kq next to NATS JetStream: the shared scenarios, their bounded counts, and the run loop.

Each system (`bench.compare_kq.KqSystem`, kq over gRPC; `bench.compare_kafka.KqKafkaSystem`, the
same kq cluster type through its Kafka port with confluent-kafka; `bench.compare_nats.NatsSystem`)
starts its own three-node cluster on loopback and implements the same five workloads with its own client; this
module runs them `runs` times, run-major (run 1 of every scenario, then run 2, ...), and measures
the servers' CPU around each run from `/proc/PID/stat`. The systems run one after the other, never
at the same time: they share two cores with each other's clients.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from kq.bench import procfs
from kq.bench.failover import FailoverSample
from kq.bench.produce_fetch import LatencySample, ThroughputSample
from kq.client.producer import BATCH_BYTES_DEFAULT

logger = logging.getLogger(__name__)

SYSTEMS = ("kq", "kq-kafka", "nats")  # The order systems run in; NATS is the baseline of the ratios.
BASELINE = "nats"  # The system every ratio in the report divides by.
DURABILITIES = ("replicated", "fsync")  # kq-node's --durability values; the first is kq's default.
# How the kq systems' clients reach the nodes; the first is the default. "tls": gRPC over mutual TLS
# (`LocalCluster(tls_dir=...)`: certificates from kq.deploy.certs, the client presents `admin`'s)
# and, for kq-kafka, the Kafka listener over TLS (`--kafka-tls`, security.protocol=SSL).
SECURITIES = ("plain", "tls")
# The report's columns, in order: a kq system under `--durability=fsync` gets its own column
# ("kq-fsync"), so one run can put both modes beside NATS (`--kq-durability replicated,fsync`); one
# over TLS likewise ("kq-tls", "kq-fsync-tls": `--kq-security plain,tls`).
COLUMNS = (
    "kq",
    "kq-tls",
    "kq-fsync",
    "kq-fsync-tls",
    "kq-kafka",
    "kq-kafka-tls",
    "kq-kafka-fsync",
    "kq-kafka-fsync-tls",
    "nats",
)
# Columns measured with kq's gRPC client (the send_batch rows).
KQ_GRPC_COLUMNS = ("kq", "kq-tls", "kq-fsync", "kq-fsync-tls")
LATENCY = "latency-100b"  # (1) one record in flight.
PRODUCE_SMALL = "produce-100b"  # (2) pipelined produce of 100-byte values.
PRODUCE_LARGE = "produce-1kib"  # (2) pipelined produce of 1 KiB values.
CONSUME = "consume-100b"  # (3) read the 100-byte records back.
FAILOVER = "failover"  # (5) kill -9 of the leader under load.
# kq only, next to the Producer: `KqClient.send_batch` from several threads (the pre-Producer way).
PRODUCE_SMALL_THREADS = "produce-100b-send-batch"
PRODUCE_LARGE_THREADS = "produce-1kib-send-batch"
SCENARIOS = (LATENCY, PRODUCE_SMALL, PRODUCE_LARGE, CONSUME, FAILOVER)
PRODUCE_SCENARIOS = (PRODUCE_SMALL, PRODUCE_LARGE, PRODUCE_SMALL_THREADS, PRODUCE_LARGE_THREADS)
SMALL_VALUE_BYTES = 100
LARGE_VALUE_BYTES = 1024
RUNS_DEFAULT = 3
RUNS_MAX = 20
SCENARIO_TIME_CAP_S = 60.0  # One run of one scenario stops after this long, whatever its count.
FAILOVER_WINDOW_S = 30.0  # After a kill, writers wait at most this long for writes to succeed again.

Sample = LatencySample | ThroughputSample | FailoverSample


@dataclass(frozen=True, slots=True)
class CompareCounts:
    """How much each scenario does per run; every count is also bounded by the time cap."""

    latency_sends: int
    produce_small_records: int
    produce_large_records: int
    consume_records: int  # Read per run; the small-value stream is topped up to this many first.
    failover_load_before_s: float  # Writers run this long before the kill.
    failover_load_after_s: float  # And this long after the first acknowledgement that follows it.
    failover_writers: int  # Concurrent writers, each with one write in flight.


FULL_COUNTS = CompareCounts(
    latency_sends=2_000,
    produce_small_records=300_000,
    produce_large_records=100_000,
    consume_records=1_000_000,
    failover_load_before_s=2.0,
    failover_load_after_s=1.0,
    failover_writers=4,
)
QUICK_COUNTS = CompareCounts(
    latency_sends=50,
    produce_small_records=2_000,
    produce_large_records=500,
    consume_records=5_000,
    failover_load_before_s=0.5,
    failover_load_after_s=0.2,
    failover_writers=2,
)


@dataclass(frozen=True, slots=True)
class CompareSettings:
    """One invocation of `python -m kq.bench.compare`."""

    counts: CompareCounts
    runs: int = RUNS_DEFAULT
    systems: tuple[str, ...] = SYSTEMS
    partitions: int = 6  # kq topics of the produce and consume scenarios.
    scenario_time_cap_s: float = SCENARIO_TIME_CAP_S
    failover_window_s: float = FAILOVER_WINDOW_S
    kq_send_batch: bool = True  # Also measure kq's send_batch from threads (extra rows).
    kq_threads: int = 8  # Threads of the send_batch scenarios.
    # Producer batch_size (the Producer's own default, 256 KiB); values per send_batch request.
    kq_batch_bytes: int = BATCH_BYTES_DEFAULT
    kq_linger_ms: int = 5
    kq_max_in_flight: int = 5
    nats_max_pending: int = 4_000  # Outstanding async publishes of the NATS client.
    nats_fetch_batch: int = 10_000  # Messages per pull request of the NATS consumer.
    nats_consume: str = "pull"  # How nats-py reads: "pull", "fetch" or "ordered" (`bench.nats_consume`).
    kq_durability: str = "replicated"  # The kq nodes' --durability ("fsync": acknowledged once on disk).
    # Each kq system runs once per durability here, in this order (its `kq_durability` set to each).
    kq_durabilities: tuple[str, ...] = ("replicated",)
    kq_security: str = "plain"  # How the kq systems' clients reach the nodes (`SECURITIES`).
    # Each kq system runs once per security here (after the durabilities: every pair), in this order.
    kq_securities: tuple[str, ...] = ("plain",)
    interleave: bool = False  # Round-robin: run N of every system on fresh clusters, then run N + 1.
    base_dir: Path | None = None  # Where servers keep data; None means a fresh temporary directory.

    def records_for(self, scenario: str) -> int:
        """Records (sends for latency) per run of a produce, consume or latency scenario."""
        return {
            LATENCY: self.counts.latency_sends,
            PRODUCE_SMALL: self.counts.produce_small_records,
            PRODUCE_LARGE: self.counts.produce_large_records,
            PRODUCE_SMALL_THREADS: self.counts.produce_small_records,
            PRODUCE_LARGE_THREADS: self.counts.produce_large_records,
            CONSUME: self.counts.consume_records,
        }[scenario]


def column_for(system: str, durability: str, security: str = SECURITIES[0]) -> str:
    """The report column of `system` run with kq-node's `--durability=durability` and its clients
    reaching the nodes in `security` (NATS has one column): the defaults add no suffix."""
    assert durability in DURABILITIES, f"unknown durability {durability!r}"
    assert security in SECURITIES, f"unknown security {security!r}"
    if system == BASELINE:
        return system
    suffixes = (
        durability if durability != DURABILITIES[0] else "",
        security if security != SECURITIES[0] else "",
    )
    return "-".join([system, *filter(None, suffixes)])


def value_for(scenario: str) -> bytes:
    """The value every record of a produce scenario carries."""
    small = scenario in (PRODUCE_SMALL, PRODUCE_SMALL_THREADS)
    return b"v" * (SMALL_VALUE_BYTES if small else LARGE_VALUE_BYTES)


class System(Protocol):
    """One broker under test, with its cluster running; each method is one bounded run."""

    name: str

    def scenarios(self) -> tuple[str, ...]:
        """The scenarios this system runs, in order (`SCENARIOS`, plus kq's gRPC send_batch ones)."""
        ...

    def server_pids(self) -> dict[str, int]:
        """The PID of each running server process."""
        ...

    def describe(self) -> dict[str, Any]:
        """Versions, client mode and settings, for the report."""
        ...

    def latency(self, sends: int) -> LatencySample:
        """Sequential 100-byte sends, one in flight; each round trip timed."""
        ...

    def produce(self, scenario: str, value: bytes, records: int) -> ThroughputSample:
        """Pipelined/batched produce of `records` copies of `value`, acknowledged after replication."""
        ...

    def ensure_records(self, scenario: str, value: bytes, records: int) -> None:
        """Tops the scenario's topic/stream up to `records` (untimed): the consume scenario reads them."""
        ...

    def consume(self, records: int) -> ThroughputSample:
        """Reads `records` 100-byte records from the start of the produce-100b topic/stream."""
        ...

    def failover(self) -> FailoverSample:
        """Writers under load, kill -9 of the leader, the gap until writes are acknowledged again.

        Leaves the cluster with the killed server restarted and caught up.
        """
        ...


def run_system(system: System, settings: CompareSettings) -> dict[str, Any]:
    """Runs every scenario `settings.runs` times on one started system; returns its raw runs."""
    runs: list[dict[str, Any]] = []
    for run in range(1, settings.runs + 1):
        for scenario in system.scenarios():
            logger.info("%s run %d/%d: %s", system.name, run, settings.runs, scenario)
            if scenario == CONSUME:
                value = value_for(PRODUCE_SMALL)
                system.ensure_records(PRODUCE_SMALL, value, settings.counts.consume_records)
            runs.append(_measured_run(system, scenario, run, settings))
    return {"system": system.name, "describe": system.describe(), "runs": runs}


def _measured_run(system: System, scenario: str, run: int, settings: CompareSettings) -> dict[str, Any]:
    """One run of one scenario with the servers', the client's and the machine's CPU around it.

    The machine's dirty pages are written out first (sync(2), outside the measurement): what the
    earlier scenarios and systems wrote would otherwise be written back by the kernel during this
    run, and its page locking and journal work land in the servers' system time. Measured on kq's
    1 KiB `Producer` run, rounds 4-6 of a series without it cost 13-17.5 µs of system time a message
    against 8-9 in the first rounds and in every round with it (bench/README.md, "Latest run")."""
    os.sync()
    pids = system.server_pids()
    server_before, client_before = procfs.cpu_seconds_each(pids), procfs.own_cpu_seconds()
    host_before, started = procfs.host_cpu(), time.monotonic()
    sample: Sample
    if scenario == LATENCY:
        sample = system.latency(settings.records_for(LATENCY))
    elif scenario in PRODUCE_SCENARIOS:
        sample = system.produce(scenario, value_for(scenario), settings.records_for(scenario))
    elif scenario == CONSUME:
        sample = system.consume(settings.records_for(CONSUME))
    else:
        sample = system.failover()
    host_after, wall_s = procfs.host_cpu(), time.monotonic() - started
    client_after = procfs.own_cpu_seconds()
    # A failover run replaces the killed server: only processes alive throughout the run count.
    survivors = {name: pid for name, pid in system.server_pids().items() if pids.get(name) == pid}
    server_after = procfs.cpu_seconds_each(survivors)
    server_cpu_s = {name: server_after[name] - server_before[name] for name in survivors}
    return {
        "scenario": scenario,
        "run": run,
        "sample": asdict(sample),
        "server_cpu_s": server_cpu_s,
        "client_cpu_s": client_after - client_before,
        "wall_s": wall_s,
        "host_cpu_busy": host_after.busy_fraction_since(host_before),
        "host_cpu_s": (host_after.busy_ticks - host_before.busy_ticks) / procfs.CLOCK_TICKS_PER_S,
    }
