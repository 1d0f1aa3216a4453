"""Client-side errors, one per gRPC status kq uses; `retriable` says whether the client retries."""

from __future__ import annotations

import grpc


class KqClientError(Exception):
    """A request failed; `code` is the gRPC status, the message is the server's one line."""

    retriable = False

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class InvalidRequestError(KqClientError):
    """The server rejected the request as malformed or outside a limit (INVALID_ARGUMENT)."""


class TopicNotFoundError(KqClientError):
    """The topic does not exist (NOT_FOUND)."""


class TopicExistsError(KqClientError):
    """A topic of that name exists (ALREADY_EXISTS)."""


class OffsetOutOfRangeError(KqClientError):
    """The offset is below the log start or beyond the log end (OUT_OF_RANGE)."""


class PreconditionFailedError(KqClientError):
    """The cluster's state forbids the request (FAILED_PRECONDITION without a redirect): an idempotent
    producer's sequence out of order, or a group operation that needs a group without active members."""


ProducerSequenceError = PreconditionFailedError  # The producer-facing name of the same error.


class RebalanceError(KqClientError):
    """The group member is unknown or its generation is stale (ABORTED): it must rejoin."""


class UnavailableError(KqClientError):
    """No node answered, or no leader was found, before the retry deadline; a write may have committed."""

    retriable = True


_BY_CODE: dict[grpc.StatusCode, type[KqClientError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequestError,
    grpc.StatusCode.NOT_FOUND: TopicNotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: TopicExistsError,
    grpc.StatusCode.OUT_OF_RANGE: OffsetOutOfRangeError,
    grpc.StatusCode.FAILED_PRECONDITION: PreconditionFailedError,
    grpc.StatusCode.ABORTED: RebalanceError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: UnavailableError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: UnavailableError,
    grpc.StatusCode.CANCELLED: UnavailableError,
}


def from_rpc_error(error: grpc.RpcError, address: str) -> KqClientError:
    """The KqClientError for a failed call to `address`."""
    code = error.code()
    details = error.details() or code.name
    if code == grpc.StatusCode.UNAVAILABLE and "failed to connect" in details.lower():
        details = f"cannot reach {address}"
    return _BY_CODE.get(code, KqClientError)(details, code)
