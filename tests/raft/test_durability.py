"""Durability modes in one process: kq's Raft journal, and three real RaftNodes through a simulated
power cut of every node at once.

The power cut is a fault-injecting disk (`PowerCutDisk`, the journal's file I/O) and store
(`PowerCutStore`, which keeps the LMDB file as of its last `sync()`): at the cut, everything written
since the last sync of each file is dropped, for all three nodes at the same instant. The store model
is harsher than LMDB itself (in fsync mode every commit syncs its data pages; this keeps only explicit
syncs), so what survives it survives a real power loss. In fsync mode every acknowledged entry comes
back after the cut; in replicated mode (no syncs) the same run loses them, which shows the syncs are
what keeps them.
"""

from __future__ import annotations

import os
import pickle
import shutil
import struct
import threading
import tracemalloc
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pysyncobj.journal import FileJournal

from kq.deploy.cluster import free_ports
from kq.deploy.waiting import wait_for
from kq.proto.limits import JOURNAL_READ_BYTES, JOURNAL_RETIRED_FILES_MAX
from kq.raft.journal import (
    JOURNAL_NAME,
    MAGIC,
    RETIRED_FILES,
    Disk,
    JournalFaultError,
    RaftJournal,
    RetiredFiles,
    convert_legacy_journal,
    encode_record,
    file_records,
)
from kq.raft.node import Durability, RaftConfig, RaftNode, finish_compaction
from kq.raft.pysyncobj_adapter import read_pysyncobj_journal
from kq.raft.results import ApplyResult
from kq.raft.snapshot import MAGIC as MAGIC_SNAPSHOT
from kq.storage import Store
from tests.raft.helpers import append, create

WAIT_S = 30.0  # Elections, commits and applies of in-process nodes on a busy 2-core machine.
WRITERS = 3  # Threads proposing at once, so entries share ticks and flushes (group commit).
ACKNOWLEDGED_BEFORE_CUT = 60
TOPIC = "t"


# The journal alone ---------------------------------------------------------------------------------


def test_the_journal_reads_back_its_entries_term_vote_and_commit_index(tmp_path: Path) -> None:
    """Entries, term, vote and commit index written by one journal are read by the next."""
    journal = RaftJournal(tmp_path, sync=True)
    for index in range(1, 6):
        journal.add(b"command-%d" % index, index, 2)
    journal.setCurrentTerm(3, "127.0.0.1:1")
    journal.setRaftCommitIndex(4)
    journal.close()
    again = RaftJournal(tmp_path, sync=True)
    assert [again[i] for i in range(len(again))] == [(b"command-%d" % i, i, 2) for i in range(1, 6)]
    assert (again.getCurrentTerm(), again.getVotedForNodeId(), again.getRaftCommitIndex()) == (
        3,
        "127.0.0.1:1",
        4,
    )
    again.close()


def test_truncation_and_compaction_survive_a_reopen(tmp_path: Path) -> None:
    """deleteEntriesFrom cuts the tail, deleteEntriesTo the head, and both are what a reopen reads."""
    journal = RaftJournal(tmp_path, sync=True)
    for index in range(1, 11):
        journal.add(b"x" * index, index, 1)
    journal.deleteEntriesFrom(8)  # Keeps indexes 1..8.
    journal.add(b"new", 9, 2)
    journal.deleteEntriesTo(3)  # Keeps indexes 4..9.
    journal.add(b"after", 10, 2)
    journal.close()
    again = RaftJournal(tmp_path, sync=True)
    assert [(again[i][1], again[i][2]) for i in range(len(again))] == [(i, 1) for i in range(4, 9)] + [
        (9, 2),
        (10, 2),
    ]
    assert again[-1][0] == b"after"
    again.close()


