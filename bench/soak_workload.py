"""The soak's clients (`bench.soak`): a paced producer, a plain and a group consumer, and the digests.

Each role runs in its own thread with its own `KqClient` and only counts; the soak's main thread
samples the counts. Consumers check what they read: per partition the next offset they expect, so
a record read twice (a group rebalance re-delivers from the last commit) counts as a duplicate and
an offset skipped counts as a gap — a lost record — rather than disappearing into a total.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import struct
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from kq.client import Consumer, ConsumerRecord, GroupConsumer, KqClient, KqClientError, Producer
from kq.client.producer import BATCH_BYTES_DEFAULT
from kq.deploy.reading import PartitionReadError, read_partition

logger = logging.getLogger(__name__)

LINGER_MS = 5
PACING_TICK_S = 0.005  # The producer sends what is due, then waits this long: 25 records at 5,000/s.
BURST_RECORDS_MAX = 5_000  # Sends between two looks at the stop flag when the producer is behind.
ACKS_PENDING_MAX = 200_000  # Futures waiting to be counted; the producer blocks beyond (bounded memory).
ACK_WAIT_S = 120.0  # One record's acknowledgement; longer counts as an error.
ERROR_PAUSE_S = 0.5  # After a failed call, before the next one: no busy loop against a sick node.
POLL_TIMEOUT_MS = 500
CONSUMER_RECORDS_MAX = 2_000
ERROR_KINDS_SHOWN_MAX = 5
KEYS = 1_000  # Distinct keys, so murmur2 spreads records over every partition.
SEQUENCE = struct.Struct(">Q")
DIGEST_RETRY_TIMEOUT_S = 10.0
DIGEST_WAIT_MS = 200


class SendResult(Protocol):
    """What `Producer.send` returns: only `result` is relied on (the Producer is being reworked)."""

    def result(self, timeout: float | None = None) -> object:
        """Blocks until the record is acknowledged; raises when its send failed."""


@dataclass(slots=True)
class ErrorTally:
    """Errors by kind, with the first message of each kind."""

    count: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def add(self, error: BaseException) -> None:
        """Counts one error."""
        kind = type(error).__name__
        self.count += 1
        self.kinds[kind] += 1
        if kind not in self.examples and len(self.examples) < ERROR_KINDS_SHOWN_MAX:
            self.examples[kind] = str(error)[:300]

    def as_json(self) -> dict[str, object]:
        """The tally for the report."""
        return {"count": self.count, "kinds": dict(self.kinds), "examples": dict(self.examples)}


@dataclass(slots=True)
class RecordTracker:
    """Per partition, the next offset a consumer expects: counts records, duplicates and gaps."""

    next_offsets: dict[int, int] = field(default_factory=dict)
    records: int = 0  # Every record returned, duplicates included.
    duplicates: int = 0
    gap_records: int = 0  # Offsets skipped: records this consumer never saw.

    def add(self, record: ConsumerRecord) -> None:
        """Counts one record read."""
        self.records += 1
        expected = self.next_offsets.get(record.partition, 0)  # A fresh topic starts at offset 0.
        if record.offset < expected:
            self.duplicates += 1
            return
        self.gap_records += record.offset - expected
        self.next_offsets[record.partition] = record.offset + 1

    @property
    def distinct(self) -> int:
        """Distinct offsets read (the topic is fresh, so they start at 0; with retention the consumer
        reads each record before it is trimmed, or the trimmed ones count as skipped)."""
        return sum(self.next_offsets.values()) - self.gap_records

    def reached(self, log_ends: Mapping[int, int]) -> bool:
        """Whether every partition has been read up to its log end."""
        return all(self.next_offsets.get(p, 0) >= end for p, end in log_ends.items())

    def as_json(self) -> dict[str, object]:
        """The counts for the report."""
        return {
            "records": self.records,
            "distinct": self.distinct,
            "duplicates": self.duplicates,
            "gap_records": self.gap_records,
        }


class PacedProducer:
    """Sends `rate` records per second through `client.Producer` until stopped; counts acks.

    The sending thread keeps a schedule (record n is due at n / rate seconds) and sends whatever is
    due, so a slow moment is made up afterwards and the average rate holds; `behind_max_records`
    says how far it ever fell behind. A second thread waits on each send's result in send order.
    """

    def __init__(
        self, bootstrap: list[str], topic: str, rate: float, value_bytes: int, batch_bytes: int | None = None
    ) -> None:
        """`batch_bytes`: the Producer's `batch_size` (None: its default, 256 KiB)."""
        assert rate > 0 and value_bytes >= SEQUENCE.size, "a positive rate and room for the sequence"
        self._client = KqClient(bootstrap)
        batch_size = BATCH_BYTES_DEFAULT if batch_bytes is None else batch_bytes
        self._producer = Producer(self._client, linger_ms=LINGER_MS, batch_size=batch_size)
        self._topic = topic
        self._rate = rate
        self._padding = bytes((i * 131 + 17) % 251 for i in range(value_bytes - SEQUENCE.size))
        self._pending: queue.Queue[SendResult | None] = queue.Queue(maxsize=ACKS_PENDING_MAX)
        self._stop = threading.Event()
        self.sent = 0
        self.acked = 0
        self.errors = ErrorTally()
        self.behind_max_records = 0
        self.started_at = 0.0
        self.stopped_at = 0.0
        self._sender = threading.Thread(target=self._send_loop, name="soak-producer", daemon=True)
        self._collector = threading.Thread(target=self._collect_loop, name="soak-acks", daemon=True)

    @property
    def client(self) -> KqClient:
        """The producing client (it has seen every index its writes were acknowledged at)."""
        return self._client

    def start(self) -> None:
        """Starts sending."""
        self.started_at = time.monotonic()
        self._collector.start()
        self._sender.start()

    def stop(self, flush_timeout_s: float) -> None:
        """Stops sending, waits for every acknowledgement (up to the timeout) and closes the Producer."""
        self._stop.set()
        self._sender.join()
        self.stopped_at = time.monotonic()
        try:
            self._producer.flush(timeout_s=flush_timeout_s)
        except KqClientError as error:
            self.errors.add(error)
        self._pending.put(None)
        self._collector.join(timeout=flush_timeout_s + ACK_WAIT_S)
        self._producer.close()

    def close(self) -> None:
        """Closes the client."""
        self._client.close()

    def _send_loop(self) -> None:
        while not self._stop.is_set():
            due = int((time.monotonic() - self.started_at) * self._rate)
            self.behind_max_records = max(self.behind_max_records, due - self.sent)
            for _ in range(min(due - self.sent, BURST_RECORDS_MAX)):
                self._send_one()
            if self.sent >= due:
                self._stop.wait(PACING_TICK_S)

    def _send_one(self) -> None:
        number = self.sent
        self.sent += 1
        key = b"key-%d" % (number % KEYS)
        try:
            future = self._producer.send(self._topic, SEQUENCE.pack(number) + self._padding, key=key)
        except KqClientError as error:  # The buffer stayed full, or the producer is closed.
            self.errors.add(error)
            return
        self._pending.put(future)

    def _collect_loop(self) -> None:
        while (future := self._pending.get()) is not None:
            try:
                future.result(timeout=ACK_WAIT_S)
            except Exception as error:  # Every failed send is counted by kind; none stops the soak.
                self.errors.add(error)
                continue
            self.acked += 1


