"""`kq.bench.scale`: the process-tree CPU it reads, its medians and problem lines, and its smallest shape
run end to end against a real cluster (every delivered record stored and read back, every node's CPU
seen, the JSON holding what the table prints, every process it started ended)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest

from kq.bench import procfs
from kq.bench.scale import parse_counts
from kq.bench.scale_report import node_order, problems, summarize, table
from kq.deploy.processes import command_line, pid_alive
from tests.bench.quick import run_quick

SCALE_RUN_TIMEOUT_S = 180.0  # About 15 s: a cluster start, 1 s warm-up, 2 s window, the read-back.
BURN = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"


def test_tree_cpu_counts_children_alive_and_ended() -> None:
    """A live child is in the tree; once it ended and was reaped, its CPU moves into the parent's
    cutime, so a tree's reading keeps it (the difference of two readings stays the tree's CPU)."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert child.pid in procfs.process_tree(os.getpid())
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)
    before = procfs.tree_cpu_seconds(os.getpid()) - procfs.cpu_seconds(os.getpid())
    subprocess.run([sys.executable, "-c", BURN], check=True, timeout=60)
    after = procfs.tree_cpu_seconds(os.getpid()) - procfs.cpu_seconds(os.getpid())
    assert after - before >= 0.2  # The burner's 0.3 s of CPU, in 10 ms ticks.


def _record(run: int, leader: str, rate: float, cores: dict[str, float], **produce: Any) -> dict[str, Any]:
    """A level record as `measure_level` writes it, with the fields the report reads."""
    return {
        "run": run,
        "size": 100,
        "level": 2,
        "leader": leader,
        "produce": {
            "msgs_per_s": rate,
            "mb_per_s": rate * 100 / 1e6,
            "node_cores": cores,
            "client_cores": 1.0,
            "host_busy": 0.5,
            "failed": 0,
            "undelivered": 0,
            "first_error": "",
            "delivered": 10,
            "stored": 10,
            **produce,
        },
    }


def test_rows_give_medians_with_the_leader_first_whichever_node_led() -> None:
    """Node cores are taken by position (leader, then the others by id), so fresh clusters whose
    leaders differ still line up; msgs/s is the median with its range."""
    records = [
        _record(1, "2", 100.0, {"1": 0.4, "2": 1.0, "3": 0.5}),
        _record(2, "1", 300.0, {"1": 1.2, "2": 0.6, "3": 0.4}),
        _record(3, "3", 200.0, {"1": 0.3, "2": 0.3, "3": 0.8}),
    ]
    [row] = summarize(records)
    assert (row["msgs_per_s"], row["msgs_per_s_min"], row["msgs_per_s_max"]) == (200.0, 100.0, 300.0)
    assert row["node_cores"] == pytest.approx([1.0, 0.4, 0.4])  # Medians of (1.0, 1.2, 0.8), ...
    assert node_order({"10": 0.0, "2": 0.0, "1": 0.0}, "2") == ["2", "1", "10"]
    assert row["consumer_msgs_per_s"] is None and row["problems"] == []
    lines = table([row]).splitlines()
    assert lines[2].startswith("| 2 | 200 (100..300) | 0.0 | - | - | - | 1.00* 0.40 0.40 | - | 1.00 | 50% |")


def test_a_level_whose_records_do_not_add_up_says_so() -> None:
    """Failed deliveries, a topic holding other than what was delivered, a leader that moved during a
    phase, an unfinished read-back."""
    record = _record(1, "1", 1.0, {"1": 1.0}, failed=2, first_error="timed out", delivered=8, stored=9)
    record["produce"] |= {"leader": "1", "leader_after": "3"}
    record["consume"] = {
        **{"errors": 0, "first_error": "", "complete": False, "records": 5},
        **{"consumers": 1, "msgs_per_s": 5.0, "mb_per_s": 0.0, "node_cores": {"1": 0.1}},
    }
    found = problems(record)
    assert found == [
        "2 delivery reports with an error (first: timed out)",
        "8 records delivered, but the topic holds 9",
        "the leader moved from node 1 to node 3 while producing (its CPU is split between them)",
        "consumers read 5 of 9 records in time",
    ]
    assert table(summarize([record])).endswith("level 2, run 1: consumers read 5 of 9 records in time")


def test_counts_are_parsed_in_order_and_bounded() -> None:
    assert parse_counts("1,2,4,2", 1, 64, "--levels") == (1, 2, 4)
    for wrong in ("", "0", "65", "1,x"):
        with pytest.raises(click.BadParameter):
            parse_counts(wrong, 1, 64, "--levels")


@pytest.mark.system
@pytest.mark.bench
def test_smallest_run_counts_every_delivered_record_and_every_node(tmp_path: Path) -> None:
    """`--quick` (one producer, 100 B, 4 partitions, 2 s) on a real cluster: records delivered in the
    window, every delivered record stored once and read back, CPU seen on every node, the printed
    table the JSON's, and no process of the run left running."""
    report, printed = run_quick("kq.bench.scale", tmp_path, SCALE_RUN_TIMEOUT_S)
    assert report["complete"] is True
    [record] = report["levels"]
    produce, consume = record["produce"], record["consume"]
    assert produce["window_delivered"] > 0 and produce["msgs_per_s"] > 0 and produce["mb_per_s"] > 0
    assert produce["failed"] == produce["undelivered"] == 0
    assert produce["delivered"] == produce["stored"] == consume["records"]  # Each one once, none lost.
    assert produce["delivered"] >= produce["window_delivered"] + 1  # The window and the warm-up.
    assert consume["complete"] and consume["msgs_per_s"] > 0
    assert set(produce["node_cores"]) == set(record["node_pids"]) == {"1", "2", "3"}
    assert all(cores > 0 for cores in produce["node_cores"].values())
    assert produce["client_cores"] > 0 and produce["leader"] == record["leader"] in record["node_pids"]
    [row] = report["summary"]
    assert row["problems"] == [] and row["msgs_per_s"] == produce["msgs_per_s"]
    assert report["tables"]["100"] in printed
    assert f"| 1 | {row['msgs_per_s']:,.0f} | {row['mb_per_s']:,.1f} | 1 |" in printed
    started = [*record["node_pids"].values(), *produce["pids"], *consume["pids"]]
    assert not [pid for pid in started if pid_alive(pid) and "kq" in " ".join(command_line(pid))]
