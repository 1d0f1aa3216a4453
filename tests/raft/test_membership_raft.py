"""RaftNode's membership: PySyncObj's dynamic voters as kq drives them (a joining node, add, remove,
the voters' publication) on real nodes in this process, and PySyncObj's admin messages refused."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest
from pysyncobj import FAIL_REASON
from pysyncobj.monotonic import monotonic as pysyncobj_clock

from kq.deploy.cluster import free_ports
from kq.deploy.waiting import wait_for
from kq.raft import commands
from kq.raft.node import RaftConfig, RaftNode
from kq.raft.pysyncobj_adapter import NO_OP_COMMAND, membership_command
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


def _address_beside(addresses: list[str], above: bool) -> tuple[str, str]:
    """A free address for a new node and a member's address below it (`above`) or above it."""
    for port in free_ports(20):
        new = f"127.0.0.1:{port}"
        stale = [address for address in addresses if (address < new) == above]
        if stale:
            return new, stale[0]
    raise AssertionError("no free port on the wanted side")


def _leader_of(nodes: list[RaftNode]) -> RaftNode | None:
    return next((node for node in nodes if node.is_leader()), None)


def _change_on_leader(nodes: list[RaftNode], kind: str, address: str) -> int:
    """`_change` on the leader among `nodes`, asked again while PySyncObj refuses it because that leader
    was just elected (REQUEST_DENIED until its first entry of the term commits: seen on a busy
    machine right after the leader before it closed)."""
    reasons: list[int] = []

    def changed() -> bool:
        leader = _leader_of(nodes)
        if leader is None:
            return False
        reasons.append(_change(leader, kind, address))
        return reasons[-1] != int(FAIL_REASON.REQUEST_DENIED)

    wait_for(changed, f"{kind} {address} on a leader", CHANGE_WAIT_S, poll_s=0.2)
    return reasons[-1]


def _commits_on_a_leader(nodes: list[RaftNode]) -> bool:
    """Whether one of `nodes` leads and commits an entry now."""
    leader = _leader_of(nodes)
    if leader is None:
        return False
    reasons: list[int] = []
    done = threading.Event()

    def on_result(_result: ApplyResult | None, reason: int) -> None:
        reasons.append(reason)
        done.set()

    leader.propose(commands.encode(commands.create_topic("after", 1, 1)), on_result)
    return done.wait(WAIT_S) and reasons == [0]


def _hand_over_until(target: str, node: RaftNode, nodes: list[RaftNode]) -> None:
    """Asks the leader among `nodes` to hand over to `node` (at `target`) until it leads (a hand-over
    is refused while the target lacks part of the log)."""

    def leads() -> bool:
        leader = _leader_of(nodes)
        if leader is not None and leader is not node:
            leader.hand_over_leadership(lambda _result, _reason: None, target=target)
        return node.is_leader()

    wait_for(leads, "the hand-over", WAIT_S, poll_s=0.2)


