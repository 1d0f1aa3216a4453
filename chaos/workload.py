"""The load a scenario runs under: idempotent producers (keyed, unkeyed, pinned), plain consumers and
consumer-group members (`chaos.group_members`).

Each producer is one thread with its own `KqClient` (its own producer id). It sends one request at a
time, so its send order is its records' `sequence` order, and it records every attempt before
sending and its outcome after. Each consumer is pinned to one node and reads every partition from
offset 0, recording what it reads and every change of the node's log end offset it sees; a consumer
whose position fell below the log start (retention trimmed it) moves up to the log start.

A scenario shapes what the producers send (`WorkloadShape`): the key space, the producer kinds, and
the share of tombstones (null values, for compacted topics). Every record is named by a unique
identity (`chaos.history.record_id`): its value, or for a tombstone a header.

The cluster's members may change during a run (the `membership` scenario): `Workload.follow` then
hands the producers and group members the new bootstrap list (`Bootstrap`), which each takes up
between two requests (a producer) or at its next join (a group member) with a new client, as an
operator would reconfigure them, starts a consumer on each node that joined and stops the consumers
of nodes that left.

Every client here reaches the nodes as the run says (`tls`: None for plain text; a secure run's
clients present the cluster's `admin` certificate, see `chaos.runner`).
"""

from __future__ import annotations

import enum
import logging
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kq.chaos.bootstrap import Bootstrap
from kq.chaos.group_members import GroupMember, GroupMemberSpec, stop_members
from kq.chaos.history import (
    TOMBSTONE_ID_HEADER,
    ClientError,
    ConsumedRecord,
    History,
    HwmObservation,
    Unknown,
    record_id,
)
from kq.client import (
    KqClient,
    KqClientError,
    OffsetOutOfRangeError,
    ProducerRecord,
    RecordMetadata,
    TlsConfig,
    UnavailableError,
)

logger = logging.getLogger(__name__)

KEYS = 64  # Distinct keys of keyed producers.
RECORDS_PER_SEND_MAX = 5
VALUE_PAD_BYTES_MAX = 48  # Values are "<producer>-<sequence>." plus up to this much padding.
CONSUMER_FETCH_RECORDS = 1_000
CONSUMER_WAIT_MS = 200  # Long-poll when nothing is new, so idle consumers do not spin.
CONSUMER_RETRY_S = 0.2  # Pause after a failed fetch (the node may be down or paused).
CONSUMER_RETRY_TIMEOUT_S = 1.0
CONSUMER_RPC_TIMEOUT_S = 2.0
JOIN_TIMEOUT_S = 45.0  # Longer than a producer's whole retry deadline plus one RPC.


class ProducerKind(enum.Enum):
    """How a producer chooses partitions."""

    KEYED = "keyed"  # A random key per request; Kafka's partitioner picks the partition.
    UNKEYED = "unkeyed"  # One record per request; the client spreads them round-robin.
    PINNED = "pinned"  # A random explicit partition per request.
    PINNED_KEYED = "pinned-keyed"  # A random explicit partition and a random key per request.


KINDS_DEFAULT = (ProducerKind.KEYED, ProducerKind.UNKEYED, ProducerKind.PINNED)


@dataclass(frozen=True, slots=True)
class WorkloadShape:
    """What a scenario's producers send: their kinds (cycled through), how many distinct keys keyed
    ones draw from, and what share of keyed records are tombstones (null values)."""

    kinds: tuple[ProducerKind, ...] = KINDS_DEFAULT
    keys: int = KEYS
    tombstone_share: float = 0.0


DEFAULT_SHAPE = WorkloadShape()


@dataclass(frozen=True, slots=True)
class ProducerSpec:
    """One producer: its name, partition choice, where it connects, how fast and how long it sends."""

    name: str
    kind: ProducerKind
    bootstrap: tuple[str, ...]
    rate_per_s: float
    retry_timeout_s: float = 30.0  # The client's default.
    rpc_timeout_s: float = 10.0  # The client's default.
    sends_max: int = 1_000_000
    keys: int = KEYS
    tombstone_share: float = 0.0  # Of keyed records.
    tls: TlsConfig | None = None  # How its client reaches the nodes (None: plain text).


