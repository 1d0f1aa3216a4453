"""The one place kq reaches inside PySyncObj. Pinned: pysyncobj==0.3.17 (pyproject.toml).

kq uses PySyncObj's public API where it has one: `SyncObjConf`, `@replicated`, `doTick`, `destroy`,
`addOnTickCallback`, `forceLogCompaction`, `getStatus`, `isReady`, `raftLastApplied`, and the
constructor's `transportClass` with the `pysyncobj.transport.Transport` interface. It never changes
PySyncObj's modules: no attribute of `pysyncobj.*` is assigned and its serializer class is not swapped.

Peers talk through kq's transport (raft/transport.py, raft/wire.py): protobuf frames, mutual TLS or
an HMAC handshake with the cluster password, and no pickle on the network; PySyncObj's own
TCPTransport (zlib, pickle, Fernet) and its encryptor are not used (`conf.password` is None). An
entry's command is still a pickle in PySyncObj's log (PySyncObj unpickles it at apply), so the
transport carries entries as fields and the receiver rebuilds the command with the builders below
(`entry_command`, `membership_command`, `NO_OP_COMMAND`): no network byte reaches an unpickler.

kq builds each REGULAR entry itself, as `@replicated` would (`entry_command`: PySyncObj's REGULAR type
byte, then the call pickled once, at protocol 5, where bytes are bytes; PySyncObj's own protocol 2
stores them as latin-1 text, two bytes for each byte >= 0x80), so the leader's and every follower's
log hold the same bytes. They are plain bytes, which snapshot headers pickle at protocol 5 as bytes;
entries were once `WireBytes` (a bytes subclass that any pickle protocol stores as one integer,
which mattered while PySyncObj pickled its messages), and headers written then call `wire_bytes`
(raft/local_pickle.py resolves it).

What PySyncObj keeps private, and kq needs, is read or written only by `PySyncObjAdapter` below.
Every private member used, and why (a `_SyncObj__` name is a double-underscore member of `SyncObj`,
as Python mangles it):

- `_SyncObj__raftLog`, `_SyncObj__raftCurrentTerm`, `_SyncObj__votedForNodeId`,
  `_SyncObj__raftCommitIndex`, written once, in the constructor: kq's journal (raft/journal.py)
  replaces the one PySyncObj would open from `journalFile` (kq passes None, so PySyncObj builds an
  in-memory one), and the three values PySyncObj's constructor reads from its journal are read again
  from kq's, as that constructor does. PySyncObj's `FileJournal` never syncs and rewrites itself in
  place; kq's syncs in `--durability=fsync` (DESIGN.md, "Durability"). `_SyncObj__raftCurrentTerm`
  is also read (`current_term`): the term a leader's batcher stamps as the Kafka leader epoch.
- `_SyncObj__sendNextNodeIdx`, overridden: a follower's answer to AppendEntries; a successful one
  (which tells the leader the follower holds the entries) first flushes the journal (`sync_journal`).
- `_SyncObj__sendAppendEntries`, overridden; `_SyncObj__newAppendEntriesTime`,
  `_SyncObj__raftNextIndex`, `_SyncObj__readonlyNodes`, `_SyncObj__getCurrentLogIndex`, read (the
  first two also written): the AppendEntries round is kq's. PySyncObj sends AppendEntries to every
  peer at once after applying entries, only to tell the followers the new commit index, a second
  round trip per entry; kq sends at once to the peers that lack entries (new ones, or a follower
  catching up) and to all when the heartbeat is due, or when a peer was still not sent a commit index
  COMMIT_NOTICE_DELAY_S after the leader found it untold (`commit_notice`: under load the entries
  carry it, and no such round goes); an applied entry other than an append (a topic,
  config, group or security change) is told at once (`notify_commit_now`), so only produce entries
  wait. Each peer gets one message a round, so a follower catching up or receiving a store copy
  does not hold the tick thread. Messages are built as PySyncObj builds them, from
  `_SyncObj__raftCurrentTerm`, `_SyncObj__raftCommitIndex`, `_SyncObj__getPrevLogIndexTerm`,
  `_SyncObj__getEntries`, `_SyncObj__raftLog` (the log's start) and the serializer's chunks
  (`_SyncObj__serializer`, whose `cancelTransmisstion` a disconnected peer gets), and sent on
  `_SyncObj__transport`.
- `FileJournal._destroy`, called: closes PySyncObj's own journal file once `read_pysyncobj_journal`
  has read it (converting a data directory written before kq's journal).
- `_SyncObj__serializer`, written once, in the constructor: kq's `SnapshotSerializer`
  (raft/snapshot.py) replaces the object PySyncObj builds from `fullDumpFile`, which pickles the
  state machine (an LMDB store cannot be pickled). PySyncObj first uses it at its first tick, to
  load the snapshot file; kq ticks PySyncObj itself (`autoTick=False`), so that is after this.
- `_SyncObj__transport`, `_SyncObj__otherNodes`, read: keepalives to every peer, and the answer
  to a refused forwarded proposal (raft/node.py).
- `_SyncObj__selfNode`, read: the cluster's nodes, stored in a snapshot header.
- `_SyncObj__raftLog`, read: the first entry's index (compaction, store copies) and the last entry
  (resent appends); kq's journal object, so the adapter can flush it.
- `_SyncObj__getEntries`, called: entries by index (snapshot headers, retained bytes, resent appends).
- `_SyncObj__connectedNodes`, `_SyncObj__raftMatchIndex`, read: which connected followers still
  need entries before compacting.
- `_SyncObj__lastResponseTime`, read: whether a follower sent a store copy has answered since (it
  restored it: raft/snapshot.py holds compaction and a second copy until then).
- `_SyncObj__raftCommitIndex`, read: a store-copy chunk may not raise it (raft/inbound.py).
- `_SyncObj__onMessageReceived`, overridden: every peer message passes `peer_message` first (kq's
  three inbound fixes).
- `_SyncObj__raftElectionDeadline`, read and written: a node joining a running cluster (`--join`)
  pushes its election deadline on while no leader has contacted it yet, so it does not raise its term
  (and unseat the leader once it is added) before it holds any entry; a follower whose connection to
  its leader closed brings it closer (`hasten_election`, raft/node.py `peer_disconnected`); the node
  ticked on a loop sets its timer by it (`election_due_s`).
- `_SyncObj__onNodeDisconnected`, overridden: after PySyncObj's own, `peer_disconnected` hears of
  every open peer connection that closed (kq's transport calls it, `_onNodeDisconnected`).
- `_addNodeToCluster`, `_removeNodeFromCluster`, overridden: the handlers of PySyncObj's admin
  messages (`syncobj_admin -add/-remove`) refuse, so membership changes only through kq's AddNode and
  RemoveNode, which validate the address and register the node's other addresses first.
- `transferLeadership`, called on the tick thread only (it reads the match indexes).
- `_isLeader`, `_getLeader`, called: the leader flag and address (PySyncObj's "protected" getters).
- `_poller`, replaced once in the constructor (`transportClass`, before anything subscribes) by a
  `SwitchablePoller` (raft/loop_poller.py), then read (`poller`): kq's transport and PySyncObj's
  proposal pipe subscribe their sockets to it, so peer messages are read and handled inside
  `doTick`, on the tick thread, as with PySyncObj's transport; or, once the node ticks on the
  serving loop (`RaftNode.start_on_loop`), by the loop, each burst followed by a tick.
  raft/transport.py itself names no SyncObj member: it implements `Transport` and calls that base
  class's helpers for subclasses (`_onMessageReceived`, `_onNodeConnected`, `_onNodeDisconnected`).
- `_applyCommand`, `_methodToID`, `_getFuncName`, `pysyncobj.syncobj._COMMAND_TYPE.REGULAR`: what
  `@replicated` itself calls to queue a call (`propose_call`), so that kq chooses the entry's bytes.
  `_SyncObj__commandsQueue`, put into: on the loop the node ticks on, `propose_call(wake=False)`
  queues the call as `_applyCommand` does but does not write PySyncObj's wake-up pipe (the loop
  ticks next anyway).
- `_SyncObj__doApplyCommand`, overridden; `_idToMethod`, read: a REGULAR entry whose call this
  process remembers (`EntryCalls`: it built the command) is applied by calling the method with the
  argument, as PySyncObj does after `pickle.loads(command[1:])` (two copies of the entry saved);
  any other entry goes to PySyncObj's own.

Deadlines PySyncObj keeps are on its own clock, `pysyncobj.monotonic` (CLOCK_MONOTONIC_RAW, which
can be a tenth of a second from `time.monotonic` here), so the adapter compares and sets them with it.

All of these are PySyncObj's tick-thread state: they are read only on the tick thread (callbacks
from `doTick`: apply, the serializer, tick callbacks, the message hook), except `_isLeader` and
`_getLeader`, which read one reference each and are hints by nature. Upgrading PySyncObj means
re-reading its `syncobj.py` for each item of this list; `tests/raft/test_node.py` fails if one is
gone, or if any other kq module names a PySyncObj private or assigns to a `pysyncobj` module, and
measures an entry's size on the wire.
"""

