"""Turns raw runs into the report: median, min and max per scenario, tables, targets, the JSON file.

The median of the runs is the headline number (robust to one disturbed run); min and max show the
spread. Latency percentiles use the nearest-rank method over each run's sends.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kq.bench.settings import BenchSettings, Scenario, ScenarioKind

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# What the team wants to see (benchmark targets, never test assertions).
TARGET_BATCH_100_RECORDS_PER_S = 50_000.0
TARGET_P50_LATENCY_MS = 5.0
MICROSECONDS_PER_S = 1e6
KIB_PER_MIB = 1024
BYTES_PER_MIB = 1024 * 1024


def percentile(values: Sequence[float], percent: float) -> float:
    """Nearest-rank percentile: the smallest value with at least `percent` % of values at or below it."""
    assert values, "percentile of no values"
    ordered = sorted(values)
    rank = max(1, math.ceil(percent / 100 * len(ordered)))
    return ordered[rank - 1]


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of one metric over the runs."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _run_metrics(scenario: Scenario, run: dict[str, Any]) -> dict[str, float]:
    """The per-run numbers a scenario's summary is made of.

    CPU is per record (per send for latency): all three nodes together, the node that served the
    requests alone (the leader for produce, the follower read from for fetch), and this client.
    """
    sample = run["sample"]
    server_cpu_s = sum(run["server_cpu_s"].values())
    serving = run["served_by"]
    serving_cpu_s = run["server_cpu_s"].get(serving, 0.0) if serving is not None else 0.0
    if scenario.kind is ScenarioKind.LATENCY:
        latencies = sample["latencies_ms"] or [0.0]
        count = max(1, len(sample["latencies_ms"]))
        metrics = {
            "p50_ms": percentile(latencies, 50),
            "p99_ms": percentile(latencies, 99),
            "mean_ms": statistics.fmean(latencies),
            "max_ms": max(latencies),
            "sends": float(len(sample["latencies_ms"])),
        }
    else:
        count = max(1, sample["records"])
        elapsed_s = sample["elapsed_s"] or float("inf")
        metrics = {
            "records_per_s": sample["records"] / elapsed_s,
            "mib_per_s": sample["payload_bytes"] / elapsed_s / BYTES_PER_MIB,
            "records": float(sample["records"]),
            "requests": float(sample["requests"]),
            "elapsed_s": sample["elapsed_s"],
        }
    metrics["errors"] = float(sample["errors"])
    metrics["host_cpu_busy_percent"] = 100 * run["host_cpu_busy"]
    metrics["server_cpu_us_per_record"] = server_cpu_s * MICROSECONDS_PER_S / count
    metrics["serving_node_cpu_us_per_record"] = serving_cpu_s * MICROSECONDS_PER_S / count
    metrics["client_cpu_us_per_record"] = run["client_cpu_s"] * MICROSECONDS_PER_S / count
    return metrics


def summarize(settings: BenchSettings, raw: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """The JSON document: settings, every run, per-scenario median/min/max, memory."""
    scenarios: dict[str, Any] = {}
    for scenario in settings.scenarios:
        runs = [run for run in raw["runs"] if run["scenario"] == scenario.name]
        per_run = [_run_metrics(scenario, run) for run in runs]
        summary = {name: spread([metrics[name] for metrics in per_run]) for name in per_run[0]}
        summary["errors"]["total"] = sum(metrics["errors"] for metrics in per_run)
        scenarios[scenario.name] = {
            "kind": scenario.kind.value,
            "threads": scenario.threads,
            "records_per_request": scenario.records_per_request,
            "records_max": scenario.records_max,
            "summary": summary,
            "runs": runs,
            "run_metrics": per_run,
        }
    settings_document = asdict(settings)
    settings_document["scenarios"] = [
        {**asdict(scenario), "kind": scenario.kind.value} for scenario in settings.scenarios
    ]
    settings_document["base_dir"] = str(settings.base_dir) if settings.base_dir is not None else None
    return {
        "meta": meta,
        "settings": settings_document,
        "scenarios": scenarios,
        "memory": {"final": raw["final"], "timeline": raw["memory_timeline"]},
        "targets": targets(scenarios, raw["memory_timeline"], len(settings.scenarios)),
    }


def targets(scenarios: dict[str, Any], timeline: list[dict[str, Any]], points_per_run: int) -> dict[str, Any]:
    """The team's targets against the medians; memory growth after the first run, next to data written.

    Memory is judged from the end of run 1 (when the nodes have warmed up and the Raft log has
    reached its compaction threshold) to the end: growth there should not follow the data written.
    """
    batch_rates = {
        name: entry["summary"]["records_per_s"]["median"]
        for name, entry in scenarios.items()
        if entry["kind"] == "produce" and entry["records_per_request"] == 100
    }
    best_batch = max(batch_rates.values(), default=0.0)
    latency = next((e for e in scenarios.values() if e["kind"] == "latency"), None)
    p50_ms = latency["summary"]["p50_ms"]["median"] if latency is not None else float("nan")
    first = timeline[points_per_run - 1] if len(timeline) > points_per_run else timeline[0]
    last = timeline[-1]
    return {
        "batch_100_records_per_s": {
            "target": TARGET_BATCH_100_RECORDS_PER_S,
            "best_median": best_batch,
            "met": best_batch >= TARGET_BATCH_100_RECORDS_PER_S,
        },
        "p50_latency_ms": {
            "target": TARGET_P50_LATENCY_MS,
            "median": p50_ms,
            "met": p50_ms <= TARGET_P50_LATENCY_MS,
        },
        "rss_growth_after_first_run": {
            "from": first["after"],
            "records_written_since": last["records_written"] - first["records_written"],
            "stored_mib_written_since": (last["stored_bytes"] - first["stored_bytes"]) / BYTES_PER_MIB,
            "rss_growth_mib": {
                node: (last["rss_kib"][node] - first["rss_kib"][node]) / KIB_PER_MIB
                for node in last["rss_kib"]
            },
            "anon_growth_mib": {
                node: (last["anon_kib"][node] - first["anon_kib"][node]) / KIB_PER_MIB
                for node in last["anon_kib"]
            },
        },
    }


def write_json(document: dict[str, Any], output: Path | None, stamp: str) -> Path:
    """Writes the document to `output`, or to bench/results/<stamp>.json; returns the path."""
    path = output if output is not None else RESULTS_DIR / f"{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")
    return path


def _range(entry: dict[str, float], digits: int) -> str:
    return f"{entry['min']:,.{digits}f}..{entry['max']:,.{digits}f}"


def render(document: dict[str, Any], console: Console) -> None:
    """Prints the throughput, latency, memory and timeline tables, then the targets."""
    runs = document["settings"]["runs"]
    console.print(_throughput_table(document, runs))
    console.print(_latency_table(document, runs))
    console.print(_memory_table(document))
    console.print(_timeline_table(document))
    for line in _target_lines(document["targets"]):
        console.print(line)


def _throughput_table(document: dict[str, Any], runs: int) -> Table:
    table = Table(title=f"kq throughput: median of {runs} run(s) (min..max)")
    for column in ("scenario", "threads", "records/req", "records/run"):
        table.add_column(column)
    for column in (
        "records/s",
        "min..max",
        "MiB/s",
        "server CPU µs/rec",
        "serving node µs/rec",
        "client µs/rec",
        "host CPU %",
        "errors",
    ):
        table.add_column(column, justify="right")
    for name, entry in document["scenarios"].items():
        if entry["kind"] == "latency":
            continue
        summary = entry["summary"]
        table.add_row(
            name,
            str(entry["threads"]),
            f"{entry['records_per_request']:,}",
            f"{summary['records']['median']:,.0f}",
            f"{summary['records_per_s']['median']:,.0f}",
            _range(summary["records_per_s"], 0),
            f"{summary['mib_per_s']['median']:,.1f}",
            f"{summary['server_cpu_us_per_record']['median']:,.1f}",
            f"{summary['serving_node_cpu_us_per_record']['median']:,.1f}",
            f"{summary['client_cpu_us_per_record']['median']:,.1f}",
            f"{summary['host_cpu_busy_percent']['median']:.0f}",
            f"{summary['errors']['total']:.0f}",
        )
    return table


def _latency_table(document: dict[str, Any], runs: int) -> Table:
    table = Table(title=f"kq produce latency, one record in flight: median of {runs} run(s) (min..max)")
    table.add_column("scenario")
    table.add_column("sends/run", justify="right")
    for key in ("p50", "p99", "mean", "max"):
        table.add_column(f"{key} ms", justify="right")
        table.add_column("min..max", justify="right")
    table.add_column("server CPU µs/send", justify="right")
    table.add_column("host CPU %", justify="right")
    table.add_column("errors", justify="right")
    for name, entry in document["scenarios"].items():
        if entry["kind"] != "latency":
            continue
        summary = entry["summary"]
        cells = [name, f"{summary['sends']['median']:,.0f}"]
        for key in ("p50_ms", "p99_ms", "mean_ms", "max_ms"):
            cells += [f"{summary[key]['median']:.2f}", _range(summary[key], 2)]
        cells += [
            f"{summary['server_cpu_us_per_record']['median']:,.0f}",
            f"{summary['host_cpu_busy_percent']['median']:.0f}",
            f"{summary['errors']['total']:.0f}",
        ]
        table.add_row(*cells)
    return table


def _memory_table(document: dict[str, Any]) -> Table:
    final = document["memory"]["final"]
    table = Table(
        title=(
            f"node memory after all runs: {final['records_written']:,} records, "
            f"{final['payload_bytes_written'] / BYTES_PER_MIB:,.0f} MiB of values "
            f"({final['stored_bytes'] / BYTES_PER_MIB:,.0f} MiB stored) written; "
            f"--compaction-min-entries {final['compaction_min_entries']:,}"
        )
    )
    columns = (
        "node",
        "role",
        "pid",
        "RSS MiB",
        "anon MiB",
        "peak anon MiB",
        "file-backed MiB",
        "peak RSS MiB",
        "Raft log entries",
        "data dir MiB",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for node_id, node in sorted(final["nodes"].items()):
        table.add_row(
            node_id,
            node["role"],
            str(node["pid"]),
            f"{node['rss_kib'] / KIB_PER_MIB:,.0f}",
            f"{node['anon_kib'] / KIB_PER_MIB:,.0f}",
            f"{node['peak_anon_kib'] / KIB_PER_MIB:,.0f}",
            f"{node['file_kib'] / KIB_PER_MIB:,.0f}",
            f"{node['peak_rss_kib'] / KIB_PER_MIB:,.0f}",
            f"{node['raft_log_entries']:,}" if node["raft_log_entries"] is not None else "?",
            f"{node['data_dir_bytes'] / BYTES_PER_MIB:,.0f}",
        )
    return table


def _timeline_table(document: dict[str, Any]) -> Table:
    table = Table(title="RSS / anon (heap) MiB / Raft log entries, per node, as data accumulates")
    table.add_column("after")
    table.add_column("records written", justify="right")
    table.add_column("stored MiB", justify="right")
    nodes = sorted(document["memory"]["final"]["nodes"])
    for node_id in nodes:
        table.add_column(f"node {node_id}", justify="right")
    for point in document["memory"]["timeline"]:
        table.add_row(
            point["after"],
            f"{point['records_written']:,}",
            f"{point['stored_bytes'] / BYTES_PER_MIB:,.0f}",
            *(
                f"{point['rss_kib'][node] / KIB_PER_MIB:,.0f} / {point['anon_kib'][node] / KIB_PER_MIB:,.0f}"
                f" / {point['raft_log_entries'][node]}"
                for node in nodes
            ),
        )
    return table


def _target_lines(result: dict[str, Any]) -> list[str]:
    batch, latency, growth = (
        result["batch_100_records_per_s"],
        result["p50_latency_ms"],
        result["rss_growth_after_first_run"],
    )
    rss = ", ".join(
        f"node {node} {mib:+,.0f} MiB (anon {growth['anon_growth_mib'][node]:+,.0f})"
        for node, mib in sorted(growth["rss_growth_mib"].items())
    )
    return [
        f"target batch-100 produce ≥ {batch['target']:,.0f} records/s: best median "
        f"{batch['best_median']:,.0f} → {'MET' if batch['met'] else 'MISSED'}",
        f"target p50 latency ≤ {latency['target']:.1f} ms: median {latency['median']:.2f} ms → "
        f"{'MET' if latency['met'] else 'MISSED'}",
        f"RSS growth after '{growth['from']}': {rss}, while {growth['records_written_since']:,} records "
        f"({growth['stored_mib_written_since']:,.0f} MiB stored) were written",
    ]
