"""Leader balancing: each node moves the leadership of the Raft groups it leads until every running
node leads ⌊G/N⌋ or ⌈G/N⌉ of them (issue 37, "Leaders spread"; DESIGN.md "Scale-out").

Nobody coordinates the moves. Every node computes the same plan (raft/placement.py `leader_moves`,
a pure function of the leaders it sees and the running nodes, ties broken by node order and group
number) and carries out the moves whose source is itself: only a group's leader can hand its
leadership over (PySyncObj's `transferLeadership`, which refuses a target that lacks part of the
log). Views differ only while leadership changes, and a node acts only on a view that has stayed
the same for `settle_s`: elections finish first, and a node that just came back is not a target
until its groups have their leaders again. After a round that moved leaders the next waits
`cooldown_s`. A balanced view moves nothing, so leadership never flaps between balanced states.

Thread: `kq-leader-balance`, started by `start()`, one `step()` every `period_s`, joined by `stop()`.
It owns the balancer's state (the view it last saw, since when, the next round's earliest time);
the `GroupLeadership` it reads must be safe to call from it (RaftNode's status and hand-over are).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kq.broker.background import BackgroundThread
from kq.broker.groups_view import GroupsView
from kq.broker.membership import MembershipView
from kq.proto.limits import (
    LEADER_BALANCE_PERIOD_S,
    LEADER_BALANCE_SETTLE_S,
    LEADER_MOVE_COOLDOWN_S,
    LEADER_MOVES_PER_ROUND,
)
from kq.raft.node import RaftNode
from kq.raft.placement import LeaderMove, balanced, leader_moves

logger = logging.getLogger(__name__)

THREAD_NAME = "kq-leader-balance"
PARTNER_CONNECTED = 2  # PySyncObj's status value of a connected partner (CONNECTION_STATE.CONNECTED).


@dataclass(frozen=True, slots=True)
class LeadershipView:
    """What one node sees: each group's leader (a node id; None while it elects), the running nodes
    in the cluster's node order, and the nodes each group may move to (its voters among them)."""

    leaders: Mapping[int, str | None]
    nodes: Sequence[str]
    eligible: Mapping[int, frozenset[str]] = field(default_factory=dict)
    # The groups whose leadership this process can hand over (None: every group it sees): a worker
    # process holds one group, and its node's other workers move theirs.
    local: frozenset[int] | None = None


class GroupLeadership(Protocol):
    """The Raft groups of one node, as the balancer needs them."""

    def view(self) -> LeadershipView:
        """The leaders, running nodes and eligible targets this node sees now."""

    def transfer(self, group: int, target: str) -> None:
        """Asks this node's replica of `group`, its leader, to hand leadership to node `target`."""


class LeaderBalancer(BackgroundThread):
    """Moves the leadership of this node's groups to even out the leaders per running node; its thread
    (`start()`, `stop()`: broker/background.py) runs `step()` every `period_s`."""

    thread_name = THREAD_NAME

    def __init__(
        self,
        node_id: str,
        leadership: GroupLeadership,
        clock: Callable[[], float] = time.monotonic,
        settle_s: float = LEADER_BALANCE_SETTLE_S,
        cooldown_s: float = LEADER_MOVE_COOLDOWN_S,
        moves_max: int = LEADER_MOVES_PER_ROUND,
        period_s: float = LEADER_BALANCE_PERIOD_S,
    ) -> None:
        self._node_id = node_id
        self._leadership = leadership
        self._clock = clock
        self._settle_s = settle_s
        self._cooldown_s = cooldown_s
        self._moves_max = moves_max
        self._period_s = period_s
        self._seen: LeadershipView | None = None
        self._seen_since = 0.0
        self._next_round = float("-inf")
        self.moves_started = 0  # Transfers this node asked for since it started (a metric).
        super().__init__()

    def step(self) -> tuple[LeaderMove, ...]:
        """One round: the moves this node started (none while the view is balanced, changing or too
        recent, or within the cooldown of the last round that moved leaders)."""
        view = self._leadership.view()
        now = self._clock()
        if view != self._seen:
            self._seen, self._seen_since = view, now
        if balanced(view.leaders, view.nodes):
            return ()
        if now - self._seen_since < self._settle_s or now < self._next_round:
            return ()
        plan = leader_moves(view.leaders, view.nodes, view.eligible, self._moves_max)
        mine = tuple(
            move
            for move in plan
            if move.source == self._node_id and (view.local is None or move.group in view.local)
        )
        for move in mine:
            self._leadership.transfer(move.group, move.target)
        if mine:
            self._next_round = now + self._cooldown_s
            self.moves_started += len(mine)
            logger.info(
                "node %s hands over the leadership of %s",
                self._node_id,
                ", ".join(f"group {move.group} to {move.target}" for move in mine),
            )
        return mine

    def _run(self) -> None:
        while not self._stopping.wait(self._period_s):
            self.step()


