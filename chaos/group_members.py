"""Consumer-group members of the chaos workload: `GroupConsumer`s that record what the group did.

Every member of a group is a thread with its own `KqClient` and `GroupConsumer` subscribed to the
chaos topic. It records every record a poll returns, every commit the cluster acknowledges (from
whichever path: a manual commit after processing, an auto-commit on the interval, the commit before a
rebalance or on close), and every committed offset it reads when it (re)joins. The recording happens
in `RecordingClient`, under the `GroupConsumer`, so no commit path can be missed.

Members ride out faults: a failed call is retried on the next poll, a member fenced by a rebalance
rejoins (the `GroupConsumer` does that on its next poll), and some members leave and rejoin on a
seeded schedule (churn), so the group also rebalances while the cluster is faulted. A member whose
position fell below the log start (retention trimmed it) moves up to the log start
(`ResettingGroupConsumer`). When the cluster's members change, a member leaves the group (committing
first) and joins again with a client of the new bootstrap list (`chaos.bootstrap`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kq.chaos.bootstrap import Bootstrap
from kq.chaos.history import ClientError, GroupDelivery, GroupObservation, History, record_id
from kq.client import (
    GroupConsumer,
    KqClient,
    KqClientError,
    RebalanceError,
    TlsConfig,
    UnavailableError,
)
from kq.client.types import GroupAssignment

logger = logging.getLogger(__name__)

GROUP_NAME = "chaos-group"
GROUP_POLL_MS = 200  # One poll's wait: also how soon a member notices it should stop or churn.
AUTO_COMMIT_INTERVAL_MS = 1_000  # Short, so the group commits often and catches up quickly at the end.
SESSION_TIMEOUT_MS = 10_000  # Kafka's default: longer than any fault here keeps a member from its node.
HEARTBEAT_INTERVAL_MS = 1_000
GROUP_RETRY_TIMEOUT_S = 20.0  # A member's client retries a call this long (longer than any failover).
GROUP_RPC_TIMEOUT_S = 10.0  # Above the broker's 5 s JoinGroup wait.
MEMBER_RETRY_S = 0.2  # Pause after a failed poll or commit before the next try.
CHURN_MIN_S = 2.0  # A churning member leaves after a random time in this range (several times per
CHURN_MAX_S = 5.0  # fault round), then stays away for a while: long enough that the others rebalance
CHURN_AWAY_MIN_S = 0.5  # without it (its partitions move to them), short enough to come back within
CHURN_AWAY_MAX_S = 1.5  # the round (they move again): two rebalances with handoffs per churn.
# Stopping a member may take a close: a final commit and a leave (each up to the retry deadline)
# and the heartbeat thread's end.
MEMBER_STOP_TIMEOUT_S = 2 * GROUP_RETRY_TIMEOUT_S + 15.0


@dataclass(frozen=True, slots=True)
class GroupMemberSpec:
    """One member: its name, its group, how it commits and whether it leaves and rejoins now and then."""

    name: str
    group: str
    manual_commit: bool  # Commit after processing each batch; else the GroupConsumer auto-commits.
    churn: bool = False


def group_member_specs(count: int, group: str = GROUP_NAME) -> list[GroupMemberSpec]:
    """`count` members of one group: auto, manual, then churning auto, manual, auto, ... members.

    The first two never churn, so the group always has a steady member; every third churns.
    """
    return [
        GroupMemberSpec(
            f"g{i}-{'manual' if i % 2 else 'auto'}{'-churn' if i % 3 == 2 else ''}",
            group,
            manual_commit=i % 2 == 1,
            churn=i % 3 == 2,
        )
        for i in range(count)
    ]


class RecordingClient(KqClient):
    """A member's client: records the commits the cluster acknowledges and the offsets read at a join."""

    def __init__(
        self, bootstrap: Sequence[str], member: str, history: History, tls: TlsConfig | None
    ) -> None:
        super().__init__(
            bootstrap, retry_timeout_s=GROUP_RETRY_TIMEOUT_S, rpc_timeout_s=GROUP_RPC_TIMEOUT_S, tls=tls
        )
        self._member = member
        self._history = history
        self._generation = 0  # Of the last successful join: the GroupConsumer reads offsets right after.

    def join_group(
        self,
        group: str,
        *,
        topics: Sequence[str] = (),
        pattern: str = "",
        member_id: str = "",
        client_id: str = "",
        assignor: str = "",
        session_timeout_ms: int = 0,
        rebalance_timeout_ms: int = 0,
    ) -> GroupAssignment:
        """Joins, and remembers the generation for the committed offsets the GroupConsumer reads next."""
        joined = super().join_group(
            group,
            topics=topics,
            pattern=pattern,
            member_id=member_id,
            client_id=client_id,
            assignor=assignor,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
        )
        self._generation = joined.generation
        return joined

    def commit_offsets(
        self, group: str, offsets: Mapping[tuple[str, int], int], member_id: str = "", generation: int = 0
    ) -> None:
        """Commits, and records the commit once the cluster acknowledged it."""
        try:
            super().commit_offsets(group, offsets, member_id=member_id, generation=generation)
        except RebalanceError:
            self._history.group_refused(fenced=True)
            raise
        except UnavailableError:
            self._history.group_refused(fenced=False)
            raise
        for topic in sorted({topic for topic, _ in offsets}):
            entries = sorted((p, o) for (t, p), o in offsets.items() if t == topic)
            self._history.acknowledge_commit(group, self._member, generation, topic, entries)

    def committed_offsets(
        self, group: str, partitions: Iterable[tuple[str, int]] = (), node: str | None = None
    ) -> dict[tuple[str, int], int]:
        """Reads committed offsets (the GroupConsumer does so right after joining) and records them."""
        wanted = list(partitions)
        requested_s = time.monotonic()
        committed = super().committed_offsets(group, wanted, node)
        observed_s = time.monotonic()
        self._history.observe_committed(
            [
                GroupObservation(
                    group,
                    self._member,
                    self._generation,
                    topic,
                    partition,
                    committed.get((topic, partition)),
                    requested_s,
                    observed_s,
                )
                for topic, partition in wanted
            ]
        )
        return committed


