"""Cluster membership: who the members are (a view every RPC reads), and adding or removing one.

Two replicated things make up the membership:
- The Raft voters: PySyncObj's own set, changed by its MEMBERSHIP entries, one node at a time (a
  change takes effect on each node when the entry reaches its log). RaftNode publishes it each tick.
- The members' addresses: the store's `members` table, written by RegisterMember and
  UnregisterMember commands through `apply` (checked at the edge and in apply by the same
  `cluster_member_problem`), so every node, a follower or a node that joined later included, maps a
  voter's Raft address to its gRPC and Kafka addresses and rack. Nodes know the members they were
  started with from `--peers`; a registered entry takes precedence.

Adding (`MembershipChanges.add`, on the leader): the request is checked, the new node (started with
`--join`) must answer a status call with the id and Raft address asked for, the change must leave a
majority of the voters running; then its addresses are registered (so every node can name it before
it votes) and the MEMBERSHIP entry is proposed; the call answers once that entry committed. The new
node catches up from the leader: entries, or a store copy when the log was compacted past them.
Removing: the MEMBERSHIP entry first, then the addresses are forgotten. A leader asked to remove
itself hands its leadership to the most caught-up follower and answers NOT_LEADER, naming the new
leader once one is known, so the client retries there.

Threads: `Membership.refresh` runs on the tick thread (the voters changed; a member command applied)
and once at start; it swaps an immutable view that any thread reads without a lock.
`MembershipChanges` runs on a gRPC worker thread and blocks it while a change commits (at most
PROPOSAL_TIMEOUT_S plus MEMBERSHIP_CHANGE_TIMEOUT_S); one change at a time per node (others answer
MEMBERSHIP_CHANGE_PENDING), and PySyncObj refuses a second change before the first committed.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import grpc

from kq.broker.consensus import Consensus, Peer
from kq.broker.deadlines import capped
from kq.broker.errors import MembershipError, NotLeaderError, UnavailableError
from kq.broker.proposals import propose_and_wait, wait_result
from kq.broker.validation import check
from kq.proto import kq_pb2, kq_pb2_grpc
from kq.proto.errors import ErrorCode
from kq.proto.limits import (
    LEADERSHIP_CHECK_S,
    MEMBER_PROBE_TIMEOUT_S,
    MEMBERSHIP_CHANGE_TIMEOUT_S,
    PEERS_MAX,
    PROPOSAL_TIMEOUT_S,
)
from kq.proto.placement import group_address
from kq.raft import commands
from kq.raft.results import ApplyResult, MemberResult
from kq.raft.validation import cluster_member_problem, node_id_problem
from kq.storage import Store

logger = logging.getLogger(__name__)

PYSYNCOBJ_REQUEST_DENIED = 6  # pysyncobj.FAIL_REASON.REQUEST_DENIED: a change is pending, or too early.


def derived_cluster_id(raft_addresses: Iterable[str]) -> str:
    """The cluster id of nodes started from the same `--peers`: computed alike by each, without agreeing
    on it. The first registered member records it in the log, so a node that joins later (with other
    `--peers`) reports the same id (`MembershipView.cluster_id`)."""
    digest = hashlib.sha256(",".join(sorted(raft_addresses)).encode()).digest()
    return base64.urlsafe_b64encode(digest[:16]).decode().rstrip("=")


def peer_of(member: kq_pb2.Member) -> Peer:
    """A registered member as a Peer."""
    return Peer(member.node_id, member.raft_address, member.grpc_address, member.kafka_address, member.rack)


@dataclass(frozen=True, slots=True)
class MembershipView:
    """The cluster as one node knows it at one moment."""

    self_id: str
    members: tuple[Peer, ...]  # The Raft voters, by node id, this node included.
    known: Mapping[str, Peer]  # Every node whose addresses are known, by Raft address (voter or not).
    registered: frozenset[str]  # Node ids in the replicated `members` table.
    cluster_id: str

    @property
    def peers(self) -> tuple[Peer, ...]:
        """The other voters."""
        return tuple(peer for peer in self.members if peer.node_id != self.self_id)

    def member(self, node_id: str) -> Peer | None:
        """The voter with this id, or None."""
        return next((peer for peer in self.members if peer.node_id == node_id), None)


class Membership:
    """This node's view of the members, rebuilt when the voters or the registered addresses change."""

    def __init__(
        self,
        self_peer: Peer,
        configured: tuple[Peer, ...],
        store: Store,
        voters: Callable[[], frozenset[str]] | None = None,
        group: int = 0,
    ) -> None:
        """`configured`: the other nodes of `--peers`; `voters`: the Raft voters' addresses (RaftNode's
        `voters`; None: the configured nodes, for a node without Raft in in-process tests); `group`:
        the Raft group of this process (broker/workers.py: its addresses are the node's moved by it,
        and its cluster id is derived from the node's, as every group's process reports the same)."""
        self._self = self_peer
        self._configured = configured
        self._store = store
        started_with = frozenset(peer.raft_address for peer in (self_peer, *configured))
        self._voters = voters or (lambda: started_with)
        self._derived_id = derived_cluster_id(group_address(address, -group) for address in started_with)
        self._lock = threading.Lock()  # Serializes rebuilds (tick thread, and start).
        self._view = self._build()

    @property
    def view(self) -> MembershipView:
        """The latest view (any thread)."""
        return self._view

    def refresh(self, *_: object) -> None:
        """Rebuilds the view from the voters and the store (a callback: its arguments are ignored)."""
        with self._lock:
            self._view = self._build()

    def on_applied(self, result: ApplyResult | None) -> None:
        """Called with each applied entry's result (tick thread): a member command changes the view,
        and so may a store restored from a copy (None)."""
        if result is None or isinstance(result, MemberResult):
            self.refresh()

    def _build(self) -> MembershipView:
        with self._store.read() as reader:
            registered = [kq_pb2.Member.FromString(raw) for _, raw in reader.members()]
            stored_id = reader.cluster_id()
        known = {peer.raft_address: peer for peer in self._configured}
        known.update((member.raft_address, peer_of(member)) for member in registered)
        known[self._self.raft_address] = self._self
        members = sorted(
            (known.get(address) or Peer(address, address, "") for address in self._voters()),
            key=lambda peer: (len(peer.node_id), peer.node_id),  # "2" before "10".
        )
        return MembershipView(
            self._self.node_id,
            tuple(members),
            known,
            frozenset(member.node_id for member in registered),
            stored_id or self._derived_id,
        )


