"""The final members' LMDB stores, compared byte for byte after the nodes stopped.

Every named database of `kq.storage.store.DATABASE_NAMES` is compared, row by row, `meta` included:
its rows (applied_index, next_topic_id, next_producer_id, rejected_entries, layout, cluster_id; see
`kq.storage`) are written by `apply`, or alike by every node opening its store, so none of them holds
a per-node value. What is a node's own (its id, addresses, the Raft journal under `raft/`) lives
outside the store. So there is nothing to exclude.

Stores are compared only among nodes that applied the same Raft index: a node stopped a moment before
it applied a last background entry (a trim or a compaction the leader proposed after the final read)
differs for that reason alone, which a note reports. Two stores that applied the same index must hold
the same bytes: "same state, same input, same output" is the contract of `apply`.

The stores are opened read-only, without LMDB's lock file, once every node has stopped: the check
never writes to a node's data, which is kept as it was when a run fails.
"""

from __future__ import annotations

import itertools
import struct
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb

from kq.chaos.checker import Anomaly
from kq.storage.store import DATABASE_NAMES, MAX_DATABASES

APPLIED_INDEX_KEY = b"applied_index"  # In `meta`: u64, big-endian (the layout in kq/storage/__init__.py).
_U64 = struct.Struct(">Q")
KEY_SHOWN_BYTES = 32  # Of a differing row's key, in hex, in the anomaly's detail.


@dataclass(slots=True)
class StoreComparison:
    """Differences found (one anomaly per pair of nodes), how many stores were compared, and notes."""

    anomalies: list[Anomaly] = field(default_factory=list)
    compared: int = 0  # Stores compared with at least one other at the same applied index.
    notes: list[str] = field(default_factory=list)


def compare_stores(stores: Mapping[str, Path]) -> StoreComparison:
    """Compares the stores (node id -> the store's directory, `<data dir>/store`) of stopped nodes."""
    comparison = StoreComparison()
    missing = [node for node, path in stores.items() if not (path / "data.mdb").is_file()]
    if missing:
        comparison.notes.append(f"no store to compare on node(s) {', '.join(missing)}")
    environments = {node: _open(path) for node, path in stores.items() if node not in missing}
    try:
        by_index: dict[int, list[str]] = defaultdict(list)
        for node, environment in environments.items():
            by_index[_applied_index(environment)].append(node)
        if len(by_index) > 1:
            indexes = "; ".join(
                f"index {index} on node(s) {','.join(group)}" for index, group in by_index.items()
            )
            comparison.notes.append(f"stores compared only among nodes at the same applied index: {indexes}")
        for index, nodes in by_index.items():
            if len(nodes) < 2:
                continue
            comparison.compared += len(nodes)
            reference = nodes[0]
            for node in nodes[1:]:
                difference = _first_difference(environments[reference], environments[node], reference, node)
                if difference is not None:
                    comparison.anomalies.append(
                        Anomaly(
                            "store-divergence",
                            f"nodes {reference} and {node}, both at applied index {index}: {difference}",
                            nodes=(reference, node),
                        )
                    )
    finally:
        for environment in environments.values():
            environment.close()
    return comparison


def _open(path: Path) -> Any:
    """The environment at `path`, read-only and without the lock file (its node has stopped)."""
    return lmdb.open(str(path), readonly=True, lock=False, max_dbs=MAX_DATABASES, subdir=True)


def _applied_index(environment: Any) -> int:
    with environment.begin() as transaction:
        meta = environment.open_db(b"meta", txn=transaction, create=False)
        raw = transaction.get(APPLIED_INDEX_KEY, db=meta)
    return 0 if raw is None else int(_U64.unpack(raw)[0])


def _first_difference(left: Any, right: Any, left_node: str, right_node: str) -> str | None:
    """Where the two stores first differ (database, key, which side), or None when they are identical."""
    with left.begin() as left_txn, right.begin() as right_txn:
        for name in DATABASE_NAMES:
            left_rows = left_txn.cursor(db=left.open_db(name, txn=left_txn, create=False))
            right_rows = right_txn.cursor(db=right.open_db(name, txn=right_txn, create=False))
            for left_row, right_row in itertools.zip_longest(left_rows, right_rows):
                if left_row == right_row:
                    continue
                database = name.decode()
                if right_row is None or (left_row is not None and bytes(left_row[0]) < bytes(right_row[0])):
                    return f"{database} row {_key(left_row[0])} only on node {left_node}"
                if left_row is None or bytes(right_row[0]) < bytes(left_row[0]):
                    return f"{database} row {_key(right_row[0])} only on node {right_node}"
                return f"{database} row {_key(left_row[0])} holds different values"
    return None


def _key(key: bytes) -> str:
    raw = bytes(key)
    shown = raw[:KEY_SHOWN_BYTES].hex()
    return f"key {shown}{'...' if len(raw) > KEY_SHOWN_BYTES else ''}"
