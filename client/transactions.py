"""Kafka transactions as kq's client sees them: the coordinator's list of transactional ids and their
states (ListTransactions, answered from any node's replica of group 0). Producing in a transaction is
a Kafka client's (README, "Kafka clients"); kq's own producer is idempotent, not transactional."""

from __future__ import annotations

from dataclasses import dataclass

from kq.client.calls import Calls
from kq.proto import kq_pb2
from kq.proto.txn_states import STATE_NAMES


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    """A transactional id and its transaction as the coordinator keeps it."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str  # Kafka's name: Empty, Ongoing, PrepareCommit, ...
    timeout_ms: int
    started_ms: int  # When the current (or last) transaction began; 0: none yet.
    partitions: tuple[tuple[str, int], ...]
    groups: tuple[str, ...]


class TransactionsApi:
    """ListTransactions; `KqClient` provides `_connections`."""

    _connections: Calls

    def list_transactions(self, transactional_id: str = "") -> list[TransactionDescription]:
        """Every transactional id (up to the broker's limit) with its state, or only `transactional_id`'s
        (an empty list when the cluster does not know it)."""
        request = kq_pb2.ListTransactionsRequest(transactional_id=transactional_id)
        response = self._connections.read("ListTransactions", request, group=0)
        return [
            TransactionDescription(
                info.transactional_id,
                info.state.producer_id,
                info.state.producer_epoch,
                STATE_NAMES.get(info.state.phase, "Unknown"),
                info.state.timeout_ms,
                info.state.started_ms,
                tuple((p.topic, p.partition) for p in info.state.partitions),
                tuple(info.state.groups),
            )
            for info in response.transactions
        ]
