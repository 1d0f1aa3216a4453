"""The soak (`bench.soak`): floor slope, snapshot-log rules, loss accounting, verdict, and a short run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kq.bench.soak_analysis import (
    ERROR_LINES_SHOWN_MAX,
    FloorPoint,
    floor_points,
    least_squares_slope,
    scan_log,
    snapshot_stats,
)
from kq.bench.soak_report import Limits, verdict
from kq.bench.soak_workload import RecordTracker
from kq.client import ConsumerRecord

REPO = Path(__file__).resolve().parents[2]
SMOKE_TIMEOUT_S = 300.0  # The run takes about a minute; this only bounds a hung cluster.
SAMPLE_PERIOD_S = 10.0


def _sawtooth(
    minutes: int, floor_mib_per_min: float, peak_growth_mib_per_min: float = 0.0
) -> list[tuple[float, int]]:
    """Samples every 10 s: a floor rising at the given rate under a sawtooth that resets every 40 s.

    The teeth are 10 MiB a step high, plus `peak_growth_mib_per_min` per minute of run (longer and
    longer compactions): the peaks then rise while the floor does not.
    """
    samples = []
    for step in range(minutes * 6 + 1):
        time_s = step * SAMPLE_PERIOD_S
        floor_mib = 100.0 + floor_mib_per_min * time_s / 60
        tooth_mib = (10 + peak_growth_mib_per_min * time_s / 60) * (step % 4)
        samples.append((time_s, int((floor_mib + tooth_mib) * 1024)))
    return samples


def test_floor_slope_sees_a_rising_floor_under_a_sawtooth() -> None:
    """Peaks far above the floor neither hide a 2 MiB/min rise of the floor nor fake one when they grow."""
    slope = least_squares_slope(floor_points(_sawtooth(20, 2.0), warmup_s=0))
    assert slope == pytest.approx(2.0, abs=0.15)
    flat = least_squares_slope(floor_points(_sawtooth(20, 0.0, peak_growth_mib_per_min=5.0), warmup_s=0))
    assert flat == pytest.approx(0.0, abs=0.15)


def test_floor_slope_ignores_the_warmup_and_a_short_last_window() -> None:
    """A big start-up climb before the warm-up ends and a lone high last sample leave a flat floor flat."""
    samples = [(t, a + (500 * 1024 if t < 300 else 0)) for t, a in _sawtooth(15, 0.0)]
    samples.append((samples[-1][0] + 5, 900 * 1024))  # Alone in a new window: left out.
    points = floor_points(samples, warmup_s=300)
    assert all(point.anon_mib < 200 for point in points)
    assert [point.minute for point in points] == [0.5 + n for n in range(10)]
    assert least_squares_slope(points) == pytest.approx(0.0, abs=0.05)


def test_least_squares_slope_is_exact_on_a_line_and_undefined_on_one_point() -> None:
    """Three points on y = 3x + 1 give 3; a single point gives no slope."""
    points = [FloorPoint(x, 3 * x + 1) for x in (0.5, 1.5, 2.5)]
    assert least_squares_slope(points) == pytest.approx(3.0)
    assert least_squares_slope(points[:1]) is None


def _line(clock: str, message: str, level: str = "INFO", logger: str = "kq.raft.snapshot") -> str:
    return f"2026-11-23 10:{clock} {level} node=2 {logger}: {message}"


def test_snapshot_log_durations_gaps_and_back_to_back() -> None:
    """Durations come from the 'written in' figure (else the timestamps); a 2 s rest is back to back."""
    log = [
        _line("00:00,000", "snapshot started at applied index 100"),
        _line("00:01,500", "snapshot at applied index 100 written in 1.400 s"),
        _line("00:30,000", "snapshot started at applied index 900"),
        _line("00:32,250", "snapshot at applied index 900 written"),  # No figure: 2.25 s by the clock.
        _line("00:34,250", "snapshot started at applied index 990"),  # 2 s after the previous end.
        _line("00:35,000", "snapshot at applied index 990 written in 0.700 s"),
        _line("00:36,000", "applied index 1000", logger="kq.raft.node"),
    ]
    stats = snapshot_stats(scan_log(log), gap_min_s=5.0)
    assert (stats.count, stats.overlaps, stats.failed, stats.unfinished) == (3, 0, 0, 0)
    assert (stats.first_s, stats.last_s) == (1.4, 0.7)
    assert stats.max_s == pytest.approx(2.25)
    assert stats.gap_min_s == pytest.approx(2.0)
    assert stats.back_to_back == 1
    assert snapshot_stats(scan_log(log), gap_min_s=1.0).back_to_back == 0


def test_snapshot_log_overlap_is_a_start_before_the_previous_end() -> None:
    """A second start while the first is still being written is an overlap; a clean log has none."""
    log = [
        _line("00:00,000", "snapshot started at applied index 100"),
        _line("00:01,000", "snapshot started at applied index 200"),
        _line("00:02,000", "snapshot at applied index 100 written in 2.000 s"),
        _line("00:20,000", "snapshot started at applied index 300"),
    ]
    scan = scan_log(log)
    stats = snapshot_stats(scan, gap_min_s=5.0)
    assert stats.overlaps == 1
    assert stats.unfinished == 2  # The overlapped one, and the one still running when the log ends.
    clean = [line for line in log if "index 200" not in line]
    assert snapshot_stats(scan_log(clean), gap_min_s=5.0).overlaps == 0


def test_error_lines_are_counted_and_a_few_kept() -> None:
    """ERROR and CRITICAL count; a traceback under an ERROR is part of it; a stray traceback counts."""
    log = [
        _line("00:00,000", "boom", level="ERROR", logger="kq.broker.service_base"),
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in f',
        _line("00:01,000", "all fine", logger="kq.node"),
        "Exception in thread kq-snapshot:",
        "Traceback (most recent call last):",
        _line("00:02,000", "snapshot at applied index 5 failed", level="ERROR"),
        *(_line("00:03,000", f"diverged {n}", level="CRITICAL", logger="pysyncobj") for n in range(20)),
        _line("00:04,000", "slow", level="WARNING", logger="kq.node"),
    ]
    scan = scan_log(log)
    assert scan.error_count == 23
    assert len(scan.error_lines) == ERROR_LINES_SHOWN_MAX
    assert scan.error_lines[1].startswith("traceback outside an error record")
    assert scan.unmatched_ends == 1  # The failure of a snapshot whose start is not in the log.


def _record(partition: int, offset: int) -> ConsumerRecord:
    return ConsumerRecord("soak", partition, offset, 0, 0, None, b"v")


def test_record_tracker_counts_duplicates_and_skipped_offsets() -> None:
    """Re-read offsets are duplicates, jumped offsets are gaps; distinct counts each offset once."""
    tracker = RecordTracker()
    for partition, offset in [(0, 0), (0, 1), (1, 0), (0, 1), (0, 0), (1, 3), (0, 2)]:
        tracker.add(_record(partition, offset))
    assert (tracker.records, tracker.duplicates, tracker.gap_records, tracker.distinct) == (7, 2, 2, 5)
    assert tracker.reached({0: 3, 1: 4}) and not tracker.reached({0: 4, 1: 4})


def _report(**changes: Any) -> dict[str, Any]:
    """A minimal passing report; `changes` replace top-level entries."""
    snapshots = {"overlaps": 0, "back_to_back": 0, "gap_min_s": 30.0}
    node = {"anon_floor_slope_mib_per_min": 0.2, "snapshots": snapshots, "error_line_count": 0}
    consumer = {"distinct": 100, "gap_records": 0}
    report: dict[str, Any] = {
        "aborted": [],
        "nodes": {n: dict(node) for n in ("1", "2", "3")},
        "digests": {"equal": True},
        "produce": {"acked": 100},
        "consume": {"plain": dict(consumer), "group": dict(consumer)},
    }
    report.update(changes)
    return report


def test_verdict_passes_a_clean_report_and_names_each_failure() -> None:
    """Every limit, when broken, adds its own reason."""
    limits = Limits(slope_max_mib_per_min=1.0, snapshot_gap_min_s=5.0)
    assert verdict(_report(), limits) == []
    leaky = _report()
    leaky["nodes"]["2"]["anon_floor_slope_mib_per_min"] = 1.5
    leaky["nodes"]["3"]["snapshots"] = {"overlaps": 1, "back_to_back": 2, "gap_min_s": 0.5}
    leaky["nodes"]["1"]["error_line_count"] = 4
    failures = verdict(leaky, limits)
    assert len(failures) == 4 and any("node 2" in f and "MiB/min" in f for f in failures)
    lost = _report(digests={"equal": False}, produce={"acked": 101})
    assert len(verdict(lost, limits)) == 3  # Digests, and each consumer short of the acked count.


@pytest.mark.system
def test_short_soak_reports_equal_digests_and_no_lost_records(tmp_path: Path) -> None:
    """A 36-second soak at a low rate writes a complete report: equal digests, consumed >= acked."""
    output = tmp_path / "soak.json"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "kq.bench.soak",
            "--minutes",
            "0.6",
            "--rate",
            "300",
            "--warmup-minutes",
            "0",
            "--sample-interval-s",
            "2",
            "--floor-window-s",
            "10",
            "--json",
            str(output),
            "--keep-dir",
            str(tmp_path / "cluster"),
        ],
        cwd=REPO,
        check=False,  # FAIL (exit 1) is expected in so short a run: it is checked against the report.
        timeout=SMOKE_TIMEOUT_S,
        capture_output=True,
        text=True,
    )
    report = json.loads(output.read_text())
    assert completed.returncode == (0 if report["verdict"]["pass"] else 1), completed.stderr[-2000:]
    assert "VERDICT:" in completed.stdout
    assert report["aborted"] == []
    acked = report["produce"]["acked"]
    assert acked > 0 and report["produce"]["errors"]["count"] == 0
    for consumer in report["consume"].values():
        assert consumer["distinct"] >= acked and consumer["gap_records"] == 0 and consumer["caught_up"]
    digests = report["digests"]
    assert digests["equal"] and set(digests["per_node"]) == {"1", "2", "3"}
    assert all(entry["records"] >= acked for entry in digests["per_node"].values())
    assert len(report["samples"]) >= 10
    for node in report["nodes"].values():
        assert node["anon_mib"]["max"] > 0 and node["file_mib"]["last"] > 0
        assert isinstance(node["anon_floor_slope_mib_per_min"], float)  # Measured; its value is not judged.
        assert {"count", "first_s", "last_s", "max_s", "overlaps", "gap_min_s"} <= set(node["snapshots"])
        assert isinstance(node["error_line_count"], int)
    assert isinstance(report["verdict"]["failures"], list)
