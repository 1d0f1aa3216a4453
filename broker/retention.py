"""Retention: the leader trims each partition's expired prefix through Raft (Kafka's delete policy).

The leader decides from committed state only (its store holds exactly what was applied) which prefix
of a partition has expired, and proposes a `TrimCommand` naming the topic id it measured; every
replica applies the same trim, so `log_start_offset` is the same everywhere, and apply stays
deterministic (it reads no clock: the decision, which does, is the leader's). A batch expires:

- by time, when `retention.ms` >= 0 and its maxTimestamp is more than `retention.ms` before the
  leader's clock (a batch without a timestamp, -1, never expires by time);
- by size, when `retention.bytes` >= 0 and the partition would still hold at least `retention.bytes`
  without it (Kafka's rule, per segment there and per batch here: a partition keeps at most one
  batch more than the bound).

Batches are expired oldest first and the scan stops at the first batch that stays, so a batch with
a future timestamp holds back those after it (as a Kafka segment does). One trim deletes at most
TRIM_BATCHES_PER_ENTRY_MAX batches in apply; batches a trim left below the log start are seen here
and trimmed again.

Thread: `kq-retention` (started by `start()`, stopped by `stop()`: an Event, then joined) wakes every
`check_s`, and on the leader only runs `run_once`: it reads the store in one read transaction per
partition and proposes (blocking, PROPOSAL_TIMEOUT_S) one trim per partition that needs one. It owns
nothing but its Event; the store and consensus are thread-safe.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from kq.broker.background import LeaderRounds
from kq.broker.proposals import propose_and_wait
from kq.proto.limits import PROPOSAL_TIMEOUT_S, TRIM_BATCHES_PER_ENTRY_MAX
from kq.raft import commands
from kq.raft.results import PurgeResult, TrimResult
from kq.raft.topic_config import TopicConfig
from kq.storage import BatchSpan, PartitionState

logger = logging.getLogger(__name__)

THREAD_NAME = "kq-retention"


@dataclass(frozen=True, slots=True)
class Trim:
    """A trim retention proposes: the partition, the new log start, and why."""

    topic: str
    topic_id: int
    partition: int
    before_offset: int
    reason: str


def trim_point(
    spans: Iterable[BatchSpan], state: PartitionState, config: TopicConfig, now_ms: int
) -> tuple[int, str] | None:
    """(offset to trim below, reason) for one partition, or None when nothing is to be deleted.

    `spans` are the partition's stored batches oldest first (at most TRIM_BATCHES_PER_ENTRY_MAX are
    read), `state` its offsets and stored size. Pure: the tests drive it with any clock.
    """
    if not config.deletes:
        return None
    start = state.log_start_offset
    target = start
    leftover = False
    reasons: set[str] = set()
    # Bytes the partition holds beyond retention.bytes (batches below the start count: they are stored).
    excess = state.size_bytes - config.retention_bytes if config.retention_bytes >= 0 else -1
    for span in spans:
        if span.end_offset <= start:  # Below the log start already; a bounded trim left it.
            leftover = True
            excess -= span.size_bytes
            continue
        by_time = (
            config.retention_ms >= 0
            and span.max_timestamp_ms >= 0
            and now_ms - span.max_timestamp_ms > config.retention_ms
        )
        by_size = config.retention_bytes >= 0 and excess - span.size_bytes >= 0
        if not (by_time or by_size):
            break
        reasons.add("retention.ms" if by_time else "retention.bytes")
        target = span.end_offset
        excess -= span.size_bytes
    if target > start:
        return target, " and ".join(sorted(reasons))
    if leftover:
        return start, "batches left below the log start"
    return None


class Retention(LeaderRounds):
    """The leader's retention loop (see the module docstring)."""

    thread_name = THREAD_NAME

    def due(self, now_ms: int) -> list[Trim]:
        """The trims the committed state calls for at `now_ms` (reads only)."""
        due: list[Trim] = []
        for topic, config in self.topic_configs():
            if not config.deletes or (config.retention_ms < 0 and config.retention_bytes < 0):
                continue
            for partition in range(topic.partitions):
                if self._stopping.is_set():
                    return due
                with self._store.read() as reader:
                    state = reader.partition(topic.topic_id, partition)
                    if state is None:  # Deleted since the topics were listed.
                        break
                    spans = reader.oldest_batches(topic.topic_id, partition, TRIM_BATCHES_PER_ENTRY_MAX)
                    found = trim_point(spans, state, config, now_ms)
                if found is not None:
                    due.append(Trim(topic.name, topic.topic_id, partition, found[0], found[1]))
        return due

    def run_once(self) -> list[Trim]:
        """Proposes every due trim, one after the other (after finishing the deletion of deleted
        topics' batches); returns the trims that applied."""
        self.purge_deleted()
        done: list[Trim] = []
        for trim in self.due(self._clock_ms()):
            command = commands.trim(trim.topic, trim.partition, trim.before_offset, trim.topic_id)
            result = propose_and_wait(self._consensus, command, PROPOSAL_TIMEOUT_S)
            if isinstance(result, TrimResult) and result.log_start_offset == trim.before_offset:
                logger.info(
                    "retention: %s/%d starts at %d (%s)",
                    trim.topic,
                    trim.partition,
                    trim.before_offset,
                    trim.reason,
                )
                done.append(trim)
        return done

    def purge_deleted(self) -> int:
        """Proposes PurgeTopicCommands until every deleted topic's batches are gone (each entry deletes
        at most TRIM_BATCHES_PER_ENTRY_MAX); returns how many it proposed."""
        with self._store.read() as reader:
            pending = reader.purges()
        proposed = 0
        for topic_id in pending:
            done = False
            while not done and not self._stopping.is_set():
                result = propose_and_wait(self._consensus, commands.purge_topic(topic_id), PROPOSAL_TIMEOUT_S)
                proposed += 1
                done = not isinstance(result, PurgeResult) or result.done
            if done:
                logger.info("retention: the batches of deleted topic id %d are deleted", topic_id)
        return proposed
