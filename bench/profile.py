"""Where a workload's time and CPU go on each node: `python -m kq.bench.profile`.

Starts a three-node cluster (the harness, 127.0.0.1, a temporary directory), runs one workload of
the comparison's (`one-in-flight`: `KqClient.send` one record at a time; `producer`: one
`client.Producer` with the comparison's settings; `kafka-producer`: one librdkafka producer through
the Kafka port with `kq.bench.scale`'s settings, the path whose bytes issue 40 follows;
`kafka-python-producer`: one kafka-python producer with Java's defaults, 16 KiB batches and 5 ms
linger, whose requests carry a batch of every ready partition of a broker, as Java's do, where
librdkafka sends one a partition), and reports
each node's CPU per message (utime + stime from /proc over the run) and, with py-spy installed (`pip
install py-spy`; it ptraces the nodes, so it needs the permission to), the top frames of every busy
thread of the leader and of one follower: the samples whose innermost frame is that function
("self"), and those whose stack holds it ("total"). py-spy samples stacks of threads that are
running, so a thread waiting in `poll` or on a lock counts only when the OS says it runs; the share
of samples is the share of that thread's busy time. The raw py-spy files (collapsed stacks, loadable
by any flame graph tool) are kept in `--output-dir` when given. Every node is stopped by its PID.

`--timeline` (one-in-flight only) runs the nodes as `python -m kq.broker.timeline`, which reads the
clock around the steps of the commit path (broker/timeline.py), and prints each step's median offset
from the start of the leader's Produce, on the leader and on the followers (the first follower to
reach a step is its "#1"): where one record's round trip spends its time, hop by hop.

`--native` has py-spy unwind C frames too (it stops the process for each sample, so rates and CPU
read lower than without): memcpy, CRC32C, LMDB, the kernel's socket
calls show as their own frames instead of inside the Python call that made them, which is how the
payload bytes' copies are found (bench/README.md, "Payload bytes").
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from kq.bench import procfs
from kq.bench.produce_fetch import produce_latency
from kq.client import KqClient, Producer
from kq.client.producer import BATCH_BYTES_DEFAULT
from kq.deploy.cluster import LocalCluster, work_dir

SCENARIOS = ("one-in-flight", "producer", "kafka-producer", "kafka-python-producer")
KAFKA_SCENARIOS = ("kafka-producer", "kafka-python-producer")
TOPIC = "profile"
PARTITIONS = {"one-in-flight": 1, "producer": 6, "kafka-producer": 6, "kafka-python-producer": 6}
KAFKA_PYTHON_BATCH_BYTES = 16 * 1024  # Java's batch.size.
KAFKA_PYTHON_LINGER_MS = 5  # Java's linger.ms since Kafka 4.0.
SAMPLES_PER_S = 300  # py-spy's rate: enough samples in seconds, little load of its own.
SPY_START_S = 1.0  # py-spy attaches before the measured run starts.
SPY_STOP_TIMEOUT_S = 30.0
TOP_FRAMES = 12
ROOT_SHARE = 0.8  # A frame on at least this share of a thread's busy stacks is its run loop: not shown.
PRODUCER_TIMEOUT_S = 600.0
KAFKA_POLL_S = 0.05  # librdkafka's queue is full: serve delivery reports this long before producing on.
KAFKA_FAILURES_KEPT = 10
METRICS_TIMEOUT_S = 10.0
PRODUCE_REQUESTS_METRIC = 'kq_kafka_request_latency_seconds_count{request="produce"}'
COMMIT_INDEX_METRIC = "kq_raft_commit_index{"  # Each Raft group's; summed: the entries committed.
IDLE_LEAVES = (  # Innermost frames of a thread that waits: not work, though the OS may call it running.
    "PollPoller.poll (pysyncobj/poller.py:88)",
    "EpollSelector.select",
    "Condition.wait",
    "_worker (concurrent/futures/thread.py:81)",
)


def thread_profile(raw: str, frames: int = TOP_FRAMES) -> dict[str, dict[str, list[tuple[str, int]]]]:
    """Per thread (its Python name) of py-spy's raw output (`--threads`, collapsed stacks): its busy
    samples, and its top frames by self and by total samples; idle leaves (IDLE_LEAVES) left out."""
    selves: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    totals: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    busy: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit() or not stack:
            continue
        count, stack_frames = int(count_text), stack.split(";")
        thread = stack_frames[0].rsplit(": ", 1)[-1] if ": " in stack_frames[0] else stack_frames[0]
        if any(stack_frames[-1].startswith(idle) for idle in IDLE_LEAVES):
            continue
        busy[thread] += count
        selves[thread][_short(stack_frames[-1])] += count
        for frame in dict.fromkeys(stack_frames[1:]):  # Once a stack, outermost first (ties keep that order).
            totals[thread][_short(frame)] += count
    return {
        thread: {
            "busy": [("samples", samples)],
            "self": selves[thread].most_common(frames),
            # Frames on (nearly) every stack of the thread (its run loop) say nothing: left out.
            "total": [
                (frame, count)
                for frame, count in totals[thread].most_common()
                if count < ROOT_SHARE * samples
            ][:frames],
        }
        for thread, samples in busy.most_common()
    }


TIMELINE_MODULE = "kq.broker.timeline"
TIMELINE_DIRECTORY_VARIABLE = "KQ_TIMELINE_DIR"  # broker/timeline.py DIRECTORY_VARIABLE.
TIMELINE_SHARE_MIN = 0.5  # A step shown must occur in at least this share of the requests.


def timeline(
    events_by_pid: dict[int, list[tuple[str, str, int]]], leader_pid: int, window: tuple[int, int]
) -> list[str]:
    """The median offset (µs) of each step from the start of the leader's Produce, one line a step.

    `events_by_pid`: each node's (step, "+"/"-", ns) readings; only requests that started inside
    `window` count. One record is in flight at a time, so every reading between a Produce's start and
    its end belongs to it."""
    merged = sorted(
        (at, "leader" if pid == leader_pid else "follower", step, edge)
        for pid, events in events_by_pid.items()
        for step, edge, at in events
        if window[0] <= at <= window[1]
    )
    offsets: dict[str, list[float]] = collections.defaultdict(list)
    requests, start, seen = 0, None, collections.Counter[str]()
    for at, role, step, edge in merged:
        if role == "leader" and step == "produce" and edge == "+":
            requests, start, seen = requests + 1, at, collections.Counter()
            continue
        if start is None:
            continue
        key = f"{role} {step} {'starts' if edge == '+' else 'ends'}"
        seen[key] += 1
        offsets[f"{key} #{seen[key]}"].append((at - start) / 1000)
        if role == "leader" and step == "produce" and edge == "-":
            start = None
    rows = sorted(
        (statistics.median(values), name, len(values))
        for name, values in offsets.items()
        if len(values) >= TIMELINE_SHARE_MIN * requests
    )
    return [f"timeline of {requests:,} requests (µs from the leader's Produce starting, medians):"] + [
        f"  {median:8.1f}  {name} ({count:,})" for median, name, count in rows
    ]


def _short(frame: str) -> str:
    """`function (path/to/file.py:line)` as `function (file.py:line)`."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit('/', 1)[-1]}" if where else name


