"""The transaction RPCs of the Broker service (a mixin of BrokerService): the coordinator's steps on
group 0's leader, the markers on each group's leader, and the listing any replica of group 0 answers.

The Kafka edge (broker/kafka/transactions.py) calls these for InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn and TxnOffsetCommit, forwarding to group 0's leader like other cluster writes.
EndTxn answers once the outcome is replicated (PREPARE_*) and its markers are written, or, when a
group's leader cannot be reached, once decided: the coordinator's driver finishes it.
"""

from __future__ import annotations

import logging

import grpc

from kq.broker.errors import InvalidArgumentError, KqError, UnavailableError, error_for_code
from kq.broker.proposals import propose_and_wait, wall_clock_ms
from kq.broker.service_base import ServiceBase
from kq.broker.txn_coordinator import TransactionFinisher, stored_state
from kq.broker.validation import check
from kq.proto import kq_pb2
from kq.proto.limits import PROPOSAL_TIMEOUT_S, TXN_LIST_MAX
from kq.raft import commands
from kq.raft.placement import METADATA_GROUP
from kq.raft.results import ErrorCode, TransactionResult
from kq.raft.transactions import PREPARED, timeout_problem, transactional_id_problem

logger = logging.getLogger(__name__)


class TransactionRpcs(ServiceBase):
    """InitTransaction, AddToTransaction, EndTransaction, TxnCommitOffsets, WriteTxnMarkers and
    ListTransactions."""

    # Writes a decided transaction's markers and completes it (set by the node; None: no Raft here).
    transaction_finisher: TransactionFinisher | None = None

    def _propose_transaction(self, command: kq_pb2.Command, transactional_id: str) -> TransactionResult:
        result = propose_and_wait(self._consensus, command, PROPOSAL_TIMEOUT_S)
        assert isinstance(result, TransactionResult), f"a transaction command answered {result!r}"
        error = error_for_code(result.error, transactional_id)
        if error is not None:
            raise error
        return result

    def _propose_finishing(self, command: kq_pb2.Command, transactional_id: str) -> TransactionResult:
        """`_propose_transaction`, and when the id's previous transaction is still being finished
        (CONCURRENT_TRANSACTIONS: prepared, or an older instance's just aborted), finishes it here and
        proposes once more, so the client need not wait for the driver's next round."""
        try:
            return self._propose_transaction(command, transactional_id)
        except KqError as error:
            if error.code != ErrorCode.CONCURRENT_TRANSACTIONS or not self._finish(transactional_id):
                raise
            return self._propose_transaction(command, transactional_id)

    def _finish(self, transactional_id: str) -> bool:
        """Finishes the id's transaction when it is prepared (markers, completion); whether it is no
        longer prepared. A failure is left to the driver."""
        finisher = self.transaction_finisher
        state = stored_state(self._store, transactional_id)
        if state is None or state.phase not in PREPARED:
            return True
        if finisher is None:
            return False
        try:
            finisher.finish(transactional_id)
        except KqError as error:
            logger.info(
                "transaction %s decided; its markers wait for the driver: %s", transactional_id, error
            )
            return False
        return True

    def InitTransaction(
        self, request: kq_pb2.InitTransactionRequest, context: grpc.ServicerContext | None
    ) -> kq_pb2.TransactionResponse:
        """InitProducerId of a transactional id: its producer id and new epoch. An open transaction of
        an older instance is aborted first (finished here when its groups answer, else the caller
        retries on CONCURRENT_TRANSACTIONS)."""
        self._require_leader(METADATA_GROUP)
        check(transactional_id_problem(request.transactional_id))
        problem = timeout_problem(request.timeout_ms)
        if problem is not None:
            raise KqError(problem, ErrorCode.INVALID_TRANSACTION_TIMEOUT)
        init = kq_pb2.InitTransactionCommand(
            transactional_id=request.transactional_id, timeout_ms=request.timeout_ms, now_ms=wall_clock_ms()
        )
        result = self._propose_finishing(commands.transaction(init), request.transactional_id)
        return _response(result)

    def AddToTransaction(
        self, request: kq_pb2.AddToTransactionRequest, context: grpc.ServicerContext | None
    ) -> kq_pb2.TransactionResponse:
        """AddPartitionsToTxn / AddOffsetsToTxn: the partitions and groups join the open transaction."""
        self._require_leader(METADATA_GROUP)
        add = kq_pb2.AddToTransactionCommand(
            transactional_id=request.transactional_id,
            producer_id=request.producer_id,
            producer_epoch=request.producer_epoch,
            partitions=request.partitions,
            groups=request.groups,
            now_ms=wall_clock_ms(),
        )
        result = self._propose_finishing(commands.transaction(add), request.transactional_id)
        return _response(result)

    def EndTransaction(
        self, request: kq_pb2.EndTransactionRequest, context: grpc.ServicerContext | None
    ) -> kq_pb2.TransactionResponse:
        """EndTxn: commits or aborts; answered once decided and, when every group answers, marked."""
        self._require_leader(METADATA_GROUP)
        end = kq_pb2.EndTransactionCommand(
            transactional_id=request.transactional_id,
            producer_id=request.producer_id,
            producer_epoch=request.producer_epoch,
            commit=request.commit,
            now_ms=wall_clock_ms(),
        )
        try:
            result = self._propose_transaction(commands.transaction(end), request.transactional_id)
        except KqError as error:
            # A retry of an end being finished: finish it and answer as decided.
            if error.code != ErrorCode.CONCURRENT_TRANSACTIONS or not self._finish(request.transactional_id):
                raise
            return kq_pb2.TransactionResponse(
                producer_id=request.producer_id, producer_epoch=request.producer_epoch
            )
        self._finish(request.transactional_id)
        return _response(result)

    def TxnCommitOffsets(
        self, request: kq_pb2.TxnCommitOffsetsRequest, context: grpc.ServicerContext | None
    ) -> kq_pb2.TransactionResponse:
        """TxnOffsetCommit: a consumer group's offsets, committed by the transaction's COMMIT marker."""
        self._require_leader(self._groups.coordinator_of(request.group))
        offsets = kq_pb2.TxnCommitOffsetsCommand(
            transactional_id=request.transactional_id,
            producer_id=request.producer_id,
            producer_epoch=request.producer_epoch,
            group=request.group,
            offsets=request.offsets,
            commit_ms=wall_clock_ms(),
            member_id=request.member_id,
            generation=request.generation,
            group_instance_id=request.group_instance_id,
        )
        result = self._propose_transaction(commands.transaction(offsets), request.transactional_id)
        return _response(result)

    def WriteTxnMarkers(
        self, request: kq_pb2.WriteTxnMarkersRequest, context: grpc.ServicerContext | None
    ) -> kq_pb2.WriteTxnMarkersResponse:
        """The coordinator's markers for this process's group (on its leader): control batches in the
        partitions the producer's transaction wrote to here."""
        if request.group >= self._groups.count:
            raise InvalidArgumentError(f"no Raft group {request.group}: the cluster has {self._groups.count}")
        self._require_leader(request.group)
        known = self._groups.leader(METADATA_GROUP).term
        if request.marker.coordinator_epoch > known:
            # A coordinator epoch is group 0's term: one newer than this node knows would fence every
            # later coordinator's markers in this group (raft/transactions.py `_marker`), so it waits
            # until this node's replica of group 0 has seen that term (the coordinator retries).
            raise UnavailableError(
                f"coordinator epoch {request.marker.coordinator_epoch} is newer than group 0's term "
                f"{known} here; retry",
                ErrorCode.NOT_CAUGHT_UP,
            )
        marker = kq_pb2.TransactionMarkerCommand()
        marker.CopyFrom(request.marker)
        marker.leader_epoch = self._consensus.term()  # This group's: the markers' partitionLeaderEpoch.
        result = propose_and_wait(self._consensus, commands.transaction(marker), PROPOSAL_TIMEOUT_S)
        assert isinstance(result, TransactionResult), f"a marker answered {result!r}"
        if result.error != ErrorCode.OK:  # A deposed coordinator's (raft/transactions.py `_marker`).
            raise KqError("a newer transaction coordinator marked here: this one is fenced", result.error)
        return kq_pb2.WriteTxnMarkersResponse(written=result.written)

    def ListTransactions(
        self, request: kq_pb2.ListTransactionsRequest, context: grpc.ServicerContext | None
    ) -> kq_pb2.ListTransactionsResponse:
        """Transactional ids and their states, from this node's replica of group 0 (one id, or all up to
        TXN_LIST_MAX)."""
        self._require_group_replica(METADATA_GROUP)
        if request.transactional_id:
            check(transactional_id_problem(request.transactional_id))
        with self._store.read() as reader:
            if request.transactional_id:
                raw = reader.transaction_state(request.transactional_id)
                rows = [] if raw is None else [(request.transactional_id, raw)]
            else:
                rows = reader.transaction_states(TXN_LIST_MAX)
        return kq_pb2.ListTransactionsResponse(
            transactions=[
                kq_pb2.TransactionInfo(transactional_id=name, state=kq_pb2.TransactionState.FromString(raw))
                for name, raw in rows
            ]
        )


def _response(result: TransactionResult) -> kq_pb2.TransactionResponse:
    """A transaction RPC's answer: the id's producer id and epoch after the step."""
    return kq_pb2.TransactionResponse(producer_id=result.producer_id, producer_epoch=result.producer_epoch)
