"""Pure analysis for the soak (`bench.soak`): the anonymous-memory floor slope and node-log scanning.

No I/O and no clock here, so each rule is unit-tested on made-up inputs (tests/bench/test_soak.py).

Memory floor. A node's RssAnon moves in a sawtooth: it grows with the Raft log kept in RAM and
drops when a snapshot compacts it. The peaks say little; a leak shows as a rising *floor*. So the
samples taken after the warm-up are cut into consecutive windows (60 s by default) starting at the
end of the warm-up; each window contributes its minimum RssAnon, placed at the window's midpoint;
the slope is the least-squares line through those points, in MiB per minute. A window with samples
over less than half its span (the one cut short at the end of the run) is left out, since a
minimum over fewer samples is biased upward.

Node logs. The broker logs with the format
`%(asctime)s %(levelname)s node=ID %(name)s: %(message)s` (asctime like `2026-11-23 10:05:01,123`);
the `raft.snapshot` logger writes `snapshot started at applied index N` and
`snapshot at applied index N written in X.XXX s` (older nodes: without ` in X.XXX s`; the
duration then comes from the two timestamps) or `snapshot at applied index N failed`. Lines that
do not match the format (tracebacks, output of the interpreter) belong to the record above them.

Disk size levelling. With `retention.bytes` set, a node's data directory must stop growing once
retention trims as fast as the producer writes. The samples are cut at the midpoint of the sampled
time; the size *levelled off* when the peak over the second half exceeds the peak over the first
half by at most a fraction of the latter (`SIZE_GROWTH_MAX_FRACTION_DEFAULT`, 10 %). Peaks, not
last values, because the LMDB file never shrinks while the journal and snapshot files come and go:
a file still growing raises the second half's peak by what it grew, whatever the noise. The
least-squares slope over the second half is reported beside it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

KIB_PER_MIB = 1024
BYTES_PER_MIB = 1024 * 1024
SIZE_GROWTH_MAX_FRACTION_DEFAULT = 0.10  # Second half's size peak over the first half's, at most +10 %.
FLOOR_WINDOW_S_DEFAULT = 60.0
WINDOW_COVERAGE_MIN = 0.5  # Share of a window's span its samples must cover for its minimum to count.
ERROR_LINES_SHOWN_MAX = 10
ERROR_LEVELS = ("ERROR", "CRITICAL")
SNAPSHOT_LOGGER = "kq.raft.snapshot"
TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S,%f"

_LINE = re.compile(
    r"^(?P<asctime>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (?P<level>[A-Z]+) node=(?P<node>\S+) "
    r"(?P<logger>\S+): (?P<message>.*)$"
)
_SNAPSHOT_STARTED = re.compile(r"^snapshot started at applied index (?P<index>\d+)$")
_SNAPSHOT_WRITTEN = re.compile(
    r"^snapshot at applied index (?P<index>\d+) written(?: in (?P<duration>\d+(?:\.\d+)?) s)?$"
)
_SNAPSHOT_FAILED = re.compile(r"^snapshot at applied index (?P<index>\d+) failed")
_TRACEBACK = "Traceback (most recent call last):"


# Memory floor -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FloorPoint:
    """One window's minimum RssAnon, placed at the window's midpoint."""

    minute: float  # Minutes since the end of the warm-up.
    anon_mib: float


def floor_points(
    samples: Sequence[tuple[float, int]],
    warmup_s: float,
    window_s: float = FLOOR_WINDOW_S_DEFAULT,
) -> list[FloorPoint]:
    """The per-window minima of (seconds since start, RssAnon KiB) samples taken after `warmup_s`."""
    assert window_s > 0, "a floor window has a positive length"
    windows: dict[int, list[tuple[float, int]]] = {}
    for time_s, anon_kib in samples:
        if time_s >= warmup_s:
            windows.setdefault(int((time_s - warmup_s) // window_s), []).append((time_s, anon_kib))
    points: list[FloorPoint] = []
    for number in sorted(windows):
        members = windows[number]
        covered_s = max(t for t, _ in members) - min(t for t, _ in members)
        if covered_s < window_s * WINDOW_COVERAGE_MIN:
            continue
        midpoint_s = (number + 0.5) * window_s
        points.append(FloorPoint(midpoint_s / 60, min(a for _, a in members) / KIB_PER_MIB))
    return points


def least_squares_slope(points: Sequence[FloorPoint]) -> float | None:
    """Slope (MiB per minute) of the least-squares line through `points`; None below two points."""
    sums = _deviation_sums(points)
    if sums is None or sums[0] == 0:
        return None
    spread_x, _, covariance = sums
    return covariance / spread_x


def r_squared(points: Sequence[FloorPoint]) -> float | None:
    """How much of the floor's variation the least-squares line explains (0..1): a slope with a low R²
    is noise around a flat floor, one with a high R² a steady rise. None below two points, or when
    the floor is perfectly flat (no variation to explain). For one line, the squared correlation."""
    sums = _deviation_sums(points)
    if sums is None or sums[0] == 0 or sums[1] == 0:
        return None
    spread_x, spread_y, covariance = sums
    return covariance * covariance / (spread_x * spread_y)


def _deviation_sums(points: Sequence[FloorPoint]) -> tuple[float, float, float] | None:
    """Σ(x - x̄)², Σ(y - ȳ)² and Σ(x - x̄)(y - ȳ) of (minute, MiB); None below two points."""
    if len(points) < 2:
        return None
    mean_x = sum(p.minute for p in points) / len(points)
    mean_y = sum(p.anon_mib for p in points) / len(points)
    return (
        sum((p.minute - mean_x) ** 2 for p in points),
        sum((p.anon_mib - mean_y) ** 2 for p in points),
        sum((p.minute - mean_x) * (p.anon_mib - mean_y) for p in points),
    )


# Node logs --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One snapshot as its node logged it; `ended` is None while it never finished."""

    applied_index: int
    started: datetime
    ended: datetime | None = None
    duration_s: float | None = None
    failed: bool = False


