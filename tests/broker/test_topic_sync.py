"""broker/topic_sync.py's plan: a group's copy of the topics brought to group 0's by ordinary commands,
each idempotent by topic id, so a copy interrupted at any command (a leader killed mid-round) is
completed by the next round, and applying a plan twice changes nothing more."""

from __future__ import annotations

from pathlib import Path

from kq.broker.topic_sync import TopicCopy, sync_plan, topic_copies
from kq.raft import commands
from kq.raft.state_machine import GroupScope, apply
from kq.storage import Store

COPY_SCOPE = GroupScope(allocates_producer_ids=False, holds_every_partition=False)


def group0_topics(tmp_path: Path, *created: tuple[str, int, dict[str, str]]) -> Store:
    """A store of group 0 holding `created` (name, partitions, overrides), ids from 1."""
    store = Store.open(tmp_path / "group0", map_size_bytes=64 * 1024**2)
    for index, (name, partitions, overrides) in enumerate(created, start=1):
        apply(store, index, commands.encode(commands.create_topic(name, partitions, 5, overrides, groups=3)))
    return store


def converge(copy: Store, source: Store, first_index: int, rounds: int, cut_after: int | None = None) -> int:
    """Runs `rounds` sync rounds against `copy`, applying each plan (the first round only `cut_after`
    of its commands, as a leader killed mid-round); returns the next Raft index."""
    index = first_index
    for round_number in range(rounds):
        with source.read() as reader:
            wanted = topic_copies(reader)
        with copy.read() as reader:
            plan = sync_plan(wanted, topic_copies(reader))
        if round_number == 0 and cut_after is not None:
            plan = plan[:cut_after]
        for command in plan:
            apply(copy, index, commands.encode(command), COPY_SCOPE)
            index += 1
    return index


def test_a_copy_takes_group_0s_ids_configs_and_group_counts_then_nothing_is_left(tmp_path: Path) -> None:
    """Created with group 0's ids, creation times, overrides and group counts; nothing left to do."""
    source = group0_topics(tmp_path, ("a", 2, {"retention.ms": "1000"}), ("b", 1, {}))
    copy = Store.open(tmp_path / "copy", map_size_bytes=64 * 1024**2)
    converge(copy, source, 1, 1)
    with source.read() as wanted, copy.read() as have:
        assert topic_copies(have) == topic_copies(wanted)
        assert [(t.name, t.topic_id, t.groups) for t in have.topics()] == [("a", 1, 3), ("b", 2, 3)]
        assert sync_plan(topic_copies(wanted), topic_copies(have)) == []


def test_a_round_cut_short_is_completed_by_the_next(tmp_path: Path) -> None:
    """A leader killed after the first command of a round: the next round's plan finishes the copy."""
    source = group0_topics(tmp_path, ("a", 2, {}), ("b", 1, {}), ("c", 4, {"cleanup.policy": "compact"}))
    copy = Store.open(tmp_path / "copy", map_size_bytes=64 * 1024**2)
    converge(copy, source, 1, 2, cut_after=1)
    with source.read() as wanted, copy.read() as have:
        assert topic_copies(have) == topic_copies(wanted)


def test_a_topic_recreated_in_group_0_is_deleted_then_created_again_by_id() -> None:
    """Same name, another id: deleted by its old id first, created with the new one a round later;
    overrides that differ are set and removed; a topic group 0 no longer has is deleted by id."""
    wanted = {
        "same": TopicCopy(1, 1, 5, {"retention.ms": "10"}),
        "again": TopicCopy(9, 2, 7, {}),
    }
    have = {
        "same": TopicCopy(1, 1, 5, {"retention.ms": "20", "cleanup.policy": "compact"}),
        "again": TopicCopy(4, 2, 6, {}),
        "gone": TopicCopy(3, 1, 5, {}),
    }
    plan = sync_plan(wanted, have)
    kinds = [(command.WhichOneof("kind"), command) for command in plan]
    deletes = [(c.delete_topic.name, c.delete_topic.topic_id) for kind, c in kinds if kind == "delete_topic"]
    assert deletes == [("again", 4), ("gone", 3)]
    alters = [c.alter_topic_config for kind, c in kinds if kind == "alter_topic_config"]
    assert [(a.topic, [(e.name, e.value) for e in a.set], list(a.remove)) for a in alters] == [
        ("same", [("retention.ms", "10")], ["cleanup.policy"])
    ]
    assert not any(kind == "create_topic" for kind, _ in kinds)  # "again" exists (old id) this round.
    next_round = sync_plan(wanted, {"same": wanted["same"]})  # Once the old "again" is gone.
    assert [c.create_topic.topic_id for c in next_round if c.HasField("create_topic")] == [9]


def test_a_topic_grown_in_group_0_grows_in_the_copy_by_id(tmp_path: Path) -> None:
    """A topic group 0 grew (CreatePartitions) grows in the copy to the same count, its id checked;
    the copy's existing partitions keep their offsets, and a grow applied twice changes nothing."""
    source = group0_topics(tmp_path, ("a", 2, {}))
    copy = Store.open(tmp_path / "copy", map_size_bytes=64 * 1024**2)
    index = converge(copy, source, 1, 1)
    apply(source, 2, commands.encode(commands.grow_partitions("a", 5)))
    with source.read() as wanted, copy.read() as have:
        plan = sync_plan(topic_copies(wanted), topic_copies(have))
    assert [
        (c.grow_partitions.topic, c.grow_partitions.partitions, c.grow_partitions.topic_id) for c in plan
    ] == [("a", 5, 1)]
    index = converge(copy, source, index, 1)
    apply(copy, index, commands.encode(plan[0]), COPY_SCOPE)  # Again: refused alike, nothing changes.
    with source.read() as wanted, copy.read() as have:
        assert topic_copies(have) == topic_copies(wanted)
        topic = have.topic("a")
        assert topic is not None and topic.partitions == 5
        assert [have.partition(topic.topic_id, p) is not None for p in range(6)] == [True] * 5 + [False]
