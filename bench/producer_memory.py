"""`python -m kq.bench.producer_memory`: does one `client.Producer`, sent to flat out, stay within its bound?

A fresh three-node `kq.deploy.cluster.LocalCluster` (in a temporary directory) gets a topic; one thread sends
`--records` values of `--value-bytes` through one Producer as fast as `send` returns, keeping no
handle but every `CHECKED_EVERY`-th, then flushes. Meanwhile a thread samples this process's VmRSS
and `gc.callbacks` time every garbage collection. The report gives records/s, the peak client RSS
(the kernel's VmHWM, which no sampling gap can miss) against the bound `buffer_memory` + 64 MiB,
PASS/FAIL of that bound, and the longest GC pause. It also counts the records the cluster holds at
the end, so a fast run that lost records cannot pass. Exit code 0 on PASS, 1 on FAIL.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from kq.bench import procfs
from kq.client import KqClient, Producer
from kq.client.producer import BUFFER_BYTES_DEFAULT, PENDING_RECORDS_DEFAULT, RecordFuture
from kq.deploy.cluster import LocalCluster, work_dir

TOPIC = "producer-memory"
PARTITIONS = 6
RECORDS_DEFAULT = 2_000_000
VALUE_BYTES_DEFAULT = 100
RSS_SLACK_BYTES = 64 * 1024 * 1024  # The interpreter, gRPC and requests on the wire, beside the buffer.
RSS_SAMPLE_PERIOD_S = 0.05
CHECKED_EVERY = 10_000  # Every n-th handle is kept and must resolve to a real offset.
FLUSH_TIMEOUT_S = 600.0
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class MemorySettings:
    """What a run is told."""

    records: int = RECORDS_DEFAULT
    value_bytes: int = VALUE_BYTES_DEFAULT
    buffer_memory: int = BUFFER_BYTES_DEFAULT
    max_pending_records: int = PENDING_RECORDS_DEFAULT


@dataclass(frozen=True, slots=True)
class MemoryReport:
    """What a run measured; `passed` is the RSS bound, `all_stored` the delivery check."""

    settings: MemorySettings
    elapsed_s: float
    records_per_s: float
    rss_before_bytes: int  # Before the first send: the interpreter, gRPC, the cluster handles.
    rss_peak_bytes: int
    rss_bound_bytes: int
    pending_records_peak: int
    pending_bytes_peak: int
    gc_pause_longest_s: float
    gc_pause_longest_cpu_s: float  # The most CPU time one collection took (not always the longest pause).
    gc_pause_longest_generation: int
    gc_pauses: int
    gc_pause_total_s: float
    gc_pause_total_cpu_s: float
    records_stored: int

    @property
    def passed(self) -> bool:
        """Whether the client's peak RSS stayed within the bound."""
        return self.rss_peak_bytes <= self.rss_bound_bytes

    @property
    def all_stored(self) -> bool:
        """Whether the cluster holds exactly the records sent."""
        return self.records_stored == self.settings.records


class GcPauses:
    """Times every garbage collection through `gc.callbacks` while installed (a context manager).

    A pause is wall time from the "start" to the "stop" callback: what the collecting thread (and,
    holding the GIL, every thread) lost. On a busy machine that includes time the process was not
    scheduled at all, so the collecting thread's CPU time is kept too: the GC's own work.
    """

    def __init__(self) -> None:
        self.count = 0
        self.total_s = 0.0
        self.total_cpu_s = 0.0
        self.longest_s = 0.0
        self.longest_cpu_s = 0.0
        self.longest_generation = -1
        self._started = 0.0
        self._started_cpu = 0.0

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        # Collections run under the GIL one at a time, so one start time is enough.
        if phase == "start":
            self._started, self._started_cpu = time.perf_counter(), time.thread_time()
            return
        pause_s = time.perf_counter() - self._started
        pause_cpu_s = time.thread_time() - self._started_cpu
        self.count += 1
        self.total_s += pause_s
        self.total_cpu_s += pause_cpu_s
        self.longest_cpu_s = max(self.longest_cpu_s, pause_cpu_s)
        if pause_s > self.longest_s:
            self.longest_s, self.longest_generation = pause_s, info["generation"]


class PeakSampler(procfs.PeriodicSampler):
    """Keeps the peaks of this process's VmRSS and of the producer's pending records and bytes."""

    def __init__(self, producer: Producer) -> None:
        super().__init__(RSS_SAMPLE_PERIOD_S, "bench-rss")
        self._producer = producer
        self.rss_peak_bytes = 0
        self.pending_records_peak = 0
        self.pending_bytes_peak = 0

    def sample(self) -> None:
        """Reads VmRSS (and VmHWM) and the producer's pending counts."""
        memory = procfs.memory(os.getpid())
        self.rss_peak_bytes = max(self.rss_peak_bytes, memory.rss_kib * 1024, memory.peak_rss_kib * 1024)
        self.pending_records_peak = max(self.pending_records_peak, self._producer.pending_records)
        self.pending_bytes_peak = max(self.pending_bytes_peak, self._producer.pending_bytes)


def run(settings: MemorySettings) -> MemoryReport:
    """Starts a cluster in a temporary directory, runs the measurement, stops every node by PID."""
    with (
        work_dir(None, "kq-producer-memory-") as base,
        LocalCluster(base / "cluster") as cluster,
        KqClient(cluster.bootstrap) as client,
    ):
        client.create_topic(TOPIC, PARTITIONS)
        return measure(client, settings)


