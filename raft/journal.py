"""The Raft journal on disk: PySyncObj's log entries and its term, vote and commit index, in kq's
format, written so that `--durability=fsync` can make them durable with one fdatasync per batch.

PySyncObj's own `FileJournal` writes entries into an mmap that it never flushes, rewrites the whole
file in place when it compacts, stores the term and vote by a rename without fsync, and its records
carry no checksum: after a power loss any of these can come back torn, and a torn record cannot be
told from a good one. This journal implements the same interface (PySyncObj's `Journal`: `add`,
`clear`, `deleteEntriesFrom`, `deleteEntriesTo`, indexing, the term/vote/commit getters and setters,
`onOneSecondTimer`, `_destroy`) and `raft/pysyncobj_adapter.py` installs it in PySyncObj's log slot.
In both durability modes every write reaches the page cache at once (a killed process loses
nothing); only `sync=True` (`--durability=fsync`) adds the syncs:

- `add` appends a record; `flush()` makes every record added since the last flush durable with one
  `fdatasync` (group commit: the adapter calls it once per tick and before a follower acknowledges
  an AppendEntries message, not once per entry).
- `deleteEntriesFrom` (a follower's conflicting suffix) and `clear` truncate the file; the next
  flush makes the truncation durable with the entries written after it.
- `deleteEntriesTo` (log compaction) writes the retained entries to a new file and renames it over
  the journal (file and directory synced in fsync mode): a crash leaves the old or the new journal,
  never a mix.
- The term and vote are written at once, by rename, synced in fsync mode before the vote or vote
  request goes out (Raft's rule); the commit index is written once a second (PySyncObj's timer).
- Only the newest entries' commands stay in memory (JOURNAL_HELD_BYTES_MAX, and always the first and
  the last entry's); an older entry keeps its index and term, and its command is read back from the
  file when PySyncObj asks for it (a lagging follower's catch-up, a compaction), its record checked
  as at open: one that changed on disk is a fault (`on_fault`), never an entry handed on. A group's
  log so costs a bounded amount of RAM, not the 128 MiB of entries between two compactions, and the
  heap reuses what an entry freed for the next one instead of faulting in fresh pages. Opening the
  file and compacting it read it a window (JOURNAL_READ_BYTES, whole records) at a time: neither
  holds the file, nor the records a compaction keeps, at once.

File layout (integers big-endian), `journal.kq`:

    magic   8 bytes  b"KQJRNL" and the format version in two ASCII digits: b"KQJRNL01" (format 1)
    records, each:  length u32 (of the command) | crc32c u32 (over index, term and command)
                    | index u64 | term u64 | command (PySyncObj's entry bytes)

Reading stops at the first record that is cut short, fails its CRC32C, exceeds the largest entry or
does not follow its predecessor's index: that tail was being written when the machine stopped, and
the file is truncated there. The metadata is `journal.kq.meta`, JSON: term, voted_for, commit_index
(its format is the journal's: a new one comes with a new magic).

A file whose magic is a newer kq journal (b"KQJRNL" and a version above JOURNAL_FORMAT) is refused
with JournalFormatError, one line naming it, and so is a file that is not a kq journal: neither is
ever truncated or overwritten. Only a file shorter than the magic and a prefix of it (none is ever
written: the file is created by a rename) is taken as no journal at all.

All I/O goes through a `Disk` (`OS_DISK` in production) so that a test can drop the writes that
were not synced when it simulates a power cut (tests/raft/test_durability.py). Only the Raft tick
thread calls a journal (PySyncObj's log is tick-thread state).

A write, truncation or sync that fails (ENOSPC, EIO) is a fault of the machine, not something to
retry: a failed fdatasync may have dropped the pages it was to write, and PySyncObj, if the call
raised into it, would carry on with a log that is not what its file holds. So every failing call
hands one line to `on_fault` (raft/faults.py `fail_stop` in a node: the process ends) before it
raises `JournalFaultError`. The file stays readable whatever the failure interrupted: an append cut
short leaves a torn tail past the last good record (cut off at the next open, or overwritten by the
next append), and a compaction or metadata write that fails leaves the old file in place (it writes a
new file and renames it over).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import queue
import struct
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import crc32c as crc32c_module

from kq.proto.limits import (
    JOURNAL_HELD_BYTES_MAX,
    JOURNAL_JOINED_WRITE_BYTES_MAX,
    JOURNAL_READ_BYTES,
    JOURNAL_RETIRED_FILES_MAX,
    TRANSPORT_BUFFER_BYTES,
)
from kq.raft.faults import journal_fault_message
from kq.storage import FormatError

logger = logging.getLogger(__name__)

JOURNAL_FORMAT = 1  # The journal format this kq writes and reads; a newer one is refused.
MAGIC_PREFIX = b"KQJRNL"
MAGIC = MAGIC_PREFIX + b"%02d" % JOURNAL_FORMAT
JOURNAL_NAME = "journal.kq"
_RECORD = struct.Struct(">IIQQ")  # command length, crc32c, index, term
_INDEX_TERM = struct.Struct(">QQ")
# No entry reaches PySyncObj's transport buffer (raft/node.py asserts it), so a longer record is a torn one.
RECORD_COMMAND_BYTES_MAX = TRANSPORT_BUFFER_BYTES

Entry = tuple[Any, int, int]  # PySyncObj's log entry: (command, index, term).
LegacyJournal = tuple[list[Entry], dict[str, Any]]  # Entries, and {"term", "voted_for", "commit_index"}.


class Disk:
    """The file operations the journal makes, on the real file system. A test subclasses it to keep
    only what was synced when it simulates a power cut."""

    def read(self, path: Path) -> bytes | None:
        """The file's bytes, or None if it does not exist."""
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None

    def open(self, path: Path) -> int:
        """Opens an existing file for reading and writing."""
        return os.open(path, os.O_RDWR)

    def read_at(self, fd: int, offset: int, length: int) -> bytes:
        """`length` bytes of the file from `offset` (fewer only where the file ends)."""
        pieces: list[bytes] = []
        while length > 0:
            piece = os.pread(fd, length, offset)
            if not piece:
                break
            pieces.append(piece)
            offset, length = offset + len(piece), length - len(piece)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def write_at(self, fd: int, offset: int, data: bytes) -> None:
        """Writes `data` at `offset` (to the page cache: a killed process loses nothing)."""
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written

    def size(self, fd: int) -> int:
        """The file's length in bytes."""
        return os.fstat(fd).st_size

    def truncate(self, fd: int, size: int) -> None:
        """Cuts the file to `size` bytes."""
        os.ftruncate(fd, size)

    def sync(self, fd: int) -> None:
        """Makes the file's data and size durable."""
        os.fdatasync(fd)

    def close(self, fd: int) -> None:
        """Closes a file `open` returned."""
        os.close(fd)

    def retire(self, fd: int) -> None:
        """Closes, on `kq-journal-closer`, a file `open` returned whose path a rename has since given to
        a new file (a compaction's). Nothing reads or writes it any more; its last close frees its
        pages, which waits for their writeback (up to ~140 ms for a 128 MiB journal on the VM), so the
        tick thread no longer waits for it. Past JOURNAL_RETIRED_FILES_MAX waiting, closed here."""
        RETIRED_FILES.close(fd, self.close)

    def replace(self, path: Path, data: bytes | Iterable[bytes], sync: bool) -> None:
        """Atomically makes `data` the content of `path` (write a temporary file, rename it over);
        with `sync`, durably: the file is synced before the rename and the directory after it. `data`
        may come in pieces, written one after the other as the iterable gives them (a compaction's
        retained records, a window at a time)."""
        temporary = path.with_name(path.name + ".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            offset = 0
            for piece in (data,) if isinstance(data, bytes) else data:
                self.write_at(fd, offset, piece)
                offset += len(piece)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
        if sync:
            sync_directory(path.parent)

    def rename(self, source: Path, destination: Path, sync: bool) -> None:
        """Renames `source` (already synced by its writer, if `sync`) over `destination`; with `sync`,
        the directory is synced after it."""
        os.replace(source, destination)
        if sync:
            sync_directory(destination.parent)

    def remove(self, path: Path) -> None:
        """Deletes a file if it exists."""
        path.unlink(missing_ok=True)


class RetiredFiles:
    """`kq-journal-closer`: closes the descriptors of replaced journal files (`Disk.retire`), one
    thread for the process, started at the first file; it owns nothing else. A full queue
    (JOURNAL_RETIRED_FILES_MAX) closes the file on the caller's thread instead: bounded either way."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[int, Callable[[int], None]]] = queue.Queue(JOURNAL_RETIRED_FILES_MAX)
        self._started = threading.Lock()
        self._thread: threading.Thread | None = None

    def close(self, fd: int, close: Callable[[int], None]) -> None:
        """Has `close(fd)` called on the closer's thread (on this one when the queue is full)."""
        with self._started:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kq-journal-closer", daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait((fd, close))
        except queue.Full:
            close(fd)

    def wait_closed(self) -> None:
        """Returns once every file handed over so far is closed (tests)."""
        self._queue.join()

    def _run(self) -> None:
        while True:
            fd, close = self._queue.get()
            try:
                close(fd)
            except OSError as error:  # Nothing was written through it since: only its space is late.
                logger.warning("closing a replaced journal file failed: %s", error)
            finally:
                self._queue.task_done()


RETIRED_FILES = RetiredFiles()
OS_DISK = Disk()


def sync_directory(directory: Path) -> None:
    """fsyncs a directory, so that the files created or renamed in it stay after a power loss."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class JournalFormatError(FormatError):
    """The journal file is of a newer format than JOURNAL_FORMAT, or not a kq journal."""


def magic_version(head: bytes, prefix: bytes) -> int | None:
    """The version a versioned magic names (`prefix` then two ASCII digits, 01 and up) at the start of
    `head`, or None if `head` does not start with one (the journal's and the snapshot's magic)."""
    digits = head[len(prefix) : len(prefix) + 2]
    if not head.startswith(prefix) or len(digits) != 2 or not digits.isdigit() or digits == b"00":
        return None
    return int(digits)


def check_journal_head(path: Path, head: bytes) -> None:
    """Raises JournalFormatError unless `head`, the first bytes of the journal file at `path`, starts
    with the magic of a format this kq reads (or is a prefix of it: a file created and not written)."""
    if len(head) < len(MAGIC) and MAGIC.startswith(head):
        return
    found = magic_version(head, MAGIC_PREFIX)
    if found == JOURNAL_FORMAT:
        return
    if found is None:
        raise JournalFormatError(
            f"Raft journal {path} is not a kq journal (it starts with {head[: len(MAGIC)]!r}, not "
            f"{MAGIC!r}); this kq leaves it as it is: restore it, or wipe this node's data directory to "
            "catch up from its peers"
        )
    raise JournalFormatError(
        f"Raft journal {path} has format {found} ({head[: len(MAGIC)].decode()}); this kq reads journal "
        f"format {JOURNAL_FORMAT}: upgrade kq"
    )


def check_journal_file(directory: Path) -> None:
    """`check_journal_head` on the journal in `directory`, if there is one: reads its magic only."""
    try:
        with (directory / JOURNAL_NAME).open("rb") as source:
            head = source.read(len(MAGIC))
    except FileNotFoundError:
        return
    check_journal_head(directory / JOURNAL_NAME, head)


def encode_record(command: bytes, index: int, term: int) -> bytes:
    """One journal record."""
    return record_header(command, index, term) + command


def record_header(command: bytes, index: int, term: int) -> bytes:
    """The bytes of a journal record before its command."""
    index_term = _INDEX_TERM.pack(index, term)
    checksum = crc32c_module.crc32c(command, crc32c_module.crc32c(index_term))
    return _RECORD.pack(len(command), checksum, index, term)


def file_records(disk: Disk, fd: int, window_bytes: int = JOURNAL_READ_BYTES) -> Iterator[tuple[Entry, int]]:
    """Each record of the journal file `fd` that checks, in file order, with its offset; stops at the
    first that is cut short, too long or fails its CRC32C (the caller stops at one that does not
    follow its predecessor's index). The file is read `window_bytes` at a time (more for a record
    longer than that), never whole: each command is a copy of its bytes, the window is let go."""
    position = window_start = len(MAGIC)
    window = b""
    ended = False  # The last read reached the file's end.
    while True:
        at = position - window_start
        record = _checked_record(window, at)
        if record is not None:
            entry, end = record
            yield entry, position
            position = window_start + end
            continue
        needed = _RECORD.size  # The record's bytes as far as the window tells them.
        if at + _RECORD.size <= len(window):
            length = _RECORD.unpack_from(window, at)[0]
            if length > RECORD_COMMAND_BYTES_MAX:
                return
            needed += length
        if ended or at + needed <= len(window):
            return  # Cut short by the file's end, or whole and failing its check.
        asked = max(window_bytes, needed)
        window = b""  # Let go before the next is read: one window at a time in memory.
        window = disk.read_at(fd, position, asked)
        window_start, ended = position, len(window) < asked


def _checked_record(data: bytes | memoryview, position: int) -> tuple[Entry, int] | None:
    """The entry of the record at `position` in `data` and where the record ends in `data`; None if it
    is cut short, longer than the largest entry, or fails its CRC32C."""
    if position + _RECORD.size > len(data):
        return None
    length, checksum, index, term = _RECORD.unpack_from(data, position)
    end = position + _RECORD.size + length
    if length > RECORD_COMMAND_BYTES_MAX or end > len(data):
        return None
    command = data[position + _RECORD.size : end]
    index_term = data[position + 8 : position + _RECORD.size]
    if crc32c_module.crc32c(command, crc32c_module.crc32c(index_term)) != checksum:
        return None
    return (command, index, term), end


class JournalFaultError(Exception):
    """The journal could not write, truncate or sync its file (after `on_fault` was told)."""


def _ignore_fault(message: str) -> None:
    """The default `on_fault`: nothing; the failing call raises JournalFaultError."""


class RaftJournal:
    """PySyncObj's journal interface over a `journal.kq` file; `sync` makes `flush` and the metadata
    writes durable (`--durability=fsync`)."""

    def __init__(
        self,
        directory: Path,
        sync: bool,
        disk: Disk = OS_DISK,
        on_fault: Callable[[str], None] = _ignore_fault,
        held_bytes_max: int = JOURNAL_HELD_BYTES_MAX,
    ) -> None:
        """Opens (creating) the journal in `directory`; a torn tail is cut off. In fsync mode the file
        is synced once here: entries a killed process left in the page cache become durable before
        this node counts them. `on_fault` gets one line when the disk fails a call (module docstring).
        A file of a newer format, or not a journal, raises JournalFormatError and is left as it is.

        The newest entries' commands, `held_bytes_max` bytes of them (and always the first and the
        last entry's), stay in memory; an older entry keeps its index and term there and its command
        is read back from the file, its record checked again, when PySyncObj asks for it
        (`__getitem__`). The file is read a window of JOURNAL_READ_BYTES at a time (`file_records`),
        so opening a long log costs that window and what is held, not the file's size."""
        self._path = directory / JOURNAL_NAME
        self._meta_path = directory / (JOURNAL_NAME + ".meta")
        self._sync = sync
        self._disk = disk
        self._on_fault = on_fault
        self.syncs = 0  # fdatasyncs of the journal file: group commit makes them fewer than entries.
        self._fd = self._open_or_create()
        # Entries from position 1 to `_held_from` hold None for their command (read back on demand);
        # the others hold theirs, `_held` bytes in all. The first is held: PySyncObj reads its index
        # at every lookup.
        self._entries: list[Entry] = []
        self._offsets: list[int] = []
        self._end = len(MAGIC)
        self._held_bytes_max = held_bytes_max
        self._held_from = 1
        self._held = 0
        with self._failing("read it"):
            for entry, offset in file_records(disk, self._fd):
                if self._entries and entry[1] != self._entries[-1][1] + 1:
                    break
                self._entries.append(entry)
                self._offsets.append(offset)
                self._end = offset + _RECORD.size + len(entry[0])
                self._held += len(entry[0])
                if self._held > held_bytes_max:
                    self._release()  # As it reads: a file of any size costs the window and what is held.
            size = disk.size(self._fd)
        self._dirty = sync  # One sync at open (see above).
        if self._end < size:
            logger.warning(
                "journal %s: dropping a torn tail of %d bytes after index %s",
                self._path,
                size - self._end,
                self._entries[-1][1] if self._entries else "none",
            )
            with self._failing("cut its torn tail"):
                disk.truncate(self._fd, self._end)
        self.flush()
        self._meta: dict[str, Any] = {"term": 0, "voted_for": None, "commit_index": 1}
        raw_meta = disk.read(self._meta_path)
        if raw_meta is not None:
            self._meta.update(json.loads(raw_meta))
        self._meta_dirty = False

    def _open_or_create(self) -> int:
        """The journal file, opened for reading and writing, its magic checked (JournalFormatError for
        a newer format or another file, closed again first); created holding the magic alone when
        there is none, or only a part of the magic (no record was ever written after it)."""
        with self._failing("open it"):
            try:
                fd: int | None = self._disk.open(self._path)
            except FileNotFoundError:
                fd = None
        if fd is not None:
            try:
                with self._failing("read it"):
                    head = self._disk.read_at(fd, 0, len(MAGIC))
                check_journal_head(self._path, head)
            except BaseException:
                self._disk.close(fd)
                raise
            if head == MAGIC:
                return fd
            logger.warning("%s holds a part of its magic only: starting an empty journal", self._path)
            self._disk.close(fd)
        with self._failing("create it"):
            self._disk.replace(self._path, MAGIC, self._sync)
            return self._disk.open(self._path)

    # Entries ------------------------------------------------------------------------------------

    def add(self, command: bytes, idx: int, term: int) -> None:
        """Appends an entry (to the page cache; durable at the next `flush` in fsync mode)."""
        command = bytes(command)  # A bytes subclass (an old snapshot header's entry) as plain bytes.
        header = record_header(command, idx, term)
        with self._failing(f"append entry {idx}"):
            if len(command) <= JOURNAL_JOINED_WRITE_BYTES_MAX:  # One write: the copy costs less.
                self._disk.write_at(self._fd, self._end, header + command)
            else:  # Two writes: joining them would copy the entry.
                self._disk.write_at(self._fd, self._end, header)
                self._disk.write_at(self._fd, self._end + len(header), command)
        self._entries.append((command, idx, term))
        self._offsets.append(self._end)
        self._end += len(header) + len(command)
        self._dirty = True
        self._held += len(command)
        if self._held > self._held_bytes_max:
            self._release()

    def _release(self) -> None:
        """Drops the commands of the oldest held entries while more than `held_bytes_max` bytes are
        held, the first and the last entry's always kept (what `__getitem__` reads back from the
        file)."""
        entries = self._entries
        last = len(entries) - 1
        while self._held > self._held_bytes_max and self._held_from < last:
            command, index, term = entries[self._held_from]
            self._held -= len(command)
            entries[self._held_from] = (None, index, term)
            self._held_from += 1

    @property
    def held_bytes(self) -> int:
        """The bytes of the commands held in memory."""
        return self._held

    def clear(self) -> None:
        """Drops every entry."""
        self._truncate(0)

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802, N803 - PySyncObj's names.
        """Drops the entries at list positions `entryFrom` and after."""
        self._truncate(entryFrom)

    def _truncate(self, position: int) -> None:
        if position >= len(self._entries):
            return
        self._end = self._offsets[position] if position > 0 else len(MAGIC)
        self._held -= sum(len(entry[0]) for entry in self._entries[position:] if entry[0] is not None)
        self._held_from = max(1, min(self._held_from, position))
        del self._entries[position:], self._offsets[position:]
        with self._failing("truncate it"):
            self._disk.truncate(self._fd, self._end)
        self._dirty = True

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802, N803 - PySyncObj's names.
        """Drops the entries before list position `entryTo` (log compaction): the retained entries'
        records go to a new file renamed over the journal, so a crash leaves the old journal or the new
        one. The records are copied from the old file a window at a time, each checked as it is read
        (`_checked_window`: one that changed on disk is a fault, never copied on), so a compaction
        costs JOURNAL_READ_BYTES of RAM whatever it retains."""
        start = min(max(entryTo, 0), len(self._entries))
        retained, offsets = self._entries[start:], self._offsets[start:]
        shift = (offsets[0] if offsets else self._end) - len(MAGIC)
        first: Entry | None = None
        if retained and retained[0][0] is None:  # The new first entry is always held: read back.
            first = self._read_back(start, start + 1)[0]
        with self._failing("compact it"):
            # The new file first: a failure leaves the old one open and whole. (Closing first, as this
            # once did, left a closed descriptor behind a failed write, whose number the process
            # could reuse for another file that the next append would then write into.)
            self._disk.replace(self._path, self._retained_records(start), self._sync)
            fd = self._disk.open(self._path)
            self._disk.retire(self._fd)  # The replaced file: its pages are freed off this thread.
            self._fd = fd
        if first is not None:
            retained[0] = first
        self._entries = retained
        self._offsets = [offset - shift for offset in offsets]
        self._end -= shift
        self._dirty = False  # replace() synced it in fsync mode; nothing to sync otherwise.
        self._held_from = max(1, self._held_from - start)
        self._held = sum(len(entry[0]) for entry in retained if entry[0] is not None)
        self._release()

    def _retained_records(self, start: int) -> Iterator[bytes]:
        """The new file's bytes after a compaction to list position `start`: the magic, then the
        records from `start` on as the old file holds them, a window of about JOURNAL_READ_BYTES
        (whole records) at a time, each checked against the entry it is."""
        yield MAGIC
        position = start
        while position < len(self._entries):
            stop = position + 1
            while stop < len(self._entries) and self._records_end(stop + 1) - self._offsets[position] <= (
                JOURNAL_READ_BYTES
            ):
                stop += 1
            yield self._checked_window(position, stop, entries_wanted=False)[0]
            position = stop

    def __getitem__(self, item: int | slice) -> Any:
        """Entries as PySyncObj reads them, (command, index, term): a command no longer held is read
        back from the file (one read for a slice's)."""
        if isinstance(item, slice):
            start, stop, step = item.indices(len(self._entries))
            if step != 1:
                return [self[position] for position in range(start, stop, step)]
            low, high = max(start, 1), min(stop, self._held_from)  # The slice's entries not held.
            if low >= high:
                return self._entries[start:stop]
            return self._entries[start:low] + self._read_back(low, high) + self._entries[high:stop]
        entry = self._entries[item]
        if entry[0] is None:
            position = item if item >= 0 else item + len(self._entries)
            return self._read_back(position, position + 1)[0]
        return entry

    def _records_end(self, stop: int) -> int:
        """Where the record before list position `stop` ends in the file."""
        return self._offsets[stop] if stop < len(self._offsets) else self._end

    def command_bytes(self, start: int, stop: int) -> int:
        """The bytes of the commands of the entries at list positions `start` to `stop`, from the
        records' lengths (nothing read back)."""
        stop = min(stop, len(self._entries))
        if start >= stop:
            return 0
        return self._records_end(stop) - self._offsets[start] - (stop - start) * _RECORD.size

    def entries_within(self, position: int, count: int, bytes_max: int) -> list[Entry]:
        """Up to `count` entries from list position `position`, cut as PySyncObj's `__getEntries`
        cuts them to `maxSizeBytes`: the first entry whose command brings the total to `bytes_max` or
        more is the last. The cut is made on the records' lengths, so only the entries handed out are
        read back (a lagging follower's catch-up round: not up to CATCH_UP_ENTRIES_PER_ROUND of them)."""
        stop = min(len(self._entries), position + count)
        total = 0
        for at in range(position, stop):
            total += self._records_end(at + 1) - self._offsets[at] - _RECORD.size
            if total >= bytes_max:
                stop = at + 1
                break
        return self[position:stop] if position < stop else []

    def _read_back(self, start: int, stop: int) -> list[Entry]:
        """The entries at positions `start` to `stop` (none held), their records read from the file in
        one call and checked as at open: a record that differs is a fault of the disk (`on_fault`,
        then JournalFaultError), never an entry handed on."""
        return self._checked_window(start, stop)[1]

    def _checked_window(
        self, start: int, stop: int, entries_wanted: bool = True
    ) -> tuple[bytes, list[Entry]]:
        """The records of the entries at positions `start` to `stop` as the file holds them (one read)
        and, if `entries_wanted`, their entries (each command a copy), each record checked against the
        entry it is (`_read_back`). Without entries the checks read views: nothing is copied."""
        base = self._offsets[start]
        with self._failing(f"read back entries {self._entries[start][1]} to {self._entries[stop - 1][1]}"):
            data = self._disk.read_at(self._fd, base, self._records_end(stop) - base)
        source = data if entries_wanted else memoryview(data)
        entries: list[Entry] = []
        for position in range(start, stop):
            at = self._offsets[position] - base
            _, index, term = self._entries[position]
            record = _checked_record(source, at)
            if (
                record is not None
                and record[0][1:] == (index, term)
                and record[1] + base == self._records_end(position + 1)
            ):
                if entries_wanted:
                    entries.append(record[0])
                continue
            error = OSError(errno.EIO, f"entry {index}'s record no longer reads as it was written")
            self._on_fault(journal_fault_message(f"read back entry {index}", self._path, error))
            raise JournalFaultError(f"the journal {self._path}: entry {index}'s record changed on disk")
        return data, entries

    def __len__(self) -> int:
        return len(self._entries)

    def flush(self) -> bool:
        """fsync mode: makes every entry added (and every truncation) since the last flush durable,
        with one fdatasync. True if it synced. Without sync, nothing to do."""
        if not (self._sync and self._dirty):
            return False
        with self._failing("sync it"):
            self._disk.sync(self._fd)
        self._dirty = False
        self.syncs += 1
        return True

    def _destroy(self) -> None:
        """PySyncObj's name for `close`."""
        self.close()

    def close(self) -> None:
        """Closes the file: flushed first, and the metadata written."""
        self.flush()
        if self._meta_dirty:
            self._write_meta()
        self._disk.close(self._fd)

    # Term, vote and commit index ------------------------------------------------------------------

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802, N803 - PySyncObj's names.
        """Remembers the commit index; written at the next one-second timer (a stale one is safe)."""
        self._meta["commit_index"] = raftCommitIndex
        self._meta_dirty = True

    def getRaftCommitIndex(self) -> int:  # noqa: N802 - PySyncObj's name.
        """The commit index written last (1 for a new journal, as PySyncObj's)."""
        return int(self._meta["commit_index"])

    def setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:  # noqa: N802, N803
        """Writes the term and vote before PySyncObj sends a message reflecting them (synced in fsync
        mode: a node that forgot its vote after a power loss could vote twice in one term)."""
        self._meta["term"] = term
        self._meta["voted_for"] = votedForNodeId
        self._write_meta()

    def getCurrentTerm(self) -> int:  # noqa: N802 - PySyncObj's name.
        """The term written last."""
        return int(self._meta["term"])

    def getVotedForNodeId(self) -> str | None:  # noqa: N802 - PySyncObj's name.
        """The node voted for in the current term, if any."""
        voted_for: str | None = self._meta["voted_for"]
        return voted_for

    def onOneSecondTimer(self) -> None:  # noqa: N802 - PySyncObj's name.
        """Writes the commit index if it changed."""
        if self._meta_dirty:
            self._write_meta()

    def _write_meta(self) -> None:
        with self._failing("write its term, vote and commit index"):
            self._disk.replace(self._meta_path, json.dumps(self._meta).encode(), self._sync)
        self._meta_dirty = False

    @contextmanager
    def _failing(self, action: str) -> Iterator[None]:
        """Turns an OSError of the block into `on_fault`'s one line, then JournalFaultError."""
        try:
            yield
        except OSError as error:
            message = journal_fault_message(action, self._path, error)
            self._on_fault(message)
            raise JournalFaultError(message) from error


def convert_legacy_journal(
    directory: Path, legacy_name: str, read_legacy: Callable[[Path], LegacyJournal], disk: Disk = OS_DISK
) -> None:
    """Moves a journal written by PySyncObj's `FileJournal` (kq before `journal.kq`) into kq's format,
    term, vote and commit index included, then deletes it; `read_legacy` reads it (the adapter's
    `read_pysyncobj_journal`). Nothing happens without one, or once `journal.kq` exists."""
    legacy = directory / legacy_name
    if disk.read(directory / JOURNAL_NAME) is not None or disk.read(legacy) is None:
        return
    entries, meta = read_legacy(legacy)
    records = b"".join(encode_record(bytes(command), index, term) for command, index, term in entries)
    disk.replace(directory / (JOURNAL_NAME + ".meta"), json.dumps(meta).encode(), sync=True)
    disk.replace(directory / JOURNAL_NAME, MAGIC + records, sync=True)
    disk.remove(legacy)
    disk.remove(legacy.with_name(legacy_name + ".meta"))
    logger.info("converted the Raft journal %s (%d entries) to %s", legacy, len(entries), JOURNAL_NAME)
