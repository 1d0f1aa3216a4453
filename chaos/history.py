"""What the clients saw during a run: every send attempt and its outcome, and what consumers observed.

Producers, consumers and consumer-group members append from their threads; the runner waits on new
acknowledgements; the checker reads the finished history. Times are `time.monotonic()` seconds, the
clock the fault schedule uses too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from kq.client import RecordMetadata

# An acknowledgement received this soon after a leader fault is fully in place was answered by the
# old leader (it was on its way, or the client thread had not run yet on this busy machine). Well
# below the default election timeout (500 ms), so no new leader can have answered it.
IN_FLIGHT_GRACE_S = 0.2
PROBE_PREFIX = "probe"  # Producers named so write to one chosen node; their acks do not time failovers.
# A tombstone (null value) cannot be told apart by its value, so it carries its unique identity, the
# value it would otherwise have had, in this header: `record_id` reads it back.
TOMBSTONE_ID_HEADER = "chaos-id"


def record_id(value: bytes | None, headers: Sequence[tuple[str, bytes]] = ()) -> bytes | None:
    """What names one sent record in a history: its value (unique per send), or a tombstone's
    TOMBSTONE_ID_HEADER; None for a null value without it (which no chaos producer sends)."""
    if value is not None:
        return value
    return next((header for name, header in headers if name == TOMBSTONE_ID_HEADER), None)


@dataclass(frozen=True, slots=True)
class Ack:
    """One record the cluster acknowledged: where it says it put it."""

    producer: str
    sequence: int  # Position in the producer's send order.
    value: bytes
    partition: int
    offset: int
    index: int  # Raft index of the entry that carried it.
    acked_s: float


@dataclass(frozen=True, slots=True)
class Unknown:
    """One record whose send failed or timed out: it may or may not have been written (once)."""

    producer: str
    sequence: int
    value: bytes
    error: str
    failed_s: float


@dataclass(frozen=True, slots=True)
class HwmObservation:
    """A consumer saw a node's log end offset (high-water mark) of a partition change to this value."""

    consumer: str
    node: str
    partition: int
    log_end_offset: int
    observed_s: float


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    """A record a consumer read: the checker compares it with the final log."""

    consumer: str
    node: str
    partition: int
    offset: int
    value: bytes | None  # The record's identity (`record_id`): its value, or a tombstone's header.
    read_s: float = 0.0  # When the fetch returned it (anomaly details give it relative to the start).
    key: bytes | None = None  # As read: compaction may drop it once a newer record has the same key.


@dataclass(frozen=True, slots=True)
class GroupDelivery:
    """A record a poll of a consumer-group member returned: the group has processed it once more."""

    group: str
    member: str
    generation: int
    topic: str
    partition: int
    offset: int
    value: bytes | None  # The record's identity (`record_id`).
    delivered_s: float = 0.0  # When the poll returned it.
    key: bytes | None = None


@dataclass(frozen=True, slots=True)
class GroupCommit:
    """A commit of a group member the cluster acknowledged: (partition, next offset to read) pairs."""

    group: str
    member: str
    generation: int
    topic: str
    offsets: tuple[tuple[int, int], ...]
    acked_s: float


@dataclass(frozen=True, slots=True)
class GroupObservation:
    """A committed offset a member read (FetchOffsets) when it (re)joined: None when there was none.

    `requested_s` is when the read was sent: every commit acknowledged before then must be visible.
    """

    group: str
    member: str
    generation: int
    topic: str
    partition: int
    committed: int | None
    requested_s: float
    observed_s: float


@dataclass(frozen=True, slots=True)
class ClientError:
    """An error no fault explains (anything but an unknown-outcome UnavailableError)."""

    client: str
    kind: str
    message: str
    at_s: float


