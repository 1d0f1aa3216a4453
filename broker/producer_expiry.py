"""Producer id expiry: the leader of each Raft group proposes the sweeps that forget idle producers.

Kafka forgets a producer's state on a partition once it has not written there for
`producer.id.expiration.ms` (default one day) and holds no ongoing transaction there, checked every
`producer.id.expiration.check.interval.ms` (ProducerStateManager, KIP-360). In kq that state is a
`producers` row (storage/__init__.py) per producer and partition, and the decision is apply's
(raft/state_machine.py `_apply_expire_producers`): every replica deletes the same rows, judged at the
entry's clock and expiration alone. This thread only chooses when: each check interval, on the
leader, it proposes `ExpireProducersCommand`s carrying its clock and its configured expiration until
one reports the table swept to its end (each looks at PRODUCER_EXPIRY_ROWS_PER_ENTRY_MAX rows and the
next resumes where it stopped), at most PRODUCER_EXPIRY_ENTRIES_PER_CHECK_MAX a check; a group whose
store remembers no producer gets none. Every group sweeps its own partitions' rows (DESIGN.md,
"Scale-out"); the thread runs in each group's process.

In group 0, the transactions coordinator's group, the same check also forgets idle transactional ids
(Kafka's `transactional.id.expiration.ms`, default 7 days): `ExpireTransactionalIdsCommand`s, bounded
by TXN_ID_EXPIRY_ROWS_PER_ENTRY_MAX ids an entry in apply (raft/transactions.py `apply_expire_ids`).

Thread: `kq-producer-expiry` (started by `start()`, stopped by `stop()`: an Event, then joined). It
owns nothing but its Event; the store and consensus are thread-safe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kq.broker.background import LeaderRounds
from kq.broker.consensus import Consensus
from kq.broker.metrics import PRODUCER_WINDOWS_EXPIRED
from kq.broker.proposals import propose_and_wait
from kq.proto import kq_pb2
from kq.proto.limits import PRODUCER_EXPIRY_ENTRIES_PER_CHECK_MAX, PROPOSAL_TIMEOUT_S
from kq.raft import commands
from kq.raft.results import ExpiryResult
from kq.storage import Store

logger = logging.getLogger(__name__)

THREAD_NAME = "kq-producer-expiry"


class ProducerExpiry(LeaderRounds):
    """The leader's producer id expiry loop (see the module docstring)."""

    thread_name = THREAD_NAME

    def __init__(
        self,
        store: Store,
        consensus: Consensus,
        clock_ms: Callable[[], int],
        expiration_ms: int,
        check_s: float,
        transactional_id_expiration_ms: int | None = None,
    ) -> None:
        """`transactional_id_expiration_ms`: None in a group that coordinates no transactions (every
        group but group 0): no id sweep there."""
        super().__init__(store, consensus, clock_ms, {}, check_s)  # No topic configs: it reads none.
        self._expiration_ms = expiration_ms
        self._txn_id_expiration_ms = transactional_id_expiration_ms

    def run_once(self) -> int:
        """Proposes producer window sweeps until one reaches the table's end (or the per-check bound,
        or a stop), then (group 0) the transactional id sweeps alike; returns the windows expired."""
        with self._store.read() as reader:
            windows = reader.has_producer_windows()
            ids = self._txn_id_expiration_ms is not None and reader.transaction_count() > 0
        expired = 0
        if windows:
            expired = self._sweep(lambda now_ms: commands.expire_producers(now_ms, self._expiration_ms))
            PRODUCER_WINDOWS_EXPIRED.inc(expired)
            if expired:
                logger.info("producer expiry: %d idle producer windows expired", expired)
        if ids and self._txn_id_expiration_ms is not None:
            expiration_ms = self._txn_id_expiration_ms
            forgotten = self._sweep(lambda now_ms: commands.expire_transactional_ids(now_ms, expiration_ms))
            if forgotten:
                logger.info("producer expiry: %d idle transactional ids expired", forgotten)
        return expired

    def _sweep(self, command_at: Callable[[int], kq_pb2.Command]) -> int:
        """Proposes `command_at(clock)` until an entry reaches its table's end, at most
        PRODUCER_EXPIRY_ENTRIES_PER_CHECK_MAX times; the rows they deleted."""
        expired = 0
        for _ in range(PRODUCER_EXPIRY_ENTRIES_PER_CHECK_MAX):
            if self._stopping.is_set():
                break
            result = propose_and_wait(self._consensus, command_at(self._clock_ms()), PROPOSAL_TIMEOUT_S)
            if not isinstance(result, ExpiryResult):  # Refused (a bad flag is refused at start).
                logger.warning("producer expiry: the sweep was not applied: %s", result)
                break
            expired += result.expired
            if result.wrapped:
                break
        return expired
