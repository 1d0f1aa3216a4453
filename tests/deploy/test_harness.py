"""The harness's pure parts and its process table: the one leader definition, the one wait, PIDs."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from kq.client import NodeStatus
from kq.deploy.cluster import LocalCluster, agreed_leader
from kq.deploy.processes import ProcessTable, pid_alive
from kq.deploy.waiting import WaitTimeoutError, holds_within, wait_for

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)", "--marker", "kq-harness-test"]


def status(node_id: str, role: str, leader_id: str, term: int) -> NodeStatus:
    """A node's ClusterStatus with only what the leader definition reads."""
    return NodeStatus(f"127.0.0.1:{node_id}", node_id, role, leader_id, "", term, 0, 0, True, 0)


def test_the_leader_is_the_one_a_majority_follows_in_its_term() -> None:
    """A cut-off old leader still says "leader", but only the new one has a majority in its own term."""
    statuses = {
        "1": status("1", "leader", "1", 3),  # Deposed, has not heard of term 4 yet.
        "2": status("2", "leader", "2", 4),
        "3": status("3", "follower", "2", 4),
    }
    assert agreed_leader(statuses, 3) == "2"
    stale_followers = {**statuses, "3": status("3", "follower", "2", 3)}  # Names 2 but in an old term.
    assert agreed_leader(stale_followers, 3) is None
    assert agreed_leader({"1": status("1", "leader", "1", 1), "2": None, "3": None}, 3) is None
    assert agreed_leader({"1": status("1", "leader", "1", 1)}, 1) == "1"


def test_wait_for_returns_the_value_or_names_what_it_waited_for() -> None:
    """The condition's first truthy value is returned; a timeout names the wait and the last state."""
    calls = iter([None, None, "3"])
    assert wait_for(lambda: next(calls), "a leader", 5.0, poll_s=0.001) == "3"
    with pytest.raises(WaitTimeoutError, match=r"waiting for node 9 to apply index 7; last: applied 5"):
        wait_for(lambda: False, "node 9 to apply index 7", 0.01, poll_s=0.001, last_state=lambda: "applied 5")
    assert not holds_within(lambda: False, 0.01, poll_s=0.001)


def test_process_table_adopts_only_a_live_pid_whose_command_line_matches(tmp_path: Path) -> None:
    """A PID file is taken over only while that process runs with the marker words; stop ends it by PID."""
    started = ProcessTable(tmp_path, pid_prefix="node")
    pid = started.start("1", SLEEPER, tmp_path / "node1.log")
    try:
        assert (tmp_path / "node1.pid").read_text().strip() == str(pid)
        assert ProcessTable(tmp_path, pid_prefix="node").adopt("1", ["--marker", "other"]) is None
        assert not (tmp_path / "node1.pid").exists(), "a PID file naming another program is removed"
        (tmp_path / "node1.pid").write_text(f"{pid}\n")
        adopted = ProcessTable(tmp_path, pid_prefix="node")
        assert adopted.adopt("1", ["--marker", "kq-harness-test"]) == pid
        adopted.stop(["1"], timeout_s=5.0)
        assert not (tmp_path / "node1.pid").exists()
        assert wait_for(lambda: not started.running("1"), "the child to be reaped", 5.0)
        assert started.exited() == ["1"] and started.exit_code("1") == -15
    finally:
        started.stop(started.names(), timeout_s=1.0)
    assert not pid_alive(pid)


def test_a_paused_process_is_still_stopped(tmp_path: Path) -> None:
    """SIGSTOP'd (as chaos pauses a leader), a process still ends on stop: it is continued first."""
    table = ProcessTable()
    pid = table.start("1", SLEEPER, tmp_path / "sleeper.log")
    table.signal("1", signal.SIGSTOP)
    began = time.monotonic()
    table.stop(["1"], timeout_s=5.0)
    assert not pid_alive(pid) and time.monotonic() - began < 5.0


def test_one_node_gets_a_command_of_its_own_and_keeps_its_arguments(tmp_path: Path) -> None:
    """set_node_command (a rolling upgrade) changes that node's command alone, not its arguments."""
    cluster = LocalCluster(tmp_path, node_command=["old/kq-node"], kafka=False)
    before = cluster.node_command_line("2")
    cluster.set_node_command("2", ["new/python", "-m", "kq.broker"])
    assert cluster.node_command_line("2") == ["new/python", "-m", "kq.broker", *before[1:]]
    assert cluster.node_command_line("1")[0] == "old/kq-node"
    with pytest.raises(AssertionError, match="no node 9"):
        cluster.set_node_command("9", ["new/kq-node"])
