"""Without root, partition scenarios are skipped with the reason, and nothing is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from kq.chaos import netns
from kq.chaos.runner import RunSettings, run_scenario
from kq.chaos.scenarios import SCENARIOS

UNPRIVILEGED_UID = 1000


def test_partition_scenarios_are_skipped_without_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A non-root runner reports SKIPPED with "needs root" and creates no cluster directory."""
    monkeypatch.setattr("kq.chaos.netns.os.geteuid", lambda: UNPRIVILEGED_UID)
    assert netns.unavailable_reason() == "needs root (network namespaces)"
    report = run_scenario(SCENARIOS["partition-leader"], RunSettings(tmp_path))
    assert report.verdict == "SKIPPED"
    assert report.reason == "skipped: needs root (network namespaces)"
    assert not any(tmp_path.iterdir())