from __future__ import annotations

import io
import pickle
import queue
import struct
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, SupportsIndex

import pysyncobj.pickle
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
from pysyncobj.journal import FileJournal
from pysyncobj.monotonic import monotonic as pysyncobj_clock
from pysyncobj.node import TCPNode
from pysyncobj.syncobj import _COMMAND_TYPE

from kq.proto.limits import (
    CATCH_UP_BYTES_PER_ROUND,
    CATCH_UP_ENTRIES_PER_ROUND,
    CATCH_UP_QUEUED_BYTES_MAX,
    CATCH_UP_ROUND_S,
    COMMIT_NOTICE_DELAY_S,
    ENTRY_CALLS_BYTES_MAX,
    ENTRY_CALLS_KEPT,
    RAFT_ENTRIES_PER_ROUND_MAX,
)
from kq.raft.journal import LegacyJournal, RaftJournal
from kq.raft.loop_poller import SwitchablePoller

Entry = tuple[Any, int, int]  # PySyncObj's log entry: (command, index, term).
# Builds the peer transport from PySyncObj's poller, its tick-callback registration, and the nodes.
TransportFactory = Callable[[Any, Callable[[Callable[[], None]], None], Any, Any], Any]


class WireBytes(bytes):
    """An entry's bytes that every pickle protocol carries byte for byte (as one LONG4 integer): what
    entry commands were until snapshot headers pickled them at protocol 5, kept for reading headers
    written before (their pickle calls `wire_bytes`)."""

    __slots__ = ()

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        return (wire_bytes, (int.from_bytes(self, "little"), len(self)))


