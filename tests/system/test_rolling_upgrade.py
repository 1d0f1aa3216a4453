"""A rolling upgrade (issue 37, acceptance point 5): a three-node cluster of the commit before issue 37,
holding data, is restarted node by node on this checkout's code while a producer and a consumer group
run; nothing acknowledged is lost, every node serves every record, the group's commits hold, and the
upgraded data directories carry this kq's format marker.

The old nodes run kq's wheel of that commit, built once into a virtualenv kept in pytest's cache
(tests/system/wheels.py `release_venv`). The upgrade's path is the one an operator takes: stop a node
(SIGTERM, or kill -9 for the last), start it on the new code with the same data directory, ports and
arguments, wait until it has applied what the leader had, go on to the next; the leader is among them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from kq.client import KqClient, KqClientError, ProducerRecord
from kq.deploy.cluster import LocalCluster, agreed_leader, default_node_command, free_ports
from kq.deploy.reading import PartitionReadError, read_partition
from kq.deploy.waiting import wait_for
from kq.raft.data_dir import DATA_DIR_LAYOUT, read_layout
from tests.system.checks import read_everywhere
from tests.system.groups import agreed_leaders
from tests.system.wheels import REPO, commit_hash, release_venv, run_outside

pytestmark = pytest.mark.system

OLD_COMMIT = "c216126"  # The commit before issue 37 ("Scale out, part 1"): the release upgraded from.
TOPIC, PARTITIONS, GROUP = "upgrade", 6, "upgrade-readers"
RECORDS_BEFORE = 3_000  # Acknowledged by the old cluster before the upgrade starts, in 50 sends.
RECORDS_BEFORE_SEND = 60
RECORD_BEFORE_BYTES = 1_024  # 3 MiB in all: each old node compacts (writes a snapshot) twice or more.
BURST_RECORDS, BURST_SEND, BURST_RECORD_BYTES = 320, 16, 8_192  # 2.5 MiB while the first node is down.
BATCH_RECORDS = 12  # A send of the producer: two small records a partition.
PRODUCER_PAUSE_S = 0.02  # Between sends: three nodes, a consumer and the checks share two cores.
ACKS_PER_STEP = 200  # Acknowledged after each restart before the next: writes go through the mixed cluster.
# A node compacts its Raft log (writes a snapshot) after each MiB of entries and at no other time in
# the test: the old nodes do while the data goes in, so the new code reads an old snapshot beside an
# old journal; the leader does while the first node is down (a burst), so that node, back on the new
# code, is sent a copy of the old leader's store; the producer's small records alone reach no MiB.
NODE_ARGS = ("--compaction-log-mib", "1", "--compaction-min-entries", "1000000")
# How each node leaves the old code: the leader stops as an operator stops it, the last one crashes.
STOPS = ("stop", "stop", "kill")
NEW_PROCESSES = 3  # Worker processes of the upgraded nodes in the second run of the test.
WAIT_TIMEOUT_S = 60.0  # Elections, restarts and catching up take seconds; this bounds a stuck cluster.
JOIN_TIMEOUT_S = 10.0  # The threads, once told to stop.
# A node that applied what it is read at answers at once: an empty answer below the end is a hole.
READ_TIMEOUT_S = 5.0
Acked = tuple[int, int, bytes]  # (partition, offset, value) of an acknowledged record.


@pytest.fixture(scope="module")
def old_release(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The virtualenv of the old commit's wheel, from pytest's cache when it has one."""
    cache = getattr(request.config, "cache", None)
    cache_dir = cache.mkdir("kq-releases") if cache is not None else tmp_path_factory.mktemp("releases")
    return release_venv(commit_hash(OLD_COMMIT), cache_dir)


