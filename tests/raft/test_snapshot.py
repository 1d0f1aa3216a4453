"""Snapshots copy nothing; a store copy streamed to a wiped follower restores it; damage and shutdown safe."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kq.raft.snapshot import NOT_SERIALIZING, SERIALIZING, SUCCESS, RaftData, SnapshotSerializer
from kq.raft.state_machine import apply
from kq.storage import SnapshotError, Store
from tests.raft.helpers import append, create

CHUNK_BYTES = 4096


class FakeLog:
    """PySyncObj's log as the serializer sees it: entries (command, index, term) from `first` on."""

    def __init__(self, first: int = 2) -> None:
        self.first = first
        self.retain_to: int | None = None
        self.responses: dict[Any, float] = {}
        self.matches: dict[Any, int] = {}
        self.last = 3

    def first_index(self) -> int:
        return self.first

    def window(self, index: int) -> RaftData:
        return (f"entry-{index + 1}", index + 1, 1), (f"entry-{index}", index, 1), {"127.0.0.1:1"}

    def compaction_start(self, proposed: int) -> int:
        return proposed if self.retain_to is None else self.retain_to

    def last_response(self, node: Any) -> float:
        return self.responses.get(node, 0.0)

    def match_index(self, node: Any) -> int:
        return self.matches.get(node, 0)

    def last_index(self) -> int:
        return self.last


def make_store(path: Path) -> Store:
    return Store.open(path, map_size_bytes=64 * 1024**2)


def serializer(
    store: Store, directory: Path, log: FakeLog | None = None, restored: Any = None
) -> SnapshotSerializer:
    directory.mkdir(parents=True, exist_ok=True)
    return SnapshotSerializer(
        store, directory / "snapshot", CHUNK_BYTES, log or FakeLog(), restored or (lambda i: None)
    )


@pytest.fixture
def source(tmp_path: Path) -> Store:
    store = make_store(tmp_path / "source")
    values = [b"v" * 3000] * 40  # Several chunks.
    for index, entry in enumerate([create("t", 2), append("t", 0, *values), append("t", 1, b"b")], start=1):
        apply(store, index, entry)
    return store


def stream(sender: SnapshotSerializer, receiver: SnapshotSerializer, node: str = "n") -> int:
    """Pumps chunks as PySyncObj's ticks would until the receiver has the whole copy; returns chunks."""
    deadline = time.monotonic() + 10
    chunks = 0
    while time.monotonic() < deadline:
        data = sender.getTransmissionData(node)
        if data is None:
            time.sleep(0.01)  # The copy thread is still writing: PySyncObj asks again at its next tick.
            continue
        chunks += 1
        if receiver.setTransmissionData(data):
            return chunks
    raise AssertionError("the transmission did not finish")


def test_a_snapshot_writes_only_a_header_whatever_the_store_size(source: Store, tmp_path: Path) -> None:
    """Compaction is a few hundred bytes and reports the log start it chose, exactly once."""
    log = FakeLog()
    log.retain_to = 2  # A slow follower still needs entry 3 on.
    hooks = serializer(source, tmp_path / "raft", log)
    hooks.serialize((None,), 3)
    assert hooks.checkSerializing() == (SUCCESS, 2)
    assert hooks.checkSerializing() == (NOT_SERIALIZING, None)
    size = (tmp_path / "raft" / "snapshot").stat().st_size
    assert size < 1024  # The store holds over 120 KB of records; none of it is copied.
    assert hooks.deserialize() == (None, ("entry-3", 3, 1), ("entry-2", 2, 1), {"127.0.0.1:1"})


def test_a_wiped_follower_gets_a_copy_of_the_store(source: Store, tmp_path: Path) -> None:
    """The copy streams in chunks, compaction waits meanwhile and until the follower restored it (it
    answers again) and holds the entries written while it went out, and the wiped store ends
    byte-identical."""
    log = FakeLog()
    sender = serializer(source, tmp_path / "leader", log)
    restored_at: list[int] = []
    wiped = make_store(tmp_path / "wiped")
    receiver = serializer(wiped, tmp_path / "follower", restored=restored_at.append)
    assert sender.getTransmissionData("n") in (None, (sender._copy.header, True, False))  # type: ignore[union-attr]
    assert sender.checkSerializing() == (SERIALIZING, None)  # No compaction while a copy is sent.
    log.last = 9  # Entries written while the copy went out.
    assert stream(sender, receiver) > 2
    assert sender.checkSerializing() == (SERIALIZING, None)  # The follower is restoring it.
    log.responses["n"] = 1.0  # Its answer, from the restored store.
    log.matches["n"] = 3
    assert sender.checkSerializing() == (SERIALIZING, None)  # It lacks entries 4 to 9 (or so it was).
    assert sender.getTransmissionData("n") is None  # And gets no second copy.
    log.matches["n"] = 3 + 6
    assert sender.checkSerializing() == (NOT_SERIALIZING, None)
    assert receiver.deserialize() == (None, ("entry-3", 3, 1), ("entry-2", 2, 1), {"127.0.0.1:1"})
    assert wiped.dump() == source.dump() and restored_at == [3]
    assert (tmp_path / "follower" / "snapshot").stat().st_size < 1024  # The data now lives in the store.
    assert sender._thread is not None
    sender._thread.join()  # The copy's thread removes it once no follower needs it, and ends.
    assert not list((tmp_path / "leader").glob("snapshot-*"))  # The leader's scratch copy is gone.