@dataclass(slots=True)
class LogScan:
    """What one node's log says: its snapshots in order, overlaps, and error lines."""

    snapshots: list[Snapshot] = field(default_factory=list)
    overlaps: int = 0  # Starts logged while the previous snapshot was still being written.
    unmatched_ends: int = 0  # "written"/"failed" lines with no open snapshot (e.g. log cut at restart).
    error_count: int = 0
    error_lines: list[str] = field(default_factory=list)  # The first ERROR_LINES_SHOWN_MAX.

    def add_error(self, line: str) -> None:
        """Counts an error line and keeps it when fewer than the limit are kept."""
        self.error_count += 1
        if len(self.error_lines) < ERROR_LINES_SHOWN_MAX:
            self.error_lines.append(line)


@dataclass(frozen=True, slots=True)
class SnapshotStats:
    """Per-node snapshot figures for the report."""

    count: int
    failed: int
    unfinished: int
    first_s: float | None
    last_s: float | None
    max_s: float | None
    overlaps: int
    gap_min_s: float | None  # Shortest time from one snapshot's end to the next one's start.
    back_to_back: int  # Gaps below the threshold.


def scan_log(lines: Iterable[str]) -> LogScan:
    """Snapshots and error lines of one node's log, in file order."""
    scan = LogScan()
    open_snapshot: Snapshot | None = None
    level = ""  # Level of the record that the current line belongs to.
    for raw in lines:
        line = raw.rstrip("\n")
        match = _LINE.match(line)
        if match is None:
            if line.startswith(_TRACEBACK) and level not in ERROR_LEVELS:
                scan.add_error(f"traceback outside an error record: {line}")  # Uncaught, e.g. in a thread.
            continue
        level = match["level"]
        if level in ERROR_LEVELS:
            scan.add_error(line)
        if match["logger"] != SNAPSHOT_LOGGER:
            continue
        when = datetime.strptime(match["asctime"], TIMESTAMP_FORMAT)
        open_snapshot = _snapshot_event(scan, open_snapshot, when, match["message"])
    if open_snapshot is not None:
        scan.snapshots.append(open_snapshot)
    return scan


