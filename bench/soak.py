"""`python -m kq.bench.soak`: a long run at a fixed produce rate that checks for leaks, stalls and drift.

A fresh three-node `LocalCluster` (kq.deploy; a temporary directory, or `--keep-dir`) takes `--rate`
records per second through `client.Producer` for `--minutes`, while a plain consumer reads every partition
from a follower and a group consumer commits offsets. Every `--sample-interval-s` the nodes'
RssAnon and RssFile and the client counts are recorded. At the end production stops, the consumers
catch up, every node's copy of the topic is hashed, and the node logs are scanned for snapshots and
error lines. The verdict (exit code 0 on PASS, 1 on FAIL) holds the run against: an RssAnon floor
slope of at most 1 MiB/min per node after the warm-up (`bench.soak_analysis` defines the floor), no
overlapping or back-to-back snapshots, no ERROR/CRITICAL log lines, equal digests on every node,
and consumers that read at least every acknowledged record with no offset skipped.

Every sample also measures each node's data directory on disk (`bench.disk_usage`: the total, the
LMDB file, the Raft journal). `--retention-bytes N` creates the topic with Kafka's `retention.bytes`
(per partition) and runs the nodes with a short `--retention-check-ms`: records below the log start
are then gone, so the consumers must read each record before it is trimmed (they keep up, or the
trimmed records count as skipped), the digests compare what every node holds once retention has
settled after the last write, and the verdict adds that retention trimmed and that each node's data
directory and LMDB file levelled off (the second half's size peak at most
`--size-growth-max-fraction` above the first half's).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kq.bench import disk_usage, procfs
from kq.bench.soak_analysis import FLOOR_WINDOW_S_DEFAULT, SIZE_GROWTH_MAX_FRACTION_DEFAULT, scan_log
from kq.bench.soak_report import (
    SLOPE_MAX_MIB_PER_MIN,
    Limits,
    disk_section,
    node_section,
    render,
    verdict,
)
from kq.bench.soak_workload import (
    ConsumerLoop,
    DigestError,
    GroupConsumerLoop,
    PacedProducer,
    PlainConsumerLoop,
    node_digest,
)
from kq.client import KqClient, KqClientError
from kq.deploy.cluster import LocalCluster, work_dir
from kq.deploy.waiting import WaitTimeoutError

TOPIC = "soak"
GROUP = "soak-group"
SAMPLE_INTERVAL_S_DEFAULT = 10.0
FLUSH_TIMEOUT_S = 120.0
CATCH_UP_TIMEOUT_S_DEFAULT = 180.0
CONSUMER_STOP_TIMEOUT_S = 30.0
DIGEST_TIMEOUT_S = 600.0  # Per node; a 30-minute run at the default rate holds about 9 million records.
APPLIED_TIMEOUT_S = 120.0
RETENTION_CHECK_MS_DEFAULT = 5_000  # The nodes' --retention-check-ms when --retention-bytes is given.
RETENTION_SETTLED_ROUNDS = 2  # Log starts unchanged over this many retention rounds: retention is done.
RETENTION_SETTLE_TIMEOUT_S = 120.0  # Beyond the rounds themselves.
SIZE_REPORT_INTERVAL_S_DEFAULT = 300.0
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SoakSettings:
    """Everything a soak run is told."""

    minutes: float = 30.0
    rate: float = 5_000.0
    value_bytes: int = 512
    partitions: int = 6
    warmup_minutes: float = 5.0
    snapshot_gap_min_s: float = 5.0
    slope_max_mib_per_min: float = SLOPE_MAX_MIB_PER_MIN
    sample_interval_s: float = SAMPLE_INTERVAL_S_DEFAULT
    floor_window_s: float = FLOOR_WINDOW_S_DEFAULT
    catch_up_timeout_s: float = CATCH_UP_TIMEOUT_S_DEFAULT
    keep_dir: str | None = None
    node_args: tuple[str, ...] = field(default_factory=tuple)
    retention_bytes: int | None = None  # The topic's retention.bytes (per partition); None: keep all.
    retention_check_ms: int = RETENTION_CHECK_MS_DEFAULT  # Passed to the nodes with retention_bytes.
    size_growth_max_fraction: float = SIZE_GROWTH_MAX_FRACTION_DEFAULT
    size_report_interval_s: float = SIZE_REPORT_INTERVAL_S_DEFAULT  # Rows of the printed size table.
    # The Producer's batch_size; None: its default. Each batch is one LMDB value on every node, and
    # values of many pages fragment LMDB's free space (README.md, "Soak").
    batch_bytes: int | None = None

    @property
    def limits(self) -> Limits:
        """The verdict's limits."""
        return Limits(
            self.slope_max_mib_per_min,
            self.snapshot_gap_min_s,
            self.size_growth_max_fraction if self.retention_bytes is not None else None,
        )

    @property
    def topic_configs(self) -> dict[str, str]:
        """The soak topic's config overrides."""
        return {"retention.bytes": str(self.retention_bytes)} if self.retention_bytes is not None else {}

    @property
    def all_node_args(self) -> tuple[str, ...]:
        """`--node-arg` values, after the retention check period when retention is on."""
        retention = ("--retention-check-ms", str(self.retention_check_ms))
        return (retention if self.retention_bytes is not None else ()) + self.node_args


