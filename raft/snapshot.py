"""Log compaction without copying the store: kq's replacement for PySyncObj's snapshot serializer.

The LMDB store is durable on its own and records the Raft index it has applied, so compacting the
Raft log needs no copy of the data: a snapshot is only a small header file (PySyncObj's entries at
the new log start, and the store's applied index). Its cost does not grow with the store. The data
is copied only when a follower is so far behind that the entries it needs were compacted away (or
it was wiped): then a thread copies the store from one read transaction into a scratch file while
Raft keeps ticking, and the copy is streamed to the follower in chunks; the follower restores it if
it is ahead of its own store (restore only moves forward) and skips the entries the copy covers.

File layout, a local snapshot and a transmitted one alike (integers big-endian):

    magic          8 bytes  b"KQSNAP" and the format version in two ASCII digits: b"KQSNAP02" (format 2;
                            format 1, the same layout always with data, is still read)
    header_length  u32      then a pickle (protocol 5) of {"raft": <PySyncObj's tuple>, "applied_index": u64},
                            written by this node only (a copy's header travels as fields: raft/wire.py)
    data_length    u64      then a copy of the store (`data.mdb`) of that many bytes; 0 in a local snapshot
    data_crc32c    u32      over the copy
    end            5 bytes  b"KQEND"

A snapshot file of a newer format (b"KQSNAP" and a version above SNAPSHOT_FORMAT), or one that is not
a kq snapshot, is refused by name (SnapshotFormatError, one line; `check_snapshot_file` at the node's
start, raft/data_dir.py) and never overwritten. A store copy from a leader whose store has a newer
layout stops this node (`on_fault`) instead of being restored.

The object given to PySyncObj (`SnapshotSerializer`) implements the interface of its private
`Serializer`: checkSerializing, serialize, deserialize, getTransmissionData, setTransmissionData,
cancelTransmisstion. All of these run on PySyncObj's tick thread (`kq-raft-tick`). The constructor
starts no thread: the tick thread starts `kq-snapshot-copy` when a follower first needs a copy (one
at a time; followers that need one at once share it); it owns the copy's scratch directory and the
read transaction, and sets the copy's `path` or `failed` under `_lock`. `close()` stops it between
batches and joins it; after `close()` no copy starts. While a transmission runs, compaction
waits (checkSerializing answers SERIALIZING), so the log entries the copy's header names stay in the
leader's log until the follower has loaded it.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import crc32c as crc32c_module
import lmdb

from kq.proto.limits import (
    COPY_CHUNK_BYTES,
    COPY_RESTORE_WAIT_S,
    COPY_RETRY_S,
    COPY_SEND_BYTES_PER_S,
    HEADER_BYTES_MAX,
    TRANSMISSION_TIMEOUT_S,
)
from kq.raft import local_pickle
from kq.raft.faults import receive_fault_message, restore_fault_message
from kq.raft.journal import OS_DISK, Disk, magic_version
from kq.raft.local_pickle import LocalPickleError
from kq.raft.state_machine import ENVIRONMENT_ERRORS
from kq.storage import FormatError, SnapshotError, Store

logger = logging.getLogger(__name__)

SNAPSHOT_FORMAT = 2  # The snapshot format this kq writes; it reads 1 (same layout, always with data) too.
MAGIC_PREFIX = b"KQSNAP"
MAGIC = MAGIC_PREFIX + b"%02d" % SNAPSHOT_FORMAT
END = b"KQEND"
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")

# PySyncObj's SERIALIZER_STATE values (pysyncobj.config), restated to keep the import surface small.
NOT_SERIALIZING, SERIALIZING, SUCCESS, FAILED = 0, 1, 2, 3


RaftData = tuple[Any, Any, Any]  # PySyncObj's (entry at log start + 1, entry at log start, cluster).


class RaftLogView(Protocol):
    """What the serializer reads of PySyncObj's log (on the tick thread, which owns it)."""

    def first_index(self) -> int:
        """Index of the first entry in the log."""

    def window(self, index: int) -> RaftData:
        """PySyncObj's entries at `index + 1` and `index`, and the cluster's nodes."""

    def compaction_start(self, proposed: int) -> int:
        """Where the log should start after compacting up to `proposed` (earlier for a slow follower)."""

    def last_response(self, node: Any) -> float:
        """When the leader last heard an answer to its appends from `node`, on Raft's own clock (0:
        never); only compared with itself."""

    def match_index(self, node: Any) -> int:
        """The last entry the leader knows `node` holds (0: not heard)."""

    def last_index(self) -> int:
        """Index of the last entry in the log."""


