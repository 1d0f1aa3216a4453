"""What a node's data directory takes on disk, split into the parts that grow for different reasons.

A kq node's `--data-dir` holds its LMDB environment (`store/data.mdb`, which never shrinks: LMDB
reuses freed pages inside the file but does not give them back), the Raft journal
(`raft/journal.kq` and `journal.kq.meta`, rewritten smaller at each log compaction), the snapshot
header and, while a follower is being sent a full snapshot, a copy of the store. The soak
(`bench.soak`) samples these every few seconds to show whether retention keeps a node's disk bounded.

Sizes are file sizes (`st_size`, what `ls -l` shows) and, separately, the blocks the files occupy
(`st_blocks`, what `du` shows), which differ for sparse or preallocated files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

LMDB_DATA_FILE = "data.mdb"
JOURNAL_PREFIX = "journal"  # raft/journal.kq and its .meta; PySyncObj's old `journal` file too.
BLOCK_BYTES = 512  # The unit of st_blocks, whatever the file system's block size.
WALK_ENTRIES_MAX = 100_000  # A data directory holds a handful of files; this only bounds a runaway walk.


@dataclass(frozen=True, slots=True)
class DiskUsage:
    """One data directory at one moment; every figure in bytes."""

    total_bytes: int  # Sum of the file sizes under the directory.
    allocated_bytes: int  # Sum of the blocks those files occupy.
    lmdb_bytes: int  # The LMDB data file(s), `data.mdb`.
    journal_bytes: int  # The Raft journal and its metadata.
    files: int

    @property
    def other_bytes(self) -> int:
        """Everything else: snapshot header, LMDB lock file, a store copy being sent."""
        return self.total_bytes - self.lmdb_bytes - self.journal_bytes


def classify(name: str) -> str:
    """Which part of a data directory a file of this name belongs to: "lmdb", "journal" or "other"."""
    if name == LMDB_DATA_FILE:
        return "lmdb"
    if name.startswith(JOURNAL_PREFIX):
        return "journal"
    return "other"


def measure(directory: Path) -> DiskUsage:
    """Walks `directory` (without following symbolic links); files removed meanwhile are skipped.

    A missing directory measures as empty (a node that has not written yet).
    """
    sizes = {"lmdb": 0, "journal": 0, "other": 0}
    allocated = 0
    files = 0
    pending = [directory]
    seen = 0
    while pending and seen < WALK_ENTRIES_MAX:
        current = pending.pop()
        try:
            entries = list(os.scandir(current))
        except (FileNotFoundError, NotADirectoryError):
            continue  # Removed meanwhile (a snapshot copy that was sent and deleted).
        for entry in entries:
            seen += 1
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
                    continue
                if not entry.is_file(follow_symlinks=False):
                    continue
                status = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            sizes[classify(entry.name)] += status.st_size
            allocated += status.st_blocks * BLOCK_BYTES
            files += 1
    return DiskUsage(
        total_bytes=sum(sizes.values()),
        allocated_bytes=allocated,
        lmdb_bytes=sizes["lmdb"],
        journal_bytes=sizes["journal"],
        files=files,
    )
