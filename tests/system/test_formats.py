"""A real node refuses a data directory of a newer format: it exits non-zero with one line, no
traceback, and writes nothing there."""

from __future__ import annotations

from pathlib import Path

import pytest

from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for
from kq.raft.data_dir import MARKER_NAME

EXIT_WAIT_S = 60.0  # A node process's start (imports) on a busy 2-core machine; it exits at once after.
# What a newer kq left: a marker of issue 37's layout, or today's layout with a journal of format 2.
NEWER = {
    "marker": {MARKER_NAME: b'{"data_dir_layout": 2}\n'},
    "journal": {"raft/journal.kq": b"KQJRNL02" + bytes(40)},
}


def expected_line(newer: str, data_dir: Path) -> str:
    if newer == "marker":
        return (
            f"data directory {data_dir} has layout 2 ({MARKER_NAME}); this kq reads data directory layout 1: "
            "upgrade kq"
        )
    return (
        f"Raft journal {data_dir / 'raft/journal.kq'} has format 2 (KQJRNL02); this kq reads journal "
        "format 1: upgrade kq"
    )


@pytest.mark.parametrize("newer", sorted(NEWER))
def test_a_node_on_a_data_directory_of_a_newer_format_exits_with_one_line(tmp_path: Path, newer: str) -> None:
    """kq-node started on a data directory a newer kq wrote: exit status 1, its last line names what
    it found and what it reads, no traceback; the directory holds the same files, byte for byte (no
    store, no marker written)."""
    cluster = LocalCluster(tmp_path / "cluster", size=1)
    data_dir = cluster.nodes["1"].data_dir
    for name, content in NEWER[newer].items():
        (data_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (data_dir / name).write_bytes(content)
    try:
        cluster.start_node("1")
        wait_for(lambda: not cluster.running("1"), "node 1 to exit", EXIT_WAIT_S)
        assert cluster.exit_code("1") == 1
    finally:
        cluster.stop()
    log = cluster.log_path("1").read_text()
    lines = [line for line in log.splitlines() if line.strip()]
    assert lines[-1] == expected_line(newer, data_dir), log
    assert "Traceback" not in log, log
    files = {
        str(path.relative_to(data_dir)): path.read_bytes() for path in data_dir.rglob("*") if path.is_file()
    }
    assert files == NEWER[newer]