class Producer:
    """A thread sending numbered records to every partition until stopped, keeping each ack."""

    def __init__(self, bootstrap: list[str], first: int) -> None:
        self.acked: list[Acked] = []
        self.index = 0  # The highest Raft index of an acknowledged send.
        self.errors: list[BaseException] = []
        self._client = KqClient(bootstrap)
        self._next = first
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="upgrade-producer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            numbers = range(self._next, self._next + BATCH_RECORDS)
            try:
                sent = send(self._client, [value_of("during", n) for n in numbers])
            except Exception as error:  # The client must ride out every restart by itself.
                self.errors.append(error)
                return
            self.index = self._client.index_seen  # Before the acks: `acknowledged` reads them first.
            self.acked += sent
            self._next += BATCH_RECORDS
            self._stop.wait(PRODUCER_PAUSE_S)  # Pacing, not synchronisation.

    def acknowledged(self) -> tuple[list[Acked], int]:
        """The acks so far and a Raft index that covers them all."""
        acked = list(self.acked)
        return acked, self.index

    def stop(self) -> bool:
        """Stops sending; whether the thread ended (a send in flight retries up to its timeout)."""
        self._stop.set()
        self._thread.join(JOIN_TIMEOUT_S + WAIT_TIMEOUT_S)
        self._client.close()
        return not self._thread.is_alive()


class GroupReader:
    """A librdkafka consumer in GROUP on the Kafka listeners, auto-committing, polled by its thread."""

    def __init__(self, kafka_bootstrap: str) -> None:
        self.read: dict[tuple[int, int], bytes] = {}  # (partition, offset) -> value, as read.
        self.lock = threading.Lock()  # Held by the thread while it adds to `read`.
        self.conflicts: list[str] = []  # An offset read twice with two values.
        self.errors: list[str] = []  # Fatal errors only: a node restarting is a transient one.
        self._consumer = Consumer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "group.id": GROUP,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": True,
                "auto.commit.interval.ms": 500,
                "session.timeout.ms": 6_000,
                "heartbeat.interval.ms": 500,
                "reconnect.backoff.max.ms": 1_000,
                "log_level": 2,  # A node down is logged as an error by librdkafka: expected here.
            }
        )
        self._consumer.subscribe([TOPIC])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="upgrade-consumer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for message in self._consumer.consume(500, 0.2):
                    error = message.error()
                    if error is not None:
                        if error.fatal():
                            self.errors.append(str(error))
                        continue
                    key = (int(message.partition() or 0), int(message.offset() or 0))
                    value = message.value() or b""
                    with self.lock:
                        if self.read.setdefault(key, value) != value:
                            self.conflicts.append(f"{key}: {self.read[key]!r} and {value!r}")
        finally:
            self._consumer.close()  # Commits what was read (auto-commit) and leaves the group.

    def offsets(self) -> set[tuple[int, int]]:
        """The (partition, offset) pairs read so far."""
        with self.lock:
            return set(self.read)

    def stop(self) -> bool:
        """Stops reading, commits and leaves the group; whether the thread ended."""
        self._stop.set()
        self._thread.join(JOIN_TIMEOUT_S + WAIT_TIMEOUT_S)
        return not self._thread.is_alive()


class CommitWatch:
    """The group's committed offsets as each node reports them, checked at each call: never lower than
    any seen before (from any node: each read carries the highest Raft index seen) and never past the
    node's log end."""

    def __init__(self, client: KqClient) -> None:
        self.highest: dict[tuple[str, int], int] = {}
        self._client = client

    def check(self, cluster: LocalCluster) -> None:
        for node_id, spec in cluster.nodes.items():
            if not cluster.running(node_id):
                continue
            committed = self._client.committed_offsets(GROUP, node=spec.grpc_address)
            ends = self._client.list_offsets(TOPIC, spec.grpc_address)  # After: log ends only grow.
            for (topic, partition), offset in committed.items():
                before = self.highest.get((topic, partition), 0)
                assert offset >= before, f"node {node_id}: {topic}/{partition} committed {offset} < {before}"
                end = ends[partition].log_end_offset
                assert offset <= end, f"node {node_id}: {topic}/{partition} committed {offset} > end {end}"
                self.highest[(topic, partition)] = offset


def value_of(phase: str, number: int, size: int = 0) -> bytes:
    """A record's value: unique by phase and number, padded to `size` bytes."""
    return f"{phase}-{number:08d}".encode().ljust(size, b".")


