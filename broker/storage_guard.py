"""The leader's disk bound: writes that would grow the store are refused before the disk fills.

A node's store can grow only into LMDB's map (`--max-disk-bytes`; 64 GiB of address space without
it) and into its data directory's filesystem. Apply cannot refuse an entry for want of room on one
node (its peers would apply it: the replicas would diverge), so a store that does fill stops its
node (raft/faults.py). The edge is where a write can still be refused cleanly: before it is proposed,
the leader measures its own store and refuses Produce and CreateTopic (gRPC and Kafka) with
STORAGE_FULL (RESOURCE_EXHAUSTED; Kafka's KAFKA_STORAGE_ERROR) once less than a headroom would be
left. Everything that frees space or is small and bounded still goes through: DeleteRecords, topic
deletion, retention's trims, compaction, config changes (a lower retention.ms frees space), group
and producer-id writes, and every read.

The leader decides from its own disk; a follower with less room than the leader fills first and
stops (fail-stop, then catches up once given room): give every node the same bound.

Threads: `StorageGuard.check` runs on the gRPC worker threads that handle writes (Kafka's Produce and
CreateTopics reach the same handlers). The store is measured at most every DISK_CHECK_INTERVAL_S, by
whichever thread checks first after that, under the guard's lock, which also guards the bytes
accepted since that measure (they count against it, so a burst between two measures cannot
overshoot). No thread of its own.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from kq.broker.errors import StorageFullError
from kq.proto.limits import (
    DISK_CHECK_INTERVAL_S,
    DISK_HEADROOM_BYTES_MAX,
    DISK_HEADROOM_BYTES_MIN,
    DISK_HEADROOM_SHARE,
    DISK_RESUME_MARGIN_BYTES,
)
from kq.storage import StoreUsage

logger = logging.getLogger(__name__)

_MIB = 1024 * 1024


def headroom_bytes(map_bytes: int) -> int:
    """The room the leader keeps free under a store of `map_bytes` (its bound): DISK_HEADROOM_SHARE of
    it, within DISK_HEADROOM_BYTES_MIN and DISK_HEADROOM_BYTES_MAX."""
    share = int(map_bytes * DISK_HEADROOM_SHARE)
    return min(DISK_HEADROOM_BYTES_MAX, max(DISK_HEADROOM_BYTES_MIN, share))


def map_room_bytes(usage: StoreUsage) -> int:
    """Bytes the store can still add before its map (the bound) is full."""
    return usage.map_bytes - usage.used_bytes


def disk_room_bytes(usage: StoreUsage) -> int:
    """Bytes the store can still add before its disk is full: the filesystem's free bytes, plus the
    pages freed inside the file, which LMDB reuses before it grows the file."""
    return usage.filesystem_free_bytes + max(0, usage.file_bytes - usage.used_bytes)


def storage_problem(
    usage: StoreUsage, accepted_bytes: int, incoming_bytes: int, refusing: bool = False
) -> str | None:
    """Why a write of `incoming_bytes` must be refused when `accepted_bytes` were accepted since
    `usage` was measured; None when it may go. While `refusing` (the last write was refused), the
    room must also hold DISK_RESUME_MARGIN_BYTES: refusals end when a full entry fits again, not as
    soon as a small write does. Pure: the whole decision, for tests."""
    headroom = headroom_bytes(usage.map_bytes)
    needed = headroom + (DISK_RESUME_MARGIN_BYTES if refusing else 0)
    in_map, on_disk = map_room_bytes(usage), disk_room_bytes(usage)
    if min(in_map, on_disk) - accepted_bytes - incoming_bytes >= needed:
        return None
    if in_map <= on_disk:
        held = f"the store holds {_mib(usage.used_bytes)} of its {_mib(usage.map_bytes)} (--max-disk-bytes)"
    else:
        held = f"its disk has {_mib(usage.filesystem_free_bytes)} free"
    return (
        f"{held}; writes are refused while less than {_mib(needed)} would be left: "
        "delete records or topics, lower retention, or give the nodes more room"
    )


def _mib(count: int) -> str:
    return f"{count / _MIB:.1f} MiB"


class StorageGuard:
    """Refuses writes that would grow the store once it is within its headroom of full (see module)."""

    def __init__(
        self,
        measure: Callable[[], StoreUsage],
        node_id: str,
        clock: Callable[[], float] = time.monotonic,
        interval_s: float = DISK_CHECK_INTERVAL_S,
    ) -> None:
        self._measure = measure
        self._node_id = node_id
        self._clock = clock
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._usage: StoreUsage | None = None  # The last measure, and when it was taken.
        self._measured_s = -math.inf
        self._accepted_bytes = 0  # Accepted since that measure: not in the store yet, or not in it.
        self._refusing = False  # Since the last refusal; one log line when refusals start, one when they end.

    def check(self, incoming_bytes: int, counted: bool = True) -> None:
        """Counts a write of `incoming_bytes` against the room left (unless not `counted`: a check that
        so much would still fit); StorageFullError when the store is, or with it would be, within its
        headroom of full."""
        with self._lock:
            now = self._clock()
            if self._usage is None or now - self._measured_s >= self._interval_s:
                self._usage = self._measure()
                self._measured_s = now
                self._accepted_bytes = 0
            problem = storage_problem(self._usage, self._accepted_bytes, incoming_bytes, self._refusing)
            if problem is None:
                self._accepted_bytes += incoming_bytes if counted else 0
                if self._refusing:
                    self._refusing = False
                    room = min(map_room_bytes(self._usage), disk_room_bytes(self._usage))
                    logger.info("accepting writes again: %s of room", _mib(room))
                return
            if not self._refusing:
                self._refusing = True
                logger.warning("refusing writes that grow the store: %s", problem)
        raise StorageFullError(f"node {self._node_id} refuses writes: {problem}")
