"""kq's error hierarchy and its one mapping to gRPC status codes."""

from __future__ import annotations

from typing import NoReturn

import grpc

from kq.raft.results import ErrorCode

LEADER_METADATA_KEY = "kq-leader"


class KqError(Exception):
    """A failure reported to the client; `status_code` and `retriable` carry the policy."""

    status_code = grpc.StatusCode.INTERNAL
    retriable = False


class InvalidArgumentError(KqError):
    """The request is malformed or outside a limit; it was never proposed."""

    status_code = grpc.StatusCode.INVALID_ARGUMENT


class NotFoundError(KqError):
    """The named topic does not exist."""

    status_code = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(KqError):
    """A topic of that name exists."""

    status_code = grpc.StatusCode.ALREADY_EXISTS


class OutOfRangeError(KqError):
    """An offset outside the partition's log."""

    status_code = grpc.StatusCode.OUT_OF_RANGE


class ResourceExhaustedError(KqError):
    """A limit of the cluster (topics, queues) is reached."""

    status_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    retriable = True


class SequenceError(KqError):
    """An idempotent producer's sequence is out of order or too old to deduplicate."""

    status_code = grpc.StatusCode.FAILED_PRECONDITION


class GroupNotEmptyError(KqError):
    """The operation needs a group without active members."""

    status_code = grpc.StatusCode.FAILED_PRECONDITION


class RebalanceError(KqError):
    """The member is unknown to its group or its generation is stale: it must rejoin."""

    status_code = grpc.StatusCode.ABORTED


class NotLeaderError(KqError):
    """This node does not lead; `leader_address` (gRPC host:port) is where to go, if known."""

    status_code = grpc.StatusCode.FAILED_PRECONDITION
    retriable = True

    def __init__(self, leader_address: str | None) -> None:
        where = f"; leader is {leader_address}" if leader_address else ""
        super().__init__(f"not the leader{where}")
        self.leader_address = leader_address


class UnavailableError(KqError):
    """No leader, or the proposal did not commit in time (it may still commit: retry idempotently)."""

    status_code = grpc.StatusCode.UNAVAILABLE
    retriable = True


def abort_with(context: grpc.ServicerContext, error: KqError) -> NoReturn:
    """Ends the RPC with `error`'s status (and the leader's address for a redirect)."""
    if isinstance(error, NotLeaderError) and error.leader_address is not None:
        context.set_trailing_metadata(((LEADER_METADATA_KEY, error.leader_address),))
    context.abort(error.status_code, str(error))


def error_for_code(code: ErrorCode, subject: str) -> KqError | None:
    """The KqError for a deterministic rejection from apply, None for OK."""
    if code == ErrorCode.OK:
        return None
    errors: dict[ErrorCode, KqError] = {
        ErrorCode.UNKNOWN_TOPIC: NotFoundError(f"unknown topic {subject}"),
        ErrorCode.UNKNOWN_PARTITION: InvalidArgumentError(f"unknown partition {subject}"),
        ErrorCode.TOPIC_EXISTS: AlreadyExistsError(f"topic {subject} already exists"),
        ErrorCode.TOO_MANY_TOPICS: ResourceExhaustedError("the cluster holds its maximum number of topics"),
        ErrorCode.UNKNOWN_PRODUCER: SequenceError(f"unknown producer id for {subject}"),
        ErrorCode.OUT_OF_ORDER_SEQUENCE: SequenceError(f"out-of-order producer sequence for {subject}"),
        ErrorCode.OFFSET_OUT_OF_RANGE: OutOfRangeError(f"offset beyond the log end of {subject}"),
        ErrorCode.UNKNOWN_GROUP: NotFoundError(f"unknown group {subject}"),
        ErrorCode.UNKNOWN_MEMBER: RebalanceError(f"unknown member of group {subject}: rejoin"),
        ErrorCode.STALE_GENERATION: RebalanceError(
            f"stale generation for group {subject}: it rebalanced; rejoin"
        ),
        ErrorCode.GROUP_HAS_MEMBERS: GroupNotEmptyError(
            f"group {subject} has active members; stop its consumers first"
        ),
        ErrorCode.TOO_MANY_GROUPS: ResourceExhaustedError("the cluster holds its maximum number of groups"),
        ErrorCode.GROUP_FULL: ResourceExhaustedError(f"group {subject} holds its maximum number of members"),
        ErrorCode.INVALID_COMMAND: InvalidArgumentError(f"the cluster refused the request for {subject}"),
        ErrorCode.DUPLICATE_SEQUENCE: SequenceError(
            f"producer sequence for {subject} is too old to deduplicate"
        ),
    }
    return errors[code]
