"""Full disks and maps: apply stops (never records a rejection its peers would not), nothing of the
entry is half-applied, the journal fails loudly and stays readable, and each says so in one line.

Some tests mount a small tmpfs for a real ENOSPC (root only; skipped elsewhere); the rest inject the
failure."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import lmdb
import pytest

from kq.broker.workers import fail_stop_token
from kq.chaos.disk_full import mount_tmpfs, resize_tmpfs, tmpfs_unavailable_reason, unmount
from kq.proto.records import NewRecord, encode_batch
from kq.raft import commands
from kq.raft.faults import (
    EXIT_ENVIRONMENT_FAULT,
    FAIL_STOP_TOKEN_FD,
    apply_fault_message,
    journal_fault_message,
)
from kq.raft.journal import Disk, JournalFaultError, RaftJournal
from kq.raft.snapshot import SnapshotSerializer
from kq.raft.state_machine import EnvironmentFaultError, apply
from kq.storage import Store, StoreWriter
from tests.raft.helpers import append, create
from tests.raft.test_snapshot import CHUNK_BYTES, FakeLog, stream

MIB = 1024 * 1024
MAP_BYTES = 64 * MIB
FAIL_STOP_WAIT_S = 60.0  # A Python process's start and exit on a busy machine.


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (root only)."""
    reason = tmpfs_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    mount = tmp_path / "disk"
    mount.mkdir()
    mount_tmpfs(mount, 4 * MIB)
    try:
        yield mount
    finally:
        unmount(mount)


def big_append(index: int) -> bytes:
    """An append entry of about 256 KiB (random: no codec shrinks it)."""
    batch = encode_batch([NewRecord(None, os.urandom(256 * 1024))])
    return commands.encode(commands.append(index, [commands.partition_append("t", 0, batch)]))


def test_an_errno_lmdb_error_stops_apply_instead_of_rejecting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LMDB reports a commit that found no room on the disk as a bare lmdb.Error (EIO): that is the
    machine's fault, so apply raises EnvironmentFaultError and records nothing, not a rejection."""
    store = Store.open(tmp_path / "s", map_size_bytes=MAP_BYTES)
    apply(store, 1, create("t", 1))

    def failing(*_: object) -> int:
        raise lmdb.Error("mdb_txn_commit: Input/output error")

    monkeypatch.setattr(StoreWriter, "append", failing)
    with pytest.raises(EnvironmentFaultError):
        apply(store, 2, append("t", 0, b"v"))
    assert store.applied_index() == 1
    with store.read() as reader:
        assert reader.rejected_entries() == 0


def test_a_full_disk_stops_apply_with_nothing_half_applied_and_room_lets_it_go_on(
    small_disk: Path, tmp_path: Path
) -> None:
    """A real ENOSPC (a 4 MiB tmpfs): apply stops at one entry with a one-line "disk is full" message;
    the store, reopened, holds exactly the entries before it; given room, the same entry applies and
    the store equals one that never ran out of room."""
    entries = [create("t", 1)] + [big_append(index) for index in range(2, 40)]
    store = Store.open(small_disk / "s", map_size_bytes=MAP_BYTES)
    with pytest.raises(EnvironmentFaultError) as stopped:
        for index, entry in enumerate(entries, start=1):
            apply(store, index, entry)
    failed_at = index
    message = apply_fault_message(stopped.value, failed_at, store.path, MAP_BYTES)
    assert "is full" in message and f"entry {failed_at}" in message and "\n" not in message
    store.close()
    store = Store.open(small_disk / "s", map_size_bytes=MAP_BYTES)
    assert store.applied_index() == failed_at - 1
    with store.read() as reader:
        topic = reader.topic("t")
        assert topic is not None
        state = reader.partition(topic.topic_id, 0)
        assert state is not None and state.log_end_offset == failed_at - 2  # One record per append.
        assert reader.rejected_entries() == 0
    resize_tmpfs(small_disk, 64 * MIB)
    for index in range(failed_at, len(entries) + 1):
        apply(store, index, entries[index - 1])
    reference = Store.open(tmp_path / "reference", map_size_bytes=MAP_BYTES)
    for index, entry in enumerate(entries, start=1):
        apply(reference, index, entry)
    assert store.dump() == reference.dump()


def test_a_full_map_says_so_and_names_the_bound(tmp_path: Path) -> None:
    """A MapFullError is the bound, not the disk: the line names --max-disk-bytes."""
    store = Store.open(tmp_path / "s", map_size_bytes=MIB)
    apply(store, 1, create("t", 1))
    with pytest.raises(EnvironmentFaultError) as stopped:
        for index in range(2, 10):
            apply(store, index, big_append(index))
    message = apply_fault_message(stopped.value, 5, store.path, MIB)
    assert message.startswith("the store is full: entry 5 does not fit in its LMDB map of 1048576 bytes")
    assert "--max-disk-bytes" in message and "\n" not in message


