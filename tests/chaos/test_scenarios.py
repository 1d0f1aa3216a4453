"""The short chaos runs of the default suite: leader kills and a leader pause under load, leader kills
while retention trims the topic, a node added and an old one removed while the leader is killed, and
leader kills on a cluster with mutual TLS; zero anomalies."""

from __future__ import annotations

from pathlib import Path

import pytest

from kq.chaos.report import render
from kq.chaos.runner import CERTS_DIR, RunSettings, run_scenario
from kq.chaos.scenarios import SCENARIOS

pytestmark = pytest.mark.system


def test_smoke_scenario_passes_over_tls_with_no_anomaly(tmp_path: Path) -> None:
    """Three leader kills and one pause, on a secure cluster (`--secure`: mutual TLS on gRPC, TLS on
    Kafka, `--auth`): no anomaly, and the consumer group rebalanced and caught up. The certificates
    were made into the scenario's directory, and at the end every endpoint of the three nodes was
    probed and refused plain text (a run that silently fell back to plain text has no probe count, or
    fails: TLS clients cannot talk to plain nodes, and the probe reports plain text). The other
    scenarios of this file run in plain text."""
    report = run_scenario(SCENARIOS["smoke"], RunSettings(tmp_path, secure=True, keep_data=True))
    print(render([report]))  # Shown by pytest on failure: the verdict table and the anomalies.
    assert report.verdict == "PASS", report.reason
    assert (tmp_path / "smoke" / CERTS_DIR / "admin.pem").is_file()
    assert report.counts.get("tls_endpoints_checked") == 6, "gRPC and Kafka of each of the three nodes probed"
    assert len(report.faults) == 4
    assert all(event.time_to_ack_s is not None for event in report.faults)
    assert report.counts["records_acknowledged"] > 0
    assert report.counts["nodes_read"] == 3
    assert report.counts["group_generation_max"] >= 2, "the group's members joined one by one"
    assert report.counts["group_commits"] > 0 and report.counts["group_join_reads"] > 0
    assert report.counts["group_acked_beyond_commit"] == 0, "the group caught up with the log end"


def test_retention_smoke_scenario_trims_under_leader_kills_with_no_anomaly(tmp_path: Path) -> None:
    """Two leader kills while retention trims 4 times a second: records below the final log start are
    counted as trimmed gaps, everything above it is verified, and nothing else is missing."""
    report = run_scenario(SCENARIOS["retention-smoke"], RunSettings(tmp_path))
    print(render([report]))
    assert report.verdict == "PASS", report.reason
    assert len(report.faults) == 2
    assert report.counts["log_start_offset_max"] > 0, "retention trimmed"
    assert report.gaps["trimmed"] > 0 and report.gaps["compacted"] == 0
    assert report.counts["records_in_log"] > 0, "the final log still holds the newest records"
    assert report.counts["group_acked_beyond_commit"] == 0


def test_membership_scenario_adds_and_removes_under_leader_kills_with_no_anomaly(tmp_path: Path) -> None:
    """One round: a fourth node joins and an old one leaves, each while the leader is killed; no anomaly,
    the three final members are read (the new one among them), and their stores are byte-identical."""
    report = run_scenario(SCENARIOS["membership"], RunSettings(tmp_path, rounds=1))
    print(render([report]))
    assert report.verdict == "PASS", report.reason
    assert [event.kind for event in report.faults] == ["add-node", "remove-node"]
    assert all(event.time_to_ack_s is not None for event in report.faults)
    assert report.counts["records_acknowledged"] > 0
    assert report.counts["nodes_read"] == 3, "the final members: the new node and two old ones"
    assert report.counts["stores_compared"] == 3, "every final member's store matched the others'"
    assert report.counts["group_acked_beyond_commit"] == 0
