"""The seam between the broker and Raft: a Protocol the servicers use, and its PySyncObj implementation."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from kq.raft.node import RaftNode
from kq.raft.results import ApplyResult

PYSYNCOBJ_SUCCESS = 0  # pysyncobj.FAIL_REASON.SUCCESS
# The role of a node a leader told it is not a voter (removed, still running): ClusterStatus, /readyz,
# kq cluster status and the metrics show it (DESIGN.md, "A removed node").
REMOVED_ROLE = "removed"


@dataclass(frozen=True, slots=True)
class Peer:
    """A cluster member as configured: its id, Raft address, gRPC address, Kafka listener ("": none) and
    rack (Kafka's broker.rack, "": none)."""

    node_id: str
    raft_address: str
    grpc_address: str
    kafka_address: str = ""
    rack: str = ""


@dataclass(frozen=True, slots=True)
class ConsensusStatus:
    """What `kq cluster status` shows for one node."""

    role: str  # "leader", "follower", "candidate" or REMOVED_ROLE.
    leader_id: str
    leader_address: str
    term: int
    commit_index: int
    applied_index: int
    connected: dict[str, bool]  # Peer node id -> connected.
    ready: bool
    log_entries: int
    # Peer node id -> the last Raft index it is known to hold (the leader's match index; 0: not heard).
    match_indexes: dict[str, int] = field(default_factory=dict)


class Consensus(Protocol):
    """What the broker needs from Raft; a fake implements it in the in-process tests."""

    def propose(self, data: bytes, callback: Callable[[ApplyResult | None, int], None]) -> None:
        """Queues `data`; `callback(result, reason)` runs once it committed (reason 0) or failed."""

    def is_leader(self) -> bool:
        """Whether this node believes it leads (a hint; only a commit is proof)."""

    def leader_grpc_address(self) -> str | None:
        """The gRPC address of the leader this node knows of, if any."""

    def status(self) -> ConsensusStatus:
        """A snapshot of this node's Raft state."""

    def term(self) -> int:
        """This replica's current Raft term (cheap: the Kafka leader epoch of its partitions)."""


class MembersView(Protocol):
    """What the consensus reads of the members as one node knows them (broker/membership.py
    `MembershipView`): a Protocol here, so that membership, which proposes through a Consensus,
    is imported by no module it imports."""

    @property
    def known(self) -> Mapping[str, Peer]:
        """Every node whose addresses are known, by Raft address."""
        ...

    @property
    def peers(self) -> tuple[Peer, ...]:
        """The other voters."""
        ...


class MembersSource(Protocol):
    """The latest `MembersView` (broker/membership.py `Membership`)."""

    @property
    def view(self) -> MembersView:
        """The latest view (any thread)."""
        ...


class PySyncObjConsensus:
    """Consensus over a RaftNode, mapping Raft addresses to members (broker/membership.py)."""

    def __init__(self, node: RaftNode, membership: MembersSource) -> None:
        self._node = node
        self._membership = membership

    def propose(self, data: bytes, callback: Callable[[ApplyResult | None, int], None]) -> None:
        """Queues `data` with PySyncObj."""
        self._node.propose(data, callback)

    def is_leader(self) -> bool:
        """PySyncObj's leader flag."""
        return self._node.is_leader()

    def _leader(self) -> Peer | None:
        address = self._node.leader_address()
        return None if address is None else self._membership.view.known.get(address)

    def leader_grpc_address(self) -> str | None:
        """The known leader's gRPC address."""
        leader = self._leader()
        return None if leader is None else leader.grpc_address

    def term(self) -> int:
        """PySyncObj's current term."""
        return self._node.current_term()

    def status(self) -> ConsensusStatus:
        """Reads PySyncObj's status dictionary."""
        raw = self._node.status()
        leader = self._leader()
        peers = self._membership.view.peers
        role = {0: "follower", 1: "candidate", 2: "leader"}.get(int(raw["state"]), "unknown")
        removed = self._node.removal() is not None
        if removed:  # A leader told it so: it no longer stands for election (DESIGN.md, "A removed node").
            role = REMOVED_ROLE
        return ConsensusStatus(
            role=role,
            leader_id=leader.node_id if leader else "",
            leader_address=leader.grpc_address if leader else "",
            term=int(raw["raft_term"]),
            commit_index=int(raw["commit_idx"]),
            applied_index=int(raw["last_applied"]),
            connected={
                peer.node_id: raw.get(f"partner_node_status_server_{peer.raft_address}", 0) == 2
                for peer in peers
            },
            ready=bool(self._node.isReady()) and not removed,
            log_entries=int(raw["log_len"]),
            match_indexes={
                peer.node_id: int(raw.get(f"match_idx_server_{peer.raft_address}", 0)) for peer in peers
            },
        )
