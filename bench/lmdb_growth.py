"""`python -m kq.bench.lmdb_growth`: does an LMDB file level off under append + trim, for given value sizes?

Retention makes each partition a queue: kq appends each batch (storage/__init__.py, the `records`
and `record_pieces` databases) and a trim deletes the oldest ones. LMDB reuses freed pages, but a
value larger than about half a page lives on a run of contiguous *overflow* pages, and LMDB looks for
such a run among its free pages only so far before it extends the file instead: stored whole, batches
of mixed sizes kept the file growing in a 30-minute soak, which is why kq stores a batch in pieces of
one page each. This replays that pattern in one process, with no reader at all (so no read
transaction can pin a freed page), to show what the value sizes alone do to the file, whole
(`--piece-bytes 0`, the default) or in pieces (`--piece-bytes 4080`: kq's, on 4 KiB pages):

- six partitions; each write transaction appends `--batches-per-txn` values whose sizes are drawn
  (seeded) from `--sizes-file` (whitespace-separated byte counts, e.g. a stopped node's stored
  batches: `--sizes-from-store NODE_DATA_DIR/store`), optionally without those above `--cap-bytes`;
- every `--batches-per-round` appends (1,250: about 5 s of the soak's default load) each partition is
  trimmed, oldest first, to at most `--keep-mib` (32), one transaction per partition, as kq's
  retention does every `--retention-check-ms`;
- every 12 rounds (a "minute" of the soak) the size of `data.mdb` and the bytes held are printed.

LMDB is opened the way storage/store.py opens it (no sync, no writemap). The directory is temporary.
"""

from __future__ import annotations

import argparse
import random
import struct
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import lmdb

from kq.storage.records import stored_length_of

PARTITIONS = 6
ROUNDS_PER_MINUTE = 12  # A round stands for 5 s of the soak (its default --retention-check-ms).
MAP_SIZE_BYTES = 1 << 36
MIB = 1024 * 1024
KEY = struct.Struct(">IQI")  # partition, offset, piece: ordered oldest first within a partition.
RECORDS_DATABASE = b"records"  # storage/__init__.py: one stored batch per value.
STORE_DATABASES_MAX = 16


@dataclass(frozen=True, slots=True)
class Minute:
    """The file after one simulated minute."""

    minute: int
    file_bytes: int
    held_bytes: int  # Bytes of the values still stored.


def stored_value_sizes(store_dir: Path) -> list[int]:
    """The sizes of every batch in a stopped node's store (opened read-only, without the lock file)."""
    environment = lmdb.open(
        str(store_dir), readonly=True, lock=False, max_dbs=STORE_DATABASES_MAX, subdir=True
    )
    try:
        database = environment.open_db(RECORDS_DATABASE, create=False)
        with environment.begin(db=database) as transaction:
            return [stored_length_of(value) for _, value in transaction.cursor()]
    finally:
        environment.close()


