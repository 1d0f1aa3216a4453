"""Fault steps: one round of one kind of fault, injected while the workload runs, then healed.

Each step starts from a healthy cluster taking writes (`steady_leader`), records a `FaultEvent`
right before injecting, waits (with deadlines) for what must follow, heals, and leaves the cluster
healthy again. Durations are drawn from the scenario's seeded random generator.
"""

from __future__ import annotations

import functools
import logging
import time

from kq.chaos.context import ScenarioContext

logger = logging.getLogger(__name__)

PAUSE_MIN_S = 2.5  # SIGSTOP lasts longer than the election timeout (1 s) and leader fallback (2 s).
PAUSE_MAX_S = 4.0
PARTITION_HOLD_MIN_S = 4.0  # Longer than the leader fallback (2 s): the cut-off leader steps down.
PARTITION_HOLD_MAX_S = 6.0
COLD_DOWN_MAX_S = 1.0  # All nodes stay dead up to this long before the cold restart.
COMPACTION_TIMEOUT_S = 90.0
COMPACTION_MARGIN_ENTRIES = 10
COMPACTION_POLL_S = 0.25
SNAPSHOT_RESTORED_LINE = "store restored from snapshot"  # Logged by raft.snapshot on restore.


def leader_kill(context: ScenarioContext) -> None:
    """`kill -9` of the leader; time to the next acknowledged write; restart it and let it catch up."""
    leader = context.steady_leader()
    event = context.fault("leader-kill", [leader], leader_fault=True)
    context.kill(leader)
    context.wait_resumed(event)
    context.heal(event, lambda: context.start(leader))
    context.wait_healthy()


def leader_pause(context: ScenarioContext) -> None:
    """SIGSTOP of the leader beyond the election timeout, then SIGCONT.

    A probe keeps writing to the paused leader: its requests queue up and reach the old leader the
    moment it wakes, which must not acknowledge anything it cannot commit (the checker verifies
    every acknowledgement).
    """
    leader = context.steady_leader()
    pause_s = context.rng.uniform(PAUSE_MIN_S, PAUSE_MAX_S)
    probe = context.start_probe(leader, pause_s)
    event = context.fault("leader-pause", [leader], leader_fault=True)
    context.pause(leader)
    new_leader = context.wait_leader_other_than(leader)
    event.notes.append(f"node {new_leader} elected while node {leader} was paused for {pause_s:.1f} s")
    context.hold(event, pause_s)
    context.heal(event, lambda: context.resume(leader))
    context.wait_resumed(event)
    context.wait_healthy()
    probe.stop()  # It finishes its request in flight by itself; the runner joins it at the end.


def follower_snapshot(context: ScenarioContext) -> None:
    """`kill -9` of a follower; restart it only after the leader compacted past it (snapshot catch-up)."""
    leader = context.steady_leader()
    follower = context.rng.choice(context.followers(leader))
    status = context.cluster.statuses()[follower]
    applied_at_kill = status.applied_index if status is not None else 0
    event = context.fault("follower-kill", [follower], leader_fault=False)
    context.kill(follower)
    context.wait_resumed(event)
    _wait_compacted_past(context, leader, applied_at_kill)
    log_path = context.cluster.log_path(follower)
    log_bytes = log_path.stat().st_size
    context.heal(event, lambda: context.start(follower))
    context.wait_healthy()
    context.wait_caught_up(follower)
    with open(log_path, "rb") as log:
        log.seek(log_bytes)
        restored = SNAPSHOT_RESTORED_LINE.encode() in log.read()
    event.notes.append(
        "caught up from a snapshot" if restored else "caught up without a snapshot (no restore logged)"
    )
    if not restored:
        context.notes.append(
            f"follower {follower} did not restore a snapshot: the leader had not compacted past it"
        )


def _wait_compacted_past(context: ScenarioContext, leader: str, applied_index: int) -> None:
    """Waits until the leader's in-RAM Raft log starts beyond `applied_index` (it compacted past it)."""

    def compacted() -> bool:
        status = context.cluster.statuses().get(leader)
        return (
            status is not None
            and status.commit_index - status.raft_log_entries > applied_index + COMPACTION_MARGIN_ENTRIES
        )

    what = f"leader {leader} to compact past index {applied_index}"
    context.until(compacted, what, COMPACTION_TIMEOUT_S, COMPACTION_POLL_S)


def cold_restart(context: ScenarioContext) -> None:
    """`kill -9` of every node at once, then all start again; time to the next acknowledged write."""
    context.steady_leader()
    nodes = list(context.cluster.nodes)
    event = context.fault("cold-restart", nodes, leader_fault=True)
    for node in nodes:  # Signal all first, so they die together rather than one reaped at a time.
        context.cluster.signal_node(node, 9)
    for node in nodes:
        context.kill(node)
    context.in_place(event)
    time.sleep(context.rng.uniform(0.0, COLD_DOWN_MAX_S))  # How long the cluster stays dark.
    context.heal(event, lambda: _start_all(context, nodes))
    context.wait_resumed(event)
    context.wait_healthy()


