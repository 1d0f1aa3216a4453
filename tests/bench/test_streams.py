"""The streams benchmark works: a --quick run measures every level and accounts for each stream."""

from __future__ import annotations

from pathlib import Path

import pytest

from kq.bench.streams import LEVELS_QUICK
from tests.bench.quick import run_quick

QUICK_RUN_TIMEOUT_S = 120.0  # A quick run takes about 10 s; this only bounds a hung cluster.


@pytest.mark.system
@pytest.mark.bench
def test_quick_run_measures_every_level(tmp_path: Path) -> None:
    """`python -m kq.bench.streams --quick`: latency at every level, admitted + refused == requested."""
    report, printed = run_quick("kq.bench.streams", tmp_path, QUICK_RUN_TIMEOUT_S)
    assert report["settings"]["levels"] == list(LEVELS_QUICK)
    assert [level["streams"] for level in report["levels"]] == list(LEVELS_QUICK)
    for level in report["levels"]:
        counts = level["counts"]
        assert level["sends"] > 0 and level["send_errors"] == 0
        assert level["producer_records_per_s"] > 0 and level["producer_errors"] == 0
        assert 0 < level["p50_ms"] <= level["p99_ms"]
        assert counts["requested"] == level["streams"]
        assert counts["admitted"] + counts["refused"] == counts["requested"], counts
        assert counts["failed"] == 0 and counts["refused"] == 0  # Far below the node's limits.
        assert counts["delivered_caught_up"] == counts["admitted"], counts
        assert sum(counts["admitted_by_node"].values()) == counts["admitted"]
        assert set(level["nodes"]) == set(level["probes"]) == {"1", "2", "3"}
        for node in level["nodes"].values():
            assert node["rss_kib_max"] > 0 and node["threads_max"] > 0
        for probe in level["probes"].values():
            assert probe["calls"] >= 2 and probe["failures"] == 0
    assert "| streams | admitted | refused |" in printed
