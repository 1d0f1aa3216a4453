"""Key compaction: the leader drops superseded records through Raft (Kafka's compact cleanup policy).

For a topic whose `cleanup.policy` holds `compact`, the newest record of each key is kept and older
ones go. The leader decides from committed state only (its store holds exactly what was applied) and
proposes `CompactCommand`s naming, per stored batch, the offsetDeltas of the records to drop; every
replica rewrites those batches with the same pure function (proto/records.py `compacted_batch`), so
the nodes stay byte-identical and apply reads no clock. Offsets never change: a dropped record leaves
a gap, and a batch that keeps no record is removed; the log's start and end offsets stay.

One pass over a partition (Kafka's log cleaner, per batch instead of per segment):

1. **Due?** The partition's dirty part (from where the last pass on this node ended, or its log start)
   is at least `min.cleanable.dirty.ratio` of its bytes, or a tombstone it kept has expired since.
2. **Key map**: the dirty part is read, oldest first, into a map of key digest (BLAKE2b, 16 bytes) to
   the key's newest offset, up to the first batch younger than `min.compaction.lag.ms` (its
   maxTimestamp; a lag of 0 takes every batch) or the one that would take the map past
   COMPACTION_KEYS_MAX keys. The map covers offsets up to X.
3. **Clean**: every batch below X, from the log start, loses each record that has a newer offset in
   the map, each record without a key (Kafka's producers may not send one to such a topic), and each
   tombstone (a null value) that is its key's newest below X and older than `delete.retention.ms`
   (from its timestamp, else its batch's maxTimestamp; one with neither stays). The drops go out in
   entries of at most ENTRY_WORK_MAX units of apply's work (proto/records.py WorkMeter, counted as
   apply will count it), proposed one after the other in offset order, each waiting for its commit.

Why it is safe: a record goes only when a newer one of its key was committed, and compaction never
removes a key's newest record except an expired tombstone, after every older record of that key
(entries go oldest batch first, and a pass stops at the first entry that fails). Records at or above
X, and anything younger than the lag, are untouched, so a consumer that keeps up sees every record.
An entry proposed by a leader that lost its place since, applied late, still drops only superseded
records. What this node remembers (where each partition's clean part ends, when its next tombstone
expires) is a hint: a new leader starts from each log start.

Thread: `kq-compactor` (started by `start()`, stopped by `stop()`: an Event, then joined) wakes every
`check_s`, and on the leader only runs `run_once`. It reads the store in short read transactions (at
most COMPACTION_READ_BATCHES batches each, so it never pins old pages for long) and proposes with
PROPOSAL_TIMEOUT_S. It owns its two maps; the store and consensus are thread-safe.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from kq.broker.background import LeaderRounds
from kq.broker.consensus import Consensus
from kq.broker.proposals import propose_and_wait
from kq.proto.limits import (
    COMPACT_BATCHES_PER_ENTRY_MAX,
    COMPACT_DROPPED_PER_ENTRY_MAX,
    COMPACTION_ABORTED_ROWS_MAX,
    COMPACTION_KEYS_MAX,
    COMPACTION_READ_BATCHES,
    COMPACTION_SCAN_BATCHES_MAX,
    ENTRY_WORK_MAX,
    PROPOSAL_TIMEOUT_S,
    TXN_OPEN_PER_PARTITION_MAX,
)
from kq.proto.records import BatchHeader, WorkMeter, parse_batch, read_header
from kq.raft import commands
from kq.raft.results import CompactResult, ErrorCode
from kq.raft.topic_config import TopicConfig
from kq.storage import Store
from kq.storage.transactions import AbortedTransaction

logger = logging.getLogger(__name__)

THREAD_NAME = "kq-compactor"
KEY_DIGEST_BYTES = 16
_UNMETERED = 2**62


def key_digest(key: bytes) -> bytes:
    """What the key map holds of a key: 16 bytes of BLAKE2b (a collision is as unlikely as Kafka's MD5)."""
    return hashlib.blake2b(key, digest_size=KEY_DIGEST_BYTES).digest()


@dataclass(frozen=True, slots=True)
class KeyMap:
    """The newest offset of each key in a partition's dirty part, which it covers up to `end_offset`."""

    latest: dict[bytes, int]
    end_offset: int


Aborted = Callable[[BatchHeader], bool]  # Whether a stored batch holds an aborted transaction's records.


def never_aborted(_header: BatchHeader) -> bool:
    """A partition without aborted transactions."""
    return False


def aborted_ranges(ranges: Iterable[AbortedTransaction]) -> Aborted:
    """Whether a batch belongs to one of these aborted transactions: its producer's, within its offsets."""
    by_producer: dict[int, list[tuple[int, int]]] = {}
    for row in ranges:
        by_producer.setdefault(row.producer_id, []).append((row.first_offset, row.last_offset))

    def aborted(header: BatchHeader) -> bool:
        if not header.is_transactional or header.is_control:
            return False
        spans = by_producer.get(header.producer_id, ())
        return any(first <= header.base_offset < last for first, last in spans)

    return aborted


def build_key_map(
    batches: Iterable[tuple[int, bytes]],
    dirty_from: int,
    config: TopicConfig,
    now_ms: int,
    keys_max: int,
    aborted: Aborted = never_aborted,
) -> KeyMap:
    """The key map of `batches` (the partition's, oldest first, from the one holding `dirty_from`).

    It ends before the first batch younger than `min.compaction.lag.ms` (lag 0: none is too young), or
    before the batch whose keys would take it past `keys_max` (never before the first batch: one holds
    at most RECORDS_PER_APPEND_MAX keys). A transaction marker and an aborted transaction's records
    (`aborted`) supersede nothing. Pure: the tests drive it with any clock.
    """
    latest: dict[bytes, int] = {}
    end_offset = dirty_from
    lag_ms = config.min_compaction_lag_ms
    for base_offset, data in batches:
        header = read_header(data)
        if lag_ms > 0 and now_ms - header.max_timestamp_ms < lag_ms:
            break
        if header.is_control or aborted(header):  # A marker's key, or records no reader commits.
            end_offset = base_offset + header.last_offset_delta + 1
            continue
        records = parse_batch(data)
        digests = [(key_digest(r.key), base_offset + r.offset_delta) for r in records if r.key is not None]
        if latest and len(latest) + len(digests) > keys_max:
            break
        latest.update(digests)
        end_offset = base_offset + header.last_offset_delta + 1
    return KeyMap(latest, end_offset)


@dataclass(frozen=True, slots=True)
class BatchDrops:
    """The records compaction drops from one stored batch, and what apply's rewrite of it costs."""

    base_offset: int
    dropped: tuple[int, ...]  # offsetDeltas, ascending.
    work: int  # WorkMeter units, as apply's compacted_batch charges them.


def batch_drops(
    base_offset: int,
    data: bytes,
    key_map: KeyMap,
    config: TopicConfig,
    now_ms: int,
    aborted: Aborted = never_aborted,
) -> tuple[BatchDrops, int | None]:
    """The records of one batch below the map's end that may go (the module docstring's step 3), and
    when the first tombstone it keeps expires (None: it keeps none that will). An aborted transaction's
    records all go (Kafka's cleaner removes them too); a marker stays. Pure."""
    header = read_header(data)
    meter = WorkMeter(_UNMETERED)
    if header.is_control:  # Markers stay: read_committed consumers need them (Kafka keeps them too).
        return BatchDrops(base_offset, (), meter.spent), None
    records = parse_batch(data, meter=meter)
    if aborted(header):
        return BatchDrops(base_offset, tuple(r.offset_delta for r in records), meter.spent), None
    dropped: list[int] = []
    expiry_ms: int | None = None
    for record in records:
        offset = base_offset + record.offset_delta
        if record.key is None:
            dropped.append(record.offset_delta)
            continue
        newest = key_map.latest.get(key_digest(record.key))
        if newest is not None and newest > offset:
            dropped.append(record.offset_delta)
        elif record.value is None:
            stamp_ms = record.timestamp_ms if record.timestamp_ms >= 0 else header.max_timestamp_ms
            if stamp_ms < 0:
                continue  # No time to expire from: kept.
            expires_ms = stamp_ms + config.delete_retention_ms
            if now_ms > expires_ms:
                dropped.append(record.offset_delta)
            else:
                expiry_ms = expires_ms + 1 if expiry_ms is None else min(expiry_ms, expires_ms + 1)
    return BatchDrops(base_offset, tuple(dropped), meter.spent), expiry_ms


def pack_entries(drops: Iterable[BatchDrops]) -> Iterator[list[BatchDrops]]:
    """`drops` (those that drop something) in entries apply takes whole: within ENTRY_WORK_MAX units of
    work, COMPACT_BATCHES_PER_ENTRY_MAX batches and COMPACT_DROPPED_PER_ENTRY_MAX records each."""
    entry: list[BatchDrops] = []
    work = dropped = 0
    for drop in drops:
        if not drop.dropped:
            continue
        if entry and (
            work + drop.work > ENTRY_WORK_MAX
            or len(entry) >= COMPACT_BATCHES_PER_ENTRY_MAX
            or dropped + len(drop.dropped) > COMPACT_DROPPED_PER_ENTRY_MAX
        ):
            yield entry
            entry, work, dropped = [], 0, 0
        entry.append(drop)
        work += drop.work
        dropped += len(drop.dropped)
    if entry:
        yield entry


@dataclass(slots=True)
class PassReport:
    """What one pass over a partition did."""

    topic: str
    partition: int
    end_offset: int  # X: the pass compacted the offsets below it.
    entries: int = 0
    records_dropped: int = 0
    batches_removed: int = 0
    bytes_freed: int = 0
    results: list[CompactResult] = field(default_factory=list)


class Compactor(LeaderRounds):
    """The leader's compaction loop (see the module docstring)."""

    thread_name = THREAD_NAME

    def __init__(
        self,
        store: Store,
        consensus: Consensus,
        clock_ms: Callable[[], int],
        topic_defaults: Mapping[str, str],
        check_s: float,
        keys_max: int = COMPACTION_KEYS_MAX,
    ) -> None:
        self._keys_max = keys_max
        # By (topic id, partition); only this thread touches them. Bounded by the partitions that exist.
        self._clean_to: dict[tuple[int, int], int] = {}  # Where the clean part ends (a hint, see above).
        self._tombstone_due_ms: dict[tuple[int, int], int] = {}  # When a kept tombstone expires.
        super().__init__(store, consensus, clock_ms, topic_defaults, check_s)

    def run_once(self) -> list[PassReport]:
        """One pass over every compacted partition that is due; returns what each pass did."""
        topics = self.topic_configs()
        live = {
            (topic.topic_id, p)
            for topic, config in topics
            if config.compacts
            for p in range(topic.partitions)
        }
        for hints in (self._clean_to, self._tombstone_due_ms):
            for key in [key for key in hints if key not in live]:
                del hints[key]  # A deleted topic, or one no longer compacted.
        reports: list[PassReport] = []
        for topic, config in topics:
            if not config.compacts:
                continue
            for partition in range(topic.partitions):
                if self._stopping.is_set():
                    return reports
                report = self.compact_partition(topic.name, topic.topic_id, partition, config)
                if report is not None:
                    reports.append(report)
        return reports

    def compact_partition(
        self, topic: str, topic_id: int, partition: int, config: TopicConfig
    ) -> PassReport | None:
        """One pass over one partition when it is due (None when it is not, or had nothing to compact)."""
        key = (topic_id, partition)
        now_ms = self._clock_ms()
        with self._store.read() as reader:
            state = reader.partition(topic_id, partition)
            if state is None:
                return None
            # Only records below the last stable offset are compacted (an open transaction's may still
            # abort), as Kafka's cleaner stops at the first unstable offset.
            stable = reader.last_stable_offset(
                topic_id, partition, state.log_end_offset, TXN_OPEN_PER_PARTITION_MAX
            )
            aborted = aborted_ranges(
                reader.aborted_transactions(
                    topic_id, partition, state.log_start_offset, stable, COMPACTION_ABORTED_ROWS_MAX
                )
            )
            dirty_from = max(self._clean_to.get(key, 0), state.log_start_offset)
            dirty_bytes = sum(
                span.size_bytes
                for span in reader.batch_spans(topic_id, partition, dirty_from, COMPACTION_SCAN_BATCHES_MAX)
            )
        ratio_due = dirty_bytes > 0 and dirty_bytes >= config.min_cleanable_dirty_ratio * state.size_bytes
        tombstone_due = self._tombstone_due_ms.get(key, now_ms + 1) <= now_ms
        if not (ratio_due or tombstone_due):
            return None
        batches = self._scan(topic_id, partition, dirty_from, stable)
        key_map = build_key_map(batches, dirty_from, config, now_ms, self._keys_max, aborted)
        if key_map.end_offset <= dirty_from and not tombstone_due:
            return None  # Nothing new is old enough yet (min.compaction.lag.ms).
        if key_map.end_offset <= state.log_start_offset:
            return None
        report = PassReport(topic, partition, key_map.end_offset)
        expiries: list[int] = []

        def drops() -> Iterator[BatchDrops]:
            for base_offset, data in self._scan(
                topic_id, partition, state.log_start_offset, key_map.end_offset
            ):
                found, expiry_ms = batch_drops(base_offset, data, key_map, config, now_ms, aborted)
                if expiry_ms is not None:
                    expiries.append(expiry_ms)
                yield found

        for entry in pack_entries(drops()):
            if self._stopping.is_set():
                return report
            command = commands.compact(
                topic, topic_id, partition, [(d.base_offset, d.dropped) for d in entry]
            )
            result = propose_and_wait(self._consensus, command, PROPOSAL_TIMEOUT_S)
            if not isinstance(result, CompactResult) or result.error != ErrorCode.OK:
                logger.info("compaction of %s/%d stopped: %s", topic, partition, result)
                return report
            report.entries += 1
            report.records_dropped += result.records_dropped
            report.batches_removed += result.batches_removed
            report.bytes_freed += result.bytes_freed
            report.results.append(result)
        self._clean_to[key] = key_map.end_offset
        if expiries:
            self._tombstone_due_ms[key] = min(expiries)
        else:
            self._tombstone_due_ms.pop(key, None)
        if report.records_dropped:
            logger.info(
                "compaction: %s/%d below offset %d: %d records dropped, %d batches removed, %d bytes freed",
                topic,
                partition,
                key_map.end_offset,
                report.records_dropped,
                report.batches_removed,
                report.bytes_freed,
            )
        return report

    def _scan(
        self, topic_id: int, partition: int, offset: int, end_offset: int | None
    ) -> Iterator[tuple[int, bytes]]:
        """The partition's batches from the one holding `offset` up to `end_offset` (None: its end, at
        most COMPACTION_SCAN_BATCHES_MAX), copied out of short read transactions."""
        read = 0
        while read < COMPACTION_SCAN_BATCHES_MAX and not self._stopping.is_set():
            with self._store.read() as reader:
                chunk = [
                    (base_offset, bytes(value))
                    for base_offset, value in reader.stored_batches(
                        topic_id,
                        partition,
                        offset,
                        min(COMPACTION_READ_BATCHES, COMPACTION_SCAN_BATCHES_MAX - read),
                    )
                    if end_offset is None or base_offset < end_offset
                ]
            if not chunk:
                return
            yield from chunk
            read += len(chunk)
            base_offset, data = chunk[-1]
            offset = base_offset + read_header(data).last_offset_delta + 1
