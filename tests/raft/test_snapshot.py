"""Snapshot hooks: a written snapshot restores a wiped store, never moves a store back, detects damage."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from raft.snapshot import FAILED, NOT_SERIALIZING, SERIALIZING, SUCCESS, SnapshotHooks
from raft.state_machine import apply
from storage import SnapshotError, Store
from tests.raft.helpers import append, create

RAFT_DATA = (("entry-1", 3, 1), ("entry-0", 2, 1), {"127.0.0.1:1"})


def make_store(path: Path) -> Store:
    return Store.open(path, map_size_bytes=64 * 1024**2)


def finished_state(hooks: SnapshotHooks) -> int:
    """Polls `check` until the copying thread has finished (10 s at most); returns its final state."""
    deadline = time.monotonic() + 10
    state = hooks.check()
    while state == SERIALIZING and time.monotonic() < deadline:
        time.sleep(0.01)
        state = hooks.check()
    return state


def write_snapshot(store: Store, file_name: Path, scratch: Path) -> None:
    hooks = SnapshotHooks(store, scratch, lambda index: None)
    hooks.serialize(str(file_name), RAFT_DATA)
    assert finished_state(hooks) == SUCCESS
    assert hooks.check() == NOT_SERIALIZING  # SUCCESS is reported once.


@pytest.fixture
def source(tmp_path: Path) -> Store:
    store = make_store(tmp_path / "source")
    for index, entry in enumerate([create("t", 2), append("t", 0, b"a"), append("t", 1, b"b")], start=1):
        apply(store, index, entry)
    return store


def test_snapshot_restores_a_wiped_store(source: Store, tmp_path: Path) -> None:
    """A follower with an empty store gets identical state and PySyncObj its header back."""
    write_snapshot(source, tmp_path / "snapshot", tmp_path)
    restored_at: list[int] = []
    wiped = make_store(tmp_path / "wiped")
    hooks = SnapshotHooks(wiped, tmp_path, restored_at.append)
    assert hooks.deserialize(str(tmp_path / "snapshot")) == RAFT_DATA
    assert wiped.dump() == source.dump()
    assert restored_at == [3]


def test_snapshot_never_moves_a_store_backwards(source: Store, tmp_path: Path) -> None:
    """A store already past the snapshot's index keeps its own (newer) state."""
    write_snapshot(source, tmp_path / "snapshot", tmp_path)
    apply(source, 4, append("t", 0, b"newer"))
    before = source.dump()
    SnapshotHooks(source, tmp_path, lambda index: None).deserialize(str(tmp_path / "snapshot"))
    assert source.dump() == before


def test_damaged_snapshot_is_refused(source: Store, tmp_path: Path) -> None:
    """A cut-short or bit-flipped data section is refused; the behind store is left untouched."""
    write_snapshot(source, tmp_path / "snapshot", tmp_path)
    whole = (tmp_path / "snapshot").read_bytes()
    damaged = bytearray(whole)
    damaged[-20] ^= 0xFF
    for name, content in (("short", whole[:-100]), ("flipped", bytes(damaged))):
        (tmp_path / name).write_bytes(content)
        behind = make_store(tmp_path / f"behind-{name}")
        with pytest.raises(SnapshotError):
            SnapshotHooks(behind, tmp_path, lambda index: None).deserialize(str(tmp_path / name))
        assert behind.applied_index() == 0


def test_header_only_file_serves_a_store_that_is_ahead(source: Store, tmp_path: Path) -> None:
    """A snapshot cut short by a crash still gives PySyncObj its header when the local store is ahead."""
    write_snapshot(source, tmp_path / "snapshot", tmp_path)
    whole = (tmp_path / "snapshot").read_bytes()
    (tmp_path / "partial").write_bytes(whole[: len(whole) // 2])
    hooks = SnapshotHooks(source, tmp_path, lambda index: None)
    assert hooks.deserialize(str(tmp_path / "partial")) == RAFT_DATA


def test_failed_serialization_is_reported_once(source: Store, tmp_path: Path) -> None:
    """A snapshot that cannot be written reports FAILED once, so PySyncObj can try again later."""
    hooks = SnapshotHooks(source, tmp_path / "missing-dir", lambda index: None)
    hooks.serialize(str(tmp_path / "snapshot"), RAFT_DATA)
    assert finished_state(hooks) == FAILED
    assert hooks.check() == NOT_SERIALIZING