def send(client: KqClient, values: list[bytes]) -> list[Acked]:
    """Sends the values round-robin over the partitions (by their position); what was acknowledged."""
    batch = [ProducerRecord(value, partition=i % PARTITIONS) for i, value in enumerate(values)]
    sent = client.send_batch(TOPIC, batch)
    return [(m.partition, m.offset, value) for m, value in zip(sent, values, strict=True)]


@pytest.fixture(params=[1, NEW_PROCESSES], ids=["one-process", f"{NEW_PROCESSES}-processes"])
def new_processes(request: pytest.FixtureRequest) -> int:
    """The worker processes each node runs once upgraded (`kq-node --processes`)."""
    return int(request.param)


@pytest.fixture
def old_cluster(tmp_path: Path, old_release: Path, new_processes: int) -> Iterator[LocalCluster]:
    """Three nodes of the old commit (with Kafka listeners), stopped by PID at the end; their ports
    leave room for `new_processes` workers each (a worker binds the node's ports plus its group)."""
    ports = [free_ports(3, new_processes) for _ in range(4)]
    cluster = LocalCluster(
        tmp_path / "cluster",
        node_command=[str(old_release / "bin" / "kq-node")],
        node_args=NODE_ARGS,
        grpc_ports=ports[0],
        raft_ports=ports[1],
        kafka_ports=ports[2],
        http_ports=ports[3],
    )
    try:
        cluster.start(WAIT_TIMEOUT_S)
        yield cluster
    finally:
        cluster.stop()


def test_a_rolling_upgrade_from_the_commit_before_issue_37_loses_nothing(
    old_cluster: LocalCluster, old_release: Path, tmp_path: Path, new_processes: int
) -> None:
    """Old cluster with data; each node restarted on this code under a producer and a consumer group
    (the leader among them); every ack at its offset on every node, commits monotonic, markers written.
    Restarted with worker processes, the old topic stays in group 0 and a new one spreads."""
    cluster = old_cluster
    assert_runs_the_release(old_release, tmp_path)
    for spec in cluster.nodes.values():
        assert read_layout(spec.data_dir) is None, "the old release writes no format marker"
    with KqClient(cluster.bootstrap) as client:
        client.create_topic(TOPIC, PARTITIONS)
        acked: list[Acked] = []
        for start in range(0, RECORDS_BEFORE, RECORDS_BEFORE_SEND):
            numbers = range(start, start + RECORDS_BEFORE_SEND)
            acked += send(client, [value_of("before", n, RECORD_BEFORE_BYTES) for n in numbers])
        wait_until_compacted(cluster)
        commits = CommitWatch(client)
        producer = Producer(cluster.bootstrap, RECORDS_BEFORE)
        reader = GroupReader(cluster.kafka_bootstrap)
        try:
            wait_for(
                lambda: len(client.committed_offsets(GROUP)) == PARTITIONS,
                "the group's first commits on every partition",
                WAIT_TIMEOUT_S,
            )
            commits.check(cluster)
            stopped_leaders = upgrade_node_by_node(
                cluster, client, acked, producer, reader, commits, new_processes
            )
            assert stopped_leaders, "no node was the leader when it was stopped"
            assert producer.stop(), "the producer did not stop"
            assert not producer.errors, producer.errors
            acked += producer.acked
            wanted = {(partition, offset) for partition, offset, _ in acked}
            wait_for(
                lambda: wanted <= reader.offsets() or bool(reader.errors),
                "the group to read every acknowledged record",
                WAIT_TIMEOUT_S,
                last_state=lambda: f"{len(wanted - reader.offsets())} of {len(wanted)} unread",
            )
        finally:
            producer.stop()
            reader_stopped = reader.stop()  # Its close commits the group's last offsets.
        assert reader_stopped, "the consumer did not stop"
        assert not reader.errors and not reader.conflicts, (reader.errors, reader.conflicts[:5])
        misread = [(p, offset) for p, offset, value in acked if reader.read[(p, offset)] != value]
        assert not misread, f"the group read other values at {len(misread)} offsets, first {misread[:3]}"
        cluster.wait_applied(max(producer.index, client.index_seen), list(cluster.nodes))
        assert_every_node_holds(client, cluster, acked)
        commits.check(cluster)  # After the group's last commit (its close).
        assert_accepts_writes(client, cluster)
        if new_processes > 1:
            assert_groups_after_the_upgrade(client, cluster, new_processes)
    for spec in cluster.nodes.values():
        assert read_layout(spec.data_dir) == DATA_DIR_LAYOUT, f"{spec.data_dir} carries no marker"


