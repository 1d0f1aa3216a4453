"""Placement of partitions on Raft groups, and of group leadership on nodes: pure functions.

Scale-out (issue 37, DESIGN.md "Scale-out: many Raft groups") splits the cluster's data over many
Raft groups numbered from 0; group 0 (`METADATA_GROUP`) also holds the cluster's state (topics,
configs, users, ACLs, members) that the others copy (broker/topic_sync.py). Everything here is
a function of its arguments alone: no clock, no randomness, no I/O, so every node that computes a
placement or a leadership plan from the same view gets the same answer, and `apply` may call the
placement functions on values its entry carries (the one rule).

- `partition_groups`: the group of each partition of a topic. A topic's partitions go round-robin
  over the groups starting at the group its id names, so consecutive topics
  start at consecutive groups and a topic with at least as many partitions as groups touches every
  group. A cluster's group count is fixed, so the map is a function of the topic alone.
- `coordinator_group`: the group that holds a consumer group's state and committed offsets,
  by a stable hash of its name (as Kafka's `__consumer_offsets` partition: the name's hash modulo the
  partition count). CRC32, not Python's `hash`, which differs between processes.
- `leader_moves`: the leadership transfers that bring every node to ⌊G/N⌋ or ⌈G/N⌉ of the G led
  groups; none when the spread is already within one (so a balanced cluster never moves a leader:
  no flapping), and at most `moves_max` per plan (bounded disruption: each transfer is a short
  election of its group).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kq.proto.limits import PARTITIONS_MAX, RAFT_GROUPS_MAX

METADATA_GROUP = 0  # Topics, configs, members, users, ACLs, producer ids: KRaft's controller quorum.


def partition_groups(topic_id: int, partitions: int, groups: int) -> tuple[int, ...]:
    """The Raft group (0..groups-1) of each partition 0..partitions-1 of the topic `topic_id`."""
    if not 1 <= groups <= RAFT_GROUPS_MAX:
        raise ValueError(f"groups must be 1..{RAFT_GROUPS_MAX}, not {groups}")
    if not 0 <= partitions <= PARTITIONS_MAX:
        raise ValueError(f"partitions must be 0..{PARTITIONS_MAX}, not {partitions}")
    if topic_id < 0:
        raise ValueError(f"topic ids are not negative: {topic_id}")
    start = topic_id % groups
    return tuple((start + partition) % groups for partition in range(partitions))


def partition_group(topic_id: int, partition: int, groups: int) -> int:
    """The Raft group of one partition (`partition_groups`' entry for it)."""
    return (topic_id % groups + partition) % groups


def coordinator_group(group_name: str, groups: int) -> int:
    """The Raft group (0..groups-1) that coordinates the consumer group `group_name`."""
    if not 1 <= groups <= RAFT_GROUPS_MAX:
        raise ValueError(f"groups must be 1..{RAFT_GROUPS_MAX}, not {groups}")
    return zlib.crc32(group_name.encode("utf-8")) % groups


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