def _snapshot_event(scan: LogScan, current: Snapshot | None, when: datetime, message: str) -> Snapshot | None:
    """Applies one raft.snapshot message; returns the snapshot still being written, if any."""
    if (started := _SNAPSHOT_STARTED.match(message)) is not None:
        if current is not None:
            scan.overlaps += 1
            scan.snapshots.append(current)  # Stays unfinished: its end, if logged, pairs with the newer one.
        return Snapshot(int(started["index"]), when)
    written = _SNAPSHOT_WRITTEN.match(message)
    failed = _SNAPSHOT_FAILED.match(message)
    if written is None and failed is None:
        return current
    if current is None:
        scan.unmatched_ends += 1
        return None
    measured = (when - current.started).total_seconds()
    duration_s = float(written["duration"]) if written is not None and written["duration"] else measured
    scan.snapshots.append(Snapshot(current.applied_index, current.started, when, duration_s, written is None))
    return None


def snapshot_stats(scan: LogScan, gap_min_s: float) -> SnapshotStats:
    """Durations of the finished snapshots and the shortest rest between two of them."""
    finished = [s for s in scan.snapshots if s.ended is not None and not s.failed]
    durations = [s.duration_s for s in finished if s.duration_s is not None]
    gaps: list[float] = []
    for previous, following in zip(scan.snapshots, scan.snapshots[1:], strict=False):
        if previous.ended is not None:
            gaps.append((following.started - previous.ended).total_seconds())
    return SnapshotStats(
        count=len(finished),
        failed=sum(1 for s in scan.snapshots if s.failed),
        unfinished=sum(1 for s in scan.snapshots if s.ended is None),
        first_s=durations[0] if durations else None,
        last_s=durations[-1] if durations else None,
        max_s=max(durations) if durations else None,
        overlaps=scan.overlaps,
        gap_min_s=min(gaps) if gaps else None,
        back_to_back=sum(1 for g in gaps if g < gap_min_s),
    )


# Disk size levelling ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SizeLevel:
    """Whether a size series levelled off: its peak over the second half against the first half's."""

    first_half_peak_bytes: int
    second_half_peak_bytes: int
    growth_bytes: int  # Second half's peak minus the first half's (negative when it shrank).
    growth_fraction: float | None  # growth_bytes over the first half's peak; None if that is 0.
    second_half_slope_mib_per_min: float | None
    growth_max_fraction: float
    levelled: bool


def size_level(samples: Sequence[tuple[float, int]], growth_max_fraction: float) -> SizeLevel | None:
    """Judges (seconds since start, bytes) samples; None without two samples in each half."""
    assert growth_max_fraction >= 0, "a growth bound is not negative"
    if not samples:
        return None
    middle_s = (samples[0][0] + samples[-1][0]) / 2
    first = [size for time_s, size in samples if time_s < middle_s]
    second = [(time_s, size) for time_s, size in samples if time_s >= middle_s]
    if len(first) < 2 or len(second) < 2:
        return None
    first_peak, second_peak = max(first), max(size for _, size in second)
    growth = second_peak - first_peak
    return SizeLevel(
        first_half_peak_bytes=first_peak,
        second_half_peak_bytes=second_peak,
        growth_bytes=growth,
        growth_fraction=growth / first_peak if first_peak > 0 else None,
        second_half_slope_mib_per_min=_slope([(t / 60, b / BYTES_PER_MIB) for t, b in second]),
        growth_max_fraction=growth_max_fraction,
        levelled=growth <= growth_max_fraction * first_peak,
    )


def _slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (x, y) points; None below two distinct x."""
    if len(points) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


def at_intervals(times_s: Sequence[float], interval_s: float) -> list[int]:
    """Indexes of the first sample at or after each multiple of `interval_s`, and of the last sample.

    `times_s` ascend; the report prints these rows of a long timeline (every 5 minutes by default).
    """
    assert interval_s > 0, "a report interval is positive"
    chosen: list[int] = []
    next_s = 0.0
    for index, time_s in enumerate(times_s):
        if time_s >= next_s:
            chosen.append(index)
            next_s = (int(time_s // interval_s) + 1) * interval_s
    if times_s and chosen[-1] != len(times_s) - 1:
        chosen.append(len(times_s) - 1)
    return chosen
