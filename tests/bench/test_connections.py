"""The connections benchmark works: a --quick run holds every level's connections and measures the node."""

from __future__ import annotations

from pathlib import Path

import pytest

from kq.bench.connections import LEVELS_QUICK
from tests.bench.quick import run_quick

QUICK_RUN_TIMEOUT_S = 120.0  # A quick run takes about 15 s; this only bounds a hung cluster.


@pytest.mark.system
@pytest.mark.bench
def test_quick_run_holds_every_connection(tmp_path: Path) -> None:
    """`python -m kq.bench.connections --quick`: every connection held and rechecked, the node answers."""
    report, printed = run_quick("kq.bench.connections", tmp_path, QUICK_RUN_TIMEOUT_S)
    assert report["settings"]["levels"] == list(LEVELS_QUICK)
    assert [level["connections"] for level in report["levels"]] == list(LEVELS_QUICK)
    assert report["node_open_files_limit"] > max(LEVELS_QUICK)
    for level in report["levels"]:
        count = level["connections"]
        assert level["held"] == count and level["open"]["failed"] == {}
        assert level["recheck"] == {**level["recheck"], "ready": count, "answered": count, "failed": {}}
        # One descriptor per client connection on each side, beyond the processes' own files.
        assert level["node"]["fds"] >= count and level["client"]["fds"] >= count
        assert level["node"]["rss_kib"] > 0 and level["node"]["threads"] > 0
        assert level["sends"] > 0 and level["send_errors"] == 0
        assert 0 < level["p50_ms"] <= level["p99_ms"]
        assert set(level["probes"]) == {"ListTopics", "ClusterStatus"}
        for probe in level["probes"].values():
            assert probe["calls"] >= 2 and probe["failures"] == 0
    assert "| connections | held |" in printed
