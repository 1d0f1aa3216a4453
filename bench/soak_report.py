"""The soak's report (`bench.soak`): per-node sections, the verdict against the limits, and the text.

The report is a plain JSON-ready dict, written as is by `--json`; `verdict` and `render` read only
that dict, so a saved report can be judged and printed again without a cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kq.bench.soak_analysis import (
    ERROR_LINES_SHOWN_MAX,
    KIB_PER_MIB,
    LogScan,
    floor_points,
    least_squares_slope,
    snapshot_stats,
)

SLOPE_MAX_MIB_PER_MIN = 1.0


@dataclass(frozen=True, slots=True)
class Limits:
    """What a passing soak stays within."""

    slope_max_mib_per_min: float = SLOPE_MAX_MIB_PER_MIN
    snapshot_gap_min_s: float = 5.0


def node_section(
    samples: Sequence[tuple[float, int, int]],
    scan: LogScan,
    warmup_s: float,
    window_s: float,
    limits: Limits,
) -> dict[str, Any]:
    """One node's memory floor, memory figures and snapshot statistics.

    `samples` are (seconds since start, RssAnon KiB, RssFile KiB).
    """
    points = floor_points([(t, anon) for t, anon, _ in samples], warmup_s, window_s)
    anon = [a for _, a, _ in samples]
    files = [f for _, _, f in samples]
    return {
        "anon_floor_slope_mib_per_min": least_squares_slope(points),
        "floor_points": [[round(p.minute, 3), round(p.anon_mib, 2)] for p in points],
        "anon_mib": _range_mib(anon),
        "file_mib": _range_mib(files),
        "snapshots": asdict(snapshot_stats(scan, limits.snapshot_gap_min_s)),
        "snapshot_unmatched_ends": scan.unmatched_ends,
        "error_line_count": scan.error_count,
        "error_lines": list(scan.error_lines),
    }


def _range_mib(values: Sequence[int]) -> dict[str, float | None]:
    if not values:
        return {"first": None, "last": None, "min": None, "max": None}
    return {
        "first": round(values[0] / KIB_PER_MIB, 1),
        "last": round(values[-1] / KIB_PER_MIB, 1),
        "min": round(min(values) / KIB_PER_MIB, 1),
        "max": round(max(values) / KIB_PER_MIB, 1),
    }


def verdict(report: dict[str, Any], limits: Limits) -> list[str]:
    """Why the soak fails; an empty list is a pass."""
    failures: list[str] = list(report.get("aborted", []))
    for node_id, node in sorted(report["nodes"].items()):
        slope = node["anon_floor_slope_mib_per_min"]
        if slope is None:
            failures.append(
                f"node {node_id}: memory floor slope not measured (under 2 windows after warm-up)"
            )
        elif slope > limits.slope_max_mib_per_min:
            failures.append(
                f"node {node_id}: RssAnon floor rises {slope:.2f} MiB/min > {limits.slope_max_mib_per_min}"
            )
        snapshots = node["snapshots"]
        if snapshots["overlaps"]:
            failures.append(f"node {node_id}: {snapshots['overlaps']} overlapping snapshot(s)")
        if snapshots["back_to_back"]:
            failures.append(
                f"node {node_id}: {snapshots['back_to_back']} snapshot(s) started < "
                f"{limits.snapshot_gap_min_s} s after the previous one ended "
                f"(min gap {snapshots['gap_min_s']:.3f} s)"
            )
        if node["error_line_count"]:
            failures.append(f"node {node_id}: {node['error_line_count']} ERROR/CRITICAL line(s)")
    digests = report["digests"]
    if not digests["equal"]:
        failures.append("digests differ between nodes (or a node could not be read)")
    acked = report["produce"]["acked"]
    for name, consumer in sorted(report["consume"].items()):
        if consumer["distinct"] < acked or consumer["gap_records"]:
            failures.append(
                f"{name} consumer: {consumer['distinct']} distinct records < {acked} acked"
                if consumer["distinct"] < acked
                else f"{name} consumer skipped {consumer['gap_records']} offset(s)"
            )
    return failures


def render(report: dict[str, Any]) -> str:
    """The report as text for the terminal."""
    settings, produce = report["settings"], report["produce"]
    lines = [
        f"kq soak: {settings['minutes']} min at {settings['rate']} records/s x {settings['value_bytes']} B, "
        f"{settings['partitions']} partitions, warm-up {settings['warmup_minutes']} min; "
        f"ran {report['duration_s']:.0f} s; cluster in {report['base_dir']}",
        f"produce: sent {produce['sent']:,}, acked {produce['acked']:,}, errors {produce['errors']['count']} "
        f"{produce['errors']['kinds'] or ''}, achieved {produce['rate_achieved']:.0f}/s, "
        f"furthest behind {produce['behind_max_records']:,} records",
    ]
    for name, consumer in sorted(report["consume"].items()):
        lines.append(
            f"consume {name}: {consumer['distinct']:,} distinct of {consumer['records']:,} read, "
            f"duplicates {consumer['duplicates']:,}, skipped {consumer['gap_records']:,}, "
            f"errors {consumer['errors']['count']} {consumer['errors']['kinds'] or ''}, "
            f"caught up: {consumer['caught_up']}"
        )
    lines.append(f"group committed offsets at log end: {report['group_committed_at_end']}")
    lines.append("")
    lines.append("node  floor slope MiB/min  RssAnon MiB first/min/max/last  RssFile MiB last")
    for node_id, node in sorted(report["nodes"].items()):
        lines += _node_lines(node_id, node)
    lines.append("")
    lines += _error_lines(report)
    digests = report["digests"]
    lines.append(f"digests ({'equal' if digests['equal'] else 'DIFFER'}):")
    for node_id, entry in sorted(digests["per_node"].items()):
        lines.append(
            f"  node {node_id}: {entry.get('sha256', entry.get('error'))} "
            f"({entry.get('records', '?')} records)"
        )
    failures = report["verdict"]["failures"]
    lines.append("")
    lines.append("VERDICT: PASS" if not failures else "VERDICT: FAIL")
    lines += [f"  - {failure}" for failure in failures]
    return "\n".join(lines)


def _node_lines(node_id: str, node: dict[str, Any]) -> list[str]:
    anon, snap = node["anon_mib"], node["snapshots"]
    memory = f"{anon['first']}/{anon['min']}/{anon['max']}/{anon['last']}"
    durations = (
        f"first {_number(snap['first_s'], '.2f')} s, last {_number(snap['last_s'], '.2f')} s, "
        f"max {_number(snap['max_s'], '.2f')} s"
    )
    return [
        f"{node_id:>4}  {_number(node['anon_floor_slope_mib_per_min'], '+.3f'):>19}  {memory:>32}  "
        f"{node['file_mib']['last']!s:>16}",
        f"      snapshots: {snap['count']} written ({durations}), overlaps {snap['overlaps']}, "
        f"min gap {_number(snap['gap_min_s'], '.1f')} s, back-to-back {snap['back_to_back']}, "
        f"failed {snap['failed']}, unfinished {snap['unfinished']}",
    ]


def _error_lines(report: dict[str, Any]) -> list[str]:
    total = sum(node["error_line_count"] for node in report["nodes"].values())
    shown = [
        f"  node {n}: {line}" for n, node in sorted(report["nodes"].items()) for line in node["error_lines"]
    ]
    return [f"ERROR/CRITICAL lines in node logs: {total}", *shown[:ERROR_LINES_SHOWN_MAX]]


def _number(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)
