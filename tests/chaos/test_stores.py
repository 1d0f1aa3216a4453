"""The store comparison: replicas fed one log match; a differing row, or a node behind, is told apart."""

from __future__ import annotations

from pathlib import Path

from kq.chaos.stores import compare_stores
from kq.raft.state_machine import apply
from kq.storage import Store
from tests.raft.helpers import append, create

MAP_BYTES = 64 * 1024**2


def _replica(path: Path, entries: list[bytes]) -> Path:
    """A store at `path` that applied `entries` from index 1, closed (as a stopped node leaves it)."""
    store = Store.open(path, map_size_bytes=MAP_BYTES)
    for index, entry in enumerate(entries, start=1):
        apply(store, index, entry)
    store.close()
    return path


def test_replicas_of_one_log_compare_equal(tmp_path: Path) -> None:
    """Three stores that applied the same entries: no anomaly, all three compared."""
    log = [create("t", 2), append("t", 0, b"a", b"b"), append("t", 1, b"c")]
    stores = {node: _replica(tmp_path / node, log) for node in ("1", "2", "4")}
    comparison = compare_stores(stores)
    assert comparison.anomalies == [] and comparison.notes == []
    assert comparison.compared == 3


def test_a_different_row_at_the_same_index_is_a_divergence(tmp_path: Path) -> None:
    """Same index, different contents (a record's bytes): a store-divergence naming the database."""
    left = _replica(tmp_path / "1", [create("t", 1), append("t", 0, b"a")])
    right = _replica(tmp_path / "2", [create("t", 1), append("t", 0, b"z")])
    comparison = compare_stores({"1": left, "2": right})
    assert [anomaly.kind for anomaly in comparison.anomalies] == ["store-divergence"]
    assert comparison.anomalies[0].nodes == ("1", "2")
    assert "records row" in comparison.anomalies[0].detail


def test_a_node_at_another_index_is_noted_not_compared(tmp_path: Path) -> None:
    """A node stopped before it applied the last entry is left out of the comparison, with a note."""
    log = [create("t", 1), append("t", 0, b"a")]
    stores = {
        "1": _replica(tmp_path / "1", log),
        "2": _replica(tmp_path / "2", log),
        "3": _replica(tmp_path / "3", log[:1]),
    }
    comparison = compare_stores(stores)
    assert comparison.anomalies == [] and comparison.compared == 2
    assert len(comparison.notes) == 1 and "index 1 on node(s) 3" in comparison.notes[0]