@dataclass(slots=True)
class _Copy:
    """A copy of the store being prepared (or ready) for followers, with the header it goes out with."""

    header: bytes
    applied_index: int
    path: Path | None = None  # The finished data file; None while the thread copies.
    failed: bool = False
    started_s: float = field(default_factory=time.monotonic)
    discarded: threading.Event = field(default_factory=threading.Event)  # Set when no follower needs it.


@dataclass(slots=True)
class _Transmission:
    """One follower's progress through a copy."""

    copy: _Copy
    source: BinaryIO | None = None
    sent_bytes: int = 0
    read_bytes: int = 0  # Of the section file.
    checksum: int = 0  # CRC32C of the data read so far (the section file's bytes after its size).
    trailer_sent: bool = False


class SnapshotSerializer:
    """What PySyncObj calls for log compaction and for sending and installing snapshots."""

    def __init__(
        self,
        store: Store,
        file_name: Path,
        chunk_bytes: int,
        log: RaftLogView,
        on_restored: Callable[[int], None],
        durable: bool = False,
        disk: Disk = OS_DISK,
        on_fault: Callable[[str], None] | None = None,
        send_bytes_per_s: int = COPY_SEND_BYTES_PER_S,
    ) -> None:
        """`durable` (`--durability=fsync`): before compaction drops journal entries the store is
        synced, and a restored copy is synced before the follower acknowledges it. `on_fault` gets
        one line when the machine fails receiving or restoring a copy (full disk or map: the node
        stops, raft/faults.py); without it the error is raised to PySyncObj, which logs it.
        `send_bytes_per_s`: how fast copies go out to followers (all of them together)."""
        self._store = store
        self._on_fault = on_fault
        self._durable = durable
        self._disk = disk  # The snapshot file's writes go where the journal's go (tests cut power there).
        self._file_name = file_name
        self.written = 0  # Snapshots this process wrote, and the seconds they took (node metrics).
        self.written_seconds = 0.0
        self._scratch_dir = file_name.parent
        self._chunk_bytes = chunk_bytes
        self._log = log
        self._copy_failed_s = -COPY_RETRY_S
        self._on_restored = on_restored
        self._result: tuple[int, int] | None = None  # (state, index) to report once.
        self._lock = threading.Lock()  # Guards _copy's fields, which the copy thread sets.
        self._copy: _Copy | None = None
        self._transmissions: dict[Any, _Transmission] = {}  # By follower: at most the cluster's size.
        # Followers sent a whole copy: when, when the leader had last heard from them then, and the
        # leader's last log index then. Until a follower answers again (it sends nothing while it
        # receives and restores a copy: its next answer comes from the restored store) it gets no
        # other copy; until it also holds the entries the leader had when the copy ended, compaction
        # waits (unless it disconnects, or COPY_RESTORE_WAIT_S passes). Else the log start could pass
        # the copy's before the follower has the entries after it (a match index alone cannot tell,
        # since a wiped follower's is still the one from before it was wiped), and it would need a
        # second copy at once: the entries written while a 300 MB copy went out are more than
        # compaction keeps for a lagging follower. A follower that answered and still asks for a copy
        # (a late answer to an append sent before the copy moved it back) gets one. At most the
        # cluster's size.
        self._sent: dict[Any, tuple[float, float, int]] = {}
        self._send_rate = send_bytes_per_s
        self._send_allowance = float(2 * chunk_bytes)  # Bytes sendable now (a token bucket).
        self._send_checked_s = time.monotonic()
        self._incoming: BinaryIO | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # Compaction -------------------------------------------------------------------------------

    def checkSerializing(self) -> tuple[int, int | None]:  # noqa: N802 - PySyncObj's name.
        """SUCCESS/FAILED once after `serialize`; SERIALIZING while a follower receives a copy."""
        self._drop_stale_transmissions()
        self._drop_restored()
        if self._result is not None:
            state, index = self._result
            self._result = None
            return state, index
        if self._transmissions or self._sent:
            return SERIALIZING, None
        return NOT_SERIALIZING, None

    def serialize(self, data: tuple[Any, ...], index: int) -> None:
        """Writes the header-only snapshot whose log starts at `index`: a few hundred bytes, no data."""
        started_s = time.monotonic()
        applied_index = self._store.applied_index()
        logger.info("snapshot started at applied index %d", applied_index)
        try:
            index = self._log.compaction_start(index)
            header = header_bytes(self._log.window(index), applied_index)
            if self._durable:  # The journal loses the entries up to `index`: the store must hold them.
                self._store.sync()
            self._write_durably(header + _U64.pack(0) + _U32.pack(0) + END)
        except OSError as error:
            logger.warning("snapshot at applied index %d failed: %s", applied_index, error)
            self._result = (FAILED, index)
            return
        self._result = (SUCCESS, index)
        seconds = time.monotonic() - started_s
        self.written += 1  # Read by metrics scrapes: an int and a float, each replaced whole.
        self.written_seconds += seconds
        logger.info("snapshot at applied index %d written in %.3f s", applied_index, seconds)

    def deserialize(self) -> tuple[Any, ...]:
        """PySyncObj's header tuple from the snapshot file; restores its data first if ahead of the store."""
        with self._file_name.open("rb") as source:
            applied_index, raft_data = read_header(source)
            has_data = _has_data(source)
            if has_data and applied_index > self._store.applied_index():
                try:
                    self._restore(source, applied_index)
                except Exception as error:
                    # A copy of a newer layout (StoreFormatError) stops the node too: it cannot follow.
                    stops = _environment_fault(error) or isinstance(error, FormatError)
                    if self._on_fault is not None and stops:
                        path, map_bytes = self._store.path, self._store.map_size_bytes()
                        self._on_fault(restore_fault_message(error, applied_index, path, map_bytes))
                    raise
                self._on_restored(applied_index)
        if has_data:  # Keep only the header: the data now lives in the store.
            self._rewrite_header_only(raft_data)
        return (None, *raft_data)

    def _rewrite_header_only(self, raft_data: RaftData) -> None:
        header = header_bytes(raft_data, self._store.applied_index())
        self._write_durably(header + _U64.pack(0) + _U32.pack(0) + END)

    def _write_durably(self, content: bytes) -> None:
        """Replaces the snapshot file with `content` by a rename. In fsync mode it is synced first and
        its directory after, so after a power loss the snapshot names the log start the journal was
        compacted to. Not in replicated mode, where a node that lost power is wiped anyway (DESIGN.md,
        "Durability"): that sync waited for the page cache's dirty data on the tick thread, a third of
        a second after a follower had been sent a 300 MB copy."""
        self._disk.replace(self._file_name, content, sync=self._durable)

    def _restore(self, source: BinaryIO, applied_index: int) -> None:
        scratch = Path(tempfile.mkdtemp(prefix="restore-", dir=self._scratch_dir))
        try:
            extract_data(source, scratch / "data.mdb")
            copy = Store.open(scratch, map_size_bytes=self._store.map_size_bytes())
            try:
                if copy.applied_index() != applied_index:
                    raise SnapshotError("snapshot header and data disagree on the applied index")
                self._store.replace_with(copy)
            finally:
                copy.close()
            if self._durable:  # Before the journal restarts at the copy's index and the leader hears so.
                self._store.sync()
            logger.info("store restored from snapshot at applied index %d", applied_index)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    # Sending to a follower --------------------------------------------------------------------

    def getTransmissionData(self, node: Any) -> tuple[bytes, bool, bool] | None:  # noqa: N802
        """The next chunk of a store copy for `node`: (data, is_first, is_last), or None until ready."""
        transmission = self._transmissions.get(node)
        if transmission is None:
            if self._stopping.is_set() or time.monotonic() - self._copy_failed_s < COPY_RETRY_S:
                return None
            self._drop_restored()
            sent = self._sent.get(node)
            if sent is not None:
                if self._log.last_response(node) == sent[1]:
                    return None  # It is restoring the copy it got: its answer moves it past the log start.
                del self._sent[node]  # It answered since, and needs a copy all the same.
            copy = self._current_copy()
            if copy is None:
                return None  # A dropped copy's thread is still finishing: one copy thread at a time.
            transmission = _Transmission(copy)
            self._transmissions[node] = transmission
            logger.info(
                "sending a copy of the store at applied index %d to %s", transmission.copy.applied_index, node
            )
        with self._lock:
            path, failed = transmission.copy.path, transmission.copy.failed
        if failed:
            self._copy_failed_s = time.monotonic()
            self._finish(node, transmission)
            return None
        if path is None:
            return None  # The copy thread is still at work; the next round asks again.
        if transmission.source is None:
            transmission.source = path.open("rb")
        is_first = transmission.sent_bytes == 0
        if not is_first and not self._may_send(self._chunk_bytes):
            return None  # Over the rate: a later round sends on.
        chunk = transmission.copy.header if is_first else self._next_section_chunk(transmission)
        transmission.sent_bytes += len(chunk)
        if not chunk:
            logger.info("sent a copy of the store (%d bytes) to %s", transmission.sent_bytes, node)
            self._finish(node, transmission)
            self._sent[node] = (time.monotonic(), self._log.last_response(node), self._log.last_index())
            return b"", False, True
        return chunk, is_first, False

    def _next_section_chunk(self, transmission: _Transmission) -> bytes:
        """The section's next bytes: the file's (its size, then the data, checksummed as it goes out),
        then the checksum and END; b"" once all went out."""
        assert transmission.source is not None
        chunk = transmission.source.read(self._chunk_bytes)
        if chunk:
            skip = max(0, _U64.size - transmission.read_bytes)  # The size field is not checksummed.
            transmission.read_bytes += len(chunk)
            with memoryview(chunk) as view:
                transmission.checksum = crc32c_module.crc32c(view[skip:], transmission.checksum)
            return chunk
        if transmission.trailer_sent:
            return b""
        transmission.trailer_sent = True
        return _U32.pack(transmission.checksum) + END

    def restoring(self, node: Any) -> bool:
        """Whether `node` was sent a whole copy and has not caught up past it yet (see `_sent`): it may
        stay silent while it restores. Tick thread (the transport's connection checks)."""
        return node in self._sent

    def _may_send(self, size: int) -> bool:
        """Takes `size` bytes from the send allowance, which refills at the send rate (up to two chunks);
        False (nothing taken) when it holds less."""
        now = time.monotonic()
        burst = 2.0 * self._chunk_bytes
        refill = (now - self._send_checked_s) * self._send_rate
        self._send_allowance = min(burst, self._send_allowance + refill)
        self._send_checked_s = now
        if self._send_allowance < size:
            return False
        self._send_allowance -= size
        return True

    def cancelTransmisstion(self, node: Any) -> None:  # noqa: N802 - PySyncObj's name (sic).
        """Drops `node`'s transmission (it disconnected); a copy may go to it again at once."""
        self._sent.pop(node, None)
        transmission = self._transmissions.get(node)
        if transmission is not None:
            self._finish(node, transmission)

    def _finish(self, node: Any, transmission: _Transmission) -> None:
        if transmission.source is not None:
            transmission.source.close()
        self._transmissions.pop(node, None)
        if not any(t.copy is transmission.copy for t in self._transmissions.values()):
            self._discard(transmission.copy)

    def _drop_restored(self) -> None:
        """Forgets the followers that restored the copy they were sent and caught up to the log's end
        as it was then, or took too long to."""
        now = time.monotonic()
        for node, (sent_s, heard, last_index) in list(self._sent.items()):
            restored = self._log.last_response(node) != heard and self._log.match_index(node) >= last_index
            if restored or now - sent_s > COPY_RESTORE_WAIT_S:
                del self._sent[node]

    def _drop_stale_transmissions(self) -> None:
        now = time.monotonic()
        for node, transmission in list(self._transmissions.items()):
            if now - transmission.copy.started_s > TRANSMISSION_TIMEOUT_S:
                logger.warning(
                    "giving up sending a copy of the store to %s after %.0f s", node, TRANSMISSION_TIMEOUT_S
                )
                self._finish(node, transmission)

    def _current_copy(self) -> _Copy | None:
        """The copy being prepared or sent, shared by followers that need one at once; else a new one,
        or None while the thread of a dropped copy still runs (so at most one copies the store)."""
        if self._copy is not None and any(t.copy is self._copy for t in self._transmissions.values()):
            return self._copy
        if self._thread is not None and self._thread.is_alive():
            return None
        transaction = self._store.begin_snapshot()
        applied_index = self._store.applied_index_in(transaction)
        copy = _Copy(header_bytes(self._log.window(self._log.first_index()), applied_index), applied_index)
        self._copy = copy
        self._thread = threading.Thread(
            target=self._write_copy, args=(copy, transaction), name="kq-snapshot-copy", daemon=True
        )
        self._thread.start()
        return copy

    def _write_copy(self, copy: _Copy, transaction: Any) -> None:
        """Runs in kq-snapshot-copy: the store as seen by `transaction`, as one data section; then
        waits until no follower needs the copy (`_discard`) and removes it, so the tick thread never
        waits for a large file's unlink (deleting a 300 MB copy there held acknowledgements 40 ms)."""
        scratch = Path(tempfile.mkdtemp(prefix="snapshot-", dir=self._scratch_dir))
        try:
            section = scratch / "section"
            try:
                self._dump_section(section, transaction)
            finally:
                transaction.abort()
            with self._lock:
                if not copy.failed:  # Else its followers went away (or stopped) while it was written.
                    copy.path = section
            copy.discarded.wait()
        except Exception as error:  # Disk full, or stopping: this copy is dropped; the follower asks again.
            if not self._stopping.is_set():
                logger.warning("copying the store at applied index %d failed: %s", copy.applied_index, error)
            with self._lock:
                copy.failed = True
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _dump_section(self, section: Path, transaction: Any) -> None:
        """Writes the section file without its trailer: the copy's size, then the copy. The checksum
        and END follow when it is sent (`_next_section_chunk`), which reads every byte anyway.

        LMDB writes the copy (`Store.copy_to_fd`, C code without the GIL, on `kq-snapshot-dump`) into
        a pipe that this thread moves into the file with splice(2), in the kernel: no Python thread
        touches the copy's bytes, so the leader's threads, the tick thread first, are not held up (a
        copy made row by row in Python held the GIL for seconds; a Python loop reading the pipe,
        checksumming and writing held acknowledgements several milliseconds while 300 MB went by).
        Stopping closes the pipe, which ends the dump."""
        read_fd, write_fd = os.pipe()
        dump_errors: list[BaseException] = []

        def dump() -> None:
            try:
                self._store.copy_to_fd(write_fd, transaction)
            except BaseException as error:  # Reported below (a broken pipe when the copy stopped).
                dump_errors.append(error)
            finally:
                os.close(write_fd)

        dumper = threading.Thread(target=dump, name="kq-snapshot-dump", daemon=True)
        try:
            dumper.start()
        except BaseException:
            os.close(write_fd)
            os.close(read_fd)
            raise
        try:
            with section.open("wb", buffering=0) as output:
                output.write(_U64.pack(0))  # The data's size, written once it is known.
                size = 0
                while moved := os.splice(read_fd, output.fileno(), COPY_CHUNK_BYTES):
                    if self._stopping.is_set():
                        raise SnapshotError("the node is stopping")
                    size += moved
                output.seek(0)
                output.write(_U64.pack(size))
        finally:
            os.close(read_fd)  # An early end: the dump's next write fails, and it ends.
            dumper.join()
        if dump_errors:
            raise dump_errors[0]

    def _discard(self, copy: _Copy) -> None:
        """No follower needs `copy` any more: its thread removes it and ends."""
        with self._lock:
            copy.failed = True
        copy.discarded.set()
        if self._copy is copy:
            self._copy = None

    # Receiving from the leader ----------------------------------------------------------------

    def setTransmissionData(self, data: tuple[bytes, bool, bool] | None) -> bool:  # noqa: N802
        """Appends a received chunk; True once the whole copy is in `file_name` (then PySyncObj loads it)."""
        if data is None:
            return False
        try:
            return self._receive(*data)
        except OSError as error:  # The disk is full (or failing): a copy that cannot be kept is no use.
            if self._on_fault is not None:
                self._on_fault(receive_fault_message(error, self._file_name.with_suffix(".incoming")))
            raise

    def _receive(self, chunk: bytes, is_first: bool, is_last: bool) -> bool:
        incoming = self._file_name.with_suffix(".incoming")
        if is_first:
            if self._incoming is not None:
                self._incoming.close()
            self._incoming = incoming.open("wb")
        if self._incoming is None:
            return False
        self._incoming.write(chunk)
        if not is_last:
            return False
        if self._durable:  # Renamed over the snapshot: never a torn one after a power loss.
            self._incoming.flush()
            os.fsync(self._incoming.fileno())
        self._incoming.close()
        self._incoming = None
        self._disk.rename(incoming, self._file_name, self._durable)
        return True

    # Shutdown ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Stops a running copy (between chunks) and waits for its thread; then the store may close."""
        self._stopping.set()
        if self._copy is not None:
            self._copy.discarded.set()
        if self._thread is not None:
            self._thread.join()
        for node, transmission in list(self._transmissions.items()):
            self._finish(node, transmission)
        if self._incoming is not None:
            self._incoming.close()