def measure(client: KqClient, settings: MemorySettings) -> MemoryReport:
    """Sends the records flat out through one Producer and measures RSS and GC while it does."""
    value = bytes((i * 131 + 17) % 251 for i in range(settings.value_bytes))
    rss_before_bytes = procfs.memory(os.getpid()).rss_kib * 1024
    producer = Producer(
        client, buffer_memory=settings.buffer_memory, max_pending_records=settings.max_pending_records
    )
    checked: list[RecordFuture] = []
    try:
        with PeakSampler(producer) as peaks, GcPauses() as pauses:
            started = time.monotonic()
            for number in range(settings.records):
                handle = producer.send(TOPIC, value)
                if number % CHECKED_EVERY == 0:
                    checked.append(handle)
            producer.flush(timeout_s=FLUSH_TIMEOUT_S)
            elapsed_s = time.monotonic() - started
    finally:
        producer.close()
    assert all(handle.result(timeout=0).offset >= 0 for handle in checked), "a kept handle has no offset"
    stored = sum(o.log_end_offset - o.log_start_offset for o in client.list_offsets(TOPIC).values())
    return MemoryReport(
        settings=settings,
        elapsed_s=elapsed_s,
        records_per_s=settings.records / max(elapsed_s, 1e-9),
        rss_before_bytes=rss_before_bytes,
        rss_peak_bytes=peaks.rss_peak_bytes,
        rss_bound_bytes=settings.buffer_memory + RSS_SLACK_BYTES,
        pending_records_peak=peaks.pending_records_peak,
        pending_bytes_peak=peaks.pending_bytes_peak,
        gc_pause_longest_s=pauses.longest_s,
        gc_pause_longest_cpu_s=pauses.longest_cpu_s,
        gc_pause_longest_generation=pauses.longest_generation,
        gc_pauses=pauses.count,
        gc_pause_total_s=pauses.total_s,
        gc_pause_total_cpu_s=pauses.total_cpu_s,
        records_stored=stored,
    )


def render(report: MemoryReport) -> str:
    """The short text report."""
    settings = report.settings
    verdict = "PASS" if report.passed else "FAIL"
    return "\n".join(
        [
            f"producer memory: {settings.records:,} records x {settings.value_bytes} B, "
            f"buffer_memory {settings.buffer_memory / MIB:.0f} MiB, "
            f"max_pending_records {settings.max_pending_records:,}",
            f"  throughput        {report.records_per_s:,.0f} records/s "
            f"({report.elapsed_s:.1f} s, flush included)",
            f"  client RSS        {report.rss_before_bytes / MIB:.1f} MiB before sending, "
            f"peak {report.rss_peak_bytes / MIB:.1f} MiB",
            f"  RSS bound         {report.rss_bound_bytes / MIB:.1f} MiB (buffer_memory + 64 MiB): {verdict}",
            f"  pending peak      {report.pending_records_peak:,} records, "
            f"{report.pending_bytes_peak / MIB:.1f} MiB charged",
            f"  GC pauses         longest {report.gc_pause_longest_s * 1000:.1f} ms "
            f"(generation {report.gc_pause_longest_generation}), "
            f"longest in CPU {report.gc_pause_longest_cpu_s * 1000:.1f} ms, {report.gc_pauses:,} pauses, "
            f"{report.gc_pause_total_s:.2f} s in total ({report.gc_pause_total_cpu_s:.2f} s CPU)",
            f"  records stored    {report.records_stored:,} of {settings.records:,}",
        ]
    )


def parse_arguments(argv: Sequence[str] | None) -> tuple[MemorySettings, Path | None]:
    """Settings and the --json path from the command line."""
    parser = argparse.ArgumentParser(
        prog="python -m kq.bench.producer_memory", description=__doc__.splitlines()[0]
    )
    defaults = MemorySettings()
    parser.add_argument("--records", type=int, default=defaults.records)
    parser.add_argument("--value-bytes", type=int, default=defaults.value_bytes)
    parser.add_argument("--buffer-memory", type=int, default=defaults.buffer_memory, help="bytes")
    parser.add_argument("--max-pending-records", type=int, default=defaults.max_pending_records)
    parser.add_argument("--json", type=Path, help="also write the report as JSON here")
    arguments = parser.parse_args(argv)
    settings = MemorySettings(
        records=arguments.records,
        value_bytes=arguments.value_bytes,
        buffer_memory=arguments.buffer_memory,
        max_pending_records=arguments.max_pending_records,
    )
    return settings, arguments.json


def as_json(report: MemoryReport) -> dict[str, Any]:
    """The report with its verdicts, for --json."""
    return {**asdict(report), "passed": report.passed, "all_stored": report.all_stored}


def main(argv: Sequence[str] | None = None) -> int:
    """Runs once, prints the report, writes the JSON; 0 when the bound held and every record is stored."""
    settings, json_path = parse_arguments(argv)
    report = run(settings)
    print(render(report), flush=True)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(as_json(report), indent=2))
    return 0 if report.passed and report.all_stored else 1


if __name__ == "__main__":
    sys.exit(main())