def _start_all(context: ScenarioContext, nodes: list[str]) -> None:
    for node in nodes:
        context.start(node)


def rolling_restart(context: ScenarioContext) -> None:
    """Restarts every node in turn (SIGTERM, then start), followers first and the leader last."""
    leader = context.steady_leader()
    for node in [*context.followers(leader), leader]:
        current = context.steady_leader()
        event = context.fault("rolling-restart", [node], leader_fault=node == current)
        context.cluster.stop_node(node)
        context.down.add(node)
        context.heal(event, functools.partial(_start_all, context, [node]))
        context.wait_resumed(event)
        context.wait_healthy()
        context.wait_caught_up(node)


def partition_leader(context: ScenarioContext) -> None:
    """Cuts the leader (plus, in a 5-node cluster, one follower) off from the majority, then heals.

    A probe keeps writing to the cut-off leader, which the client can still reach: it must not
    acknowledge anything it cannot commit.
    """
    assert context.lab is not None, "partition faults need a network lab"
    leader = context.steady_leader()
    followers = context.followers(leader)
    minority = [leader, *context.rng.sample(followers, len(context.cluster.nodes) // 2 - 1)]
    majority = [node for node in context.cluster.nodes if node not in minority]
    hold_s = context.rng.uniform(PARTITION_HOLD_MIN_S, PARTITION_HOLD_MAX_S)
    probe = context.start_probe(leader, hold_s)
    event = context.fault("partition-leader", minority, leader_fault=True)
    context.lab.partition([minority, majority])  # The minority's rules first: the leader is cut at once.
    context.in_place(event)
    new_leader = context.wait_leader_other_than(leader)
    event.notes.append(f"node {new_leader} elected in the majority {','.join(majority)}")
    context.wait_resumed(event)
    context.hold(event, hold_s)
    context.heal(event, context.lab.heal)
    context.wait_healthy()
    probe.stop()
    _wait_all_caught_up(context)


def partition_minority(context: ScenarioContext) -> None:
    """Cuts a minority of followers off; the leader's majority keeps taking writes; then heals."""
    assert context.lab is not None, "partition faults need a network lab"
    leader = context.steady_leader()
    minority = context.rng.sample(context.followers(leader), len(context.cluster.nodes) // 2)
    majority = [node for node in context.cluster.nodes if node not in minority]
    hold_s = context.rng.uniform(PARTITION_HOLD_MIN_S, PARTITION_HOLD_MAX_S)
    event = context.fault("partition-minority", minority, leader_fault=False)
    context.lab.partition([minority, majority])
    context.in_place(event)
    context.wait_resumed(event)
    context.hold(event, hold_s)
    context.heal(event, context.lab.heal)
    context.wait_healthy()
    _wait_all_caught_up(context)


def _wait_all_caught_up(context: ScenarioContext) -> None:
    for node in context.cluster.nodes:
        context.wait_caught_up(node)


def random_fault(context: ScenarioContext) -> None:
    """One fault drawn from the seeded generator: any kind above (partitions only inside a lab)."""
    steps = [leader_kill, leader_pause, follower_snapshot, cold_restart]
    if context.lab is not None:
        steps += [partition_leader, partition_minority]
    step = context.rng.choice(steps)
    logger.info("mixed: drew %s", step.__name__)
    step(context)


def partition_leader_kill(context: ScenarioContext) -> None:
    """`kill -9` of a node leading a Raft group of partitions other than group 0 (with worker processes:
    not group 0's leader, whose kill `leader_kill` is); in a cluster of one group, of the leader."""
    leader = context.steady_leader()
    statuses = [status for status in context.cluster.statuses().values() if status is not None]
    leaders = next((s.group_leaders for s in statuses if len(s.group_leaders) > 1), ())
    others = sorted({info.leader_id for info in leaders if info.leader_id not in ("", leader)})
    victim = context.rng.choice(others) if others else leader
    event = context.fault("partition-leader-kill", [victim], leader_fault=True)
    context.kill(victim)
    context.wait_resumed(event)
    context.heal(event, lambda: context.start(victim))
    context.wait_healthy()


def exactly_once_fault(context: ScenarioContext) -> None:
    """The exactly-once scenario's faults in turn: a kill of group 0's leader (the transaction and
    group coordinator), a kill of a partition group's leader, a pause of group 0's leader."""
    steps = (leader_kill, partition_leader_kill, leader_pause)
    step = steps[len(context.faults) % len(steps)]
    logger.info("exactly-once: %s", step.__name__)
    step(context)