def wire_bytes(value: int, length: int) -> WireBytes:
    """Unpickles WireBytes (peers resolve this name: keep it)."""
    return WireBytes(value.to_bytes(length, "little"))


# The first byte of an entry's command: PySyncObj's entry types.
REGULAR_TYPE = _COMMAND_TYPE.REGULAR
NO_OP_TYPE = _COMMAND_TYPE.NO_OP
MEMBERSHIP_TYPE = _COMMAND_TYPE.MEMBERSHIP
NO_OP_COMMAND = bytes([NO_OP_TYPE])  # A new leader's first entry, as PySyncObj writes it.
_REGULAR_PREFIX = bytes([REGULAR_TYPE])


_CLOSING = b"\x94\x85\x94\x86\x94."  # MEMOIZE, TUPLE1, MEMOIZE, TUPLE2, MEMOIZE, STOP.
_FRAMED_ARGUMENT_BYTES_MAX = 65_535  # Protocol 5 frames an argument this long with the rest of the call.
# The type byte, PROTO 5, FRAME and its length, BININT1 and the method id, then SHORT_BINBYTES and the
# argument's length (below 256 bytes) or BINBYTES and its length (a framed call's layouts, one pack).
_FRAMED_SHORT = struct.Struct("<B2scQcBcB")
_FRAMED = struct.Struct("<B2scQcBcI")
# Past the frame: the type byte, PROTO 5, BININT1 and the method id, BINBYTES and the length; the
# argument stands outside any frame, then a FRAME of the closing bytes.
_UNFRAMED = struct.Struct("<B2scBcI")
_UNFRAMED_TAIL = b"\x95" + len(_CLOSING).to_bytes(8, "little") + _CLOSING


def _call_pieces(method_id: int, size: int) -> tuple[bytes, bytes]:
    """The entry bytes around an argument of `size` bytes in the REGULAR entry of the call
    `(method_id, (argument,))` pickled at protocol 5, for a method id below 256 and a size below 2**32:
    the type byte and what the pickler writes before the argument, and what it writes after it. Up to
    _FRAMED_ARGUMENT_BYTES_MAX bytes one FRAME holds the whole call; a longer argument is written
    outside any frame (the pickler's FRAME_SIZE_TARGET), and only the closing opcodes are framed."""
    if size > _FRAMED_ARGUMENT_BYTES_MAX:
        return _UNFRAMED.pack(REGULAR_TYPE, b"\x80\x05", b"K", method_id, b"B", size), _UNFRAMED_TAIL
    if size < 256:
        frame = 4 + size + len(_CLOSING)  # BININT1 and its byte, SHORT_BINBYTES and its length byte.
        head = _FRAMED_SHORT.pack(REGULAR_TYPE, b"\x80\x05", b"\x95", frame, b"K", method_id, b"C", size)
        return head, _CLOSING
    frame = 7 + size + len(_CLOSING)  # BININT1 and its byte, BINBYTES and its 4-byte length.
    return _FRAMED.pack(REGULAR_TYPE, b"\x80\x05", b"\x95", frame, b"K", method_id, b"B", size), _CLOSING


# Sizes whose layouts `_call_pieces` tells apart: each side of each boundary, and the ends.
_LAYOUT_SIZES = (0, 1, 255, 256, _FRAMED_ARGUMENT_BYTES_MAX, _FRAMED_ARGUMENT_BYTES_MAX + 1, 200_000)


