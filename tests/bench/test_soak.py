"""The soak (`bench.soak`): floor slope, snapshot-log rules, loss accounting, verdict, and a short run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kq.bench.disk_usage import classify, measure
from kq.bench.soak_analysis import (
    ERROR_LINES_SHOWN_MAX,
    FloorPoint,
    at_intervals,
    floor_points,
    least_squares_slope,
    r_squared,
    scan_log,
    size_level,
    snapshot_stats,
)
from kq.bench.soak_report import Limits, node_section, verdict
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


def test_r_squared_is_one_on_a_line_low_on_noise_and_undefined_when_flat() -> None:
    """A steady rise is explained by its line (R² 1); a floor jumping around a flat line is not (near
    0); a perfectly flat floor or a single point has no R²."""
    line = [FloorPoint(x, 2 * x + 5) for x in (0.5, 1.5, 2.5, 3.5)]
    assert r_squared(line) == pytest.approx(1.0)
    noise = [FloorPoint(x, 100 + (3 if i % 2 else -3)) for i, x in enumerate((0.5, 1.5, 2.5, 3.5, 4.5, 5.5))]
    r2 = r_squared(noise)
    assert r2 is not None and r2 < 0.2
    assert r_squared([FloorPoint(x, 7.0) for x in (0.5, 1.5)]) is None
    assert r_squared(line[:1]) is None


def test_node_section_reports_thread_counts_and_the_verdict_holds_them_to_the_limit() -> None:
    """Each node's first, largest and last thread count go in its section; a count above
    `Limits.threads_max` (NODE_THREADS_MAX by default) fails the soak, naming the node."""
    samples = [(t * 10.0, 100_000, 50_000) for t in range(40)]
    section = node_section(samples, scan_log([]), 0.0, 60.0, Limits(), [(0.0, 20), (10.0, 31), (20.0, 25)])
    assert section["threads"] == {"first": 20, "max": 31, "last": 25}
    assert section["anon_floor_slope_mib_per_min"] == pytest.approx(0.0)
    report = _report()
    report["nodes"]["2"]["threads"] = section["threads"]
    assert verdict(report, Limits(threads_max=31)) == []
    failures = verdict(report, Limits(threads_max=30))
    assert failures == ["node 2: 31 threads > 30 (NODE_THREADS_MAX)"]


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


MIB = 1024 * 1024


def _plateau(minutes: int, growth_mib_per_min: float) -> list[tuple[float, int]]:
    """Samples every 10 s: 3 minutes of ramp to 200 MiB, then a sawtooth of ±8 MiB (journal files
    coming and going) on a base that grows `growth_mib_per_min` from then on."""
    samples = []
    for step in range(minutes * 6 + 1):
        time_s = step * SAMPLE_PERIOD_S
        ramp = min(time_s / 180, 1.0) * 200
        growth = max(0.0, time_s - 180) / 60 * growth_mib_per_min
        samples.append((time_s, int((ramp + growth + 8 * ((step % 3) - 1)) * MIB)))
    return samples


def test_size_level_sees_a_plateau_after_a_ramp_and_a_size_that_keeps_growing() -> None:
    """A ramp then a noisy flat size levels off; 2 MiB/min more on 200 MiB over 30 minutes does not."""
    flat = size_level(_plateau(30, 0.0), growth_max_fraction=0.10)
    assert flat is not None and flat.levelled
    assert flat.growth_bytes == 0 and flat.second_half_slope_mib_per_min == pytest.approx(0.0, abs=0.5)
    growing = size_level(_plateau(30, 2.0), growth_max_fraction=0.10)
    assert growing is not None and not growing.levelled
    assert growing.growth_fraction == pytest.approx(30 / 224, abs=0.02)  # 15 min x 2 MiB over the peak.
    assert growing.second_half_slope_mib_per_min == pytest.approx(2.0, abs=0.3)
    looser = size_level(_plateau(30, 2.0), growth_max_fraction=0.20)
    assert looser is not None and looser.levelled


def test_size_level_needs_two_samples_in_each_half() -> None:
    """One or three samples cannot show a trend: not judged."""
    assert size_level([], 0.1) is None
    assert size_level([(0.0, 1), (5.0, 2), (10.0, 3)], 0.1) is None
    assert size_level([(0.0, 1), (4.0, 2), (6.0, 2), (10.0, 2)], 0.1) is not None


def test_at_intervals_takes_the_first_sample_of_each_interval_and_the_last() -> None:
    """Rows every 300 s of samples every 10 s (with a late one), ending with the last sample."""
    times = [10.0 * n for n in range(95)] + [951.5]
    chosen = at_intervals(times, 300.0)
    assert [times[i] for i in chosen] == [0.0, 300.0, 600.0, 900.0, 951.5]
    assert at_intervals([3.0, 7.0], 300.0) == [0, 1]


def test_disk_usage_splits_lmdb_journal_and_the_rest(tmp_path: Path) -> None:
    """data.mdb and journal files are counted apart; other files, nested too, make up the rest."""
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "data.mdb").write_bytes(b"x" * 5000)
    (tmp_path / "store" / "lock.mdb").write_bytes(b"x" * 100)
    (tmp_path / "raft").mkdir()
    (tmp_path / "raft" / "journal.kq").write_bytes(b"x" * 700)
    (tmp_path / "raft" / "journal.kq.meta").write_bytes(b"x" * 30)
    (tmp_path / "raft" / "snapshot").write_bytes(b"x" * 20)
    usage = measure(tmp_path)
    parts = (usage.total_bytes, usage.lmdb_bytes, usage.journal_bytes, usage.other_bytes)
    assert parts == (5850, 5000, 730, 120)
    assert usage.files == 5 and usage.allocated_bytes > 0
    assert measure(tmp_path / "missing").total_bytes == 0
    assert [classify(name) for name in ("data.mdb", "journal", "lock.mdb")] == ["lmdb", "journal", "other"]


def _retention_report(**retention: Any) -> dict[str, Any]:
    """A passing report of a retention soak; `retention` replaces entries of its retention section."""
    level = {"levelled": True, "first_half_peak_bytes": 100, "second_half_peak_bytes": 101}
    report = _report(retention={"settled": True, "log_starts": {"0": 10, "1": 0}, **retention})
    for node in report["nodes"].values():
        node["disk"] = {"levels": {"total": dict(level), "lmdb": dict(level)}}
    return report


def test_verdict_with_retention_wants_trims_a_settled_end_and_level_sizes() -> None:
    """Retention on: no trim, trims after the last write, a growing or unjudged size each fail."""
    limits = Limits(size_growth_max_fraction=0.1)
    assert verdict(_retention_report(), limits) == []
    assert verdict(_retention_report(), Limits()) == []  # Off: sizes are not judged.
    untrimmed = verdict(_retention_report(log_starts={"0": 0, "1": 0}, settled=False), limits)
    assert len(untrimmed) == 2 and "trimmed nothing" in untrimmed[0] and "settle" in untrimmed[1]
    growing = _retention_report()
    growing["nodes"]["2"]["disk"]["levels"]["lmdb"] = {
        "levelled": False,
        "first_half_peak_bytes": 100 * MIB,
        "second_half_peak_bytes": 150 * MIB,
    }
    growing["nodes"]["3"]["disk"]["levels"]["total"] = None
    failures = verdict(growing, limits)
    assert len(failures) == 2
    assert "node 2: LMDB file still grows: peak 150.0 MiB" in failures[0]
    assert "node 3: data directory size not judged" in failures[1]


def test_verdict_names_a_consumer_that_fell_behind_retention() -> None:
    """Skipped offsets with OUT_OF_RANGE errors are blamed on retention outrunning the consumer."""
    behind = {"distinct": 90, "gap_records": 10, "errors": {"kinds": {"OffsetOutOfRangeError": 3}}}
    caught_up = {"distinct": 100, "gap_records": 0}
    failures = verdict(_report(consume={"plain": behind, "group": caught_up}), Limits())
    assert len(failures) == 1 and "fell behind retention" in failures[0]
    skipped = {"distinct": 100, "gap_records": 10}  # A group consumer that moved up by itself.
    report = _report(consume={"plain": caught_up, "group": skipped}, settings={"retention_bytes": 1})
    assert "retention is on" in verdict(report, Limits())[0]


def _run_soak(tmp_path: Path, *extra: str) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """A 36-second soak at 300 records/s with `extra` arguments: its JSON report and its process."""
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
            *extra,
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
    return report, completed


@pytest.mark.system
@pytest.mark.bench
def test_short_soak_with_retention_trims_and_compares_what_is_left(tmp_path: Path) -> None:
    """A 36-second soak at a low rate with retention.bytes of 32 KiB a partition writes a complete
    report: logs are trimmed alike on every node, the digests of what is left are equal, the consumers
    still read every record, and every sample measures each node's data directory."""
    retention = ("--retention-bytes", "32768", "--retention-check-ms", "1000")
    report, completed = _run_soak(tmp_path, *retention, "--size-report-interval-s", "10")
    assert report["aborted"] == [] and report["produce"]["errors"]["count"] == 0
    acked = report["produce"]["acked"]
    for consumer in report["consume"].values():
        assert consumer["distinct"] >= acked and consumer["gap_records"] == 0 and consumer["caught_up"]
    retention = report["retention"]
    assert retention["settled"] and all(start > 0 for start in retention["log_starts"].values())
    digests = report["digests"]
    assert digests["equal"] and digests["log_starts_equal"]
    assert all(0 < entry["records"] < acked for entry in digests["per_node"].values())
    for node in report["nodes"].values():
        disk = node["disk"]
        assert set(disk["levels"]) == {"total", "lmdb"} and len(disk["rows"]) >= 4
        assert all(row[1] >= row[2] > 0 for row in disk["rows"][1:])  # Total holds the LMDB file.
    assert all(sample["nodes"]["1"]["dir_bytes"] > 0 for sample in report["samples"])
    # The rest of a complete report (one run serves both: each soak costs the suite ~40 s).
    assert acked > 0 and set(digests["per_node"]) == {"1", "2", "3"} and len(report["samples"]) >= 10
    for node in report["nodes"].values():
        assert node["anon_mib"]["max"] > 0 and node["file_mib"]["last"] > 0
        assert isinstance(node["anon_floor_slope_mib_per_min"], float)  # Measured; its value is not judged.
        assert {"count", "first_s", "last_s", "max_s", "overlaps", "gap_min_s"} <= set(node["snapshots"])
        assert isinstance(node["error_line_count"], int)
    assert isinstance(report["verdict"]["failures"], list)
    assert "data directory per node" in completed.stdout
    assert not any("trimmed nothing" in failure for failure in report["verdict"]["failures"])
