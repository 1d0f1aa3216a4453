"""A single-replica Consensus for in-process tests: proposals apply at once to a real store."""

from __future__ import annotations

import threading
from collections.abc import Callable

from kq.broker.consensus import ConsensusStatus
from kq.raft.results import ApplyResult
from kq.raft.state_machine import apply
from kq.storage import Store


class FakeConsensus:
    """Leads (or not) as told; commits every proposal immediately, in order."""

    def __init__(self, store: Store, on_applied: Callable[[int], None]) -> None:
        self.store = store
        self.leader = True
        self.leader_address: str | None = None
        self.proposals = 0
        self._on_applied = on_applied
        self._lock = threading.Lock()

    def propose(self, data: bytes, callback: Callable[[ApplyResult | None, int], None]) -> None:
        """Applies `data` as the next index and reports success."""
        with self._lock:
            self.proposals += 1
            index = self.store.applied_index() + 1
            result = apply(self.store, index, data)
        self._on_applied(index)
        callback(result, 0)

    def is_leader(self) -> bool:
        """As set by the test."""
        return self.leader

    def leader_grpc_address(self) -> str | None:
        """As set by the test."""
        return self.leader_address

    def term(self) -> int:
        """Term 1, as `status` says."""
        return 1

    def status(self) -> ConsensusStatus:
        """A one-node cluster."""
        index = self.store.applied_index()
        return ConsensusStatus("leader" if self.leader else "follower", "1", "", 1, index, index, {}, True, 1)