class FullDisk(Disk):
    """The real file system, until `room` bytes are left: then a write stops short (as a real one does)
    and raises ENOSPC; a sync or a replace can be made to fail too."""

    def __init__(self) -> None:
        self.room: int | None = None
        self.sync_error: OSError | None = None
        self.replace_error: OSError | None = None

    def write_at(self, fd: int, offset: int, data: bytes) -> None:
        if self.room is not None and len(data) > self.room:
            super().write_at(fd, offset, data[: self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if self.room is not None:
            self.room -= len(data)
        super().write_at(fd, offset, data)

    def sync(self, fd: int) -> None:
        if self.sync_error is not None:
            raise self.sync_error
        super().sync(fd)

    def replace(self, path: Path, data: bytes | Iterable[bytes], sync: bool) -> None:
        if self.replace_error is not None and path.name.endswith(".kq"):
            raise self.replace_error
        super().replace(path, data, sync)


def journal_with(
    directory: Path, disk: Disk, faults: list[str], count: int, sync: bool = False
) -> RaftJournal:
    journal = RaftJournal(directory, sync, disk, faults.append)
    for index in range(1, count + 1):
        journal.add(b"entry-%d" % index, index, 1)
    return journal


def entries_on_disk(directory: Path) -> list[tuple[bytes, int, int]]:
    journal = RaftJournal(directory, False)
    try:
        return [(bytes(command), index, term) for command, index, term in journal[:]]
    finally:
        journal.close()


def test_an_append_that_finds_the_disk_full_fails_once_loudly_and_leaves_a_readable_journal(
    tmp_path: Path,
) -> None:
    """ENOSPC mid-record: one fault line naming the entry and the full disk, JournalFaultError, the
    journal still holds what it held (the torn record is cut at the next open); with room again, the
    next append overwrites the torn bytes."""
    disk, faults = FullDisk(), list[str]()
    journal = journal_with(tmp_path, disk, faults, 3)
    disk.room = 5  # Part of the next record's header.
    with pytest.raises(JournalFaultError):
        journal.add(b"entry-4", 4, 1)
    assert len(faults) == 1 and "cannot append entry 4" in faults[0] and "\n" not in faults[0]
    assert "No space left on device" in faults[0]
    assert len(journal) == 3
    assert [index for _, index, _ in entries_on_disk(tmp_path)] == [1, 2, 3]
    disk.room = None
    journal.add(b"entry-4", 4, 1)
    journal.close()
    assert [index for _, index, _ in entries_on_disk(tmp_path)] == [1, 2, 3, 4]


def test_a_failed_sync_is_a_fault_not_a_retry(tmp_path: Path) -> None:
    """fsync mode: an fdatasync that fails (its pages may be gone) is reported once, never retried."""
    disk, faults = FullDisk(), list[str]()
    journal = journal_with(tmp_path, disk, faults, 2, sync=True)
    disk.sync_error = OSError(errno.EIO, os.strerror(errno.EIO))
    with pytest.raises(JournalFaultError):
        journal.flush()
    assert len(faults) == 1 and "cannot sync it" in faults[0]


def test_a_compaction_that_cannot_write_keeps_the_old_journal_open_and_whole(tmp_path: Path) -> None:
    """A compaction writes a new file and renames it over: when the write fails, the old journal stays,
    open (its descriptor was not closed first), and the next append lands in it."""
    disk, faults = FullDisk(), list[str]()
    journal = journal_with(tmp_path, disk, faults, 5)
    disk.replace_error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with pytest.raises(JournalFaultError):
        journal.deleteEntriesTo(3)
    assert len(faults) == 1 and "cannot compact it" in faults[0]
    disk.replace_error = None
    journal.add(b"entry-6", 6, 1)
    journal.close()
    assert [index for _, index, _ in entries_on_disk(tmp_path)] == [1, 2, 3, 4, 5, 6]


def test_a_journal_on_a_full_tmpfs_fails_loudly_and_keeps_every_entry_it_took(small_disk: Path) -> None:
    """A real ENOSPC: appends of 64 KiB until one fails; the fault line says the disk is full; every
    entry added before it reads back after a reopen."""
    faults: list[str] = []
    journal = RaftJournal(small_disk, True, on_fault=faults.append)
    added = 0
    with pytest.raises(JournalFaultError):
        for index in range(1, 1_000):
            journal.add(os.urandom(64 * 1024), index, 1)
            journal.flush()
            added = index
    assert len(faults) == 1 and "is full" in faults[0]
    assert added > 0 and len(journal) == added
    assert [index for _, index, _ in entries_on_disk(small_disk)] == list(range(1, added + 1))


def test_journal_messages_name_what_failed_on_a_disk_with_room(tmp_path: Path) -> None:
    """An I/O error on a disk with room is not called a full disk."""
    message = journal_fault_message(
        "sync it", tmp_path / "journal.kq", OSError(errno.EIO, "Input/output error")
    )
    assert message.startswith(f"the Raft journal {tmp_path / 'journal.kq'} failed: cannot sync it: OSError")
    assert "full" not in message


def test_a_copy_of_the_leaders_store_that_does_not_fit_stops_the_follower_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """Restoring needs room for the copy beside the store it replaces: a follower whose map cannot hold
    it reports one line naming the bound (then stops), and its store is left as it was."""
    source = Store.open(tmp_path / "leader-store", map_size_bytes=MAP_BYTES)
    entries = [create("t", 1)] + [big_append(index) for index in range(2, 10)]  # About 2 MiB.
    for index, entry in enumerate(entries, start=1):
        apply(source, index, entry)
    small = Store.open(tmp_path / "follower-store", map_size_bytes=MIB)
    faults: list[str] = []
    (tmp_path / "leader").mkdir()
    (tmp_path / "follower").mkdir()
    sender = SnapshotSerializer(
        source, tmp_path / "leader" / "snapshot", CHUNK_BYTES, FakeLog(), lambda i: None
    )
    receiver = SnapshotSerializer(
        small,
        tmp_path / "follower" / "snapshot",
        CHUNK_BYTES,
        FakeLog(),
        lambda i: None,
        on_fault=faults.append,
    )
    stream(sender, receiver)
    with pytest.raises(lmdb.MapFullError):
        receiver.deserialize()
    assert len(faults) == 1 and faults[0].startswith(
        "the store is full: the leader's copy at applied index 9"
    )
    assert "--max-disk-bytes" in faults[0] and small.applied_index() == 0
    sender.close()


def test_a_copy_that_cannot_be_received_on_a_full_disk_stops_the_follower(
    small_disk: Path, tmp_path: Path
) -> None:
    """A real ENOSPC while a copy's chunks are written: one line saying the disk is full."""
    store = Store.open(tmp_path / "store", map_size_bytes=MAP_BYTES)
    faults: list[str] = []
    receiver = SnapshotSerializer(
        store, small_disk / "snapshot", CHUNK_BYTES, FakeLog(), lambda i: None, on_fault=faults.append
    )
    chunk = os.urandom(MIB)
    with pytest.raises(OSError):
        receiver.setTransmissionData((chunk, True, False))
        for _ in range(8):
            receiver.setTransmissionData((chunk, False, False))
    assert len(faults) == 1 and "is full" in faults[0] and "cannot receive the leader's copy" in faults[0]


# Three threads of each process meet the fault together, as apply and the journal do on a full disk.
FAIL_STOP_SCRIPT = """
import logging, sys, threading
from kq.raft.faults import fail_stop
logging.basicConfig(stream=sys.stderr, format="%(levelname)s %(message)s")
for _ in range(3):
    threading.Thread(target=fail_stop, args=("the disk holding the store is full",)).start()
threading.Event().wait()
"""


def _stop_together(processes: int, token_fd: int | None) -> list[str]:
    """Runs `processes` processes (with the node's token pipe when `token_fd` is given), each failing in
    three threads at once; returns every `stopping:` line they logged, after checking each exited 70."""
    environment = dict(os.environ)
    if token_fd is not None:
        environment[FAIL_STOP_TOKEN_FD] = str(token_fd)
    started = [
        subprocess.Popen(
            [sys.executable, "-c", FAIL_STOP_SCRIPT],
            env=environment,
            pass_fds=() if token_fd is None else (token_fd,),
            stderr=subprocess.PIPE,
        )
        for _ in range(processes)
    ]
    if token_fd is not None:
        os.close(token_fd)
    outputs = [process.communicate(timeout=FAIL_STOP_WAIT_S)[1].decode() for process in started]
    assert [process.returncode for process in started] == [EXIT_ENVIRONMENT_FAULT] * processes
    return [line for output in outputs for line in output.splitlines() if "stopping:" in line]


def test_a_node_that_fails_in_several_threads_logs_one_critical_line() -> None:
    """A full disk fails apply and the journal together: the process logs one CRITICAL line, exit 70."""
    assert _stop_together(1, None) == ["CRITICAL stopping: the disk holding the store is full"]


def test_a_node_of_worker_processes_that_all_meet_the_full_disk_logs_one_line() -> None:
    """Every worker process of a node meets the full disk they share: only the one that reads the
    node's fail-stop token (broker/workers.py `fail_stop_token`) logs the line; all exit 70."""
    assert _stop_together(3, fail_stop_token()) == ["CRITICAL stopping: the disk holding the store is full"]
