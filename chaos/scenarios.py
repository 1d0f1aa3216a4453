"""The scenarios: named sequences of fault steps, each run on a fresh cluster of its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kq.chaos import faults
from kq.chaos.context import ScenarioContext

Step = Callable[[ScenarioContext], None]

SNAPSHOT_COMPACTION_ENTRIES = (
    "200"  # Compacts within a second or two of load: the killed follower falls behind.
)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A name, what it does, its fault steps with their default round counts, and what it needs."""

    name: str
    summary: str
    steps: tuple[tuple[Step, int], ...]
    needs_netns: bool = False  # Skipped (with the reason) where network namespaces are unavailable.
    wants_netns: bool = False  # Uses namespaces where available, else runs on loopback without partitions.
    node_args: tuple[str, ...] = ()

    def rounds(self, override: int | None) -> list[tuple[Step, int]]:
        """The steps with their round counts (`override` replaces every count)."""
        return [(step, override if override is not None else rounds) for step, rounds in self.steps]


SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in (
        Scenario(
            "smoke",
            "a few leader kills and one leader pause: the short run of the default test suite",
            ((faults.leader_kill, 3), (faults.leader_pause, 1)),
        ),
        Scenario("leader-kill", "kill -9 of the leader, restart it, repeat", ((faults.leader_kill, 20),)),
        Scenario(
            "leader-pause",
            "SIGSTOP of the leader beyond the election timeout, then SIGCONT, with a probe writing to it",
            ((faults.leader_pause, 4),),
        ),
        Scenario(
            "follower-snapshot",
            "kill -9 of a follower, restart it after the leader compacted past it (snapshot catch-up)",
            ((faults.follower_snapshot, 2),),
            node_args=("--compaction-min-entries", SNAPSHOT_COMPACTION_ENTRIES),
        ),
        Scenario(
            "cold-restart", "kill -9 of every node at once, then start them all", ((faults.cold_restart, 3),)
        ),
        Scenario(
            "rolling-restart",
            "SIGTERM and restart of each node in turn, followers first, the leader last",
            ((faults.rolling_restart, 2),),
        ),
        Scenario(
            "partition-leader",
            "cut the leader (with a follower, on 5 nodes) off from the majority, probe it, heal",
            ((faults.partition_leader, 4),),
            needs_netns=True,
        ),
        Scenario(
            "mixed",
            "faults of every kind, drawn at random from the seed, one after another on one cluster",
            ((faults.random_fault, 10),),
            wants_netns=True,
        ),
        Scenario(
            "partition-minority",
            "cut a minority of followers off while the majority keeps writing, heal",
            ((faults.partition_minority, 4),),
            needs_netns=True,
        ),
    )
}

FULL_SET = (
    "leader-kill",
    "leader-pause",
    "follower-snapshot",
    "cold-restart",
    "rolling-restart",
    "partition-leader",
    "partition-minority",
    "mixed",
)
