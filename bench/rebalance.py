"""Rebalance time of Kafka consumer groups on kq: the classic protocol against KIP-848's.

`python -m kq.bench.rebalance [--runs 5] [--partitions 12] [--modes ...]` starts three real node
processes on 127.0.0.1 (a temporary directory), creates one topic, and for each mode and run:
three librdkafka consumers (confluent-kafka) join a new group and settle, owning every partition;
then a fourth joins (**join**: from its `subscribe` until every partition is owned again, by the
four members in balance), then one of the first three closes (**leave**: from the start of its
`close` until the three left own every partition in balance). Ownership is what the members'
on_assign / on_revoke callbacks say, so a partition revoked during an eager rebalance counts as not
owned until it is assigned again. Reported: the median, min and max of each, per mode.

Modes: `classic-cooperative-sticky` and `classic-range` (`group.protocol=classic`, JoinGroup and
SyncGroup, client-side assignors), `consumer-uniform` and `consumer-range` (`group.protocol=
consumer`, ConsumerGroupHeartbeat with the server assignor). Every client setting is librdkafka's
default (classic heartbeat.interval.ms 3000, session.timeout.ms 45000; the consumer protocol's
heartbeat interval is the node's --group-consumer-heartbeat-interval-ms, Kafka's default 5000), so the
numbers are what an application sees without tuning. One thread polls every consumer in turn
(callbacks run in poll), every 50 ms each; a close runs on its own thread so the others keep polling.
`--kill-leader` kills the leader (every group's coordinator) with -9 as the fourth member joins and
restarts it, so the join is measured across a coordinator failover.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kq.deploy.cluster import LocalCluster

MODES = ("classic-cooperative-sticky", "classic-range", "consumer-uniform", "consumer-range")
SETTLE_TIMEOUT_S = 120.0  # No join or leave waits longer (a run that does is reported as failed).
POLL_S = 0.05


@dataclass
class Member:
    """One consumer and the partitions its callbacks say it owns."""

    consumer: Consumer
    owned: set[int] = field(default_factory=set)


def _config(bootstrap: str, group: str, mode: str) -> dict[str, object]:
    protocol, _, assignor = mode.partition("-")
    config: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "group.protocol": protocol,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    if protocol == "classic":
        config["partition.assignment.strategy"] = assignor
    else:
        config["group.remote.assignor"] = assignor
    return config


def _member(bootstrap: str, group: str, mode: str, topic: str) -> Member:
    consumer = Consumer(_config(bootstrap, group, mode))
    member = Member(consumer)

    def on_assign(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
        member.owned |= {tp.partition for tp in partitions}

    def on_revoke(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
        member.owned -= {tp.partition for tp in partitions}

    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
    return member


def _balanced(members: Sequence[Member], partitions: int) -> bool:
    """Every partition owned once, and no member owning more than its share rounded up."""
    owned = sorted(p for member in members for p in member.owned)
    share = -(-partitions // len(members))
    return owned == list(range(partitions)) and all(len(m.owned) <= share for m in members)


def _poll_until(members: Sequence[Member], done: Callable[[], bool], partitions: int) -> tuple[bool, float]:
    """Polls every member until `done`: (whether it came in time, partition-seconds not owned meanwhile,
    the time no member could consume a partition: what a stop-the-world rebalance costs)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    paused_s, last = 0.0, time.monotonic()
    while not done():
        now = time.monotonic()
        owned = len({p for member in members for p in member.owned})
        paused_s += (partitions - owned) * (now - last)
        last = now
        if now > deadline:
            return False, paused_s
        for member in members:
            member.consumer.poll(POLL_S / max(len(members), 1))
    return True, paused_s


Sample = tuple[float | None, float | None, float, float]  # join s, leave s, their paused partition-s


