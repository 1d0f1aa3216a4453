"""RaftNode's membership: PySyncObj's dynamic voters as kq drives them (a joining node, add, remove,
the voters' publication) on real nodes in this process, and PySyncObj's admin messages refused."""

from __future__ import annotations

import threading
from pathlib import Path

from pysyncobj import FAIL_REASON
from pysyncobj.monotonic import monotonic as pysyncobj_clock

from kq.deploy.cluster import free_ports
from kq.deploy.waiting import wait_for
from kq.raft import commands
from kq.raft.node import RaftConfig, RaftNode
from kq.raft.results import ApplyResult
from kq.storage import Store
from tests.raft.test_node import WAIT_S, Cluster

# The MEMBERSHIP entry commits within a few heartbeats; a new node's catch-up takes a little longer.
CHANGE_WAIT_S = 20.0


def _change(node: RaftNode, kind: str, address: str) -> int:
    """Proposes a membership change on `node` and waits for its outcome (0: committed)."""
    done = threading.Event()
    reasons: list[int] = []

    def on_result(_result: ApplyResult | None, reason: int) -> None:
        reasons.append(reason)
        done.set()

    node.change_membership(kind, address, on_result)
    assert done.wait(CHANGE_WAIT_S), f"{kind} {address} never answered"
    return reasons[0]


def test_a_joining_node_is_added_catches_up_and_a_member_is_removed(tmp_path: Path) -> None:
    """Three voters and a fourth node started with join: once added it holds every entry and every node
    publishes four voters; removing another member leaves three that still commit."""
    cluster = Cluster(tmp_path)
    address = f"127.0.0.1:{free_ports(1)[0]}"
    config = RaftConfig(address, tuple(cluster.addresses), tmp_path / "node3", "secret", join=True)
    store = Store.open(config.data_dir / "store", map_size_bytes=256 * 1024**2)
    joining = RaftNode(config, store, lambda index, result: None)
    changes: list[frozenset[str]] = []
    joining.on_voters_changed(changes.append)
    try:
        for node in (*cluster.nodes, joining):
            node.start()
        before = cluster.propose(commands.encode(commands.create_topic("t", 1, 1)))
        leader = cluster.leader()
        assert _change(leader, "add", address) == 0
        after = cluster.propose(commands.encode(commands.create_topic("u", 1, 1)))
        assert after > before
        wait_for(lambda: store.applied_index() >= after, "the new node to catch up", CHANGE_WAIT_S)
        everyone = frozenset((*cluster.addresses, address))
        for node in (*cluster.nodes, joining):
            wait_for(lambda node=node: node.voters() == everyone, "four voters everywhere", WAIT_S)  # type: ignore[misc]
        leaving = next(node for node in cluster.nodes if node is not leader)
        leaving_address = cluster.addresses[cluster.nodes.index(leaving)]
        assert _change(leader, "remove", leaving_address) == 0
        for node in (leader, joining):
            wait_for(
                lambda node=node: node.voters() == everyone - {leaving_address},  # type: ignore[misc]
                "three voters",
                WAIT_S,
            )
        assert cluster.propose(commands.encode(commands.create_topic("v", 1, 1))) > after
        assert changes, "the joining node published no voter change"
    finally:
        joining.close()
        store.close()
        cluster.close()


def test_pysyncobjs_admin_membership_messages_are_refused(tmp_path: Path) -> None:
    """`syncobj_admin -add/-remove` reach these handlers: refused, so only AddNode/RemoveNode (which
    check the address and register the node) change the voters."""
    cluster = Cluster(tmp_path)
    try:
        answers: list[int] = []
        node = cluster.nodes[0]
        node._addNodeToCluster(["127.0.0.1:1"], lambda result, reason: answers.append(reason))
        node._removeNodeFromCluster([cluster.addresses[1]], lambda result, reason: answers.append(reason))
        assert answers == [FAIL_REASON.REQUEST_DENIED, FAIL_REASON.REQUEST_DENIED]
        assert node.voters() == frozenset(cluster.addresses)
    finally:
        cluster.close()


def test_a_joining_node_defers_its_election_until_a_leader_contacts_it(tmp_path: Path) -> None:
    """While joining, each tick puts the election deadline an election timeout away; an AppendEntries
    from a leader ends that. Measured on PySyncObj's own clock (CLOCK_MONOTONIC_RAW), which drifts
    from time.monotonic's (0.14 s apart was seen here): no wall-clock margin, so no flakiness."""
    address, peer = (f"127.0.0.1:{port}" for port in free_ports(2))
    config = RaftConfig(address, (peer,), tmp_path / "node", "secret", join=True)
    store = Store.open(config.data_dir / "store", map_size_bytes=64 * 1024**2)
    node = RaftNode(config, store, lambda index, result: None)
    try:
        before = pysyncobj_clock()
        node._tick_housekeeping()
        assert node._SyncObj__raftElectionDeadline >= before + config.election_timeout_max_s
        node.peer_message(None, {"type": "append_entries", "term": 1})
        assert not node._joining
    finally:
        node.close()
        store.close()
