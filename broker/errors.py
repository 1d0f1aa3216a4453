"""kq's error hierarchy on the broker, and the one place a failure becomes a gRPC status.

Every KqError carries an ErrorCode; its status comes from the table in proto/errors.py, never from
the class. `abort_with` answers it with trailing metadata `kq-error-code` (the code's number) and,
for a redirect, `kq-leader`, so a client never needs the message text. The classes only give each
kind of failure a default code and a name to raise and catch by.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc

from kq.proto.errors import ERROR_CODE_METADATA_KEY, LEADER_METADATA_KEY, ErrorCode, spec_of


class KqError(Exception):
    """A failure reported to the client: `code` decides its status and whether a client may retry it."""

    default_code = ErrorCode.INTERNAL_ERROR

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.code = self.default_code if code is None else code
        assert self.code != ErrorCode.OK, "an error needs a code other than OK"

    @property
    def status_code(self) -> grpc.StatusCode:
        """The gRPC status the table gives this error's code."""
        return spec_of(self.code).status

    @property
    def retriable(self) -> bool:
        """Whether the same request may succeed if sent again (the table's policy for the code)."""
        return spec_of(self.code).retriable


class InvalidArgumentError(KqError):
    """The request is malformed or outside a limit; it was never proposed."""

    default_code = ErrorCode.INVALID_REQUEST


class BatchTooLargeError(InvalidArgumentError):
    """A record batch within its topic's max.message.bytes but over a broker-wide limit on one batch
    (RECORDS_PER_APPEND_MAX records): INVALID_REQUEST over gRPC, Kafka's RECORD_LIST_TOO_LARGE (18),
    its code for a batch over a broker limit that is not the topic's (Kafka's: segment.bytes)."""


class NotFoundError(KqError):
    """The named topic (or, with UNKNOWN_GROUP, group) does not exist."""

    default_code = ErrorCode.UNKNOWN_TOPIC


class AlreadyExistsError(KqError):
    """A topic of that name exists."""

    default_code = ErrorCode.TOPIC_EXISTS


class OutOfRangeError(KqError):
    """An offset outside the partition's log."""

    default_code = ErrorCode.OFFSET_OUT_OF_RANGE


class ResourceExhaustedError(KqError):
    """A queue (by default the produce queue) or a limit of the cluster (topics, groups) is full."""

    default_code = ErrorCode.QUEUE_FULL


class CorruptDataError(KqError):
    """A batch the read needs failed its checksum on this node (broker/corruption.py): nothing of it
    is served; another replica holds it whole."""

    default_code = ErrorCode.CORRUPT_DATA


class StorageFullError(KqError):
    """The leader's store is within its headroom of --max-disk-bytes or of a full disk: a write that
    would grow it is refused before it is proposed (broker/storage_guard.py)."""

    default_code = ErrorCode.STORAGE_FULL


class MembershipError(KqError):
    """A membership change that cannot be made as asked (the default), or one that must wait for the
    previous change to commit (MEMBERSHIP_CHANGE_PENDING)."""

    default_code = ErrorCode.MEMBERSHIP_REFUSED


class TooManyReadersError(KqError):
    """The node, or the caller's connection, holds its maximum of waiting readers (broker/admission.py)."""

    default_code = ErrorCode.TOO_MANY_READERS


class SequenceError(KqError):
    """An idempotent producer's sequence is out of order or too old to deduplicate, or its id unknown."""

    default_code = ErrorCode.OUT_OF_ORDER_SEQUENCE


class GroupNotEmptyError(KqError):
    """The operation needs a group without active members."""

    default_code = ErrorCode.GROUP_HAS_MEMBERS


class RebalanceError(KqError):
    """The member is unknown to its group (the default) or its generation is stale: it must rejoin."""

    default_code = ErrorCode.UNKNOWN_MEMBER


class TransactionError(KqError):
    """A transaction request that does not fit the transactional id's state: fenced, not its producer,
    a concurrent completion (retriable), or a step its state does not allow."""

    default_code = ErrorCode.INVALID_TXN_STATE


class NotLeaderError(KqError):
    """This node does not lead; `leader_address` (gRPC host:port) is where to go."""

    default_code = ErrorCode.NOT_LEADER

    def __init__(self, leader_address: str) -> None:
        super().__init__(f"not the leader; leader is {leader_address}")
        self.leader_address = leader_address


class UnavailableError(KqError):
    """The proposal did not commit in time (it may still commit: retry idempotently), or no leader."""

    default_code = ErrorCode.NOT_COMMITTED


def error_metadata(code: ErrorCode, leader_address: str | None = None) -> tuple[tuple[str, str], ...]:
    """The trailing metadata of a failed call: the code's number, and the leader for a redirect."""
    metadata: tuple[tuple[str, str], ...] = ((ERROR_CODE_METADATA_KEY, str(int(code))),)
    if leader_address is not None:
        metadata += ((LEADER_METADATA_KEY, leader_address),)
    return metadata


def abort_with_code(
    context: grpc.ServicerContext, code: ErrorCode, message: str, leader_address: str | None = None
) -> NoReturn:
    """Ends the RPC with `code`'s status from the table, its metadata, and `message` for people."""
    context.set_trailing_metadata(error_metadata(code, leader_address))
    context.abort(spec_of(code).status, message)


