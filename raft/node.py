"""The PySyncObj adapter: one replicated method that hands each committed entry to the pure `apply`.

Every PySyncObj option is spelled out here (see ARCHITECTURE.md, "Facts about PySyncObj").
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pysyncobj
import pysyncobj.pickle
import pysyncobj.syncobj
from pysyncobj import SyncObj, SyncObjConf, replicated

from kq.proto.limits import ENTRY_BYTES_MAX
from kq.raft.inbound import already_held, refusal, without_commit_advance
from kq.raft.results import ApplyResult
from kq.raft.snapshot import RaftData, SnapshotSerializer
from kq.raft.state_machine import apply
from kq.storage import Store

logger = logging.getLogger(__name__)

TRANSPORT_BUFFER_BYTES = 4 * 1024 * 1024  # Entries up to ENTRY_BYTES_MAX must fit (64 KiB default broke).
COMMANDS_QUEUE_MAX = 10_000  # Proposals waiting for PySyncObj's tick; beyond it QUEUE_FULL.
PICKLE_PROTOCOL = 5  # PySyncObj hard-codes protocol 2: slower and 1.75x bigger for bytes.
EXIT_APPLY_FAILED = 70  # An environment fault in apply (disk full, I/O): stop rather than diverge.
# PySyncObj drops a peer connection idle for connectionTimeout at its next use. Followers never talk
# to each other while a leader lives, so the first vote request after the leader dies was lost and
# most elections needed a second round (measured: 11 of 12). A small message of a type PySyncObj
# ignores keeps every connection warm.
KEEPALIVE_PERIOD_S = 0.4
KEEPALIVE_MESSAGE = {"type": "kq_keepalive"}
# A connected follower that lags behind the compaction point keeps the entries it still needs, up to
# these bounds (beyond them it is sent a copy of the store instead), so compaction does not turn
# every short lag into a full copy. At most half the compaction trigger's entries are kept, so
# the log left after compacting never re-triggers compaction by itself.
COMPACTION_RETAIN_SHARE = 0.5
COMPACTION_RETAIN_BYTES_MAX = 32 * 1024 * 1024
_SERIALIZER_SWAP = threading.Lock()  # PySyncObj builds its serializer by module-level name.

assert ENTRY_BYTES_MAX < TRANSPORT_BUFFER_BYTES


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """Consensus settings of one node."""

    raft_address: str  # host:port this node binds and its peers dial.
    peer_raft_addresses: tuple[str, ...]
    data_dir: Path
    password: str
    election_timeout_min_s: float = 0.5
    election_timeout_max_s: float = 1.0
    heartbeat_period_s: float = 0.05
    leader_fallback_timeout_s: float = 2.0  # A leader cut off from a majority steps down after this.
    connection_timeout_s: float = 1.5
    connection_retry_s: float = 0.3  # A restarted peer is dialed again this soon (default 5 s).
    compaction_min_entries: int = 5_000  # Bounds the Raft log PySyncObj keeps in RAM.
    compaction_min_time_s: float = 300.0
    # Entry bytes kept in RAM between snapshots: a byte bound next to PySyncObj's entry-count bound.
    # A snapshot copies nothing (raft/snapshot.py), so compacting often is cheap.
    compaction_log_bytes_max: int = 32 * 1024 * 1024


ProposalCallback = Callable[[ApplyResult | None, int], None]


def _unused_hook(*_args: Any) -> None:
    raise AssertionError("PySyncObj called a serializer hook; kq replaces its serializer object")


class RaftNode(SyncObj):  # type: ignore[misc]  # PySyncObj ships no type hints.
    """A Raft member whose state machine is the node's LMDB store."""

    def __init__(self, config: RaftConfig, store: Store, on_applied: Callable[[int], None]) -> None:
        self._store = store
        self._on_applied = on_applied
        self._log_bytes_max = config.compaction_log_bytes_max
        self._log_bytes = 0  # Entry bytes applied since the last forced compaction.
        self._retain_entries_max = int(config.compaction_min_entries * COMPACTION_RETAIN_SHARE)
        raft_dir = config.data_dir / "raft"
        raft_dir.mkdir(parents=True, exist_ok=True)
        self._snapshots = SnapshotSerializer(
            store, raft_dir / "snapshot", TRANSPORT_BUFFER_BYTES // 4, self, on_applied
        )
        setattr(pysyncobj.pickle, "__protocol", PICKLE_PROTOCOL)  # Module-private setting.
        conf = SyncObjConf(
            password=config.password,
            autoTick=True,
            autoTickPeriod=0.01,
            commandsQueueSize=COMMANDS_QUEUE_MAX,
            raftMinTimeout=config.election_timeout_min_s,
            raftMaxTimeout=config.election_timeout_max_s,
            appendEntriesPeriod=config.heartbeat_period_s,
            connectionTimeout=config.connection_timeout_s,
            connectionRetryTime=config.connection_retry_s,
            leaderFallbackTimeout=config.leader_fallback_timeout_s,
            appendEntriesUseBatch=False,  # True adds ~100 ms per commit; kq's batcher groups instead.
            appendEntriesBatchSizeBytes=TRANSPORT_BUFFER_BYTES,
            sendBufferSize=TRANSPORT_BUFFER_BYTES,
            recvBufferSize=TRANSPORT_BUFFER_BYTES,
            bindAddress=config.raft_address,
            logCompactionMinEntries=config.compaction_min_entries,
            logCompactionMinTime=config.compaction_min_time_s,
            logCompactionSplit=False,
            logCompactionBatchSize=TRANSPORT_BUFFER_BYTES // 4,
            fullDumpFile=str(raft_dir / "snapshot"),
            journalFile=str(raft_dir / "journal"),
            # Set so PySyncObj does not pickle this object at compaction; the serializer below is used.
            serializer=_unused_hook,
            deserializer=_unused_hook,
            useFork=False,
            dynamicMembershipChange=False,
            commandsWaitLeader=True,
            pollerType="auto",
        )
        with _SERIALIZER_SWAP:  # PySyncObj gets kq's serializer (raft/snapshot.py) instead of its own.
            original = pysyncobj.syncobj.Serializer
            pysyncobj.syncobj.Serializer = lambda *_args, **_kwargs: self._snapshots
            try:
                super().__init__(config.raft_address, list(config.peer_raft_addresses), conf)
            finally:
                pysyncobj.syncobj.Serializer = original
        assert config.connection_timeout_s > 2 * KEEPALIVE_PERIOD_S
        self._keepalive_due = 0.0
        self.addOnTickCallback(self._send_keepalives)

    def _send_keepalives(self) -> None:
        """Runs on PySyncObj's tick thread: one keepalive to every peer each KEEPALIVE_PERIOD_S."""
        now = time.monotonic()
        if now < self._keepalive_due:
            return
        self._keepalive_due = now + KEEPALIVE_PERIOD_S
        transport = self._SyncObj__transport  # PySyncObj keeps its transport private.
        for node in self._SyncObj__otherNodes:
            transport.send(node, KEEPALIVE_MESSAGE)

    @replicated  # type: ignore[untyped-decorator]
    def _apply_entry(self, data: bytes) -> ApplyResult:
        """Applied on every node in log order; PySyncObj increments raftLastApplied right after."""
        index = self.raftLastApplied + 1
        try:
            result = apply(self._store, index, data)
        except BaseException as error:  # An environment fault (or a newer entry): fail-stop, never diverge.
            debug = logger.isEnabledFor(logging.DEBUG)
            logger.critical(
                "stopping: cannot apply entry %d: %s: %s", index, type(error).__name__, error, exc_info=debug
            )
            logging.shutdown()
            os._exit(EXIT_APPLY_FAILED)
        self._on_applied(index)
        self._log_bytes += len(data)
        if self._log_bytes > self._log_bytes_max:
            self._log_bytes = 0
            self.forceLogCompaction()
        return result

    # The log view the snapshot serializer reads (tick thread only) ---------------------------------

    def start(self) -> int:
        """Index of the first entry in PySyncObj's log."""
        return int(self._SyncObj__raftLog[0][1])

    def window(self, index: int) -> RaftData:
        """PySyncObj's entries at `index + 1` and `index`, and the cluster: a snapshot header's content."""
        entries = self._SyncObj__getEntries(index, 2)
        assert len(entries) == 2, f"no log entries at {index} and {index + 1}"
        return entries[1], entries[0], self._SyncObj__otherNodes | {self._SyncObj__selfNode}

    def compaction_start(self, proposed: int) -> int:
        """`proposed`, or earlier while a connected follower still needs entries (within the bounds).

        A match index of 0 means the leader has not heard where that follower is (just elected, or
        the follower just came back): nothing is kept for it; if it is far behind it gets a copy.
        """
        if not self._isLeader():
            return proposed
        connected = self._SyncObj__connectedNodes
        match_index = self._SyncObj__raftMatchIndex
        matches = [match_index.get(n, 0) for n in self._SyncObj__otherNodes if n in connected]
        target = max(min([proposed, *(m for m in matches if m > 0)]), self.start())
        if target >= proposed or proposed - target > self._retain_entries_max:
            return proposed
        retained = sum(len(entry[0]) for entry in self._SyncObj__getEntries(target, proposed - target))
        return target if retained <= COMPACTION_RETAIN_BYTES_MAX else proposed

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802
        """PySyncObj's message handler behind kq's three safety fixes (raft/inbound.py).

        Runs on the tick thread, which owns every PySyncObj field it reads.
        """
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "apply_command":  # A proposal forwarded by a node that is not the leader.
            answer = refusal(message)
            if answer is not None:
                self._SyncObj__transport.send(node, answer)
            return
        if kind == "append_entries":
            if "serialized" in message:
                message = without_commit_advance(message, self._SyncObj__raftCommitIndex)
            elif message.get("entries"):
                trimmed = already_held(message, self._SyncObj__getEntries, self._SyncObj__raftLog[-1])
                message = message if trimmed is None else trimmed
        SyncObj._SyncObj__onMessageReceived(self, node, message)

    def close(self) -> None:
        """Stops the tick thread and any store copy; the store may be closed afterwards."""
        self.destroy_synchronous()
        self._snapshots.close()

    def propose(self, data: bytes, callback: ProposalCallback) -> None:
        """Queues `data` for replication; `callback(result, reason)` runs on commit or failure."""
        self._apply_entry(data, callback=callback)

    def status(self) -> dict[str, Any]:
        """PySyncObj's status dictionary."""
        return dict(self.getStatus())
