"""Reader admission: how many calls may wait for records at once on this node, in all and per client.

A waiting reader (a FetchStream stream, or a Fetch that has nothing to answer yet and waits up to
its `wait_ms`) holds one gRPC worker thread for its whole wait. Without a bound, `--grpc-workers`
waiting readers take every thread, and every other call to the node (Produce, ListTopics,
ClusterStatus, even a redirect) queues behind them until one ends. So readers hold at most
READERS_WORKERS_SHARE of the workers, one client connection (one gRPC peer, as `context.peer()`
names it) at most READERS_PEER_SHARE of those, and one more is refused at once with
TOO_MANY_READERS (retriable: the client backs off, or reads from another node).

A Fetch that answers without waiting (`wait_ms` 0, or records already there) takes no slot.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kq.broker.config import ConfigError
from kq.broker.errors import TooManyReadersError
from kq.proto.limits import (
    GRPC_WORKERS_MIN,
    GRPC_WORKERS_RESERVED_MIN,
    READERS_PEER_SHARE,
    READERS_WORKERS_SHARE,
)


@dataclass(frozen=True, slots=True)
class ReaderLimits:
    """The reader slots of a node with `workers` gRPC worker threads."""

    workers: int
    readers_max: int  # Waiting readers of the whole node.
    peer_readers_max: int  # Waiting readers of one client connection.


def reader_limits(workers: int) -> ReaderLimits:
    """The limits derived from the worker count; ConfigError when they would leave too few workers."""
    readers_max = int(workers * READERS_WORKERS_SHARE)
    if workers < GRPC_WORKERS_MIN or readers_max < 1 or workers - readers_max < GRPC_WORKERS_RESERVED_MIN:
        raise ConfigError(
            f"--grpc-workers {workers} is too few (at least {GRPC_WORKERS_MIN}): waiting readers may take "
            f"{READERS_WORKERS_SHARE:.0%} of them and {GRPC_WORKERS_RESERVED_MIN} must stay for other calls"
        )
    return ReaderLimits(workers, readers_max, max(1, int(readers_max * READERS_PEER_SHARE)))


class ReaderAdmission:
    """Counts the waiting readers, in all and per peer, and refuses one past either limit.

    Thread-safe (one lock, held only to count). The per-peer map holds only peers with a reader
    waiting (an entry is removed when its count reaches 0), so it has at most `readers_max` entries.
    """

    def __init__(self, limits: ReaderLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._readers = 0
        self._by_peer: dict[str, int] = {}

    @classmethod
    def for_workers(cls, workers: int) -> ReaderAdmission:
        """Admission for a node with `workers` gRPC worker threads (ConfigError if too few)."""
        return cls(reader_limits(workers))

    def acquire(self, peer: str) -> None:
        """Takes a slot for `peer`, or raises TooManyReadersError naming the limit it is at."""
        with self._lock:
            held = self._by_peer.get(peer, 0)
            if self._readers >= self.limits.readers_max:
                raise TooManyReadersError(
                    f"this node serves its maximum of {self.limits.readers_max} waiting readers (streams and "
                    f"waiting fetches: {READERS_WORKERS_SHARE:.0%} of {self.limits.workers} gRPC workers); "
                    "retry later or read from another node"
                )
            if held >= self.limits.peer_readers_max:
                raise TooManyReadersError(
                    f"this client connection holds its maximum of {self.limits.peer_readers_max} waiting "
                    f"readers on this node ({READERS_PEER_SHARE:.0%} of its {self.limits.readers_max}); "
                    "retry later or read from another node"
                )
            self._readers += 1
            self._by_peer[peer] = held + 1

    def release(self, peer: str) -> None:
        """Gives back a slot `peer` took."""
        with self._lock:
            held = self._by_peer.get(peer, 0)
            assert held > 0 and self._readers > 0, "a reader slot released that was never taken"
            self._readers -= 1
            if held == 1:
                del self._by_peer[peer]
            else:
                self._by_peer[peer] = held - 1

    @contextmanager
    def admitted(self, peer: str) -> Iterator[None]:
        """Holds a slot for `peer` while the block runs, however it ends (a return, an exception, a
        generator closed by a cancelled stream); refuses at once when there is none."""
        self.acquire(peer)
        try:
            yield
        finally:
            self.release(peer)

    def readers(self) -> int:
        """Slots held now."""
        with self._lock:
            return self._readers

    def peers(self) -> int:
        """Peers holding a slot now (the per-peer map's size)."""
        with self._lock:
            return len(self._by_peer)
