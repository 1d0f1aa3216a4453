"""The failover measurement: writers keep acknowledging records while the leader is killed with -9.

This module holds what both systems share: the acknowledgement log the writers fill, and the pure
analysis of it. The *gap* is the time from the kill signal until the first write that was *sent
after the old leader was gone* (its process reaped) is acknowledged: acknowledgements the old
leader sent just before it died can still be on their way to the client, and writes sent in the
milliseconds between the signal and the process's end can still reach it; neither is recovery. (A client that
retries a write across the election internally shows it as one slow write started before the
kill; the writers' next writes, started after it, are then acknowledged one round trip later.)
The longest pause between two consecutive acknowledgements around the kill is reported next to
it, because it also counts the time before the kill during which the old leader stopped answering.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kq.deploy.waiting import holds_within

if TYPE_CHECKING:
    from kq.bench.side_by_side import CompareSettings
    from kq.deploy.cluster import LocalCluster

ACKS_MAX = 2_000_000  # A bound on the log: far more than a 60-second window produces here.


@dataclass(frozen=True, slots=True)
class FailoverSample:
    """One kill -9 of the leader under load."""

    killed: str  # The node or server that led when it was killed.
    gap_s: float | None  # Kill → first acknowledgement after it; None if none came within the window.
    longest_pause_s: float  # Longest time between consecutive acknowledgements, from 1 s before the kill.
    acks_before_kill: int
    acks_after_kill: int
    errors: int  # Failed or timed-out writes (each was retried).
    window_s: float  # How long after the kill the writers kept going.


class AckLog:
    """(sent, acknowledged) monotonic times of writes, from many writers; bounded by `ACKS_MAX`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._acks: list[tuple[float, float]] = []
        self.errors = 0

    def ack(self, sent_at: float) -> None:
        """Records one write sent at `sent_at` and acknowledged now."""
        now = time.monotonic()
        with self._lock:
            if len(self._acks) < ACKS_MAX:
                self._acks.append((sent_at, now))

    def error(self) -> None:
        """Records one failed write."""
        with self._lock:
            self.errors += 1

    def recovered_after(self, moment: float) -> bool:
        """Whether a write sent after `moment` has been acknowledged."""
        with self._lock:
            return any(sent > moment for sent, _ in self._acks)

    def acks(self) -> list[tuple[float, float]]:
        """Every (sent, acknowledged) pair so far."""
        with self._lock:
            return list(self._acks)


def analyze(
    killed: str,
    acks: Sequence[tuple[float, float]],
    killed_at: float,
    dead_at: float,
    ended_at: float,
    errors: int,
) -> FailoverSample:
    """The gap and pauses of one failover run from its (sent, acknowledged) times (pure).

    `killed_at` is when SIGKILL was sent, `dead_at` when the killed process had been reaped.
    """
    assert killed_at <= dead_at <= ended_at, "kill, death and the window's end in that order"
    recovered = [done for sent, done in acks if sent > dead_at]
    gap_s = min(recovered) - killed_at if recovered else None
    ordered = sorted(done for _, done in acks)
    around = [t for t in ordered if t >= killed_at - 1.0]
    # Never recovered: the last pause runs to the end of the window.
    edges = around if recovered else [*around, ended_at]
    pauses = [later - earlier for earlier, later in itertools.pairwise(edges)]
    return FailoverSample(
        killed=killed,
        gap_s=gap_s,
        longest_pause_s=max(pauses, default=ended_at - killed_at),
        acks_before_kill=sum(1 for t in ordered if t <= killed_at),
        acks_after_kill=sum(1 for t in ordered if t > killed_at),
        errors=errors,
        window_s=ended_at - killed_at,
    )


RECOVERY_POLL_S = 0.01  # The failover's clock: how finely recovery is seen.
WRITER_JOIN_GRACE_S = 30.0


def kill_leader_under_load(
    cluster: LocalCluster,
    writer: Callable[[int, AckLog, threading.Event], None],
    writers: int,
    thread_prefix: str,
    settings: CompareSettings,
    writer_timeout_s: float,
) -> FailoverSample:
    """The failover scenario of every kq system: `writers` threads run `writer(partition, log, stop)`
    (one record in flight each); once all are acknowledged, after some load, the leader is killed;
    the sample measures until acknowledgements resume; then the killed node rejoins.

    `writer_timeout_s` is how long one writer may still take to return after `stop` (its client's
    longest retry).
    """
    counts = settings.counts
    leader = cluster.wait_ready()
    log, stop = AckLog(), threading.Event()
    threads = [
        threading.Thread(
            target=writer, args=(partition, log, stop), name=f"{thread_prefix}-{partition}", daemon=True
        )
        for partition in range(writers)
    ]
    for thread in threads:
        thread.start()
    try:
        holds_within(lambda: log.recovered_after(0.0), settings.scenario_time_cap_s, poll_s=RECOVERY_POLL_S)
        time.sleep(counts.failover_load_before_s)  # Load, not synchronization.
        killed_at = time.monotonic()
        cluster.kill_node(leader)  # Returns once the process is reaped.
        dead_at = time.monotonic()
        holds_within(lambda: log.recovered_after(dead_at), settings.failover_window_s, poll_s=RECOVERY_POLL_S)
        time.sleep(counts.failover_load_after_s)
    finally:
        stop.set()
        for thread in threads:
            thread.join(writer_timeout_s + WRITER_JOIN_GRACE_S)
    ended_at = time.monotonic()
    sample = analyze(leader, log.acks(), killed_at, dead_at, ended_at, log.errors)
    cluster.start_node(leader)
    cluster.wait_ready()
    return sample
