"""The group coordinator's timers on the leader: heartbeats in memory, expiries proposed through Raft.

Heartbeats are not replicated (they would flood the log). The leader remembers when it last heard
from each member; a member silent for its session timeout, or one that has not rejoined within its
rebalance timeout (a consumer group's member (KIP-848): one that has not revoked its partitions within
it), is removed by a LeaveGroup(expired) command.

What it remembers is bounded by the replicated groups: it tracks exactly the members the store's
groups hold (at most GROUPS_MAX x GROUP_MEMBERS_MAX, kq.proto.limits), refreshed at every tick. A
member id no group holds is not remembered at all (a client inventing member ids grows nothing);
a member the coordinator sees in its group for the first time (a join just committed, or this node
just became leader) is given a full session timeout from that moment, so neither a join in flight
nor a failover expires a live consumer. A node that does not lead remembers nothing.

Threads: the constructor starts none; `start()` starts `kq-groups`, which calls `tick()` every
COORDINATOR_TICK_S until `stop()`. `heard_from` runs on the gRPC threads. `_lock` guards `_members`,
`_last_seen`, `_proposed` and `_leading_since`; the store is read in its own read transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kq.broker.background import BackgroundThread
from kq.broker.consensus import Consensus
from kq.proto import kq_pb2
from kq.proto.limits import COORDINATOR_TICK_S, EXPIRY_RETRY_S
from kq.raft import commands
from kq.storage import Store

logger = logging.getLogger(__name__)

THREAD_NAME = "kq-groups"

MemberKey = tuple[str, str]  # (group, member id)


class GroupCoordinator(BackgroundThread):
    """Tracks member liveness on the leader and proposes expiries.

    `clock_ms` is the wall clock stamped into commands (and compared with a group's
    `phase_started_ms`); `clock_s` the monotonic clock of the timers. Tests pass fakes of both.
    """

    thread_name = THREAD_NAME  # Stopped within one tick; the store may close after.

    def __init__(
        self,
        store: Store,
        consensus: Consensus,
        clock_ms: Callable[[], int],
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._consensus = consensus
        self._clock_ms = clock_ms
        self._clock_s = clock_s
        self._lock = threading.Lock()
        self._members: frozenset[MemberKey] = frozenset()  # The groups' members at the last tick.
        self._last_seen: dict[MemberKey, float] = {}  # Keys: exactly _members.
        self._proposed: dict[MemberKey, float] = {}  # Keys within _members: no expiry proposal before.
        self._leading_since: float | None = None
        super().__init__()

    def heard_from(self, group: str, member_id: str) -> None:
        """Records a sign of life (join, heartbeat, commit) from a member its group holds."""
        key = (group, member_id)
        with self._lock:
            if key in self._members:
                self._last_seen[key] = self._clock_s()

    def tracked(self) -> int:
        """How many members the coordinator remembers (the size of each of its maps at most)."""
        with self._lock:
            return len(self._last_seen)

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
                self._members = frozenset()
                self._last_seen.clear()
                self._proposed.clear()
            return
        now = self._clock_s()
        with self._store.read() as reader:
            raw_groups = reader.groups()
        states = []
        for _, raw in raw_groups:
            state = kq_pb2.GroupState()
            state.ParseFromString(raw)
            states.append(state)
        with self._lock:
            if self._leading_since is None:
                self._leading_since = now
            leading_since = self._leading_since
            self._track(frozenset((s.name, m.member_id) for s in states for m in s.members), now)
        for state in states:
            expired = self._expired(state, now, leading_since)
            if expired:
                logger.info("group %s: expiring members %s", state.name, expired)
                command = commands.leave_group(state.name, expired, self._clock_ms(), expired=True)
                self._consensus.propose(commands.encode(command), lambda result, reason: None)

    def _track(self, members: frozenset[MemberKey], now: float) -> None:
        """Follows the groups' membership (holding _lock): newcomers are heard from now, leavers forgotten."""
        for key in members - self._members:
            self._last_seen[key] = now
        for key in self._members - members:
            self._last_seen.pop(key, None)
            self._proposed.pop(key, None)
        self._members = members

    def _expired(self, state: kq_pb2.GroupState, now: float, leading_since: float) -> list[str]:
        rebalance_age_s = (self._clock_ms() - state.phase_started_ms) / 1000
        rebalance_age_s = min(rebalance_age_s, now - leading_since)
        expired = []
        with self._lock:
            for member in state.members:
                key = (state.name, member.member_id)
                if self._proposed.get(key, 0.0) > now:
                    continue
                silent_s = now - self._last_seen.get(key, now)
                late = (
                    state.phase == kq_pb2.GROUP_REBALANCING
                    and not member.rejoined
                    and rebalance_age_s > member.rebalance_timeout_ms / 1000
                )
                if member.revoking:  # A consumer-group member (KIP-848) that does not revoke in time.
                    revoking_s = (self._clock_ms() - member.revoking_since_ms) / 1000
                    late = min(revoking_s, now - leading_since) > member.rebalance_timeout_ms / 1000
                if silent_s > member.session_timeout_ms / 1000 or late:
                    expired.append(member.member_id)
                    self._proposed[key] = now + EXPIRY_RETRY_S
        return expired
