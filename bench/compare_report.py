"""The side-by-side report: per-run figures, medians of the runs, ratios to NATS, targets; JSON and Markdown.

Every figure is the median over the runs, with min..max beside it. Each kq column (kq's gRPC client, and
"kq-kafka", the same cluster type through its Kafka port; each also as "-fsync" when that run's nodes
had `--durability=fsync`, and as "-tls" when its clients reached the nodes over TLS) gets a ratio: its
median over NATS's, whichever way is better: above 1 is better for rates, below 1 for latency, CPU and
failover gaps (the "better" column says which). A row's `ratio` is kq (gRPC)/NATS, `ratios` holds every
column's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kq.bench.report import BYTES_PER_MIB, MICROSECONDS_PER_S, RESULTS_DIR, percentile, spread
from kq.bench.side_by_side import (
    BASELINE,
    COLUMNS,
    CONSUME,
    FAILOVER,
    KQ_GRPC_COLUMNS,
    LATENCY,
    PRODUCE_LARGE,
    PRODUCE_LARGE_THREADS,
    PRODUCE_SMALL,
    PRODUCE_SMALL_THREADS,
)

# Issue 17's acceptance, each against NATS in the same run.
TARGET_P50_MS = 1.0  # One record in flight: kq's p50 at most this,
TARGET_IN_FLIGHT_RATIO = 0.8  # and its msgs/s at least this x NATS's.
TARGET_PRODUCE_RATIO = 1.0  # Pipelined produce (the Producer, and send_batch from threads): msgs/s.
TARGET_CONSUME_RATIO = 1.0
TARGET_SERVER_CPU_RATIO = 1.5  # Server CPU per message, in every scenario: at most this x NATS's.
LABELS = {
    "kq": "kq",
    "kq-tls": "kq (TLS)",
    "kq-fsync": "kq (fsync)",
    "kq-fsync-tls": "kq (fsync, TLS)",
    "kq-kafka": "kq (Kafka)",
    "kq-kafka-tls": "kq (Kafka, TLS)",
    "kq-kafka-fsync": "kq (Kafka, fsync)",
    "kq-kafka-fsync-tls": "kq (Kafka, fsync, TLS)",
    "nats": "NATS",
}


@dataclass(frozen=True, slots=True)
class Figure:
    """One row of the table: a metric of one scenario."""

    key: str
    label: str
    scenario: str
    metric: str
    higher_is_better: bool
    digits: int
    # kq's (gRPC) value from this scenario instead, compared with NATS's `scenario`; such a row is
    # kq's gRPC API only, so the kq-kafka columns show nothing there.
    kq_scenario: str | None = None


RATE, SERVER_CPU, CLIENT_CPU = "msgs_per_s", "server_cpu_us_per_msg", "client_cpu_us_per_msg"
THREADS = "kq send_batch from threads"
FIGURES = (
    Figure("latency_msgs_per_s", "(1) one in flight, 100 B: msgs/s", LATENCY, RATE, True, 0),
    Figure("latency_p50_ms", "(1) one in flight, 100 B: p50 ms", LATENCY, "p50_ms", False, 2),
    Figure("latency_p99_ms", "(1) one in flight, 100 B: p99 ms", LATENCY, "p99_ms", False, 2),
    Figure("produce_100b_msgs_per_s", "(2) pipelined produce, 100 B: msgs/s", PRODUCE_SMALL, RATE, True, 0),
    Figure("produce_1kib_msgs_per_s", "(2) pipelined produce, 1 KiB: msgs/s", PRODUCE_LARGE, RATE, True, 0),
    Figure(
        "send_batch_100b_msgs_per_s",
        f"(2) pipelined produce, 100 B, {THREADS}: msgs/s",
        PRODUCE_SMALL,
        RATE,
        True,
        0,
        kq_scenario=PRODUCE_SMALL_THREADS,
    ),
    Figure(
        "send_batch_1kib_msgs_per_s",
        f"(2) pipelined produce, 1 KiB, {THREADS}: msgs/s",
        PRODUCE_LARGE,
        RATE,
        True,
        0,
        kq_scenario=PRODUCE_LARGE_THREADS,
    ),
    Figure("consume_msgs_per_s", "(3) consume 100 B: msgs/s", CONSUME, RATE, True, 0),
    Figure("cpu_latency_us", "(4) server CPU µs/msg, one in flight", LATENCY, SERVER_CPU, False, 0),
    Figure(
        "cpu_produce_100b_us", "(4) server CPU µs/msg, produce 100 B", PRODUCE_SMALL, SERVER_CPU, False, 1
    ),
    Figure(
        "cpu_produce_1kib_us", "(4) server CPU µs/msg, produce 1 KiB", PRODUCE_LARGE, SERVER_CPU, False, 1
    ),
    Figure("cpu_consume_us", "(4) server CPU µs/msg, consume", CONSUME, SERVER_CPU, False, 1),
    Figure("client_produce_100b_us", "client CPU µs/msg, produce 100 B", PRODUCE_SMALL, CLIENT_CPU, False, 1),
    Figure("client_consume_us", "client CPU µs/msg, consume", CONSUME, CLIENT_CPU, False, 1),
    Figure("failover_gap_s", "(5) kill -9 leader: gap until acked again, s", FAILOVER, "gap_s", False, 2),
    Figure(
        "failover_pause_s", "(5) kill -9 leader: longest ack pause, s", FAILOVER, "longest_pause_s", False, 2
    ),
)


def run_metrics(run: dict[str, Any]) -> dict[str, float]:
    """The numbers one run contributes: rates, latency, CPU per message, other load on the machine."""
    sample, scenario = run["sample"], run["scenario"]
    server_cpu_s = sum(run["server_cpu_s"].values())
    metrics: dict[str, float] = {}
    if scenario == FAILOVER:
        # No acknowledgement within the window: the gap is at least the window (flagged in the report).
        metrics["gap_s"] = sample["gap_s"] if sample["gap_s"] is not None else sample["window_s"]
        metrics["gap_missing"] = float(sample["gap_s"] is None)
        metrics["longest_pause_s"] = sample["longest_pause_s"]
        messages = sample["acks_before_kill"] + sample["acks_after_kill"]
    elif scenario == LATENCY:
        latencies = sample["latencies_ms"] or [0.0]
        messages = len(sample["latencies_ms"])
        metrics["msgs_per_s"] = messages / sample["elapsed_s"] if sample["elapsed_s"] > 0 else 0.0
        metrics["p50_ms"] = percentile(latencies, 50)
        metrics["p99_ms"] = percentile(latencies, 99)
    else:
        messages = sample["records"]
        elapsed_s = sample["elapsed_s"]
        metrics["msgs_per_s"] = messages / elapsed_s if elapsed_s > 0 else 0.0
        metrics["mib_per_s"] = sample["payload_bytes"] / elapsed_s / BYTES_PER_MIB if elapsed_s > 0 else 0.0
        metrics["messages"] = float(messages)
    metrics["errors"] = float(sample["errors"])
    metrics["server_cpu_us_per_msg"] = server_cpu_s * MICROSECONDS_PER_S / max(1, messages)
    metrics["client_cpu_us_per_msg"] = run["client_cpu_s"] * MICROSECONDS_PER_S / max(1, messages)
    metrics["host_cpu_busy_percent"] = 100 * run["host_cpu_busy"]
    # CPU the machine spent on neither the servers nor this client (other engineers' work, the kernel).
    other_cpu_s = max(0.0, run["host_cpu_s"] - server_cpu_s - run["client_cpu_s"])
    metrics["other_cpu_s"] = other_cpu_s
    return metrics


def summarize_system(raw: dict[str, Any]) -> dict[str, Any]:
    """Per scenario: every run's metrics and their median/min/max."""
    scenarios: dict[str, Any] = {}
    for scenario in dict.fromkeys(run["scenario"] for run in raw["runs"]):
        per_run = [run_metrics(run) for run in raw["runs"] if run["scenario"] == scenario]
        scenarios[scenario] = {
            "run_metrics": per_run,
            "summary": {name: spread([m[name] for m in per_run]) for name in per_run[0]},
        }
    return scenarios