def _replaced_journals_open() -> list[str]:
    """This process's descriptors of journal files a rename has replaced (`/proc/self/fd`)."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:  # The directory's own descriptor, closed by now.
            continue
    return [t for t in targets if JOURNAL_NAME in t and t.endswith("(deleted)")]


def test_a_compaction_closes_the_replaced_file_off_the_tick_thread(tmp_path: Path) -> None:
    """The file a compaction replaced is closed by `kq-journal-closer` (its last close frees its pages,
    which waits for their writeback): the compacting thread hands it over, it is closed, and the
    journal goes on writing to the new file."""
    closed_on: list[str] = []

    class WatchingDisk(Disk):
        def close(self, fd: int) -> None:
            closed_on.append(threading.current_thread().name)
            super().close(fd)

    journal = RaftJournal(tmp_path, sync=False, disk=WatchingDisk())
    for index in range(1, 11):
        journal.add(b"x" * 1000, index, 1)
    journal.deleteEntriesTo(5)  # Keeps indexes 6..10.
    journal.add(b"after", 11, 1)
    RETIRED_FILES.wait_closed()
    assert closed_on == ["kq-journal-closer"]
    assert _replaced_journals_open() == []
    journal.close()
    again = RaftJournal(tmp_path, sync=False)
    assert [again[i][1] for i in range(len(again))] == list(range(6, 12))
    assert again[-1][0] == b"after"
    again.close()


def test_retired_files_past_the_bound_are_closed_by_the_caller() -> None:
    """While the closer is busy, at most JOURNAL_RETIRED_FILES_MAX files wait; the next is closed on the
    caller's thread (bounded either way), and every one is closed in the end."""
    retired = RetiredFiles()
    release = threading.Event()
    closed: list[tuple[int, str]] = []

    def close(fd: int) -> None:
        if threading.current_thread().name == "kq-journal-closer":
            release.wait(WAIT_S)
        closed.append((fd, threading.current_thread().name))

    retired.close(0, close)  # The closer takes it and blocks in it.
    wait_for(lambda: retired._queue.qsize() == 0, "the closer to take the first file", WAIT_S)
    for fd in range(1, JOURNAL_RETIRED_FILES_MAX + 1):
        retired.close(fd, close)  # They wait.
    retired.close(99, close)  # The queue is full: closed here.
    assert closed == [(99, threading.current_thread().name)]
    release.set()
    retired.wait_closed()
    assert sorted(fd for fd, _ in closed) == [*range(JOURNAL_RETIRED_FILES_MAX + 1), 99]


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(0, 300)),
            st.tuples(st.just("from"), st.integers(0, 40)),
            st.tuples(st.just("to"), st.integers(0, 40)),
            st.tuples(st.just("reopen"), st.just(0)),
        ),
        max_size=60,
    ),
    held_bytes_max=st.integers(0, 600),
)
def test_entries_not_held_read_back_as_they_were_added(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, int]], held_bytes_max: int
) -> None:
    """Whatever adds, truncations, compactions and reopens did, every entry (by index, by negative
    index, by slice) is the one added, read back from the file where its command is no longer held,
    and the journal holds at most `held_bytes_max` bytes of commands beyond its first and last."""
    directory = tmp_path_factory.mktemp("journal")
    journal = RaftJournal(directory, sync=False, held_bytes_max=held_bytes_max)
    model: list[tuple[bytes, int, int]] = []
    for kind, number in steps:
        if kind == "add":
            index = model[-1][1] + 1 if model else 1
            model.append((bytes([index % 251]) * number, index, 1 + index // 7))
            journal.add(*model[-1])
        elif kind == "from":
            del model[number:]
            journal.deleteEntriesFrom(number)
        elif kind == "to" and number < len(model):
            del model[:number]
            journal.deleteEntriesTo(number)
        elif kind == "reopen":
            journal.close()
            journal = RaftJournal(directory, sync=False, held_bytes_max=held_bytes_max)
        assert len(journal) == len(model)
        assert [journal[position] for position in range(len(model))] == model
        assert journal[:] == model and journal[1:-1] == model[1:-1] and journal[3:7] == model[3:7]
        if model:
            assert journal[-1] == model[-1] and journal[0] == model[0]
            ends = len(model[0][0]) + (len(model[-1][0]) if len(model) > 1 else 0)
            assert journal.held_bytes <= held_bytes_max + ends
        # The file holds exactly the model's records: a compaction copied the retained ones as written.
        assert (directory / JOURNAL_NAME).read_bytes() == MAGIC + b"".join(encode_record(*e) for e in model)
    journal.close()


def _whole_file_records(data: bytes) -> list[tuple[tuple[bytes, int, int], int]]:
    """The records `file_records` must find, read the way the journal read its file before it read
    windows: the whole file at once, record after record until one does not check."""
    found = []
    position = len(MAGIC)
    while position + 24 <= len(data):
        length, _, index, term = struct.unpack_from(">IIQQ", data, position)
        end = position + 24 + length
        if end > len(data) or encode_record(data[position + 24 : end], index, term) != data[position:end]:
            break
        found.append(((data[position + 24 : end], index, term), position))
        position = end
    return found


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 120), max_size=25),
    window_bytes=st.integers(1, 200),
    damage=st.one_of(
        st.none(),
        st.tuples(st.just("cut"), st.integers(0, 4_000)),
        st.tuples(st.just("flip"), st.integers(0, 4_000)),
        st.tuples(st.just("long"), st.integers(0, 24)),
    ),
)
def test_file_records_read_in_windows_find_what_the_whole_file_holds(
    tmp_path_factory: pytest.TempPathFactory,
    sizes: list[int],
    window_bytes: int,
    damage: tuple[str, int] | None,
) -> None:
    """Reading a journal a window at a time (windows that cut records anywhere, records longer than a
    window) finds the very records, at the very offsets, that one read of the whole file finds, torn,
    flipped or absurdly long tails included."""
    data = bytearray(MAGIC + b"".join(encode_record(bytes([n % 256]) * n, n + 1, 2) for n in sizes))
    if damage is not None:
        kind, at = damage
        at = len(MAGIC) + at % max(1, len(data) - len(MAGIC))
        if kind == "cut":
            del data[at:]
        elif kind == "flip" and at < len(data):
            data[at] ^= 0x5A
        elif kind == "long":  # A record header claiming more than the largest entry.
            data += struct.pack(">IIQQ", 0xFFFFFFF0, 0, len(sizes) + 1, 2)[: max(1, damage[1])]
    path = tmp_path_factory.mktemp("journal") / JOURNAL_NAME
    path.write_bytes(bytes(data))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert list(file_records(Disk(), fd, window_bytes)) == _whole_file_records(bytes(data))
    finally:
        os.close(fd)