class ConsumerLoop:
    """Base of the two consumers: a thread that polls until stopped or caught up with `log_ends`."""

    name = "consumer"

    def __init__(self, bootstrap: list[str]) -> None:
        self._client = KqClient(bootstrap)
        self.tracker = RecordTracker()
        self.errors = ErrorTally()
        self._stop = threading.Event()
        self.caught_up = threading.Event()
        self._log_ends: dict[int, int] | None = None
        self._thread = threading.Thread(target=self._run, name=f"soak-{self.name}", daemon=True)

    def start(self) -> None:
        """Starts consuming."""
        self._thread.start()

    def catch_up_to(self, log_ends: Mapping[int, int]) -> None:
        """From now on, stop once every partition is read up to `log_ends`."""
        self._log_ends = dict(log_ends)

    def stop(self, timeout_s: float) -> None:
        """Stops the thread and closes the client."""
        self._stop.set()
        self._thread.join(timeout=timeout_s)
        self._close()
        self._client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                records = self._poll()
            except KqClientError as error:
                self.errors.add(error)
                self._stop.wait(ERROR_PAUSE_S)
                continue
            for record in records:
                self.tracker.add(record)
            if self._log_ends is not None and self.tracker.reached(self._log_ends):
                self.caught_up.set()
                return

    def _poll(self) -> list[ConsumerRecord]:
        raise NotImplementedError

    def _close(self) -> None:
        """Releases what the subclass holds."""