class SnapshotFormatError(SnapshotError, FormatError):
    """The snapshot file is of a newer format than SNAPSHOT_FORMAT, or not a kq snapshot."""


def snapshot_format_problem(head: bytes) -> str | None:
    """What is wrong with a snapshot whose file starts with `head` (its magic), to follow its name in
    one line; None when this kq reads it."""
    found = magic_version(head, MAGIC_PREFIX)
    if found is None:
        return (
            f"is not a kq snapshot (it starts with {head!r}, not {MAGIC!r}); this kq leaves it as it is: "
            "restore it, or wipe this node's data directory to catch up from its peers"
        )
    if found > SNAPSHOT_FORMAT:
        supported = f"1-{SNAPSHOT_FORMAT}"
        return f"has format {found} ({head.decode()}); this kq reads snapshot formats {supported}: upgrade kq"
    return None


def check_snapshot_file(path: Path) -> None:
    """Raises SnapshotFormatError unless the snapshot file at `path` is absent or of a format this kq
    reads; reads its magic only."""
    try:
        with path.open("rb") as source:
            head = source.read(len(MAGIC))
    except FileNotFoundError:
        return
    problem = snapshot_format_problem(head)
    if problem is not None:
        raise SnapshotFormatError(f"Raft snapshot {path} {problem}")