def test_a_copy_never_moves_a_store_backwards(source: Store, tmp_path: Path) -> None:
    """A follower already past the copy's index keeps its own, newer state."""
    sender = serializer(source, tmp_path / "leader")
    ahead = make_store(tmp_path / "ahead")
    for index, entry in enumerate(
        [create("t", 2), append("t", 0, b"x"), append("t", 1, b"y"), append("t", 0, b"z")], 1
    ):
        apply(ahead, index, entry)
    before = ahead.dump()
    receiver = serializer(ahead, tmp_path / "follower")
    stream(sender, receiver)
    receiver.deserialize()
    assert ahead.dump() == before


def test_a_damaged_copy_is_refused_and_the_store_left_alone(source: Store, tmp_path: Path) -> None:
    """A bit flipped in transit fails the CRC32C; the behind store is untouched."""
    sender = serializer(source, tmp_path / "leader")
    behind = make_store(tmp_path / "behind")
    receiver = serializer(behind, tmp_path / "follower")
    stream(sender, receiver)
    path = tmp_path / "follower" / "snapshot"
    damaged = bytearray(path.read_bytes())
    damaged[-200] ^= 0xFF
    path.write_bytes(bytes(damaged))
    with pytest.raises(SnapshotError):
        receiver.deserialize()
    assert behind.applied_index() == 0


def test_close_stops_a_copy_and_leaves_no_scratch(source: Store, tmp_path: Path) -> None:
    """Shutdown while a copy is prepared: the thread ends, nothing is left behind, the store can close."""
    sender = serializer(source, tmp_path / "leader")
    sender.getTransmissionData("n")  # Starts kq-snapshot-copy.
    sender.close()
    assert sender._thread is not None and not sender._thread.is_alive()
    assert not list((tmp_path / "leader").glob("snapshot-*"))
    assert sender.getTransmissionData("n") is None  # After close() no copy starts.
    assert [t for t in threading.enumerate() if t.name == "kq-snapshot-copy"] == []
    source.close()


def test_the_serializer_starts_no_thread_until_a_follower_needs_a_copy(source: Store, tmp_path: Path) -> None:
    """Construction and compaction run on the caller's thread; only a store copy has its own."""
    before = set(threading.enumerate())
    hooks = serializer(source, tmp_path / "raft")
    hooks.serialize((None,), 3)
    assert set(threading.enumerate()) == before
    hooks.close()


def test_one_copy_thread_at_a_time(source: Store, tmp_path: Path) -> None:
    """A follower that leaves while its copy is written, then asks again, waits for that thread to end."""
    sender = serializer(source, tmp_path / "leader")
    sender.getTransmissionData("n")
    first = sender._thread
    sender.cancelTransmisstion("n")  # The copy is dropped; its thread may still be writing.
    assert first is not None
    answers = [sender.getTransmissionData("n")]
    if first.is_alive():
        assert answers[0] is None and sender._thread is first
    first.join()
    receiver = serializer(make_store(tmp_path / "wiped"), tmp_path / "follower")
    stream(sender, receiver)  # A new copy, from a new thread, once the first ended.
    assert sender._thread is not None and sender._thread is not first
    sender._thread.join()
    assert not list((tmp_path / "leader").glob("snapshot-*"))  # The dropped copy cleaned up after itself.
    sender.close()
    receiver.close()


def test_a_follower_restoring_a_copy_gets_no_second_one_until_it_answers_or_reconnects(
    source: Store, tmp_path: Path
) -> None:
    """After a whole copy went out, the follower is sent nothing more while it restores (a second copy
    of a large store once started 4 s after the first); its answer ends the wait, and so does a
    disconnect (it may have lost what it was sent)."""
    log = FakeLog()
    sender = serializer(source, tmp_path / "leader", log)
    receiver = serializer(make_store(tmp_path / "wiped"), tmp_path / "follower")
    stream(sender, receiver)
    assert sender.getTransmissionData("n") is None and sender._copy is None
    sender.cancelTransmisstion("n")  # It disconnected.
    assert stream(sender, serializer(make_store(tmp_path / "again"), tmp_path / "f2")) > 2
    log.responses["n"] = 1.0
    log.matches["n"] = log.last
    assert sender.checkSerializing() == (NOT_SERIALIZING, None)


def test_a_copy_goes_out_no_faster_than_the_send_rate(source: Store, tmp_path: Path) -> None:
    """At most two chunks at once, then one chunk per chunk's worth of the rate: PySyncObj sends every
    chunk it is given in one loop of the tick thread, so an unbounded copy held up acknowledgements."""
    directory = tmp_path / "leader"
    directory.mkdir()
    rate = CHUNK_BYTES * 10  # Ten chunks a second.
    sender = SnapshotSerializer(
        source, directory / "snapshot", CHUNK_BYTES, FakeLog(), lambda i: None, send_bytes_per_s=rate
    )
    receiver = serializer(make_store(tmp_path / "wiped"), tmp_path / "follower")
    started = time.monotonic()
    chunks = stream(sender, receiver)
    assert chunks > 5
    # The header and two chunks go at once; every later chunk waited its tenth of a second.
    assert time.monotonic() - started >= (chunks - 4) / 10