class PlainConsumerLoop(ConsumerLoop):
    """`client.Consumer` over every partition, every read served by one chosen (follower) node."""

    name = "plain"

    def __init__(self, bootstrap: list[str], topic: str, node: str) -> None:
        super().__init__(bootstrap)
        self._topic = topic
        self.node = node
        self._consumer: Consumer | None = None

    def _poll(self) -> list[ConsumerRecord]:
        if self._consumer is None:
            self._consumer = Consumer(
                self._client, self._topic, node=self.node, max_records=CONSUMER_RECORDS_MAX
            )
        return self._consumer.poll(timeout_ms=POLL_TIMEOUT_MS)


class GroupConsumerLoop(ConsumerLoop):
    """The only member of a consumer group, auto-committing its positions."""

    name = "group"

    def __init__(self, bootstrap: list[str], topic: str, group: str) -> None:
        super().__init__(bootstrap)
        self.group = group
        self._consumer = GroupConsumer(self._client, group, [topic], max_records=CONSUMER_RECORDS_MAX)

    def _poll(self) -> list[ConsumerRecord]:
        return self._consumer.poll(timeout_ms=POLL_TIMEOUT_MS)

    def _close(self) -> None:
        self._consumer.close()  # Commits the final positions.

    def committed(self, client: KqClient, partitions: list[int], topic: str) -> dict[int, int]:
        """The group's committed offsets, read through `client`."""
        offsets = client.committed_offsets(self.group, [(topic, p) for p in partitions])
        return {p: offsets.get((topic, p), 0) for p in partitions}


# Digest -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeDigest:
    """One node's copy of a topic, reduced to a SHA-256 and a count."""

    sha256: str
    records: int
    log_ends: dict[int, int]
    log_starts: dict[int, int]  # Above 0 where retention trimmed: the digest covers what is left.


class DigestError(RuntimeError):
    """A node kept answering with no records below the log end it reported."""


def _sized(data: bytes | None) -> bytes:
    return struct.pack(">i", -1) if data is None else struct.pack(">i", len(data)) + data


def record_bytes(record: ConsumerRecord) -> bytes:
    """A record's partition, offset, timestamp, key, value and headers, unambiguously framed."""
    parts = [
        struct.pack(">iqqb", record.partition, record.offset, record.timestamp_ms, record.timestamp_type),
        _sized(record.key),
        _sized(record.value),
        struct.pack(">i", len(record.headers)),
    ]
    for name, value in record.headers:
        parts += (_sized(name.encode()), _sized(value))
    return b"".join(parts)


def node_digest(address: str, topic: str, min_index: int, timeout_s: float) -> NodeDigest:
    """Reads every partition of `topic` from the node at `address` (once it applied `min_index`)."""
    digest = hashlib.sha256()
    records = 0
    deadline = time.monotonic() + timeout_s
    with KqClient([address], retry_timeout_s=DIGEST_RETRY_TIMEOUT_S) as client:
        offsets = client.list_offsets(topic, address)
        log_ends = {p: o.log_end_offset for p, o in sorted(offsets.items())}
        log_starts = {p: o.log_start_offset for p, o in sorted(offsets.items())}
        for partition, partition_offsets in sorted(offsets.items()):
            start, end = partition_offsets.log_start_offset, partition_offsets.log_end_offset
            remaining_s = max(0.0, deadline - time.monotonic())
            reading = read_partition(
                client,
                topic,
                partition,
                address,
                start,
                end,
                min_index=min_index,
                wait_ms=DIGEST_WAIT_MS,
                timeout_s=remaining_s,
            )
            try:
                for record in reading:
                    digest.update(record_bytes(record))
                    records += 1
            except PartitionReadError as error:
                raise DigestError(f"{address}: {error}") from error
    return NodeDigest(digest.hexdigest(), records, log_ends, log_starts)
