"""`deploy/run-cluster.sh` end to end: real node processes on free ports, driven only through the script."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kq.client import AuthenticationError, Consumer, ConsumerRecord, KqClient, KqClientError, TlsConfig
from kq.deploy.cluster import address_in_use
from kq.deploy.processes import command_line, pid_alive
from kq.deploy.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "run-cluster.sh"
NODE_IDS = ("1", "2", "3")
ALL_NODE_IDS = ("1", "2", "3", "4")  # With the one `add` gives: every port and PID file a test may use.
SCRIPT_TIMEOUT_S = 120.0  # The script itself waits at most 60 s for a leader.
CONSUME_TIMEOUT_S = 30.0
STATUS_TIMEOUT_S = 30.0
PORT_ATTEMPTS_MAX = 200
REAP_TIMEOUT_S = 15.0
# Below Linux's ephemeral range (32768+), so outgoing connections do not take the ports meanwhile; one
# range per kind, so that no test (nor another copy of this one) uses the fixed defaults (9101.., 9092..).
GRPC_BASE_RANGE = (20_000, 23_000)
RAFT_BASE_RANGE = (23_000, 26_000)
KAFKA_BASE_RANGE = (26_000, 29_000)
HTTP_BASE_RANGE = (29_000, 32_000)


def free_base(low: int, high: int) -> int:
    """A port base in [low, high) whose base+1..base+4 are all free on 127.0.0.1 right now."""
    for _ in range(PORT_ATTEMPTS_MAX):
        base = random.randrange(low, high - len(ALL_NODE_IDS))
        if all(address_in_use(f"127.0.0.1:{base + int(node_id)}") is None for node_id in ALL_NODE_IDS):
            return base
    raise RuntimeError(f"no {len(ALL_NODE_IDS)} consecutive free ports in [{low}, {high})")


def _is_our_node(pid: int, run_dir: Path) -> bool:
    """Whether `pid` runs a node on this test's run directory (a reused PID is someone else's)."""
    return pid_alive(pid) and any(word.startswith(str(run_dir)) for word in command_line(pid))


@dataclass
class ScriptCluster:
    """Runs the script against one run directory and remembers every node PID it ever recorded."""

    run_dir: Path
    grpc_base: int
    raft_base: int
    kafka_base: int
    http_base: int
    seen_pids: set[int] = field(default_factory=set)

    @property
    def bootstrap(self) -> list[str]:
        return [self.grpc_address(node_id) for node_id in NODE_IDS]

    def grpc_address(self, node_id: str) -> str:
        return f"127.0.0.1:{self.grpc_base + int(node_id)}"

    def run(self, *arguments: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        environment = {key: value for key, value in os.environ.items() if not key.startswith("KQ_")}
        environment |= {
            "KQ_RUN_DIR": str(self.run_dir),
            "KQ_VENV": sys.prefix,  # The venv running these tests: the script must not reinstall.
            "KQ_BASE_GRPC_PORT": str(self.grpc_base),
            "KQ_BASE_RAFT_PORT": str(self.raft_base),
            "KQ_BASE_KAFKA_PORT": str(self.kafka_base),
            "KQ_BASE_HTTP_PORT": str(self.http_base),
        }
        result = subprocess.run(
            ["bash", str(SCRIPT), *arguments],
            env=environment,
            capture_output=True,
            text=True,
            timeout=SCRIPT_TIMEOUT_S,
            check=False,
        )
        self.pids()  # Remember what it started, for the teardown.
        if check:
            assert result.returncode == 0, (
                f"{arguments}: exit {result.returncode}\n{result.stdout}{result.stderr}"
            )
        return result

    def pids(self) -> dict[str, int]:
        """The PIDs recorded now, by node id."""
        recorded = {}
        for node_id in ALL_NODE_IDS:
            pid_file = self.run_dir / f"node{node_id}.pid"
            if pid_file.exists():
                recorded[node_id] = int(pid_file.read_text())
        self.seen_pids |= set(recorded.values())
        return recorded

    def status_rows(self) -> dict[str, str]:
        """`status`'s row of each node it lists, by node id, and its last line (the leader)."""
        lines = self.run("status").stdout.splitlines()
        rows = {line.split()[0]: line for line in lines if line[:1].isdigit()}
        rows["leader"] = lines[-1] if lines else ""
        return rows

    def wait_status(self, node_ids: set[str]) -> dict[str, str]:
        """Waits until `status` lists exactly `node_ids`, each running and ready, and a leader."""
        seen: dict[str, str] = {}

        def settled() -> bool:
            seen.clear()
            seen.update(self.status_rows())
            rows = {node: row for node, row in seen.items() if node != "leader"}
            return (
                set(rows) == node_ids
                and all("running" in row and row.endswith("yes") for row in rows.values())
                and seen["leader"].startswith("leader: node")
            )

        wait_for(
            settled,
            f"status to show nodes {sorted(node_ids)} ready",
            STATUS_TIMEOUT_S,
            last_state=lambda: repr(seen),
        )
        return seen

    def kill_leftovers(self) -> None:
        """SIGKILLs any node this test saw that still runs on its run directory, by PID."""
        for pid in self.seen_pids:
            if _is_our_node(pid, self.run_dir):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def script_cluster(tmp_path: Path) -> Iterator[ScriptCluster]:
    scripted = ScriptCluster(
        tmp_path / "run",
        free_base(*GRPC_BASE_RANGE),
        free_base(*RAFT_BASE_RANGE),
        free_base(*KAFKA_BASE_RANGE),
        free_base(*HTTP_BASE_RANGE),
    )
    try:
        yield scripted
    finally:
        try:
            scripted.run("stop", check=False)
        finally:
            scripted.kill_leftovers()


