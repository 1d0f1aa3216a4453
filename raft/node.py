"""kq's Raft node: PySyncObj, configured and ticked by kq, with one replicated method that hands each
committed entry to the pure `apply`.

Every PySyncObj option is spelled out here (see ARCHITECTURE.md, "Facts about PySyncObj"); what kq
reaches inside PySyncObj is in `raft/pysyncobj_adapter.py` and nowhere else.

Threads: the constructor binds the Raft port and starts none. `start()` starts `kq-raft-tick`, the
one thread that runs PySyncObj (`doTick` in a loop): elections, the peer transport, the journal,
every `apply` (the only LMDB writer), the snapshot serializer's calls and the proposal callbacks.
`start_on_loop(loop)` runs all of that on a running asyncio loop instead (a node process's serving
loop, raft/loop_poller.py): ticks after socket events, after a proposal made on the loop, and by a
timer (when the leader's next AppendEntries is due, else LOOP_TICK_IDLE_S after the last tick).
`close()` stops ticking (joins the thread), then destroys PySyncObj (its sockets and journal; on the
loop when it ticks there) and any store copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import random
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pysyncobj import SyncObjConf, SyncObjException, replicated
from pysyncobj.node import TCPNode

from kq.proto.limits import (
    BIND_ATTEMPTS_MAX,
    BIND_RETRY_S,
    COMMANDS_QUEUE_MAX,
    COMPACTION_RETAIN_BYTES_MAX,
    COMPACTION_RETAIN_SHARE,
    COPY_SEND_CHUNK_BYTES,
    ENTRY_BYTES_MAX,
    ENTRY_COMMAND_OVERHEAD_BYTES,
    FIRST_ELECTION_LINE_TIMEOUT_S,
    KEEPALIVE_PERIOD_S,
    LEADER_LOST_ELECTION_DELAY_S,
    LEADER_LOST_ELECTION_JITTER_S,
    LEADER_LOST_ELECTION_SLOT_S,
    LOOP_CALL_TIMEOUT_S,
    LOOP_TICK_IDLE_S,
    REMOVED_NOTICE_SCAN_ENTRIES_MAX,
    TICK_FAILED_PAUSE_S,
    TICK_WAIT_S,
    TRANSPORT_BUFFER_BYTES,
)
from kq.raft.faults import EXIT_ENVIRONMENT_FAULT, apply_fault_message, fail_stop
from kq.raft.inbound import already_held, refusal, without_commit_advance
from kq.raft.journal import OS_DISK, Disk, RaftJournal, convert_legacy_journal
from kq.raft.pysyncobj_adapter import PySyncObjAdapter, TransportFactory, read_pysyncobj_journal
from kq.raft.results import AppendResult, ApplyResult
from kq.raft.snapshot import RaftData, SnapshotSerializer, read_header
from kq.raft.state_machine import SOLE_GROUP, GroupScope, apply
from kq.raft.transport import RaftTls, RaftTransport, TransportSettings
from kq.raft.wire import KEEPALIVE_TYPE, NOT_A_VOTER_TYPE
from kq.storage import SnapshotError, Store

logger = logging.getLogger(__name__)

TICK_THREAD_NAME = "kq-raft-tick"
# PySyncObj sends an entry at least this large in pieces, marking the last piece by the size of the
# entry's command instead of its pickle: a follower unpickled a cut entry (EOFError; the 64 KiB default
# broke this way). Every entry stays below it (raft/pysyncobj_adapter.py builds them), so messages
# carry whole entries only.
APPEND_ENTRIES_BATCH_BYTES = TRANSPORT_BUFFER_BYTES
EXIT_APPLY_FAILED = EXIT_ENVIRONMENT_FAULT  # A full store or disk, an I/O error: stop, never diverge.
KEEPALIVE_MESSAGE = {"type": KEEPALIVE_TYPE}
LEGACY_JOURNAL_NAME = "journal"  # PySyncObj's FileJournal, which kq used before raft/journal.py.

# What an acknowledged write survives (DESIGN.md, "Durability"). replicated: a majority holds it in
# the page cache (any process crash, not a power loss of that majority). fsync: a majority has it on
# disk (the journal flushed before the leader counts its entry and before a follower acknowledges).
Durability = Literal["replicated", "fsync"]
DURABILITY_MODES: tuple[Durability, ...] = ("replicated", "fsync")

assert ENTRY_BYTES_MAX + ENTRY_COMMAND_OVERHEAD_BYTES < APPEND_ENTRIES_BATCH_BYTES
assert LEADER_LOST_ELECTION_JITTER_S < LEADER_LOST_ELECTION_SLOT_S  # Jitter never reorders the line.


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """Consensus settings of one node."""

    raft_address: str  # host:port this node binds and its peers dial.
    peer_raft_addresses: tuple[str, ...]
    data_dir: Path
    password: str  # The cluster secret: peers prove it in the transport's handshake (HMAC).
    election_timeout_min_s: float = 0.5
    election_timeout_max_s: float = 1.0
    heartbeat_period_s: float = 0.05
    leader_fallback_timeout_s: float = 2.0  # A leader cut off from a majority steps down after this.
    connection_timeout_s: float = 1.5
    connection_retry_s: float = 0.3  # A restarted peer is dialed again this soon (default 5 s).
    compaction_min_entries: int = 5_000  # Bounds the Raft log PySyncObj keeps in RAM.
    compaction_min_time_s: float = 300.0
    # Entry bytes kept in RAM between snapshots: a byte bound next to PySyncObj's entry-count bound.
    # A snapshot copies no store (raft/snapshot.py), but rewrites the journal's tail: not too often.
    compaction_log_bytes_max: int = 128 * 1024 * 1024
    durability: Durability = "replicated"  # "fsync": acknowledged once on disk on a majority.
    # `--join`: this node is being added to a running cluster. While its data directory is new it
    # never starts an election: it waits for the leader that adds it (broker/membership.py).
    join: bool = False
    # Mutual TLS between nodes (`--tls-cert/--tls-key/--tls-ca`); None: plain TCP (loopback clusters).
    tls: RaftTls | None = None
    # The Raft group this node is a replica of in a cluster of several (raft/placement.py): its tick
    # thread is kq-raft-tick-<group>, and its apply's GroupScope follows (raft/state_machine.py).
    # None: the cluster's one group, ticked by kq-raft-tick.
    group: int | None = None
    # The node's id (`--node-id`), for its log lines ("" in tests that run bare Raft nodes).
    node_id: str = ""

    @property
    def synced(self) -> bool:
        """Whether this node syncs its journal and store (`--durability=fsync`)."""
        return self.durability == "fsync"


ProposalCallback = Callable[[ApplyResult | None, int], None]


@dataclass(frozen=True, slots=True)
class Removal:
    """What a leader said when it told this node it is not a voter: its Raft address, term and commit
    index (DESIGN.md, "A removed node")."""

    leader: str
    term: int
    commit_index: int


class RaftBindError(Exception):
    """The Raft port could not be bound: the node does not start."""


def _unused_hook(*_args: Any) -> None:
    raise AssertionError("PySyncObj called a serializer hook; kq replaces its serializer object")


def _conf(config: RaftConfig, raft_dir: Path) -> SyncObjConf:
    return SyncObjConf(
        password=None,  # kq's transport (raft/transport.py) authenticates peers; no Fernet layer.
        autoTick=False,  # kq's kq-raft-tick thread ticks it (start/close), so the constructor starts none.
        commandsQueueSize=COMMANDS_QUEUE_MAX,
        raftMinTimeout=config.election_timeout_min_s,
        raftMaxTimeout=config.election_timeout_max_s,
        appendEntriesPeriod=config.heartbeat_period_s,
        # PySyncObj requires it at least raftMaxTimeout (else an AssertionError at start).
        connectionTimeout=max(config.connection_timeout_s, config.election_timeout_max_s),
        connectionRetryTime=config.connection_retry_s,
        leaderFallbackTimeout=config.leader_fallback_timeout_s,
        appendEntriesUseBatch=False,  # True adds ~100 ms per commit; kq's batcher groups instead.
        appendEntriesBatchSizeBytes=APPEND_ENTRIES_BATCH_BYTES,
        sendBufferSize=TRANSPORT_BUFFER_BYTES,
        recvBufferSize=TRANSPORT_BUFFER_BYTES,
        bindAddress=config.raft_address,
        bindRetryTime=BIND_RETRY_S,
        maxBindRetries=BIND_ATTEMPTS_MAX,
        logCompactionMinEntries=config.compaction_min_entries,
        logCompactionMinTime=config.compaction_min_time_s,
        logCompactionSplit=False,
        logCompactionBatchSize=TRANSPORT_BUFFER_BYTES // 4,
        fullDumpFile=str(raft_dir / "snapshot"),
        journalFile=None,  # kq's journal (raft/journal.py) replaces PySyncObj's: the adapter installs it.
        # Set so PySyncObj does not pickle this object at compaction; kq's serializer object is used.
        serializer=_unused_hook,
        deserializer=_unused_hook,
        useFork=False,
        dynamicMembershipChange=True,  # AddNode/RemoveNode (broker/membership.py).
        commandsWaitLeader=True,
        pollerType="auto",
    )


def _transport_factory(
    config: RaftConfig, conf: SyncObjConf, may_be_silent: Callable[[Any], bool]
) -> TransportFactory:
    """Builds kq's Raft transport (raft/transport.py) with this node's password, TLS and timings;
    `may_be_silent(node)`: a peer whose connection outlives the connection timeout (TransportSettings)."""
    settings = TransportSettings(
        bind_address=config.raft_address,
        password=config.password,
        tls=config.tls,
        connection_timeout_s=conf.connectionTimeout,
        connection_retry_s=conf.connectionRetryTime,
        bind_retry_s=BIND_RETRY_S,
        bind_attempts_max=BIND_ATTEMPTS_MAX,
        socket_buffer_bytes=TRANSPORT_BUFFER_BYTES,
        guests=config.peer_raft_addresses,
        may_be_silent=may_be_silent,
    )

    def build(poller: Any, add_tick_callback: Any, self_node: Any, other_nodes: Any) -> RaftTransport:
        # The transport's tick work (dialing, connection timeouts) runs at most every TICK_WAIT_S.
        def add_periodic(callback: Callable[[], None]) -> None:
            add_tick_callback(at_most_every(TICK_WAIT_S, callback))

        return RaftTransport(self_node, other_nodes, poller, add_periodic, settings, TCPNode)

    return build


def at_most_every(period_s: float, callback: Callable[[], None]) -> Callable[[], None]:
    """`callback`, skipped when it ran less than `period_s` ago: for tick work that only watches
    clocks (the transport's dialing and connection timeouts). A tick runs after every burst of peer
    messages, two or three per produce request on the leader; this work needs only a periodic one."""
    last_s = -period_s

    def periodic() -> None:
        nonlocal last_s
        now = time.monotonic()
        if now - last_s >= period_s:
            last_s = now
            callback()

    return periodic


def leader_lost_delay_s(voters: frozenset[str], own: str, leader: str, group: int, jitter_s: float) -> float:
    """How long after its connection to `leader` closed the voter at `own` stands for election (pure;
    `leader` "" for a new group's first election: every voter is in line).

    The voters other than the leader stand in line, one LEADER_LOST_ELECTION_SLOT_S apart from
    LEADER_LOST_ELECTION_DELAY_S on, plus `jitter_s` (drawn by the caller, at most
    LEADER_LOST_ELECTION_JITTER_S): the first in line has the others' votes before the next would
    stand, so they do not split the vote. Each follower of a group computes the same line: the voters
    ordered by a checksum of the group and the address (rendezvous hashing), so that the groups a dead
    node led go to the others as if by lot, not all to the same one. A node that is not a voter
    (removed) stands last."""
    line = sorted(voters - {leader}, key=lambda address: (zlib.crc32(f"{group}/{address}".encode()), address))
    place = line.index(own) if own in line else len(line)
    return LEADER_LOST_ELECTION_DELAY_S + place * LEADER_LOST_ELECTION_SLOT_S + jitter_s


def finish_compaction(journal: RaftJournal, snapshot_file: Path) -> None:
    """Drops the journal's entries before the snapshot's log start if a compaction wrote the snapshot
    but stopped (killed, power lost) before cutting the journal.

    PySyncObj, loading a snapshot whose first entries are not the journal's first two, clears the whole
    journal down to those two: it would drop every entry after the snapshot that this node held and
    may have acknowledged. Cutting the journal where the snapshot starts is what the compaction would
    have done next."""
    try:
        with snapshot_file.open("rb") as source:
            _, raft_data = read_header(source)
    except (OSError, SnapshotError):
        return  # No snapshot (or an unreadable one: PySyncObj logs it at its first tick).
    start = raft_data[1]  # PySyncObj's entry at the log start: (command, index, term).
    first_index = journal[0][1] if len(journal) else None
    if first_index is None or not first_index < start[1] <= journal[-1][1]:
        return
    position = start[1] - first_index
    if journal[position][2] == start[2]:
        logger.info("finishing an interrupted compaction: the journal now starts at index %d", start[1])
        journal.deleteEntriesTo(position)


class RaftNode(PySyncObjAdapter):
    """A Raft member whose state machine is the node's LMDB store."""

    def __init__(
        self,
        config: RaftConfig,
        store: Store,
        on_applied: Callable[[int, ApplyResult | None], None],
        disk: Disk = OS_DISK,
        on_fault: Callable[[str], None] = fail_stop,
    ) -> None:
        """Opens the journal and binds the Raft port (RaftBindError if it cannot); starts no thread.

        In fsync mode the store must have been opened with `sync=True`. `disk` is the journal's file
        I/O: a test substitutes one that drops unsynced writes at a simulated power cut. `on_fault`
        gets the one line on a journal or restore that the machine failed (raft/faults.py): it ends
        the process; a test records it instead (the failing call then raises)."""
        self._store = store
        self._on_applied = on_applied
        self._log_bytes_max = config.compaction_log_bytes_max
        self._log_bytes = 0  # Entry bytes applied since the last compaction (`compaction_start`).
        self._retain_entries_max = int(config.compaction_min_entries * COMPACTION_RETAIN_SHARE)
        self._stopping = threading.Event()
        self._ticker: threading.Thread | None = None
        self._group = config.group  # Names the tick thread where a process holds several groups.
        # What this group's apply takes for granted (raft/state_machine.py GroupScope): a group of a
        # cluster of several holds only its partitions, and only group 0 hands out producer ids.
        self._scope = (
            SOLE_GROUP
            if config.group is None
            else GroupScope(allocates_producer_ids=config.group == 0, holds_every_partition=False)
        )
        # When it ticks on a loop instead (start_on_loop): that loop, its thread, the periodic tick.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = 0.0  # When the timer fires (loop clock).
        self._tick_due = 0.0  # When the last tick wants the next one at the latest (loop clock).
        self._tick_requested = False
        raft_dir = config.data_dir / "raft"
        raft_dir.mkdir(parents=True, exist_ok=True)
        self._snapshots = SnapshotSerializer(
            store,
            raft_dir / "snapshot",
            COPY_SEND_CHUNK_BYTES,
            self,
            lambda index: on_applied(index, None),
            durable=config.synced,
            disk=disk,
            on_fault=on_fault,
        )
        convert_legacy_journal(raft_dir, LEGACY_JOURNAL_NAME, read_pysyncobj_journal, disk)
        journal = RaftJournal(raft_dir, config.synced, disk, on_fault)
        finish_compaction(journal, raft_dir / "snapshot")
        try:
            peers = list(config.peer_raft_addresses)
            conf = _conf(config, raft_dir)
            super().__init__(
                config.raft_address,
                peers,
                conf,
                self._snapshots,
                journal,
                _transport_factory(config, conf, self._snapshots.restoring),
            )
        except SyncObjException as error:  # Raised by PySyncObj's constructor only when it cannot bind.
            journal.close()
            raise RaftBindError(
                f"cannot bind the Raft address {config.raft_address} ({BIND_ATTEMPTS_MAX} attempts)"
            ) from error
        assert config.connection_timeout_s > 2 * KEEPALIVE_PERIOD_S
        self._keepalive_due = 0.0
        self.addOnTickCallback(self._send_keepalives)
        # A joining node waits for a leader only while it holds nothing: after a restart it is a member.
        self._joining = config.join and len(journal) <= 1 and not (raft_dir / "snapshot").exists()
        self._join_wait_s = config.election_timeout_max_s
        self._address = config.raft_address
        self._node_id = config.node_id or config.raft_address
        # A removed node that still runs (DESIGN.md, "A removed node"): set on the tick thread when a
        # leader answers its vote request with NOT_A_VOTER, read by any thread (`removed`).
        self._removed: Removal | None = None
        self._election_timeout_min_s = config.election_timeout_min_s
        self._leader_heard_s = float("-inf")  # time.monotonic() of the last AppendEntries (tick thread).
        self._voters = frozenset((config.raft_address, *config.peer_raft_addresses))
        self._on_voters: Callable[[frozenset[str]], None] | None = None
        self._tick_calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        # Every tick, not at most every TICK_WAIT_S: the voters must be published before a member
        # command after the MEMBERSHIP entry applies (Membership reads them then; a removal's answer).
        self.addOnTickCallback(self._tick_housekeeping)
        # A fresh voter stands in line once a majority is connected (`_first_election_line`): until done.
        self._first_line_pending = True
        self.addOnTickCallback(self._first_election_line)

    # Lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the kq-raft-tick thread: from now on the node takes part in elections and commits."""
        assert self._ticker is None and self._loop is None, "started twice"
        if self._group is None:
            self._ticker = threading.Thread(target=self._tick, name=TICK_THREAD_NAME, daemon=True)
        else:
            self._ticker = threading.Thread(
                target=self._tick, name=f"kq-raft-tick-{self._group}", daemon=True
            )
        self._ticker.start()

    def _tick(self) -> None:
        """The kq-raft-tick thread: PySyncObj's ticks until close()."""
        while not self._stopping.is_set():
            try:
                # Entries added while the last tick polled (a new leader's no-op, ...) reach the disk
                # before this tick's commit count includes the leader itself (fsync mode).
                self.sync_journal()
                self.doTick(0.0 if self.is_leader() and self.commits_alone() else TICK_WAIT_S)
            except Exception:  # As PySyncObj's own tick thread: log, pause, carry on (apply fail-stops).
                logger.exception("Raft tick failed")
                self._stopping.wait(TICK_FAILED_PAUSE_S)

    def start_on_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Ticks on `loop` (running, on another thread) instead of a thread of its own: PySyncObj's
        sockets move onto the loop (raft/loop_poller.py), and a tick runs after each burst of socket
        events, after a proposal made on the loop, and by a timer: when the leader's next
        AppendEntries is due (a heartbeat, or a commit notice), else at most LOOP_TICK_IDLE_S after
        the last tick (Raft's other clocks: elections, keepalives, timeouts are coarser). Returns once
        attached."""
        assert self._ticker is None and self._loop is None, "started twice"
        self._loop = loop
        asyncio.run_coroutine_threadsafe(self._attach(), loop).result(LOOP_CALL_TIMEOUT_S)

    async def _attach(self) -> None:
        self._loop_thread = threading.get_ident()
        self.messages_quiet = None  # What the tick thread's messages left (it ticked each burst).
        self.poller.attach(asyncio.get_running_loop(), self._after_socket_event)
        self._loop_tick()

    def _after_socket_event(self) -> None:
        """After the loop handled a socket's event (loop thread): a tick soon, unless the event brought
        only followers' answers that leave a tick nothing to do (`messages_quiet`); Raft's clocks tick
        by the timer as always. Any other event (a message, a connection, a write) asks for one."""
        quiet = self.messages_quiet
        self.messages_quiet = None
        if quiet is not True:
            self._request_tick()

    def _request_tick(self) -> None:
        """A tick soon (loop thread): after the callbacks the loop is running now, at most one."""
        if not self._tick_requested and self._loop is not None:
            self._tick_requested = True
            self._loop.call_soon(self._requested_tick)

    def _requested_tick(self) -> None:
        self._tick_requested = False
        self._loop_tick()

    def _timer_tick(self) -> None:
        """The timer's tick, unless a tick since it was set put the next one later (`_tick_due`): then
        the timer is set for that instead. One record in flight, the leader's commit-notice deadline
        moves 5 ms on with each record, and the timer set for the previous one fired a tick with
        nothing to do (0.42 a record, ~60 µs each here); ticks after socket events, proposals and
        apply see to everything else, and each sets `_tick_due` anew."""
        self._timer = None
        if self._loop is not None and self._tick_due > self._timer_due:
            self._arm_timer(self._tick_due)
            return
        self._loop_tick()

    def _arm_timer(self, due_s: float) -> None:
        assert self._loop is not None
        self._timer_due = due_s
        self._timer = self._loop.call_at(due_s, self._timer_tick)

    def _loop_tick(self) -> None:
        """One tick on the loop, as `_tick` makes them, then the timer for the next one."""
        if self._stopping.is_set() or self._loop is None:
            return
        pause_s = LOOP_TICK_IDLE_S
        try:
            self.sync_journal()
            self.doTick(0.0)  # The poller is attached: PySyncObj's poll returns at once.
            if self.is_leader():
                pause_s = min(pause_s, max(0.0, self.append_entries_due_s()))
                if self.commits_alone():
                    pause_s = 0.0  # What this tick appended commits at the next (a one-node cluster).
            elif (election_s := self.election_due_s()) > 0.0:
                # Stand when due, not up to LOOP_TICK_IDLE_S late (a follower that lost its leader's
                # connection stands within a fraction of a second). An overdue deadline stays on the
                # idle timer: PySyncObj stands only while connected to a peer, so a node alone keeps it.
                pause_s = min(pause_s, election_s)
        except Exception:  # As on the thread: log, pause, carry on (apply fail-stops).
            logger.exception("Raft tick failed")
            pause_s = TICK_FAILED_PAUSE_S
        due_s = self._tick_due = self._loop.time() + pause_s
        if self._timer is not None:
            if self._timer_due <= due_s:
                return  # The timer set before fires first: it sets the next (`_timer_tick`).
            self._timer.cancel()
        self._arm_timer(due_s)

    def close(self) -> None:
        """Stops ticking (joins the tick thread, or leaves the loop), then closes PySyncObj's sockets
        and journal (on the loop, when it ticks there) and stops any store copy; the store may be
        closed afterwards. Safe without start(), and twice."""
        if self._stopping.is_set():
            return  # Closed already.
        self._stopping.set()
        if self._ticker is not None:
            self._ticker.join()  # One tick: at most TICK_WAIT_S plus the work it found.
        loop = self._loop
        if loop is not None and loop.is_running() and threading.get_ident() != self._loop_thread:
            asyncio.run_coroutine_threadsafe(self._destroy_on_loop(), loop).result(LOOP_CALL_TIMEOUT_S)
        else:
            self._destroy()
        self._snapshots.close()

    async def _destroy_on_loop(self) -> None:
        self._destroy()

    def _destroy(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.destroy()  # With autoTick off PySyncObj destroys at once, on this thread.

    def _send_keepalives(self) -> None:
        """A tick callback: one keepalive to every peer each KEEPALIVE_PERIOD_S."""
        now = time.monotonic()
        if now < self._keepalive_due:
            return
        self._keepalive_due = now + KEEPALIVE_PERIOD_S
        self.send_to_peers(KEEPALIVE_MESSAGE)

    def _tick_housekeeping(self) -> None:
        """A tick callback: a joining or removed node's election wait, the calls queued for the tick
        thread (a leadership hand-over), and the voters' publication when a membership entry changed
        them."""
        if self._joining or self._removed is not None:
            self.defer_election(self._join_wait_s)
        while not self._tick_calls.empty():
            self._tick_calls.get_nowait()()
        voters = self.voter_addresses()
        if voters != self._voters:
            logger.info("cluster voters now: %s", ", ".join(sorted(voters)))
            self._voters = voters
            if self._on_voters is not None:
                self._on_voters(voters)

    def _first_election_line(self) -> None:
        """A tick callback: a voter of a new group (term 0: no election has ever been held that its
        journal knows of) stands for election in line (`leader_lost_delay_s`, with every voter in
        it) once it is connected to a majority of the voters, instead of waiting out the election
        timeout (0.5 to 1 s): most of a new cluster's start. The first in line stands within 80 ms and
        has the others' votes before the next would stand (at the default timeout; the line stretches
        with this node's election timeout: FIRST_ELECTION_LINE_TIMEOUT_S). Raft's safety does not
        depend on when a node stands; a group that has held an election (any term above 0) keeps the
        timeout, and a joining or removed node waits for a leader as before. Once per process."""
        if not self._first_line_pending or self._joining or self._removed is not None:
            return
        if self.current_term() != 0:
            self._first_line_pending = False
            return
        voters = self.voter_addresses()
        if self._address not in voters or 2 * (len(self.connected_addresses() & voters) + 1) <= len(voters):
            return  # Not a voter here (yet), or a majority is not connected yet.
        self._first_line_pending = False
        jitter_s = random.uniform(0.0, LEADER_LOST_ELECTION_JITTER_S)
        stretch = self._election_timeout_min_s / FIRST_ELECTION_LINE_TIMEOUT_S
        delay_s = stretch * leader_lost_delay_s(voters, self._address, "", self._group or 0, jitter_s)
        if delay_s < self.election_due_s():
            self.hasten_election(delay_s)

    # Membership ---------------------------------------------------------------------------------

    def removal(self) -> Removal | None:
        """Set once a leader told this node it is not one of the cluster's voters (it was removed and
        still runs): it no longer stands for election. None while it is a member (any thread)."""
        return self._removed

    def voters(self) -> frozenset[str]:
        """The Raft addresses of the voters, this node included, as of the last tick (any thread).

        PySyncObj changes its voter set when a MEMBERSHIP entry reaches the log (not when it commits,
        as Raft's single-server changes require), and back if that entry is overwritten."""
        return self._voters

    def on_voters_changed(self, callback: Callable[[frozenset[str]], None]) -> None:
        """Calls `callback(voters)` on the tick thread whenever the voter set changes."""
        self._on_voters = callback

    def change_membership(self, kind: str, raft_address: str, callback: ProposalCallback) -> None:
        """Proposes adding (`kind` "add") or removing ("remove") a voter; any thread. The address was
        checked (raft/validation.py `address_problem`): it becomes a PySyncObj node on every replica."""
        self.propose_membership(kind, raft_address, callback)

    def call_on_tick(self, function: Callable[[], None]) -> None:
        """Runs `function` on the tick thread, the store's only writer, at its next tick; any thread.
        (broker/repair.py puts a repaired batch back so.)"""
        self._tick_calls.put(function)
        if self._loop is not None:  # Ticking on a loop: a tick soon, not at the idle timer.
            with contextlib.suppress(RuntimeError):  # The loop ended: the node is closing.
                self._loop.call_soon_threadsafe(self._request_tick)

    def hand_over_leadership(self, callback: ProposalCallback, target: str | None = None) -> None:
        """Asks the follower at Raft address `target` (None: the most caught-up connected one) to take
        over now (leader only; refused unless it holds the whole log); any thread."""
        self._tick_calls.put(lambda: self.transfer_leadership(callback, target))
        if self._loop is not None:  # Ticking on a loop: a tick soon, not at the idle timer.
            with contextlib.suppress(RuntimeError):  # The loop ended: the node is closing.
                self._loop.call_soon_threadsafe(self._request_tick)

    # Proposals and apply ----------------------------------------------------------------------

    def propose(self, data: bytes, callback: ProposalCallback) -> None:
        """Queues `data` for replication; `callback(result, reason)` runs on the tick thread on commit
        or failure."""
        on_loop = self._loop_thread == threading.get_ident()
        # What `self._apply_entry(data, callback=...)` does; on the loop it ticks on, without waking
        # PySyncObj's poll: the tick runs right after this turn's callbacks.
        self.propose_call("_apply_entry", data, callback, wake=not on_loop)
        if on_loop:
            self._request_tick()

    @replicated  # type: ignore[untyped-decorator]
    def _apply_entry(self, data: bytes | memoryview) -> ApplyResult:
        """Applied on every node in log order; PySyncObj increments raftLastApplied right after."""
        index = self.raftLastApplied + 1
        try:
            result = apply(self._store, index, data, self._scope)
        except BaseException as error:  # An environment fault (or a newer entry): fail-stop, never diverge.
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("apply of entry %d failed", index, exc_info=True)
            fail_stop(apply_fault_message(error, index, self._store.path, self._store.map_size_bytes()))
        self._on_applied(index, result)
        if not isinstance(result, AppendResult):
            self.notify_commit_now()  # A metadata or group change: readers on followers see it at once.
        self._log_bytes += len(data)
        if self._log_bytes > self._log_bytes_max:
            self._log_bytes = 0
            self.forceLogCompaction()
        return result

    def snapshots_written(self) -> tuple[int, float]:
        """Snapshots this node wrote since it started, and the seconds they took (any thread)."""
        return self._snapshots.written, self._snapshots.written_seconds

    def status(self) -> dict[str, Any]:
        """PySyncObj's status dictionary (any thread).

        getStatus iterates PySyncObj's node sets, which a membership change replaces on the tick
        thread: an iteration that met one is made again (a change is rare; three tries suffice)."""
        for _ in range(2):
            try:
                return dict(self.getStatus())
            except RuntimeError:  # "Set changed size during iteration".
                continue
        return dict(self.getStatus())

    # The log view the snapshot serializer reads (tick thread only) ---------------------------------

    def window(self, index: int) -> RaftData:
        """PySyncObj's entries at `index + 1` and `index`, and the cluster: a snapshot header's content."""
        entries = self.entries(index, 2)
        assert len(entries) == 2, f"no log entries at {index} and {index + 1}"
        return entries[1], entries[0], self.cluster_nodes()

    def compaction_start(self, proposed: int) -> int:
        """`proposed`, or earlier while a connected follower still needs entries (within the bounds).

        A match index of 0 means the leader has not heard where that follower is (just elected, or
        the follower just came back): nothing is kept for it; if it is far behind it gets a copy.

        Called as each compaction starts, whichever trigger fired it: the count of entry bytes since
        the last compaction (`compaction_log_bytes_max`) starts again here. It counted from the last
        compaction it forced, so it fired seconds after one that the entry count had started (three
        back-to-back snapshots a node in a 30-minute soak).
        """
        self._log_bytes = 0
        if not self.is_leader():
            return proposed
        matches = self.connected_match_indexes()
        target = max(min([proposed, *(m for m in matches if m > 0)]), self.first_index())
        if target >= proposed or proposed - target > self._retain_entries_max:
            return proposed
        first = self.first_index()  # The journal's lengths: the commands of entries not held are not read.
        retained = self._journal.command_bytes(target - first, proposed - first)
        return target if retained <= COMPACTION_RETAIN_BYTES_MAX else proposed

    # Peer messages and connections (tick thread) ------------------------------------------------

    def peer_disconnected(self, node: Any) -> None:
        """A follower whose connection to its leader closed stands for election after a short delay
        (`leader_lost_delay_s`: a fifth of a second at most in a three-node group), not after the
        election timeout.

        When a leader's process dies (kill -9, a crash, a stop) its kernel closes its sockets, so every
        follower sees that connection close at once; waiting for the timeout (0.5 to 1 s) was most of a
        failover. Raft's safety does not depend on when a node stands. The cost is liveness: a live
        leader whose connection to a follower drops (a reset on the path) can lose its leadership, unless
        the connection is back and a heartbeat has moved the deadline on (PySyncObj does) before it
        expires. A leader cut off without a close (a partition, a paused process, a dead machine) is
        found by the timeout as before. A node still joining (`--join`) has heard no leader, so it
        never stands early. DESIGN.md, "Failover after a leader's process dies"."""
        leader = self.leader_address()
        if leader is None or str(node.address) != leader or self._removed is not None:
            return  # Another follower's connection, or this node leads, has no leader, or was removed.
        jitter_s = random.uniform(0.0, LEADER_LOST_ELECTION_JITTER_S)
        delay_s = leader_lost_delay_s(self.voters(), self._address, leader, self._group or 0, jitter_s)
        if delay_s >= self.election_due_s():
            return  # The election timeout is nearer (or already past).
        self.hasten_election(delay_s)
        logger.info(
            "the connection to the leader %s closed: standing for election in %.0f ms unless it is back",
            leader,
            delay_s * 1000,
        )

    # A removed node (DESIGN.md, "A removed node") ---------------------------------------------------

    def _ignores_vote_of(self, node: Any) -> bool:
        """Whether a vote request from `node` is dropped before PySyncObj sees it: `node` is not one of
        this node's voters, and this node leads or heard a leader within the shortest election timeout.

        The Raft thesis' rule against disruptive servers (4.2.3), for non-voters only: PySyncObj took a
        removed node's ever higher term from its vote requests, so the leader stepped down at each of
        its elections (seen: a re-election every second). A voter's request is never dropped (a
        leadership transfer's target stands while the others still hear the leader), nor one while no
        leader is heard: a node added by an entry this node has not received yet may need its vote."""
        if str(node.address) in self.voter_addresses():
            return False
        return self.is_leader() or time.monotonic() - self._leader_heard_s < self._election_timeout_min_s

    def _heard_leader(self, term: int) -> None:
        """An AppendEntries arrived (only a leader sends one): a joining node may stand for election
        from now on, and so may a removed node that a leader of its removal's term or a later one
        counts as a voter again (it was added back)."""
        self._leader_heard_s = time.monotonic()
        if self._joining:
            logger.info("a leader contacted this joining node: it takes part in elections from now on")
            self._joining = False
        if self._removed is not None and term >= self._removed.term:
            logger.warning(
                "node %s (Raft %s%s) hears from a leader again: it is a voter once more",
                self._node_id,
                self._address,
                self._group_label(),
            )
            self._removed = None

    def _answer_non_voter(self, node: Any) -> None:
        """The leader tells a non-voter whose vote request it dropped that it is none (NOT_A_VOTER),
        when its own voters are committed: a configuration still uncommitted may yet be replaced
        (the leader's entries overwritten after it lost its leadership), and the node with it."""
        if self.is_leader() and self.voters_committed(REMOVED_NOTICE_SCAN_ENTRIES_MAX):
            notice = {
                "type": NOT_A_VOTER_TYPE,
                "term": self.current_term(),
                "commit_index": self.commit_index(),
            }
            self.send_to(node, notice)

    def _learn_removed(self, node: Any, message: dict[str, Any]) -> None:
        """A leader said this node is not among its committed voters: it stops standing for election
        and says so once, until a leader counts it as a voter again (`_heard_leader`)."""
        if self._removed is not None:
            return
        self._removed = Removal(str(node.address), int(message["term"]), int(message["commit_index"]))
        self.defer_election(self._join_wait_s)
        logger.warning(
            "node %s was removed from the cluster (Raft %s%s): the leader %s (term %d, commit index %d) "
            "does not count it among its voters; it no longer stands for election: stop it",
            self._node_id,
            self._address,
            self._group_label(),
            self._removed.leader,
            self._removed.term,
            self._removed.commit_index,
        )

    def _group_label(self) -> str:
        return "" if self._group is None else f", Raft group {self._group}"

    def peer_message(self, node: Any, message: Any) -> Any | None:
        """kq's three safety fixes (raft/inbound.py) and the removed node's rules (`_ignores_vote_of`,
        `_learn_removed`) before PySyncObj handles a peer's message."""
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "append_entries":
            self._heard_leader(int(message["term"]))
        elif kind == NOT_A_VOTER_TYPE:
            self._learn_removed(node, message)
            return None
        elif kind == "request_vote" and self._ignores_vote_of(node):
            self._answer_non_voter(node)
            return None
        if kind == "apply_command":  # A proposal forwarded by a node that is not the leader.
            answer = refusal(message)
            if answer is not None:
                self.send_to(node, answer)
            return None
        if kind == "append_entries":
            if "serialized" in message:
                # PySyncObj answers no chunk of a store copy, and while chunks keep coming this node's
                # tick may not get to its keepalives: the leader, hearing nothing for its connection
                # timeout, closed the connection and started the copy over, every 2 s (bench.store_copy).
                self._send_keepalives()
                return without_commit_advance(message, self.commit_index())
            if message.get("entries"):
                trimmed = already_held(message, self.entries, self.last_entry())
                return message if trimmed is None else trimmed
        return message