def upgrade_node_by_node(
    cluster: LocalCluster,
    client: KqClient,
    acked: list[Acked],
    producer: Producer,
    reader: GroupReader,
    commits: CommitWatch,
    processes: int,
) -> list[str]:
    """Restarts each node on this checkout's code, a follower first, then the leader if it is still on
    the old code; after each, waits for it to catch up, checks that it serves every record acknowledged
    so far, and waits for new acks and reads. `acked` (the test's acks) gets the burst sent while the
    first node is down. Returns the nodes that were the leader when stopped."""
    upgraded: list[str] = []
    stopped_leaders = []
    for way in STOPS:
        leader = cluster.wait_ready(WAIT_TIMEOUT_S)
        old = [node for node in cluster.nodes if node not in upgraded]
        if upgraded and leader in old:
            node = leader
        else:
            node = next((follower for follower in old if follower != leader), old[0])
        if node == leader:
            stopped_leaders.append(node)
        if way == "kill":
            cluster.kill_node(node)
        else:
            cluster.stop_node(node)
        if not upgraded:
            acked += compact_past_a_stopped_node(cluster, client)
        cluster.set_node_command(node, default_node_command())
        if processes > 1:
            cluster.set_node_args(node, ("--processes", str(processes)))
        cluster.start_node(node)
        upgraded.append(node)
        leader = cluster.wait_ready(WAIT_TIMEOUT_S)
        status = cluster.statuses()[leader]
        assert status is not None, f"the leader {leader} stopped answering"
        produced, index = producer.acknowledged()
        cluster.wait_applied(max(status.applied_index, index), [node], WAIT_TIMEOUT_S)
        assert_node_holds(client, cluster, node, acked + produced)
        wait_for_progress(producer, reader, f"node {node} came back on the new code")
        commits.check(cluster)
    return stopped_leaders


def compact_past_a_stopped_node(cluster: LocalCluster, client: KqClient) -> list[Acked]:
    """While a node is down: sends more than two MiB (two compactions' worth) and waits until the
    leader's Raft log starts after the first of them, past all the stopped node holds, so that node
    can only catch up through a copy of the leader's store. Returns the acks."""
    acked: list[Acked] = []
    first_index = 0  # A Raft index of the first send: after everything the stopped node holds.
    for start in range(0, BURST_RECORDS, BURST_SEND):
        numbers = range(start, start + BURST_SEND)
        acked += send(client, [value_of("burst", n, BURST_RECORD_BYTES) for n in numbers])
        first_index = first_index or client.index_seen
    seen: list[str] = []

    def compacted_past() -> bool:
        statuses = cluster.statuses()
        leader = agreed_leader(statuses, len(cluster.nodes))
        status = statuses[leader] if leader is not None else None
        seen[:] = [f"leader {leader}: {status}"]
        # Its log's first index is at least commit_index - raft_log_entries + 1.
        return status is not None and status.commit_index - status.raft_log_entries >= first_index

    wait_for(
        compacted_past,
        f"the leader's log to start after index {first_index}",
        WAIT_TIMEOUT_S,
        last_state=lambda: "; ".join(seen),
    )
    return acked


def wait_for_progress(producer: Producer, reader: GroupReader, since: str) -> None:
    """Waits for ACKS_PER_STEP more acks and some more reads; fails at once on an error of either."""
    acks, reads = len(producer.acked), len(reader.offsets())

    def moved() -> bool:
        assert not producer.errors and not reader.errors, (producer.errors, reader.errors)
        return len(producer.acked) >= acks + ACKS_PER_STEP and len(reader.offsets()) > reads

    wait_for(moved, f"writes and reads after {since}", WAIT_TIMEOUT_S)


def wait_until_compacted(cluster: LocalCluster) -> None:
    """Waits until every node's Raft log starts after index 1: each has written a snapshot."""

    def compacted() -> bool:
        statuses = cluster.statuses().values()
        return all(s is not None and s.raft_log_entries < s.applied_index for s in statuses)

    wait_for(compacted, "every old node to compact its Raft log", WAIT_TIMEOUT_S)


