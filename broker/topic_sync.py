"""Topic copies: every Raft group other than group 0 holds a copy of group 0's topics, so that its own
`apply` can check an append against the topic (its id, partitions, `max.message.bytes`, timestamp
type) without reading another group's state (the one rule, per group: DESIGN.md "Scale-out").

Group 0 is where topics are created, altered and deleted. In each other group, the worker process
that leads it runs `TopicSync` (thread `kq-topic-sync`): every TOPIC_SYNC_PERIOD_S it reads group 0's
topics and their config overrides from this node's replica of group 0 (its LMDB store, opened read
only beside the group-0 worker that writes it) and its own group's, and proposes to its own group
the commands that make the copy equal (`sync_plan`, a pure function): a topic missing here is
created with group 0's id, creation time and overrides; a topic here that group 0 no longer has
under that name and id is deleted (its records then purged by the group's retention, as any
deleted topic's); a topic group 0 grew (Kafka's CreatePartitions) grows here to the same count;
overrides that differ are set and removed. At most TOPIC_SYNC_CHANGES_MAX
commands a round.

Every state in between is safe: a topic not yet copied answers the retriable
UNKNOWN_TOPIC_OR_PARTITION in this group; a crash between rounds leaves a copy that the next leader's
first round completes (each command is idempotent by topic id: a create with an id already given is
refused, a delete of another id deletes nothing). Reading this node's replica of group 0 may lag its
leader by a few entries: the copy follows it within a round or two.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kq.broker.background import BackgroundThread
from kq.broker.consensus import Consensus
from kq.broker.errors import KqError
from kq.broker.proposals import propose_and_wait
from kq.proto import kq_pb2
from kq.proto.limits import PROPOSAL_TIMEOUT_S, TOPIC_SYNC_CHANGES_MAX, TOPIC_SYNC_PERIOD_S
from kq.raft import commands
from kq.raft.topic_config import decode_overrides
from kq.storage import StorageError, Store, StoreReader

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TopicCopy:
    """What a group's copy of a topic must match: group 0's id, partitions, creation and overrides."""

    topic_id: int
    partitions: int
    created_ms: int
    overrides: Mapping[str, str]
    groups: int = 1  # The Raft groups its partitions are spread over (fixed at creation).


def topic_copies(reader: StoreReader) -> dict[str, TopicCopy]:
    """Every topic of a store, by name, with its overrides."""
    return {
        topic.name: TopicCopy(
            topic.topic_id,
            topic.partitions,
            topic.created_ms,
            decode_overrides(reader.topic_configs(topic.topic_id)),
            topic.groups,
        )
        for topic in reader.topics()
    }


def sync_plan(source: Mapping[str, TopicCopy], copy: Mapping[str, TopicCopy]) -> list[kq_pb2.Command]:
    """The commands that bring `copy` (a group's topics) to `source` (group 0's), deletions first.

    A name whose topic has another id in the copy (deleted and created again in group 0) is deleted
    here this round and created the next, once the deletion applied."""
    deletes, creates, alters = [], [], []
    for name, have in sorted(copy.items()):
        wanted = source.get(name)
        if wanted is None or wanted.topic_id != have.topic_id:
            deletes.append(commands.delete_topic(name, have.topic_id))
            continue
        if wanted.partitions > have.partitions:
            alters.append(commands.grow_partitions(name, wanted.partitions, have.topic_id))
        if dict(wanted.overrides) != dict(have.overrides):
            removed = sorted(set(have.overrides) - set(wanted.overrides))
            alters.append(commands.alter_topic_config(name, wanted.overrides, removed))
    for name, wanted in sorted(source.items()):
        if name not in copy:
            creates.append(
                commands.create_topic(
                    name,
                    wanted.partitions,
                    wanted.created_ms,
                    wanted.overrides,
                    topic_id=wanted.topic_id,
                    groups=wanted.groups,
                )
            )
    return [*deletes, *alters, *creates]


class TopicSync(BackgroundThread):
    """On the leader of a group other than 0: keeps the group's topics equal to group 0's (above)."""

    thread_name = "kq-topic-sync"

    def __init__(
        self,
        store: Store,
        consensus: Consensus,
        source_path: Path,
        map_size_bytes: int,
        period_s: float = TOPIC_SYNC_PERIOD_S,
    ) -> None:
        self._store = store
        self._consensus = consensus
        self._source_path = source_path  # This node's replica of group 0: its store directory.
        self._map_size_bytes = map_size_bytes
        self._period_s = period_s
        self._source: Store | None = None
        self.changes_proposed = 0  # Commands this node proposed since it started (a metric, tests).
        super().__init__()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stops the thread (a proposal in flight ends within PROPOSAL_TIMEOUT_S) and closes the source."""
        super().stop(PROPOSAL_TIMEOUT_S + self._period_s if timeout_s is None else timeout_s)
        if self._source is not None:
            self._source.close()
            self._source = None

    def _run(self) -> None:
        while not self._stopping.wait(self._period_s):
            if self._consensus.is_leader():
                try:
                    self.run_once()
                except KqError as error:  # Leadership lost, a commit timed out: the next round retries.
                    logger.info("topic copy round ended: %s", error)

    def run_once(self) -> int:
        """One round: the commands proposed (0 when the copy is equal, or group 0 has no store yet)."""
        source = self._open_source()
        if source is None:
            return 0
        with source.read() as reader:
            wanted = topic_copies(reader)
        with self._store.read() as reader:
            have = topic_copies(reader)
        plan = sync_plan(wanted, have)[:TOPIC_SYNC_CHANGES_MAX]
        for command in plan:
            propose_and_wait(self._consensus, command, PROPOSAL_TIMEOUT_S)
            self.changes_proposed += 1
        if plan:
            logger.info("brought %d topic changes over from group 0", len(plan))
        return len(plan)

    def _open_source(self) -> Store | None:
        if self._source is None:
            try:
                self._source = Store.open_reader(self._source_path, self._map_size_bytes)
            except StorageError as error:  # Group 0's worker has not created it yet.
                logger.debug("group 0's store is not readable yet: %s", error)
                return None
        return self._source
