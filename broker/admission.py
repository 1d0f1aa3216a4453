"""Reader admission: how many calls may wait at once on this node, in all and per client connection.

A waiting call (a FetchStream stream; a Fetch with nothing to answer yet that waits up to its
`wait_ms`; a Heartbeat or JoinGroup waiting for its group to change) is a coroutine on the node's
serving loop (broker/front.py): it holds no thread, but its call, its future and at most one stream
message waiting to be written cost memory. So a node admits at most `readers_max` of them, one
client connection (one gRPC peer, as `context.peer()` names it) at most `peer_readers_max`, and one
more is refused at once with TOO_MANY_READERS (retriable: the client backs off, or reads from
another node). Produce, metadata and status calls never count here: they keep their own capacity.

A Fetch that answers without waiting (`wait_ms` 0, or records already there) takes no slot.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kq.broker.errors import TooManyReadersError
from kq.proto.limits import (
    PRODUCE_STREAMS_MAX,
    PRODUCE_STREAMS_PER_CONNECTION_MAX,
    READERS_MAX,
    READERS_PER_CONNECTION_MAX,
)


@dataclass(frozen=True, slots=True)
class ReaderLimits:
    """The waiting calls one node admits."""

    readers_max: int = READERS_MAX  # Of the whole node.
    peer_readers_max: int = READERS_PER_CONNECTION_MAX  # Of one client connection.
    # What a refusal calls them (and, for the node's limit, which calls they are), and what the
    # client may do instead.
    kind: str = "waiting readers"
    which: str = " (streams, waiting fetches and group waits)"
    instead: str = "retry later or read from another node"


# Open ProduceStream calls are admitted apart (broker/service.py): a node full of readers still takes
# produce streams, and a client refused one sends unary Produce calls instead.
PRODUCE_STREAM_LIMITS = ReaderLimits(
    PRODUCE_STREAMS_MAX,
    PRODUCE_STREAMS_PER_CONNECTION_MAX,
    "produce streams",
    "",
    "send Produce calls instead",
)


class ReaderAdmission:
    """Counts the waiting readers, in all and per peer, and refuses one past either limit.

    Used on the serving loop; thread-safe anyway (one lock, held only to count). The per-peer map
    holds only peers with a reader waiting (an entry is removed when its count reaches 0), so it has
    at most `readers_max` entries.
    """

    def __init__(self, limits: ReaderLimits = ReaderLimits()) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._readers = 0
        self._by_peer: dict[str, int] = {}

    def acquire(self, peer: str) -> None:
        """Takes a slot for `peer`, or raises TooManyReadersError naming the limit it is at."""
        with self._lock:
            held = self._by_peer.get(peer, 0)
            if self._readers >= self.limits.readers_max:
                raise TooManyReadersError(
                    f"this node serves its maximum of {self.limits.readers_max} {self.limits.kind}"
                    f"{self.limits.which}; {self.limits.instead}"
                )
            if held >= self.limits.peer_readers_max:
                raise TooManyReadersError(
                    f"this client connection holds its maximum of {self.limits.peer_readers_max} "
                    f"{self.limits.kind} on this node; {self.limits.instead}"
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
