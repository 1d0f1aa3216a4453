"""Client-side errors: one class per kind of failure, mapped once from the error code on the wire.

Every failure the broker answers carries `kq-error-code` (proto/errors.py); `from_rpc_error` maps
that code to one class through `CLASS_BY_CODE` and never reads the status message, which the
exception keeps for people only. A status without the code was made by gRPC itself (connection
refused, deadline, cancelled, message too large) and is mapped by its status alone.

Each class carries the policy the retry loop (client/connection.py) acts on, so that loop asks
nothing but these attributes and the leader hint:

- `retriable`: the same call may succeed if sent again (the table's policy for the code);
- `refresh_leader`: the leader this client knew may be gone: forget it and look again.

The retriable classes are all `UnavailableError`s, so a caller that outlasts the retries catches one
class; what the server said is still in `error_code`.
"""

from __future__ import annotations

import grpc

from kq.proto.errors import LEADER_METADATA_KEY, ErrorCode, code_from_metadata, metadata_value, spec_of


class KqClientError(Exception):
    """A request failed. `error_code` is kq's code (None when gRPC or the client made the failure),
    `status` the gRPC status, `leader_hint` the leader a redirect named; the message is for display."""

    retriable = False
    refresh_leader = False

    def __init__(
        self,
        message: str,
        *,
        error_code: ErrorCode | None = None,
        status: grpc.StatusCode | None = None,
        leader_hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.status = status
        self.leader_hint = leader_hint


class InvalidRequestError(KqClientError):
    """The request is malformed, outside a limit, or names a partition the topic lacks: never written."""


class TopicNotFoundError(KqClientError):
    """The topic does not exist (UNKNOWN_TOPIC)."""


class GroupNotFoundError(KqClientError):
    """The consumer group does not exist (UNKNOWN_GROUP)."""


class TopicExistsError(KqClientError):
    """A topic of that name exists (TOPIC_EXISTS)."""


class OffsetOutOfRangeError(KqClientError):
    """The offset is below the log start or beyond the log end (OFFSET_OUT_OF_RANGE)."""


class PreconditionFailedError(KqClientError):
    """The cluster's state forbids the request; the subclasses say which state."""


class ProducerSequenceError(PreconditionFailedError):
    """An idempotent producer's sequence is out of order or too old, or its id unknown: the client
    starts a new producer id for the next records."""


class ProducerFencedError(PreconditionFailedError):
    """A newer epoch of this idempotent producer's id has written to the partition (Kafka's
    INVALID_PRODUCER_EPOCH): this producer is fenced and its records are refused."""


class GroupNotEmptyError(PreconditionFailedError):
    """The operation needs a group without active members (GROUP_HAS_MEMBERS)."""


class RebalanceError(KqClientError):
    """The group member must rejoin; the subclasses say whether it keeps its member id."""


class UnknownMemberError(RebalanceError):
    """The group does not know the member (expired, or left): join again without a member id."""


class StaleGenerationError(RebalanceError):
    """The group rebalanced since the member's generation: rejoin with the same member id."""


class FencedInstanceError(RebalanceError):
    """A newer member holds the consumer's group.instance.id: this instance is fenced and should stop."""


class LimitReachedError(KqClientError):
    """A limit of the cluster is reached: topics, groups, or members of one group."""


class ServerError(KqClientError):
    """A bug in the node that answered (INTERNAL_ERROR); its log has the details."""


class UnavailableError(KqClientError):
    """No node answered, or no leader was found, before the retry deadline; a write may have committed."""

    retriable = True


class NotLeaderError(UnavailableError):
    """The node does not lead; `leader_hint` names the leader (the retry loop follows it)."""

    refresh_leader = True


class LeaderUnknownError(UnavailableError):
    """No leader is elected right now (an election is under way)."""

    refresh_leader = True


class NotCommittedError(UnavailableError):
    """The write did not commit in time, or its node lost the leadership; it may still commit."""

    refresh_leader = True


class NotCaughtUpError(UnavailableError):
    """The node has not applied the Raft index this client already saw; another node (or later) may have."""


class OverloadedError(UnavailableError):
    """The leader's produce queue, or the node's calls in progress, is full; nothing was done."""


class TooManyReadersError(UnavailableError):
    """The node, or this client's connection to it, holds its maximum of waiting readers (streams and
    waiting fetches); nothing was read. Another node, or the same one a little later, may admit it."""


class StorageFullError(UnavailableError):
    """The leader's store is nearly full (its disk, or its --max-disk-bytes): it refuses writes that
    would grow it until retention, DeleteRecords or a deleted topic frees space; nothing was written.
    Reads still work."""


class MembershipChangePendingError(UnavailableError):
    """The previous membership change has not committed yet; this one was not made. Retry shortly."""


class MembershipRefusedError(KqClientError):
    """The membership change cannot be made as asked: the node id or an address is taken, the node is
    not a member, or the change would leave the cluster without a majority of running nodes."""


class AuthenticationError(KqClientError):
    """The node requires credentials (`--auth`) and this client sent none that it accepts: no client
    certificate of the cluster's CA, and no token, or an unknown, revoked or expired one."""


class PermissionDeniedError(KqClientError):
    """The principal has no ACL allowing this operation on this resource; nothing was done."""


class UnknownUserError(KqClientError):
    """No user (or token) of that name or id."""


class TransactionStateError(PreconditionFailedError):
    """A transaction request that does not fit the transactional id's state, or not its producer."""


class ConcurrentTransactionsError(UnavailableError):
    """The transactional id's previous transaction is still being completed: retry shortly."""

    retriable = True


class CorruptReplicaError(UnavailableError):
    """The node asked holds a damaged copy of what was read (CORRUPT_DATA, gRPC DATA_LOSS): another
    node serves it, and this one repairs its copy; a read moves on to the next node."""

    retriable = True


CLASS_BY_CODE: dict[ErrorCode, type[KqClientError]] = {
    ErrorCode.UNKNOWN_TOPIC: TopicNotFoundError,
    ErrorCode.UNKNOWN_PARTITION: InvalidRequestError,
    ErrorCode.TOPIC_EXISTS: TopicExistsError,
    ErrorCode.TOO_MANY_TOPICS: LimitReachedError,
    ErrorCode.UNKNOWN_PRODUCER: ProducerSequenceError,
    ErrorCode.OUT_OF_ORDER_SEQUENCE: ProducerSequenceError,
    ErrorCode.DUPLICATE_SEQUENCE: ProducerSequenceError,
    ErrorCode.OFFSET_OUT_OF_RANGE: OffsetOutOfRangeError,
    ErrorCode.UNKNOWN_GROUP: GroupNotFoundError,
    ErrorCode.UNKNOWN_MEMBER: UnknownMemberError,
    ErrorCode.STALE_GENERATION: StaleGenerationError,
    ErrorCode.FENCED_INSTANCE_ID: FencedInstanceError,
    ErrorCode.GROUP_HAS_MEMBERS: GroupNotEmptyError,
    ErrorCode.TOO_MANY_GROUPS: LimitReachedError,
    ErrorCode.GROUP_FULL: LimitReachedError,
    ErrorCode.INVALID_COMMAND: InvalidRequestError,
    ErrorCode.INVALID_REQUEST: InvalidRequestError,
    ErrorCode.NOT_LEADER: NotLeaderError,
    ErrorCode.LEADER_UNKNOWN: LeaderUnknownError,
    ErrorCode.NOT_COMMITTED: NotCommittedError,
    ErrorCode.NOT_CAUGHT_UP: NotCaughtUpError,
    ErrorCode.QUEUE_FULL: OverloadedError,
    ErrorCode.INTERNAL_ERROR: ServerError,
    ErrorCode.TOO_MANY_READERS: TooManyReadersError,
    ErrorCode.INVALID_PRODUCER_EPOCH: ProducerFencedError,
    ErrorCode.MESSAGE_TOO_LARGE: InvalidRequestError,
    ErrorCode.STORAGE_FULL: StorageFullError,
    ErrorCode.MEMBERSHIP_REFUSED: MembershipRefusedError,
    ErrorCode.MEMBERSHIP_CHANGE_PENDING: MembershipChangePendingError,
    ErrorCode.UNAUTHENTICATED: AuthenticationError,
    ErrorCode.PERMISSION_DENIED: PermissionDeniedError,
    ErrorCode.UNKNOWN_USER: UnknownUserError,
    ErrorCode.UNKNOWN_TOKEN: UnknownUserError,
    ErrorCode.SECURITY_LIMIT_REACHED: LimitReachedError,
    ErrorCode.PRODUCER_FENCED: ProducerFencedError,
    ErrorCode.CONCURRENT_TRANSACTIONS: ConcurrentTransactionsError,
    ErrorCode.INVALID_TXN_STATE: TransactionStateError,
    ErrorCode.INVALID_PRODUCER_ID_MAPPING: TransactionStateError,
    ErrorCode.INVALID_TRANSACTION_TIMEOUT: InvalidRequestError,
    ErrorCode.TRANSACTIONAL_ID_NOT_FOUND: InvalidRequestError,
    ErrorCode.TRANSACTION_LIMIT_REACHED: LimitReachedError,
    ErrorCode.CORRUPT_DATA: CorruptReplicaError,
}

# Statuses gRPC makes itself: the node is down, restarting or slow; another try (or node) may work.
# CANCELLED: a node shutting down cancels the calls it had queued; this client never cancels its own.
_TRANSPORT_STATUSES = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
)


