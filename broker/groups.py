"""The group coordinator's timers on the leader: heartbeats in memory, expiries proposed through Raft.

Heartbeats are not replicated (they would flood the log). The leader remembers when it last heard
from each member; a member silent for its session timeout, or one that has not rejoined within its
rebalance timeout, is removed by a LeaveGroup(expired) command. A new leader gives every member a
full timeout from the moment it took over, so a failover never expires a live consumer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kq.broker.consensus import Consensus
from kq.proto import kq_pb2
from kq.raft import commands
from kq.storage import Store

logger = logging.getLogger(__name__)

COORDINATOR_TICK_S = 0.1
EXPIRY_RETRY_S = 2.0  # An expiry proposal not applied by then is proposed again.
UNKNOWN_MEMBER_GRACE_S = 10.0  # A member named but not (yet) in its group is remembered this long.


class GroupCoordinator:
    """Tracks member liveness on the leader and proposes expiries."""

    def __init__(self, store: Store, consensus: Consensus, clock_ms: Callable[[], int]) -> None:
        self._store = store
        self._consensus = consensus
        self._clock_ms = clock_ms
        self._lock = threading.Lock()
        self._last_seen: dict[tuple[str, str], float] = {}
        self._leading_since: float | None = None
        self._proposed: dict[tuple[str, str], float] = {}
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kq-groups", daemon=True)
        self._thread.start()

    def heard_from(self, group: str, member_id: str) -> None:
        """Records a sign of life (join, heartbeat, commit) from a member."""
        with self._lock:
            self._last_seen[(group, member_id)] = time.monotonic()

    def stop(self) -> None:
        """Stops the timer thread."""
        self._stopping.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stopping.wait(COORDINATOR_TICK_S):
            try:
                self.tick()
            except Exception:
                logger.exception("group coordinator tick failed")

    def tick(self) -> None:
        """Proposes the removal of every member whose session or rebalance timed out."""
        if not self._consensus.is_leader():
            with self._lock:
                self._leading_since = None
            return
        now = time.monotonic()
        with self._lock:
            if self._leading_since is None:
                self._leading_since = now
            leading_since = self._leading_since
        with self._store.read() as reader:
            raw_groups = reader.groups()
        members: set[tuple[str, str]] = set()
        for _, raw in raw_groups:
            state = kq_pb2.GroupState()
            state.ParseFromString(raw)
            members.update((state.name, member.member_id) for member in state.members)
            expired = self._expired(state, now, leading_since)
            if expired:
                logger.info("group %s: expiring members %s", state.name, expired)
                command = commands.leave_group(state.name, expired, self._clock_ms(), expired=True)
                self._consensus.propose(commands.encode(command), lambda result, reason: None)
        self._forget_absent(members, now)

    def _forget_absent(self, members: set[tuple[str, str]], now: float) -> None:
        """Drops what it remembers of members no group holds (after a grace for joins in flight).

        Heartbeats and commits name members before they are checked, so without this a client
        inventing member ids would grow the maps without bound; with it they hold the groups'
        members plus what was named in the last UNKNOWN_MEMBER_GRACE_S.
        """
        with self._lock:
            for key in [k for k, seen in self._last_seen.items() if k not in members]:
                if now - self._last_seen[key] > UNKNOWN_MEMBER_GRACE_S:
                    del self._last_seen[key]
            for key in [k for k in self._proposed if k not in members]:
                del self._proposed[key]

    def _expired(self, state: kq_pb2.GroupState, now: float, leading_since: float) -> list[str]:
        rebalance_age_s = (self._clock_ms() - state.phase_started_ms) / 1000
        rebalance_age_s = min(rebalance_age_s, now - leading_since)
        expired = []
        with self._lock:
            for member in state.members:
                key = (state.name, member.member_id)
                if self._proposed.get(key, 0.0) > now:
                    continue
                silent_s = now - max(self._last_seen.get(key, leading_since), leading_since)
                late = (
                    state.phase == kq_pb2.GROUP_REBALANCING
                    and not member.rejoined
                    and rebalance_age_s > member.rebalance_timeout_ms / 1000
                )
                if silent_s > member.session_timeout_ms / 1000 or late:
                    expired.append(member.member_id)
                    self._proposed[key] = now + EXPIRY_RETRY_S
        return expired