def assert_runs_the_release(old_release: Path, tmp_path: Path) -> None:
    """The old nodes' `kq` is the release's, not this checkout's, as kq-node imports it: a script run
    from the test's working folder with the test's environment (what LocalCluster gives its nodes)."""
    probe = tmp_path / "which_kq.py"
    probe.write_text("import kq\nprint(kq.__file__)\n")
    where = run_outside([str(old_release / "bin" / "python"), str(probe)], cwd=REPO).strip()
    assert Path(where).is_relative_to(old_release), f"the old nodes would import kq from {where}"


def assert_node_holds(client: KqClient, cluster: LocalCluster, node: str, acked: list[Acked]) -> None:
    """Node `node`, asked itself, holds every record of `acked` at its offset with its value."""
    address = cluster.nodes[node].grpc_address
    for partition in range(PARTITIONS):
        wanted = {offset: value for p, offset, value in acked if p == partition}
        end = max(wanted, default=-1) + 1
        try:
            held = read_partition(client, TOPIC, partition, address, 0, end, timeout_s=READ_TIMEOUT_S)
            values = {record.offset: record.value for record in held}
        except (KqClientError, PartitionReadError) as error:
            raise AssertionError(f"node {node} cannot serve {TOPIC}/{partition}: {error}") from error
        missing = [offset for offset, value in wanted.items() if values.get(offset) != value]
        assert not missing, f"node {node} lacks {len(missing)} acked records of partition {partition}"


def assert_every_node_holds(client: KqClient, cluster: LocalCluster, acked: list[Acked]) -> None:
    """Every node holds the same records at the same offsets (read from each node itself), each
    acknowledged record at its offset with its value, and no value twice (the producer is idempotent)."""
    assert len({(partition, offset) for partition, offset, _ in acked}) == len(acked), "an offset acked twice"
    held = read_everywhere(client, TOPIC, PARTITIONS, cluster.bootstrap)
    logs = held[cluster.bootstrap[0]]  # Equal on every node: read_everywhere compared them.
    values = {p: {record.offset: record.value for record in records} for p, records in logs.items()}
    missing = [(p, offset, value) for p, offset, value in acked if values[p].get(offset) != value]
    assert not missing, f"{len(missing)} acknowledged records missing or changed, first {missing[:3]}"
    stored = [record.value for records in logs.values() for record in records]
    assert len(stored) == len(set(stored)), "a record is stored twice"


def assert_groups_after_the_upgrade(client: KqClient, cluster: LocalCluster, processes: int) -> None:
    """Nodes upgraded to worker processes: the topic of the old release keeps every partition in group
    0, and a topic created now spreads over every group and takes a record on each partition."""
    assert {client.partition_group(TOPIC, p) for p in range(PARTITIONS)} == {0}
    cluster.processes = processes  # For the harness's view of the workers (tests/system/groups.py).
    wait_for(lambda: agreed_leaders(cluster, list(cluster.nodes)), "every group's leader", WAIT_TIMEOUT_S)
    client.create_topic("after", PARTITIONS)
    assert {client.partition_group("after", p) for p in range(PARTITIONS)} == set(range(processes))
    sent = client.send_batch("after", [ProducerRecord(b"spread", partition=p) for p in range(PARTITIONS)])
    assert [m.offset for m in sent] == [0] * PARTITIONS


def assert_accepts_writes(client: KqClient, cluster: LocalCluster) -> None:
    """A record to each partition after the upgrade is acknowledged and read back from every node."""
    batch = [ProducerRecord(b"after-the-upgrade", partition=p) for p in range(PARTITIONS)]
    sent = client.send_batch(TOPIC, batch)
    cluster.wait_applied(max(m.index for m in sent), list(cluster.nodes))
    for metadata in sent:
        for address in cluster.bootstrap:
            fetched = client.fetch(TOPIC, metadata.partition, metadata.offset, max_records=1, node=address)
            assert [r.value for r in fetched.records] == [b"after-the-upgrade"], (address, metadata)
