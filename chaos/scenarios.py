"""The scenarios: named sequences of fault steps, each run on a fresh cluster of its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kq.chaos import disk_full, faults, membership
from kq.chaos.context import ScenarioContext
from kq.chaos.gaps import DELETE_RETENTION_MS_DEFAULT, Lifecycle
from kq.chaos.workload import DEFAULT_SHAPE, ProducerKind, WorkloadShape

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
    topic_configs: tuple[tuple[str, str], ...] = ()  # The chaos topic's configs, by Kafka's names.
    final_configs: tuple[tuple[str, str], ...] = ()  # Set once the load is over, before the final read.
    workload: WorkloadShape = DEFAULT_SHAPE
    # Transactional consume-transform-produce workers run beside the load (`chaos.exactly_once`).
    exactly_once: bool = False

    def rounds(self, override: int | None) -> list[tuple[Step, int]]:
        """The steps with their round counts (`override` replaces every count)."""
        return [(step, override if override is not None else rounds) for step, rounds in self.steps]

    def lifecycle(self) -> Lifecycle:
        """The documented gaps the topic's configs allow (`chaos.gaps`): trims where retention is
        configured under the delete policy, compaction where the policy holds compact."""
        configs = dict(self.topic_configs)
        policy = {part.strip() for part in configs.get(CLEANUP_POLICY, "delete").split(",")}
        bounded = any(configs.get(name, "-1") != "-1" for name in (RETENTION_MS, RETENTION_BYTES))
        return Lifecycle(
            trims="delete" in policy and bounded,
            compacted="compact" in policy,
            delete_retention_ms=int(configs.get(DELETE_RETENTION_MS, DELETE_RETENTION_MS_DEFAULT)),
        )


# Topic configs by Kafka's names (raft/topic_config.py), spelled out: chaos talks to kq as a client.
RETENTION_MS = "retention.ms"
RETENTION_BYTES = "retention.bytes"
CLEANUP_POLICY = "cleanup.policy"
DELETE_RETENTION_MS = "delete.retention.ms"

# Retention under leader kills. The load writes about 200 records/s on this 2-core machine (its
# producers send one request at a time), some 30 records (2-3 KiB) per partition and second, so 8 KiB
# hold about 3 s of it and most checks (4 a second) trim a batch or more; 5 s of retention.ms trims
# too, in the pauses of the load (a failover) when the byte bound does not. A node that was down
# for a second or two finds its readers below the log start. At the end retention.ms is turned off,
# or it would trim everything while the logs are read; the byte bound stops trimming with the load.
RETENTION_TOPIC_CONFIGS = ((RETENTION_BYTES, "8192"), (RETENTION_MS, "5000"))
RETENTION_FINAL_CONFIGS = ((RETENTION_MS, "-1"),)
RETENTION_NODE_ARGS = ("--retention-check-ms", "250")

# Key compaction under leader kills. Every record has a key (records without one are dropped by
# compaction, as Kafka refuses them), 16 keys so most records are superseded within seconds, and a
# tenth of them are tombstones. delete.retention.ms stays at its default (a day), so a tombstone goes
# only once superseded, and a key's newest record, the partition's last one included, always stays.
# The compactor runs 4 times a second, on a partition once a tenth of it is new.
COMPACTION_TOPIC_CONFIGS = (
    (CLEANUP_POLICY, "compact"),
    ("min.compaction.lag.ms", "0"),
    ("min.cleanable.dirty.ratio", "0.1"),
    (DELETE_RETENTION_MS, str(DELETE_RETENTION_MS_DEFAULT)),
)
COMPACTION_NODE_ARGS = ("--compaction-check-ms", "250")
COMPACTION_WORKLOAD = WorkloadShape(
    kinds=(ProducerKind.KEYED, ProducerKind.PINNED_KEYED), keys=16, tombstone_share=0.1
)


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
            "disk-full",
            "fill a follower's disk under load (a tmpfs as root, else a small LMDB map), then its map: it "
            "must stop with one line while the majority writes on, and catch up once given room",
            ((disk_full.follower_disk_full, 1), (disk_full.follower_map_full, 1)),
        ),
        Scenario(
            "partition-minority",
            "cut a minority of followers off while the majority keeps writing, heal",
            ((faults.partition_minority, 4),),
            needs_netns=True,
        ),
        Scenario(
            "retention-leader-kill",
            "kill -9 of the leader, restart it, repeat, while retention trims the topic 4 times a second",
            ((faults.leader_kill, 12),),
            node_args=RETENTION_NODE_ARGS,
            topic_configs=RETENTION_TOPIC_CONFIGS,
            final_configs=RETENTION_FINAL_CONFIGS,
        ),
        Scenario(
            "retention-smoke",
            "two leader kills while retention trims the topic: the default suite's short retention run",
            ((faults.leader_kill, 2),),
            node_args=RETENTION_NODE_ARGS,
            topic_configs=RETENTION_TOPIC_CONFIGS,
            final_configs=RETENTION_FINAL_CONFIGS,
        ),
        Scenario(
            "compaction-leader-kill",
            "kill -9 of the leader, restart it, repeat, while the leader compacts a compact topic by key",
            ((faults.leader_kill, 12),),
            node_args=COMPACTION_NODE_ARGS,
            topic_configs=COMPACTION_TOPIC_CONFIGS,
            workload=COMPACTION_WORKLOAD,
        ),
        Scenario(
            "exactly-once",
            "transactional consume-transform-produce workers (confluent-kafka, send_offsets_to_transaction) "
            "while group 0's leader and partition groups' leaders are killed and group 0's leader paused: "
            "every input record in the read_committed output once, in order, committed offsets never back",
            ((faults.exactly_once_fault, 12),),
            exactly_once=True,
        ),
        Scenario(
            "membership",
            "add a node, then remove an old one, each while the leader is killed (kill -9) mid-change; "
            "every round ends at the starting size",
            ((membership.membership_change, 3),),
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
    "retention-leader-kill",
    "compaction-leader-kill",
    "disk-full",
    "membership",
    "exactly-once",
)