class MembershipChange(Protocol):
    """What the Raft node offers for a membership change (RaftNode implements it)."""

    def change_membership(
        self, kind: str, raft_address: str, callback: Callable[[ApplyResult | None, int], None]
    ) -> None:
        """Proposes adding ("add") or removing ("remove") a voter."""

    def hand_over_leadership(self, callback: Callable[[ApplyResult | None, int], None]) -> None:
        """Asks the most caught-up follower to take over the leadership."""


Probe = Callable[[str, float], kq_pb2.ClusterStatusResponse]


def node_channel(grpc_address: str, credentials: grpc.ChannelCredentials | None) -> grpc.Channel:
    """A channel from this node to another node's process: with the node's own TLS as a client
    (None: plain text)."""
    if credentials is None:
        return grpc.insecure_channel(grpc_address)
    return grpc.secure_channel(grpc_address, credentials)


def probe_node(
    grpc_address: str,
    timeout_s: float,
    credentials: grpc.ChannelCredentials | None = None,
    metadata: tuple[tuple[str, str], ...] = (),
) -> kq_pb2.ClusterStatusResponse:
    """Asks the node at `grpc_address` for its status (raises grpc.RpcError when it does not answer);
    `credentials`: the node's own TLS as a client (None: plain text); `metadata`: its node proof
    (broker/auth.py), so a node requiring authentication answers."""
    with node_channel(grpc_address, credentials) as channel:
        response: kq_pb2.ClusterStatusResponse = kq_pb2_grpc.BrokerStub(channel).ClusterStatus(
            kq_pb2.ClusterStatusRequest(), timeout=timeout_s, metadata=metadata
        )
        return response


