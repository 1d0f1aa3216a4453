"""A store of a newer layout is refused at open by name, in one line, and left byte for byte."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from kq.storage import Store, StoreFormatError
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