@contextmanager
def spying(
    pids: dict[str, int], seconds: float, output_dir: Path, native: bool = False
) -> Iterator[dict[str, Path]]:
    """py-spy recording each of `pids` for `seconds` (nothing without py-spy); the raw files by name."""
    executable = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if seconds <= 0 or not Path(executable).exists():
        yield {}
        return
    files = {name: output_dir / f"{name}.raw" for name in pids}
    duration, rate = str(max(1, round(seconds))), str(SAMPLES_PER_S)
    spies = [
        subprocess.Popen(
            [
                executable,
                "record",
                "-p",
                str(pid),
                "-d",
                duration,
                "-r",
                rate,
                "--threads",
                # py-spy unwinds C frames only with the process stopped for each sample.
                *(("--native",) if native else ("--nonblocking",)),
                "-f",
                "raw",
                "-o",
                str(files[name]),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]
    time.sleep(SPY_START_S)
    try:
        yield files
    finally:
        for spy in spies:
            try:
                spy.wait(timeout=seconds + SPY_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                spy.kill()  # By its own handle (its PID): never by name.
                spy.wait()


@dataclass(frozen=True)
class KafkaShape:
    """How the `kafka-producer` scenario's librdkafka producer batches: `batch.size` (None:
    `kq.bench.scale`'s, librdkafka's default of 1,000,000; Java's clients default to 16 KiB), and
    how many keys its records cycle through (0: none, librdkafka's sticky partitioner fills one
    partition's batch at a time); how many requests either Kafka scenario's producer keeps in
    flight on a connection (`in_flight`: 1 waits for each answer before it sends the next); and the
    topic's partitions, which kafka-python's records take in turn when they have no key."""

    batch_bytes: int | None = None
    keys: int = 0
    in_flight: int = 5
    partitions: int = PARTITIONS["kafka-python-producer"]


def run_workload(
    cluster: LocalCluster, scenario: str, messages: int, value: bytes, kafka: KafkaShape = KafkaShape()
) -> float:
    """Runs `scenario` once; its elapsed seconds."""
    started = time.monotonic()
    if scenario == "one-in-flight":
        produce_latency(cluster.bootstrap, TOPIC, messages, value, 0, PRODUCER_TIMEOUT_S)
        return time.monotonic() - started
    if scenario == "kafka-producer":
        kafka_produce(cluster.kafka_bootstrap, messages, value, kafka)
        return time.monotonic() - started
    if scenario == "kafka-python-producer":
        kafka_python_produce(cluster.kafka_bootstrap, messages, value, kafka)
        return time.monotonic() - started
    with KqClient(cluster.bootstrap) as client, Producer(client, batch_size=BATCH_BYTES_DEFAULT) as producer:
        for _ in range(messages):
            producer.send(TOPIC, value)
        producer.flush(timeout_s=PRODUCER_TIMEOUT_S)
    return time.monotonic() - started


def kafka_produce(bootstrap: str, messages: int, value: bytes, shape: KafkaShape = KafkaShape()) -> None:
    """`messages` records of `value` through librdkafka (`kq.bench.scale`'s producer settings, batched
    as `shape` says), every delivery report awaited; raises when one is an error."""
    from confluent_kafka import Producer as KafkaProducer  # Only this scenario needs the client.

    from kq.bench.scale import ScaleSettings, producer_config

    failures: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None and len(failures) < KAFKA_FAILURES_KEPT:
            failures.append(str(error))

    settings = ScaleSettings() if shape.batch_bytes is None else ScaleSettings(batch_bytes=shape.batch_bytes)
    config = {
        **producer_config(bootstrap, settings),
        "max.in.flight.requests.per.connection": shape.in_flight,
    }
    producer = KafkaProducer({**config, "on_delivery": delivered})
    keys: list[bytes | None] = [f"key-{index}".encode() for index in range(shape.keys)] or [None]
    for index in range(messages):
        while True:
            try:
                producer.produce(TOPIC, value, key=keys[index % len(keys)])
                break
            except BufferError:  # Its queue is full: serve delivery reports, then again.
                producer.poll(KAFKA_POLL_S)
        producer.poll(0)
    if producer.flush(PRODUCER_TIMEOUT_S) or failures:
        raise click.ClickException(f"Kafka produce failed: {failures[:1] or 'flush timed out'}")


def kafka_python_produce(bootstrap: str, messages: int, value: bytes, shape: KafkaShape) -> None:
    """`messages` records of `value` through kafka-python (acks=all, idempotent, Java's 16 KiB
    batches and 5 ms linger, `shape.in_flight` requests a connection), spread over the topic's
    partitions in turn (or by `shape.keys` keys), every send's result awaited; raises on an error."""
    from kafka import KafkaProducer  # Only this scenario needs the client.

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        batch_size=KAFKA_PYTHON_BATCH_BYTES if shape.batch_bytes is None else shape.batch_bytes,
        linger_ms=KAFKA_PYTHON_LINGER_MS,
        max_in_flight_requests_per_connection=shape.in_flight,
    )
    failures: list[str] = []

    def failed(error: Exception) -> None:
        if len(failures) < KAFKA_FAILURES_KEPT:
            failures.append(str(error))

    try:
        keys: list[bytes | None] = [f"key-{index}".encode() for index in range(shape.keys)] or [None]
        for index in range(messages):  # Failures by callback: no future is kept per record.
            producer.send(
                TOPIC,
                value,
                key=keys[index % len(keys)],
                partition=None if shape.keys else index % shape.partitions,
            ).add_errback(failed)
        producer.flush(PRODUCER_TIMEOUT_S)
    finally:
        producer.close()
    if failures:
        raise click.ClickException(f"Kafka produce failed: {failures[0]}")


def report(
    scenario: str, messages: int, elapsed_s: float, cpu_us: dict[str, float], profiles: dict[str, str]
) -> list[str]:
    """The text printed: rate, CPU per message per node, and each profiled node's busiest threads."""
    lines = [f"{scenario}: {messages:,} messages in {elapsed_s:.2f} s = {messages / elapsed_s:,.0f} msgs/s"]
    lines.append(
        "server CPU µs/msg: "
        + ", ".join(f"{name} {value:,.1f}" for name, value in cpu_us.items())
        + f"; all nodes {sum(cpu_us.values()):,.1f}"
    )
    for name, raw in profiles.items():
        for thread, parts in thread_profile(raw).items():
            lines.append(f"\n{name} {thread}: {parts['busy'][0][1]} busy samples")
            width = max(1, parts["busy"][0][1])
            for kind in ("self", "total"):
                lines += [f"  {kind:5} {100 * n / width:5.1f}%  {frame}" for frame, n in parts[kind]]
    return lines


@click.command()
@click.option("--scenario", type=click.Choice(SCENARIOS), default="one-in-flight", show_default=True)
@click.option("--messages", type=click.IntRange(1, 10_000_000), default=3_000, show_default=True)
@click.option("--value-bytes", type=click.IntRange(1, 1024 * 1024), default=100, show_default=True)
@click.option("--spy-seconds", type=click.FloatRange(0, 600), default=8.0, show_default=True)
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--timeline", is_flag=True, help="One-in-flight: each step's median time (see the docstring).")
@click.option("--native", is_flag=True, help="py-spy unwinds C frames too (see the docstring).")
@click.option(
    "--kafka-batch-bytes",
    type=click.IntRange(1024, 16 * 1024 * 1024),
    default=None,
    help=(
        "Either Kafka scenario's batch.size (default: librdkafka's kq.bench.scale's, 1,000,000;"
        " kafka-python's 16384)."
    ),
)
@click.option(
    "--keys",
    type=click.IntRange(0, 1_000_000),
    default=0,
    show_default=True,
    help="kafka-producer, kafka-python-producer: keys the records cycle through (0: no key).",
)
@click.option(
    "--partitions",
    type=click.IntRange(1, 1_000),
    default=None,
    help="The topic's partitions (default: 1 one in flight, 6 otherwise).",
)
@click.option(
    "--kafka-in-flight",
    type=click.IntRange(1, 5),
    default=5,
    show_default=True,
    help="Either Kafka scenario: requests a connection keeps in flight (1: it waits for each answer).",
)
def main(
    scenario: str,
    messages: int,
    value_bytes: int,
    spy_seconds: float,
    output_dir: Path | None,
    timeline: bool,
    native: bool,
    kafka_batch_bytes: int | None,
    keys: int,
    partitions: int | None,
    kafka_in_flight: int,
) -> None:
    """Profiles one workload on a fresh three-node cluster (see the module docstring)."""
    if timeline:
        if scenario != "one-in-flight":
            raise click.UsageError("--timeline needs --scenario one-in-flight")
        with work_dir(None, "kq-timeline-") as base:
            click.echo("\n".join(run_timeline(base, messages, b"v" * value_bytes)))
        return
    with work_dir(None, "kq-profile-") as base, LocalCluster(base / "cluster") as cluster:
        leader = cluster.wait_ready()
        with KqClient(cluster.bootstrap) as admin:
            partitions = partitions or PARTITIONS[scenario]
            admin.create_topic(TOPIC, partitions)
        value = b"v" * value_bytes
        shape = KafkaShape(kafka_batch_bytes, keys, kafka_in_flight, partitions)
        run_workload(cluster, scenario, min(messages, 300), value, shape)  # Warm-up: connections, ids.
        pids = cluster.pids()
        follower = next(node for node in sorted(pids) if node != leader)
        names = {"leader": pids[leader], "follower": pids[follower]}
        click.echo(f"leader: node {leader}; follower profiled: node {follower}")
        spy_dir = output_dir or Path(tempfile.mkdtemp(dir=base))
        spy_dir.mkdir(parents=True, exist_ok=True)
        before = procfs.cpu_seconds_each(pids)
        kafka = scenario in KAFKA_SCENARIOS  # Only their requests are counted (the leader's metrics).
        metrics_url = cluster.nodes[leader].metrics_url
        requests_before = metric_sum(metrics_url, PRODUCE_REQUESTS_METRIC) if kafka else 0.0
        entries_before = metric_sum(metrics_url, COMMIT_INDEX_METRIC) if kafka else 0.0
        with spying(names, spy_seconds, spy_dir, native) as files:
            elapsed_s = run_workload(cluster, scenario, messages, value, shape)
            after = procfs.cpu_seconds_each(pids)
        requests = metric_sum(metrics_url, PRODUCE_REQUESTS_METRIC) - requests_before if kafka else 0.0
        entries = metric_sum(metrics_url, COMMIT_INDEX_METRIC) - entries_before if kafka else 0.0
        cpu_us = {
            ("leader " if node == leader else "follower ") + node: (after[node] - before[node])
            * 1e6
            / messages
            for node in sorted(pids)
        }
        profiles = {name: path.read_text() for name, path in files.items() if path.exists()}
        lines = report(scenario, messages, elapsed_s, cpu_us, profiles)
        if requests > 0 and entries > 0:  # What a request and an entry cost is what their records share.
            lines.insert(
                1,
                f"{requests:,.0f} Produce requests: {messages / requests:,.1f} records a request; "
                f"{entries:,.0f} Raft entries: {requests / entries:,.2f} requests an entry",
            )
        click.echo("\n".join(lines))


def metric_sum(metrics_url: str, metric: str) -> float:
    """The sum of a node's samples whose line starts with `metric`: the Kafka Produce requests it has
    answered (PRODUCE_REQUESTS_METRIC, the request latency's count), or the entries its Raft groups
    committed (COMMIT_INDEX_METRIC). The entries include the few of group changes and heartbeats."""
    with urllib.request.urlopen(metrics_url, timeout=METRICS_TIMEOUT_S) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(metric))


def run_timeline(base: Path, messages: int, value: bytes) -> list[str]:
    """One-in-flight on three `kq.broker.timeline` nodes; the report of `timeline`."""
    readings = base / "timeline"
    readings.mkdir()
    previous = os.environ.get(TIMELINE_DIRECTORY_VARIABLE)
    os.environ[TIMELINE_DIRECTORY_VARIABLE] = str(readings)  # The nodes inherit the environment.
    try:
        with LocalCluster(base / "cluster", node_command=(sys.executable, "-m", TIMELINE_MODULE)) as cluster:
            leader = cluster.wait_ready()
            with KqClient(cluster.bootstrap) as admin:
                admin.create_topic(TOPIC, PARTITIONS["one-in-flight"])
            run_workload(cluster, "one-in-flight", min(messages, 300), value)  # Warm-up.
            leader_pid = cluster.pids()[leader]
            started = time.perf_counter_ns()
            elapsed_s = run_workload(cluster, "one-in-flight", messages, value)
            window = (started, time.perf_counter_ns())
        # The nodes wrote their readings as they stopped (stopped by their PIDs when the block ended).
    finally:
        if previous is None:
            os.environ.pop(TIMELINE_DIRECTORY_VARIABLE, None)
        else:
            os.environ[TIMELINE_DIRECTORY_VARIABLE] = previous
    events = {
        int(path.stem): [tuple(event) for event in json.loads(path.read_text())]
        for path in readings.glob("*.json")
    }
    rate = f"one-in-flight: {messages:,} messages in {elapsed_s:.2f} s = {messages / elapsed_s:,.0f} msgs/s"
    return [rate, *timeline(events, leader_pid, window)]


if __name__ == "__main__":
    main()
