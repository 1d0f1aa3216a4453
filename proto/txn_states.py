"""Kafka's names of the transaction states (its TransactionState.scala), by kq's TxnPhase: what
DescribeTransactions and ListTransactions answer and what kafka-transactions.sh and `kq transactions`
show. One table for the broker and the client (both import kq.proto)."""

from __future__ import annotations

from kq.proto import kq_pb2

STATE_NAMES: dict[int, str] = {
    kq_pb2.TXN_EMPTY: "Empty",
    kq_pb2.TXN_ONGOING: "Ongoing",
    kq_pb2.TXN_PREPARE_COMMIT: "PrepareCommit",
    kq_pb2.TXN_PREPARE_ABORT: "PrepareAbort",
    kq_pb2.TXN_COMPLETE_COMMIT: "CompleteCommit",
    kq_pb2.TXN_COMPLETE_ABORT: "CompleteAbort",
}
