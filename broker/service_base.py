"""What every Broker RPC shares: the node's parts, leader check, read-your-writes wait, error mapping."""

from __future__ import annotations

import logging
import threading

from kq.broker.admission import ReaderAdmission
from kq.broker.consensus import Consensus, Peer
from kq.broker.errors import NotFoundError, NotLeaderError, UnavailableError
from kq.broker.groups import GroupCoordinator
from kq.broker.proposals import Batcher
from kq.proto.compression import decompress
from kq.proto.errors import ErrorCode
from kq.proto.limits import APPEND_BYTES_MAX, CATCH_UP_WAIT_S, HEADERS_PER_RECORD_MAX, RECORDS_PER_APPEND_MAX
from kq.proto.records import WireRecord, parse_batch
from kq.storage import Store, StoredBatch, StoreReader, TopicMeta

logger = logging.getLogger(__name__)


class AppliedNotifier:
    """Wakes long-polling fetches when an entry is applied."""

    def __init__(self, applied_index: int) -> None:
        self._changed = threading.Condition()
        self._applied_index = applied_index

    def notify(self, index: int) -> None:
        """Called by the Raft adapter after each applied entry (and after a snapshot restore)."""
        with self._changed:
            self._applied_index = max(self._applied_index, index)
            self._changed.notify_all()

    def wait_until(self, index: int, timeout_s: float) -> bool:
        """Waits until `index` is applied, at most `timeout_s`; whether it is."""
        with self._changed:
            return self._changed.wait_for(lambda: self._applied_index >= index, timeout=timeout_s)

    def wait_beyond(self, index: int, timeout_s: float) -> None:
        """Waits until an entry after `index` is applied, or `timeout_s` passes."""
        with self._changed:
            self._changed.wait_for(lambda: self._applied_index > index, timeout=timeout_s)


class ServiceBase:
    """The state every RPC uses, wired once in `broker.main`."""

    def __init__(
        self,
        node: Peer,
        peers: tuple[Peer, ...],
        store: Store,
        consensus: Consensus,
        batcher: Batcher,
        notifier: AppliedNotifier,
        coordinator: GroupCoordinator,
        readers: ReaderAdmission,
    ) -> None:
        self._node = node
        self._peers = peers
        self._store = store
        self._consensus = consensus
        self._batcher = batcher
        self._notifier = notifier
        self._coordinator = coordinator
        self._readers = readers  # Slots for calls that wait for records (broker/admission.py).

    def _catch_up(self, min_index: int) -> None:
        """Read-your-writes for metadata reads: wait until `min_index` is applied, else UNAVAILABLE."""
        if min_index and not self._notifier.wait_until(min_index, CATCH_UP_WAIT_S):
            raise UnavailableError(
                f"node {self._node.node_id} has not applied index {min_index} yet; retry",
                ErrorCode.NOT_CAUGHT_UP,
            )

    def _require_leader(self) -> None:
        if not self._consensus.is_leader():
            leader = self._consensus.leader_grpc_address()
            if leader is None:
                raise UnavailableError("no leader is elected right now; retry", ErrorCode.LEADER_UNKNOWN)
            raise NotLeaderError(leader)

    @staticmethod
    def _topic(reader: StoreReader, name: str) -> TopicMeta:
        topic = reader.topic(name)
        if topic is None:
            raise NotFoundError(f"unknown topic {name}")
        return topic


def stored_records(batch: StoredBatch) -> list[WireRecord]:
    """A stored batch's records, decompressed and decoded (the leader checked them when appended)."""
    records = parse_batch(
        decompress(batch.records, batch.compression, APPEND_BYTES_MAX),
        RECORDS_PER_APPEND_MAX,
        HEADERS_PER_RECORD_MAX,
    )
    assert len(records) == batch.record_count, "a stored batch and its count disagree"
    return records
