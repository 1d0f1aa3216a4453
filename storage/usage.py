"""How much of its bound and of its disk a store uses: what the leader's disk-bound check reads.

LMDB never shrinks its file: pages that deletes free go to its free list and are reused before the
file grows again. So the bytes the store holds are the pages its databases use (each database's
branch, leaf and overflow pages, plus the two meta pages), not the file's size; the file's
high-water mark only says how much of the disk it already took. LMDB does not report the free list's
own pages, nor the freed pages that a long read transaction still pins (a store copy for a
follower): both count as free here, which the headroom above the measure covers
(proto/limits.py, "disk bounds").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

META_PAGES = 2  # LMDB's two meta pages, at the start of every environment.


@dataclass(frozen=True, slots=True)
class StoreUsage:
    """One measure of a store and of the filesystem holding it, in bytes."""

    map_bytes: int  # LMDB's map: the store cannot grow past it (the node's --max-disk-bytes).
    used_bytes: int  # Pages the databases hold.
    file_bytes: int  # The file's high-water mark: freed pages below it are reused before it grows.
    filesystem_free_bytes: int  # Free to an unprivileged writer on the data directory's filesystem.


def measure(environment: Any, databases: dict[bytes, Any], path: Path) -> StoreUsage:
    """Measures the environment (one short read transaction) and its filesystem (one statvfs)."""
    info = environment.info()
    page_bytes = int(environment.stat()["psize"])
    pages = META_PAGES + _pages(environment.stat())
    with environment.begin(write=False) as transaction:
        pages += sum(_pages(transaction.stat(database)) for database in databases.values())
    return StoreUsage(
        map_bytes=int(info["map_size"]),
        used_bytes=pages * page_bytes,
        file_bytes=(int(info["last_pgno"]) + 1) * page_bytes,
        filesystem_free_bytes=filesystem_free_bytes(path),
    )


def filesystem_free_bytes(path: Path) -> int:
    """Bytes an unprivileged process may still write on the filesystem holding `path`."""
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def _pages(stat: dict[str, int]) -> int:
    return int(stat["branch_pages"]) + int(stat["leaf_pages"]) + int(stat["overflow_pages"])
