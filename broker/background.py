"""A node's periodic background thread: started once, stopped by an Event and joined.

The leader-side loops (`kq-groups`, broker/groups.py; `kq-retention`, broker/retention.py) share
this: a subclass sets `thread_name` and writes `_run`, which waits on `self._stopping` between rounds
so `stop()` ends it within one round.
"""

from __future__ import annotations

import threading


class BackgroundThread:
    """One named daemon thread running `_run` until `stop()`."""

    thread_name: str  # Each subclass names its thread (and DESIGN.md's thread table lists it).

    def __init__(self) -> None:
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Starts the thread (once)."""
        assert self._thread is None, "started twice"
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Asks the thread to stop and joins it (at most `timeout_s`; None waits for it)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        raise NotImplementedError
