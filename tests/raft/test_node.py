"""RaftNode in one process: three real nodes on loopback sockets, each ticked by its own kq-raft-tick thread.

The constructor starts no thread, start() starts exactly one, close() joins it and frees the port; the
largest entries replicate whole, one byte per byte in kq's Raft transport (raft/wire.py); a closed node
restarts from its journal and store; followers whose connections to the leader close elect a new one
without waiting out the election timeout. Waits are on conditions with deadlines.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import logging
import os
import queue
import re
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pysyncobj.pickle
import pytest
from pysyncobj import SyncObj
from pysyncobj.node import TCPNode

from kq.deploy.cluster import free_ports
from kq.deploy.waiting import wait_for
from kq.proto.limits import (
    COMMIT_NOTICE_DELAY_S,
    ENTRY_BYTES_MAX,
    ENTRY_COMMAND_OVERHEAD_BYTES,
    JOURNAL_HELD_BYTES_MAX,
    LEADER_LOST_ELECTION_DELAY_S,
    LEADER_LOST_ELECTION_JITTER_S,
    LEADER_LOST_ELECTION_SLOT_S,
    RAFT_FRAME_BYTES_MAX,
    RAFT_METHODS,
)
from kq.raft import pysyncobj_adapter
from kq.raft.node import (
    APPEND_ENTRIES_BATCH_BYTES,
    TICK_THREAD_NAME,
    RaftBindError,
    RaftConfig,
    RaftNode,
    leader_lost_delay_s,
)
from kq.raft.pysyncobj_adapter import entry_command
from kq.raft.results import ApplyResult
from kq.raft.wire import decode_message, encode_message
from kq.storage import Store
from tests.raft.helpers import append, create

WAIT_S = 20.0  # Elections and applies of in-process nodes on a busy 2-core machine.


# Raft timings for moving the largest entries between three nodes of one process (one GIL). Each 3 MB
# entry costs the leader's tick thread its encoding per follower (and, before kq's transport, pickling,
# zlib and Fernet), and each follower the rebuilding, before any of them ticks again: on a loaded 2-core
# machine, up to seconds. With the production
# timings (an election after 0.5-1 s without a heartbeat, the leader stepping down after 2 s without
# a majority's answers, a connection dropped after 1.5 s silent) the transfer itself caused elections,
# and an election discards the entry in flight (PySyncObj's reason 3, DISCARDED) or strands a
# follower. That test is about whole entries and identical stores, not liveness under load
# (tests/system covers failover between real processes), so it runs with timings above that cost.
def with_big_entry_timing(config: RaftConfig) -> RaftConfig:
    """`config` with the timings the largest entries need (above)."""
    return dataclasses.replace(
        config,
        election_timeout_min_s=5.0,
        election_timeout_max_s=8.0,
        leader_fallback_timeout_s=15.0,
        connection_timeout_s=15.0,
    )


REPOSITORY = Path(__file__).resolve().parents[2]
SOURCE_FOLDERS = ("proto", "storage", "raft", "broker", "client", "cli", "spark", "chaos", "bench", "deploy")


def tick_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == TICK_THREAD_NAME]


class Cluster:
    """Three RaftNodes with their stores, built (not started) in `tmp_path`."""

    def __init__(self, tmp_path: Path, adjust: Callable[[RaftConfig], RaftConfig] = lambda c: c) -> None:
        self.addresses = [f"127.0.0.1:{port}" for port in free_ports(3)]
        self.configs = [
            adjust(
                RaftConfig(
                    raft_address=address,
                    peer_raft_addresses=tuple(a for a in self.addresses if a != address),
                    data_dir=tmp_path / f"node{number}",
                    password="secret",
                )
            )
            for number, address in enumerate(self.addresses)
        ]
        self.stores = [Store.open(c.data_dir / "store", map_size_bytes=256 * 1024**2) for c in self.configs]
        self.nodes = [
            RaftNode(c, s, lambda index, result: None) for c, s in zip(self.configs, self.stores, strict=True)
        ]

    def leader(self) -> RaftNode:
        wait_for(lambda: sum(node.is_leader() for node in self.nodes) == 1, "one leader", WAIT_S)
        return next(node for node in self.nodes if node.is_leader())

    def propose(self, data: bytes) -> int:
        """Proposes `data` on the leader and waits for its commit; returns the leader's applied index."""
        done = threading.Event()
        outcome: list[tuple[ApplyResult | None, int]] = []

        def on_result(result: ApplyResult | None, reason: int) -> None:
            outcome.append((result, reason))
            done.set()

        leader = self.leader()
        leader.propose(data, on_result)
        assert done.wait(timeout=WAIT_S)
        result, reason = outcome[0]
        assert reason == 0 and result is not None, outcome
        return self.stores[self.nodes.index(leader)].applied_index()

    def close(self) -> None:
        for node, store in zip(self.nodes, self.stores, strict=True):
            node.close()
            store.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    local = Cluster(tmp_path)
    try:
        yield local
    finally:
        local.close()


