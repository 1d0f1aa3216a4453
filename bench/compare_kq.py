"""kq's side of the side-by-side benchmark: a three-node `LocalCluster` and kq's own Python client.

Pipelined produce uses `client.Producer` (linger, batch size, requests in flight) from one
thread; the extra send_batch scenarios use `KqClient.send_batch` from several threads, each with
its own client and about `kq_batch_bytes` of values per request. Consume reads from a
follower with 10,000 records per fetch. Failover kills the Raft leader (`LocalCluster.wait_ready()`,
which returns the leader `kq.deploy.cluster.agreed_leader` defines) with -9 under load.

With `kq_security="tls"` the nodes serve gRPC over mutual TLS (`LocalCluster(tls_dir=...)`:
certificates from kq.deploy.certs in the cluster's `certs/`), every client here presents the
`admin` certificate, and the start fails unless the nodes refuse plain text (`kq.deploy.tls_probe`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

from kq.bench.failover import AckLog, FailoverSample, kill_leader_under_load
from kq.bench.produce_fetch import (
    LatencySample,
    ThroughputSample,
    fetch_throughput,
    produce_latency,
    produce_throughput,
)
from kq.bench.settings import FETCH_BYTES_PER_REQUEST, FETCH_RECORDS_PER_REQUEST
from kq.bench.side_by_side import (
    FAILOVER,
    LATENCY,
    PRODUCE_LARGE,
    PRODUCE_LARGE_THREADS,
    PRODUCE_SMALL,
    PRODUCE_SMALL_THREADS,
    SCENARIOS,
    CompareSettings,
)
from kq.client import KqClient, KqClientError, Producer, TlsConfig
from kq.client.producer import RecordFuture
from kq.deploy.cluster import LocalCluster
from kq.deploy.tls_probe import plain_text_problems

LATENCY_WARMUP_SENDS = 20
TIME_CHECK_EVERY = 1024  # Sends between two looks at the clock.
WRITER_RPC_TIMEOUT_S = 1.0  # Failover writers: one attempt; the client retries within the next bound.
WRITER_RETRY_TIMEOUT_S = 5.0
JOIN_GRACE_S = 30.0
TOPICS = {
    LATENCY: "cmp-latency",
    PRODUCE_SMALL: "cmp-100b",
    PRODUCE_LARGE: "cmp-1kib",
    FAILOVER: "cmp-failover",
}
TOPICS[PRODUCE_SMALL_THREADS] = TOPICS[PRODUCE_SMALL]
TOPICS[PRODUCE_LARGE_THREADS] = TOPICS[PRODUCE_LARGE]


class KqSystem:
    """A started three-node kq cluster with the benchmark topics; a context manager that stops it."""

    name = "kq"

    def __init__(self, settings: CompareSettings, base_dir: Path) -> None:
        self.settings = settings
        self.cluster = secure_cluster(base_dir / "kq", settings)
        self._stack = ExitStack()

    @property
    def tls(self) -> TlsConfig | None:
        """How every client here reaches the nodes (None: plain text)."""
        return self.cluster.tls

    def __enter__(self) -> KqSystem:
        self._stack.enter_context(self.cluster)
        try:
            check_tls(self.cluster)
            with KqClient(self.cluster.bootstrap, tls=self.tls) as admin:
                admin.create_topic(TOPICS[LATENCY], 1)
                admin.create_topic(TOPICS[PRODUCE_SMALL], self.settings.partitions)
                admin.create_topic(TOPICS[PRODUCE_LARGE], self.settings.partitions)
                admin.create_topic(TOPICS[FAILOVER], self.settings.counts.failover_writers)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stack.close()

    def scenarios(self) -> tuple[str, ...]:
        """The shared scenarios, with the send_batch ones after the Producer's when asked for."""
        if not self.settings.kq_send_batch:
            return SCENARIOS
        produce_end = SCENARIOS.index(PRODUCE_LARGE) + 1
        extra = (PRODUCE_SMALL_THREADS, PRODUCE_LARGE_THREADS)
        return SCENARIOS[:produce_end] + extra + SCENARIOS[produce_end:]

    def server_pids(self) -> dict[str, int]:
        """The PID of each running node."""
        return self.cluster.pids()

    def describe(self) -> dict[str, Any]:
        """How kq was driven."""
        settings = self.settings
        produce = (
            f"client.Producer(linger_ms={settings.kq_linger_ms}, batch_size={settings.kq_batch_bytes}, "
            f"max_in_flight={settings.kq_max_in_flight}, acks='all'), one sending thread"
        )
        send_batch = (
            f"KqClient.send_batch from {settings.kq_threads} threads (one client each), "
            f"{settings.kq_batch_bytes:,} bytes of values per request"
        )
        return {
            "server": "kq-node (3 processes, PySyncObj Raft, LMDB)",
            "produce_client": produce,
            "send_batch_client": send_batch if settings.kq_send_batch else "not measured",
            "latency_client": "KqClient.send, one record in flight, partition 0 of a 1-partition topic",
            "consume_client": f"KqClient.fetch from a follower, max_records={FETCH_RECORDS_PER_REQUEST}",
            "failover": "kill -9 of the agreed leader; writers: KqClient.send, one in flight each",
            "partitions": settings.partitions,
            "durability": f"kq-node --durability={settings.kq_durability}",
            "security": describe_security(settings, "gRPC"),
        }

    def latency(self, sends: int) -> LatencySample:
        """One record in flight to partition 0 of a one-partition topic."""
        value = b"v" * 100
        return produce_latency(
            self.cluster.bootstrap,
            TOPICS[LATENCY],
            sends,
            value,
            LATENCY_WARMUP_SENDS,
            self.settings.scenario_time_cap_s,
            self.tls,
        )

    def produce(self, scenario: str, value: bytes, records: int) -> ThroughputSample:
        """Pipelined produce: the Producer, or send_batch from threads for the send_batch scenarios."""
        if scenario not in (PRODUCE_SMALL_THREADS, PRODUCE_LARGE_THREADS):
            return self._produce_with_producer(TOPICS[scenario], value, records)
        settings = self.settings
        return produce_throughput(
            self.cluster.bootstrap,
            TOPICS[scenario],
            settings.partitions,
            settings.kq_threads,
            max(1, settings.kq_batch_bytes // len(value)),
            records,
            value,
            1,
            settings.scenario_time_cap_s,
            self.tls,
        )

    def _produce_with_producer(self, topic: str, value: bytes, records: int) -> ThroughputSample:
        """One thread sends through `client.Producer`; the clock stops when `flush()` returns."""
        settings = self.settings
        with KqClient(self.cluster.bootstrap, tls=self.tls) as kq:
            producer = Producer(
                kq,
                linger_ms=settings.kq_linger_ms,
                batch_size=settings.kq_batch_bytes,
                max_in_flight=settings.kq_max_in_flight,
                acks="all",
            )
            try:
                producer.send(topic, value).result(timeout=settings.scenario_time_cap_s)  # Warm-up.
                tally = FutureTally()
                started = time.monotonic()
                deadline = started + settings.scenario_time_cap_s
                for number in range(records):
                    if number % TIME_CHECK_EVERY == 0 and time.monotonic() >= deadline:
                        break
                    tally.watch(producer.send(topic, value))
                producer.flush(timeout_s=max(0.0, deadline - time.monotonic()) + JOIN_GRACE_S)
                elapsed_s = time.monotonic() - started
            finally:
                producer.close()
        return ThroughputSample(tally.acked, tally.acked * len(value), tally.sent, tally.errors, elapsed_s)

    def ensure_records(self, scenario: str, value: bytes, records: int) -> None:
        """Produces (untimed) until the topic holds at least `records` records."""
        with KqClient(self.cluster.bootstrap, tls=self.tls) as admin:
            offsets = admin.list_offsets(TOPICS[scenario]).values()
            held = sum(o.log_end_offset - o.log_start_offset for o in offsets)
        if held < records:
            self.produce(scenario, value, records - held)

    def consume(self, records: int) -> ThroughputSample:
        """Reads the 100-byte topic from its start on a follower, 10,000 records per fetch."""
        leader = self.cluster.wait_ready()
        follower = next(node for node in sorted(self.cluster.nodes) if node != leader)
        return fetch_throughput(
            self.cluster.bootstrap,
            self.cluster.nodes[follower].grpc_address,
            TOPICS[PRODUCE_SMALL],
            FETCH_RECORDS_PER_REQUEST,
            FETCH_BYTES_PER_REQUEST,
            records,
            self.settings.scenario_time_cap_s,
            self.tls,
        )

    def failover(self) -> FailoverSample:
        """Writers (one record in flight each) run; the leader is killed; the killed node rejoins."""
        bootstrap, tls = self.cluster.bootstrap, self.tls

        def write(partition: int, log: AckLog, stop: threading.Event) -> None:
            _writer(bootstrap, tls, TOPICS[FAILOVER], partition, log, stop)

        return kill_leader_under_load(
            self.cluster,
            write,
            self.settings.counts.failover_writers,
            "bench-failover",
            self.settings,
            WRITER_RETRY_TIMEOUT_S,
        )


class FutureTally:
    """Counts the outcomes of sends as their futures complete (the Producer bounds how many are pending)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent = self.acked = self.errors = 0

    def watch(self, future: RecordFuture) -> None:
        """Counts this send's outcome when it completes."""
        self.sent += 1
        future.add_done_callback(self._done)

    def _done(self, future: RecordFuture) -> None:
        failed = future.cancelled() or future.exception() is not None
        with self._lock:
            if failed:
                self.errors += 1
            else:
                self.acked += 1


def _writer(
    bootstrap: Sequence[str],
    tls: TlsConfig | None,
    topic: str,
    partition: int,
    log: AckLog,
    stop: threading.Event,
) -> None:
    """Sends one record at a time until `stop`, logging each acknowledgement and failure."""
    value = b"v" * 100
    with KqClient(
        bootstrap, rpc_timeout_s=WRITER_RPC_TIMEOUT_S, retry_timeout_s=WRITER_RETRY_TIMEOUT_S, tls=tls
    ) as kq:
        while not stop.is_set():
            sent_at = time.monotonic()
            try:
                kq.send(topic, value, partition=partition)
            except KqClientError:
                log.error()
            else:
                log.ack(sent_at)


def secure_cluster(base_dir: Path, settings: CompareSettings) -> LocalCluster:
    """A kq system's three-node cluster in `base_dir`: the run's durability, and under
    `kq_security="tls"` mutual TLS on gRPC and TLS on the Kafka listeners, with certificates made
    into `base_dir/certs` (kq.deploy.certs)."""
    tls_dir = base_dir / "certs" if settings.kq_security == "tls" else None
    return LocalCluster(base_dir, durability=settings.kq_durability, tls_dir=tls_dir)


def check_tls(cluster: LocalCluster) -> None:
    """For a TLS cluster: raises RuntimeError unless every node refuses plain text and answers TLS
    (`kq.deploy.tls_probe`), so a TLS column never measures plain text by mistake."""
    if cluster.tls_dir is None:
        return
    problems = plain_text_problems(cluster)
    if problems:
        raise RuntimeError("the nodes do not speak TLS only: " + "; ".join(problems))


def describe_security(settings: CompareSettings, protocol: str) -> str:
    """The report's line on how the clients reached the nodes."""
    if settings.kq_security != "tls":
        return f"{protocol} in plain text on loopback"
    return (
        f"{protocol} over TLS (ECDSA P-256 certificates from kq.deploy.certs, the client presenting "
        "'admin'; nodes with --tls-require-client-cert and --kafka-tls); plain-text clients checked "
        "refused at the start"
    )