def _pickler_writes_calls_so() -> bool:
    """Whether this Python's pickler writes calls as `_call_pieces` says, at every layout's sizes and
    method ids (checked once, at import: a pickler that frames differently leaves every call to the
    pickler itself)."""
    for size in _LAYOUT_SIZES:
        argument = bytes(range(256)) * (size // 256) + bytes(size % 256)
        for method_id in (0, 255):
            head, tail = _call_pieces(method_id, size)
            pickled = bytes([REGULAR_TYPE]) + pickle.dumps((method_id, (argument,)), protocol=5)
            if pickled != head + argument + tail:
                return False
    return True


_JOIN_CALLS = _pickler_writes_calls_so()


def _joins(method_id: int, size: int) -> bool:
    """Whether the entry of a call is joined from `_call_pieces` (else the pickler writes it)."""
    return _JOIN_CALLS and 0 <= method_id < 256 and size < 2**32


def _joined(method_id: int, argument: bytes | memoryview) -> tuple[bytes, int]:
    """The entry of a call `_joins` takes, joined from `_call_pieces` (one copy of the argument), and
    where the argument starts in it."""
    head, tail = _call_pieces(method_id, len(argument))
    return b"".join((head, argument, tail)), len(head)


def entry_command(method_id: int, argument: bytes) -> bytes:
    """The log entry of one call `method(argument)`: PySyncObj's layout, pickled once at protocol 5.

    Byte for byte `bytes([REGULAR_TYPE]) + pickle.dumps((method_id, (argument,)), protocol=5)`: the
    argument joined with the bytes the pickler writes around it (`_call_pieces`), one copy, on the
    leader and every follower. The pickler's own buffer copied a large argument in and grew and
    trimmed by copies (246 µs for a 512 KiB argument against 17 joined), and a small call cost a
    Pickler and a BytesIO (1.57 µs for 200 bytes against 0.8 joined); a method id or size outside
    `_call_pieces` (none kq makes) is pickled."""
    if _joins(method_id, len(argument)):
        return _joined(method_id, argument)[0]
    out = io.BytesIO()
    out.write(_REGULAR_PREFIX)
    pickle.Pickler(out, protocol=5).dump((method_id, (argument,)))
    return out.getvalue()


def _command_holding(method_id: int, argument: memoryview) -> tuple[bytes, bytes | memoryview]:
    """`entry_command(method_id, argument)` and the argument as it stands in it: a view of the
    command where the joined layout puts it (`_call_pieces`), else (a call the pickler writes) its
    own bytes."""
    if _joins(method_id, len(argument)):
        command, start = _joined(method_id, argument)
        return command, memoryview(command)[start : start + len(argument)]
    copied = bytes(argument)
    return entry_command(method_id, copied), copied


class EntryCalls:
    """The (method id, argument) of the REGULAR entries this process built lately with `entry_command`
    (a leader's proposals, a follower's entries rebuilt from the wire), found by the identity of
    their command bytes: the log, the transport and apply pass that very object along. The sender's
    canonical check (raft/wire.py `command_to_wire`) and apply (`_SyncObj__doApplyCommand`) take the
    call from here instead of unpickling the command, which copies a megabyte entry twice more each
    time; `entry_command` made the command from this call, so the answer is the same. Bounded by
    ENTRY_CALLS_KEPT entries and ENTRY_CALLS_BYTES_MAX bytes of arguments, oldest out first; a command
    not found takes the longer way. Any thread (a lock)."""

    def __init__(self, kept: int = ENTRY_CALLS_KEPT, bytes_max: int = ENTRY_CALLS_BYTES_MAX) -> None:
        self._kept = kept
        self._bytes_max = bytes_max
        self._lock = threading.Lock()
        # (command, method id, argument): a bytes argument as given, a view one as a view of the command.
        self._calls: deque[tuple[bytes, int, bytes | memoryview]] = deque()
        self._bytes = 0

    def built(self, method_id: int, argument: bytes | memoryview) -> bytes:
        """`entry_command(method_id, argument)`, remembered.

        An argument given as a view (a follower's, still in the frame it received: raft/wire.py
        `_split_parsed`) is copied once, into the command, and remembered as the view of the command
        that holds it; the view given is not kept."""
        if isinstance(argument, memoryview):
            command, argument = _command_holding(method_id, argument)
        else:
            command = entry_command(method_id, argument)
        with self._lock:
            self._calls.append((command, method_id, argument))
            self._bytes += len(argument)
            while len(self._calls) > self._kept or (self._bytes > self._bytes_max and len(self._calls) > 1):
                self._bytes -= len(self._calls.popleft()[2])
        return command

    def recall(self, command: bytes) -> tuple[int, bytes | memoryview] | None:
        """The call `command` was built from, if it is one of the remembered commands (this object)."""
        with self._lock:
            for built, method_id, argument in reversed(self._calls):
                if built is command:
                    return method_id, argument
        return None


ENTRY_CALLS = EntryCalls()


def membership_command(remove: bool, address: str) -> bytes:
    """The MEMBERSHIP entry adding (or removing) the voter at `address`, byte for byte as PySyncObj's
    `addNodeToCluster(address)` (`removeNodeFromCluster`) writes it: its pickle module, protocol 2."""
    node = TCPNode(address)
    change = ["rem" if remove else "add", node.id, node]
    return bytes([MEMBERSHIP_TYPE]) + bytes(pysyncobj.pickle.dumps(change))


class PySyncObjAdapter(SyncObj):  # type: ignore[misc]  # PySyncObj ships no type hints.
    """A SyncObj that kq ticks itself, with its snapshot serializer and typed views of its internals.

    The constructor binds the Raft port and starts no thread (`autoTick` must be False): the owner
    calls `doTick` from its own thread, and `destroy()` closes the transport and the journal at once.
    The journal is kq's (`conf.journalFile` must be None); the owner calls `sync_journal` before each
    tick, and the adapter calls it at the end of each tick and before a follower acknowledges entries.
    """

    _SyncObj__raftLog: Any  # Typed here: the adapter both reads PySyncObj's log slot and writes it.
    _SyncObj__raftElectionDeadline: float
    _SyncObj__newAppendEntriesTime: float

    def __init__(
        self,
        self_address: str,
        peer_addresses: list[str],
        conf: SyncObjConf,
        serializer: Any,
        journal: RaftJournal,
        transport: TransportFactory,
    ) -> None:
        """`transport(poller, add_tick_callback, self_node, other_nodes)` builds the peer transport
        (raft/transport.py) on PySyncObj's poller; `conf.password` must be None (no Fernet layer)."""
        assert not conf.autoTick, "kq ticks PySyncObj from its own thread"
        assert conf.journalFile is None, "kq's journal replaces PySyncObj's"
        assert conf.password is None, "kq's transport authenticates peers; PySyncObj's encryptor stays off"

        def build_transport(sync_obj: SyncObj, self_node: Any, other_nodes: Any) -> Any:
            # Before anything subscribes (the transport's socket, then PySyncObj's proposal pipe).
            sync_obj._poller = SwitchablePoller(conf.pollerType)
            return transport(sync_obj._poller, sync_obj.addOnTickCallback, self_node, other_nodes)

        super().__init__(self_address, peer_addresses, conf, transportClass=build_transport)
        self._SyncObj__serializer = serializer  # Before the first tick: see the module docstring.
        self._commit_notice_now = False  # Tick thread only: `notify_commit_now`.
        self._heartbeat_period_s: float = conf.appendEntriesPeriod
        self._heartbeat_due = 0.0  # Tick thread only: when every peer next hears from the leader.
        # Tick thread only: the peer messages handled since the last socket event (raft/node.py reads
        # and resets it): None, none; True, only answers that leave a tick nothing to do
        # (`_acknowledges_committed`); False, another, or a connection that closed.
        self.messages_quiet: bool | None = None
        self._voters_key: tuple[int, int, int] | None = None  # `voter_addresses`, kept.
        self._voters_found: frozenset[str] = frozenset()
        # Tick thread only: the commit index each peer was last sent (`_send_to`), and the commit
        # notice: when every peer hears from the leader because one still lacks commit index
        # `_notice_for` (None: each connected peer was told the commit index). See `commit_notice`.
        self._commit_told: dict[Any, int] = {}
        self._notice_for = 0
        self._notice_due: float | None = None
        self._append_batch_bytes: int = conf.appendEntriesBatchSizeBytes
        self._journal = journal
        self._install_journal(journal)
        self.addOnTickCallback(self.sync_journal)  # Group commit: what this tick added, once.

    def current_term(self) -> int:
        """This replica's current Raft term (any thread: one attribute read)."""
        return int(self._SyncObj__raftCurrentTerm)

    def _install_journal(self, journal: RaftJournal) -> None:
        """Puts `journal` in PySyncObj's log slot and restores what PySyncObj's constructor reads from
        its journal (syncobj.py, after `createJournal`): the term (at least the last entry's), the
        vote and the commit index. An empty journal gets the no-op entry PySyncObj starts a log with."""
        memory_log: Any = self._SyncObj__raftLog  # PySyncObj's in-memory journal, (NO_OP, 1, 0) in it.
        if len(journal) == 0:
            journal.add(*memory_log[0])
        self._SyncObj__raftLog = journal
        self._SyncObj__raftCurrentTerm = max(journal.getCurrentTerm(), int(journal[-1][2]))
        self._SyncObj__votedForNodeId = journal.getVotedForNodeId()
        self._SyncObj__raftCommitIndex = journal.getRaftCommitIndex()

    def append_entries_due_s(self) -> float:
        """Seconds until the leader's next AppendEntries round (a heartbeat, a commit notice
        (`commit_notice`), or a catch-up round); negative when overdue. Tick thread only."""
        due: float = self._SyncObj__newAppendEntriesTime
        now: float = pysyncobj_clock()
        return due - now

    def sync_journal(self) -> None:
        """Flushes the journal (fsync mode: one fdatasync for every entry added since the last one;
        otherwise nothing). Tick thread only."""
        self._journal.flush()

    def _SyncObj__sendNextNodeIdx(  # noqa: N802 - PySyncObj's name.
        self,
        node: Any,
        reset: bool = False,
        nextNodeIdx: int | None = None,  # noqa: N803 - PySyncObj's name.
        success: bool = False,
    ) -> None:
        if success:  # The leader counts this node for the entries it now holds: they must be on disk.
            self.sync_journal()
        SyncObj._SyncObj__sendNextNodeIdx(self, node, reset, nextNodeIdx, success)

    def _SyncObj__sendAppendEntries(self) -> None:  # noqa: N802 - PySyncObj's name.
        """kq's AppendEntries round (PySyncObj calls it after adding entries, after applying, and when
        its `_SyncObj__newAppendEntriesTime` passes, which this sets).

        Every connected peer hears from the leader when the heartbeat is due (or `notify_commit_now`
        asked); between heartbeats, only the peers that lack entries do: the new ones, or a follower
        catching up. After applying, PySyncObj would tell every peer the new commit index at once, a
        second round trip per entry; peers that hold the log learn it with the next entry or heartbeat,
        or a round to every peer COMMIT_NOTICE_DELAY_S after one was found not sent it (`commit_notice`,
        `_next_notice`), even while another follower catches up (a full round on each call then cost
        every acknowledgement half a millisecond).

        Each peer gets one message a round (or the store-copy chunks the send rate releases: raft/
        snapshot.py), the peers that hold the log up to its end first. PySyncObj's own round sends a
        lagging follower messages until a heartbeat period (50 ms) has passed, and while the serializer
        holds back a copy's next chunk, empty copy messages for as long: each call held the tick thread
        that long, and a copy in progress held every acknowledgement half a second. A peer still
        behind gets its next message within CATCH_UP_ROUND_S (and sooner when entries come): catch-up
        paced by rounds and the transport's queue, not by one round's loop."""
        now = pysyncobj_clock()
        notice_due = self._notice_due
        everyone = (
            now >= self._heartbeat_due
            or self._commit_notice_now
            or (notice_due is not None and now >= notice_due)
        )
        if everyone:
            self._commit_notice_now = False
            self._heartbeat_due = now + self._heartbeat_period_s
        connected = self._SyncObj__connectedNodes
        next_index: dict[Any, int] = self._SyncObj__raftNextIndex
        last: int = self._SyncObj__getCurrentLogIndex()
        peers = self._SyncObj__otherNodes | self._SyncObj__readonlyNodes
        lagging = False
        for node in sorted(peers, key=lambda peer: -next_index.get(peer, 0)):
            if node not in connected:
                self._SyncObj__serializer.cancelTransmisstion(node)
            elif everyone or next_index.get(node, 0) <= last:
                lagging = self._send_to(node) or lagging
        self._notice_due = self._next_notice(now, peers, connected, everyone)
        wake = self._heartbeat_due if self._notice_due is None else min(self._heartbeat_due, self._notice_due)
        if lagging:
            wake = min(wake, pysyncobj_clock() + CATCH_UP_ROUND_S)
        self._SyncObj__newAppendEntriesTime = wake

    def _next_notice(self, now: float, peers: Any, connected: Any, everyone: bool) -> float | None:
        """When the leader next tells every peer the commit index (`commit_notice`), after this round's
        sends (`everyone`: to every connected peer): None when each connected peer was sent the
        current one. A notice stays while a peer still lacks the commit it is for; after a round to
        everyone a new one is always in the future (a peer the round could not reach waits for it)."""
        told = self._commit_told
        if len(told) > len(peers):  # A removed peer's row.
            for node in [node for node in told if node not in peers]:
                del told[node]
        commit_index: int = self._SyncObj__raftCommitIndex
        if all(told.get(node, 0) >= commit_index for node in peers if node in connected):
            return None
        if (
            not everyone
            and self._notice_due is not None
            and any(told.get(node, 0) < self._notice_for for node in peers if node in connected)
        ):
            return self._notice_due  # The commit the notice is for is still untold: it stays.
        self._notice_for = commit_index
        return commit_notice(now)

    def _send_to(self, node: Any) -> bool:
        """This round's message(s) to the connected `node` (`_SyncObj__sendAppendEntries`); True while
        it lacks entries or a copy after them. A node whose transport queue already holds
        CATCH_UP_QUEUED_BYTES_MAX gets nothing this round: what is queued reaches it first. kq's entries
        are under the batch (ENTRY_BYTES_MAX), so PySyncObj's split of one larger entry is never needed."""
        transport = self._SyncObj__transport
        if transport.queued_bytes(node) >= CATCH_UP_QUEUED_BYTES_MAX:
            return True
        term: int = self._SyncObj__raftCurrentTerm
        commit_index: int = self._SyncObj__raftCommitIndex
        next_index: int = self._SyncObj__raftNextIndex[node]
        last: int = self._SyncObj__getCurrentLogIndex()
        if next_index <= self._SyncObj__raftLog[0][1]:  # Behind the log's start: a copy of the store.
            serializer = self._SyncObj__serializer
            while True:
                data = serializer.getTransmissionData(node)
                chunk = {"type": "append_entries", "term": term, "commit_index": commit_index}
                chunk["serialized"] = data
                if not transport.send(node, chunk) or data is None:
                    return True
                if data[2]:  # The last chunk: entries after the copy's log start follow next round.
                    self._SyncObj__raftNextIndex[node] = self._SyncObj__raftLog[1][1] + 1
                    return True
        prev_index, prev_term = self._SyncObj__getPrevLogIndexTerm(next_index)
        entries: list[Entry] = []
        if next_index <= last:
            if next_index <= self._SyncObj__raftCommitIndex:  # Catching up: see CATCH_UP_BYTES_PER_ROUND.
                count_max, batch = CATCH_UP_ENTRIES_PER_ROUND, CATCH_UP_BYTES_PER_ROUND
            else:
                count_max, batch = RAFT_ENTRIES_PER_ROUND_MAX, self._append_batch_bytes
            # PySyncObj's `__getEntries(next_index, count, batch)`, reading back only what it hands out.
            position = next_index - self.first_index()
            entries = self._journal.entries_within(position, min(last - next_index + 1, count_max), batch)
            self._SyncObj__raftNextIndex[node] = entries[-1][1] + 1
        message = {
            "type": "append_entries",
            "term": term,
            "commit_index": commit_index,
            "entries": entries,
            "prevLogIdx": prev_index,
            "prevLogTerm": prev_term,
        }
        if transport.send(node, message):
            self._commit_told[node] = commit_index
        return bool(self._SyncObj__raftNextIndex[node] <= last)

    def notify_commit_now(self) -> None:
        """Makes the next AppendEntries (this tick's, after apply) go at once, not with the next entry
        or heartbeat: an entry readers of a follower should see without delay. Tick thread only."""
        self._commit_notice_now = True

    def propose_membership(self, kind: str, address: str, callback: Callable[[Any, int], None]) -> None:
        """Queues a MEMBERSHIP entry adding (`kind` "add") or removing ("remove") the node at the Raft
        `address` (checked by the caller: raft/validation.py `address_problem`); `callback(result,
        reason)` runs on the tick thread once it committed, or failed (REQUEST_DENIED: a change is
        still pending, or the leader's first entry of its term has not committed)."""
        if kind == "add":
            self.addNodeToCluster(address, callback)
        else:
            self.removeNodeFromCluster(address, callback)

    def _addNodeToCluster(self, args: Any, callback: Callable[[Any, int], None]) -> None:  # noqa: N802
        callback(None, FAIL_REASON.REQUEST_DENIED)  # PySyncObj's admin message: see the module docstring.

    def _removeNodeFromCluster(self, args: Any, callback: Callable[[Any, int], None]) -> None:  # noqa: N802
        callback(None, FAIL_REASON.REQUEST_DENIED)

    def propose_call(
        self, method: str, argument: bytes, callback: Callable[[Any, int], None], wake: bool = True
    ) -> None:
        """Queues the call `method(argument)` of a `@replicated` method, as `@replicated` does, with the
        entry built by `entry_command`; `callback(result, reason)` runs on the tick thread. `wake`
        False: the caller ticks PySyncObj next itself (the loop it ticks on), so the pipe that wakes
        PySyncObj's poll is not written (a write, then a turn of the loop for a tick with nothing new)."""
        method_id = self._methodToID[self._getFuncName(method)]
        command = ENTRY_CALLS.built(method_id, argument)
        if wake:
            self._applyCommand(command, callback)
            return
        try:  # `_applyCommand` without the pipe's notify.
            self._SyncObj__commandsQueue.put_nowait((command, callback))
        except queue.Full:
            callback(None, FAIL_REASON.QUEUE_FULL)

    # Reads of PySyncObj's tick-thread state (call on the tick thread only) ------------------------

    def first_index(self) -> int:
        """Index of the first entry in PySyncObj's log."""
        return int(self._SyncObj__raftLog[0][1])

    def last_entry(self) -> Entry:
        """The last entry in PySyncObj's log."""
        entry: Entry = self._SyncObj__raftLog[-1]
        return entry

    def entries(self, index: int, count: int) -> list[Entry]:
        """Up to `count` entries from `index` on (none if `index` was compacted away)."""
        return list(self._SyncObj__getEntries(index, count))

    def cluster_nodes(self) -> set[Any]:
        """Every node of the cluster, this one included (PySyncObj's node objects)."""
        return set(self._SyncObj__otherNodes | {self._SyncObj__selfNode})

    def connected_addresses(self) -> frozenset[str]:
        """The Raft addresses of the nodes this one has an open connection to (tick thread)."""
        return frozenset(str(node.address) for node in self._SyncObj__connectedNodes)

    def voter_addresses(self) -> frozenset[str]:
        """The Raft addresses of the cluster's voters as this node knows them, its own included.

        Kept by the log's last entry (index and term) and the voter count: PySyncObj changes its voters
        only as a MEMBERSHIP entry enters the log or is rolled back, or with a store copy that replaces
        the log, and two logs ending in the same entry hold the same entries (Raft's log matching).
        Every tick reads it (a membership change is published from there): building it cost ~5 µs."""
        nodes: set[Any] = self._SyncObj__otherNodes
        last: Entry = self._SyncObj__raftLog[-1]
        key = (last[1], last[2], len(nodes))
        if key != self._voters_key:
            self._voters_key = key
            self._voters_found = frozenset(str(node.address) for node in self.cluster_nodes())
        return self._voters_found

    def voters_committed(self, entries_max: int) -> bool:
        """Whether the voters this node knows are a committed configuration: no MEMBERSHIP entry follows
        its commit index (PySyncObj changes its voters when such an entry reaches the log, before it
        commits). False as well when more than `entries_max` entries follow it (not read)."""
        commit = self.commit_index()
        last = int(self.last_entry()[1])
        if last <= commit:
            return True
        if last - commit > entries_max:
            return False
        return all(
            entry[0][:1] != bytes([MEMBERSHIP_TYPE]) for entry in self.entries(commit + 1, last - commit)
        )

    def defer_election(self, seconds: float) -> None:
        """Puts this node's next election at least `seconds` away (a joining node's wait)."""
        deadline = pysyncobj_clock() + seconds
        self._SyncObj__raftElectionDeadline = max(self._SyncObj__raftElectionDeadline, deadline)

    def hasten_election(self, seconds: float) -> None:
        """Puts this node's next election at most `seconds` away (a follower that lost its leader's
        connection). PySyncObj moves the deadline on as usual: a leader's AppendEntries or a vote this
        node grants puts it a full election timeout away again, and standing for election sets the next."""
        deadline = pysyncobj_clock() + seconds
        self._SyncObj__raftElectionDeadline = min(self._SyncObj__raftElectionDeadline, deadline)

    def election_due_s(self) -> float:
        """Seconds until this node stands for election unless a leader is heard (negative: overdue; PySyncObj
        stands only while connected to a peer). Meaningful on a follower or candidate."""
        deadline: float = self._SyncObj__raftElectionDeadline
        now: float = pysyncobj_clock()
        return deadline - now

    def transfer_leadership(self, callback: Callable[[Any, int], None], target: str | None = None) -> None:
        """Asks the follower at Raft address `target` (None: the most caught-up connected one) to start
        an election now (leader only). PySyncObj refuses (REQUEST_DENIED) a target that is not a
        member or does not hold the leader's whole log, so only a caught-up voter takes over."""
        self.transferLeadership(target, callback)

    def last_response(self, node: Any) -> float:
        """When this leader last heard an answer to its appends from `node` (PySyncObj's clock; 0: never)."""
        return float(self._SyncObj__lastResponseTime.get(node, 0.0))

    def match_index(self, node: Any) -> int:
        """The last entry the leader knows `node` holds (0: not heard); meaningful on the leader."""
        return int(self._SyncObj__raftMatchIndex.get(node, 0))

    def last_index(self) -> int:
        """Index of the last entry in PySyncObj's log."""
        return int(self._SyncObj__raftLog[-1][1])

    def connected_match_indexes(self) -> list[int]:
        """The match index of each connected follower (0: not heard yet); meaningful on the leader."""
        connected = self._SyncObj__connectedNodes
        match_index = self._SyncObj__raftMatchIndex
        return [int(match_index.get(node, 0)) for node in self._SyncObj__otherNodes if node in connected]

    def commit_index(self) -> int:
        """This node's commit index."""
        return int(self._SyncObj__raftCommitIndex)

    def commits_alone(self) -> bool:
        """Whether this node is its cluster's only voter and its log holds entries past its commit
        index. PySyncObj counts the match indexes before it takes a tick's new commands, so a lone
        leader commits what a tick appended at its next tick, and no follower's answer brings that
        tick on: a leader ticks again at once (one produce entry in flight, a one-node cluster
        waited a timer's pause for each). Tick thread only."""
        return not self._SyncObj__otherNodes and int(self._SyncObj__raftLog[-1][1]) > int(
            self._SyncObj__raftCommitIndex
        )

    def send_to_peers(self, message: dict[str, Any]) -> None:
        """Sends `message` to every other node (PySyncObj ignores types it does not know)."""
        transport = self._SyncObj__transport
        for node in self._SyncObj__otherNodes:
            transport.send(node, message)

    def send_to(self, node: Any, message: dict[str, Any]) -> None:
        """Sends `message` to one node."""
        self._SyncObj__transport.send(node, message)

    @property
    def poller(self) -> SwitchablePoller:
        """The poller PySyncObj and the transport subscribe their sockets to (raft/loop_poller.py)."""
        poller: SwitchablePoller = self._poller
        return poller

    # Hints, safe from any thread ------------------------------------------------------------------

    def is_leader(self) -> bool:
        """Whether this node is in the leader state (a hint: only a committed entry is proof)."""
        return bool(self._isLeader())

    def leader_address(self) -> str | None:
        """The Raft address of the last leader this node heard of, if any."""
        leader = self._getLeader()
        return None if leader is None else str(leader.address)

    # The message and connection hooks ----------------------------------------------------------------

    def peer_message(self, node: Any, message: Any) -> Any | None:
        """Runs on the tick thread before PySyncObj handles a peer's message: the message to handle
        (rewritten or not), or None to drop it. Subclasses override it."""
        return message

    def peer_disconnected(self, node: Any) -> None:
        """Runs on the tick thread after an open connection to the peer `node` closed and PySyncObj
        counted it out of the connected nodes (a connection replaced by the peer's new one does not
        count). Subclasses override it."""

    def _SyncObj__onNodeDisconnected(self, node: Any) -> None:  # noqa: N802 - PySyncObj's name.
        SyncObj._SyncObj__onNodeDisconnected(self, node)
        self.messages_quiet = False  # The event that closed it asks for a tick, whatever it brought.
        self.peer_disconnected(node)

    def _SyncObj__doApplyCommand(self, command: bytes) -> Any:  # noqa: N802 - PySyncObj's name.
        """Applies one committed entry: a REGULAR entry this process built calls its method with the
        remembered argument (`ENTRY_CALLS`), as PySyncObj's own code would after unpickling it;
        every other entry (replayed from the journal, membership, no-op) goes PySyncObj's way."""
        known = ENTRY_CALLS.recall(command)
        if known is None:
            return SyncObj._SyncObj__doApplyCommand(self, command)
        method_id, argument = known
        return self._idToMethod[method_id](argument, _doApply=True)

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802 - PySyncObj's name.
        handled = self.peer_message(node, message)
        if handled is not None:
            SyncObj._SyncObj__onMessageReceived(self, node, handled)
        quiet = handled is not None and self._acknowledges_committed(handled)
        self.messages_quiet = quiet and self.messages_quiet is not False

    def _acknowledges_committed(self, message: Any) -> bool:
        """Whether `message`, handled, leaves a tick nothing to do: on the leader, a follower's success
        for entries already committed, holding the whole log (nothing to send it, no commit to move).
        One record in flight, the second follower's answer is one: its tick cost ~25 µs and a turn of
        the loop (`messages_quiet`). Tick thread only."""
        if (
            not isinstance(message, dict)
            or message.get("type") != "next_node_idx"
            or not message["success"]
            or message["reset"]
        ):
            return False
        acknowledged = int(message["next_node_idx"]) - 1
        return (
            bool(self._isLeader())
            and acknowledged <= self._SyncObj__raftCommitIndex
            and acknowledged >= self._SyncObj__getCurrentLogIndex()
        )


def commit_notice(now: float) -> float:
    """When the leader tells every peer a commit index one of them was not sent yet, with
    AppendEntries that may carry nothing else: COMMIT_NOTICE_DELAY_S from `now` (unless the
    heartbeat comes first), or never, if by then every peer was sent it, or a later one, with an entry.

    Followers apply an entry once they learn it committed. Telling them at once cost every entry a
    second round of messages, sent while the leader answers the producer (measured: the answer left
    the leader ~1 ms later, bench/README.md "Profiles"). Under load the next entry carries the
    commit index sooner anyway: the notice waits for the commit it is for, and goes only if that one
    is still untold when it is due (a notice every 5 ms whatever the entries carried cost one record
    in flight a quarter more messages on every node). An idle cluster's followers learn a commit
    within COMMIT_NOTICE_DELAY_S of the round that told them the one before it (twice that at most),
    plus a tick.
    """
    return now + COMMIT_NOTICE_DELAY_S


def read_pysyncobj_journal(path: Path) -> LegacyJournal:
    """The entries, term, vote and commit index of a journal PySyncObj's `FileJournal` wrote."""
    old = FileJournal(str(path))
    try:
        entries = [old[position] for position in range(len(old))]
        meta = {
            "term": old.getCurrentTerm(),
            "voted_for": old.getVotedForNodeId(),
            "commit_index": old.getRaftCommitIndex(),
        }
    finally:
        old._destroy()
    return entries, meta