class Producer(threading.Thread):
    """Sends until stopped or `sends_max` requests; records every attempt and outcome in `history`.

    It connects to `spec.bootstrap`, or, given a `bootstrap`, to its current list, and opens a new
    client (a new producer id) between two requests whenever that list changed.
    """

    def __init__(
        self,
        spec: ProducerSpec,
        topic: str,
        partitions: int,
        history: History,
        seed: int,
        bootstrap: Bootstrap | None = None,
    ) -> None:
        super().__init__(name=f"chaos-{spec.name}", daemon=True)
        self.spec = spec
        self._bootstrap_list = bootstrap or Bootstrap(spec.bootstrap)  # Not `_bootstrap`: a Thread method.
        self._topic = topic
        self._partitions = partitions
        self._history = history
        self._random = random.Random(seed)
        self._stopping = threading.Event()
        self._sequence = 0

    def stop(self) -> None:
        """Asks the thread to finish after its current request."""
        self._stopping.set()

    def run(self) -> None:
        """Paced sends until stopped; a new client whenever the bootstrap list changed."""
        interval_s = 1.0 / self.spec.rate_per_s
        next_s = time.monotonic()
        sends = 0
        while sends < self.spec.sends_max:
            addresses = self._bootstrap_list.addresses()
            with KqClient(
                addresses,
                retry_timeout_s=self.spec.retry_timeout_s,
                rpc_timeout_s=self.spec.rpc_timeout_s,
                tls=self.spec.tls,
            ) as client:
                while sends < self.spec.sends_max and self._bootstrap_list.addresses() == addresses:
                    if self._stopping.wait(max(0.0, next_s - time.monotonic())):
                        return
                    next_s = max(next_s + interval_s, time.monotonic())
                    self._send_one(client)
                    sends += 1

    def _records(self) -> list[ProducerRecord]:
        kind = self.spec.kind
        count = 1 if kind is ProducerKind.UNKEYED else self._random.randint(1, RECORDS_PER_SEND_MAX)
        keyed = kind in (ProducerKind.KEYED, ProducerKind.PINNED_KEYED)
        key = f"key-{self._random.randrange(self.spec.keys)}".encode() if keyed else None
        pinned = kind in (ProducerKind.PINNED, ProducerKind.PINNED_KEYED)
        partition = self._random.randrange(self._partitions) if pinned else None
        records = []
        for _ in range(count):
            pad = b"." * self._random.randrange(VALUE_PAD_BYTES_MAX + 1)
            value = f"{self.spec.name}-{self._sequence}".encode() + b"|" + pad
            if keyed and self._random.random() < self.spec.tombstone_share:
                # A tombstone: its identity travels in a header; its CreateTime is set here, so the
                # checker knows when compaction may drop it (delete.retention.ms after it).
                headers = ((TOMBSTONE_ID_HEADER, value),)
                now_ms = int(time.time() * 1000)
                records.append(
                    ProducerRecord(None, key=key, headers=headers, timestamp_ms=now_ms, partition=partition)
                )
            else:
                records.append(ProducerRecord(value, key=key, partition=partition))
            self._sequence += 1
        return records

    def _send_one(self, client: KqClient) -> None:
        records = self._records()
        values = [record_id(record.value, record.headers) or b"" for record in records]
        sequences = list(range(self._sequence - len(records), self._sequence))
        tombstones = {
            value: record.timestamp_ms or 0
            for value, record in zip(values, records, strict=True)
            if record.value is None
        }
        keys = [record.key for record in records]
        self._history.attempt(self.spec.name, sequences, values, keys, tombstones)
        try:
            sent: list[RecordMetadata] = client.send_batch(self._topic, records)
        except KqClientError as error:
            now_s = time.monotonic()
            unknowns = [
                Unknown(self.spec.name, s, v, type(error).__name__, now_s)
                for s, v in zip(sequences, values, strict=True)
            ]
            self._history.fail(unknowns)
            if not isinstance(error, UnavailableError):
                self._history.client_error(
                    ClientError(self.spec.name, type(error).__name__, str(error), now_s)
                )
            return
        self._history.acknowledge(self.spec.name, sequences, values, sent)


