"""Worker processes (`--processes`, broker/workers.py): a node runs one process per Raft group, each
group elects among the nodes' workers of that group, and a node's workers end with it (a stop, a
`kill -9` of the node's PID, or the death of any one worker): no replica outlives its node."""

from __future__ import annotations

import os
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kq.broker.workers import shifted, usable_cores
from kq.client import KqClient
from kq.deploy.cluster import LocalCluster, free_ports
from kq.deploy.processes import descendants
from kq.deploy.waiting import wait_for
from kq.proto.limits import PROCESSES_AUTO_MAX
from tests.system.groups import agreed_leaders, group_status

pytestmark = pytest.mark.system

PROCESSES = 3
WAIT_S = 30.0


def gone(pid: int) -> bool:
    """Whether `pid` ended (or is a zombie waiting to be reaped by whoever adopted it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


@pytest.fixture
def workers_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", processes=PROCESSES, kafka=False) as local:
        yield local


def test_each_group_elects_among_its_workers_and_workers_end_with_their_node(
    workers_cluster: LocalCluster,
) -> None:
    """Three nodes of three workers: three groups, each with one leader its three replicas agree on;
    each node's workers are its children and each serves its own group's metrics (`raft_group`);
    kill -9 of a node takes its workers, SIGTERM stops them, and a worker killed alone stops its node
    (exit 137, as a shell reports SIGKILL)."""
    cluster = workers_cluster
    nodes = list(cluster.nodes)
    leaders = wait_for(lambda: agreed_leaders(cluster, nodes), "every group's leader", WAIT_S)
    assert sorted(leaders) == list(range(PROCESSES))
    for node_id in nodes:
        for group in range(PROCESSES):
            status = group_status(cluster, node_id, group)
            assert status is not None and status.node_id == node_id
            assert status.grpc_address == shifted(cluster.nodes[node_id].grpc_address, group)
    workers = {node_id: set(descendants(cluster.pids()[node_id])) for node_id in nodes}
    assert all(len(pids) == PROCESSES for pids in workers.values()), workers
    for group in range(PROCESSES):  # Each worker's HTTP port reports its own group's Raft series.
        url = f"http://{shifted(cluster.nodes[nodes[0]].http_address, group)}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        assert f'kq_raft_term{{raft_group="{group}"}}' in text, group

    first, second, third = nodes
    cluster.kill_node(first)
    wait_for(lambda: all(gone(pid) for pid in workers[first]), "the killed node's workers gone", WAIT_S)
    wait_for(lambda: agreed_leaders(cluster, [second, third]), "leaders on the two left", WAIT_S)

    os.kill(min(workers[third]), signal.SIGKILL)
    wait_for(lambda: not cluster.running(third), "the node of a killed worker ended", WAIT_S)
    assert cluster.exit_code(third) == 128 + signal.SIGKILL
    assert all(gone(pid) for pid in workers[third])

    cluster.signal_node(second, signal.SIGTERM)
    wait_for(lambda: not cluster.running(second), "the node stopped by SIGTERM", WAIT_S)
    assert cluster.exit_code(second) == 0
    assert all(gone(pid) for pid in workers[second])


def test_a_single_group_cluster_restarted_with_workers_keeps_its_topics_in_place(tmp_path: Path) -> None:
    """Three nodes of one group hold a topic and a group's offsets; restarted with --processes 3,
    the old topic stays in group 0 (its partitions all there: created with one group), every record
    reads back from every node at its offset and new records follow on; a new topic spreads over the
    three groups; the group's offsets are kept. Restarted with fewer processes, a node refuses in
    one line (its groups hold partitions)."""
    ports = [free_ports(3, PROCESSES) for _ in range(4)]
    cluster = LocalCluster(
        tmp_path / "cluster",
        grpc_ports=ports[0],
        raft_ports=ports[1],
        kafka_ports=ports[2],
        http_ports=ports[3],
    )
    try:
        cluster.start()
        with KqClient(cluster.bootstrap) as client:
            client.create_topic("old", partitions=6)
            sent = [client.send("old", f"o{i}".encode(), partition=i % 6) for i in range(60)]
            client.commit_offsets("g", {("old", p): 5 for p in range(6)})
        cluster.stop()
        cluster.node_args = (*cluster.node_args, "--processes", str(PROCESSES))
        cluster.start()
        nodes = list(cluster.nodes)
        wait_for(lambda: agreed_leaders(cluster, nodes), "every group's leader", WAIT_S)
        with KqClient(cluster.bootstrap) as client:
            assert [client.partition_group("old", p) for p in range(6)] == [0] * 6
            for node in cluster.bootstrap:
                for partition in range(6):
                    fetched = client.fetch("old", partition, 0, node=node, wait_ms=5_000)
                    assert [(r.offset, r.value) for r in fetched.records] == [
                        (m.offset, f"o{i}".encode()) for i, m in enumerate(sent) if m.partition == partition
                    ]
            assert client.send("old", b"later", partition=0).offset == 10
            assert client.committed_offsets("g") == {("old", p): 5 for p in range(6)}
            client.create_topic("new", partitions=6)
            assert {client.partition_group("new", p) for p in range(6)} == set(range(PROCESSES))
            assert all(client.send("new", b"v", partition=p).offset == 0 for p in range(6))
        cluster.stop()
        first = nodes[0]
        cluster.set_node_args(first, ("--processes", "1"))
        cluster.start_node(first)
        wait_for(lambda: not cluster.running(first), "the node that refuses to start", WAIT_S)
        assert cluster.exit_code(first) == 2
        assert "holds 3 Raft groups: start it with --processes 3" in cluster.log_path(first).read_text()
    finally:
        cluster.stop()


def test_auto_runs_a_worker_per_usable_core_and_keeps_the_count_it_recorded(tmp_path: Path) -> None:
    """`--processes auto` (kq-node's default) on a new data directory: as many workers as the cores
    this machine lets the node use (at most PROCESSES_AUTO_MAX), each reporting that many groups; the
    node restarted with auto runs the count its directory recorded."""
    expected = min(usable_cores(), PROCESSES_AUTO_MAX)
    cluster = LocalCluster(tmp_path / "cluster", size=1, processes=expected, kafka=False)  # Its ports.
    node = next(iter(cluster.nodes))
    cluster.set_node_args(node, ("--processes", "auto"))  # The flag wins over KQ_PROCESSES.
    try:
        for _ in range(2):  # A new data directory, then the same one restarted.
            cluster.start_node(node)
            wait_for(lambda: agreed_leaders(cluster, [node]), "every group's leader", WAIT_S)
            status = group_status(cluster, node, 0)
            assert status is not None and status.groups == expected
            assert len(descendants(cluster.pids()[node])) == (expected if expected > 1 else 0)
            cluster.stop_node(node)
    finally:
        cluster.stop()
