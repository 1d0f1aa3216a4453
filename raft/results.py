"""Results of applying commands: identical on every replica, returned to the proposing broker."""

from __future__ import annotations

from dataclasses import dataclass

# ErrorCode lives in the one error table (proto/errors.py); apply returns its codes 1-15 and 24 in results.
from kq.proto.errors import ErrorCode
from kq.raft.auth import AuthResult
from kq.storage import TopicMeta

__all__ = [
    "AppendResult",
    "ApplyResult",
    "AuthResult",
    "BarrierResult",
    "CompactResult",
    "ErrorCode",
    "ExpiryResult",
    "GroupResult",
    "KafkaGroupResult",
    "MemberResult",
    "PartitionAppendResult",
    "ProducerResult",
    "PurgeResult",
    "RejectedResult",
    "SkippedResult",
    "TopicResult",
    "TransactionResult",
    "TrimResult",
]


@dataclass(frozen=True, slots=True)
class MemberResult:
    """Result of registering or unregistering a member's addresses."""

    error: ErrorCode


@dataclass(frozen=True, slots=True)
class TopicResult:
    """Result of create/delete topic."""

    error: ErrorCode
    topic: TopicMeta | None = None


@dataclass(frozen=True, slots=True)
class PartitionAppendResult:
    """Result of one partition append inside an AppendCommand."""

    error: ErrorCode
    base_offset: int = 0
    duplicate: bool = False
    reason: str = ""  # Why an INVALID_COMMAND append was refused.


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Results of an AppendCommand, one per PartitionAppend, in order, and the entry's Raft index."""

    appends: tuple[PartitionAppendResult, ...]
    index: int
    # (topic, partition) of each append, in order: whose waiting readers the node wakes (broker/waiters.py).
    partitions: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class TrimResult:
    """Result of a trim: the partition's log start afterwards."""

    error: ErrorCode
    log_start_offset: int = 0


@dataclass(frozen=True, slots=True)
class PurgeResult:
    """Result of purging a deleted topic's batches: whether none is left."""

    done: bool


@dataclass(frozen=True, slots=True)
class CompactResult:
    """Result of a compaction entry: what it did to the partition (identical on every replica)."""

    error: ErrorCode
    batches_rewritten: int = 0  # Batches that lost records and kept some.
    batches_removed: int = 0  # Batches that lost all their records.
    records_dropped: int = 0
    bytes_freed: int = 0
    batches_skipped: int = 0  # Named but no longer stored (trimmed since), or past the work budget.


@dataclass(frozen=True, slots=True)
class GroupResult:
    """Result of a group command: the group's generation and phase after it (GroupPhase values)."""

    error: ErrorCode
    generation: int = 0
    phase: int = 0


@dataclass(frozen=True, slots=True)
class KafkaGroupResult:
    """Result of a Kafka client's group command: Kafka's error code (0: none), decided in apply.

    Kafka's classic group protocol has outcomes kq's codes do not name (REBALANCE_IN_PROGRESS,
    INCONSISTENT_GROUP_PROTOCOL, FENCED_INSTANCE_ID, ...); they are protocol numbers, identical on every
    replica, that the Kafka listener answers as they are.
    """

    kafka_error: int
    generation: int = 0
    phase: int = 0


@dataclass(frozen=True, slots=True)
class ProducerResult:
    """Result of RegisterProducer."""

    producer_id: int


@dataclass(frozen=True, slots=True)
class SkippedResult:
    """The entry's index was already applied (journal replay after a restart): nothing was done."""

    index: int


@dataclass(frozen=True, slots=True)
class RejectedResult:
    """The whole entry was refused, alike on every replica, and the state left unchanged.

    Either the shared validation refused the command, or applying it raised because of its content
    (a bug: the edge runs the same validation); the entry's index is recorded as applied all the same
    so the log moves on, and replaying it after a restart refuses it again.
    """

    index: int
    reason: str


@dataclass(frozen=True, slots=True)
class TransactionResult:
    """Result of a transaction command: the transactional id's producer id and epoch after it, and
    for a marker command the control batches it wrote."""

    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1
    written: int = 0


@dataclass(frozen=True, slots=True)
class ExpiryResult:
    """Result of a producer expiry entry (ExpireProducersCommand): the rows it looked at, deleted and
    stamped (rows written before they carried a time), and whether it reached the table's end."""

    looked: int
    expired: int
    stamped: int
    wrapped: bool


@dataclass(frozen=True, slots=True)
class BarrierResult:
    """A read barrier committed (BarrierCommand): nothing changed."""

    index: int


ApplyResult = (
    RejectedResult
    | BarrierResult
    | TransactionResult
    | TopicResult
    | AppendResult
    | TrimResult
    | CompactResult
    | PurgeResult
    | ExpiryResult
    | GroupResult
    | KafkaGroupResult
    | ProducerResult
    | MemberResult
    | AuthResult
    | SkippedResult
)
