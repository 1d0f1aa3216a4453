"""The verdict table and the JSON report of a run."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kq.chaos.context import FaultEvent
from kq.chaos.gaps import COMPACTED, TRIMMED
from kq.chaos.runner import ScenarioReport

ANOMALIES_SHOWN_PER_SCENARIO = 10


def timing(events: Sequence[FaultEvent]) -> dict[str, Any]:
    """Count, median and max of the time from fault to next acknowledged write, over `events`."""
    times = [t for event in events if (t := event.time_to_ack_s) is not None]
    return {
        "faults": len(events),
        "measured": len(times),
        "median_s": round(statistics.median(times), 3) if times else None,
        "max_s": round(max(times), 3) if times else None,
    }


def timing_by_kind(reports: Sequence[ScenarioReport]) -> dict[str, dict[str, Any]]:
    """Fault kind (with "(leader)" for rolling restarts of the leader) -> timing over every scenario."""
    by_kind: dict[str, list[FaultEvent]] = {}
    for report in reports:
        for event in report.faults:
            kind = event.kind + (
                " (leader)" if event.kind == "rolling-restart" and event.leader_fault else ""
            )
            by_kind.setdefault(kind, []).append(event)
    return {kind: timing(events) for kind, events in sorted(by_kind.items())}


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _row(report: ScenarioReport) -> list[str]:
    leader = timing([event for event in report.faults if event.leader_fault])
    other = timing([event for event in report.faults if not event.leader_fault])
    counts = report.counts
    unknown = (
        f"{counts.get('records_unknown', 0)} ({counts.get('records_unknown_present', 0)})" if counts else "-"
    )
    return [
        report.name,
        str(report.nodes),
        report.verdict,
        str(len(report.faults)),
        str(counts.get("records_acknowledged", "-")),
        unknown,
        f"{_seconds(leader['median_s'])} / {_seconds(leader['max_s'])}",
        _seconds(other["max_s"]),
        _group_cell(counts),
        _gaps_cell(report.gaps),
        str(sum(report.anomaly_counts.values())),
        f"{report.duration_s:.0f} s",
    ]


def _group_cell(counts: dict[str, int]) -> str:
    """Records delivered to the group (with duplicates), commits acknowledged, last generation."""
    if not counts.get("group_records_delivered") and not counts.get("group_commits"):
        return "-"
    return (
        f"{counts.get('group_records_delivered', 0)} / {counts.get('group_commits', 0)} / "
        f"{counts.get('group_generation_max', 0)}"
    )


def _gaps_cell(gaps: dict[str, int]) -> str:
    """Acknowledged records missing as documented gaps: trimmed by retention / removed by compaction."""
    if not gaps:
        return "-"
    return f"{gaps.get(TRIMMED, 0)} / {gaps.get(COMPACTED, 0)}"


HEADER = [
    "scenario",
    "nodes",
    "verdict",
    "faults",
    "acked",
    "unknown (landed)",
    "leader fault→ack median / max (s)",
    "other stall max (s)",
    "group delivered / commits / gen",
    "gaps trimmed / compacted",
    "anomalies",
    "time",
]


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in [header, *rows]
    ]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(lines)


def render(reports: Sequence[ScenarioReport]) -> str:
    """The verdict table, timing per fault kind, then each scenario's anomalies and notes."""
    parts = [_table(HEADER, [_row(report) for report in reports])]
    kinds = timing_by_kind(reports)
    if kinds:
        rows = [
            [kind, str(t["faults"]), str(t["measured"]), _seconds(t["median_s"]), _seconds(t["max_s"])]
            for kind, t in kinds.items()
        ]
        parts.append(_table(["fault", "count", "measured", "to next ack: median (s)", "max (s)"], rows))
    for report in reports:
        parts.extend(_details(report))
    verdicts = [report.verdict for report in reports]
    parts.append(f"verdict: {'FAIL' if 'FAIL' in verdicts else 'PASS'} ({_verdict_counts(verdicts)})")
    return "\n\n".join(parts)


def _verdict_counts(verdicts: list[str]) -> str:
    return ", ".join(f"{verdicts.count(v)} {v.lower()}" for v in ("PASS", "FAIL", "SKIPPED") if v in verdicts)


def _details(report: ScenarioReport) -> list[str]:
    lines: list[str] = []
    if report.reason:
        lines.append(f"{report.name}: {report.verdict}: {report.reason}")
    for anomaly in report.anomalies[:ANOMALIES_SHOWN_PER_SCENARIO]:
        where = f" partition {anomaly.partition}" if anomaly.partition is not None else ""
        lines.append(f"  {anomaly.kind}{where} offsets {list(anomaly.offsets)}: {anomaly.detail}")
    lines.extend(f"  note: {note}" for note in report.notes)
    if report.data_dir:
        lines.append(f"  node data and logs kept in {report.data_dir}")
    return ["\n".join(lines)] if lines else []


def to_json(reports: Sequence[ScenarioReport], meta: dict[str, Any]) -> dict[str, Any]:
    """The whole run as JSON-ready data: meta, overall verdict, timing per kind, every scenario."""
    scenarios = []
    for report in reports:
        data = asdict(report)
        data["faults"] = [
            {**asdict(event), "time_to_ack_s": event.time_to_ack_s, **_relative(event, report.origin_s)}
            for event in report.faults
        ]
        data["failover"] = timing([event for event in report.faults if event.leader_fault])
        scenarios.append(data)
    verdicts = [report.verdict for report in reports]
    return {
        "meta": meta,
        "verdict": "FAIL" if "FAIL" in verdicts else "PASS",
        "timing_by_fault": timing_by_kind(reports),
        "scenarios": scenarios,
    }


def _relative(event: FaultEvent, origin_s: float) -> dict[str, float | None]:
    healed = None if event.healed_s is None else round(event.healed_s - event.started_s, 3)
    return {"at_s": round(event.started_s - origin_s, 3), "healed_after_s": healed}


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Writes the report, creating its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