class MembershipChanges:
    """AddNode and RemoveNode on the leader (the caller checked that this node leads)."""

    def __init__(
        self,
        raft: MembershipChange,
        consensus: Consensus,
        membership: Membership,
        kafka: bool,
        probe: Probe = probe_node,
        groups: int = 1,
    ) -> None:
        """`kafka`: the cluster serves Kafka, so a new node needs an integer id and a Kafka address;
        `groups`: the Raft groups of the cluster (its nodes' worker processes), so a new node must run
        as many (broker/group_membership.py changes the others)."""
        self._raft = raft
        self._consensus = consensus
        self._membership = membership
        self._kafka = kafka
        self._probe = probe
        self._groups = groups
        self._changing = threading.Lock()  # One change at a time on this node.

    def add(self, member: kq_pb2.Member, before: Callable[[], None] | None = None) -> MembershipView:
        """Adds `member` to the voters; returns the view afterwards. Adding a member again is no error.
        `before`: called once the change is checked and `member` registered, before the change is made
        here (the other Raft groups' changes, broker/group_membership.py); not called when `member` is
        a voter already."""
        problem = cluster_member_problem(member)
        if problem is None and self._kafka and not (member.node_id.isdigit() and member.kafka_address):
            problem = "this cluster serves Kafka: a node needs an integer id and a Kafka address"
        check(problem)
        with self._one_change():
            view = self._membership.view
            current = view.member(member.node_id)
            if current is not None:
                if current.raft_address != member.raft_address:
                    raise MembershipError(
                        f"node {member.node_id} is a member already, at {current.raft_address}"
                    )
                return view
            holder = view.known.get(member.raft_address)
            if holder is not None and holder in view.members:
                raise MembershipError(f"{member.raft_address} is the Raft address of node {holder.node_id}")
            if len(view.members) >= PEERS_MAX:
                raise MembershipError(f"the cluster has its maximum of {PEERS_MAX} nodes")
            self._check_answers(member)
            self._check_majority(len(view.members) + 1, self._running(view, excluding="") + 1, "adding")
            result = propose_and_wait(
                self._consensus, commands.register_member(member, view.cluster_id), PROPOSAL_TIMEOUT_S
            )
            _raise_for(result, member.node_id)
            if before is not None:  # Registered first: every process can name it while groups change.
                before()
            self._change("add", member.raft_address)
            logger.info("added node %s (Raft %s) to the cluster", member.node_id, member.raft_address)
            return self._membership.view

    def remove(
        self, node_id: str, before: Callable[[], None] | None = None, missing_ok: bool = False
    ) -> MembershipView:
        """Removes node `node_id` from the voters (it may be down) and forgets its addresses.

        `before`: called once the change is checked, before it is made here, and also when `node_id`
        is no voter here (the other groups' part of a removal cut short is done then); `missing_ok`: a
        node unknown here is removed already, not an error (one group's part of a change retried:
        broker/group_membership.py)."""
        check(node_id_problem(node_id))
        with self._one_change():
            view = self._membership.view
            target = view.member(node_id)
            if target is None:
                if before is not None:  # The other groups' part of a removal cut short, or none.
                    before()
                if node_id in view.registered:
                    self._forget(node_id)  # A removal cut short before its addresses were forgotten.
                elif not missing_ok and node_id not in {peer.node_id for peer in view.known.values()}:
                    raise MembershipError(f"node {node_id} is not a member of the cluster")
                return self._membership.view  # Removed already (a retry after the leader died).
            if node_id == view.self_id:
                self._hand_over()
            remaining = len(view.members) - 1
            self._check_majority(remaining, self._running(view, excluding=node_id), "removing")
            if before is not None:
                before()
            self._change("remove", target.raft_address)
            self._forget(node_id)
            logger.info("removed node %s (Raft %s) from the cluster", node_id, target.raft_address)
            return self._membership.view

    @contextmanager
    def _one_change(self) -> Iterator[None]:
        if not self._changing.acquire(blocking=False):
            raise UnavailableError(
                "another membership change is in progress on this node; retry",
                ErrorCode.MEMBERSHIP_CHANGE_PENDING,
            )
        try:
            yield
        finally:
            self._changing.release()

    def _check_answers(self, member: kq_pb2.Member) -> None:
        """The new node must be running and be the node asked for (a typo must not cost a vote)."""
        try:
            status = self._probe(member.grpc_address, MEMBER_PROBE_TIMEOUT_S)
        except grpc.RpcError as error:
            raise MembershipError(
                f"node {member.node_id} does not answer at {member.grpc_address} ({error.code().name}): "
                "start it first, with --join"
            ) from error
        if status.node_id != member.node_id or (
            status.raft_address and status.raft_address != member.raft_address
        ):
            raise MembershipError(
                f"the node at {member.grpc_address} is node {status.node_id} with Raft address "
                f"{status.raft_address}, not node {member.node_id} at {member.raft_address}"
            )
        if max(status.groups, 1) != self._groups:
            raise MembershipError(
                f"node {member.node_id} runs {max(status.groups, 1)} Raft groups and this cluster "
                f"{self._groups}: start it with --processes {self._groups}"
            )

    def _running(self, view: MembershipView, excluding: str) -> int:
        """Voters this leader is connected to, itself included, except `excluding`."""
        connected = self._consensus.status().connected
        return 1 + sum(
            1 for peer in view.peers if peer.node_id != excluding and connected.get(peer.node_id, False)
        )

    @staticmethod
    def _check_majority(voters: int, running: int, doing: str) -> None:
        if running <= voters // 2:
            raise MembershipError(
                f"{doing} it would leave {running} of {voters} voters running, no majority: "
                "bring members back first"
            )

    def _hand_over(self) -> None:
        """This leader is to be removed: another node leads first; the client retries there."""
        done: Future[int] = Future()
        self._raft.hand_over_leadership(lambda _result, reason: done.set_result(reason))
        try:
            reason = done.result(timeout=capped(PROPOSAL_TIMEOUT_S))
        except TimeoutError:  # The tick thread did not get to it (the node is stopping).
            reason = -1
        if reason != 0:
            raise UnavailableError(
                "this node leads and no follower is caught up to take over; retry", ErrorCode.NOT_COMMITTED
            )
        deadline = time.monotonic() + capped(PROPOSAL_TIMEOUT_S)
        while time.monotonic() < deadline:
            leader = None if self._consensus.is_leader() else self._consensus.leader_grpc_address()
            if leader is not None:
                raise NotLeaderError(leader)
            time.sleep(LEADERSHIP_CHECK_S)
        raise UnavailableError("the leadership is being handed over; retry", ErrorCode.LEADER_UNKNOWN)

    def _change(self, kind: str, raft_address: str) -> None:
        """Proposes the MEMBERSHIP entry and waits until it committed."""
        future: Future[None] = Future()

        def on_result(_result: ApplyResult | None, reason: int) -> None:
            if reason == 0:
                future.set_result(None)
            elif reason == PYSYNCOBJ_REQUEST_DENIED:
                future.set_exception(
                    UnavailableError(
                        "the previous membership change (or this leader's first entry) has not committed "
                        "yet; retry",
                        ErrorCode.MEMBERSHIP_CHANGE_PENDING,
                    )
                )
            else:
                future.set_exception(
                    UnavailableError(f"membership change not committed (reason {reason}); retry")
                )

        self._raft.change_membership(kind, raft_address, on_result)
        wait_result(future, MEMBERSHIP_CHANGE_TIMEOUT_S, self._consensus)

    def _forget(self, node_id: str) -> None:
        result = propose_and_wait(self._consensus, commands.unregister_member(node_id), PROPOSAL_TIMEOUT_S)
        _raise_for(result, node_id)


def _raise_for(result: ApplyResult, node_id: str) -> None:
    assert isinstance(result, MemberResult)
    if result.error != ErrorCode.OK:
        raise MembershipError(
            f"node {node_id}: an address is another registered member's, or the cluster holds its "
            "maximum of registered members"
        )


def peer_statuses(
    peers: Iterable[Peer], connected: Mapping[str, bool], match_indexes: Mapping[str, int], self_id: str = ""
) -> list[kq_pb2.PeerStatus]:
    """Members as PeerStatus rows: this node's connections to them (`self_id` counts as connected) and,
    on the leader, their match indexes."""
    return [
        kq_pb2.PeerStatus(
            node_id=peer.node_id,
            grpc_address=peer.grpc_address,
            raft_address=peer.raft_address,
            connected=peer.node_id == self_id or connected.get(peer.node_id, False),
            kafka_address=peer.kafka_address,
            rack=peer.rack,
            match_index=match_indexes.get(peer.node_id, 0),
        )
        for peer in peers
    ]