@dataclass(slots=True)
class Timeline:
    """The periodic samples: client counts and each node's memory."""

    samples: list[dict[str, Any]] = field(default_factory=list)
    memory: dict[str, list[tuple[float, int, int]]] = field(default_factory=dict)  # node -> (t, anon, file)
    # node -> (t, its data directory's sizes)
    disk: dict[str, list[tuple[float, disk_usage.DiskUsage]]] = field(default_factory=dict)
    threads: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # node -> (t, OS threads)


def parse_arguments(argv: Sequence[str] | None) -> tuple[SoakSettings, Path | None]:
    """Settings and the --json path from the command line."""
    parser = argparse.ArgumentParser(prog="python -m kq.bench.soak", description=__doc__.splitlines()[0])
    defaults = SoakSettings()
    parser.add_argument("--minutes", type=float, default=defaults.minutes, help="how long to produce")
    parser.add_argument("--rate", type=float, default=defaults.rate, help="records per second")
    parser.add_argument("--value-bytes", type=int, default=defaults.value_bytes)
    parser.add_argument("--partitions", type=int, default=defaults.partitions)
    parser.add_argument(
        "--warmup-minutes", type=float, default=defaults.warmup_minutes, help="left out of the memory slope"
    )
    parser.add_argument(
        "--snapshot-gap-min-s",
        type=float,
        default=defaults.snapshot_gap_min_s,
        help="a snapshot starting sooner after the previous one ended is 'back to back'",
    )
    parser.add_argument("--slope-max-mib-per-min", type=float, default=defaults.slope_max_mib_per_min)
    parser.add_argument("--sample-interval-s", type=float, default=defaults.sample_interval_s)
    parser.add_argument(
        "--floor-window-s", type=float, default=defaults.floor_window_s, help="window of each floor minimum"
    )
    parser.add_argument("--catch-up-timeout-s", type=float, default=defaults.catch_up_timeout_s)
    parser.add_argument("--keep-dir", help="run the cluster in this directory and keep it (logs, data)")
    parser.add_argument(
        "--node-arg", action="append", default=[], help="extra kq-node argument (repeat; e.g. --node-arg=--x)"
    )
    parser.add_argument(
        "--retention-bytes",
        type=int,
        default=None,
        help="create the topic with retention.bytes=N (per partition) and judge the nodes' disk size",
    )
    parser.add_argument(
        "--retention-check-ms",
        type=int,
        default=defaults.retention_check_ms,
        help="the nodes' --retention-check-ms, with --retention-bytes",
    )
    parser.add_argument(
        "--size-growth-max-fraction",
        type=float,
        default=defaults.size_growth_max_fraction,
        help="with retention: a node's size peak over the second half may exceed the first half's by this",
    )
    parser.add_argument(
        "--size-report-interval-s",
        type=float,
        default=defaults.size_report_interval_s,
        help="the printed size table shows a sample this often",
    )
    parser.add_argument(
        "--batch-bytes", type=int, default=None, help="the Producer's batch_size (default: the Producer's)"
    )
    parser.add_argument("--json", type=Path, help="also write the report as JSON here")
    arguments = parser.parse_args(argv)
    if arguments.retention_bytes is not None and arguments.retention_bytes < 0:
        parser.error("--retention-bytes is a size in bytes (omit it to keep every record)")
    settings = SoakSettings(
        minutes=arguments.minutes,
        rate=arguments.rate,
        value_bytes=arguments.value_bytes,
        partitions=arguments.partitions,
        warmup_minutes=arguments.warmup_minutes,
        snapshot_gap_min_s=arguments.snapshot_gap_min_s,
        slope_max_mib_per_min=arguments.slope_max_mib_per_min,
        sample_interval_s=arguments.sample_interval_s,
        floor_window_s=arguments.floor_window_s,
        catch_up_timeout_s=arguments.catch_up_timeout_s,
        keep_dir=arguments.keep_dir,
        node_args=tuple(arguments.node_arg),
        retention_bytes=arguments.retention_bytes,
        retention_check_ms=arguments.retention_check_ms,
        size_growth_max_fraction=arguments.size_growth_max_fraction,
        size_report_interval_s=arguments.size_report_interval_s,
        batch_bytes=arguments.batch_bytes,
    )
    return settings, arguments.json


