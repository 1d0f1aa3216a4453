"""Membership changes on real nodes: add a fourth node (it catches up through a store copy), remove
the leader, restart a member with the new --peers, and the refusals an operator meets."""

from __future__ import annotations

from pathlib import Path

import pytest

from kq.client import KqClient, MembershipRefusedError, NodeStatus
from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for
from tests.system.checks import read_everywhere

WAIT_TIMEOUT_S = 60.0
RECORDS = 300


def _check_members(cluster: LocalCluster, cluster_id: str) -> None:
    """Every node of `cluster.nodes` answers, names the others as its peers, and reports `cluster_id`."""
    statuses: dict[str, NodeStatus | None] = cluster.statuses()
    assert set(statuses) == set(cluster.nodes)
    for node, status in statuses.items():
        assert status is not None, f"node {node} does not answer"
        assert {peer.node_id for peer in status.peers} == set(cluster.nodes) - {node}, node
        assert status.cluster_id == cluster_id, f"node {node} reports another cluster id"


def _restart_with_old_peers(cluster: LocalCluster, started_with: str) -> None:
    """A member restarted with the --peers it was started with still knows every member (from its Raft
    journal and snapshot), and the cluster commits with it."""
    follower = next(node for node in ("1", "2", "3") if node != cluster.wait_ready())
    cluster.stop_node(follower)
    cluster.set_node_args(follower, ("--peers", started_with))
    cluster.start_node(follower)
    cluster.wait_ready(WAIT_TIMEOUT_S)
    restarted = cluster.statuses()[follower]
    assert restarted is not None
    assert {peer.node_id for peer in restarted.peers} == set(cluster.nodes) - {follower}


def test_a_node_is_added_and_the_leader_removed_under_writes(tmp_path: Path) -> None:
    """A 4th node joins (a store copy: the leader's log was compacted), serves the same records and is
    named by every node, in Kafka's metadata too; removing the leader hands its leadership over; a
    restarted member with the new --peers rejoins; the cluster id never changes."""
    cluster = LocalCluster(tmp_path / "cluster", node_args=("--compaction-min-entries", "50"))
    try:
        leader = cluster.start()
        started_with = cluster.peers_argument()
        with KqClient(cluster.bootstrap) as client:
            cluster_id = client.node_status(cluster.bootstrap[0]).cluster_id
            client.create_topic("members", partitions=2)
            sent = [client.send("members", f"v{i}".encode(), partition=i % 2) for i in range(RECORDS)]
            leader_address = cluster.nodes[leader].grpc_address
            wait_for(
                lambda: client.node_status(leader_address).raft_log_entries < 200,
                "leader log compaction",
                WAIT_TIMEOUT_S,
            )

        new = cluster.add_node()
        assert new == "4"
        cluster.wait_applied(sent[-1].index, list(cluster.nodes), timeout_s=WAIT_TIMEOUT_S)
        assert set(cluster.nodes) == {"1", "2", "3", "4"}
        _check_members(cluster, cluster_id)
        log = cluster.log_path(new).read_text()
        assert "store restored from snapshot" in log, "the new node must have caught up through a store copy"
        with KqClient(cluster.bootstrap) as client:
            held = read_everywhere(client, "members", 2, cluster.bootstrap)
        assert all(sum(map(len, partitions.values())) == RECORDS for partitions in held.values())

        confluent_kafka = pytest.importorskip("confluent_kafka.admin")
        admin = confluent_kafka.AdminClient({"bootstrap.servers": cluster.nodes[new].kafka_address})
        brokers = admin.list_topics(timeout=10).brokers
        assert sorted(brokers) == [1, 2, 3, 4]

        _restart_with_old_peers(cluster, started_with)

        leader = cluster.wait_ready()
        with KqClient([cluster.nodes[new].grpc_address]) as client:
            members = client.remove_node(leader)  # Sent to node 4: redirected, then handed over.
        assert sorted(member.node_id for member in members) == sorted(set(cluster.nodes) - {leader})
        cluster.stop_node(leader)
        del cluster.nodes[leader]
        survivor = next(iter(cluster.nodes))
        cluster.stop_node(survivor)  # Restarted with --peers naming the members now.
        cluster.start_node(survivor)
        new_leader = cluster.wait_ready(WAIT_TIMEOUT_S)
        assert new_leader != leader
        with KqClient(cluster.bootstrap) as client:
            last = client.send("members", b"after", partition=0)
        cluster.wait_applied(last.index, list(cluster.nodes), timeout_s=WAIT_TIMEOUT_S)
        _check_members(cluster, cluster_id)
    finally:
        cluster.stop()


def test_changes_that_cannot_be_made_are_refused_and_change_nothing(tmp_path: Path) -> None:
    """A node that does not answer, a taken id, an unknown node, and a removal that would leave no
    majority running: MEMBERSHIP_REFUSED, and the voters stay as they were."""
    with LocalCluster(tmp_path / "cluster", kafka=False) as cluster, KqClient(cluster.bootstrap) as client:
        one = cluster.nodes["1"]
        with pytest.raises(MembershipRefusedError, match="does not answer"):
            client.add_node("4", "127.0.0.1:1", "127.0.0.1:2")
        with pytest.raises(MembershipRefusedError, match="a member already"):
            client.add_node("2", one.raft_address, one.grpc_address)
        with pytest.raises(MembershipRefusedError, match="not a member"):
            client.remove_node("7")
        cluster.stop_node("3")
        leader = cluster.wait_ready(node_ids=["1", "2"])
        other = "1" if leader == "2" else "2"
        with pytest.raises(MembershipRefusedError, match="no majority"):
            client.remove_node(other)
        status = client.node_status(cluster.nodes[leader].grpc_address)
        assert {peer.node_id for peer in status.peers} == {"1", "2", "3"} - {leader}