def from_rpc_error(error: grpc.RpcError, address: str) -> KqClientError:
    """The KqClientError for a failed call to `address`: by its kq error code, else by its status."""
    status: grpc.StatusCode = error.code()
    metadata = error.trailing_metadata()
    code = code_from_metadata(metadata)
    if code is not None and code != ErrorCode.OK:
        return CLASS_BY_CODE[code](
            error.details() or code.name,
            error_code=code,
            status=status,
            leader_hint=metadata_value(metadata, LEADER_METADATA_KEY),
        )
    if status in _TRANSPORT_STATUSES:
        return UnavailableError(_unreachable(status, address), status=status)
    # gRPC's own refusals (message too large, unimplemented, ...): the text is kept for display only.
    details = error.details()
    return KqClientError(f"{status.name} from {address}" + (f": {details}" if details else ""), status=status)


def error_of_code(code: int, message: str) -> KqClientError:
    """The KqClientError for a kq error code carried in a response (one ProduceMany request's result),
    classed as the same code in a call's metadata is; a code this version does not know is a plain
    KqClientError (not retriable)."""
    try:
        known = ErrorCode(code)
    except ValueError:
        return KqClientError(f"error code {code}: {message}")
    return CLASS_BY_CODE[known](message or known.name, error_code=known, status=spec_of(known).status)


def _unreachable(status: grpc.StatusCode, address: str) -> str:
    """What a transport failure means, in the client's words (gRPC's text is not shown)."""
    if status == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"{address} did not answer in time"
    if status == grpc.StatusCode.CANCELLED:
        return f"{address} cancelled the call (shutting down?)"
    return f"cannot reach {address}"
