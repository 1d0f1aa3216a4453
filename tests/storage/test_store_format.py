"""A store of a newer layout is refused at open by name, in one line, and left byte for byte; rows of an
older format read and upgrade in place."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from kq.storage import ProducerAppend, Store, StoreFormatError
from kq.storage.store import LAYOUT_VERSION

MAP_BYTES = 64 * 1024**2


def store_of_layout(path: Path, layout: int) -> None:
    """A closed store whose `meta` row b"layout" says `layout` (as a newer kq would write it)."""
    store = Store.open(path, map_size_bytes=MAP_BYTES)
    with store.write() as writer:
        writer.create_topic("t", 1, 0)
    with store._environment.begin(write=True) as transaction:
        transaction.put(b"layout", struct.pack(">Q", layout), db=store._databases[b"meta"])
    store.close()


def test_a_store_of_a_newer_layout_is_refused_and_left_untouched(tmp_path: Path) -> None:
    """Opening it raises StoreFormatError naming the path, the layout found and the layouts read; the
    data file is the same bytes afterwards (no upgrade write, no database created)."""
    path = tmp_path / "store"
    newer = LAYOUT_VERSION + 1
    store_of_layout(path, newer)
    before = (path / "data.mdb").read_bytes()
    with pytest.raises(StoreFormatError) as refused:
        Store.open(path, map_size_bytes=MAP_BYTES)
    assert str(refused.value) == (
        f"store {path} has layout {newer}; this kq reads layouts 1-{LAYOUT_VERSION}: upgrade kq"
    )
    assert (path / "data.mdb").read_bytes() == before
    with pytest.raises(StoreFormatError):  # Refused again: the first refusal left it as it was.
        Store.open(path, map_size_bytes=MAP_BYTES, upgrade=False)


def test_a_store_of_the_current_layout_opens(tmp_path: Path) -> None:
    """The refusal is for newer layouts only: this kq's own store opens and keeps its rows."""
    store_of_layout(tmp_path / "store", LAYOUT_VERSION)
    store = Store.open(tmp_path / "store", map_size_bytes=MAP_BYTES)
    try:
        with store.read() as reader:
            assert reader.topic("t") is not None
    finally:
        store.close()


_OLD_PRODUCER_ROW = struct.Struct(">HBIIQ")  # epoch, count 1, one append: a row from before its time.


def test_producer_rows_from_before_their_time_read_unstamped_and_upgrade_in_place(tmp_path: Path) -> None:
    """`producers` rows gained a trailing last_append_ms (storage/__init__.py): a store of a kq from
    before it (here of layout 1, keyed producer first, so the open re-keys it too) opens with every
    window readable, unstamped; the next append rewrites the row stamped, and that row's head is still
    the old row (a kq from before reads it alike: its epoch, count and appends, nothing after)."""
    path = tmp_path / "store"
    store = Store.open(path, map_size_bytes=MAP_BYTES)
    old_row = _OLD_PRODUCER_ROW.pack(3, 1, 7, 2, 40)
    with store._environment.begin(write=True) as transaction:
        transaction.delete(b"layout", db=store._databases[b"meta"])  # Layout 1: no row.
        old_key = struct.pack(">QQI", 9, 1, 0)  # producer 9, topic 1, partition 0 (layout 1's order).
        transaction.put(old_key, old_row, db=store._databases[b"producers"])
    store.close()
    store = Store.open(path, map_size_bytes=MAP_BYTES)
    try:
        with store.read() as reader:
            window = reader.producer_window(9, 1, 0)
        assert window is not None and window.last_append_ms is None
        assert (window.epoch, window.appends) == (3, (ProducerAppend(7, 2, 40),))
        with store.write() as writer:
            writer.remember_producer_append(9, 1, 0, 3, ProducerAppend(9, 1, 42), window, appended_ms=123)
            stamped = writer.producer_window(9, 1, 0)
        assert stamped is not None and stamped.last_append_ms == 123
        assert stamped.appends == (ProducerAppend(7, 2, 40), ProducerAppend(9, 1, 42))
        rows = [row for row in store.dump() if row[0] == b"producers"]
        assert [row[1] for row in rows] == [struct.pack(">QIQ", 1, 0, 9)]
        raw = rows[0][2]
        epoch, count = struct.unpack_from(">HB", raw)
        assert (epoch, count, len(raw)) == (3, 2, 3 + 16 * 2 + 8)
        assert struct.unpack_from(">q", raw, 3 + 16 * 2) == (123,)
    finally:
        store.close()