def partner_connected(status: Mapping[str, Any], raft_address: str) -> bool:
    """Whether PySyncObj's status dictionary says the partner at `raft_address` is connected."""
    return bool(status.get(f"partner_node_status_server_{raft_address}", 0) == PARTNER_CONNECTED)


class RaftGroupLeadership:
    """`GroupLeadership` over this node's RaftNodes, one per group.

    `addresses[node_id][group]` is the Raft address of that node's replica of the group (each
    PySyncObj instance binds its own port). A node counts as running when it is this node or one of
    this node's replicas is connected to its replica of the same group; its voters are eligible."""

    def __init__(
        self, node_id: str, groups: Mapping[int, RaftNode], addresses: Mapping[str, Mapping[int, str]]
    ) -> None:
        self._node_id = node_id
        self._groups = groups
        self._addresses = addresses
        self._node_of = {
            address: node for node, by_group in addresses.items() for address in by_group.values()
        }

    def view(self) -> LeadershipView:
        """Reads each group's status (any thread)."""
        leaders: dict[int, str | None] = {}
        running = {self._node_id}
        voters: dict[int, frozenset[str]] = {}
        for group, raft in sorted(self._groups.items()):
            status = raft.status()
            leader = raft.leader_address()
            leaders[group] = None if leader is None else self._node_of.get(leader)
            for node, by_group in self._addresses.items():
                address = by_group.get(group)
                if address is not None and partner_connected(status, address):
                    running.add(node)
            voters[group] = frozenset(self._node_of[a] for a in raft.voters() if a in self._node_of)
        nodes = [node for node in self._addresses if node in running]
        eligible = {
            group: frozenset(node for node in members if node in running) for group, members in voters.items()
        }
        return LeadershipView(leaders, nodes, eligible)

    def transfer(self, group: int, target: str) -> None:
        """Asks this node's replica of `group` to hand leadership to `target`'s replica; a refusal
        (not the leader any more, the target not caught up) is retried by a later round."""
        self._groups[group].hand_over_leadership(
            lambda _result, _reason: None, self._addresses[target][group]
        )


class WorkerLeadership:
    """`GroupLeadership` of one worker process (broker/workers.py): every group's leader from the
    node's leader board (broker/groups_view.py), the running nodes from this process's Raft
    connections in its own group, and hand-overs of its own group only."""

    def __init__(self, groups: GroupsView, raft: RaftNode, view: Callable[[], MembershipView]) -> None:
        self._groups = groups
        self._raft = raft
        self._view = view

    def view(self) -> LeadershipView:
        """The leaders, the running nodes (this one and those its group's replica is connected to)."""
        members = self._view()
        connected = set(self._connected(members))
        nodes = [
            peer.node_id
            for peer in members.members
            if peer.node_id == members.self_id or peer.node_id in connected
        ]
        leaders = {leader.group: leader.leader_id or None for leader in self._groups.leaders()}
        running = frozenset(nodes)
        return LeadershipView(
            leaders, nodes, dict.fromkeys(leaders, running), frozenset((self._groups.group,))
        )

    def _connected(self, members: MembershipView) -> list[str]:
        """The other members this process's replica is connected to, by PySyncObj's status."""
        status = self._raft.status()
        return [
            peer.node_id
            for peer in members.peers
            if partner_connected(status, peer.raft_address)
        ]

    def transfer(self, group: int, target: str) -> None:
        """Asks this process's replica, its group's leader, to hand over to `target`'s process."""
        assert group == self._groups.group, "a worker moves its own group only"
        peer = self._view().member(target)
        if peer is not None:
            self._raft.hand_over_leadership(lambda _result, _reason: None, peer.raft_address)
