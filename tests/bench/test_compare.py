"""The kq-vs-NATS harness: failover analysis, medians and ratios of the table, a --quick run (not speed)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kq.bench import side_by_side
from kq.bench.compare_report import FIGURES, build_document, markdown
from kq.bench.failover import analyze
from kq.bench.nats_cluster import NatsServerMissingError, find_nats_server
from kq.bench.produce_fetch import LatencySample
from kq.bench.side_by_side import (
    CONSUME,
    FAILOVER,
    FULL_COUNTS,
    LATENCY,
    PRODUCE_LARGE,
    PRODUCE_LARGE_THREADS,
    PRODUCE_SMALL,
    PRODUCE_SMALL_THREADS,
    SCENARIOS,
    CompareSettings,
)
from tests.bench.quick import report_meta
from tests.bench.test_compare_kafka import check_quick_kq_kafka

REPO = Path(__file__).resolve().parents[2]
QUICK_RUN_TIMEOUT_S = 300.0  # A quick run takes about half a minute; this only bounds a hung cluster.


def test_each_measured_run_starts_after_the_machines_dirty_pages_are_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """sync(2) before the servers' CPU is first read: the kernel's writeback of what earlier runs wrote
    does not fall inside the next run."""
    events: list[str] = []
    monkeypatch.setattr(os, "sync", lambda: events.append("sync"))

    class OneServer:
        name = "fake"

        def server_pids(self) -> dict[str, int]:
            events.append("pids")
            return {"server": os.getpid()}

        def latency(self, sends: int) -> LatencySample:
            events.append("latency")
            return LatencySample((1.0,) * sends, 0, 0.1)

    settings = CompareSettings(counts=FULL_COUNTS)
    record = side_by_side._measured_run(OneServer(), LATENCY, 1, settings)  # type: ignore[arg-type]
    assert events[:3] == ["sync", "pids", "latency"]
    assert record["scenario"] == LATENCY and set(record["server_cpu_s"]) == {"server"}


def test_failover_gap_counts_only_writes_sent_after_the_leader_is_gone() -> None:
    """Acks on their way at the kill, or for writes sent before the process ended, are not recovery."""
    killed_at, dead_at = 10.0, 10.005
    acks = [(9.0, 9.5), (9.5, 9.99), (9.99, 10.01), (10.002, 10.004), (12.0, 12.5), (12.5, 12.6)]
    sample = analyze("n1", acks, killed_at, dead_at, ended_at=13.0, errors=7)
    assert sample.gap_s == pytest.approx(2.5)  # The write sent at 12.0, counted from the signal.
    assert sample.longest_pause_s == pytest.approx(12.5 - 10.01)
    assert (sample.acks_before_kill, sample.acks_after_kill, sample.errors) == (2, 4, 7)
    assert sample.window_s == pytest.approx(3.0)


def test_failover_without_recovery_has_no_gap_and_pauses_to_the_end() -> None:
    """No write sent after the kill was acknowledged: no gap, and the pause runs to the window's end."""
    sample = analyze("3", [(9.0, 9.8)], killed_at=10.0, dead_at=10.01, ended_at=40.0, errors=100)
    assert sample.gap_s is None
    assert sample.longest_pause_s == pytest.approx(40.0 - 9.8)


def _run(scenario: str, sample: dict[str, Any], server_cpu_s: float, run: int = 1) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "run": run,
        "sample": sample,
        "server_cpu_s": {"a": server_cpu_s / 2, "b": server_cpu_s / 2},
        "client_cpu_s": 0.5,
        "wall_s": 2.0,
        "host_cpu_busy": 0.5,
        "host_cpu_s": 2.0,
    }


def _raw(system: str, rate: float, gaps: list[float | None]) -> dict[str, Any]:
    """Synthetic runs: every throughput scenario moves `rate` msgs/s; one failover run per gap."""
    throughput = {"records": int(rate), "payload_bytes": int(rate) * 100, "requests": 10, "errors": 0}
    produce = [PRODUCE_SMALL, PRODUCE_LARGE, CONSUME]
    if system == "kq":
        produce += [PRODUCE_SMALL_THREADS, PRODUCE_LARGE_THREADS]
    runs = [
        _run(LATENCY, {"latencies_ms": [1.0, 2.0, 3.0], "errors": 0, "elapsed_s": 0.006}, 0.01),
        *(_run(s, {**throughput, "elapsed_s": 1.0}, 1.0) for s in produce),
    ]
    for number, gap in enumerate(gaps, 1):
        failover = {
            "killed": "x",
            "gap_s": gap,
            "longest_pause_s": gap or 30.0,
            "acks_before_kill": 10,
            "acks_after_kill": 10,
            "errors": 0,
            "window_s": 30.0,
        }
        runs.append(_run(FAILOVER, failover, 0.1, number))
    return {"system": system, "describe": {"client": system}, "runs": runs}