class ReadCountingDisk(Disk):
    """The real disk, counting what is read of the journal and how: whole-file reads and each
    `read_at`'s length."""

    def __init__(self) -> None:
        self.whole_reads: list[Path] = []
        self.read_lengths: list[int] = []

    def read(self, path: Path) -> bytes | None:
        self.whole_reads.append(path)
        return super().read(path)

    def read_at(self, fd: int, offset: int, length: int) -> bytes:
        self.read_lengths.append(length)
        return super().read_at(fd, offset, length)


def test_opening_and_compacting_a_long_journal_read_a_window_at_a_time(tmp_path: Path) -> None:
    """A journal of 48 MiB opens and compacts with reads of at most JOURNAL_READ_BYTES and never a
    whole-file read: the memory either takes (Python's allocations, tracemalloc) stays a fraction of
    the file. The entries read back are the ones written."""
    entry_bytes, count, held = 256 * 1024, 192, 1024 * 1024
    entries = [(bytes([index % 256]) * entry_bytes, index, 1) for index in range(1, count + 1)]
    journal = RaftJournal(tmp_path, sync=False, held_bytes_max=held)
    for entry in entries:
        journal.add(*entry)
    journal.close()
    file_bytes = (tmp_path / JOURNAL_NAME).stat().st_size
    disk = ReadCountingDisk()
    tracemalloc.start()
    try:
        journal = RaftJournal(tmp_path, sync=False, disk=disk, held_bytes_max=held)
        opened_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        journal.deleteEntriesTo(count // 4)
        compacted_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert tmp_path / JOURNAL_NAME not in disk.whole_reads
    assert max(disk.read_lengths) <= JOURNAL_READ_BYTES
    bound = 3 * JOURNAL_READ_BYTES + held + 2 * entry_bytes  # The windows (two at once), what is held.
    assert opened_peak < bound < file_bytes // 2, (opened_peak, bound, file_bytes)
    assert compacted_peak < bound, (compacted_peak, bound)
    assert len(journal) == count - count // 4
    assert journal[:] == entries[count // 4 :]
    journal.close()
    again = RaftJournal(tmp_path, sync=False, held_bytes_max=held)
    assert again[:] == entries[count // 4 :] and again.held_bytes <= held + 2 * entry_bytes
    again.close()


def _pysyncobj_cut(entries: list[tuple[bytes, int, int]], bytes_max: int) -> list[tuple[bytes, int, int]]:
    """PySyncObj's `__getEntries` cut to `maxSizeBytes` (syncobj.py), on entries already sliced."""
    total = 0
    for last, entry in enumerate(entries):
        total += len(entry[0])
        if total >= bytes_max:
            return entries[: last + 1]
    return entries


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 200), min_size=1, max_size=30),
    position=st.integers(0, 35),
    count=st.integers(1, 40),
    bytes_max=st.integers(1, 700),
    held_bytes_max=st.integers(0, 400),
)
def test_entries_within_cuts_as_pysyncobj_does(
    tmp_path_factory: pytest.TempPathFactory,
    sizes: list[int],
    position: int,
    count: int,
    bytes_max: int,
    held_bytes_max: int,
) -> None:
    """A leader's round to a lagging follower takes `entries_within` (reading back only the entries
    it hands out) where PySyncObj's `__getEntries(index, count, maxSizeBytes)` would slice, then cut:
    the same entries."""
    journal = RaftJournal(tmp_path_factory.mktemp("journal"), sync=False, held_bytes_max=held_bytes_max)
    model = [(bytes([index]) * size, index, 1) for index, size in enumerate(sizes, start=1)]
    for entry in model:
        journal.add(*entry)
    assert journal.entries_within(position, count, bytes_max) == _pysyncobj_cut(
        model[position : position + count], bytes_max
    )
    assert journal.command_bytes(position, position + count) == sum(
        len(entry[0]) for entry in model[position : position + count]
    )
    journal.close()


