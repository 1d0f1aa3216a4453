"""raft/placement.py: partitions spread over Raft groups, and leadership plans that even out leaders
per node without ever moving a balanced cluster."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kq.proto.limits import PARTITIONS_MAX, RAFT_GROUPS_MAX
from kq.raft.placement import (
    balanced,
    leader_counts,
    leader_moves,
    partition_group,
    partition_groups,
)

NODES = ("a", "b", "c", "d", "e")


@given(st.integers(0, 2**40), st.integers(0, 200), st.integers(1, 64))
def test_a_topic_spreads_its_partitions_evenly_over_the_data_groups(
    topic_id: int, partitions: int, groups: int
) -> None:
    """Each partition gets a group 0..G-1; the groups' shares differ by at most one; same input, same
    map; `partition_group` answers the same for one partition."""
    placed = partition_groups(topic_id, partitions, groups)
    assert len(placed) == partitions
    assert all(0 <= group < groups for group in placed)
    assert placed == tuple(partition_group(topic_id, partition, groups) for partition in range(partitions))
    shares = Counter(placed)
    used = min(partitions, groups)
    assert len(shares) == used
    if shares:
        assert max(shares.values()) - min(shares.values()) <= 1
    assert placed == partition_groups(topic_id, partitions, groups)


def test_consecutive_topics_start_at_consecutive_groups() -> None:
    """One-partition topics do not all land on the same group: topic ids rotate the start."""
    firsts = [partition_groups(topic_id, 1, 6)[0] for topic_id in range(1, 13)]
    assert Counter(firsts) == Counter(dict.fromkeys(range(6), 2))


def test_placement_refuses_out_of_range_arguments() -> None:
    """A group count, partition count or topic id outside its limit is a programming error, named."""
    with pytest.raises(ValueError, match="groups"):
        partition_groups(1, 3, 0)
    with pytest.raises(ValueError, match="groups"):
        partition_groups(1, 3, RAFT_GROUPS_MAX + 1)
    with pytest.raises(ValueError, match="partitions"):
        partition_groups(1, PARTITIONS_MAX + 1, 3)
    with pytest.raises(ValueError, match="topic ids"):
        partition_groups(-1, 3, 3)


leaders_strategy = st.integers(1, 5).flatmap(
    lambda count: st.tuples(
        st.just(NODES[:count]),
        st.dictionaries(st.integers(1, 40), st.sampled_from((*NODES, None)), max_size=40),
    )
)


@given(leaders_strategy)
def test_a_plan_with_every_node_eligible_balances_in_one_round(
    case: tuple[tuple[str, ...], dict[int, str | None]],
) -> None:
    """Every node ends at ⌊G/N⌋ or ⌈G/N⌉ of the led groups; each group moves once at most, from its
    leader; a balanced view yields no move (no flapping); the plan is deterministic."""
    nodes, leaders = case
    eligible = {group: frozenset(nodes) for group in leaders}
    moves = leader_moves(leaders, nodes, eligible, moves_max=len(leaders) + 1)
    assert moves == leader_moves(leaders, nodes, eligible, moves_max=len(leaders) + 1)
    after = dict(leaders)
    for move in moves:
        assert after[move.group] == move.source and move.target in nodes and move.target != move.source
        after[move.group] = move.target
    assert len({move.group for move in moves}) == len(moves)
    assert balanced(after, nodes)
    counts = leader_counts(after, nodes)
    led = sum(counts.values())
    assert all(led // len(nodes) <= count <= -(-led // len(nodes)) for count in counts.values())
    if balanced(leaders, nodes):
        assert moves == ()
    before = leader_counts(leaders, nodes)
    floor = led // len(nodes)
    # Only what is needed: a move takes from a node above the floor, so no more moves than that excess.
    assert len(moves) <= sum(max(0, count - floor) for count in before.values())


@given(leaders_strategy, st.integers(0, 3), st.data())
def test_a_plan_respects_its_bound_and_the_eligible_targets(
    case: tuple[tuple[str, ...], dict[int, str | None]], moves_max: int, data: st.DataObject
) -> None:
    """No more than `moves_max` moves, each to a node eligible for its group; never worse than before."""
    nodes, leaders = case
    eligible = {
        group: frozenset(data.draw(st.sets(st.sampled_from(nodes))))
        for group in leaders
        if data.draw(st.booleans())
    }
    moves = leader_moves(leaders, nodes, eligible, moves_max)
    assert len(moves) <= moves_max
    after = dict(leaders)
    for move in moves:
        assert move.target in eligible[move.group]
        after[move.group] = move.target
    spread_before = leader_counts(leaders, nodes).values()
    spread_after = leader_counts(after, nodes).values()
    assert sum(c * c for c in spread_after) <= sum(c * c for c in spread_before)


def test_a_returning_node_takes_back_a_fair_share() -> None:
    """Two nodes lead six groups after the third died; it returns and gets two, one from each."""
    leaders: dict[int, str | None] = {1: "a", 2: "b", 3: "a", 4: "b", 5: "a", 6: "b"}
    nodes = ("a", "b", "c")
    moves = leader_moves(leaders, nodes, {group: frozenset(nodes) for group in leaders}, moves_max=4)
    assert sorted((move.source, move.target) for move in moves) == [("a", "c"), ("b", "c")]
    assert moves == leader_moves(leaders, nodes, {group: frozenset(nodes) for group in leaders}, moves_max=4)


def test_leaders_outside_the_running_nodes_are_not_counted() -> None:
    """A group still naming a dead node as leader (its election not finished) counts for nobody."""
    leaders: dict[int, str | None] = {1: "a", 2: "dead", 3: None, 4: "b"}
    assert leader_counts(leaders, ("a", "b")) == {"a": 1, "b": 1}
    assert balanced(leaders, ("a", "b"))