@pytest.mark.parametrize("new_above", [True, False], ids=["new-node-dials", "restarted-node-dials"])
def test_a_node_restarted_behind_an_add_hears_the_new_node_that_leads(
    tmp_path: Path, new_above: bool
) -> None:
    """Voters A, B, S; S is down (its snapshot names A, B, S) while X is added and B removed; X leads
    and A dies: X's only majority is X and S. S restarts with --peers naming A and X, but its voters
    are its snapshot's, which lack X: X is a guest to it, so they connect whichever of them dials
    (raft/transport.py), S takes X's entries (the add and the removal among them) and X commits."""
    cluster = Cluster(  # Snapshots soon: a snapshot's voters, not --peers, are a restarted node's.
        tmp_path, lambda c: dataclasses.replace(c, compaction_min_entries=10, compaction_min_time_s=0.1)
    )
    new, stale = _address_beside(cluster.addresses, new_above)
    s_at = cluster.addresses.index(stale)
    a_at, b_at = (i for i in range(3) if i != s_at)
    config = RaftConfig(new, tuple(cluster.addresses), tmp_path / "new", "secret", join=True)
    store = Store.open(config.data_dir / "store", map_size_bytes=256 * 1024**2)
    joining = RaftNode(config, store, lambda index, result: None)
    restarted: RaftNode | None = None
    closed = {s_at}
    try:
        for node in (*cluster.nodes, joining):
            node.start()
        for i in range(30):
            cluster.propose(commands.encode(commands.create_topic(f"t{i}", 1, 1)))
        snapshot = cluster.configs[s_at].data_dir / "raft" / "snapshot"
        wait_for(snapshot.exists, "a snapshot on the node to restart", WAIT_S)
        cluster.nodes[s_at].close()  # Down while X is added and B removed.

        running = [cluster.nodes[a_at], cluster.nodes[b_at], joining]
        assert _change_on_leader(running, "add", new) == 0
        leader = wait_for(lambda: _leader_of(running), "a leader", WAIT_S)
        if leader is cluster.nodes[b_at]:  # Remove the old node that does not lead: call it B.
            a_at, b_at = b_at, a_at
        assert _change(leader, "remove", cluster.addresses[b_at]) == 0
        cluster.nodes[b_at].close()
        closed.add(b_at)
        _hand_over_until(new, joining, [cluster.nodes[a_at], joining])
        cluster.nodes[a_at].close()  # X's majority of A, S, X is now X and S.
        closed.add(a_at)
        cluster.stores[s_at].close()
        restart = dataclasses.replace(
            cluster.configs[s_at],
            peer_raft_addresses=(cluster.addresses[a_at], new),  # --peers as now.
        )
        cluster.stores[s_at] = Store.open(restart.data_dir / "store", map_size_bytes=256 * 1024**2)
        restarted = RaftNode(restart, cluster.stores[s_at], lambda index, result: None)
        restarted.start()

        wait_for(lambda: _commits_on_a_leader([joining, restarted]), "a commit of X and S", CHANGE_WAIT_S)
        wait_for(lambda: new in restarted.voters(), "the restarted node to learn the add", WAIT_S)
    finally:
        if restarted is not None:
            restarted.close()
        joining.close()
        store.close()
        for i, (node, node_store) in enumerate(zip(cluster.nodes, cluster.stores, strict=True)):
            if i not in closed:
                node.close()
            node_store.close()


def test_a_removed_node_that_still_runs_stops_standing_for_election(tmp_path: Path) -> None:
    """A follower removed while it runs is told by the leader that it is no voter: it reports its
    removal, and over several of its election timeouts its term stays, the leader keeps its term and
    the others commit. Before, it stood for election at an ever higher term and each of its vote
    requests made the leader step down (a re-election every second)."""
    cluster = Cluster(tmp_path)
    try:
        for node in cluster.nodes:
            node.start()
        leader = cluster.leader()
        removed = next(node for node in cluster.nodes if node is not leader)
        position = cluster.nodes.index(removed)
        assert _change(leader, "remove", cluster.addresses[position]) == 0
        wait_for(lambda: removed.removal() is not None, "the removed node to hear it", WAIT_S)
        removal = removed.removal()
        assert removal is not None and removal.leader == cluster.addresses[cluster.nodes.index(leader)]
        term, leader_term = removed.current_term(), leader.current_term()
        # Bounded polling, no timing asserted: entries commit while its elections would have come due.
        until = pysyncobj_clock() + 4 * cluster.configs[position].election_timeout_max_s
        proposals = 0
        while pysyncobj_clock() < until or proposals < 3:
            cluster.propose(commands.encode(commands.create_topic(f"t{proposals}", 1, 1)))
            proposals += 1
            assert removed.current_term() == term, "the removed node stood for election"
            assert leader.is_leader() and leader.current_term() == leader_term, "the leader was disturbed"
        assert removed.removal() == removal
    finally:
        cluster.close()


def test_a_leader_tells_a_non_voter_only_once_its_voters_are_committed(tmp_path: Path) -> None:
    """`voters_committed`: a MEMBERSHIP entry after the commit index (the voters may still change
    back) or a tail longer than the bound it reads means no; once it commits, yes."""
    address, peer = (f"127.0.0.1:{port}" for port in free_ports(2))
    config = RaftConfig(address, (peer,), tmp_path / "node", "secret")
    store = Store.open(config.data_dir / "store", map_size_bytes=64 * 1024**2)
    node = RaftNode(config, store, lambda index, result: None)
    try:
        assert node.voters_committed(entries_max=0)  # Its log holds the committed no-op alone.
        node._SyncObj__raftLog.add(membership_command(True, peer), 2, 1)
        assert not node.voters_committed(entries_max=10)
        node._SyncObj__raftLog.add(NO_OP_COMMAND, 3, 1)
        node._SyncObj__raftCommitIndex = 2
        assert node.voters_committed(entries_max=10)
        assert not node.voters_committed(entries_max=0)  # One entry after the commit: not read.
    finally:
        node.close()
        store.close()
