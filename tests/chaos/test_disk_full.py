"""The disk-full chaos scenario's first round in the default suite: a follower's disk (a tmpfs as root,
so a real ENOSPC; else its LMDB map) fills under load; it stops with its one line, the majority writes
on, it catches up, and the checker finds nothing acknowledged lost or duplicated. (The map round is
what tests/system/test_disk_full.py checks byte for byte; `chaos/disk-full.sh` runs both.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kq.chaos.disk_full import fail_stop_problem
from kq.chaos.report import render
from kq.chaos.runner import RunSettings, run_scenario
from kq.chaos.scenarios import SCENARIOS

pytestmark = pytest.mark.system


def test_a_follower_whose_disk_fills_under_load_stops_and_catches_up_with_no_anomaly(tmp_path: Path) -> None:
    """One round: one fail-stop, zero anomalies, and writes acknowledged throughout."""
    full = SCENARIOS["disk-full"]
    report = run_scenario(dataclasses.replace(full, steps=full.steps[:1]), RunSettings(tmp_path))
    print(render([report]))  # Shown by pytest on failure: the verdict table and the anomalies.
    assert report.verdict == "PASS", report.reason
    assert [event.kind for event in report.faults] in (["follower-tmpfs-full"], ["follower-map-full"])
    assert all(event.time_to_ack_s is not None for event in report.faults)
    assert report.counts["records_acknowledged"] > 0 and report.counts["nodes_read"] == 3


def test_a_fail_stop_is_one_line_saying_what_is_full_and_exit_70() -> None:
    """The scenario's own check of how a node stopped: each way of getting it wrong is caught."""
    line = "2026-01-01 CRITICAL node=2 kq.raft.faults: stopping: the store is full: entry 9 does not fit"
    assert fail_stop_problem(f"INFO started\n{line}\n", 70) is None
    assert fail_stop_problem(f"{line}\n", 1) is not None  # Another exit status.
    assert fail_stop_problem(f"{line}\n{line}\n", 70) is not None  # Two lines.
    workers = [line.replace("node=2 ", f"node=2/{group} ") for group in range(3)]
    assert all("node=2/" in worker for worker in workers), line
    assert fail_stop_problem(f"{workers[1]}\n", 70) is None  # The worker that took the token.
    assert fail_stop_problem("\n".join(workers) + "\n", 70) is not None  # One a worker: too many.
    assert fail_stop_problem("stopping: cannot apply entry 9: NewerCommandError: v2\n", 70) is not None
    assert fail_stop_problem(f"{line}\nTraceback (most recent call last):\n", 70) is not None
    assert fail_stop_problem("INFO nothing\n", 70) is not None  # No line at all.
