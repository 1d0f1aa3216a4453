"""Placement of partitions on Raft groups, and of group leadership on nodes: pure functions.

Scale-out (issue 37, DESIGN.md "Scale-out: many Raft groups") splits the cluster's data over many
Raft groups numbered from 0; group 0 (`METADATA_GROUP`) also holds the cluster's state (topics,
configs, users, ACLs, members) that the others copy (broker/topic_sync.py). Everything here is
a function of its arguments alone: no clock, no randomness, no I/O, so every node that computes a
placement or a leadership plan from the same view gets the same answer, and `apply` may call the
placement functions on values its entry carries (the one rule).

- `partition_groups`, `partition_group` (kq.proto.placement, shared with the client and re-exported
  here): the group of each partition of a topic.
- `leader_moves`: the leadership transfers that bring every node to ⌊G/N⌋ or ⌈G/N⌉ of the G led
  groups; none when the spread is already within one (so a balanced cluster never moves a leader:
  no flapping), and at most `moves_max` per plan (bounded disruption: each transfer is a short
  election of its group).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kq.proto.placement import partition_group, partition_groups

__all__ = [
    "METADATA_GROUP",
    "LeaderMove",
    "balanced",
    "leader_counts",
    "leader_moves",
    "partition_group",
    "partition_groups",
]

METADATA_GROUP = 0  # Topics, configs, members, users, ACLs, producer ids: KRaft's controller quorum.


@dataclass(frozen=True, slots=True)
class LeaderMove:
    """Transfer the leadership of `group` from node `source` (its leader now) to node `target`."""

    group: int
    source: str
    target: str


def leader_counts(leaders: Mapping[int, str | None], nodes: Iterable[str]) -> dict[str, int]:
    """How many groups each of `nodes` leads (0 for a node that leads none); leaders that are not
    among `nodes` (a node just removed) are not counted."""
    counts = dict.fromkeys(nodes, 0)
    for leader in leaders.values():
        if leader in counts:
            counts[leader] += 1
    return counts


def balanced(leaders: Mapping[int, str | None], nodes: Sequence[str]) -> bool:
    """Whether the nodes' leader counts differ by at most one (each leads ⌊G/N⌋ or ⌈G/N⌉ of the
    groups that have a leader among them)."""
    counts = leader_counts(leaders, nodes).values()
    return not counts or max(counts) - min(counts) <= 1


def leader_moves(
    leaders: Mapping[int, str | None],
    nodes: Sequence[str],
    eligible: Mapping[int, frozenset[str]],
    moves_max: int,
) -> tuple[LeaderMove, ...]:
    """The transfers, at most `moves_max`, that bring the leader counts of `nodes` (the running
    nodes) closest to even.

    `leaders` maps each group to the node it names as leader (None: electing). `eligible[group]` is
    the nodes that may take the group over now (its caught-up voters, from the group's leader); a
    group missing from it is not moved. Each step moves one group from the node that leads most to
    the node that leads least among those eligible for it, while the two differ by more than one;
    ties break by the order of `nodes` and by group number, so every node computes the same plan.
    A group moves at most once a plan. The result is the same for the same arguments.
    """
    order = {node: position for position, node in enumerate(nodes)}
    counts = leader_counts(leaders, nodes)
    led: dict[str, list[int]] = {node: [] for node in nodes}
    for group in sorted(leaders):
        leader = leaders[group]
        if leader in led:
            led[leader].append(group)
    moves: list[LeaderMove] = []
    while len(moves) < moves_max:
        move = _next_move(counts, led, eligible, order)
        if move is None:
            break
        moves.append(move)
        counts[move.source] -= 1
        counts[move.target] += 1
        led[move.source].remove(move.group)
    return tuple(moves)


def _next_move(
    counts: Mapping[str, int],
    led: Mapping[str, Sequence[int]],
    eligible: Mapping[int, frozenset[str]],
    order: Mapping[str, int],
) -> LeaderMove | None:
    """One transfer from a most-loaded node to a node leading at least two fewer, or None."""
    for source in sorted(counts, key=lambda node: (-counts[node], order[node])):
        for group in led[source]:
            targets = [
                node
                for node in eligible.get(group, frozenset())
                if node in counts and node != source and counts[source] - counts[node] > 1
            ]
            if targets:
                target = min(targets, key=lambda node: (counts[node], order[node]))
                return LeaderMove(group, source, target)
    return None
