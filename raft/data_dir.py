"""A node's data directory: its layout, the marker naming the layout's version, and `open_data_dir`,
the one function through which a node opens it (broker/main.py `BrokerNode`).

Layout 1 (DATA_DIR_LAYOUT), one Raft group per node:

    <data dir>/kq-format.json      {"data_dir_layout": 1}: this file, written at first start
    <data dir>/store/              the LMDB store (storage/; its own layout version in its `meta` db)
    <data dir>/raft/journal.kq     the Raft journal (raft/journal.py; its format in its magic)
    <data dir>/raft/journal.kq.meta
    <data dir>/raft/snapshot       the Raft snapshot (raft/snapshot.py; its format in its magic)

`open_data_dir` reads every format version first and writes nothing until all of them are ones this
kq reads: a newer one (or a file that is not kq's) raises a `FormatError` whose message is the one
line the node exits with. A data directory without the marker was written by a kq from before it
(layout 1, which it is): it gets the marker once its store opened. The marker is written by a
synced temporary file renamed over it, then the directory is synced, so it is whole or absent.

Issue 37's layout (a metadata group and data groups, each with its own journal, snapshots and store)
is layout 2: a kq that writes it reads the marker here to tell layout 1, which it moves in place, from
its own (DESIGN.md, "On-disk formats and versions").
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from kq.raft.journal import OS_DISK, check_journal_file
from kq.raft.snapshot import check_snapshot_file
from kq.storage import FormatError, Store

logger = logging.getLogger(__name__)

DATA_DIR_LAYOUT = 1  # One Raft group per node: `store/` and `raft/` directly under the data directory.
MARKER_NAME = "kq-format.json"
_LAYOUT_KEY = "data_dir_layout"


class DataDirFormatError(FormatError):
    """The data directory's marker names a newer layout than DATA_DIR_LAYOUT, or is not kq's."""


def read_layout(data_dir: Path) -> int | None:
    """The layout the data directory's marker names, None without a marker; DataDirFormatError if the
    marker is not one or names a layout newer than this kq's."""
    marker = data_dir / MARKER_NAME
    try:
        raw = marker.read_bytes()
    except FileNotFoundError:
        return None
    try:
        layout = json.loads(raw)[_LAYOUT_KEY]
    except (ValueError, TypeError, KeyError) as error:
        raise DataDirFormatError(
            f"data directory {data_dir}: {MARKER_NAME} is not a kq format marker ({type(error).__name__}); "
            f'this kq reads {{"{_LAYOUT_KEY}": {DATA_DIR_LAYOUT}}} and leaves the directory as it is'
        ) from error
    if not isinstance(layout, int) or isinstance(layout, bool) or layout < 1:
        raise DataDirFormatError(
            f"data directory {data_dir}: {MARKER_NAME} names no layout ({_LAYOUT_KEY}: {layout!r}); "
            f"this kq reads layout {DATA_DIR_LAYOUT} and leaves the directory as it is"
        )
    if layout > DATA_DIR_LAYOUT:
        raise DataDirFormatError(
            f"data directory {data_dir} has layout {layout} ({MARKER_NAME}); this kq reads data directory "
            f"layout {DATA_DIR_LAYOUT}: upgrade kq"
        )
    return layout


def check_data_dir(data_dir: Path) -> int | None:
    """Raises a FormatError (one line) unless this kq reads the marker, the journal and the snapshot
    of the data directory; reads only. Returns the marker's layout (None: no marker yet)."""
    layout = read_layout(data_dir)
    check_journal_file(data_dir / "raft")
    check_snapshot_file(data_dir / "raft" / "snapshot")
    return layout


def open_data_dir(data_dir: Path, map_size_bytes: int, sync: bool) -> Store:
    """Opens the node's store in `data_dir` (creating the directory) once every format in it is one
    this kq reads (`check_data_dir`, then `Store.open`, which refuses a newer store before it writes),
    and marks the directory with its layout if it has no marker yet. Raises a FormatError otherwise,
    having written nothing. `sync`: the store's (`--durability=fsync`)."""
    layout = check_data_dir(data_dir)
    store = Store.open(data_dir / "store", map_size_bytes, sync=sync)
    if layout is None:
        try:
            write_marker(data_dir)
        except BaseException:
            store.close()
            raise
        logger.info("data directory %s marked with layout %d (%s)", data_dir, DATA_DIR_LAYOUT, MARKER_NAME)
    return store


def write_marker(data_dir: Path) -> None:
    """Writes the marker of this kq's layout, durably: a synced temporary file renamed over it, then
    the directory synced."""
    content = json.dumps({_LAYOUT_KEY: DATA_DIR_LAYOUT}).encode() + b"\n"
    OS_DISK.replace(data_dir / MARKER_NAME, content, sync=True)
