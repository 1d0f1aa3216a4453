"""The transaction coordinator's moving parts (KIP-98), on the leader of group 0.

Its state machine is raft/transactions.py; this module moves a decided transaction through the groups:
`TransactionFinisher` writes its markers in every Raft group that holds one of its partitions (its own
group by a proposal, another group through that group's leader: `WriteTxnMarkers`, a node's own call)
and then proposes its completion; `TransactionDriver` (thread `kq-transactions`) is the coordinator's
timer: every TXN_DRIVER_PERIOD_S, while this process leads group 0, it finishes every prepared
transaction (those a previous leader decided and did not finish: a failover finishes them) and
aborts every ONGOING one past its transaction.timeout.ms (fencing its producer).

Each step is replicated before the next, and each is idempotent, so a crash at any point leaves a state
the next round (on this leader or the next) completes: PREPARE_* says what the markers are; a marker
repeated writes nothing; a completion repeated changes nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import grpc

from kq.broker.background import BackgroundThread
from kq.broker.consensus import Consensus
from kq.broker.errors import KqError, UnavailableError
from kq.broker.groups_view import GroupsView
from kq.broker.membership import node_channel
from kq.broker.proposals import propose_and_wait, wall_clock_ms
from kq.proto import kq_pb2, kq_pb2_grpc
from kq.proto.limits import (
    MARKER_CHANNELS_MAX,
    PROPOSAL_TIMEOUT_S,
    TRANSACTIONAL_IDS_MAX,
    TXN_DRIVER_PERIOD_S,
    TXN_FINISH_LOCKS,
    TXN_HANGING_ABORT_MS,
    TXN_HANGING_CHECK_S,
    TXN_HANGING_ROWS_MAX,
    TXN_MARKER_TIMEOUT_S,
)
from kq.raft import commands
from kq.raft.placement import METADATA_GROUP
from kq.raft.results import ErrorCode, TransactionResult
from kq.raft.transactions import ONGOING, PREPARE_COMMIT, PREPARED
from kq.storage import Store

logger = logging.getLogger(__name__)


def stored_state(store: Store, transactional_id: str) -> kq_pb2.TransactionState | None:
    """The id's transaction state in this process's store (group 0's replica), or None."""
    with store.read() as reader:
        raw = reader.transaction_state(transactional_id)
    return None if raw is None else kq_pb2.TransactionState.FromString(raw)


# Asks group `request.group`'s leader (at the gRPC address) to write markers; returns how many it wrote.
MarkerCall = Callable[[str, kq_pb2.WriteTxnMarkersRequest, float], int]


class MarkerChannels:
    """A MarkerCall over gRPC with the node's own TLS as a client (None: plain text) and its node proof,
    keeping one channel per leader address (at most RAFT_GROUPS_MAX x PEERS_MAX; every EndTxn writes
    markers, so a channel made per call would add a connection's setup to each). Thread-safe."""

    def __init__(
        self, credentials: grpc.ChannelCredentials | None, metadata: tuple[tuple[str, str], ...]
    ) -> None:
        self._credentials = credentials
        self._metadata = metadata
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}  # By gRPC address; guarded by _lock.

    def __call__(self, address: str, request: kq_pb2.WriteTxnMarkersRequest, timeout_s: float) -> int:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                if len(self._channels) >= MARKER_CHANNELS_MAX:
                    self._close_all()
                channel = self._channels[address] = node_channel(address, self._credentials)
        response = kq_pb2_grpc.BrokerStub(channel).WriteTxnMarkers(
            request, timeout=timeout_s, metadata=self._metadata
        )
        return int(response.written)

    def close(self) -> None:
        """Closes every channel (the node stops)."""
        with self._lock:
            self._close_all()

    def _close_all(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()


class TransactionFinisher:
    """Writes a decided transaction's markers in every group, then completes it (group 0's leader)."""

    def __init__(
        self,
        store: Store,
        consensus: Consensus,
        groups: GroupsView,
        call: MarkerCall | None,
        clock_ms: Callable[[], int],
    ) -> None:
        """`call`: how to reach another group's leader (None: one group, every partition here)."""
        self._store = store
        self._consensus = consensus
        self._groups = groups
        self._call = call
        self._clock_ms = clock_ms
        # One finisher at a time per transactional id (striped: a lock per id would be a map to bound).
        self._locks = tuple(threading.Lock() for _ in range(TXN_FINISH_LOCKS))

    def finish(self, transactional_id: str) -> bool:
        """Markers, then completion, of the id's transaction if it is PREPARE_COMMIT or PREPARE_ABORT
        (else nothing); whether it finished one. Raises KqError when a group's leader is unknown or a
        step does not commit (the driver tries again).

        The state is read here, under the id's lock, never taken from a caller: EndTxn's handler and the
        driver both finish, and one that read the state before the other completed the transaction
        would otherwise write that transaction's markers after it: the producer's next transaction
        (the same producer id and epoch) may already be open in a partition, and a late COMMIT would
        close it there as committed (its ABORT then finds nothing open), a late ABORT would drop its
        records. Under the lock the state stays PREPARED until this call completes it (only a finisher
        moves it on, and a newer leader's steps would be applied here first), and it is read again
        before each group's markers, with this node's leadership, so that a coordinator deposed
        mid-way stops (DESIGN.md "Transactions": what is left of that window)."""
        with self._locks[hash(transactional_id) % len(self._locks)]:
            epoch = self._consensus.term()  # Read first: the state below is this term's leader's or newer.
            state = self._prepared(transactional_id)
            if state is None:
                return False
            commit = state.phase == PREPARE_COMMIT
            for group, marker in self._markers(state, commit, epoch).items():
                if (
                    self._prepared(transactional_id) != state
                    or not self._consensus.is_leader()
                    or self._consensus.term() != epoch
                ):
                    raise UnavailableError(
                        f"transaction {transactional_id} moved on or this node stopped leading; not marked"
                    )
                self._write(group, marker)
            complete = kq_pb2.CompleteTransactionCommand(
                transactional_id=transactional_id,
                producer_id=state.producer_id,
                producer_epoch=state.producer_epoch,
                commit=commit,
                now_ms=self._clock_ms(),
            )
            propose_and_wait(self._consensus, commands.transaction(complete), PROPOSAL_TIMEOUT_S)
            return True

    def _prepared(self, transactional_id: str) -> kq_pb2.TransactionState | None:
        """The id's state in this process's store when it is PREPARE_COMMIT or PREPARE_ABORT, else None."""
        state = stored_state(self._store, transactional_id)
        return state if state is not None and state.phase in PREPARED else None

    def _markers(
        self, state: kq_pb2.TransactionState, commit: bool, coordinator_epoch: int
    ) -> dict[int, kq_pb2.TransactionMarkerCommand]:
        """The marker command of each group: its partitions of the transaction; the consumer groups' offsets
        go to the group that coordinates them (group 0, with or without partitions there). Each names
        `coordinator_epoch`, group 0's term when the state was read (its groups ignore it once a newer
        coordinator's marker was applied there: raft/transactions.py `_marker`)."""
        by_group: dict[int, list[kq_pb2.TxnPartition]] = {}
        with self._store.read() as reader:
            for named in state.partitions:
                topic = reader.topic(named.topic)
                if topic is None or named.partition >= topic.partitions:
                    continue  # Deleted since: nothing of it to mark.
                by_group.setdefault(self._groups.group_of(topic, named.partition), []).append(named)
        if state.groups:
            by_group.setdefault(METADATA_GROUP, [])
        now_ms = self._clock_ms()
        return {
            group: kq_pb2.TransactionMarkerCommand(
                producer_id=state.producer_id,
                producer_epoch=state.producer_epoch,
                commit=commit,
                partitions=partitions,
                groups=state.groups if group == METADATA_GROUP else (),
                timestamp_ms=now_ms,
                coordinator_epoch=coordinator_epoch,
            )
            for group, partitions in sorted(by_group.items())
        }

    def _write(self, group: int, marker: kq_pb2.TransactionMarkerCommand) -> None:
        if group == self._groups.group:
            marker.leader_epoch = self._consensus.term()
            result = propose_and_wait(self._consensus, commands.transaction(marker), PROPOSAL_TIMEOUT_S)
            assert isinstance(result, TransactionResult), f"a marker answered {result!r}"
            if result.error != ErrorCode.OK:  # A newer coordinator's markers were applied: fenced.
                raise KqError(f"group {group} fenced this coordinator's markers", result.error)
            return
        leader = self._groups.leader_process(group)
        if leader is None or self._call is None:
            raise UnavailableError(f"group {group} has no known leader for the markers; retry")
        try:
            self._call(
                leader.grpc_address,
                kq_pb2.WriteTxnMarkersRequest(group=group, marker=marker),
                TXN_MARKER_TIMEOUT_S,
            )
        except grpc.RpcError as error:
            raise UnavailableError(
                f"group {group}'s leader did not write the markers: {error.code()}"
            ) from error


class TransactionDriver(BackgroundThread):
    """`kq-transactions`: on group 0's leader, finishes prepared transactions and aborts expired ones; on
    every group's leader, aborts hanging ones (`abort_hanging`)."""

    thread_name = "kq-transactions"

    def __init__(
        self,
        store: Store,
        consensus: Consensus,
        groups: GroupsView,
        finisher: TransactionFinisher,
        clock_ms: Callable[[], int],
        period_s: float = TXN_DRIVER_PERIOD_S,
    ) -> None:
        self._store = store
        self._consensus = consensus
        self._groups = groups
        self._finisher = finisher
        self._clock_ms = clock_ms
        self._period_s = period_s
        self._failing: set[str] = set()  # Ids whose last step failed: logged once until one succeeds.
        super().__init__()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stops the thread; a step in flight ends within its proposal or call timeout."""
        super().stop(PROPOSAL_TIMEOUT_S + TXN_MARKER_TIMEOUT_S if timeout_s is None else timeout_s)

    def _run(self) -> None:
        hanging_due = time.monotonic() + TXN_HANGING_CHECK_S
        while not self._stopping.wait(self._period_s):
            if not self._consensus.is_leader():
                continue
            if self._groups.group == METADATA_GROUP:
                self.run_once()
            if time.monotonic() >= hanging_due:
                hanging_due = time.monotonic() + TXN_HANGING_CHECK_S
                try:
                    self.abort_hanging()
                except KqError as error:
                    logger.warning("aborting hanging transactions: %s; the next look retries", error)

    def abort_hanging(self, older_than_ms: int = TXN_HANGING_ABORT_MS) -> int:
        """On any group's leader: aborts each transaction open in one of its partitions for longer than
        `older_than_ms` (its coordinator never marked it there: a producer that wrote to a partition it
        did not add, or a transaction lost with its coordinator), so the partition's last stable
        offset moves on, as Kafka's `kafka-transactions.sh abort` does by hand. Each abort names the
        first offset it read open (`opened_at`): if its coordinator marked that transaction meanwhile
        and the producer opened its next one there, the abort writes nothing. Returns how many."""
        now_ms = self._clock_ms()
        with self._store.read() as reader:
            opened = reader.every_open_transaction(TXN_HANGING_ROWS_MAX)
            names = {topic.topic_id: topic.name for topic in reader.topics()}
        aborted = 0
        for topic_id, partition, transaction in opened:
            if now_ms - transaction.opened_ms <= older_than_ms or topic_id not in names:
                continue
            marker = kq_pb2.TransactionMarkerCommand(
                producer_id=transaction.producer_id,
                producer_epoch=transaction.producer_epoch,
                commit=False,
                partitions=[kq_pb2.TxnPartition(topic=names[topic_id], partition=partition)],
                timestamp_ms=now_ms,
                leader_epoch=self._consensus.term(),
                opened_at=transaction.first_offset,  # That transaction alone, if still open.
            )
            propose_and_wait(self._consensus, commands.transaction(marker), PROPOSAL_TIMEOUT_S)
            logger.warning(
                "aborted a hanging transaction of producer %d in %s-%d (open since %d ms)",
                transaction.producer_id,
                names[topic_id],
                partition,
                transaction.opened_ms,
            )
            aborted += 1
        return aborted

    def run_once(self) -> int:
        """One round; returns how many transactions it moved on (finished or aborted). Each id the
        round's read shows expired or prepared is read again before its step (the read is older than
        what EndTxn's handler and the producer did since: its next transaction must not be taken for
        the one that expired)."""
        with self._store.read() as reader:
            rows = reader.transaction_states(TRANSACTIONAL_IDS_MAX)
        now_ms = self._clock_ms()
        moved = 0
        for transactional_id, raw in rows:
            if self._stopping.is_set():
                break
            state = kq_pb2.TransactionState.FromString(raw)
            expired = state.phase == ONGOING and now_ms - state.started_ms > state.timeout_ms
            if not expired and state.phase not in PREPARED:
                continue
            try:
                if expired:
                    self._abort_expired(transactional_id, now_ms)
                if self._finisher.finish(transactional_id):  # It reads the state as it is now.
                    moved += 1
                self._failing.discard(transactional_id)
            except KqError as error:
                if transactional_id not in self._failing:
                    logger.warning("transaction %s: %s; the next round retries", transactional_id, error)
                    self._failing.add(transactional_id)
        return moved

    def _abort_expired(self, transactional_id: str, now_ms: int) -> None:
        """Proposes the abort of the id's transaction if, read now, it is ONGOING past its timeout (its
        producer fenced); apply aborts only that transaction (the same producer id and epoch, ONGOING)."""
        state = stored_state(self._store, transactional_id)
        if state is None or state.phase != ONGOING or now_ms - state.started_ms <= state.timeout_ms:
            return
        end = kq_pb2.EndTransactionCommand(
            transactional_id=transactional_id,
            producer_id=state.producer_id,
            producer_epoch=state.producer_epoch,
            commit=False,
            now_ms=now_ms,
            timed_out=True,
        )
        propose_and_wait(self._consensus, commands.transaction(end), PROPOSAL_TIMEOUT_S)
        logger.info("transaction %s aborted: past its timeout of %d ms", transactional_id, state.timeout_ms)


class TransactionCoordinator:
    """A node's transaction parts: the channels to groups' leaders, the finisher (EndTxn's and the
    driver's) and the `kq-transactions` driver. Constructing starts nothing; `driver.start()` does."""

    def __init__(
        self,
        store: Store,
        consensus: Consensus,
        groups: GroupsView,
        credentials: grpc.ChannelCredentials | None,
        metadata: tuple[tuple[str, str], ...],
    ) -> None:
        self.channels = MarkerChannels(credentials, metadata)
        call = self.channels if groups.count > 1 else None
        self.finisher = TransactionFinisher(store, consensus, groups, call, wall_clock_ms)
        self.driver = TransactionDriver(store, consensus, groups, self.finisher, wall_clock_ms)

    def stop(self) -> None:
        """Stops the driver, then closes the channels."""
        self.driver.stop()
        self.channels.close()