def figures(summaries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The table rows: each figure's median (min..max) per system and each kq column's ratio to NATS."""
    rows: list[dict[str, Any]] = []
    for figure in FIGURES:
        row: dict[str, Any] = {
            "key": figure.key,
            "label": figure.label,
            "better": "higher" if figure.higher_is_better else "lower",
        }
        for system, scenarios in summaries.items():
            grpc = system in KQ_GRPC_COLUMNS
            if figure.kq_scenario and not grpc and system != BASELINE:
                continue  # A kq gRPC-only row (send_batch).
            scenario = figure.kq_scenario if grpc and figure.kq_scenario else figure.scenario
            summary = scenarios.get(scenario, {}).get("summary", {})
            if figure.metric in summary:
                row[system] = dict(summary[figure.metric])
                if figure.metric == "gap_s":  # Runs with no acknowledgement after the kill at all.
                    runs = scenarios[scenario]["run_metrics"]
                    row[system]["missing_runs"] = sum(m["gap_missing"] for m in runs)
        baseline = row.get(BASELINE)
        row["ratios"] = {
            system: (
                row[system]["median"] / baseline["median"]
                if system in row and baseline and baseline["median"] > 0
                else None
            )
            for system in summaries
            if system != BASELINE
        }
        row["ratio"] = row["ratios"].get("kq")
        rows.append(row)
    return rows


# (figure key, bound on its kq/NATS ratio, "min" or "max", what the target says): issue 17's list.
RATIO_TARGETS = (
    ("latency_msgs_per_s", TARGET_IN_FLIGHT_RATIO, "min", "one in flight msgs/s"),
    ("produce_100b_msgs_per_s", TARGET_PRODUCE_RATIO, "min", "pipelined produce 100 B"),
    ("produce_1kib_msgs_per_s", TARGET_PRODUCE_RATIO, "min", "pipelined produce 1 KiB"),
    ("send_batch_100b_msgs_per_s", TARGET_PRODUCE_RATIO, "min", f"pipelined produce 100 B, {THREADS}"),
    ("send_batch_1kib_msgs_per_s", TARGET_PRODUCE_RATIO, "min", f"pipelined produce 1 KiB, {THREADS}"),
    ("consume_msgs_per_s", TARGET_CONSUME_RATIO, "min", "consume"),
    ("cpu_latency_us", TARGET_SERVER_CPU_RATIO, "max", "server CPU/msg, one in flight"),
    ("cpu_produce_100b_us", TARGET_SERVER_CPU_RATIO, "max", "server CPU/msg, produce 100 B"),
    ("cpu_produce_1kib_us", TARGET_SERVER_CPU_RATIO, "max", "server CPU/msg, produce 1 KiB"),
    ("cpu_consume_us", TARGET_SERVER_CPU_RATIO, "max", "server CPU/msg, consume"),
)


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets against this run's medians."""
    by_key = {row["key"]: row for row in rows}

    def ratio(key: str) -> float | None:
        value = by_key[key]["ratio"]
        return float(value) if value is not None else None

    p50 = by_key["latency_p50_ms"].get("kq", {}).get("median")
    listed = [
        {
            "target": f"one-in-flight p50 ≤ {TARGET_P50_MS} ms",
            "value": p50,
            "met": None if p50 is None else p50 <= TARGET_P50_MS,
        }
    ]
    for key, bound, kind, name in RATIO_TARGETS:
        value = ratio(key)
        met = None if value is None else value >= bound if kind == "min" else value <= bound
        sign = "≥" if kind == "min" else "≤"
        listed.append({"target": f"{name} {sign} {bound}x NATS", "value": value, "met": met})
    gap = ratio("failover_gap_s")
    failover_met = None if gap is None else gap <= 1.0
    listed.append({"target": "failover gap ≤ NATS's", "value": gap, "met": failover_met})
    return listed


def build_document(
    meta: dict[str, Any], settings: dict[str, Any], raws: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The JSON document: where and how it ran, each system's runs and summaries, the table, targets."""
    summaries = {system: summarize_system(raw) for system, raw in raws.items()}
    rows = figures(summaries)
    return {
        "meta": meta,
        "settings": settings,
        "systems": {
            system: {"describe": raw["describe"], "runs": raw["runs"], "scenarios": summaries[system]}
            for system, raw in raws.items()
        },
        "figures": rows,
        "targets": targets(rows) if {"kq", BASELINE} <= set(raws) else [],  # kq's (gRPC) targets.
    }


def _cell(entry: dict[str, float] | None, digits: int) -> str:
    if entry is None:
        return "-"
    text = f"{entry['median']:,.{digits}f}"
    if entry.get("missing_runs"):
        text = f"≥ {text} ({entry['missing_runs']:.0f} run(s) never recovered)"
    if entry["min"] != entry["max"]:
        text += f" ({entry['min']:,.{digits}f}..{entry['max']:,.{digits}f})"
    return text


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _met(value: bool | None) -> str:
    return "n/a" if value is None else ("MET" if value else "MISSED")


def _digits(key: str) -> int:
    return next(f.digits for f in FIGURES if f.key == key)


def _ratio_systems(systems: list[str]) -> list[str]:
    """The columns that get a ratio to NATS: every measured system but NATS, when NATS was measured."""
    return [s for s in systems if s != BASELINE] if BASELINE in systems else []


def _ratio_header(system: str) -> str:
    return f"{LABELS[system]}/{LABELS[BASELINE]}"


def markdown(document: dict[str, Any]) -> str:
    """The report as Markdown: context, the table, targets, how each system was driven."""
    meta, systems = document["meta"], [s for s in COLUMNS if s in document["systems"]]
    ratio_systems = _ratio_systems(systems)
    lines = [
        f"# kq vs NATS JetStream, {meta['date']}",
        "",
        f"Machine: {meta['cpus']} cores ({meta['cpu_model']}), {meta['memory_gib']:.0f} GiB, "
        f"{meta['platform']}, Python {meta['python']}. kq commit {meta['git_commit'][:12]}"
        f"{' (dirty)' if meta['git_dirty'] else ''}. Servers and client share the machine.",
        "",
        f"Command: `{meta['command']}` — median of {document['settings']['runs']} run(s), (min..max).",
        "",
        "| figure | "
        + " | ".join([*(LABELS[s] for s in systems), *map(_ratio_header, ratio_systems)])
        + " | better |",
        "|---|" + "---:|" * (len(systems) + len(ratio_systems)) + "---|",
    ]
    for row in document["figures"]:
        cells = [_cell(row.get(system), _digits(row["key"])) for system in systems]
        cells += [_ratio(row.get("ratios", {}).get(system)) for system in ratio_systems]
        lines.append(f"| {row['label']} | " + " | ".join(cells) + f" | {row['better']} |")
    if document["targets"]:
        lines += ["", "| target | value | |", "|---|---:|---|"]
        for target in document["targets"]:
            value = "-" if target["value"] is None else f"{target['value']:.2f}"
            lines.append(f"| {target['target']} | {value} | {_met(target['met'])} |")
    lines += ["", "How each system was driven:", ""]
    for system in systems:
        for name, text in document["systems"][system]["describe"].items():
            lines.append(f"- {LABELS[system]} {name}: {text}")
    lines += ["", _other_load_line(document), ""]
    if "load_average_start" in meta:
        start, end = meta["load_average_start"], meta["load_average_end"]
        lines += [
            "Load average (1, 5, 15 min) at the start: "
            + ", ".join(f"{value:.2f}" for value in start)
            + "; at the end: "
            + ", ".join(f"{value:.2f}" for value in end)
            + ".",
            "",
        ]
    return "\n".join(lines)


def _other_load_line(document: dict[str, Any]) -> str:
    parts = []
    for system, entry in document["systems"].items():
        other = sum(m["other_cpu_s"] for s in entry["scenarios"].values() for m in s["run_metrics"])
        wall = sum(run["wall_s"] for run in entry["runs"])
        parts.append(f"{LABELS[system]} {other:,.0f} CPU-s over {wall:,.0f} s")
    return (
        "CPU used on the machine by neither the servers nor the benchmark client during the runs "
        "(other work sharing the cores): " + "; ".join(parts) + "."
    )


def render(document: dict[str, Any], console: Console) -> None:
    """Prints the table and the targets."""
    systems = [s for s in COLUMNS if s in document["systems"]]
    ratio_systems = _ratio_systems(systems)
    table = Table(title=f"kq vs NATS JetStream: median of {document['settings']['runs']} run(s) (min..max)")
    table.add_column("figure")
    for system in systems:
        table.add_column(LABELS[system], justify="right")
    for system in ratio_systems:
        table.add_column(_ratio_header(system), justify="right")
    table.add_column("better")
    for row in document["figures"]:
        cells = [_cell(row.get(system), _digits(row["key"])) for system in systems]
        cells += [_ratio(row.get("ratios", {}).get(system)) for system in ratio_systems]
        table.add_row(row["label"], *cells, row["better"])
    console.print(table)
    for target in document["targets"]:
        value = "-" if target["value"] is None else f"{target['value']:.2f}"
        console.print(f"target {target['target']}: {value} → {_met(target['met'])}")


def write(document: dict[str, Any], output: Path | None, stamp: str) -> tuple[Path, Path]:
    """Writes the JSON and the Markdown next to each other; returns both paths."""
    json_path = output if output is not None else RESULTS_DIR / f"compare-{stamp}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(document, indent=1) + "\n")
    markdown_path = json_path.with_suffix(".md")
    markdown_path.write_text(markdown(document))
    return json_path, markdown_path
