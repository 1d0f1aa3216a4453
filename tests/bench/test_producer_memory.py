"""The producer memory benchmark works: a small run stays within its RSS bound and stores every record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kq.bench.producer_memory import RSS_SLACK_BYTES, MemoryReport, MemorySettings, render

REPO = Path(__file__).resolve().parents[2]
SMOKE_RECORDS = 20_000
SMOKE_RUN_TIMEOUT_S = 180.0  # A smoke run takes seconds on a quiet machine; this only bounds a hung cluster.


def test_the_report_fails_a_peak_above_the_bound() -> None:
    """The verdict is peak RSS <= buffer_memory + 64 MiB: one byte over is FAIL, and a lost record shows."""
    settings = MemorySettings(records=10, buffer_memory=1024)
    bound_bytes = 1024 + RSS_SLACK_BYTES
    report = MemoryReport(
        settings=settings,
        elapsed_s=1.0,
        records_per_s=10.0,
        rss_before_bytes=0,
        rss_peak_bytes=bound_bytes + 1,
        rss_bound_bytes=bound_bytes,
        pending_records_peak=10,
        pending_bytes_peak=2048,
        gc_pause_longest_s=0.001,
        gc_pause_longest_cpu_s=0.001,
        gc_pause_longest_generation=0,
        gc_pauses=1,
        gc_pause_total_s=0.001,
        gc_pause_total_cpu_s=0.001,
        records_stored=9,
    )
    assert not report.passed and not report.all_stored
    assert "FAIL" in render(report) and "9 of 10" in render(report)


@pytest.mark.system
def test_a_small_run_stays_within_the_bound(tmp_path: Path) -> None:
    """`python -m kq.bench.producer_memory` with 20,000 records: peak client RSS within the bound, all stored.

    It runs in a fresh interpreter because the bound is on the whole client process's RSS, which
    inside pytest would include whatever earlier tests left behind.
    """
    output = tmp_path / "report.json"
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            "kq.bench.producer_memory",
            "--records",
            str(SMOKE_RECORDS),
            "--json",
            str(output),
        ],
        check=False,  # The report and the output say more than the exit code alone.
        cwd=REPO,
        timeout=SMOKE_RUN_TIMEOUT_S,
        capture_output=True,
        text=True,
    )
    report = json.loads(output.read_text())
    assert report["rss_peak_bytes"] <= report["rss_bound_bytes"], finished.stdout
    assert report["passed"] and report["all_stored"] and finished.returncode == 0, finished.stdout
    assert report["settings"]["records"] == report["records_stored"] == SMOKE_RECORDS
    assert report["records_per_s"] > 0 and report["gc_pauses"] >= 0