def consume(client: KqClient, topic: str, count: int, node: str | None = None) -> list[ConsumerRecord]:
    """The first `count` records of `topic` (from `node`, or any node), waiting with a deadline."""
    consumer = Consumer(client, topic, node=node)
    records: list[ConsumerRecord] = []
    deadline = time.monotonic() + CONSUME_TIMEOUT_S
    while len(records) < count and time.monotonic() < deadline:
        records += consumer.poll(timeout_ms=500)
    return records


@pytest.mark.system
def test_script_starts_serves_survives_kill_and_stops_everything(script_cluster: ScriptCluster) -> None:
    """The script starts a working cluster, starts it again idempotently, shows status and logs, survives
    kill/restart, and stops every node it started."""
    cluster = script_cluster
    started = cluster.run("start")
    for example in (
        "topics create demo --partitions 3",
        "produce demo hello world",
        "consume demo --from-beginning --max 2",
        "cluster status",
        "run-cluster.sh stop",
    ):
        assert example in started.stdout
    first_pids = cluster.pids()
    assert sorted(first_pids) == list(NODE_IDS)
    assert (cluster.run_dir / "secret").stat().st_mode & 0o777 == 0o600

    again = cluster.run("start")
    assert "already running" in again.stdout and "cluster is up" in again.stdout
    assert cluster.pids() == first_pids

    status = cluster.run("status").stdout
    assert status.count("running") == 3 and "leader: node" in status
    assert "starting node 2" in cluster.run("logs", "2", "--lines", "5").stdout

    with KqClient(cluster.bootstrap) as client:
        client.create_topic("demo", partitions=3)
        client.send("demo", b"hello")
        client.send("demo", b"world")
        assert sorted(r.value for r in consume(client, "demo", 2) if r.value) == [b"hello", b"world"]

        cluster.run("kill", "2")
        assert "2" not in cluster.pids() and not pid_alive(first_pids["2"])
        client.send("demo", b"during failover")

        cluster.run("restart", "2")
        restarted = cluster.pids()
        assert restarted["2"] != first_pids["2"] and pid_alive(restarted["2"])
        caught_up = consume(client, "demo", 3, node=cluster.grpc_address("2"))
        assert sorted(r.value for r in caught_up if r.value) == [b"during failover", b"hello", b"world"]

    stopped = cluster.run("stop")
    assert "no node is running" in stopped.stdout
    assert cluster.pids() == {}
    # A stopped node lingers as a zombie until init reaps it (this machine's init takes ~2 s): wait.
    wait_for(
        lambda: not any(_is_our_node(pid, cluster.run_dir) for pid in cluster.seen_pids),
        "every node process to be gone",
        REAP_TIMEOUT_S,
    )


