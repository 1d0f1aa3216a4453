"""`python -m kq.bench`: the command line of the produce/fetch benchmark."""

from __future__ import annotations

import logging
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from kq.bench.report import render, summarize, write_json
from kq.bench.runner import run_benchmark
from kq.bench.settings import (
    COMPACTION_MIN_ENTRIES_DEFAULT,
    FULL_COUNTS,
    PARTITIONS_DEFAULT,
    QUICK_COUNTS,
    QUICK_PARTITIONS,
    RUNS_DEFAULT,
    RUNS_MAX,
    SCENARIO_TIME_CAP_S,
    THREADS_MAX,
    VALUE_BYTES_DEFAULT,
    BenchSettings,
    ScenarioCounts,
    standard_scenarios,
)
from kq.deploy.provenance import source_commit, source_dirty
from kq.proto.limits import PARTITIONS_MAX, RECORD_BYTES_MAX

REPORT_WIDTH = 160
COUNT_MAX = 100_000_000  # Records (or sends) of one scenario run: far beyond ten minutes here.


def _meta(stamp: str, started: float) -> dict[str, Any]:
    """Where and when the numbers were taken, so two result files can be compared honestly."""
    return {
        "timestamp": stamp,
        "started_at_unix": started,
        "duration_s": time.time() - started,
        "command": sys.argv,
        "git_commit": source_commit(),
        "git_dirty": source_dirty(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


_COUNT = click.IntRange(1, COUNT_MAX)


@click.command(context_settings={"show_default": True})
@click.option(
    "--runs",
    type=click.IntRange(1, RUNS_MAX),
    default=None,
    help=f"Repetitions of every scenario; the report shows the median. [default: {RUNS_DEFAULT}, "
    "1 with --quick]",
)
@click.option("--quick", is_flag=True, help="Tiny counts and one run: a smoke test of the benchmark itself.")
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="JSON result file. [default: bench/results/<timestamp>.json]",
)
@click.option(
    "--partitions",
    type=click.IntRange(1, PARTITIONS_MAX),
    default=None,
    help=f"Partitions of the throughput topic. [default: {PARTITIONS_DEFAULT}, "
    f"{QUICK_PARTITIONS} with --quick]",
)
@click.option("--value-bytes", type=click.IntRange(1, RECORD_BYTES_MAX), default=VALUE_BYTES_DEFAULT)
@click.option(
    "--compaction-min-entries",
    type=click.IntRange(10, 10_000_000),
    default=COMPACTION_MIN_ENTRIES_DEFAULT,
    help="Passed to every node: Raft log entries kept in RAM before a snapshot compacts them.",
)
@click.option(
    "--producer-threads",
    type=click.IntRange(1, THREADS_MAX),
    default=None,
    help=f"Threads of the one-record-per-request scenario. [default: {FULL_COUNTS.single_threads}]",
)
@click.option(
    "--batch-threads",
    type=click.IntRange(1, THREADS_MAX),
    multiple=True,
    help="Thread counts of the 100- and 1000-record scenarios (repeatable). "
    f"[default: {', '.join(map(str, FULL_COUNTS.batch_threads))}]",
)
@click.option(
    "--single-records",
    type=_COUNT,
    default=None,
    help=f"Records per run at one per request. [default: {FULL_COUNTS.single_records:,}]",
)
@click.option(
    "--batch-records",
    type=_COUNT,
    default=None,
    help=f"Records per run of each batch scenario. [default: {FULL_COUNTS.batch_records:,}]",
)
@click.option(
    "--fetch-records",
    type=_COUNT,
    default=None,
    help=f"Records read per fetch run at most. [default: {FULL_COUNTS.fetch_records:,}]",
)
@click.option(
    "--latency-sends",
    type=_COUNT,
    default=None,
    help=f"Timed sends per latency run. [default: {FULL_COUNTS.latency_sends:,}]",
)
@click.option(
    "--time-cap-s",
    type=click.FloatRange(1, 3600),
    default=SCENARIO_TIME_CAP_S,
    help="One run of one scenario stops after this long, whatever its count.",
)
@click.option(
    "--node-arg",
    "node_args",
    multiple=True,
    help="Extra kq-node flag, verbatim (repeat for each word, e.g. --node-arg=--grpc-workers "
    "--node-arg=128).",
)
@click.option(
    "--base-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep node data and logs here instead of a temporary directory.",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning"]), default="info")
def main(
    runs: int | None,
    quick: bool,
    output: Path | None,
    partitions: int | None,
    value_bytes: int,
    compaction_min_entries: int,
    producer_threads: int | None,
    batch_threads: tuple[int, ...],
    single_records: int | None,
    batch_records: int | None,
    fetch_records: int | None,
    latency_sends: int | None,
    time_cap_s: float,
    node_args: tuple[str, ...],
    base_dir: Path | None,
    log_level: str,
) -> None:
    """Starts three kq nodes, measures produce and fetch throughput and produce latency, reports medians."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    preset = QUICK_COUNTS if quick else FULL_COUNTS
    counts = ScenarioCounts(
        single_threads=producer_threads or preset.single_threads,
        single_records=single_records or preset.single_records,
        batch_threads=batch_threads or preset.batch_threads,
        batch_records=batch_records or preset.batch_records,
        fetch_records=fetch_records or preset.fetch_records,
        latency_sends=latency_sends or preset.latency_sends,
    )
    if partitions is None:
        partitions = QUICK_PARTITIONS if quick else PARTITIONS_DEFAULT
    settings = BenchSettings(
        scenarios=standard_scenarios(counts),
        runs=runs if runs is not None else (1 if quick else RUNS_DEFAULT),
        value_bytes=value_bytes,
        partitions=partitions,
        compaction_min_entries=compaction_min_entries,
        scenario_time_cap_s=time_cap_s,
        node_args=node_args,
        base_dir=base_dir,
    )
    started = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    raw = run_benchmark(settings)
    document = summarize(settings, raw, _meta(stamp, started))
    path = write_json(document, output, stamp)
    console = Console()
    if not console.is_terminal:  # Piped or logged: don't squeeze the tables into 80 columns.
        console = Console(width=REPORT_WIDTH)
    render(document, console)
    console.print(f"results: {path}")