def test_table_has_medians_ratios_and_targets() -> None:
    """Figures are medians over runs; the ratio is kq over NATS; a run that never recovered is flagged."""
    raws = {"kq": _raw("kq", 50_000.0, [1.0, 3.0, None]), "nats": _raw("nats", 100_000.0, [5.0, 6.0, 7.0])}
    meta = report_meta(command="python -m kq.bench.compare")
    document = build_document(meta, {"runs": 3}, raws)
    rows = {row["key"]: row for row in document["figures"]}

    assert set(rows) == {figure.key for figure in FIGURES}
    assert rows["produce_100b_msgs_per_s"]["kq"]["median"] == pytest.approx(50_000.0)
    assert rows["produce_100b_msgs_per_s"]["ratio"] == pytest.approx(0.5)
    assert rows["latency_p50_ms"]["kq"]["median"] == 2.0
    assert rows["failover_gap_s"]["kq"]["median"] == pytest.approx(3.0)  # Median of 1, 3 and ≥ 30.
    assert rows["failover_gap_s"]["kq"]["missing_runs"] == 1
    assert rows["failover_gap_s"]["ratio"] == pytest.approx(0.5)
    met = {target["target"]: target["met"] for target in document["targets"]}
    assert met["failover gap ≤ NATS's"] is True
    assert met["one-in-flight p50 ≤ 1.0 ms"] is False  # The median is 2.0 ms.
    assert met["one in flight msgs/s ≥ 0.8x NATS"] is True  # The same latencies on both sides.
    assert met["server CPU/msg, one in flight ≤ 1.5x NATS"] is True
    # Half NATS's rate on every throughput scenario, for the same CPU: both targets missed.
    assert all(value is False for name, value in met.items() if "produce" in name or "consume" in name)
    assert len([name for name in met if "server CPU" in name]) == 4
    text = markdown(document)
    assert all(figure.label in text for figure in FIGURES)
    assert "never recovered" in text


def _nats_unavailable() -> str | None:
    try:
        find_nats_server()
    except NatsServerMissingError as error:
        return str(error)
    if importlib.util.find_spec("nats") is None:
        return "the NATS Python client (nats-py) is not installed: pip install -e '.[bench]'"
    return None


@pytest.mark.system
@pytest.mark.bench
def test_quick_comparison_reports_every_figure_for_both_systems(tmp_path: Path) -> None:
    """`python -m kq.bench.compare --quick` runs every system (kq, kq-kafka, NATS) and writes JSON with
    every figure of each."""
    reason = _nats_unavailable()
    if reason is not None:
        pytest.skip(reason)
    output = tmp_path / "compare.json"
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            "kq.bench.compare",
            "--quick",
            "--output",
            str(output),
            "--base-dir",
            str(tmp_path / "servers"),
        ],
        cwd=REPO,
        check=False,
        timeout=QUICK_RUN_TIMEOUT_S,
        capture_output=True,
        text=True,
    )
    assert finished.returncode == 0, f"exit {finished.returncode}; its log ends:\n{finished.stderr[-4000:]}"
    document = json.loads(output.read_text())

    for system in ("kq", "nats"):
        runs = document["systems"][system]["runs"]
        assert {run["scenario"] for run in runs} >= set(SCENARIOS)
        assert all(run["server_cpu_s"] for run in runs)
    for row in document["figures"]:
        for system in ("kq", "nats"):
            assert row[system]["median"] >= 0, (row["key"], system)
        assert row["ratio"] is not None or row["nats"]["median"] == 0, row["key"]
    rows = {row["key"]: row for row in document["figures"]}
    for key in ("produce_100b_msgs_per_s", "produce_1kib_msgs_per_s", "consume_msgs_per_s"):
        assert rows[key]["kq"]["median"] > 0 and rows[key]["nats"]["median"] > 0
    assert len(document["targets"]) == 12  # Issue 17's acceptance, one target a row.
    assert output.with_suffix(".md").read_text().startswith("# kq vs NATS JetStream")
    if importlib.util.find_spec("confluent_kafka") is not None:  # The default systems include kq-kafka.
        check_quick_kq_kafka(document)