def test_a_command_changed_on_disk_is_a_fault_not_an_entry(tmp_path: Path) -> None:
    """An entry read back (no longer held) whose record does not read as written is never handed on:
    `on_fault` gets one line and the read raises JournalFaultError."""
    faults: list[str] = []
    journal = RaftJournal(tmp_path, sync=False, on_fault=faults.append, held_bytes_max=0)
    for index in range(1, 5):
        journal.add(b"command %d" % index, index, 1)
    assert journal[1] == (b"command 2", 2, 1)  # Read back: only the first and the last are held.
    with (tmp_path / JOURNAL_NAME).open("r+b") as file:
        data = file.read()
        at = data.index(b"command 2")
        file.seek(at)
        file.write(b"COMMAND")
    with pytest.raises(JournalFaultError, match="entry 2"):
        journal[1]  # The read is what is tested.
    assert len(faults) == 1 and "read back entry 2" in faults[0] and "\n" not in faults[0]
    assert journal[2] == (b"command 3", 3, 1)  # Its neighbours read as written.
    journal.close()


def test_a_torn_tail_is_cut_off_at_the_last_whole_record(tmp_path: Path) -> None:
    """A record cut short or with a bad checksum (a write the power cut tore) ends the journal there."""
    good = encode_record(b"one", 1, 1) + encode_record(b"two", 2, 1)
    torn = bytearray(encode_record(b"three", 3, 1))
    torn[-1] ^= 0xFF
    (tmp_path / JOURNAL_NAME).write_bytes(MAGIC + good + bytes(torn) + encode_record(b"four", 4, 1)[:9])
    journal = RaftJournal(tmp_path, sync=True)
    assert [journal[i][0] for i in range(len(journal))] == [b"one", b"two"]
    journal.add(b"three again", 3, 1)
    journal.close()
    assert len(RaftJournal(tmp_path, sync=False)) == 3


def test_flush_syncs_once_per_batch_of_entries_and_only_in_fsync_mode(tmp_path: Path) -> None:
    """Group commit: many entries, one fdatasync; a clean journal is not synced again; replicated
    mode never syncs."""
    for name in ("fsync", "replicated"):
        (tmp_path / name).mkdir()
    synced = RaftJournal(tmp_path / "fsync", sync=True)
    start = synced.syncs
    for index in range(1, 101):
        synced.add(b"entry", index, 1)
    assert synced.flush() and synced.syncs == start + 1
    assert not synced.flush()
    synced.close()
    replicated = RaftJournal(tmp_path / "replicated", sync=False)
    replicated.add(b"entry", 1, 1)
    assert not replicated.flush() and replicated.syncs == 0
    replicated.close()


def test_a_pysyncobj_journal_is_converted_with_its_term_and_vote(tmp_path: Path) -> None:
    """A data directory written by PySyncObj's FileJournal (kq before its own journal) keeps its log."""
    old = FileJournal(str(tmp_path / "journal"))
    for index in range(1, 4):
        old.add(b"entry-%d" % index, index, 5)
    old.setCurrentTerm(6, "127.0.0.1:2")
    old.flush()
    del old  # FileJournal has no public close; read_pysyncobj_journal opens its own.
    convert_legacy_journal(tmp_path, "journal", read_pysyncobj_journal)
    assert not (tmp_path / "journal").exists()
    journal = RaftJournal(tmp_path, sync=True)
    assert [journal[i] for i in range(len(journal))] == [(b"entry-%d" % i, i, 5) for i in range(1, 4)]
    assert (journal.getCurrentTerm(), journal.getVotedForNodeId()) == (6, "127.0.0.1:2")
    journal.close()


