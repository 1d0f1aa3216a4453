"""The console's lag sampler: every CONSOLE_LAG_SAMPLE_S, each group's total lag into a bounded ring.

Thread `kq-console-lag` (started by `LagSampler.start()`, stopped and joined by `stop()`) owns the
client calls; `_lock` guards the rings, which page handlers read (`samples`). At most
CONSOLE_GROUPS_SAMPLED_MAX groups are sampled and CONSOLE_LAG_SAMPLES_MAX samples kept for each; a
group that disappears is forgotten.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from kq.client import KqClient, KqClientError
from kq.proto.limits import CONSOLE_GROUPS_SAMPLED_MAX, CONSOLE_LAG_SAMPLE_S, CONSOLE_LAG_SAMPLES_MAX

logger = logging.getLogger(__name__)


class LagSampler:
    """Samples every group's total lag (as `kq groups describe` computes it) in the background."""

    def __init__(self, client: KqClient, interval_s: float = CONSOLE_LAG_SAMPLE_S) -> None:
        self._client = client
        self._interval_s = interval_s
        self._rings: dict[str, deque[tuple[float, int]]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kq-console-lag", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def samples(self, group: str) -> list[tuple[float, int]] | None:
        """(monotonic time, total lag) of a group, oldest first; None when it is not sampled."""
        with self._lock:
            ring = self._rings.get(group)
            return None if ring is None else list(ring)

    def sample_once(self) -> None:
        """One round over the groups (the thread's loop body; tests call it directly)."""
        try:
            groups = [summary.name for summary in self._client.list_groups(self._client.leader_address())]
        except KqClientError as error:
            logger.info("lag sample skipped: %s", error)
            return
        groups = sorted(groups)[:CONSOLE_GROUPS_SAMPLED_MAX]
        taken: dict[str, int] = {}
        for group in groups:
            try:
                taken[group] = self._client.describe_group(group, self._client.leader_address()).total_lag
            except KqClientError:
                continue
        now_s = time.monotonic()
        with self._lock:
            for gone in set(self._rings) - set(groups):
                del self._rings[gone]
            for group, lag in taken.items():
                self._rings.setdefault(group, deque(maxlen=CONSOLE_LAG_SAMPLES_MAX)).append((now_s, lag))

    def _run(self) -> None:
        while not self._stopping.is_set():
            self.sample_once()
            self._stopping.wait(self._interval_s)
