"""A node's data directory: marked with its layout at first start and the marker kept; today's
directory without a marker accepted and marked; a newer layout, or a newer format inside, refused by
name in one line with nothing written."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from kq.raft.data_dir import DATA_DIR_LAYOUT, MARKER_NAME, DataDirFormatError, open_data_dir
from kq.raft.journal import JOURNAL_NAME, RaftJournal
from kq.raft.snapshot import SNAPSHOT_FORMAT
from kq.storage import FormatError, Store
from kq.storage.store import LAYOUT_VERSION
from tests.raft.test_formats import MAP_BYTES, RECORDS


def tree(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` and its bytes (LMDB's lock file aside: LMDB's, not a format)."""
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name != "lock.mdb"
    }


def test_a_new_data_directory_is_marked_at_first_start_and_the_marker_kept(tmp_path: Path) -> None:
    """First open writes the marker of this kq's layout; later opens read it and leave it as it is."""
    data_dir = tmp_path / "node"
    open_data_dir(data_dir, MAP_BYTES, sync=False).close()
    marker = data_dir / MARKER_NAME
    assert json.loads(marker.read_bytes()) == {"data_dir_layout": DATA_DIR_LAYOUT}
    assert not list(data_dir.glob("*.tmp"))
    written = marker.stat().st_mtime_ns, marker.read_bytes()
    open_data_dir(data_dir, MAP_BYTES, sync=True).close()
    assert (marker.stat().st_mtime_ns, marker.read_bytes()) == written


def test_a_data_directory_of_today_without_a_marker_is_accepted_and_marked(tmp_path: Path) -> None:
    """A data directory written before the marker existed (store and journal, no marker) is layout 1:
    its store opens with its rows, and it gets the marker."""
    data_dir = tmp_path / "node"
    store = Store.open(data_dir / "store", map_size_bytes=MAP_BYTES)
    with store.write() as writer:
        writer.create_topic("kept", 1, 0)
    store.close()
    (data_dir / "raft").mkdir()
    RaftJournal(data_dir / "raft", sync=False).close()
    store = open_data_dir(data_dir, MAP_BYTES, sync=False)
    try:
        with store.read() as reader:
            assert reader.topic("kept") is not None
    finally:
        store.close()
    assert json.loads((data_dir / MARKER_NAME).read_bytes()) == {"data_dir_layout": DATA_DIR_LAYOUT}


def test_a_data_directory_of_a_newer_layout_is_refused_and_nothing_written(tmp_path: Path) -> None:
    """A marker of layout 2 (issue 37's many groups): one line naming it; no store, no journal, no
    marker rewrite."""
    data_dir = tmp_path / "node"
    data_dir.mkdir()
    (data_dir / MARKER_NAME).write_bytes(b'{"data_dir_layout": 2}\n')
    with pytest.raises(DataDirFormatError) as refused:
        open_data_dir(data_dir, MAP_BYTES, sync=False)
    assert str(refused.value) == (
        f"data directory {data_dir} has layout 2 ({MARKER_NAME}); this kq reads data directory layout 1: "
        "upgrade kq"
    )
    assert tree(data_dir) == {MARKER_NAME: b'{"data_dir_layout": 2}\n'}


@pytest.mark.parametrize(
    "marker",
    [b"", b"not json", b"[]", b'{"other": 1}', b'{"data_dir_layout": "1"}', b'{"data_dir_layout": 0}'],
)
def test_a_marker_that_is_not_kqs_is_refused(tmp_path: Path, marker: bytes) -> None:
    """A marker this kq cannot read names no layout it knows: refused in one line, left as it is."""
    (tmp_path / MARKER_NAME).write_bytes(marker)
    with pytest.raises(DataDirFormatError) as refused:
        open_data_dir(tmp_path, MAP_BYTES, sync=False)
    assert "\n" not in str(refused.value) and MARKER_NAME in str(refused.value)
    assert tree(tmp_path) == {MARKER_NAME: marker}


@pytest.mark.parametrize("newer", ["store", "journal", "snapshot"])
def test_a_newer_format_inside_refuses_the_data_directory_before_it_is_marked(
    tmp_path: Path, newer: str
) -> None:
    """A data directory without a marker holding a newer store, journal or snapshot is refused by that
    format's line; nothing is written (no marker, no store created, the files as they were)."""
    data_dir = tmp_path / "node"
    raft_dir = data_dir / "raft"
    raft_dir.mkdir(parents=True)
    if newer == "store":
        store = Store.open(data_dir / "store", map_size_bytes=MAP_BYTES)
        with store._environment.begin(write=True) as transaction:
            transaction.put(b"layout", struct.pack(">Q", LAYOUT_VERSION + 1), db=store._databases[b"meta"])
        store.close()
    elif newer == "journal":
        (raft_dir / JOURNAL_NAME).write_bytes(b"KQJRNL02" + RECORDS)
    else:
        (raft_dir / "snapshot").write_bytes(b"KQSNAP%02d" % (SNAPSHOT_FORMAT + 1))
    before = tree(data_dir)
    with pytest.raises(FormatError) as refused:
        open_data_dir(data_dir, MAP_BYTES, sync=False)
    assert "\n" not in str(refused.value) and str(refused.value).endswith(": upgrade kq")
    assert tree(data_dir) == before
    assert not (data_dir / MARKER_NAME).exists()
