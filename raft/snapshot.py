"""PySyncObj log-compaction hooks: a snapshot is a compact LMDB copy plus PySyncObj's own header.

File layout (integers big-endian):

    magic          8 bytes  b"KQSNAP01"
    header_length  u32      then a pickle (protocol 5) of {"raft": <PySyncObj's tuple>, "applied_index": u64}
    data_length    u64      then the compact LMDB copy (`data.mdb`) of that many bytes
    data_crc32c    u32      over the LMDB copy
    end            5 bytes  b"KQEND"

The header is written at once, inside PySyncObj's tick; the LMDB copy is written by a thread from a
read transaction opened in that same tick, so it holds exactly the state at the snapshot's index
and Raft keeps ticking while a large store is copied. PySyncObj renames the file into place as soon
as the hook returns; the thread keeps writing through its open descriptor and `check` reports
SERIALIZING until it is done (PySyncObj transmits nothing meanwhile). A file cut short by a crash
still carries a valid header; its data is only ever needed by a node that is behind it, and such a
node only ever receives complete files from the leader.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import struct
import tempfile
import threading
from pathlib import Path
from typing import Any, BinaryIO

import crc32c as crc32c_module

from storage import SnapshotError, Store

logger = logging.getLogger(__name__)

MAGIC = b"KQSNAP01"
END = b"KQEND"
COPY_CHUNK_BYTES = 1024 * 1024
HEADER_BYTES_MAX = 16 * 1024 * 1024
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")

# PySyncObj's SERIALIZER_STATE values (pysyncobj.config), restated to keep the import surface small.
NOT_SERIALIZING, SERIALIZING, SUCCESS, FAILED = 0, 1, 2, 3


class SnapshotHooks:
    """The serializer, deserializer and serializeChecker given to PySyncObj, bound to one Store."""

    def __init__(self, store: Store, scratch_dir: Path, on_restored: Any) -> None:
        self._store = store
        self._scratch_dir = scratch_dir
        self._on_restored = on_restored
        self._state = NOT_SERIALIZING
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def check(self) -> int:
        """Serialization state for PySyncObj; SUCCESS and FAILED are reported exactly once."""
        with self._lock:
            state = self._state
            if state in (SUCCESS, FAILED):
                self._state = NOT_SERIALIZING
            return state

    def serialize(self, file_name: str, raft_data: Any) -> None:
        """Writes the header now and starts the thread that appends the LMDB copy."""
        transaction = self._store.begin_snapshot()
        try:
            applied_index = self._store.applied_index_in(transaction)
            header = pickle.dumps({"raft": raft_data, "applied_index": applied_index}, protocol=5)
            output = open(file_name, "wb")  # noqa: SIM115 - handed to the copying thread, which closes it.
            output.write(MAGIC + _U32.pack(len(header)) + header)
            output.flush()
        except BaseException:
            transaction.abort()
            raise
        with self._lock:
            self._state = SERIALIZING
        logger.info("snapshot started at applied index %d", applied_index)
        self._thread = threading.Thread(
            target=self._copy_data, args=(output, transaction, applied_index), name="kq-snapshot", daemon=True
        )
        self._thread.start()

    def _copy_data(self, output: BinaryIO, transaction: Any, applied_index: int) -> None:
        scratch: Path | None = None
        state = FAILED
        try:
            scratch = Path(tempfile.mkdtemp(prefix="snapshot-", dir=self._scratch_dir))
            self._store.copy_to(scratch, transaction)
            transaction.abort()
            data_path = scratch / "data.mdb"
            output.write(_U64.pack(data_path.stat().st_size))
            checksum = 0
            with data_path.open("rb") as data:
                while chunk := data.read(COPY_CHUNK_BYTES):
                    checksum = crc32c_module.crc32c(chunk, checksum)
                    output.write(chunk)
            output.write(_U32.pack(checksum) + END)
            output.flush()
            os.fsync(output.fileno())
            state = SUCCESS
            logger.info("snapshot at applied index %d written", applied_index)
        except Exception:
            logger.exception("snapshot at applied index %d failed", applied_index)
            transaction.abort()
        finally:
            output.close()
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
            with self._lock:
                self._state = state

    def deserialize(self, file_name: str) -> Any:
        """Returns PySyncObj's header tuple; restores the data first when it is ahead of the store."""
        with open(file_name, "rb") as source:
            applied_index, raft_data = read_header(source)
            local_index = self._store.applied_index()
            if applied_index <= local_index:
                logger.info("snapshot at %d not restored: store is at %d", applied_index, local_index)
                return raft_data
            self._restore(source, applied_index)
        self._on_restored(applied_index)
        return raft_data

    def _restore(self, source: BinaryIO, applied_index: int) -> None:
        scratch = Path(tempfile.mkdtemp(prefix="restore-", dir=self._scratch_dir))
        try:
            extract_data(source, scratch / "data.mdb")
            copy = Store.open(scratch, map_size_bytes=self._store.map_size_bytes())
            try:
                assert copy.applied_index() == applied_index, "snapshot header and data disagree"
                self._store.replace_with(copy)
            finally:
                copy.close()
            logger.info("store restored from snapshot at applied index %d", applied_index)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def read_header(source: BinaryIO) -> tuple[int, Any]:
    """Reads magic and header; returns (applied index, PySyncObj's tuple)."""
    if source.read(len(MAGIC)) != MAGIC:
        raise SnapshotError("not a kq snapshot (bad magic)")
    raw_length = source.read(_U32.size)
    if len(raw_length) != _U32.size:
        raise SnapshotError("snapshot header is cut short")
    (length,) = _U32.unpack(raw_length)
    if length > HEADER_BYTES_MAX:
        raise SnapshotError(f"snapshot header of {length} bytes exceeds {HEADER_BYTES_MAX}")
    raw_header = source.read(length)
    if len(raw_header) != length:
        raise SnapshotError("snapshot header is cut short")
    # The file comes from this node or from an authenticated (password-protected) Raft peer.
    header = pickle.loads(raw_header)
    return int(header["applied_index"]), header["raft"]


def extract_data(source: BinaryIO, destination: Path) -> None:
    """Copies the LMDB data section to `destination`, verifying its length, checksum and end marker."""
    raw_length = source.read(_U64.size)
    if len(raw_length) != _U64.size:
        raise SnapshotError("snapshot has no data section (cut short while it was written)")
    (remaining,) = _U64.unpack(raw_length)
    checksum = 0
    with destination.open("wb") as output:
        while remaining:
            chunk = source.read(min(remaining, COPY_CHUNK_BYTES))
            if not chunk:
                raise SnapshotError("snapshot data is cut short")
            checksum = crc32c_module.crc32c(chunk, checksum)
            output.write(chunk)
            remaining -= len(chunk)
    trailer = source.read(_U32.size + len(END))
    if len(trailer) != _U32.size + len(END) or trailer[_U32.size :] != END:
        raise SnapshotError("snapshot has no end marker")
    if _U32.unpack(trailer[: _U32.size])[0] != checksum:
        raise SnapshotError("snapshot data fails its CRC32C")