class Consumer(threading.Thread):
    """Reads every partition from offset 0 on one node until stopped, recording records and log ends."""

    def __init__(
        self,
        name: str,
        node: str,
        topic: str,
        partitions: int,
        history: History,
        tls: TlsConfig | None = None,
    ) -> None:
        """A consumer of `topic` on the node at gRPC address `node`, reaching it with `tls` (None: plain
        text)."""
        super().__init__(name=f"chaos-{name}", daemon=True)
        self.name_ = name
        self.node = node
        self._tls = tls
        self._topic = topic
        self._positions = dict.fromkeys(range(partitions), 0)
        self._log_ends = dict.fromkeys(range(partitions), -1)
        self._history = history
        self._stopping = threading.Event()

    def stop(self) -> None:
        """Asks the thread to finish after its current fetch."""
        self._stopping.set()

    def _move_to_log_start(self, client: KqClient) -> None:
        """After OUT_OF_RANGE: every partition whose position is below the node's log start moves up
        to it (retention trimmed what lay between; the checker allows skipping only such offsets)."""
        for partition, offsets in client.list_offsets(self._topic, self.node).items():
            if self._positions.get(partition, offsets.log_start_offset) < offsets.log_start_offset:
                self._positions[partition] = offsets.log_start_offset
                self._history.reset_reader()

    def run(self) -> None:
        """Polls until stopped, riding out node restarts and pauses."""
        with KqClient(
            [self.node],
            retry_timeout_s=CONSUMER_RETRY_TIMEOUT_S,
            rpc_timeout_s=CONSUMER_RPC_TIMEOUT_S,
            tls=self._tls,
        ) as client:
            turn = 0
            while not self._stopping.is_set():
                try:
                    fetched = [self._fetch(client, p, 0) for p in self._positions]  # Every partition.
                    if not any(fetched):
                        turn = (turn + 1) % len(self._positions)
                        self._fetch(client, turn, CONSUMER_WAIT_MS)
                except UnavailableError:
                    self._stopping.wait(CONSUMER_RETRY_S)
                except OffsetOutOfRangeError:
                    self._move_to_log_start(client)
                except KqClientError as error:
                    self._history.client_error(
                        ClientError(self.name_, type(error).__name__, str(error), time.monotonic())
                    )
                    self._stopping.wait(CONSUMER_RETRY_S)

    def _fetch(self, client: KqClient, partition: int, wait_ms: int) -> bool:
        """One fetch; whether it returned records."""
        offset = self._positions[partition]
        result = client.fetch(
            self._topic,
            partition,
            offset,
            max_records=CONSUMER_FETCH_RECORDS,
            wait_ms=wait_ms,
            node=self.node,
        )
        if result.log_end_offset != self._log_ends[partition]:
            self._log_ends[partition] = result.log_end_offset
            self._history.observe_hwm(
                HwmObservation(self.name_, self.node, partition, result.log_end_offset, time.monotonic())
            )
        self._positions[partition] = max(self._positions[partition], result.next_offset)
        if not result.records:
            return False
        now_s = time.monotonic()
        self._history.consume(
            [
                ConsumedRecord(
                    self.name_, self.node, partition, r.offset, record_id(r.value, r.headers), now_s, r.key
                )
                for r in result.records
            ]
        )
        return True


