"""The benchmark itself works: a --quick run reports every scenario with positive numbers (never speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kq.bench.report import percentile
from kq.bench.settings import QUICK_COUNTS, ScenarioKind, standard_scenarios

REPO = Path(__file__).resolve().parents[2]
QUICK_RUN_TIMEOUT_S = 120.0  # A quick run takes seconds; this only bounds a hung cluster.


def test_percentile_is_nearest_rank() -> None:
    """p50 and p99 pick observed values by nearest rank, so 1 slow send in 100 is the p100, not p99."""
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([7.0], 99) == 7.0


@pytest.mark.system
def test_quick_run_reports_every_scenario(tmp_path: Path) -> None:
    """`python -m kq.bench --quick` starts three nodes, runs all scenarios once and writes complete JSON."""
    output = tmp_path / "result.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "kq.bench",
            "--quick",
            "--output",
            str(output),
            "--base-dir",
            str(tmp_path / "nodes"),
        ],
        cwd=REPO,
        check=True,
        timeout=QUICK_RUN_TIMEOUT_S,
        capture_output=True,
    )
    document = json.loads(output.read_text())

    expected = standard_scenarios(QUICK_COUNTS)
    assert set(document["scenarios"]) == {scenario.name for scenario in expected}
    for scenario in expected:
        entry = document["scenarios"][scenario.name]
        summary = entry["summary"]
        assert len(entry["runs"]) == 1
        assert summary["errors"]["total"] == 0
        assert summary["server_cpu_us_per_record"]["median"] >= 0
        if scenario.kind is ScenarioKind.LATENCY:
            assert summary["sends"]["median"] > 0
            assert 0 < summary["p50_ms"]["median"] <= summary["p99_ms"]["median"]
        else:
            assert summary["records"]["median"] > 0
            assert summary["records_per_s"]["median"] > 0

    final = document["memory"]["final"]
    assert final["records_written"] > 0 and final["stored_bytes"] > 0
    assert len(final["nodes"]) == 3
    for node in final["nodes"].values():
        assert node["rss_kib"] > 0 and node["peak_rss_kib"] >= node["rss_kib"]
        assert node["peak_anon_kib"] >= node["anon_kib"] > 0
        assert node["raft_log_entries"] is not None and node["raft_log_entries"] > 0
    assert len(document["memory"]["timeline"]) == len(expected)
