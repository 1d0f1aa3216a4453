"""`python -m kq.chaos`: runs chaos scenarios against fresh local clusters and prints the verdict."""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

import click

from kq.chaos.report import render, to_json, write_json
from kq.chaos.runner import RunSettings, ScenarioReport, run_scenario
from kq.chaos.scenarios import FULL_SET, SCENARIOS
from kq.deploy.provenance import source_commit

ROUNDS_MAX = 1_000
RATE_MAX = 1_000.0
PRODUCERS_MAX = 32
PARTITIONS_MAX = 64
GROUP_MEMBERS_MAX = 16
PROCESSES_MAX = 16  # Worker processes per node (kq-node's own bound is kq.proto.limits.PROCESSES_MAX).
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _terminate_as_interrupt(signal_number: int, frame: FrameType | None) -> None:
    """SIGTERM unwinds like Ctrl-C, so every `finally` stops its nodes and removes its namespaces."""
    raise KeyboardInterrupt(f"signal {signal_number}")


def _scenario_names(chosen: tuple[str, ...]) -> list[str]:
    names: list[str] = []
    for name in chosen or ("all",):
        for item in FULL_SET if name == "all" else (name,):
            if item not in names:
                names.append(item)
    return names


def _list_scenarios() -> str:
    width = max(len(name) for name in SCENARIOS)
    lines = [f"{name.ljust(width)}  {scenario.summary}" for name, scenario in SCENARIOS.items()]
    return "\n".join([*lines, f"{'all'.ljust(width)}  {', '.join(FULL_SET)}"])


@click.command(context_settings={"show_default": True})
@click.option(
    "--scenario",
    "-s",
    "scenarios",
    multiple=True,
    type=click.Choice([*SCENARIOS, "all"]),
    help="Scenario to run (repeatable). [default: all]",
)
@click.option("--nodes", type=click.Choice(["3", "5"]), default="3", help="Cluster size.")
@click.option(
    "--rounds", type=click.IntRange(1, ROUNDS_MAX), default=None, help="Rounds of every fault step."
)
@click.option("--seed", type=int, default=1, help="Seeds every random choice (timing still varies).")
@click.option(
    "--partitions", type=click.IntRange(1, PARTITIONS_MAX), default=6, help="Partitions of the topic."
)
@click.option("--producers", type=click.IntRange(1, PRODUCERS_MAX), default=4, help="Producer threads.")
@click.option(
    "--rate",
    type=click.FloatRange(1, RATE_MAX),
    default=50.0,
    help="Requests per second per producer (1-5 records).",
)
@click.option(
    "--group-members",
    type=click.IntRange(0, GROUP_MEMBERS_MAX),
    default=3,
    help="Members of the consumer group that consumes the topic (0: no group; 2 or more rebalance).",
)
@click.option(
    "--node-arg",
    "node_args",
    multiple=True,
    help="Extra kq-node flag, verbatim (repeat per word: --node-arg=--heartbeat-ms --node-arg=30).",
)
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="JSON report file. [default: chaos/results/<timestamp>.json]",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Node data and logs go here. [default: a new temporary directory]",
)
@click.option(
    "--secure",
    is_flag=True,
    help="Nodes with mutual TLS on gRPC and TLS on Kafka (certificates made into each scenario's "
    "certs/); every client presents the 'admin' certificate; at the end every node must refuse plain "
    "text (else a plain-text anomaly).",
)
@click.option(
    "--processes",
    type=click.IntRange(1, PROCESSES_MAX),
    default=1,
    help="Worker processes per node, a Raft group each (kq-node --processes): faults then hit nodes "
    "leading several groups.",
)
@click.option("--keep-data", is_flag=True, help="Keep node data and logs of passing scenarios too.")
@click.option("--list", "list_only", is_flag=True, help="List the scenarios and exit.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning"]), default="info")
def main(
    scenarios: tuple[str, ...],
    nodes: str,
    rounds: int | None,
    seed: int,
    partitions: int,
    producers: int,
    rate: float,
    group_members: int,
    node_args: tuple[str, ...],
    report_path: Path | None,
    work_dir: Path | None,
    secure: bool,
    processes: int,
    keep_data: bool,
    list_only: bool,
    log_level: str,
) -> None:
    """Kills, pauses, partitions and restarts kq clusters under load, then checks nothing was lost.

    Exit status: 0 when every scenario passed (or was skipped), 1 when any failed.
    """
    if list_only:
        click.echo(_list_scenarios())
        return
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = work_dir or Path(tempfile.mkdtemp(prefix=f"kq-chaos-{stamp}-"))
    settings = RunSettings(
        base,
        int(nodes),
        seed,
        partitions,
        producers,
        rate,
        rounds,
        node_args,
        keep_data,
        group_members,
        secure,
        processes,
    )
    started = time.time()
    reports: list[ScenarioReport] = []
    for name in _scenario_names(scenarios):
        click.echo(f"== {name}: {SCENARIOS[name].summary}", err=True)
        reports.append(run_scenario(SCENARIOS[name], settings))
        click.echo(f"== {name}: {reports[-1].verdict} {reports[-1].reason}", err=True)
    _remove_if_empty(base)
    output = report_path or RESULTS_DIR / f"{stamp}.json"
    write_json(output, to_json(reports, _meta(stamp, started, settings)))
    click.echo(render(reports))
    click.echo(f"report: {output}")
    sys.exit(1 if any(report.verdict == "FAIL" for report in reports) else 0)


def _remove_if_empty(base: Path) -> None:
    with contextlib.suppress(OSError):  # It holds the data of a failed (or kept) scenario.
        base.rmdir()


def _meta(stamp: str, started: float, settings: RunSettings) -> dict[str, Any]:
    return {
        "timestamp": stamp,
        "duration_s": round(time.time() - started, 1),
        "command": sys.argv,
        "git_commit": source_commit(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "settings": {
            "nodes": settings.nodes,
            "seed": settings.seed,
            "partitions": settings.partitions,
            "producers": settings.producers,
            "rate_per_producer": settings.rate_per_producer,
            "group_members": settings.group_members,
            "secure": settings.secure,
            "rounds": settings.rounds,
            "node_args": list(settings.node_args),
            "processes": settings.processes,
            "work_dir": str(settings.work_dir),
        },
    }