def test_a_restart_finishes_a_compaction_that_wrote_its_snapshot_but_did_not_cut_the_journal(
    tmp_path: Path,
) -> None:
    """The journal is cut where the snapshot starts (PySyncObj would clear it down to two entries)."""
    journal = RaftJournal(tmp_path, sync=True)
    for index in range(1, 11):
        journal.add(b"entry-%d" % index, index, 1)
    header = pickle.dumps({"raft": (journal[5], journal[4], set()), "applied_index": 6}, protocol=5)
    snapshot = tmp_path / "snapshot"
    snapshot.write_bytes(MAGIC_SNAPSHOT + struct.pack(">I", len(header)) + header + bytes(12) + b"KQEND")
    finish_compaction(journal, snapshot)
    assert [journal[i][1] for i in range(len(journal))] == list(range(5, 11))
    journal.close()


# The power cut ---------------------------------------------------------------------------------


class PowerCutDisk(Disk):
    """Real files, plus the image of each as of its last sync; `cut()` freezes the images (later syncs
    change nothing) and `restore()` puts them back as the files, as a machine finds them after power
    returns. One instance serves every node, so the cut is one instant for all of them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # Orders every sync against the cut.
        self.cut_off = False
        self._paths: dict[int, Path] = {}
        self._durable: dict[Path, bytes] = {}
        self._touched: set[Path] = set()
        self._stores: dict[Path, bytes | None] = {}  # A store directory: its data.mdb as of its last sync.

    def open(self, path: Path) -> int:
        fd = super().open(path)
        self._paths[fd] = path
        self._touched.add(path)
        return fd

    def sync(self, fd: int) -> None:
        with self.lock:
            super().sync(fd)
            if not self.cut_off:
                self._durable[self._paths[fd]] = self._paths[fd].read_bytes()

    def replace(self, path: Path, data: bytes | Iterable[bytes], sync: bool) -> None:
        with self.lock:
            super().replace(path, data, sync)
            self._touched.add(path)
            if sync and not self.cut_off:  # Pieces (a compaction's) are gone once written: read back.
                self._durable[path] = data if isinstance(data, bytes) else path.read_bytes()

    def rename(self, source: Path, destination: Path, sync: bool) -> None:
        with self.lock:
            super().rename(source, destination, sync)
            self._touched.add(destination)
            if sync and not self.cut_off:
                self._durable[destination] = destination.read_bytes()

    def store_synced(self, store: Store) -> None:
        """Called by `PowerCutStore.sync` after LMDB flushed: its file is now durable."""
        with self.lock:
            if not self.cut_off:
                self._stores[store.path] = (store.path / "data.mdb").read_bytes()

    def store_opened(self, store: Store) -> None:
        self._stores.setdefault(store.path, None)

    def cut(self) -> None:
        """The power goes off: nothing written from now on reaches the disk."""
        with self.lock:
            self.cut_off = True

    def restore(self) -> None:
        """The power comes back: every file is what its last sync left (gone if never synced)."""
        for path in self._touched:
            if path in self._durable:
                path.write_bytes(self._durable[path])
            else:
                path.unlink(missing_ok=True)
        for directory, image in self._stores.items():
            shutil.rmtree(directory)
            if image is not None:
                directory.mkdir()
                (directory / "data.mdb").write_bytes(image)
        self.cut_off = False
        self._touched.clear()


class PowerCutStore(Store):
    """A real LMDB store whose state after a power cut is what it held at its last `sync()`."""

    disk: PowerCutDisk

    def sync(self) -> None:
        super().sync()
        self.disk.store_synced(self)


class PowerCutCluster:
    """Three RaftNodes on one PowerCutDisk, with stores that keep only what they synced."""

    def __init__(self, tmp_path: Path, durability: Durability, compaction_min_entries: int) -> None:
        self.disk = PowerCutDisk()
        addresses = [f"127.0.0.1:{port}" for port in free_ports(3)]
        self.configs = [
            RaftConfig(
                raft_address=address,
                peer_raft_addresses=tuple(a for a in addresses if a != address),
                data_dir=tmp_path / f"node{number}",
                password="secret",
                compaction_min_entries=compaction_min_entries,
                durability=durability,
            )
            for number, address in enumerate(addresses)
        ]
        self.stores: list[PowerCutStore] = []
        self.nodes: list[RaftNode] = []

    def start(self) -> None:
        for config in self.configs:
            store = PowerCutStore.open(config.data_dir / "store", 256 * 1024**2, sync=config.synced)
            assert isinstance(store, PowerCutStore)
            store.disk = self.disk
            self.disk.store_opened(store)
            self.stores.append(store)
            self.nodes.append(RaftNode(config, store, lambda index, result: None, self.disk))
        for node in self.nodes:
            node.start()

    def leader(self) -> RaftNode:
        wait_for(lambda: sum(node.is_leader() for node in self.nodes) == 1, "one leader", WAIT_S)
        return next(node for node in self.nodes if node.is_leader())

    def propose(self, data: bytes) -> bool:
        """Proposes `data` on the leader; True once it committed before the cut (acknowledged)."""
        done = threading.Event()
        outcome: list[bool] = []

        def on_result(result: ApplyResult | None, reason: int) -> None:
            with self.disk.lock:  # An entry acknowledged after the cut was never acknowledged.
                outcome.append(reason == 0 and result is not None and not self.disk.cut_off)
            done.set()

        self.leader().propose(data, on_result)
        return done.wait(WAIT_S) and outcome[0]

    def stop(self) -> None:
        for node, store in zip(self.nodes, self.stores, strict=True):
            node.close()
            store.close()
        self.nodes, self.stores = [], []

    def values_on_leader(self) -> bytes:
        """Every stored batch of the topic on the leader, once it applied an entry of its own term."""
        assert self.propose(create("marker", 1))
        store = self.stores[self.nodes.index(self.leader())]
        with store.read() as reader:
            topic = reader.topic(TOPIC)
            if topic is None:
                return b""
            return b"".join(batch.data for batch in reader.batches(topic.topic_id, 0, 0, 1 << 30))


MakeCluster = Callable[[Durability, int], PowerCutCluster]


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[MakeCluster]:
    made: list[PowerCutCluster] = []

    def build(durability: Durability, compaction_min_entries: int) -> PowerCutCluster:
        cluster = PowerCutCluster(tmp_path, durability, compaction_min_entries)
        made.append(cluster)
        return cluster

    yield build
    for cluster in made:
        cluster.stop()


def acknowledged_then_cut(cluster: PowerCutCluster) -> list[bytes]:
    """Writers propose appends until ACKNOWLEDGED_BEFORE_CUT are acknowledged; the power is cut while
    they still write; the nodes stop and the disk comes back. Returns the acknowledged values."""
    cluster.start()
    assert cluster.propose(create(TOPIC, 1))
    acknowledged: list[bytes] = []
    lock = threading.Lock()

    def write(writer: int) -> None:
        sequence = 0
        while not cluster.disk.cut_off:
            value = b"value-%02d-%06d;" % (writer, sequence)
            sequence += 1
            if cluster.propose(append(TOPIC, 0, value)):
                with lock:
                    acknowledged.append(value)

    writers = [threading.Thread(target=write, args=(n,), name=f"writer-{n}") for n in range(WRITERS)]
    for thread in writers:
        thread.start()
    wait_for(lambda: len(acknowledged) >= ACKNOWLEDGED_BEFORE_CUT, "acknowledged appends", WAIT_S)
    cluster.disk.cut()
    for thread in writers:
        thread.join(WAIT_S)
    cluster.stop()
    cluster.disk.restore()
    cluster.start()
    return acknowledged


def test_fsync_mode_keeps_every_acknowledged_entry_through_a_power_cut_of_every_node(
    make_cluster: MakeCluster,
) -> None:
    """fsync mode: with the log compacted every few entries (so the store's sync points matter too),
    every append acknowledged before the cut is in the leader's store after it."""
    cluster = make_cluster("fsync", 10)
    acknowledged = acknowledged_then_cut(cluster)
    stored = cluster.values_on_leader()
    missing = [value for value in acknowledged if value not in stored]
    assert missing == [], f"{len(missing)} of {len(acknowledged)} acknowledged appends lost"


def test_replicated_mode_loses_acknowledged_entries_in_the_same_power_cut(
    make_cluster: MakeCluster,
) -> None:
    """replicated mode, the same run: nothing was synced, so the acknowledged appends are gone. This
    is what --durability=fsync is for, and it shows that the test above depends on the syncs."""
    cluster = make_cluster("replicated", 5_000)
    acknowledged = acknowledged_then_cut(cluster)
    stored = cluster.values_on_leader()
    missing = [value for value in acknowledged if value not in stored]
    assert len(acknowledged) >= ACKNOWLEDGED_BEFORE_CUT and missing != []
