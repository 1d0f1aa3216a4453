"""The LMDB growth replay (`bench.lmdb_growth`): retention's trim rule and its per-minute rows (not sizes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kq.bench.lmdb_growth import PARTITIONS, main, simulate, stored_value_sizes


def test_simulation_trims_each_partition_to_its_bound_and_reports_every_minute(tmp_path: Path) -> None:
    """Two minutes of small values kept to 64 KiB a partition: two rows, held within one value of it."""
    rows = simulate(tmp_path, [1000, 3000, 9000], 2, keep_bytes=64 * 1024, batches_per_round=40)
    assert [row.minute for row in rows] == [1, 2]
    for row in rows:
        assert PARTITIONS * 64 * 1024 <= row.held_bytes <= PARTITIONS * (64 * 1024 + 9000)
        assert row.file_bytes >= row.held_bytes
    assert stored_value_sizes(tmp_path)  # What is left reads back as sizes, as from a node's store.


def test_command_reads_sizes_from_a_file_and_leaves_out_those_above_the_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--cap-bytes drops the large sizes before drawing."""
    sizes = tmp_path / "sizes.txt"
    sizes.write_text("500 700\n90000")
    arguments = [
        "--sizes-file",
        str(sizes),
        "--cap-bytes",
        "1000",
        "--minutes",
        "1",
        "--batches-per-round",
        "8",
    ]
    assert main(arguments) == 0
    output = capsys.readouterr().out
    assert "2 sizes, 500..700 bytes" in output and "minute    1:" in output
