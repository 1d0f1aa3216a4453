"""Assignors: every partition to exactly one subscribed member, balanced within one, sticky keeps owners."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kq.raft.assignors import ASSIGNORS, Assignment, assign_sticky

members_strategy = st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=7, unique=True)
partitions_strategy = st.dictionaries(st.sampled_from(["t1", "t2", "t3"]), st.integers(1, 12), min_size=1)


def owners(assignment: Assignment) -> dict[tuple[str, int], list[str]]:
    result: dict[tuple[str, int], list[str]] = {}
    for member, owned in assignment.items():
        for tp in owned:
            result.setdefault(tp, []).append(member)
    return result


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
@given(members=members_strategy, partitions=partitions_strategy)
def test_every_partition_has_exactly_one_owner_and_load_is_balanced(
    name: str, members: list[str], partitions: dict[str, int]
) -> None:
    """With one subscription for all, each partition has one owner and counts differ by at most one
    (range balances per topic, so across topics it is checked per topic)."""
    subscriptions = {m: frozenset(partitions) for m in members}
    assignment = ASSIGNORS[name](subscriptions, partitions, {})
    assert set(assignment) == set(members)
    every = {(t, p) for t, count in partitions.items() for p in range(count)}
    assert {tp: len(o) for tp, o in owners(assignment).items()} == dict.fromkeys(every, 1)
    if name == "range":
        for topic in partitions:
            counts = [sum(1 for t, _ in owned if t == topic) for owned in assignment.values()]
            assert max(counts) - min(counts) <= 1
    else:
        counts = [len(owned) for owned in assignment.values()]
        assert max(counts) - min(counts) <= 1


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
@given(members=members_strategy, partitions=partitions_strategy, data=st.data())
def test_partitions_only_go_to_subscribed_members(
    name: str, members: list[str], partitions: dict[str, int], data: st.DataObject
) -> None:
    """Differing subscriptions: a partition goes to one member subscribed to its topic, if any."""
    subscriptions = {m: frozenset(data.draw(st.sets(st.sampled_from(sorted(partitions))))) for m in members}
    assignment = ASSIGNORS[name](subscriptions, partitions, {})
    for (topic, _), owned_by in owners(assignment).items():
        assert len(owned_by) == 1 and topic in subscriptions[owned_by[0]]
    subscribed_topics = set().union(*subscriptions.values())
    expected = {(t, p) for t in subscribed_topics for p in range(partitions[t])}
    assert set(owners(assignment)) == expected


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
@given(members=members_strategy, partitions=partitions_strategy)
def test_assignors_are_deterministic(name: str, members: list[str], partitions: dict[str, int]) -> None:
    """Same input, same output, whatever the order members are listed in (replicas must agree)."""
    forward = {m: frozenset(partitions) for m in members}
    backward = {m: frozenset(partitions) for m in reversed(members)}
    assert ASSIGNORS[name](forward, partitions, {}) == ASSIGNORS[name](backward, partitions, {})


@given(members=members_strategy, partitions=partitions_strategy, data=st.data())
def test_sticky_keeps_every_owner_it_can_when_a_member_leaves(
    members: list[str], partitions: dict[str, int], data: st.DataObject
) -> None:
    """When a member leaves, every partition of the members that stay keeps its owner."""
    subscriptions = {m: frozenset(partitions) for m in members}
    before = assign_sticky(subscriptions, partitions, {})
    leaving = data.draw(st.sampled_from(members))
    staying = {m: s for m, s in subscriptions.items() if m != leaving}
    after = assign_sticky(staying, partitions, before)
    for member in staying:
        assert set(before[member]) <= set(after[member])


@given(members=members_strategy, partitions=partitions_strategy)
def test_sticky_moves_only_what_balance_needs_when_a_member_joins(
    members: list[str], partitions: dict[str, int]
) -> None:
    """When a member joins, only partitions beyond the old members' new quotas move."""
    subscriptions = {m: frozenset(partitions) for m in members}
    before = assign_sticky(subscriptions, partitions, {})
    after = assign_sticky({**subscriptions, "zz-new": frozenset(partitions)}, partitions, before)
    total = sum(partitions.values())
    quota_max = -(-total // (len(members) + 1))
    for member in members:
        kept = set(before[member]) & set(after[member])
        assert len(kept) >= min(len(before[member]), quota_max - 1)