def producer_specs(
    count: int,
    bootstrap: Sequence[str],
    rate_per_s: float,
    shape: WorkloadShape | None = None,
    tls: TlsConfig | None = None,
) -> list[ProducerSpec]:
    """`count` producers cycling through the shape's kinds (by default keyed, unkeyed, pinned, ...),
    reaching the nodes with `tls` (None: plain text)."""
    shape = shape or DEFAULT_SHAPE
    kinds = shape.kinds
    return [
        ProducerSpec(
            f"p{i}-{kinds[i % len(kinds)].value}",
            kinds[i % len(kinds)],
            tuple(bootstrap),
            rate_per_s,
            keys=shape.keys,
            tombstone_share=shape.tombstone_share,
            tls=tls,
        )
        for i in range(count)
    ]


class Workload:
    """The producers, consumers and group members of one scenario run."""

    def __init__(
        self,
        topic: str,
        partitions: int,
        history: History,
        producers: Sequence[ProducerSpec],
        consumer_nodes: Sequence[str],
        seed: int,
        group_members: Sequence[GroupMemberSpec] = (),
        tls: TlsConfig | None = None,
    ) -> None:
        """`consumer_nodes`: the gRPC address of every node (a consumer each), also the bootstrap list
        of the producers and group members until `follow` replaces it. `tls`: how the consumers and
        group members reach the nodes (the producers' specs say it for each)."""
        self._topic = topic
        self._tls = tls
        self._partitions = partitions
        self._history = history
        self.bootstrap = Bootstrap(consumer_nodes)
        self.producers = [
            Producer(spec, topic, partitions, history, seed * 1_000 + i, self.bootstrap)
            for i, spec in enumerate(producers)
        ]
        self.consumers = [
            Consumer(f"c{i}@{node}", node, topic, partitions, history, tls)
            for i, node in enumerate(consumer_nodes)
        ]
        self.group_members = [
            GroupMember(spec, self.bootstrap, topic, history, seed * 1_000 + 500 + i, tls)
            for i, spec in enumerate(group_members)
        ]

    def start(self) -> None:
        """Starts every thread."""
        for thread in [*self.producers, *self.consumers, *self.group_members]:
            thread.start()

    def follow(self, addresses: Sequence[str]) -> None:
        """The cluster's members are now the nodes at `addresses` (gRPC): the producers and group
        members take them as their bootstrap list, a consumer starts on each node that joined, and the
        consumers of nodes that left stop (what they recorded stays in the history)."""
        self.bootstrap.replace(addresses)
        for consumer in self.consumers:
            if consumer.node not in addresses:
                consumer.stop()
        pinned = {consumer.node for consumer in self.consumers}
        for node in addresses:
            if node not in pinned:
                consumer = Consumer(
                    f"c{len(self.consumers)}@{node}",
                    node,
                    self._topic,
                    self._partitions,
                    self._history,
                    self._tls,
                )
                self.consumers.append(consumer)
                consumer.start()

    def groups(self) -> list[str]:
        """The consumer groups the members belong to."""
        return sorted({member.spec.group for member in self.group_members})

    def settle_group_members(self) -> None:
        """Ends the members' churn, so the groups can catch up with the log end."""
        for member in self.group_members:
            member.settle()

    def stop_group_members(self) -> list[str]:
        """Stops the group members (each commits and leaves); returns any that did not finish in time."""
        return stop_members([member for member in self.group_members if member.is_alive()])

    def stop_producers(self) -> list[str]:
        """Stops the producers; returns any still running (their last sends count as unknown)."""
        return _stop_all(self.producers)

    def stop_consumers(self) -> list[str]:
        """Stops the consumers; returns the names of any that did not finish in time."""
        return _stop_all(self.consumers)


def _stop_all(threads: Sequence[Producer | Consumer]) -> list[str]:
    for thread in threads:
        thread.stop()
    deadline_s = time.monotonic() + JOIN_TIMEOUT_S
    for thread in threads:
        thread.join(timeout=max(0.0, deadline_s - time.monotonic()))
    return [thread.name for thread in threads if thread.is_alive()]