@dataclass(slots=True)
class History:
    """Thread-safe record of one run; append through the methods, read the lists when the run is over."""

    attempted: dict[bytes, tuple[str, int]] = field(default_factory=dict)  # value -> (producer, sequence)
    keys: dict[bytes, bytes] = field(default_factory=dict)  # value -> key, for records sent with one
    tombstones: dict[bytes, int] = field(default_factory=dict)  # identity -> CreateTime (ms) of a tombstone
    acks: list[Ack] = field(default_factory=list)
    unknowns: list[Unknown] = field(default_factory=list)
    hwm: list[HwmObservation] = field(default_factory=list)
    consumed: list[ConsumedRecord] = field(default_factory=list)
    client_errors: list[ClientError] = field(default_factory=list)
    group_deliveries: list[GroupDelivery] = field(default_factory=list)
    group_commits: list[GroupCommit] = field(default_factory=list)  # In the order they were acknowledged.
    group_observations: list[GroupObservation] = field(default_factory=list)
    group_fenced: int = 0  # Commits or joins refused as stale (the member rejoined): normal, counted.
    group_commits_unknown: int = 0  # Commits whose answer never came (they may have been applied).
    consumer_resets: int = 0  # Reads below the log start (OUT_OF_RANGE) that moved a reader up to it.
    index_max: int = 0  # Highest Raft index acknowledged so far.
    origin_s: float = 0.0  # When the workload started: reports give times relative to it.
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def attempt(
        self,
        producer: str,
        sequences: Sequence[int],
        values: Sequence[bytes],
        keys: Sequence[bytes | None] = (),
        tombstones: Mapping[bytes, int] | None = None,
    ) -> None:
        """Records values about to be sent (before the send, so a hung send still counts as tried),
        with their keys (the checker's compaction rule needs them) and which are tombstones, sent at
        what CreateTime (ms). `values` are identities (`record_id`): a tombstone's header value."""
        with self._changed:
            for sequence, value in zip(sequences, values, strict=True):
                self.attempted[value] = (producer, sequence)
            for value, key in zip(values, keys, strict=False):  # No keys given: none recorded.
                if key is not None:
                    self.keys[value] = key
            self.tombstones.update(tombstones or {})

    def acknowledge(
        self, producer: str, sequences: Sequence[int], values: Sequence[bytes], sent: Sequence[RecordMetadata]
    ) -> None:
        """Records acknowledged records, stamped now (under the lock, so `acks` is in receive order)."""
        with self._changed:
            now_s = time.monotonic()
            for sequence, value, metadata in zip(sequences, values, sent, strict=True):
                self.acks.append(
                    Ack(producer, sequence, value, metadata.partition, metadata.offset, metadata.index, now_s)
                )
                self.index_max = max(self.index_max, metadata.index)
            self._changed.notify_all()

    def fail(self, unknowns: Sequence[Unknown]) -> None:
        """Records records whose outcome is unknown."""
        with self._changed:
            self.unknowns.extend(unknowns)

    def observe_hwm(self, observation: HwmObservation) -> None:
        """Records a high-water mark a consumer saw."""
        with self._changed:
            self.hwm.append(observation)

    def consume(self, records: Sequence[ConsumedRecord]) -> None:
        """Records records a consumer read."""
        with self._changed:
            self.consumed.extend(records)

    def reset_reader(self) -> None:
        """Counts a reader moved up to the log start after its position fell below it (OUT_OF_RANGE)."""
        with self._changed:
            self.consumer_resets += 1

    def deliver_to_group(self, deliveries: Sequence[GroupDelivery]) -> None:
        """Records records a group member's poll returned."""
        with self._changed:
            self.group_deliveries.extend(deliveries)

    def acknowledge_commit(
        self, group: str, member: str, generation: int, topic: str, offsets: Sequence[tuple[int, int]]
    ) -> None:
        """Records an acknowledged commit, stamped now (under the lock, so commits are in ack order)."""
        with self._changed:
            commit = GroupCommit(group, member, generation, topic, tuple(offsets), time.monotonic())
            self.group_commits.append(commit)

    def observe_committed(self, observations: Sequence[GroupObservation]) -> None:
        """Records the committed offsets a member read when it joined."""
        with self._changed:
            self.group_observations.extend(observations)

    def group_refused(self, *, fenced: bool) -> None:
        """Counts a group call refused as stale (`fenced`) or whose outcome is unknown."""
        with self._changed:
            if fenced:
                self.group_fenced += 1
            else:
                self.group_commits_unknown += 1

    def group_excerpt(self) -> dict[str, list[dict[str, object]]]:
        """The group part of the history as JSON-ready data (times from the start), for failed runs."""

        def relative(at_s: float) -> float:
            return round(at_s - self.origin_s, 3)

        with self._changed:
            commits: list[dict[str, object]] = [
                {
                    "member": c.member,
                    "generation": c.generation,
                    "offsets": dict(c.offsets),
                    "acked_s": relative(c.acked_s),
                }
                for c in self.group_commits
            ]
            reads: list[dict[str, object]] = [
                {
                    "member": o.member,
                    "generation": o.generation,
                    "partition": o.partition,
                    "committed": o.committed,
                    "requested_s": relative(o.requested_s),
                    "observed_s": relative(o.observed_s),
                }
                for o in self.group_observations
            ]
            errors: list[dict[str, object]] = [
                {"client": e.client, "kind": e.kind, "message": e.message, "at_s": relative(e.at_s)}
                for e in self.client_errors
            ]
        return {"commits": commits, "join_reads": reads, "client_errors": errors}

    def client_error(self, error: ClientError) -> None:
        """Records an unexpected client error."""
        with self._changed:
            self.client_errors.append(error)

    def acks_count(self) -> int:
        """How many records were acknowledged so far."""
        with self._changed:
            return len(self.acks)

    def index_before(self, at_s: float, partitions: frozenset[int]) -> int:
        """The highest Raft index acknowledged before `at_s` for a record of `partitions`."""
        with self._changed:
            before = self.acks[: _first_after(self.acks, at_s)]
            return max((ack.index for ack in before if ack.partition in partitions), default=0)

    def mark(self) -> tuple[float, int]:
        """(now, highest index acknowledged so far): taken at the moment a fault is injected."""
        with self._changed:
            return time.monotonic(), self.index_max

    def wait_for_ack(self, predicate: Callable[[Sequence[Ack]], Ack | None], deadline_s: float) -> Ack | None:
        """Waits until `predicate(acks)` finds an ack (returned), or until the monotonic deadline (None)."""
        with self._changed:
            while True:
                found = predicate(self.acks)
                remaining_s = deadline_s - time.monotonic()
                if found is not None or remaining_s <= 0:
                    return found
                self._changed.wait(timeout=min(remaining_s, 1.0))


