"""A node's periodic background thread: started once, stopped by an Event and joined.

The leader-side loops (`kq-groups`, broker/groups.py; `kq-retention`, broker/retention.py;
`kq-compactor`, broker/compactor.py) share this: a subclass sets `thread_name` and writes `_run`,
which waits on `self._stopping` between rounds so `stop()` ends it within one round. `LeaderRounds`
is the loop of the two that act on topics by their configs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kq.broker.consensus import Consensus
from kq.broker.errors import KqError
from kq.proto.limits import PROPOSAL_TIMEOUT_S
from kq.raft.topic_config import TopicConfig, decode_overrides, effective
from kq.storage import Store, TopicMeta

logger = logging.getLogger(__name__)


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


class LeaderRounds(BackgroundThread):
    """Every `check_s`, on the leader only, one `run_once` (retention and compaction over the topics,
    with this node's topic config defaults; producer expiry over the producer windows).

    A round that loses leadership or a commit (KqError) ends with one log line; the next retries.
    """

    def __init__(
        self,
        store: Store,
        consensus: Consensus,
        clock_ms: Callable[[], int],
        topic_defaults: Mapping[str, str],
        check_s: float,
    ) -> None:
        self._store = store
        self._consensus = consensus
        self._clock_ms = clock_ms
        self._topic_defaults = dict(topic_defaults)
        self._check_s = check_s
        super().__init__()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stops the thread; a proposal in flight ends within PROPOSAL_TIMEOUT_S."""
        super().stop(PROPOSAL_TIMEOUT_S + self._check_s if timeout_s is None else timeout_s)

    def run_once(self) -> Any:
        """One round (the subclass's)."""
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stopping.wait(self._check_s):
            if not self._consensus.is_leader():
                continue
            try:
                self.run_once()
            except KqError as error:  # Lost leadership, no commit in time: the next round retries.
                logger.info("%s round stopped: %s", self.thread_name, error)

    def topic_configs(self) -> list[tuple[TopicMeta, TopicConfig]]:
        """Every topic with the configs in effect (overrides over this node's defaults), by name."""
        with self._store.read() as reader:
            overrides = [(t, decode_overrides(reader.topic_configs(t.topic_id))) for t in reader.topics()]
        return [(topic, effective(values, self._topic_defaults)) for topic, values in overrides]