def test_threads_start_in_start_and_end_in_close(cluster: Cluster) -> None:
    """No thread before start(); one kq-raft-tick per node after; none after close(), and the port is free."""
    assert tick_threads() == []
    for node in cluster.nodes:
        node.start()
    assert len(tick_threads()) == 3
    cluster.propose(create("t", 1))
    cluster.close()
    assert tick_threads() == []
    with socket.socket() as rebind:
        rebind.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        host, port = cluster.addresses[0].split(":")
        rebind.bind((host, int(port)))


@pytest.fixture
def patient_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Three nodes with `with_big_entry_timing`: no election while the largest entries are in transit."""
    local = Cluster(tmp_path, with_big_entry_timing)
    try:
        yield local
    finally:
        local.close()


def test_the_largest_entries_replicate_whole(
    patient_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """3 MB of bytes >= 0x80 (pickle protocol 2's worst case) and 3 MB of random bytes: each entry is
    the same bytes in every node's log (a follower rebuilds it with `entry_command`), goes out in one
    message, and every store ends byte-identical.

    Under CPU load it used to fail: the transfer itself starved the tick threads past the election
    timeout, so the proposal came back DISCARDED or a follower missed the entry (`with_big_entry_timing`)."""
    cluster = patient_cluster
    for node in cluster.nodes:
        node.start()
    cluster.propose(create("t", 1))
    for values in ([b"\xff" * 1_000_000] * 3, [os.urandom(1_000_000) for _ in range(3)]):
        entry = append("t", 0, *values)
        assert len(entry) <= ENTRY_BYTES_MAX
        index = cluster.propose(entry)
        wait_for(
            lambda: all(store.applied_index() >= index for store in cluster.stores),  # noqa: B023
            "every store applied the entry",
            WAIT_S,
        )
        held = [node.entries(index, 1) for node in cluster.nodes]
        assert all(type(entries[0][0]) is bytes for entries in held if entries)
        assert all(len(entries[0][0]) < APPEND_ENTRIES_BATCH_BYTES for entries in held if entries)
    dumps = [store.dump() for store in cluster.stores]
    assert dumps[0] == dumps[1] == dumps[2]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []  # No cut entry.


def test_a_closed_node_restarts_from_its_journal_and_store(cluster: Cluster) -> None:
    """Close one follower, commit without it, build it again on the same directory: it catches up."""
    for node in cluster.nodes:
        node.start()
    cluster.propose(create("t", 1))
    follower = next(number for number, node in enumerate(cluster.nodes) if not node.is_leader())
    cluster.nodes[follower].close()
    index = cluster.propose(append("t", 0, b"while it was away"))
    config = cluster.configs[follower]
    cluster.nodes[follower] = RaftNode(config, cluster.stores[follower], lambda applied, result: None)
    cluster.nodes[follower].start()
    wait_for(lambda: cluster.stores[follower].applied_index() >= index, "the follower applied it", WAIT_S)
    assert cluster.stores[follower].dump() == cluster.stores[cluster.nodes.index(cluster.leader())].dump()


def test_a_follower_catches_up_on_entries_its_leader_holds_only_on_disk(cluster: Cluster) -> None:
    """A follower away while more than JOURNAL_HELD_BYTES_MAX of entries commit comes back to a leader
    whose journal holds only the newest in memory: the older ones are read back from its file for
    the catch-up, and the follower's store ends as the leader's."""
    for node in cluster.nodes:
        node.start()
    cluster.propose(create("t", 1))
    follower = next(number for number, node in enumerate(cluster.nodes) if not node.is_leader())
    cluster.nodes[follower].close()
    first = cluster.leader()._journal[0][1]
    value = os.urandom(100 * 1024)
    written = 0
    while written <= JOURNAL_HELD_BYTES_MAX + 4 * 1024 * 1024:
        index = cluster.propose(append("t", 0, *[value] * 10))
        written += 10 * len(value)
    journal = cluster.leader()._journal
    assert journal.held_bytes < written  # Evicted: the first entries' commands are on disk only.
    assert journal[0][1] == first  # No compaction: the follower gets entries, not a copy of the store.
    config = cluster.configs[follower]
    cluster.nodes[follower] = RaftNode(config, cluster.stores[follower], lambda applied, result: None)
    cluster.nodes[follower].start()
    wait_for(lambda: cluster.stores[follower].applied_index() >= index, "the follower caught up", WAIT_S)
    assert cluster.stores[follower].dump() == cluster.stores[cluster.nodes.index(cluster.leader())].dump()


@pytest.fixture
def loops() -> Iterator[list[asyncio.AbstractEventLoop]]:
    """Three running event loops, each on its own thread (a node process's serving loop)."""
    running = [asyncio.new_event_loop() for _ in range(3)]
    threads = [
        threading.Thread(target=loop.run_forever, name=f"test-loop-{n}") for n, loop in enumerate(running)
    ]
    for thread in threads:
        thread.start()
    try:
        yield running
    finally:
        for loop, thread in zip(running, threads, strict=True):
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()


def test_nodes_ticked_on_event_loops_commit_restart_and_close(
    cluster: Cluster, loops: list[asyncio.AbstractEventLoop]
) -> None:
    """start_on_loop (a node process's way): no kq-raft-tick thread; proposals made on the leader's loop
    (as the serving loop's Produce does) and from another thread commit; a follower closed (from
    another thread: it is destroyed on its loop) and built again on the same loop catches up; close()
    frees every port."""
    for node, loop in zip(cluster.nodes, loops, strict=True):
        node.start_on_loop(loop)
    assert tick_threads() == []
    assert all(node.poller.attached for node in cluster.nodes)
    cluster.propose(create("t", 1))  # From this thread: PySyncObj's pipe wakes the leader's loop.
    leader = cluster.leader()
    done: concurrent.futures.Future[int] = concurrent.futures.Future()

    async def propose_on_loop() -> None:
        leader.propose(append("t", 0, b"on the loop"), lambda result, reason: done.set_result(reason))

    asyncio.run_coroutine_threadsafe(propose_on_loop(), loops[cluster.nodes.index(leader)]).result(WAIT_S)
    assert done.result(WAIT_S) == 0
    follower = next(number for number, node in enumerate(cluster.nodes) if not node.is_leader())
    cluster.nodes[follower].close()
    index = cluster.propose(append("t", 0, b"while it was away"))
    cluster.nodes[follower] = RaftNode(cluster.configs[follower], cluster.stores[follower], lambda i, r: None)
    cluster.nodes[follower].start_on_loop(loops[follower])
    wait_for(lambda: cluster.stores[follower].applied_index() >= index, "the follower applied it", WAIT_S)
    assert cluster.stores[follower].dump() == cluster.stores[cluster.nodes.index(cluster.leader())].dump()
    cluster.close()
    for address in cluster.addresses:
        with socket.socket() as rebind:
            rebind.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            host, port = address.split(":")
            rebind.bind((host, int(port)))


# An election timeout no test here waits out: with it on every node but node0, node0 is the first
# leader (the others vote for it), and any later election is one a closed connection started.
PATIENT_TIMEOUT_S = 600.0


def patient_followers(config: RaftConfig) -> RaftConfig:
    """`config` with PATIENT_TIMEOUT_S as its election timeout, unless it is node0's."""
    if config.data_dir.name == "node0":
        return config
    return dataclasses.replace(
        config, election_timeout_min_s=PATIENT_TIMEOUT_S, election_timeout_max_s=PATIENT_TIMEOUT_S + 1
    )


def commit_on(node: RaftNode, data: bytes) -> int:
    """Proposes `data` on `node` and waits for the outcome: PySyncObj's reason (0: committed)."""
    reasons: concurrent.futures.Future[int] = concurrent.futures.Future()
    node.propose(data, lambda result, reason: reasons.set_result(reason))
    return reasons.result(WAIT_S)


@pytest.mark.parametrize("ticking", ["thread", "loop"])
def test_followers_elect_a_leader_once_the_leaders_connections_close(
    tmp_path: Path, ticking: str, request: pytest.FixtureRequest
) -> None:
    """The leader closes (its sockets close, as a killed process's do): the followers, whose election
    timeout is ten minutes, elect one of them and commit, on a kq-raft-tick thread or a serving loop."""
    cluster = Cluster(tmp_path, patient_followers)
    try:
        if ticking == "loop":
            running: list[asyncio.AbstractEventLoop] = request.getfixturevalue("loops")
            for node, loop in zip(cluster.nodes, running, strict=True):
                node.start_on_loop(loop)
        else:
            for node in cluster.nodes:
                node.start()
        cluster.propose(create("t", 1))
        assert cluster.leader() is cluster.nodes[0]
        cluster.nodes[0].close()
        followers = cluster.nodes[1:]
        wait_for(lambda: sum(node.is_leader() for node in followers) == 1, "a leader among them", WAIT_S)
        leader = next(node for node in followers if node.is_leader())
        assert commit_on(leader, append("t", 0, b"after the leader closed")) == 0
    finally:
        cluster.close()


def test_only_the_leaders_connection_brings_a_followers_election_near(tmp_path: Path) -> None:
    """On a follower's tick thread: another follower's closed connection leaves its election timeout
    as it was; the leader's brings it to the follower's `leader_lost_delay_s`."""
    local = Cluster(tmp_path, patient_followers)
    try:
        for node in local.nodes:
            node.start()
        local.propose(create("t", 1))
        assert local.leader() is local.nodes[0]
        follower = local.nodes[1]
        due_s: queue.SimpleQueue[tuple[float, float]] = queue.SimpleQueue()

        def on_tick_thread() -> None:
            follower.peer_disconnected(TCPNode(local.addresses[2]))
            after_follower = follower.election_due_s()
            follower.peer_disconnected(TCPNode(local.addresses[0]))
            due_s.put((after_follower, follower.election_due_s()))

        follower._tick_calls.put(on_tick_thread)
        after_follower, after_leader = due_s.get(timeout=WAIT_S)
        assert after_follower > PATIENT_TIMEOUT_S / 2
        voters = frozenset(local.addresses)
        line_s = leader_lost_delay_s(voters, local.addresses[1], local.addresses[0], 0, 0.0)
        assert after_leader <= line_s + LEADER_LOST_ELECTION_JITTER_S
    finally:
        local.close()


def test_the_followers_of_a_lost_leader_stand_in_a_line_of_their_group() -> None:
    """The voters other than the leader stand one slot apart (the jitter cannot close the gap), each
    group in an order of its own (every one of them first in some groups); a node that is not a voter
    (removed) stands last."""
    voters = frozenset({"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000", "10.0.0.4:7000"})
    leader = "10.0.0.2:7000"
    followers = voters - {leader}
    first_in_line = set()
    for group in range(30):
        earliest = {own: leader_lost_delay_s(voters, own, leader, group, 0.0) for own in followers}
        latest = {
            own: leader_lost_delay_s(voters, own, leader, group, LEADER_LOST_ELECTION_JITTER_S)
            for own in followers
        }
        slots = sorted(earliest.values())
        assert slots[0] == LEADER_LOST_ELECTION_DELAY_S
        assert all(b - a == pytest.approx(LEADER_LOST_ELECTION_SLOT_S) for a, b in itertools.pairwise(slots))
        later = [(own, other) for own in followers for other in followers if earliest[other] > earliest[own]]
        assert all(latest[own] < earliest[other] for own, other in later)
        first_in_line.add(min(followers, key=earliest.__getitem__))
    assert first_in_line == followers
    outsider = leader_lost_delay_s(voters, "10.0.0.9:7000", leader, 0, 0.0)
    assert outsider == LEADER_LOST_ELECTION_DELAY_S + 3 * LEADER_LOST_ELECTION_SLOT_S


def test_a_port_in_use_refuses_to_start(tmp_path: Path) -> None:
    """A Raft address that cannot be bound raises RaftBindError (after the bounded retries)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        address = f"127.0.0.1:{holder.getsockname()[1]}"
        config = RaftConfig(address, (), tmp_path / "node", "secret")
        store = Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)
        with pytest.raises(RaftBindError):
            RaftNode(config, store, lambda index, result: None)
        store.close()


def test_entries_cost_one_byte_per_byte_on_the_wire() -> None:
    """The Raft transport's frame carrying the largest entry of bytes >= 0x80 is as long as the entry
    (protobuf bytes, no pickle), fits a frame, and the receiver rebuilds the leader's exact command."""
    argument = b"\xff" * ENTRY_BYTES_MAX
    command = entry_command(0, argument)
    assert len(command) <= ENTRY_BYTES_MAX + ENTRY_COMMAND_OVERHEAD_BYTES < APPEND_ENTRIES_BATCH_BYTES
    message = {"type": "append_entries", "term": 3, "commit_index": 11, "entries": [(command, 12, 3)]}
    wire = encode_message({**message, "prevLogIdx": 11, "prevLogTerm": 3})
    assert len(argument) < len(wire) < len(argument) + 1024 <= RAFT_FRAME_BYTES_MAX
    received = decode_message(wire, TCPNode)["entries"][0][0]
    assert type(received) is bytes and received == command
    assert pysyncobj.pickle.loads(received[1:]) == (0, (argument,))  # As PySyncObj's apply reads it.


def test_kq_has_exactly_the_replicated_methods_the_wire_allows(cluster: Cluster) -> None:
    """The wire refuses method ids >= RAFT_METHODS: kq's one @replicated method has PySyncObj's id 0."""
    assert cluster.nodes[0]._methodToID == {"_apply_entry_v0": 0}  # PySyncObj names it by version.
    assert RAFT_METHODS == 1


def test_pysyncobj_privates_are_touched_only_by_the_adapter_and_its_modules_never_patched() -> None:
    """Outside raft/pysyncobj_adapter.py no kq module names a PySyncObj private or assigns to pysyncobj."""
    offenders = []
    patch = re.compile(r"setattr\(\s*pysyncobj|^\s*pysyncobj(\.\w+)+\s*=", re.MULTILINE)
    for folder in SOURCE_FOLDERS:
        for path in (REPOSITORY / folder).rglob("*.py"):
            text = path.read_text()
            if path.name != "pysyncobj_adapter.py" and ("_SyncObj__" in text or "._isLeader" in text):
                offenders.append(str(path))
            if patch.search(text):
                offenders.append(f"{path} (patches pysyncobj)")
    assert offenders == []


def test_every_private_member_the_adapter_names_exists(cluster: Cluster) -> None:
    """The adapter's docstring lists PySyncObj's privates it uses; each exists in the pinned version."""
    names = set(re.findall(r"`(_SyncObj__\w+|_isLeader|_getLeader)`", pysyncobj_adapter.__doc__ or ""))
    assert len(names) >= 10
    own_fields = cluster.nodes[0].__dict__["_SyncObj__properies"]  # What SyncObj.__init__ itself set.
    missing = [name for name in names if not hasattr(SyncObj, name) and name not in own_fields]
    assert missing == []


def test_the_adapter_lists_every_private_member_it_names() -> None:
    """Each PySyncObj private named in the adapter's code is in its docstring's list (with its reason)."""
    source = (REPOSITORY / "raft" / "pysyncobj_adapter.py").read_text()
    code = source.split('"""', 2)[2]
    listed = set(re.findall(r"`(_SyncObj__\w+)`", pysyncobj_adapter.__doc__ or ""))
    assert set(re.findall(r"_SyncObj__\w+", code)) - listed == set()


def test_the_byte_trigger_counts_entry_bytes_from_the_last_compaction_whatever_started_it(
    tmp_path: Path,
) -> None:
    """Compaction by entry count every ten or so 10 KiB entries, and by bytes at 190 KiB: the count
    comes first every time, so the byte trigger never fires. Its count restarted only at compactions
    it forced, so it fired a few entries after one the entry count had started (back-to-back
    snapshots, three a node in a 30-minute soak)."""
    cluster = Cluster(
        tmp_path,
        lambda c: dataclasses.replace(
            c, compaction_min_entries=10, compaction_min_time_s=3600.0, compaction_log_bytes_max=190 * 1024
        ),
    )
    forced: list[int] = []
    try:
        for node in cluster.nodes:
            node.forceLogCompaction = lambda: forced.append(1)
            node.start()
        cluster.propose(create("t", 1))
        for _ in range(60):
            cluster.propose(append("t", 0, b"v" * 10 * 1024))
        assert all(node.snapshots_written()[0] >= 4 for node in cluster.nodes)
        assert forced == []
    finally:
        cluster.close()


class FirstElection:
    """What `RaftNode._first_election_line` reads of its node, set by the test."""

    def __init__(self, term: int, connected: frozenset[str], joining: bool = False) -> None:
        self._first_line_pending = True
        self._joining = joining
        self._removed = None
        self._address = "10.0.0.1:7000"
        self._group = 0
        self._election_timeout_min_s = 0.5
        self.voters = frozenset({"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"})
        self.term = term
        self.connected = connected
        self.due_s = 0.7
        self.hastened: list[float] = []

    def current_term(self) -> int:
        return self.term

    def pending(self) -> bool:
        return self._first_line_pending

    def voter_addresses(self) -> frozenset[str]:
        return self.voters

    def connected_addresses(self) -> frozenset[str]:
        return self.connected

    def election_due_s(self) -> float:
        return self.due_s

    def hasten_election(self, seconds: float) -> None:
        self.hastened.append(seconds)


def test_a_new_groups_voter_stands_in_line_once_a_majority_is_connected() -> None:
    """At term 0 a voter waits until it and the voters it is connected to are a majority, then puts
    its election at its place in the group's line (once); a group that has held an election, and a
    joining node, keep the timeout; a longer election timeout stretches the line in proportion."""
    node = FirstElection(term=0, connected=frozenset())
    RaftNode._first_election_line(node)  # type: ignore[arg-type]
    assert node.hastened == [] and node.pending()  # Alone: not a majority yet.
    node.connected = frozenset({"10.0.0.3:7000", "10.0.0.9:7000"})  # One voter (and a stranger).
    RaftNode._first_election_line(node)  # type: ignore[arg-type]
    place_s = leader_lost_delay_s(node.voters, node._address, "", 0, 0.0)
    assert len(node.hastened) == 1 and place_s <= node.hastened[0] <= place_s + LEADER_LOST_ELECTION_JITTER_S
    RaftNode._first_election_line(node)  # type: ignore[arg-type]
    assert len(node.hastened) == 1 and not node.pending()  # Once.
    patient = FirstElection(term=0, connected=node.connected)
    patient._election_timeout_min_s, patient.due_s = 5.0, 9.0
    RaftNode._first_election_line(patient)  # type: ignore[arg-type]
    assert 10 * place_s <= patient.hastened[0] <= 10 * (place_s + LEADER_LOST_ELECTION_JITTER_S)
    for kept in (FirstElection(term=3, connected=node.connected), FirstElection(0, node.connected, True)):
        RaftNode._first_election_line(kept)  # type: ignore[arg-type]
        assert kept.hastened == []


class _NoticeState:
    """What `PySyncObjAdapter._next_notice` reads and writes of the leader's state."""

    def __init__(self, commit_index: int, told: dict[str, int]) -> None:
        self._SyncObj__raftCommitIndex = commit_index
        self._commit_told = dict(told)
        self._notice_for = 0
        self._notice_due: float | None = None

    def next_notice(
        self, now: float, peers: set[str], connected: set[str], everyone: bool = False
    ) -> tuple[float | None, int]:
        """Runs `_next_notice` after a round; returns (when the notice is due, the commit it is for)."""
        self._notice_due = pysyncobj_adapter.PySyncObjAdapter._next_notice(
            self,  # type: ignore[arg-type]  # Only the attributes above are read.
            now,
            peers,
            connected,
            everyone,
        )
        return self._notice_due, self._notice_for


def test_a_commit_notice_waits_for_its_commit_and_goes_only_while_a_peer_lacks_it() -> None:
    """The leader tells every peer a commit index COMMIT_NOTICE_DELAY_S after it found a peer not sent
    it, unless entries carried it by then: under steady load no notice round goes (each entry carries
    the commit before it); a notice for a commit still untold stays where it is; a peer the notice's
    round could not reach gets the next one later, never at once again; disconnected peers wait for
    their connection, removed ones are forgotten."""
    delay = COMMIT_NOTICE_DELAY_S
    peers = {"a", "b"}
    state = _NoticeState(5, {"a": 5, "b": 5})
    assert state.next_notice(0.0, peers, peers)[0] is None  # Both were sent commit index 5.
    state._SyncObj__raftCommitIndex = 6  # Entry 6 committed (applied); nobody was told yet.
    assert state.next_notice(1.0, peers, peers) == (1.0 + delay, 6)
    state._SyncObj__raftCommitIndex = 7
    # 7 committed too: the notice for 6 stays where it was.
    assert state.next_notice(1.001, peers, peers) == (1.0 + delay, 6)
    state._commit_told.update(a=7, b=7)  # Entry 8's AppendEntries carried commit index 7.
    assert state.next_notice(1.002, peers, peers)[0] is None
    state._SyncObj__raftCommitIndex = 8
    state.next_notice(1.003, peers, peers)
    state._commit_told["a"] = 8  # Only "a" was sent 8 (entry 9 went to it first).
    state._SyncObj__raftCommitIndex = 9
    assert state.next_notice(1.004, peers, peers) == (1.003 + delay, 8)  # "b" still lacks 8.
    state._commit_told["b"] = 8
    # 8 told to both, 9 to none: a notice for 9, from now.
    assert state.next_notice(1.005, peers, peers) == (1.005 + delay, 9)
    state._commit_told["a"] = 9  # The notice's round reached "a" only.
    due, _ = state.next_notice(1.005 + delay, peers, peers, everyone=True)
    assert due == pytest.approx(1.005 + 2 * delay)  # Later, not at once again.
    assert state.next_notice(1.006 + delay, peers, {"a"})[0] is None  # "b" disconnected: all told.
    state._commit_told["gone"] = 1  # A peer removed from the cluster.
    state.next_notice(1.007 + delay, peers, {"a"})
    assert "gone" not in state._commit_told


class _AnswerState:
    """What `PySyncObjAdapter._acknowledges_committed` reads of the node's state."""

    def __init__(self, leader: bool, commit_index: int, last_index: int) -> None:
        self._leader = leader
        self._SyncObj__raftCommitIndex = commit_index
        self._last_index = last_index

    def _isLeader(self) -> bool:  # noqa: N802 - PySyncObj's name.
        return self._leader

    def _SyncObj__getCurrentLogIndex(self) -> int:  # noqa: N802 - PySyncObj's name.
        return self._last_index

    def quiet(self, message: dict[str, Any]) -> bool:
        return bool(pysyncobj_adapter.PySyncObjAdapter._acknowledges_committed(self, message))  # type: ignore[arg-type]


def test_only_a_success_for_a_committed_whole_log_leaves_the_leader_no_tick() -> None:
    """A follower's answer that a tick could act on asks for one: a success that may move the commit
    index, one for a log the follower does not hold whole (entries to send), a failure or a reset
    (entries to send again), any other message, or any message on a follower. Only a success for
    the whole log, committed already, on the leader, does not (the second follower's answer)."""

    def answer(next_index: int, success: bool = True, reset: bool = False) -> dict[str, Any]:
        return {"type": "next_node_idx", "next_node_idx": next_index, "success": success, "reset": reset}

    leader = _AnswerState(leader=True, commit_index=10, last_index=10)
    assert leader.quiet(answer(11))
    assert not leader.quiet(answer(11, success=False))
    assert not leader.quiet(answer(11, reset=True))
    assert not leader.quiet(answer(10))  # It lacks entry 10: send it.
    assert not _AnswerState(leader=True, commit_index=9, last_index=10).quiet(answer(11))  # Commits 10.
    assert not _AnswerState(leader=False, commit_index=10, last_index=10).quiet(answer(11))
    assert not leader.quiet({"type": "append_entries", "term": 1, "commit_index": 10})


class _VotersState:
    """What `PySyncObjAdapter.voter_addresses` reads of PySyncObj's state."""

    def __init__(self, others: set[TCPNode], log: list[tuple[bytes, int, int]]) -> None:
        self._SyncObj__otherNodes = others
        self._SyncObj__selfNode = TCPNode("127.0.0.1:1")
        self._SyncObj__raftLog = log
        self._voters_key: tuple[int, int, int] | None = None
        self._voters_found: frozenset[str] = frozenset()

    def cluster_nodes(self) -> set[TCPNode]:
        return set(self._SyncObj__otherNodes | {self._SyncObj__selfNode})

    def voters(self) -> frozenset[str]:
        return frozenset(pysyncobj_adapter.PySyncObjAdapter.voter_addresses(self))  # type: ignore[arg-type]


def test_the_voters_are_read_again_when_the_log_or_their_count_changes() -> None:
    """The voters are kept by the log's last entry and their count: a MEMBERSHIP entry appended, one
    rolled back and replaced by another entry of a later term at the same index, or a store copy,
    each change the key, and the voters are read again; an unchanged log gives the kept set."""
    others = {TCPNode("127.0.0.1:2")}
    log = [(b"", 1, 1)]
    state = _VotersState(others, log)
    assert state.voters() == {"127.0.0.1:1", "127.0.0.1:2"}
    others.add(TCPNode("127.0.0.1:3"))  # PySyncObj adds a voter as its MEMBERSHIP entry enters the log.
    log.append((b"add", 2, 1))
    assert state.voters() == {"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}
    others.discard(TCPNode("127.0.0.1:3"))  # Rolled back: a new leader's entry of term 2 at index 2.
    others.add(TCPNode("127.0.0.1:4"))  # Same count, another voter.
    log[-1] = (b"add", 2, 2)
    assert state.voters() == {"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:4"}
    others.discard(TCPNode("127.0.0.1:4"))  # Not something PySyncObj does without a log change:
    others.add(TCPNode("127.0.0.1:5"))  # it shows the voters are kept, not read again, while the key stays.
    assert state.voters() == {"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:4"}


class _FakeTimer:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class _FakeLoop:
    """The loop clock and timers `RaftNode`'s loop ticks use, the clock moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[_FakeTimer] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> _FakeTimer:
        timer = _FakeTimer(when, callback)
        self.timers.append(timer)
        return timer

    def pending(self) -> list[float]:
        return [timer.when for timer in self.timers if not timer.cancelled]

    def advance(self, now: float) -> None:
        """Moves the clock to `now`, firing each timer due by then in order, as asyncio would."""
        while due := [timer for timer in self.timers if not timer.cancelled and timer.when <= now]:
            first = min(due, key=lambda timer: timer.when)
            self.now = first.when
            self.timers.remove(first)
            first.callback()
        self.now = now


class _LoopTickState:
    """What `RaftNode`'s loop ticks read and write of a leader: the next AppendEntries `due_s` away."""

    def __init__(self, due_s: float) -> None:
        self._loop = _FakeLoop()
        self._stopping = threading.Event()
        self._timer: _FakeTimer | None = None
        self._timer_due = 0.0
        self._tick_due = 0.0
        self.due_s = due_s
        self.ticks: list[float] = []
        self.alone_uncommitted = False  # A lone leader's appended entries, committed at its next tick.

    def sync_journal(self) -> None:
        pass

    def commits_alone(self) -> bool:
        return self.alone_uncommitted

    def doTick(self, _wait: float) -> None:  # noqa: N802 - PySyncObj's name.
        self.ticks.append(self._loop.now)

    def is_leader(self) -> bool:
        return True

    def append_entries_due_s(self) -> float:
        return self.due_s

    def _loop_tick(self) -> None:
        RaftNode._loop_tick(self)  # type: ignore[arg-type]

    def _timer_tick(self) -> None:
        RaftNode._timer_tick(self)  # type: ignore[arg-type]

    def _arm_timer(self, due_s: float) -> None:
        RaftNode._arm_timer(self, due_s)  # type: ignore[arg-type]


def test_a_lone_leader_with_entries_past_its_commit_ticks_again_at_once() -> None:
    """A one-node cluster's leader commits what a tick appended at its next tick, and no follower's
    answer brings that tick on: the loop ticks again at once instead of at the heartbeat's timer."""
    state = _LoopTickState(due_s=0.005)
    state.alone_uncommitted = True
    state._loop_tick()
    assert state._loop.pending() == [0.0]
    state.alone_uncommitted = False
    state._loop.advance(0.0)
    assert state.ticks == [0.0, 0.0]
    assert state._loop.pending() == [0.005]


def test_the_timer_ticks_only_when_no_tick_since_moved_the_next_one_later() -> None:
    """The loop's timer ticks when the last tick's deadline comes: a timer whose deadline a later
    tick moved on is set again for the new one instead of ticking (one record in flight, the leader's
    commit notice moves 5 ms on with each record); a tick that wants one sooner replaces the timer."""
    state = _LoopTickState(due_s=0.005)
    state._loop_tick()  # t=0: the next tick at 5 ms at the latest.
    assert state._loop.pending() == [0.005]
    state._loop.advance(0.002)
    state._loop_tick()  # A tick after a socket event: the next one 7 ms at the latest.
    assert state._loop.pending() == [0.005]  # The timer is not replaced on every tick.
    state._loop.advance(0.006)
    assert state.ticks == [0.0, 0.002]  # The timer at 5 ms found the deadline moved on: no tick.
    assert state._loop.pending() == [0.007]
    state._loop.advance(0.0075)
    assert state.ticks == [0.0, 0.002, 0.007]  # Nothing since: the timer ticks, and sets the next.
    assert state._loop.pending() == [0.012]
    state.due_s = 0.001  # A tick that wants the next one sooner (a heartbeat due) replaces the timer.
    state._loop_tick()
    assert state._loop.pending() == [0.0085]
    state._loop.advance(0.009)
    assert state.ticks == [0.0, 0.002, 0.007, 0.0075, 0.0085]
