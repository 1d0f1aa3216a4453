"""`GroupConsumer`: a member of a consumer group, kafka-python style.

The cluster assigns the group's partitions among its members and keeps their committed offsets. A
background thread heartbeats (long-polling, so a rebalance is noticed at once); the next `poll`
then commits the current positions (auto-commit mode), calls `on_revoke`, rejoins, and calls
`on_assign` with the new partitions. Delivery is at-least-once: a record is committed only after the
`poll` that returned it is followed by another `poll`, `commit` or `close`.

Not thread-safe: call a GroupConsumer's methods from one thread (use one consumer per thread). Its
heartbeat thread is internal; it starts with the first join (in `poll`), never in the constructor,
and shares only the member id, generation and a rebalance flag with the caller's thread, under a lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from kq.client.client import KqClient
from kq.client.errors import KqClientError, OffsetOutOfRangeError, RebalanceError, UnknownMemberError
from kq.client.types import ConsumerRecord
from kq.proto.limits import GROUP_JOIN_ATTEMPTS_MAX

logger = logging.getLogger(__name__)

POLL_WAIT_SLICE_MS = 100
HEARTBEAT_ERROR_PAUSE_S = 0.2

PartitionsCallback = Callable[[list[tuple[str, int]]], None]


class GroupConsumer:
    """Consumes `topics` (or topics matching `pattern`) as a member of `group`; not thread-safe."""

    def __init__(
        self,
        client: KqClient,
        group: str,
        topics: Sequence[str] = (),
        *,
        pattern: str = "",
        assignor: str = "range",
        client_id: str = "",
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 1_000,
        rebalance_timeout_ms: int = 30_000,
        auto_offset_reset: str = "earliest",
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5_000,
        max_records: int = 500,
        on_assign: PartitionsCallback | None = None,
        on_revoke: PartitionsCallback | None = None,
    ) -> None:
        if auto_offset_reset not in ("earliest", "latest"):
            raise ValueError("auto_offset_reset must be 'earliest' or 'latest'")
        if heartbeat_interval_ms * 3 > session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be at most a third of session_timeout_ms")
        self._client = client
        self.group = group
        self._topics = tuple(topics)
        self._pattern = pattern
        self._assignor = assignor
        self._client_id = client_id
        self._session_timeout_ms = session_timeout_ms
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._rebalance_timeout_ms = rebalance_timeout_ms
        self._reset = auto_offset_reset
        self._auto_commit_s = auto_commit_interval_ms / 1000 if enable_auto_commit else None
        self._max_records = max_records
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._lock = threading.Lock()
        self._member_id = ""
        self._generation = 0
        self._positions: dict[tuple[str, int], int] = {}
        self._committed: dict[tuple[str, int], int] = {}
        self._last_commit = time.monotonic()
        self._rebalance_needed = threading.Event()
        self._closed = threading.Event()
        self._turn = 0
        self._heartbeats: threading.Thread | None = None  # Started by the first join.

    # Membership ---------------------------------------------------------------------------------

    @property
    def member_id(self) -> str:
        """This member's id ('' before the first join)."""
        return self._member_id

    @property
    def generation(self) -> int:
        """The group generation of the current assignment."""
        return self._generation

    def assignment(self) -> list[tuple[str, int]]:
        """The (topic, partition) pairs this member owns now."""
        return sorted(self._positions)

    def position(self, topic: str, partition: int) -> int:
        """The next offset this member will read from the partition."""
        return self._positions[(topic, partition)]

    def _join(self) -> None:
        for _ in range(GROUP_JOIN_ATTEMPTS_MAX):
            try:
                joined = self._client.join_group(
                    self.group,
                    topics=self._topics,
                    pattern=self._pattern,
                    member_id=self._member_id,
                    client_id=self._client_id,
                    assignor=self._assignor,
                    session_timeout_ms=self._session_timeout_ms,
                    rebalance_timeout_ms=self._rebalance_timeout_ms,
                )
                break
            except UnknownMemberError as error:
                logger.info("join of group %s: %s; joining as a new member", self.group, error)
                self._member_id = ""  # The group forgot this id (expired or left): only a new one joins.
            except RebalanceError as error:
                logger.info("join of group %s: %s", self.group, error)
        else:
            raise RebalanceError(f"could not join group {self.group} in {GROUP_JOIN_ATTEMPTS_MAX} attempts")
        positions = self._starting_positions(list(joined.partitions))
        with self._lock:
            self._member_id, self._generation = joined.member_id, joined.generation
            self._positions = positions
            self._committed = {}
            self._rebalance_needed.clear()
        logger.info(
            "member %s of %s, generation %d: %s", joined.member_id, self.group, joined.generation, positions
        )
        self._start_heartbeats()
        if self._on_assign is not None:
            self._on_assign(sorted(positions))

    def _starting_positions(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        committed = self._client.committed_offsets(self.group, partitions) if partitions else {}
        positions: dict[tuple[str, int], int] = {}
        logs: dict[str, dict[int, tuple[int, int]]] = {}
        for topic, partition in partitions:
            if (topic, partition) in committed:
                positions[(topic, partition)] = committed[(topic, partition)]
                continue
            if topic not in logs:
                offsets = self._client.list_offsets(topic)
                logs[topic] = {p: (o.log_start_offset, o.log_end_offset) for p, o in offsets.items()}
            start, end = logs[topic][partition]
            positions[(topic, partition)] = start if self._reset == "earliest" else end
        return positions

    def _rebalance(self) -> None:
        if self._member_id and self._positions:
            if self._auto_commit_s is not None:
                try:
                    self.commit()
                except RebalanceError:
                    logger.info(
                        "commit before rejoining %s came too late; records may be read again", self.group
                    )
            if self._on_revoke is not None:
                self._on_revoke(sorted(self._positions))
        self._join()

    def _start_heartbeats(self) -> None:
        """Starts the heartbeat thread once, after the first join (before it there is no member to keep)."""
        if self._heartbeats is None:
            self._heartbeats = threading.Thread(
                target=self._heartbeat_loop, name=f"kq-heartbeat-{self.group}", daemon=True
            )
            self._heartbeats.start()

    def _heartbeat_loop(self) -> None:
        while not self._closed.is_set():
            with self._lock:
                member_id, generation = self._member_id, self._generation
            try:
                rebalancing = self._client.heartbeat(
                    self.group, member_id, generation, wait_ms=self._heartbeat_interval_ms
                )
            except RebalanceError:
                rebalancing = True
            except KqClientError as error:
                logger.info("heartbeat of %s failed: %s", self.group, error)
                self._closed.wait(HEARTBEAT_ERROR_PAUSE_S)
                continue
            with self._lock:
                current = self._generation == generation
            if rebalancing and current:
                self._rebalance_needed.set()
                self._closed.wait(self._heartbeat_interval_ms / 1000)  # Keep the session alive meanwhile.

    # Reading and committing ---------------------------------------------------------------------

    def poll(self, timeout_ms: int = 1_000, max_records: int | None = None) -> list[ConsumerRecord]:
        """Records from the owned partitions, waiting up to `timeout_ms`; handles rebalances first.

        Positions move only when records are returned: if a fetch fails, nothing read in this call
        counts as consumed, so a later commit cannot skip records the caller never saw.
        """
        if self._closed.is_set():
            raise KqClientError("the consumer is closed")
        if not self._member_id or self._rebalance_needed.is_set():
            self._rebalance()
        self._maybe_auto_commit()
        limit = max_records or self._max_records
        deadline = time.monotonic() + timeout_ms / 1000
        partitions = sorted(self._positions)
        while partitions:
            records: list[ConsumerRecord] = []
            for topic, partition in partitions:
                records += self._fetch(topic, partition, limit - len(records), 0)
                if len(records) >= limit:
                    break
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if not records and remaining_ms > 0 and not self._rebalance_needed.is_set():
                self._turn = (self._turn + 1) % len(partitions)
                topic, partition = partitions[self._turn]
                records = self._fetch(topic, partition, limit, min(remaining_ms, POLL_WAIT_SLICE_MS))
            if records or remaining_ms <= 0 or self._rebalance_needed.is_set():
                for record in records:
                    self._positions[(record.topic, record.partition)] = record.offset + 1
                return records
        self._closed.wait(timeout_ms / 1000 if not self._rebalance_needed.is_set() else 0)
        return []

    def _reset_out_of_range(self, topic: str, partition: int) -> bool:
        """After OUT_OF_RANGE: moves a position retention left below the log start (or one past the log
        end) to the start or the end, as `auto_offset_reset` says (Kafka's auto.offset.reset); whether it
        moved. A position within the log means the node asked lags behind: it is fetched again.

        The log's ends come from the leader of the partition's Raft group: a follower that lags (a
        node just restarted) would put them too low, and the position would be reset to the start
        of a log that holds it. No leader known: the position stays, and is fetched again."""
        leader = self._client.group_leader_address(self._client.partition_group(topic, partition))
        if leader is None:
            return False
        offsets = self._client.list_offsets(topic, node=leader)[partition]
        position = self._positions[(topic, partition)]
        if offsets.log_start_offset <= position <= offsets.log_end_offset:
            return False
        reset = offsets.log_start_offset if self._reset == "earliest" else offsets.log_end_offset
        logger.info("%s/%d: offset %d out of range, reset to %d", topic, partition, position, reset)
        self._positions[(topic, partition)] = reset
        return True

    def _fetch(self, topic: str, partition: int, limit: int, wait_ms: int) -> list[ConsumerRecord]:
        if limit <= 0:
            return []
        position = self._positions[(topic, partition)]
        try:
            result = self._client.fetch(topic, partition, position, max_records=limit, wait_ms=wait_ms)
        except OffsetOutOfRangeError:
            self._reset_out_of_range(topic, partition)
            return []
        if not result.records:  # Offsets compaction left without a record: nothing to consume there.
            self._positions[(topic, partition)] = max(position, result.next_offset)
        return list(result.records)

    def _maybe_auto_commit(self) -> None:
        if self._auto_commit_s is not None and time.monotonic() - self._last_commit >= self._auto_commit_s:
            try:
                self.commit()
            except RebalanceError:
                self._rebalance_needed.set()

    def commit(self) -> None:
        """Commits the positions (next offsets to read) of the owned partitions for this generation.

        Raises RebalanceError when the group has moved on; the next `poll` rejoins.
        """
        with self._lock:
            changed = {tp: o for tp, o in self._positions.items() if self._committed.get(tp) != o}
            member_id, generation = self._member_id, self._generation
        self._last_commit = time.monotonic()
        if not changed or not member_id:
            return
        try:
            self._client.commit_offsets(self.group, changed, member_id=member_id, generation=generation)
        except RebalanceError:
            self._rebalance_needed.set()
            raise
        self._committed.update(changed)

    def close(self) -> None:
        """Commits (in auto-commit mode), leaves the group and stops heartbeating."""
        if self._closed.is_set():
            return
        if self._auto_commit_s is not None:
            try:
                self.commit()
            except KqClientError as error:
                logger.info("final commit of %s failed: %s", self.group, error)
        self._closed.set()
        if self._member_id:
            try:
                self._client.leave_group(self.group, self._member_id)
            except KqClientError as error:
                logger.info("leaving %s failed: %s", self.group, error)
        if self._heartbeats is not None:
            self._heartbeats.join(timeout=self._heartbeat_interval_ms / 1000 + 11)

    def __enter__(self) -> GroupConsumer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """Yields records forever (until `close`)."""
        while not self._closed.is_set():
            yield from self.poll(timeout_ms=1_000)
