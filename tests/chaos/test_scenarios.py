"""The short chaos run of the default suite: leader kills and a leader pause under load, zero anomalies."""

from __future__ import annotations

from pathlib import Path

import pytest

from kq.chaos.report import render
from kq.chaos.runner import RunSettings, run_scenario
from kq.chaos.scenarios import SCENARIOS

pytestmark = pytest.mark.system


def test_smoke_scenario_passes_with_no_anomaly(tmp_path: Path) -> None:
    """Three leader kills and one pause: no anomaly, and the consumer group rebalanced and caught up."""
    report = run_scenario(SCENARIOS["smoke"], RunSettings(tmp_path))
    print(render([report]))  # Shown by pytest on failure: the verdict table and the anomalies.
    assert report.verdict == "PASS", report.reason
    assert len(report.faults) == 4
    assert all(event.time_to_ack_s is not None for event in report.faults)
    assert report.counts["records_acknowledged"] > 0
    assert report.counts["nodes_read"] == 3
    assert report.counts["group_generation_max"] >= 2, "the group's members joined one by one"
    assert report.counts["group_commits"] > 0 and report.counts["group_join_reads"] > 0
    assert report.counts["group_acked_beyond_commit"] == 0, "the group caught up with the log end"
