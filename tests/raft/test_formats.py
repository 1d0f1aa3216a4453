"""Versioned on-disk formats of the Raft journal and snapshot: a newer one is refused by name in one
line and left as it is (never taken for a torn file); a store copy of a newer layout stops the node."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from kq.raft.journal import JOURNAL_NAME, MAGIC, JournalFormatError, RaftJournal, encode_record
from kq.raft.snapshot import MAGIC as SNAPSHOT_MAGIC
from kq.raft.snapshot import SNAPSHOT_FORMAT, SnapshotFormatError, SnapshotSerializer, check_snapshot_file
from kq.raft.state_machine import apply
from kq.storage import Store, StoreFormatError
from kq.storage.store import LAYOUT_VERSION
from tests.raft.helpers import append, create
from tests.raft.test_snapshot import CHUNK_BYTES, FakeLog, stream

MAP_BYTES = 64 * 1024**2
RECORDS = encode_record(b"one", 1, 1) + encode_record(b"two", 2, 1)


def ignore(_index: int) -> None:
    """A serializer's `on_restored` that nothing listens to."""


# The journal ---------------------------------------------------------------------------------------


def test_a_journal_of_a_newer_format_is_refused_and_not_cut_as_torn(tmp_path: Path) -> None:
    """KQJRNL02 with records this kq cannot read: one line naming it, and the file keeps every byte
    (it is not taken for a torn file and truncated, nor replaced by an empty journal)."""
    content = b"KQJRNL02" + RECORDS + b"\x00" * 7
    (tmp_path / JOURNAL_NAME).write_bytes(content)
    with pytest.raises(JournalFormatError) as refused:
        RaftJournal(tmp_path, sync=True)
    assert str(refused.value) == (
        f"Raft journal {tmp_path / JOURNAL_NAME} has format 2 (KQJRNL02); this kq reads journal format 1: "
        "upgrade kq"
    )
    assert (tmp_path / JOURNAL_NAME).read_bytes() == content


def test_a_file_that_is_not_a_kq_journal_is_refused_and_not_overwritten(tmp_path: Path) -> None:
    """Unknown bytes where the journal should be: refused as not a kq journal, left as they are."""
    content = b"\x00" * 64
    (tmp_path / JOURNAL_NAME).write_bytes(content)
    with pytest.raises(JournalFormatError, match=r"is not a kq journal") as refused:
        RaftJournal(tmp_path, sync=False)
    assert "\n" not in str(refused.value)
    assert (tmp_path / JOURNAL_NAME).read_bytes() == content


def test_a_journal_file_holding_a_part_of_its_magic_only_starts_empty(tmp_path: Path) -> None:
    """A file created and never written (empty, or a prefix of the magic) holds no entry: a new
    journal replaces it, as before versions were checked."""
    for content in (b"", MAGIC[:5]):
        (tmp_path / JOURNAL_NAME).write_bytes(content)
        journal = RaftJournal(tmp_path, sync=False)
        assert len(journal) == 0
        journal.close()
        assert (tmp_path / JOURNAL_NAME).read_bytes() == MAGIC


# The snapshot --------------------------------------------------------------------------------------


def test_a_snapshot_of_a_newer_format_is_refused_by_name(tmp_path: Path) -> None:
    """KQSNAP03 names its format: the check at start refuses it in one line, loading it refuses it
    too, and the file is left as it is."""
    newer = b"KQSNAP%02d" % (SNAPSHOT_FORMAT + 1)
    path = tmp_path / "raft" / "snapshot"
    path.parent.mkdir()
    content = newer + b"\x00" * 40
    path.write_bytes(content)
    with pytest.raises(SnapshotFormatError) as refused:
        check_snapshot_file(path)
    assert str(refused.value) == (
        f"Raft snapshot {path} has format {SNAPSHOT_FORMAT + 1} ({newer.decode()}); this kq reads snapshot "
        f"formats 1-{SNAPSHOT_FORMAT}: upgrade kq"
    )
    store = Store.open(tmp_path / "store", map_size_bytes=MAP_BYTES)
    try:
        hooks = SnapshotSerializer(store, path, CHUNK_BYTES, FakeLog(), ignore)
        with pytest.raises(SnapshotFormatError, match=f"has format {SNAPSHOT_FORMAT + 1} "):
            hooks.deserialize()
    finally:
        store.close()
    assert path.read_bytes() == content


def test_a_file_that_is_not_a_kq_snapshot_is_refused_and_older_formats_are_read(tmp_path: Path) -> None:
    """Unknown bytes are refused as not a kq snapshot; KQSNAP01 and this kq's own magic pass."""
    path = tmp_path / "snapshot"
    path.write_bytes(b"\x80\x05pickle" + b"\x00" * 8)
    with pytest.raises(SnapshotFormatError, match=r"is not a kq snapshot"):
        check_snapshot_file(path)
    for readable in (b"KQSNAP01", SNAPSHOT_MAGIC):
        path.write_bytes(readable + b"\x00" * 8)
        check_snapshot_file(path)
    check_snapshot_file(tmp_path / "absent")


def test_a_store_copy_of_a_newer_layout_stops_the_follower_with_one_line(tmp_path: Path) -> None:
    """A leader of a newer kq sends a copy of a newer layout: the follower does not restore it, and
    hands `on_fault` (which ends a node) the line naming the layout; its own store is unchanged."""
    source = Store.open(tmp_path / "source", map_size_bytes=MAP_BYTES)
    for index, entry in enumerate([create("t", 1), append("t", 0, b"a")], start=1):
        apply(source, index, entry)
    with source._environment.begin(write=True) as transaction:  # What a newer kq's store holds.
        transaction.put(b"layout", struct.pack(">Q", LAYOUT_VERSION + 1), db=source._databases[b"meta"])
    behind = Store.open(tmp_path / "behind", map_size_bytes=MAP_BYTES)
    (tmp_path / "leader").mkdir()
    (tmp_path / "follower").mkdir()
    faults: list[str] = []
    sender = SnapshotSerializer(source, tmp_path / "leader" / "snapshot", CHUNK_BYTES, FakeLog(), ignore)
    receiver = SnapshotSerializer(
        behind, tmp_path / "follower" / "snapshot", CHUNK_BYTES, FakeLog(), ignore, on_fault=faults.append
    )
    try:
        stream(sender, receiver)
        with pytest.raises(StoreFormatError):
            receiver.deserialize()
        assert len(faults) == 1 and "\n" not in faults[0]
        assert faults[0].startswith("cannot restore the leader's copy at applied index 2: its store ")
        supported = f"1-{LAYOUT_VERSION}"
        assert faults[0].endswith(
            f"has layout {LAYOUT_VERSION + 1}; this kq reads layouts {supported}: upgrade kq"
        )
        assert behind.applied_index() == 0
    finally:
        sender.close()
        receiver.close()
        source.close()
        behind.close()