def one_run(
    bootstrap: str, topic: str, partitions: int, mode: str, kill: Callable[[], None] | None = None
) -> Sample:
    """(join s, leave s, join paused partition-s, leave paused partition-s) of one fresh group in
    `mode`; None for a step that did not settle in time. `kill`: run on a thread as the fourth
    member joins (the leader, every group's coordinator, killed -9 and restarted)."""
    group = f"rb-{mode}-{uuid.uuid4().hex[:8]}"
    members = [_member(bootstrap, group, mode, topic) for _ in range(3)]
    try:
        if not _poll_until(members, lambda: _balanced(members, partitions), partitions)[0]:
            return None, None, 0.0, 0.0
        started = time.monotonic()
        killer = None if kill is None else threading.Thread(target=kill, name="rebalance-kill")
        if killer is not None:
            killer.start()
        members.append(_member(bootstrap, group, mode, topic))
        joined, join_paused = _poll_until(members, lambda: _balanced(members, partitions), partitions)
        join_s = time.monotonic() - started if joined else None
        if killer is not None:
            killer.join(SETTLE_TIMEOUT_S)
        leaving = members.pop(0)
        started = time.monotonic()
        closing = threading.Thread(target=leaving.consumer.close, name="rebalance-close")
        closing.start()
        settled, leave_paused = _poll_until(members, lambda: _balanced(members, partitions), partitions)
        leave_s = time.monotonic() - started if settled else None
        closing.join(SETTLE_TIMEOUT_S)
        return join_s, leave_s, join_paused, leave_paused
    finally:
        for member in members:
            member.consumer.close()


def _kill_leader(cluster: LocalCluster) -> None:
    """Kills the leader with -9, waits for the next, and restarts the killed node (as a follower)."""
    leader = cluster.wait_ready()
    cluster.kill_node(leader)
    cluster.wait_ready()
    cluster.start_node(leader)
    cluster.wait_ready()


def _summary(values: Sequence[float | None]) -> dict[str, object]:
    done = [v for v in values if v is not None]
    if not done:
        return {"median_s": None, "failed": len(values)}
    return {
        "median_s": round(statistics.median(done), 3),
        "min_s": round(min(done), 3),
        "max_s": round(max(done), 3),
        "failed": len(values) - len(done),
        "runs_s": [None if v is None else round(v, 3) for v in values],
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Runs the measurement and prints one JSON object (and a table) with the medians."""
    parser = argparse.ArgumentParser(
        prog="python -m kq.bench.rebalance", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--output", type=Path, default=None, help="also write the JSON here")
    parser.add_argument(
        "--kill-leader",
        action="store_true",
        help="kill -9 the leader (the coordinator) as the fourth member joins, and restart it",
    )
    args = parser.parse_args(argv)
    results: dict[str, dict[str, object]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="kq-bench-rebalance-") as base,
        LocalCluster(Path(base) / "cluster") as cluster,
    ):
        cluster.wait_ready()
        topic = f"rebalance-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
        admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(60)
        kill = partial(_kill_leader, cluster) if args.kill_leader else None
        for mode in args.modes:
            bootstrap = cluster.kafka_bootstrap
            runs = [one_run(bootstrap, topic, args.partitions, mode, kill) for _ in range(args.runs)]
            results[mode] = {
                "join": _summary([run[0] for run in runs]),
                "leave": _summary([run[1] for run in runs]),
                "join_paused_partition_s": _summary([run[2] for run in runs]),
                "leave_paused_partition_s": _summary([run[3] for run in runs]),
            }
            print(mode, json.dumps(results[mode]), flush=True)
    report = {"runs": args.runs, "partitions": args.partitions, "members": "3 (+1 joins, then 1 leaves)"}
    report["leader_killed_at_join"] = args.kill_leader
    report["results"] = results
    text = json.dumps(report, indent=2)
    if args.output is not None:
        args.output.write_text(text + "\n")
    print(text)
    columns = ("join", "leave", "join_paused_partition_s", "leave_paused_partition_s")
    header = ("join s", "leave s", "join paused p-s", "leave paused p-s")
    print(f"{'mode (medians)':28} {header[0]:>8} {header[1]:>8} {header[2]:>16} {header[3]:>17}")
    for mode, result in results.items():
        cells = []
        for column in columns:
            summary = result[column]
            assert isinstance(summary, dict)
            cells.append(summary["median_s"])
        print(f"{mode:28} {cells[0]!s:>8} {cells[1]!s:>8} {cells[2]!s:>16} {cells[3]!s:>17}")


if __name__ == "__main__":
    main()