class ResettingGroupConsumer(GroupConsumer):
    """A GroupConsumer (`auto_offset_reset="earliest"`: a position retention left below the log start
    moves up to it) that counts each move in the history; `moved` says a position moved without
    records since the last commit (a manual member commits then too: else the group's committed offset
    stays below the log start while no record comes)."""

    def __init__(
        self, client: KqClient, group: str, topics: Sequence[str], history: History, **options: Any
    ) -> None:
        super().__init__(client, group, topics, **options)
        self._history = history
        self.moved = False

    def commit(self) -> None:
        """Commits the positions (GroupConsumer.commit), which include any moved up to the log start."""
        super().commit()
        self.moved = False

    def _reset_out_of_range(self, topic: str, partition: int) -> bool:
        """The GroupConsumer's reset (to the log start: `auto_offset_reset="earliest"`), counted."""
        moved = super()._reset_out_of_range(topic, partition)
        if moved:
            self._history.reset_reader()
            self.moved = True
        return moved


class GroupMember(threading.Thread):
    """One member: polls, records, commits (manual mode), until stopped; leaves and rejoins if it churns."""

    def __init__(
        self,
        spec: GroupMemberSpec,
        bootstrap: Bootstrap,
        topic: str,
        history: History,
        seed: int,
        tls: TlsConfig | None = None,
    ) -> None:
        """`tls`: how the member's clients reach the nodes (None: plain text)."""
        super().__init__(name=f"chaos-{spec.name}", daemon=True)
        self.spec = spec
        self._tls = tls
        self._addresses = bootstrap  # Not `_bootstrap`: a Thread method of that name.
        self._topic = topic
        self._history = history
        self._random = random.Random(seed)
        self._stopping = threading.Event()
        self._settled = threading.Event()

    def settle(self) -> None:
        """Stops churning: from now on the member stays in the group until stopped."""
        self._settled.set()

    def stop(self) -> None:
        """Asks the member to commit what it processed, leave the group and finish."""
        self._settled.set()
        self._stopping.set()

    def run(self) -> None:
        """One GroupConsumer after another (a churning member replaces its own) until stopped; a new
        client whenever the bootstrap list changed."""
        while not self._stopping.is_set():
            addresses = self._addresses.addresses()
            with RecordingClient(addresses, self.spec.name, self._history, self._tls) as client:
                while not self._stopping.is_set() and self._addresses.addresses() == addresses:
                    self._membership(client, addresses)

    def _membership(self, client: KqClient, addresses: tuple[str, ...]) -> None:
        """One GroupConsumer: joins, consumes until it is time to churn (or the bootstrap list changed,
        or the member stops), leaves; a churning member then stays away a while."""
        consumer = ResettingGroupConsumer(
            client,
            self.spec.group,
            [self._topic],
            self._history,
            client_id=self.spec.name,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
            auto_offset_reset="earliest",
            enable_auto_commit=not self.spec.manual_commit,
            auto_commit_interval_ms=AUTO_COMMIT_INTERVAL_MS,
        )
        churn_at_s = (
            time.monotonic() + self._random.uniform(CHURN_MIN_S, CHURN_MAX_S) if self.spec.churn else None
        )
        try:
            self._consume(consumer, churn_at_s, addresses)
        finally:
            self._leave(consumer)
        if self.spec.churn and not self._settled.is_set():
            self._stopping.wait(self._random.uniform(CHURN_AWAY_MIN_S, CHURN_AWAY_MAX_S))

    def _consume(
        self, consumer: ResettingGroupConsumer, churn_at_s: float | None, addresses: tuple[str, ...]
    ) -> None:
        """Polls until stopped (or until it is time to churn, or the bootstrap list is no longer
        `addresses`), recording and committing."""
        uncommitted = False  # Manual mode: records were returned since the last acknowledged commit.
        while not self._stopping.is_set():
            if churn_at_s is not None and not self._settled.is_set() and time.monotonic() >= churn_at_s:
                return
            if self._addresses.addresses() != addresses:
                return
            try:
                records = consumer.poll(GROUP_POLL_MS)
                now_s = time.monotonic()
                if records:
                    self._history.deliver_to_group(
                        [
                            GroupDelivery(
                                self.spec.group,
                                self.spec.name,
                                consumer.generation,
                                record.topic,
                                record.partition,
                                record.offset,
                                record_id(record.value, record.headers),
                                now_s,
                                record.key,
                            )
                            for record in records
                        ]
                    )
                uncommitted = uncommitted or bool(records)
                if self.spec.manual_commit and (uncommitted or consumer.moved):
                    consumer.commit()  # After processing (recording) the batch: at-least-once.
                    uncommitted = False
            except RebalanceError:
                # Fenced: the group moved on. The next poll rejoins and starts from the committed
                # offsets, so what was not committed is delivered again (at least once).
                uncommitted = False
                self._stopping.wait(MEMBER_RETRY_S)
            except UnavailableError:  # A fault: the same call is tried again on the next round.
                self._stopping.wait(MEMBER_RETRY_S)
            except KqClientError as error:
                self._history.client_error(
                    ClientError(self.spec.name, type(error).__name__, str(error), time.monotonic())
                )
                self._stopping.wait(MEMBER_RETRY_S)

    def _leave(self, consumer: ResettingGroupConsumer) -> None:
        """Commits what was processed (the GroupConsumer does so itself in auto mode) and leaves."""
        if self.spec.manual_commit:
            try:
                consumer.commit()
            except KqClientError as error:
                logger.info("%s: commit before leaving failed: %s", self.spec.name, error)
        consumer.close()


def stop_members(members: Sequence[GroupMember]) -> list[str]:
    """Stops every member (they close in parallel); returns the names of any still running."""
    for member in members:
        member.stop()
    deadline_s = time.monotonic() + MEMBER_STOP_TIMEOUT_S
    for member in members:
        member.join(timeout=max(0.0, deadline_s - time.monotonic()))
    return [member.name for member in members if member.is_alive()]
