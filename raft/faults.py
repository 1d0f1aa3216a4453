"""Fail-stop: a node whose machine fails it (a full store or disk, an I/O error) stops with one line.

Apply must not record a rejection that its healthy peers would not (the replicas would diverge), and
the Raft journal must not acknowledge what it could not write. So when the store's write transaction
fails for an environment reason (raft/state_machine.py, `EnvironmentFaultError`; the transaction is
aborted, nothing of the entry is applied), when the journal cannot write, truncate or sync
(raft/journal.py), or when a store copy from the leader cannot be restored (raft/snapshot.py), the
node logs one CRITICAL line that says what filled up and what to do, and exits with
EXIT_ENVIRONMENT_FAULT. Restarted with room (space freed on its disk, or a larger --max-disk-bytes),
it replays its journal from the store's applied index and catches up from its peers like any
restarted follower.

The messages are built here, from the error and the data directory, so that every path says the same
thing the same way; `fail_stop` is the one place that ends the process.

One line a node, however many parts of it meet the fault. A full disk fails every writer at once: the
apply and the journal of one process (two threads), and with worker processes each group's process
(they share the disk), which logged one line each, the same CRITICAL twice or more. So the first
caller in a process holds `_STOPPING` and the others wait for the exit; and the processes of one node
share a token: the supervisor passes each worker the read end of a pipe holding one byte
(FAIL_STOP_TOKEN_FD names it; broker/workers.py), and only the process that reads that byte logs the
line. A pipe takes no disk, and a one-byte read is atomic: one reader gets it, the others read the
end of the pipe (its write end is closed) and stop without a second line; the supervisor's own line
says which worker ended.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path
from typing import NoReturn

import lmdb

from kq.proto.limits import DISK_FULL_FREE_BYTES_MAX
from kq.storage.errors import FormatError
from kq.storage.usage import filesystem_free_bytes

logger = logging.getLogger(__name__)

EXIT_ENVIRONMENT_FAULT = 70  # EX_SOFTWARE: the machine failed the node; it stopped rather than diverge.
# The environment variable naming the fd of the node's fail-stop token (module docstring): set by a
# node's supervisor for its workers; unset, the process is the node's only one and logs its line.
FAIL_STOP_TOKEN_FD = "KQ_FAIL_STOP_TOKEN_FD"
FAIL_STOP_TOKEN = b"!"
_STOPPING = threading.Lock()  # Held by the thread that stops the process.
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def fail_stop(message: str) -> NoReturn:
    """Logs `message` as the node's one last line and ends the process at once (no cleanup: a thread
    still running must not write anything after the fault). A second caller, in this process or in
    another process of the node, logs nothing (module docstring)."""
    if not _STOPPING.acquire(blocking=False):
        threading.Event().wait()  # Another thread is ending the process; its os._exit ends this one.
    if holds_fail_stop_token(os.environ.get(FAIL_STOP_TOKEN_FD)):
        logger.critical("stopping: %s", message)
    logging.shutdown()
    os._exit(EXIT_ENVIRONMENT_FAULT)


def holds_fail_stop_token(token_fd: str | None) -> bool:
    """Whether this process is the one of its node to log the fail-stop line: always when `token_fd`
    is None (the node's only process); else whether it read the node's token from that pipe."""
    if token_fd is None:
        return True
    try:
        return os.read(int(token_fd), 1) == FAIL_STOP_TOKEN
    except (OSError, ValueError):  # No such pipe (a process started by hand with the variable): say it.
        return True


def apply_fault_message(error: BaseException, index: int, store_path: Path, map_bytes: int) -> str:
    """What stopped apply at entry `index`, and what to do, in one line. `error` is the
    EnvironmentFaultError (its cause is the LMDB or OS error) or what else apply raised."""
    cause = error.__cause__ if error.__cause__ is not None else error
    if isinstance(cause, lmdb.MapFullError):
        return (
            f"the store is full: entry {index} does not fit in its LMDB map of {map_bytes} bytes "
            "(--max-disk-bytes); nothing of it was applied. Restart this node with a larger "
            "--max-disk-bytes (it must hold what its peers hold: give every node the same bound): "
            "it then catches up from its peers"
        )
    free = _free_bytes(store_path)
    if _disk_full(cause, free):
        return (
            f"the disk holding the store {store_path} is full ({_describe_free(free)}; {_cause(cause)}): "
            f"entry {index} could not be written, nothing of it was applied. Free space on that disk (or "
            "move the data directory to a larger one) and restart this node: it then catches up from its "
            "peers"
        )
    if isinstance(cause, lmdb.Error | OSError):
        return f"cannot apply entry {index}: {_cause(cause)} ({_describe_free(free)} on the store's disk)"
    return f"cannot apply entry {index}: {_cause(cause)}"


def journal_fault_message(action: str, path: Path, error: OSError) -> str:
    """Why the Raft journal at `path` could not `action`, and what to do, in one line."""
    free = _free_bytes(path.parent)
    if _disk_full(error, free):
        return (
            f"the disk holding the Raft journal {path} is full ({_describe_free(free)}; {_cause(error)}): "
            f"cannot {action}. Free space on that disk and restart this node: it then catches up from "
            "its peers"
        )
    described = f"{_cause(error)} ({_describe_free(free)} on its disk)"
    return f"the Raft journal {path} failed: cannot {action}: {described}"


def restore_fault_message(error: BaseException, applied_index: int, store_path: Path, map_bytes: int) -> str:
    """Why a store copy from the leader (at `applied_index`) could not be restored, in one line."""
    if isinstance(error, FormatError):  # A leader of a newer kq: this node cannot follow it.
        return f"cannot restore the leader's copy at applied index {applied_index}: its {error}"
    if isinstance(error, lmdb.MapFullError):
        return (
            f"the store is full: the leader's copy at applied index {applied_index} does not fit in its "
            f"LMDB map of {map_bytes} bytes (restoring it needs room for the copy beside the store "
            "it replaces); restart this node with a larger --max-disk-bytes: it then catches up"
        )
    free = _free_bytes(store_path)
    if _disk_full(error, free):
        return (
            f"the disk holding the store {store_path} is full ({_describe_free(free)}; {_cause(error)}): "
            f"cannot restore the leader's copy at applied index {applied_index}. Free space on that "
            "disk and restart this node: it then catches up"
        )
    return f"cannot restore the leader's copy at applied index {applied_index}: {_cause(error)}"


def receive_fault_message(error: OSError, path: Path) -> str:
    """Why a chunk of the leader's store copy could not be written to `path`, in one line."""
    free = _free_bytes(path.parent)
    if _disk_full(error, free):
        return (
            f"the disk holding {path} is full ({_describe_free(free)}; {_cause(error)}): cannot receive "
            "the leader's copy of its store. Free space on that disk and restart this node: it then "
            "catches up"
        )
    return f"cannot receive the leader's copy of its store into {path}: {_cause(error)}"


def _disk_full(error: BaseException, free_bytes: int | None) -> bool:
    """Whether `error` is (or, from an LMDB that reports only EIO, most likely is) a full disk."""
    if isinstance(error, lmdb.DiskError) or (isinstance(error, OSError) and error.errno in _DISK_FULL_ERRNOS):
        return True
    return (
        isinstance(error, lmdb.Error | OSError)
        and free_bytes is not None
        and (free_bytes < DISK_FULL_FREE_BYTES_MAX)
    )


def _free_bytes(path: Path) -> int | None:
    try:
        return filesystem_free_bytes(path)
    except OSError:
        return None


def _describe_free(free_bytes: int | None) -> str:
    return "free space unknown" if free_bytes is None else f"{free_bytes} bytes free"


def _cause(error: BaseException) -> str:
    text = " ".join(str(error).split())  # One line, whatever the library put in its message.
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