def sample(
    cluster: LocalCluster,
    pids: dict[str, int],
    timeline: Timeline,
    elapsed_s: float,
    producer: PacedProducer,
    consumers: Sequence[ConsumerLoop],
    admin: KqClient,
) -> list[str]:
    """Records one sample and prints it; returns the nodes that are no longer running."""
    nodes: dict[str, dict[str, int]] = {}
    gone: list[str] = []
    for node_id, pid in pids.items():
        if not cluster.running(node_id):
            gone.append(node_id)
            continue
        try:
            memory = procfs.memory(pid)
            threads = procfs.thread_count(pid)
        except (OSError, KeyError):
            gone.append(node_id)
            continue
        usage = disk_usage.measure(cluster.nodes[node_id].data_dir)
        nodes[node_id] = {
            "anon_kib": memory.anon_kib,
            "file_kib": memory.file_kib,
            "dir_bytes": usage.total_bytes,
            "dir_allocated_bytes": usage.allocated_bytes,
            "lmdb_bytes": usage.lmdb_bytes,
            "journal_bytes": usage.journal_bytes,
            "threads": threads,
        }
        timeline.threads.setdefault(node_id, []).append((elapsed_s, threads))
        timeline.memory.setdefault(node_id, []).append((elapsed_s, memory.anon_kib, memory.file_kib))
        timeline.disk.setdefault(node_id, []).append((elapsed_s, usage))
    entry = {
        "t_s": round(elapsed_s, 1),
        "sent": producer.sent,
        "acked": producer.acked,
        "produce_errors": producer.errors.count,
        **{f"{c.name}_distinct": c.tracker.distinct for c in consumers},
        **{f"{c.name}_errors": c.errors.count for c in consumers},
        **(topic := _topic_state(admin)),
        "nodes": nodes,
    }
    timeline.samples.append(entry)
    memory_text = " ".join(
        f"n{n}={m['anon_kib'] / 1024:.0f}/{m['file_kib'] / 1024:.0f}" for n, m in sorted(nodes.items())
    )
    disk_text = " ".join(
        f"n{n}={m['dir_bytes'] / MIB:.0f}/{m['lmdb_bytes'] / MIB:.0f}" for n, m in sorted(nodes.items())
    )
    consumed = " ".join(f"{c.name}={c.tracker.distinct:,}" for c in consumers)
    print(
        f"[{elapsed_s:7.0f} s] acked {producer.acked:,} (errors {producer.errors.count}), {consumed}; "
        f"anon/file MiB {memory_text}; dir/lmdb MiB {disk_text}; topic holds "
        f"{_mib(topic['topic_stored_bytes'])} MiB, log starts sum to {topic['topic_log_start_sum']}",
        flush=True,
    )
    return gone


def _topic_state(client: KqClient) -> dict[str, int | None]:
    """What the topic holds (any node's view): the bytes of its stored batches and its log starts, summed
    over partitions; None when no node answered (the sample is still taken)."""
    try:
        offsets = client.list_offsets(TOPIC)
    except KqClientError:
        return {"topic_stored_bytes": None, "topic_log_start_sum": None}
    return {
        "topic_stored_bytes": sum(o.size_bytes for o in offsets.values()),
        "topic_log_start_sum": sum(o.log_start_offset for o in offsets.values()),
    }


def _mib(value: int | None) -> str:
    return "?" if value is None else f"{value / MIB:.0f}"


