"""CPU time and resident memory of processes by PID, from Linux `/proc` (no third-party library).

CPU comes from `/proc/PID/stat` (utime + stime, in clock ticks: 10 ms resolution at the usual
100 Hz), memory from `/proc/PID/status`, the whole machine's CPU from `/proc/stat`.

Resident memory is split the way the kernel counts it, because the two halves mean different
things here: RssAnon is the heap (Python objects, PySyncObj's in-RAM Raft log), which must stay
bounded; RssFile is pages of memory-mapped files (LMDB's map, the Raft journal) that the kernel
can drop at any time, and which grows with the data a node touches.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from kq.deploy.processes import descendants

PROC = Path("/proc")
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
PEAK_SAMPLE_PERIOD_S = 0.25  # Often enough to see a Raft log grow between two compactions.
# /proc/PID/stat fields after the ")" that closes the command name: state is field 3, so utime
# (field 14) and stime (field 15) sit at these positions of the split remainder.
_UTIME_POSITION = 14 - 3
_STIME_POSITION = 15 - 3
# utime, stime, cutime (16), cstime (17): a process's own CPU and that of its reaped children.
_TREE_TICK_POSITIONS = (_UTIME_POSITION, _STIME_POSITION, 16 - 3, 17 - 3)


@dataclass(frozen=True, slots=True)
class MemorySample:
    """One process's resident memory, in KiB."""

    rss_kib: int  # VmRSS: resident now (anon + file + shmem).
    peak_rss_kib: int  # VmHWM: the most it was ever resident.
    anon_kib: int  # RssAnon: heap and other private memory.
    file_kib: int  # RssFile: resident pages of mapped files (reclaimable).


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used so far."""
    fields = _stat_fields(pid)
    ticks = int(fields[_UTIME_POSITION]) + int(fields[_STIME_POSITION])
    return ticks / CLOCK_TICKS_PER_S


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name, so that field N is at index N - 3."""
    text = (PROC / str(pid) / "stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def process_tree(pid: int) -> list[int]:
    """`pid` and every live descendant of it (children, their children, ...), `pid` first: the
    harness's own walk (kq.deploy.processes.descendants), which signals a node's whole tree."""
    return [pid, *descendants(pid)]


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of `pid` and all its descendants: for each live one, its own utime + stime plus
    cutime + cstime (what its children that already ended and were reaped used).

    The difference of two readings is the tree's CPU in between even when a child ends meanwhile: its
    seconds move from its own counters to its parent's cutime/cstime. A node that later runs worker
    processes is measured whole this way. Raises OSError if `pid` itself is gone.
    """
    total_ticks = 0
    for member in process_tree(pid):
        try:
            fields = _stat_fields(member)
        except OSError:
            if member == pid:
                raise
            continue  # A descendant that ended (and was reaped) since the listing: its parent counts it.
        total_ticks += sum(int(fields[position]) for position in _TREE_TICK_POSITIONS)
    return total_ticks / CLOCK_TICKS_PER_S


def memory(pid: int) -> MemorySample:
    """The process's current and peak resident memory."""
    values: dict[str, int] = {}
    for line in (PROC / str(pid) / "status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            values[name] = int(rest.split()[0])  # Always in kB.
    return MemorySample(values["VmRSS"], values["VmHWM"], values["RssAnon"], values["RssFile"])


def thread_count(pid: int) -> int:
    """The process's OS threads (entries of /proc/PID/task)."""
    return sum(1 for _ in (PROC / str(pid) / "task").iterdir())


def cpu_seconds_each(pids: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds of each named process."""
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


@dataclass(frozen=True, slots=True)
class HostCpu:
    """Cumulative CPU time of the whole machine, in clock ticks, summed over all CPUs."""

    busy_ticks: int
    total_ticks: int

    def busy_fraction_since(self, earlier: HostCpu) -> float:
        """Share of all CPUs' time spent not idle between `earlier` and this sample (0..1)."""
        total = self.total_ticks - earlier.total_ticks
        return (self.busy_ticks - earlier.busy_ticks) / total if total > 0 else 0.0


def host_cpu() -> HostCpu:
    """The machine's CPU counters (the first line of /proc/stat); idle and iowait count as not busy."""
    with open(PROC / "stat") as handle:
        fields = [int(value) for value in handle.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice: already inside user/nice].
    total = sum(fields[:8])
    idle = fields[3] + fields[4]
    return HostCpu(total - idle, total)


def own_cpu_seconds() -> float:
    """User + system CPU seconds of this (the benchmark client's) process, all threads."""
    times = os.times()
    return times.user + times.system


class PeriodicSampler:
    """Calls `sample()` every `period_s` in a background thread while used as a context manager.

    Subclasses keep peaks: the kernel keeps one for total RSS (VmHWM) but not for the figures the
    benchmarks bound, and a reading taken only between phases would miss them.
    """

    def __init__(self, period_s: float, name: str) -> None:
        self._period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def sample(self) -> None:
        """One reading; the subclass keeps what it needs."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=self._period_s * 20)
        self.sample()  # The state at the end counts too.

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):  # A sampling period, not synchronization.
            self.sample()


class PeakAnonSampler(PeriodicSampler):
    """Keeps the largest RssAnon seen of each process: the part the Raft log compaction must bound."""

    def __init__(self, pids: Mapping[str, int], period_s: float = PEAK_SAMPLE_PERIOD_S) -> None:
        super().__init__(period_s, "bench-peak-anon")
        self._pids = dict(pids)
        self.peak_anon_kib = dict.fromkeys(self._pids, 0)

    def sample(self) -> None:
        """Reads every process's RssAnon."""
        for name, pid in self._pids.items():
            try:
                anon_kib = memory(pid).anon_kib
            except (OSError, KeyError):
                continue  # The process is gone or mid-exit; the runner reports that elsewhere.
            self.peak_anon_kib[name] = max(self.peak_anon_kib[name], anon_kib)