def simulate(
    directory: Path,
    sizes: Sequence[int],
    minutes: int,
    *,
    keep_bytes: int = 32 * MIB,
    batches_per_txn: int = 4,
    batches_per_round: int = 1_250,
    seed: int = 1,
    piece_bytes: int = 0,
    report: Callable[[Minute], None] | None = None,
) -> list[Minute]:
    """Appends and trims in an LMDB environment created in `directory`; returns one row per minute.

    `piece_bytes` > 0 stores each value in pieces of at most that many bytes, one LMDB value each (as
    storage/store.py does, a page minus OVERFLOW_PAGE_HEADER_BYTES a piece); 0 stores each value whole."""
    assert sizes and minutes > 0 and batches_per_txn > 0, "sizes to draw from, and something to do"
    rng = random.Random(seed)
    payload = rng.randbytes(max(sizes))
    environment = lmdb.open(
        str(directory), map_size=MAP_SIZE_BYTES, max_dbs=2, sync=False, metasync=False, writemap=False
    )
    database = environment.open_db(RECORDS_DATABASE)
    stored: list[deque[tuple[int, int]]] = [deque() for _ in range(PARTITIONS)]  # (offset, size)
    held = [0] * PARTITIONS
    next_offset = [0] * PARTITIONS
    rows: list[Minute] = []
    try:
        for round_number in range(1, minutes * ROUNDS_PER_MINUTE + 1):
            for _ in range(batches_per_round // batches_per_txn):
                with environment.begin(write=True, db=database) as transaction:
                    for _ in range(batches_per_txn):
                        partition, size = rng.randrange(PARTITIONS), rng.choice(sizes)
                        step = piece_bytes or size
                        for piece, start in enumerate(range(0, size, step)):
                            value = payload[start : min(size, start + step)]
                            transaction.put(KEY.pack(partition, next_offset[partition], piece), value)
                        stored[partition].append((next_offset[partition], size))
                        held[partition] += size
                        next_offset[partition] += 1
            for partition in range(PARTITIONS):
                with environment.begin(write=True, db=database) as transaction:
                    _trim(transaction, partition, stored[partition], held, keep_bytes, piece_bytes)
            if round_number % ROUNDS_PER_MINUTE == 0:
                row = Minute(
                    round_number // ROUNDS_PER_MINUTE, (directory / "data.mdb").stat().st_size, sum(held)
                )
                rows.append(row)
                if report is not None:
                    report(row)
    finally:
        environment.close()
    return rows


def _trim(
    transaction: lmdb.Transaction,
    partition: int,
    stored: deque[tuple[int, int]],
    held: list[int],
    keep_bytes: int,
    piece_bytes: int,
) -> None:
    """Deletes the oldest values while the partition would still hold at least `keep_bytes` without
    them (kq's retention.bytes rule, broker/retention.py)."""
    while stored and held[partition] - stored[0][1] >= keep_bytes:
        offset, size = stored.popleft()
        held[partition] -= size
        for piece in range(-(-size // piece_bytes) if piece_bytes else 1):
            transaction.delete(KEY.pack(partition, offset, piece))


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the simulation and prints one line per simulated minute."""
    parser = argparse.ArgumentParser(
        prog="python -m kq.bench.lmdb_growth", description=__doc__.splitlines()[0]
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--sizes-file", type=Path, help="whitespace-separated value sizes in bytes")
    source.add_argument("--sizes-from-store", type=Path, help="a stopped node's store directory")
    parser.add_argument("--cap-bytes", type=int, default=0, help="leave out sizes above this (0: keep all)")
    parser.add_argument("--minutes", type=int, default=30, help="simulated minutes (12 rounds each)")
    parser.add_argument("--keep-mib", type=float, default=32.0, help="retention.bytes per partition, MiB")
    parser.add_argument("--batches-per-txn", type=int, default=4)
    parser.add_argument("--batches-per-round", type=int, default=1_250)
    parser.add_argument(
        "--piece-bytes", type=int, default=0, help="store each value in pieces of this many bytes (0: whole)"
    )
    arguments = parser.parse_args(argv)
    if arguments.sizes_file is not None:
        sizes = [int(word) for word in arguments.sizes_file.read_text().split()]
    else:
        sizes = stored_value_sizes(arguments.sizes_from_store)
    if arguments.cap_bytes:
        sizes = [size for size in sizes if size <= arguments.cap_bytes]
    if not sizes:
        parser.error("no value sizes to draw from")
    print(f"{len(sizes):,} sizes, {min(sizes):,}..{max(sizes):,} bytes, mean {sum(sizes) / len(sizes):,.0f}")
    with tempfile.TemporaryDirectory(prefix="kq-lmdb-growth-") as directory:
        simulate(
            Path(directory),
            sizes,
            arguments.minutes,
            keep_bytes=int(arguments.keep_mib * MIB),
            batches_per_txn=arguments.batches_per_txn,
            batches_per_round=arguments.batches_per_round,
            piece_bytes=arguments.piece_bytes,
            report=lambda row: print(
                f"minute {row.minute:4d}: data.mdb {row.file_bytes / MIB:8.1f} MiB, "
                f"held {row.held_bytes / MIB:7.1f} MiB",
                flush=True,
            ),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