def soak_loop(
    cluster: LocalCluster,
    settings: SoakSettings,
    producer: PacedProducer,
    consumers: Sequence[ConsumerLoop],
    timeline: Timeline,
    admin: KqClient,
) -> list[str]:
    """Samples every interval until the time is up or a node dies; returns reasons to abort."""
    pids = cluster.pids()
    started = time.monotonic()
    end = started + settings.minutes * 60
    ticker = threading.Event()  # Never set: its wait() paces the samples.
    next_sample = started
    while True:
        gone = sample(cluster, pids, timeline, time.monotonic() - started, producer, consumers, admin)
        if gone:
            return [f"node(s) {gone} stopped running during the soak"]
        if time.monotonic() >= end:
            return []
        next_sample += settings.sample_interval_s
        ticker.wait(max(0.0, min(next_sample, end) - time.monotonic()))


def finish(
    cluster: LocalCluster,
    settings: SoakSettings,
    producer: PacedProducer,
    plain: PlainConsumerLoop,
    group: GroupConsumerLoop,
    admin: KqClient,
) -> dict[str, Any]:
    """Stops producing, lets the consumers catch up, reads the group's commits and every node's digest.

    With retention the digests wait until retention has settled (nothing trims any more), so that
    every node is read at the same log start.
    """
    producer.stop(FLUSH_TIMEOUT_S)
    log_ends = {p: o.log_end_offset for p, o in producer.client.list_offsets(TOPIC).items()}
    index = producer.client.index_seen
    deadline = time.monotonic() + settings.catch_up_timeout_s
    for consumer in (plain, group):
        consumer.catch_up_to(log_ends)
    for consumer in (plain, group):
        consumer.caught_up.wait(max(0.0, deadline - time.monotonic()))
    for consumer in (plain, group):
        consumer.stop(CONSUMER_STOP_TIMEOUT_S)
    try:
        committed = group.committed(producer.client, sorted(log_ends), TOPIC)
        committed_at_end: bool | str = committed == log_ends
    except KqClientError as error:
        committed_at_end = f"could not read: {error}"
    retention: dict[str, Any] | None = None
    if settings.retention_bytes is not None:
        retention = wait_retention_settled(cluster, admin, settings.retention_check_ms / 1000)
        index = max(index, retention["applied_index"])
    digests: dict[str, dict[str, Any]] = {}
    try:
        cluster.wait_applied(index, sorted(cluster.nodes), APPLIED_TIMEOUT_S)
    except WaitTimeoutError as error:
        print(f"warning: {error}", flush=True)
    for node_id, spec in sorted(cluster.nodes.items()):
        try:
            digests[node_id] = asdict(node_digest(spec.grpc_address, TOPIC, index, DIGEST_TIMEOUT_S))
        except (KqClientError, DigestError) as error:
            digests[node_id] = {"error": str(error)}
    hashes = {entry.get("sha256") for entry in digests.values()}
    starts = [json.dumps(entry.get("log_starts"), sort_keys=True) for entry in digests.values()]
    return {
        "log_ends": log_ends,
        "applied_index_checked": index,
        "group_committed_at_end": committed_at_end,
        "retention": retention,
        "digests": {
            "equal": len(hashes) == 1 and None not in hashes,
            "log_starts_equal": len(set(starts)) == 1,
            "per_node": digests,
        },
    }


def wait_retention_settled(cluster: LocalCluster, admin: KqClient, check_s: float) -> dict[str, Any]:
    """Waits until the leader's log starts stay put over RETENTION_SETTLED_ROUNDS retention rounds.

    Returns the log starts, the leader's applied index read after them (so it covers the last trim),
    whether they settled within the timeout, and how long it took.
    """
    started = time.monotonic()
    deadline = started + RETENTION_SETTLE_TIMEOUT_S + check_s * (RETENTION_SETTLED_ROUNDS + 1)
    pause = threading.Event()  # Never set: its wait() paces the looks.
    previous: dict[int, int] | None = None
    unchanged = 0
    starts: dict[int, int] = {}
    applied_index = 0
    while True:
        leader = cluster.leader_id()
        if leader is not None:
            try:
                offsets = admin.list_offsets(TOPIC, cluster.nodes[leader].grpc_address)
                status = admin.node_status(cluster.nodes[leader].grpc_address)
            except KqClientError:
                offsets, status = {}, None
            if offsets and status is not None:
                starts = {p: o.log_start_offset for p, o in sorted(offsets.items())}
                applied_index = status.applied_index
                unchanged = unchanged + 1 if starts == previous else 0
                previous = starts
        settled = unchanged >= RETENTION_SETTLED_ROUNDS
        if settled or time.monotonic() >= deadline:
            return {
                "settled": settled,
                "waited_s": round(time.monotonic() - started, 1),
                "log_starts": starts,
                "applied_index": applied_index,
            }
        pause.wait(check_s)