def resumed_ack(
    acks: Sequence[Ack],
    fault_s: float,
    in_place_s: float,
    index_at_fault: int,
    leader_fault: bool,
    partitions: frozenset[int] | None = None,
) -> Ack | None:
    """The first acknowledgement that shows writes resumed after a fault begun at `fault_s`, or None.

    `in_place_s` is when the fault was complete (a partition takes a few `ip` commands; until the last
    one the old leader may still commit). After a leader fault the ack must come from the next leader:
    received more than IN_FLIGHT_GRACE_S after `in_place_s`, for an entry beyond `index_at_fault` and
    beyond every entry acknowledged before then (those were the old leader's). After other faults, any
    later acknowledgement counts. `acks` are in the order they were received; probes' acks are skipped.
    `partitions`: only acks of these (one Raft group's, whose indexes alone compare with each other and
    with `index_at_fault`, when nodes run a group per worker process); None: every ack.
    """
    after = [
        ack
        for ack in acks[_first_after(acks, fault_s) :]
        if not ack.producer.startswith(PROBE_PREFIX) and (partitions is None or ack.partition in partitions)
    ]
    if not leader_fault:
        return after[0] if after else None
    window_end_s = in_place_s + IN_FLIGHT_GRACE_S
    old_index_max = max([index_at_fault, *(ack.index for ack in after if ack.acked_s <= window_end_s)])
    for ack in after:
        if ack.index > old_index_max and ack.acked_s > window_end_s:
            return ack
    return None


def _first_after(acks: Sequence[Ack], at_s: float) -> int:
    """The position of the first ack received after `at_s` (acks are in receive order)."""
    low, high = 0, len(acks)
    while low < high:
        middle = (low + high) // 2
        if acks[middle].acked_s <= at_s:
            low = middle + 1
        else:
            high = middle
    return low
