"""What one benchmark invocation runs: the scenarios, their bounded counts and time caps, node tuning.

Every count is a bound: a scenario stops at its record (or send) count or at its time cap,
whichever comes first, so a slow or stuck cluster still ends the benchmark in bounded time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from kq.proto.limits import FETCH_BYTES_MAX, FETCH_RECORDS_MAX


class ScenarioKind(Enum):
    """The kind of work a scenario measures."""

    PRODUCE = "produce"  # Throughput of concurrent producers, records/s.
    FETCH = "fetch"  # Throughput of one reader on a follower, records/s.
    LATENCY = "latency"  # Produce latency with one record in flight, ms.


@dataclass(frozen=True, slots=True)
class Scenario:
    """One measured workload; repeated `BenchSettings.runs` times."""

    name: str
    kind: ScenarioKind
    threads: int
    records_per_request: int
    records_max: int  # Produce/fetch: records per run. Latency: timed sends per run.
    warmup_requests: int = 0  # Untimed requests (per thread) before the clock starts.


RUNS_DEFAULT = 3
RUNS_MAX = 100
VALUE_BYTES_DEFAULT = 100
PARTITIONS_DEFAULT = 12
COMPACTION_MIN_ENTRIES_DEFAULT = 5_000  # The node's own default (`kq-node --help`).
SCENARIO_TIME_CAP_S = 60.0  # One run of one scenario never takes longer than this.
FETCH_RECORDS_PER_REQUEST = FETCH_RECORDS_MAX
FETCH_BYTES_PER_REQUEST = FETCH_BYTES_MAX  # 10,000 small records fit.
THREADS_MAX = 256  # Client threads of one scenario (the node answers at most 256 RPCs at once).
THROUGHPUT_TOPIC = "bench-throughput"
LATENCY_TOPIC = "bench-latency"


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """Everything one invocation needs; `full()` and `quick()` build the two standard shapes."""

    scenarios: tuple[Scenario, ...]
    runs: int = RUNS_DEFAULT
    value_bytes: int = VALUE_BYTES_DEFAULT
    partitions: int = PARTITIONS_DEFAULT
    compaction_min_entries: int = COMPACTION_MIN_ENTRIES_DEFAULT
    scenario_time_cap_s: float = SCENARIO_TIME_CAP_S
    node_args: tuple[str, ...] = ()  # Extra `kq-node` flags, passed verbatim.
    base_dir: Path | None = None  # Where the nodes keep data; None means a fresh temporary directory.
    notes: dict[str, str] = field(default_factory=dict)

    def all_node_args(self) -> tuple[str, ...]:
        """The flags every node starts with."""
        return ("--compaction-min-entries", str(self.compaction_min_entries), *self.node_args)


@dataclass(frozen=True, slots=True)
class ScenarioCounts:
    """The sizes of the standard scenarios; `FULL_COUNTS` and `QUICK_COUNTS` are the two presets."""

    single_threads: int  # Producer threads of (a), one record per request.
    single_records: int
    batch_threads: tuple[int, ...]  # (b) and (c) run once per entry.
    batch_records: int
    fetch_records: int
    latency_sends: int


# About two minutes per run on a 2-core machine (three nodes and the client share the cores).
# Batch scenarios run at 16 threads too: at 4 the commit pipeline, not the CPUs, is the limit.
FULL_COUNTS = ScenarioCounts(
    single_threads=32,
    single_records=20_000,
    batch_threads=(16, 4, 1),
    batch_records=300_000,
    fetch_records=1_000_000,
    latency_sends=2_000,
)
# A smoke run: every scenario with tiny counts, seconds rather than minutes.
QUICK_COUNTS = ScenarioCounts(
    single_threads=4,
    single_records=200,
    batch_threads=(2,),
    batch_records=2_000,
    fetch_records=10_000,
    latency_sends=50,
)
QUICK_PARTITIONS = 3
LATENCY_WARMUP_SENDS_MIN = 10


def standard_scenarios(counts: ScenarioCounts) -> tuple[Scenario, ...]:
    """(a) one record per request, (b) 100 and (c) 1000 per request, (d) fetch, (e) latency.

    Fetch comes after the produce scenarios so that it reads what they wrote.
    """
    scenarios = [
        Scenario(
            "produce-1",
            ScenarioKind.PRODUCE,
            counts.single_threads,
            1,
            counts.single_records,
            warmup_requests=2,
        )
    ]
    for records_per_request in (100, 1000):
        for threads in counts.batch_threads:
            scenarios.append(
                Scenario(
                    f"produce-{records_per_request}-t{threads}",
                    ScenarioKind.PRODUCE,
                    threads,
                    records_per_request,
                    counts.batch_records,
                    warmup_requests=1,
                )
            )
    scenarios.append(
        Scenario("fetch-follower", ScenarioKind.FETCH, 1, FETCH_RECORDS_PER_REQUEST, counts.fetch_records)
    )
    scenarios.append(
        Scenario(
            "latency-1-in-flight",
            ScenarioKind.LATENCY,
            1,
            1,
            counts.latency_sends,
            warmup_requests=max(LATENCY_WARMUP_SENDS_MIN, counts.latency_sends // 10),
        )
    )
    return tuple(scenarios)
