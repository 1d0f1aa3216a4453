"""The soak's report (`bench.soak`): per-node sections, the verdict against the limits, and the text.

The report is a plain JSON-ready dict, written as is by `--json`; `verdict` and `render` read only
that dict, so a saved report can be judged and printed again without a cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kq.bench.disk_usage import DiskUsage
from kq.bench.soak_analysis import (
    BYTES_PER_MIB,
    ERROR_LINES_SHOWN_MAX,
    KIB_PER_MIB,
    LogScan,
    at_intervals,
    floor_points,
    least_squares_slope,
    r_squared,
    size_level,
    snapshot_stats,
)
from kq.proto.limits import NODE_THREADS_MAX

SLOPE_MAX_MIB_PER_MIN = 1.0


@dataclass(frozen=True, slots=True)
class Limits:
    """What a passing soak stays within."""

    slope_max_mib_per_min: float = SLOPE_MAX_MIB_PER_MIN
    snapshot_gap_min_s: float = 5.0
    # With retention: how far a node's size peak over the second half may exceed the first half's,
    # as a fraction of the latter. None (no retention): sizes are reported, not judged.
    size_growth_max_fraction: float | None = None
    threads_max: int = NODE_THREADS_MAX  # A node process's OS threads at any sample.


def node_section(
    samples: Sequence[tuple[float, int, int]],
    scan: LogScan,
    warmup_s: float,
    window_s: float,
    limits: Limits,
    threads: Sequence[tuple[float, int]] = (),
) -> dict[str, Any]:
    """One node's memory floor (its slope and R²), memory figures, thread counts and snapshot
    statistics.

    `samples` are (seconds since start, RssAnon KiB, RssFile KiB); `threads` (seconds since start,
    the process's OS threads).
    """
    points = floor_points([(t, anon) for t, anon, _ in samples], warmup_s, window_s)
    anon = [a for _, a, _ in samples]
    files = [f for _, _, f in samples]
    counts = [count for _, count in threads]
    r2 = r_squared(points)
    return {
        "anon_floor_slope_mib_per_min": least_squares_slope(points),
        "anon_floor_r_squared": None if r2 is None else round(r2, 3),
        "threads": {
            "first": counts[0] if counts else None,
            "max": max(counts) if counts else None,
            "last": counts[-1] if counts else None,
        },
        "floor_points": [[round(p.minute, 3), round(p.anon_mib, 2)] for p in points],
        "anon_mib": _range_mib(anon),
        "file_mib": _range_mib(files),
        "snapshots": asdict(snapshot_stats(scan, limits.snapshot_gap_min_s)),
        "snapshot_unmatched_ends": scan.unmatched_ends,
        "error_line_count": scan.error_count,
        "error_lines": list(scan.error_lines),
    }


def disk_section(
    samples: Sequence[tuple[float, DiskUsage]], growth_max_fraction: float, interval_s: float
) -> dict[str, Any]:
    """One node's data directory over time: whether the total and the LMDB file levelled off, and the
    samples at every `interval_s` (rows of the printed table: seconds, then sizes in bytes)."""
    totals = [(t, usage.total_bytes) for t, usage in samples]
    lmdb = [(t, usage.lmdb_bytes) for t, usage in samples]
    levels = {"total": size_level(totals, growth_max_fraction), "lmdb": size_level(lmdb, growth_max_fraction)}
    rows = [samples[i] for i in at_intervals([t for t, _ in samples], interval_s)]
    return {
        "levels": {name: asdict(level) if level is not None else None for name, level in levels.items()},
        "columns": ["t_s", "total_bytes", "lmdb_bytes", "journal_bytes", "other_bytes", "allocated_bytes"],
        "rows": [
            [round(t, 1), u.total_bytes, u.lmdb_bytes, u.journal_bytes, u.other_bytes, u.allocated_bytes]
            for t, u in rows
        ],
        "max_total_bytes": max((u.total_bytes for _, u in samples), default=None),
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
        most_threads = node.get("threads", {}).get("max")
        if most_threads is not None and most_threads > limits.threads_max:
            failures.append(
                f"node {node_id}: {most_threads} threads > {limits.threads_max} (NODE_THREADS_MAX)"
            )
    digests = report["digests"]
    if not digests["equal"]:
        failures.append("digests differ between nodes (or a node could not be read)")
    if not digests.get("log_starts_equal", True):
        failures.append("nodes report different log starts")
    acked = report["produce"]["acked"]
    for name, consumer in sorted(report["consume"].items()):
        if consumer["distinct"] < acked or consumer["gap_records"]:
            failures.append(
                f"{name} consumer: {consumer['distinct']} distinct records < {acked} acked"
                if consumer["distinct"] < acked
                else f"{name} consumer skipped {consumer['gap_records']} offset(s)"
            )
            if "OffsetOutOfRangeError" in consumer.get("errors", {}).get("kinds", {}):
                failures[-1] += " (it fell behind retention: records were trimmed before it read them)"
            elif report.get("settings", {}).get("retention_bytes") is not None:
                # The group consumer moves past trimmed offsets by itself (auto_offset_reset), silently.
                failures[-1] += " (retention is on: trimmed before it read them, if not lost)"
    if limits.size_growth_max_fraction is not None:
        failures += _retention_failures(report, limits.size_growth_max_fraction)
    return failures


def _retention_failures(report: dict[str, Any], growth_max_fraction: float) -> list[str]:
    """With retention on: it trimmed, it settled, and every node's sizes levelled off."""
    failures: list[str] = []
    retention = report.get("retention") or {}
    if not any(start > 0 for start in (retention.get("log_starts") or {}).values()):
        failures.append("retention trimmed nothing: every log still starts at offset 0")
    if not retention.get("settled", False):
        failures.append("retention kept trimming after the last write (log starts did not settle)")
    for node_id, node in sorted(report["nodes"].items()):
        for name, level in sorted(node["disk"]["levels"].items()):
            what = "data directory" if name == "total" else "LMDB file"
            if level is None:
                failures.append(f"node {node_id}: {what} size not judged (under 2 samples in a half)")
            elif not level["levelled"]:
                failures.append(
                    f"node {node_id}: {what} still grows: peak {_mib(level['second_half_peak_bytes'])} MiB "
                    f"over the second half > first half's {_mib(level['first_half_peak_bytes'])} MiB "
                    f"+ {growth_max_fraction:.0%}"
                )
    return failures


def _mib(value: int | None) -> str:
    return "?" if value is None else f"{value / BYTES_PER_MIB:,.1f}"


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
    lines.append(
        "node  floor slope MiB/min (R²)  RssAnon MiB first/min/max/last  RssFile MiB last  "
        f"threads first/max/last (<= {NODE_THREADS_MAX})"
    )
    for node_id, node in sorted(report["nodes"].items()):
        lines += _node_lines(node_id, node)
    lines.append("")
    lines += _disk_lines(report)
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
    threads = node.get("threads", {})
    r2 = _number(node.get("anon_floor_r_squared"), ".2f")
    slope = f"{_number(node['anon_floor_slope_mib_per_min'], '+.3f')} ({r2})"
    return [
        f"{node_id:>4}  {slope:>24}  {memory:>32}  {node['file_mib']['last']!s:>16}  "
        f"{threads.get('first')}/{threads.get('max')}/{threads.get('last')}",
        f"      snapshots: {snap['count']} written ({durations}), overlaps {snap['overlaps']}, "
        f"min gap {_number(snap['gap_min_s'], '.1f')} s, back-to-back {snap['back_to_back']}, "
        f"failed {snap['failed']}, unfinished {snap['unfinished']}",
    ]


def _disk_lines(report: dict[str, Any]) -> list[str]:
    """Retention, each node's data directory over time, and whether its sizes levelled off."""
    settings, lines = report["settings"], []
    retention = report.get("retention")
    if settings.get("retention_bytes") is not None:
        lines.append(
            f"retention: retention.bytes={settings['retention_bytes']:,} per partition, checked every "
            f"{settings['retention_check_ms']:,} ms; log starts at the end "
            f"{(retention or {}).get('log_starts')}, settled: {(retention or {}).get('settled')} "
            f"(after {(retention or {}).get('waited_s')} s)"
        )
    nodes = sorted(report["nodes"].items())
    if not nodes:
        return lines
    lines.append("data directory per node, MiB: total (LMDB data.mdb + Raft journal + other)")
    lines.append("   time  " + "  ".join(f"{'node ' + n:>30}" for n, _ in nodes))
    rows = {n: node["disk"]["rows"] for n, node in nodes}
    for index in range(max(len(r) for r in rows.values())):
        cells, time_s = [], None
        for node_id, _ in nodes:
            if index < len(rows[node_id]):
                t, total, lmdb, journal, other, _allocated = rows[node_id][index]
                time_s = t
                cells.append(f"{_mib(total)} ({_mib(lmdb)} + {_mib(journal)} + {_mib(other)})")
            else:
                cells.append("")
        lines.append(f"{_number(time_s, '7.0f')}s  " + "  ".join(f"{cell:>30}" for cell in cells))
    for node_id, node in nodes:
        for name, level in sorted(node["disk"]["levels"].items()):
            lines.append(f"  node {node_id} {name}: {_level_text(level)}")
    return lines


def _level_text(level: dict[str, Any] | None) -> str:
    if level is None:
        return "not judged (under 2 samples in a half)"
    fraction = level["growth_fraction"]
    growth = "n/a" if fraction is None else f"{fraction:+.1%}"
    return (
        f"peak {_mib(level['first_half_peak_bytes'])} MiB in the first half, "
        f"{_mib(level['second_half_peak_bytes'])} MiB in the second ({growth}; bound "
        f"+{level['growth_max_fraction']:.0%}), second-half slope "
        f"{_number(level['second_half_slope_mib_per_min'], '+.2f')} MiB/min: "
        + ("levelled off" if level["levelled"] else "STILL GROWING")
    )


def _error_lines(report: dict[str, Any]) -> list[str]:
    total = sum(node["error_line_count"] for node in report["nodes"].values())
    shown = [
        f"  node {n}: {line}" for n, node in sorted(report["nodes"].items()) for line in node["error_lines"]
    ]
    return [f"ERROR/CRITICAL lines in node logs: {total}", *shown[:ERROR_LINES_SHOWN_MAX]]


def _number(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)