async def abort_async(
    context: grpc.aio.ServicerContext[Any, Any],
    code: ErrorCode,
    message: str,
    leader_address: str | None = None,
) -> NoReturn:
    """`abort_with_code` for a call of the node's asyncio server (broker/front.py)."""
    context.set_trailing_metadata(error_metadata(code, leader_address))
    await context.abort(spec_of(code).status, message)


async def abort_with(context: grpc.aio.ServicerContext[Any, Any], error: KqError) -> NoReturn:
    """Ends the RPC with `error`'s status and code (and the leader's address for a redirect)."""
    leader = error.leader_address if isinstance(error, NotLeaderError) else None
    await abort_async(context, error.code, str(error), leader)


def error_for_code(code: ErrorCode, subject: str) -> KqError | None:
    """The KqError for a deterministic rejection from apply, None for OK."""
    if code == ErrorCode.OK:
        return None
    kind, message = _REJECTIONS[code]
    return kind(message.format(subject=subject), code)


_REJECTIONS: dict[ErrorCode, tuple[type[KqError], str]] = {
    ErrorCode.UNKNOWN_TOPIC: (NotFoundError, "unknown topic {subject}"),
    ErrorCode.UNKNOWN_PARTITION: (InvalidArgumentError, "unknown partition {subject}"),
    ErrorCode.TOPIC_EXISTS: (AlreadyExistsError, "topic {subject} already exists"),
    ErrorCode.TOO_MANY_TOPICS: (ResourceExhaustedError, "the cluster holds its maximum number of topics"),
    ErrorCode.UNKNOWN_PRODUCER: (SequenceError, "unknown producer id for {subject}"),
    ErrorCode.OUT_OF_ORDER_SEQUENCE: (SequenceError, "out-of-order producer sequence for {subject}"),
    ErrorCode.OFFSET_OUT_OF_RANGE: (OutOfRangeError, "offset beyond the log end of {subject}"),
    ErrorCode.UNKNOWN_GROUP: (NotFoundError, "unknown group {subject}"),
    ErrorCode.UNKNOWN_MEMBER: (RebalanceError, "unknown member of group {subject}: rejoin"),
    ErrorCode.STALE_GENERATION: (
        RebalanceError,
        "stale generation for group {subject}: it rebalanced; rejoin",
    ),
    ErrorCode.FENCED_INSTANCE_ID: (
        RebalanceError,
        "transactional id {subject}: a newer member holds the consumer's group.instance.id; it is fenced",
    ),
    ErrorCode.GROUP_HAS_MEMBERS: (
        GroupNotEmptyError,
        "group {subject} has active members; stop its consumers first",
    ),
    ErrorCode.TOO_MANY_GROUPS: (ResourceExhaustedError, "the cluster holds its maximum number of groups"),
    ErrorCode.GROUP_FULL: (ResourceExhaustedError, "group {subject} holds its maximum number of members"),
    ErrorCode.INVALID_COMMAND: (InvalidArgumentError, "the cluster refused the request for {subject}"),
    ErrorCode.DUPLICATE_SEQUENCE: (
        SequenceError,
        "producer sequence for {subject} is too old to deduplicate",
    ),
    ErrorCode.INVALID_PRODUCER_EPOCH: (
        SequenceError,
        "producer epoch for {subject} is older than one that already wrote there: the producer is fenced",
    ),
    ErrorCode.MESSAGE_TOO_LARGE: (
        InvalidArgumentError,
        "the record batch for {subject} is larger than the topic's max.message.bytes",
    ),
    ErrorCode.MEMBERSHIP_REFUSED: (
        MembershipError,
        "node {subject}: its id or an address belongs to another member, or the cluster holds its "
        "maximum number of registered members",
    ),
    ErrorCode.UNKNOWN_USER: (NotFoundError, "unknown user {subject}"),
    ErrorCode.UNKNOWN_TOKEN: (NotFoundError, "unknown token {subject}"),
    ErrorCode.SECURITY_LIMIT_REACHED: (
        ResourceExhaustedError,
        "the cluster holds its maximum of users, tokens or ACLs ({subject})",
    ),
    ErrorCode.PRODUCER_FENCED: (
        TransactionError,
        "transactional id {subject}: a newer instance fenced this producer",
    ),
    ErrorCode.CONCURRENT_TRANSACTIONS: (
        TransactionError,
        "transactional id {subject}: its previous transaction is still being completed; retry",
    ),
    ErrorCode.INVALID_TXN_STATE: (
        TransactionError,
        "transactional id {subject}: not allowed in its transaction's state",
    ),
    ErrorCode.INVALID_PRODUCER_ID_MAPPING: (
        TransactionError,
        "transactional id {subject}: unknown, or the producer id is not its own",
    ),
    ErrorCode.TRANSACTIONAL_ID_NOT_FOUND: (NotFoundError, "unknown transactional id {subject}"),
    ErrorCode.TRANSACTION_LIMIT_REACHED: (
        ResourceExhaustedError,
        "transactional id {subject}: too many transactional ids, or partitions or groups in its transaction",
    ),
}