def run(settings: SoakSettings) -> dict[str, Any]:
    """Runs the soak in `--keep-dir` or a temporary directory (removed afterwards); returns the report."""
    with work_dir(Path(settings.keep_dir) if settings.keep_dir else None, "kq-soak-") as base:
        return _run_in(base, settings)


def _run_in(base: Path, settings: SoakSettings) -> dict[str, Any]:
    """The soak on a cluster in `base`; the report, verdict included."""
    cluster = LocalCluster(base / "cluster", node_args=settings.all_node_args)
    timeline = Timeline()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    started = time.monotonic()
    try:
        cluster.start()
        leader = cluster.wait_ready()
        follower = next(node for node in sorted(cluster.nodes) if node != leader)
        admin = KqClient(cluster.bootstrap)
        try:
            admin.create_topic(TOPIC, settings.partitions, configs=settings.topic_configs)
            producer = PacedProducer(
                cluster.bootstrap, TOPIC, settings.rate, settings.value_bytes, settings.batch_bytes
            )
            plain = PlainConsumerLoop(cluster.bootstrap, TOPIC, cluster.nodes[follower].grpc_address)
            group = GroupConsumerLoop(cluster.bootstrap, TOPIC, GROUP)
            for role in (plain, group, producer):
                role.start()
            try:
                aborted = soak_loop(cluster, settings, producer, (plain, group), timeline, admin)
                ending = finish(cluster, settings, producer, plain, group, admin)
            finally:
                producer.close()
        finally:
            admin.close()
    finally:
        cluster.stop()
    report: dict[str, Any] = {
        "command": ["python", "-m", "kq.bench.soak", *sys.argv[1:]],
        "started_at": started_at,
        "duration_s": round(time.monotonic() - started, 1),
        "base_dir": str(base) + ("" if settings.keep_dir else " (removed)"),
        "settings": asdict(settings),
        "follower_read": follower,
        "aborted": aborted,
        **_client_sections(producer, (plain, group)),
        **{key: value for key, value in ending.items() if key != "digests"},
        "digests": ending["digests"],
        "nodes": _node_sections(cluster, settings, timeline),
        "samples": timeline.samples,
    }
    report["verdict"] = {"failures": verdict(report, settings.limits)}
    report["verdict"]["pass"] = not report["verdict"]["failures"]
    return report


def _client_sections(producer: PacedProducer, consumers: Sequence[ConsumerLoop]) -> dict[str, Any]:
    """The report's produce and consume sections."""
    sending_s = max(producer.stopped_at - producer.started_at, 1e-9)
    return {
        "produce": {
            "sent": producer.sent,
            "acked": producer.acked,
            "errors": producer.errors.as_json(),
            "rate_achieved": producer.sent / sending_s,
            "behind_max_records": producer.behind_max_records,
        },
        "consume": {
            c.name: {**c.tracker.as_json(), "errors": c.errors.as_json(), "caught_up": c.caught_up.is_set()}
            for c in consumers
        },
    }


def _node_sections(cluster: LocalCluster, settings: SoakSettings, timeline: Timeline) -> dict[str, Any]:
    """Per node: memory, snapshots and log lines (`node_section`), and its disk size over time."""
    sections: dict[str, Any] = {}
    for node_id in sorted(cluster.nodes):
        scan = scan_log(_read_lines(cluster.log_path(node_id)))
        memory = timeline.memory.get(node_id, [])
        section = node_section(
            memory,
            scan,
            settings.warmup_minutes * 60,
            settings.floor_window_s,
            settings.limits,
            timeline.threads.get(node_id, []),
        )
        section["disk"] = disk_section(
            timeline.disk.get(node_id, []), settings.size_growth_max_fraction, settings.size_report_interval_s
        )
        sections[node_id] = section
    return sections


def _read_lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the soak, prints the report, writes the JSON; 0 on PASS, 1 on FAIL."""
    settings, json_path = parse_arguments(argv)
    report = run(settings)
    print(render(report), flush=True)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2, default=str))
    return 0 if report["verdict"]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
