"""kq through its Kafka port: the same three-node `LocalCluster` driven by confluent-kafka (librdkafka).

This is the "kq-kafka" column of `python -m kq.bench.compare`: what a stock Kafka client gets from
kq, next to kq's own gRPC client and NATS. Every kq node serves the Kafka wire protocol
(`LocalCluster.kafka_bootstrap`); Metadata names the Raft leader as every partition's leader, so
produce and fetch both go to the leader (kq's gRPC consume reads from a follower instead). Topics
are created with Kafka's CreateTopics (`AdminClient`). The clients:

- one in flight: a `Producer` (acks=all, idempotent, `linger.ms=0`, Nagle off) that produces one
  record and polls until its delivery report arrives before producing the next;
- pipelined: one `Producer` (acks=all, idempotent, `linger.ms` as kq's, `batch.size` as kq's
  batch, librdkafka's 5 requests in flight per broker) from one thread, no key (librdkafka's
  sticky partitioner spreads batches over the partitions), every delivery report counted;
- consume: a `Consumer` assigned every partition from the beginning (no group join), read with
  `consume(10000)`; `fetch.min.bytes=1` (the data is already there: never wait for more),
  `max.partition.fetch.bytes` 1 MiB, `fetch.max.bytes` 4 MiB (kq's per-fetch bound);
- failover: writers, each its own idempotent `Producer` on its own partition with one record in
  flight, librdkafka's own retries (`message.timeout.ms` 30 s) across the kill of the Raft leader.

With `kq_security="tls"` the listeners speak TLS (`--kafka-tls`, mutual TLS required) and every
client here uses `security.protocol=SSL` with the cluster's CA and the `admin` certificate
(`bench.compare_kq.secure_cluster`; the start checks that plain text is refused).
"""

from __future__ import annotations

import threading
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka import __version__ as confluent_version
from confluent_kafka import libversion as librdkafka_version
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kq.bench.compare_kq import check_tls, describe_security, secure_cluster
from kq.bench.failover import AckLog, FailoverSample, kill_leader_under_load
from kq.bench.produce_fetch import LatencySample, ThroughputSample
from kq.bench.side_by_side import (
    FAILOVER,
    LATENCY,
    PRODUCE_LARGE,
    PRODUCE_SMALL,
    SCENARIOS,
    CompareSettings,
)
from kq.proto.limits import FETCH_BYTES_MAX

LATENCY_WARMUP_SENDS = 20
PRODUCE_WARMUP_SENDS = 100
TIME_CHECK_EVERY = 1024  # Sends between two looks at the clock.
POLL_EVERY = 1000  # Sends between two `poll(0)` calls that serve delivery reports.
QUEUE_FULL_POLL_S = 0.01  # librdkafka's local queue is full: serve reports for this long, then retry.
DELIVERY_POLL_S = 1.0  # One wait for a delivery report; returns as soon as one arrives.
CONSUME_BATCH = 10_000  # Messages per `Consumer.consume` call.
CONSUME_POLL_S = 1.0
MAX_PARTITION_FETCH_BYTES = 1024 * 1024
FETCH_MAX_BYTES = FETCH_BYTES_MAX  # kq's bound on one fetch answer.
ADMIN_TIMEOUT_S = 30.0
JOIN_GRACE_S = 30.0
WRITER_MESSAGE_TIMEOUT_MS = 30_000  # librdkafka retries a write this long before reporting it failed.
WRITER_REQUEST_TIMEOUT_MS = 1_000  # One produce attempt.
TOPICS = {
    LATENCY: "cmpk-latency",
    PRODUCE_SMALL: "cmpk-100b",
    PRODUCE_LARGE: "cmpk-1kib",
    FAILOVER: "cmpk-failover",
}