def _environment_fault(error: BaseException) -> bool:
    """Whether restoring failed because of the machine (as apply decides: raft/state_machine.py), not
    because the copy is bad (SnapshotError)."""
    return isinstance(error, ENVIRONMENT_ERRORS) or type(error) is lmdb.Error


def header_bytes(raft_data: RaftData, applied_index: int) -> bytes:
    """The snapshot file's magic and header (a local snapshot and the first chunk of a copy alike)."""
    raw = pickle.dumps({"raft": tuple(raft_data), "applied_index": applied_index}, protocol=5)
    return MAGIC + _U32.pack(len(raw)) + raw


def _has_data(source: BinaryIO) -> bool:
    """Whether the data section after the header is non-empty (the position is left unchanged)."""
    position = source.tell()
    raw = source.read(_U64.size)
    source.seek(position)
    return len(raw) == _U64.size and _U64.unpack(raw)[0] > 0


def read_header(source: BinaryIO) -> tuple[int, RaftData]:
    """Reads magic and header; returns (applied index, PySyncObj's tuple)."""
    problem = snapshot_format_problem(source.read(len(MAGIC)))
    if problem is not None:
        raise SnapshotFormatError(f"the Raft snapshot {problem}")
    raw_length = source.read(_U32.size)
    if len(raw_length) != _U32.size:
        raise SnapshotError("snapshot header is cut short")
    (length,) = _U32.unpack(raw_length)
    if length > HEADER_BYTES_MAX:
        raise SnapshotError(f"snapshot header of {length} bytes exceeds {HEADER_BYTES_MAX}")
    raw_header = source.read(length)
    if len(raw_header) != length:
        raise SnapshotError("snapshot header is cut short")
    # This node wrote the header (a peer's header arrives as fields, raft/wire.py, and is written here
    # by `header_bytes`); the unpickler resolves only the globals a header holds.
    try:
        header = local_pickle.loads(raw_header)
        raft_data: RaftData = tuple(header["raft"])
        return int(header["applied_index"]), raft_data
    except (LocalPickleError, KeyError, TypeError, ValueError) as error:
        raise SnapshotError(f"snapshot header is not kq's: {error}") from error


def extract_data(source: BinaryIO, destination: Path) -> None:
    """Copies the data section to `destination`, verifying its length, checksum and end marker."""
    raw_length = source.read(_U64.size)
    if len(raw_length) != _U64.size:
        raise SnapshotError("snapshot has no data section (cut short while it was written)")
    (remaining,) = _U64.unpack(raw_length)
    checksum = 0
    with destination.open("wb") as output:
        while remaining:
            chunk = source.read(min(remaining, COPY_CHUNK_BYTES))
            if not chunk:
                raise SnapshotError("snapshot data is cut short")
            checksum = crc32c_module.crc32c(chunk, checksum)
            output.write(chunk)
            remaining -= len(chunk)
    trailer = source.read(_U32.size + len(END))
    if len(trailer) != _U32.size + len(END) or trailer[_U32.size :] != END:
        raise SnapshotError("snapshot has no end marker")
    if _U32.unpack(trailer[: _U32.size])[0] != checksum:
        raise SnapshotError("snapshot data fails its CRC32C")