@pytest.mark.system
def test_script_adds_and_removes_nodes_and_remembers_the_members(script_cluster: ScriptCluster) -> None:
    """`add` starts node 4 and makes it a voter that serves what was written through node 1; `remove 1`
    takes node 1 out and ends its process; `stop` then `start` brings back exactly nodes 2, 3 and 4."""
    cluster = script_cluster
    cluster.run("start")
    added = cluster.run("add").stdout
    assert "node 4 is a member and ready" in added and "remove 4" in added
    cluster.wait_status({"1", "2", "3", "4"})
    pids = cluster.pids()
    assert sorted(pids) == ["1", "2", "3", "4"]
    with KqClient([cluster.grpc_address("1")]) as through_one:
        through_one.create_topic("members", partitions=1)
        through_one.send("members", b"through node 1")
    with KqClient([cluster.grpc_address("4")]) as at_four:
        records = consume(at_four, "members", 1, node=cluster.grpc_address("4"))
        assert [record.value for record in records] == [b"through node 1"]
        peers = at_four.node_status(cluster.grpc_address("4")).peers
        assert {peer.node_id for peer in peers} == {"1", "2", "3"}

    removed = cluster.run("remove", "1").stdout
    assert f"removed node 1 from the voters and stopped its process (PID {pids['1']})" in removed
    assert "1" not in cluster.pids()
    wait_for(
        lambda: not _is_our_node(pids["1"], cluster.run_dir), "node 1's process to be gone", REAP_TIMEOUT_S
    )
    status = cluster.wait_status({"2", "3", "4"})
    assert "1" not in status
    assert cluster.run("restart", "1", check=False).returncode != 0, "a removed node is no member to restart"

    cluster.run("stop")
    assert cluster.pids() == {}
    started = cluster.run("start").stdout
    assert "started node(s) 2 3 4" in started and "cluster is up" in started
    assert sorted(cluster.pids()) == ["2", "3", "4"]
    cluster.wait_status({"2", "3", "4"})
    members = [cluster.grpc_address(node_id) for node_id in ("2", "3", "4")]
    with KqClient(members) as client:
        client.send("members", b"after the restart")
        records = consume(client, "members", 2, node=cluster.grpc_address("2"))
        assert [record.value for record in records] == [b"through node 1", b"after the restart"]
        peers = client.node_status(cluster.grpc_address("4")).peers
        assert {peer.node_id for peer in peers} == {"2", "3"}

    assert "no node is running" in cluster.run("stop").stdout
    assert cluster.pids() == {}


@pytest.mark.system
def test_secure_start_serves_mutual_tls_and_adds_a_node(script_cluster: ScriptCluster) -> None:
    """`start --secure` makes certificates once, starts the nodes on mutual TLS and prints kq commands
    that carry them (the admin certificate: a super-user, since authentication is on); a plain client
    is refused; `add` issues the new node's certificate; `status`
    and later commands find the certificates themselves."""
    cluster = script_cluster
    started = cluster.run("start", "--secure").stdout
    certs = cluster.run_dir / "certs"
    assert f"--tls-ca {certs / 'ca.pem'}" in started and "mutual TLS" in started
    tls = TlsConfig.from_files(certs / "ca.pem", certs / "admin.pem", certs / "admin-key.pem")
    with KqClient(cluster.bootstrap, tls=tls) as client:
        assert client.whoami() == ("User:admin", True)  # The admin certificate is a super-user.
        client.create_topic("secure", partitions=1)
        client.send("secure", b"over tls")
    kcat_line = next(line for line in started.splitlines() if line.strip().startswith("kcat "))
    if shutil.which("kcat") is not None:  # The printed kcat command lists the brokers over mutual TLS.
        listed = subprocess.run(kcat_line.split(), capture_output=True, text=True, timeout=30, check=False)
        assert listed.returncode == 0 and "3 brokers" in listed.stdout, listed.stderr
    with (
        KqClient(cluster.bootstrap, tls=tls, secret="not the secret") as forged,
        pytest.raises(AuthenticationError),
    ):
        forged.whoami()  # --auth is on: a wrong credential is refused (not taken as anonymous).
    with KqClient(cluster.bootstrap, retry_timeout_s=2.0) as plain, pytest.raises(KqClientError):
        plain.list_topics()
    added = cluster.run("add").stdout
    assert "node 4 is a member and ready" in added and (certs / "node-4.pem").exists()
    status = cluster.run("status").stdout
    assert status.count("running") == 4 and "leader: node" in status
    with KqClient([cluster.grpc_address("4")], tls=tls) as at_four:
        records = consume(at_four, "secure", 1, node=cluster.grpc_address("4"))
        assert [record.value for record in records] == [b"over tls"]