class KqKafkaSystem:
    """A started three-node kq cluster, driven over its Kafka listeners; a context manager that stops it."""

    name = "kq-kafka"

    def __init__(self, settings: CompareSettings, base_dir: Path) -> None:
        self.settings = settings
        self.cluster = secure_cluster(base_dir / "kq-kafka", settings)
        self._stack = ExitStack()

    def __enter__(self) -> KqKafkaSystem:
        self._stack.enter_context(self.cluster)
        try:
            check_tls(self.cluster)
            self._create_topics()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stack.close()

    def _create_topics(self) -> None:
        """Kafka CreateTopics for every benchmark topic (replication is kq's: every node has all)."""
        partitions = {
            LATENCY: 1,
            PRODUCE_SMALL: self.settings.partitions,
            PRODUCE_LARGE: self.settings.partitions,
            FAILOVER: self.settings.counts.failover_writers,
        }
        admin = AdminClient(self._config())
        wanted = [NewTopic(TOPICS[scenario], count, 1) for scenario, count in partitions.items()]
        for future in admin.create_topics(wanted, operation_timeout=ADMIN_TIMEOUT_S).values():
            future.result(ADMIN_TIMEOUT_S)

    def _config(self, **overrides: Any) -> dict[str, Any]:
        """The client settings every client shares (the listeners, and TLS when the cluster has it),
        with this one's overrides."""
        return {"bootstrap.servers": self.cluster.kafka_bootstrap, **self._ssl_config(), **overrides}

    def _ssl_config(self) -> dict[str, Any]:
        """librdkafka's TLS settings for a TLS cluster: its CA, the `admin` certificate and key, the
        node's address checked against its certificate (librdkafka's default, spelled out)."""
        directory = self.cluster.tls_dir
        if directory is None:
            return {}
        return {
            "security.protocol": "SSL",
            "ssl.ca.location": str(directory / "ca.pem"),
            "ssl.certificate.location": str(directory / "admin.pem"),
            "ssl.key.location": str(directory / "admin-key.pem"),
            "ssl.endpoint.identification.algorithm": "https",
        }

    def _producer_config(self, **overrides: Any) -> dict[str, Any]:
        """acks=all and idempotence, as kq's own Producer (and NATS's R3 acknowledgements)."""
        return self._config(**{"acks": "all", "enable.idempotence": True, **overrides})

    def scenarios(self) -> tuple[str, ...]:
        """The shared scenarios (send_batch is kq's gRPC API: not measured here)."""
        return SCENARIOS

    def server_pids(self) -> dict[str, int]:
        """The PID of each running node."""
        return self.cluster.pids()

    def describe(self) -> dict[str, Any]:
        """How kq was driven over Kafka."""
        settings = self.settings
        # confluent_kafka.version() returns a bare string at run time, though typed as a tuple.
        client = f"confluent-kafka {confluent_version} (librdkafka {librdkafka_version()[0]})"
        return {
            "server": "kq-node (3 processes, PySyncObj Raft, LMDB), Kafka listener; Metadata names the "
            "Raft leader for every partition",
            "produce_client": f"{client} Producer(acks=all, enable.idempotence=true, "
            f"linger.ms={settings.kq_linger_ms}, batch.size={settings.kq_batch_bytes}), no key, "
            "one sending thread, a delivery report per message",
            "latency_client": "Producer(acks=all, idempotent, linger.ms=0, socket.nagle.disable=true): "
            "produce one record, poll until its delivery report, next; 1-partition topic",
            "consume_client": f"Consumer assigned every partition from the beginning (no group), "
            f"consume({CONSUME_BATCH}), fetch.min.bytes=1, "
            f"max.partition.fetch.bytes={MAX_PARTITION_FETCH_BYTES}, fetch.max.bytes={FETCH_MAX_BYTES}; "
            "reads from the leader",
            "failover": "kill -9 of the agreed leader; writers: one idempotent Producer each, one record "
            f"in flight, request.timeout.ms={WRITER_REQUEST_TIMEOUT_MS}, librdkafka's retries",
            "partitions": settings.partitions,
            "durability": f"kq-node --durability={settings.kq_durability}",
            "security": describe_security(settings, "Kafka"),
        }

    def latency(self, sends: int) -> LatencySample:
        """One record in flight to the one-partition topic; each produce → delivery report timed."""
        topic, value = TOPICS[LATENCY], b"v" * 100
        producer = Producer(
            self._producer_config(
                **{
                    "linger.ms": 0,
                    "socket.nagle.disable": True,
                    "message.timeout.ms": WRITER_MESSAGE_TIMEOUT_MS,
                }
            )
        )
        outcome: list[KafkaError | None] = []

        def delivered(error: KafkaError | None, message: Message) -> None:
            outcome.append(error)

        def send_one() -> KafkaError | None:
            outcome.clear()
            producer.produce(topic, value, partition=0, on_delivery=delivered)
            while not outcome:
                producer.poll(DELIVERY_POLL_S)
            return outcome[0]

        for _ in range(LATENCY_WARMUP_SENDS):
            send_one()
        latencies_ms: list[float] = []
        errors = 0
        started = time.monotonic()
        deadline = started + self.settings.scenario_time_cap_s
        for _ in range(sends):
            if time.monotonic() >= deadline:
                break
            sent_ns = time.perf_counter_ns()
            if send_one() is not None:
                errors += 1
                continue
            latencies_ms.append((time.perf_counter_ns() - sent_ns) / 1e6)
        elapsed_s = time.monotonic() - started
        producer.flush(JOIN_GRACE_S)
        return LatencySample(tuple(latencies_ms), errors, elapsed_s)

    def produce(self, scenario: str, value: bytes, records: int) -> ThroughputSample:
        """One thread produces `records` copies of `value`; the clock stops when `flush()` returns."""
        settings = self.settings
        topic = TOPICS[scenario]
        tally = DeliveryTally()
        producer = Producer(
            self._producer_config(
                **{
                    "linger.ms": settings.kq_linger_ms,
                    "batch.size": settings.kq_batch_bytes,
                    "on_delivery": tally.delivered,
                }
            )
        )
        for _ in range(PRODUCE_WARMUP_SENDS):  # Connections, metadata and the producer id.
            producer.produce(topic, value)
        producer.flush(settings.scenario_time_cap_s)
        tally.reset()
        started = time.monotonic()
        deadline = started + settings.scenario_time_cap_s
        sent = 0
        for number in range(records):
            if number % TIME_CHECK_EVERY == 0 and time.monotonic() >= deadline:
                break
            while True:
                try:
                    producer.produce(topic, value)
                    break
                except BufferError:  # queue.buffering.max.messages/kbytes: wait for acknowledgements.
                    producer.poll(QUEUE_FULL_POLL_S)
            sent += 1
            if number % POLL_EVERY == 0:
                producer.poll(0)
        producer.flush(max(0.0, deadline - time.monotonic()) + JOIN_GRACE_S)
        elapsed_s = time.monotonic() - started
        return ThroughputSample(tally.acked, tally.acked * len(value), sent, tally.errors, elapsed_s)

    def _held(self, topic: str) -> int:
        """Records in the topic: the sum over its partitions of high minus low watermark (ListOffsets)."""
        consumer = Consumer(self._config(**{"group.id": f"cmpk-{uuid.uuid4().hex[:8]}"}))
        try:
            metadata = consumer.list_topics(topic, timeout=ADMIN_TIMEOUT_S)
            held = 0
            for partition in metadata.topics[topic].partitions:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=ADMIN_TIMEOUT_S
                )
                held += high - low
            return held
        finally:
            consumer.close()

    def ensure_records(self, scenario: str, value: bytes, records: int) -> None:
        """Produces (untimed) until the topic holds at least `records` records."""
        held = self._held(TOPICS[scenario])
        if held < records:
            self.produce(scenario, value, records - held)

    def consume(self, records: int) -> ThroughputSample:
        """A Consumer assigned every partition of the 100-byte topic from offset 0, large batches."""
        topic = TOPICS[PRODUCE_SMALL]
        consumer = Consumer(
            self._config(
                **{
                    "group.id": f"cmpk-{uuid.uuid4().hex[:8]}",
                    "enable.auto.commit": False,
                    "fetch.min.bytes": 1,
                    "max.partition.fetch.bytes": MAX_PARTITION_FETCH_BYTES,
                    "fetch.max.bytes": FETCH_MAX_BYTES,
                }
            )
        )
        received = payload_bytes = calls = errors = 0
        try:
            started = time.monotonic()
            deadline = started + self.settings.scenario_time_cap_s
            consumer.assign(
                [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(self.settings.partitions)]
            )
            while received < records and time.monotonic() < deadline:
                batch = consumer.consume(CONSUME_BATCH, CONSUME_POLL_S)
                calls += 1
                for message in batch:
                    if message.error() is not None:
                        errors += 1
                        continue
                    received += 1
                    payload_bytes += len(message)
            elapsed_s = time.monotonic() - started
        finally:
            consumer.close()
        return ThroughputSample(received, payload_bytes, calls, errors, elapsed_s)

    def failover(self) -> FailoverSample:
        """Writers (one record in flight each) run; the leader is killed; the killed node rejoins."""
        config = self._producer_config(
            **{
                "linger.ms": 0,
                "socket.nagle.disable": True,
                "request.timeout.ms": WRITER_REQUEST_TIMEOUT_MS,
                "message.timeout.ms": WRITER_MESSAGE_TIMEOUT_MS,
                "retry.backoff.ms": 10,
                "reconnect.backoff.ms": 10,
                "reconnect.backoff.max.ms": 100,
            }
        )

        def write(partition: int, log: AckLog, stop: threading.Event) -> None:
            _writer(config, TOPICS[FAILOVER], partition, log, stop)

        return kill_leader_under_load(
            self.cluster,
            write,
            self.settings.counts.failover_writers,
            "bench-kafka-failover",
            self.settings,
            WRITER_MESSAGE_TIMEOUT_MS / 1000,
        )


class DeliveryTally:
    """Counts delivery reports (served by `poll`/`flush` on the producing thread, so no lock)."""

    def __init__(self) -> None:
        self.acked = self.errors = 0

    def reset(self) -> None:
        """Forgets the warm-up's reports."""
        self.acked = self.errors = 0

    def delivered(self, error: KafkaError | None, message: Message) -> None:
        """librdkafka's delivery report of one message."""
        if error is None:
            self.acked += 1
        else:
            self.errors += 1


def _writer(config: dict[str, Any], topic: str, partition: int, log: AckLog, stop: threading.Event) -> None:
    """Produces one record at a time to `partition` until `stop`, logging each acknowledgement and failure."""
    value = b"v" * 100
    producer = Producer(config)
    outcome: list[KafkaError | None] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        outcome.append(error)

    try:
        while not stop.is_set():
            outcome.clear()
            sent_at = time.monotonic()
            producer.produce(topic, value, partition=partition, on_delivery=delivered)
            while not outcome:
                producer.poll(DELIVERY_POLL_S)
            if outcome[0] is None:
                log.ack(sent_at)
            else:
                log.error()
    finally:
        producer.flush(JOIN_GRACE_S)
