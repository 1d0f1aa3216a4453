"""Server processes known by their PID: started here, or adopted from a PID file a previous run wrote.

Every process is signalled by its own PID, never by name. A process started here is a child (it is
reaped, so no zombie stays behind); one adopted from a PID file (`python -m kq.deploy stop` in a new
shell) is checked first: it must be alive and its command line must hold the marker words it was
started with (a node's `--data-dir <dir>`), since a PID left over from before a reboot may belong to
another program now.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from kq.deploy.waiting import WaitTimeoutError, wait_for

STOP_TIMEOUT_S = 10.0  # SIGTERM first; SIGKILL for what still runs after this.
KILL_TIMEOUT_S = 10.0  # SIGKILL cannot be refused; this bounds a process stuck in the kernel.
DESCENDANTS_MAX = 1_024  # Processes below one server process that a signal reaches (a node's workers).


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs, from /proc (none where there is no /proc)."""
    found: list[int] = []
    pending = [pid]
    while pending and len(found) < DESCENDANTS_MAX:
        parent = pending.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                children = [int(child) for child in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            found.extend(children)
            pending.extend(children)
    return found


def signal_tree(pid: int, signal_number: int) -> None:
    """Sends `signal_number` to `pid` and to every process below it, the children first (so a pause
    leaves no worker running behind a paused parent); one that ended meanwhile is skipped."""
    for target in [*reversed(descendants(pid)), pid]:
        try:
            os.kill(target, signal_number)
        except ProcessLookupError:
            continue


def pid_alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is dead; another user's process counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        return True  # No /proc here: kill(0) succeeding is the best we know.


def command_line(pid: int) -> list[str]:
    """The argument vector of `pid` (empty when it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return [word.decode(errors="replace") for word in cmdline.read().split(b"\0") if word]
    except OSError:
        return []


def _holds_in_order(words: Sequence[str], marker: Sequence[str]) -> bool:
    """Whether `marker` stands in `words` as consecutive words."""
    size = len(marker)
    return any(list(words[start : start + size]) == list(marker) for start in range(len(words) - size + 1))


@dataclass(slots=True)
class ServerProcess:
    """One process by PID: `child` is set when this process started it, `log` while its log is open."""

    pid: int
    child: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = field(default=None, repr=False)

    def alive(self) -> bool:
        """Whether the process still runs (a child is reaped here when it has ended)."""
        if self.child is not None:
            return self.child.poll() is None
        return pid_alive(self.pid)

    def release(self) -> None:
        """Closes this side's handle on the log file."""
        if self.log is not None:
            self.log.close()
            self.log = None


class ProcessTable:
    """The processes of one cluster by name; `pid_dir` (optional) holds a `<prefix><name>.pid` file for each.

    A name in the table is a process expected to run: `stop`, `kill` and `forget` take it out, so one
    that is in the table but not alive exited by itself (`exited()`).
    """

    def __init__(self, pid_dir: Path | None = None, pid_prefix: str = "") -> None:
        self.pid_dir = pid_dir
        self.pid_prefix = pid_prefix
        self._processes: dict[str, ServerProcess] = {}

    def pid_path(self, name: str) -> Path | None:
        """Where `name`'s PID is recorded (None when this table keeps no files)."""
        return self.pid_dir / f"{self.pid_prefix}{name}.pid" if self.pid_dir is not None else None

    def start(
        self,
        name: str,
        command: Sequence[str],
        log_path: Path,
        *,
        environment: Mapping[str, str] | None = None,
        detach: bool = False,
    ) -> int:
        """Starts `command` with stdout and stderr appended to `log_path`; returns its PID.

        `detach` gives it a session of its own, so it outlives the caller and a Ctrl-C in the caller's
        terminal does not reach it.
        """
        assert not self.running(name), f"{name} is already running"
        self.forget(name)  # One that exited by itself: its log handle and PID file go.
        log = open(log_path, "ab")  # noqa: SIM115 - closed by release() when the process is stopped.
        try:
            child = subprocess.Popen(
                list(command),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(environment) if environment is not None else None,
                start_new_session=detach,
            )
        except BaseException:
            log.close()
            raise
        self._processes[name] = ServerProcess(child.pid, child, log)
        pid_path = self.pid_path(name)
        if pid_path is not None:
            pid_path.write_text(f"{child.pid}\n")
        return child.pid

    def adopt(self, name: str, marker: Sequence[str]) -> int | None:
        """Takes over `name` from its PID file if that process is alive and its command line holds
        `marker`; a stale PID file is removed. Returns the PID, or None."""
        pid_path = self.pid_path(name)
        if pid_path is None or not pid_path.exists():
            return None
        text = pid_path.read_text().strip()
        pid = int(text) if text.isdigit() else 0
        if pid > 0 and pid_alive(pid) and _holds_in_order(command_line(pid), marker):
            self._processes[name] = ServerProcess(pid)
            return pid
        pid_path.unlink(missing_ok=True)
        return None

    def running(self, name: str) -> bool:
        """Whether `name` is in the table and alive."""
        process = self._processes.get(name)
        return process is not None and process.alive()

    def pid(self, name: str) -> int | None:
        """The PID of `name` while it runs."""
        process = self._processes.get(name)
        return process.pid if process is not None and process.alive() else None

    def pids(self) -> dict[str, int]:
        """The PID of every running process, by name."""
        return {name: process.pid for name, process in self._processes.items() if process.alive()}

    def exit_code(self, name: str) -> int | None:
        """How a child that ended by itself exited (negative: the signal); None while running or unknown."""
        process = self._processes.get(name)
        return process.child.poll() if process is not None and process.child is not None else None

    def exited(self) -> list[str]:
        """The names expected to run whose process has ended (a crash, not a stop of ours)."""
        return [name for name, process in self._processes.items() if not process.alive()]

    def signal(self, name: str, signal_number: int) -> None:
        """Sends a signal to one running process by its PID, and to the processes it started (a node's
        worker processes, `kq-node --processes`): SIGSTOP pauses the whole node, SIGCONT resumes it."""
        signal_tree(self._processes[name].pid, signal_number)

    def kill(self, name: str) -> None:
        """`kill -9` of one process; returns once it is gone."""
        self._end([name], signal.SIGKILL, KILL_TIMEOUT_S)

    def stop(self, names: Sequence[str], timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM to all of `names` at once (a paused one is continued first), SIGKILL to any still
        running after `timeout_s`; returns once all are gone."""
        try:
            self._end(names, signal.SIGTERM, timeout_s)
        except WaitTimeoutError:
            self._end(names, signal.SIGKILL, KILL_TIMEOUT_S)

    def _end(self, names: Sequence[str], signal_number: int, timeout_s: float) -> None:
        ending = [self._processes[name] for name in names if name in self._processes]
        for process in ending:
            if process.alive():
                try:
                    if signal_number != signal.SIGKILL:  # A paused process cannot handle SIGTERM.
                        signal_tree(process.pid, signal.SIGCONT)
                    os.kill(process.pid, signal_number)
                except ProcessLookupError:
                    continue  # It ended between the check and the signal.
        wait_for(
            lambda: not any(process.alive() for process in ending),
            f"PIDs {[p.pid for p in ending if p.alive()]} to end after signal {signal_number}",
            timeout_s,
        )
        for name in names:
            self.forget(name)

    def forget(self, name: str) -> None:
        """Takes `name` out of the table (and its PID file); the process must have ended."""
        process = self._processes.pop(name, None)
        if process is not None:
            process.release()
        pid_path = self.pid_path(name)
        if pid_path is not None:
            pid_path.unlink(missing_ok=True)

    def names(self) -> list[str]:
        """Every name in the table, running or not."""
        return list(self._processes)
