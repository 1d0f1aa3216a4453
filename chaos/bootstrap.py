"""The bootstrap list the workload's clients connect to, which follows the cluster's members."""

from __future__ import annotations

import threading
from collections.abc import Sequence


class Bootstrap:
    """The gRPC addresses the workload's clients connect to, replaced when the cluster's members change.

    A KqClient finds the leader from its bootstrap nodes and the leader hints they give; it does not
    learn of members added later. Once the nodes it was given are gone, only the list an operator
    hands it keeps it working, so the scenario replaces the list here and the clients take it up.
    Thread-safe: the scenario replaces it while the workload's threads read it.
    """

    def __init__(self, addresses: Sequence[str]) -> None:
        self._lock = threading.Lock()
        self._addresses = tuple(addresses)

    def addresses(self) -> tuple[str, ...]:
        """The current list."""
        with self._lock:
            return self._addresses

    def replace(self, addresses: Sequence[str]) -> None:
        """Makes `addresses` the list from now on."""
        with self._lock:
            self._addresses = tuple(addresses)
