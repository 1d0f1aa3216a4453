"""The client maps kq error codes (never message text) to one exception class each, with its policy."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from kq.client.errors import (
    CLASS_BY_CODE,
    InvalidRequestError,
    KqClientError,
    NotLeaderError,
    PreconditionFailedError,
    RebalanceError,
    TopicNotFoundError,
    UnavailableError,
    UnknownMemberError,
    from_rpc_error,
)
from kq.proto.errors import ERROR_CODE_METADATA_KEY, ERROR_TABLE, LEADER_METADATA_KEY, ErrorCode

ADDRESS = "10.0.0.1:9101"
FAILING_CODES = [code for code in ErrorCode if code != ErrorCode.OK]


class FakeRpcError(grpc.RpcError):
    """A failed call as grpc raises it: status, details and trailing metadata."""

    def __init__(
        self, status: grpc.StatusCode, details: str, metadata: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(details)
        self._status, self._details, self._metadata = status, details, metadata

    def code(self) -> grpc.StatusCode:
        return self._status

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:
        return self._metadata


def coded(code: ErrorCode, details: str = "the server's words", leader: str | None = None) -> FakeRpcError:
    metadata: tuple[tuple[str, str], ...] = ((ERROR_CODE_METADATA_KEY, str(int(code))),)
    if leader is not None:
        metadata += ((LEADER_METADATA_KEY, leader),)
    return FakeRpcError(ERROR_TABLE[code].status, details, metadata)


def test_every_failing_code_has_one_client_class() -> None:
    """The map from code to exception class covers every code but OK."""
    assert set(CLASS_BY_CODE) == set(FAILING_CODES)


@pytest.mark.parametrize("code", FAILING_CODES, ids=lambda code: code.name)
def test_a_coded_failure_maps_to_its_class_with_the_tables_retriable_policy(code: ErrorCode) -> None:
    """The code in the metadata picks the class; its `retriable` is the table's; the message is kept."""
    error = from_rpc_error(coded(code), ADDRESS)
    assert type(error) is CLASS_BY_CODE[code]
    assert error.error_code == code
    assert error.status == ERROR_TABLE[code].status
    assert error.retriable == ERROR_TABLE[code].retriable
    assert isinstance(error, UnavailableError) == ERROR_TABLE[code].retriable  # One class to catch.
    assert str(error) == "the server's words"
    assert error.leader_hint is None


def test_the_code_decides_not_the_text_or_the_status() -> None:
    """Text that once drove decisions (and a shared status) no longer does: only the code counts."""
    joined = from_rpc_error(coded(ErrorCode.STALE_GENERATION, "join again without a member id"), ADDRESS)
    assert isinstance(joined, RebalanceError) and not isinstance(joined, UnknownMemberError)
    # Three meanings of FAILED_PRECONDITION, told apart by code alone.
    redirect = from_rpc_error(coded(ErrorCode.NOT_LEADER, "", leader="10.0.0.2:9101"), ADDRESS)
    sequence = from_rpc_error(coded(ErrorCode.OUT_OF_ORDER_SEQUENCE), ADDRESS)
    not_empty = from_rpc_error(coded(ErrorCode.GROUP_HAS_MEMBERS), ADDRESS)
    assert isinstance(redirect, NotLeaderError) and redirect.retriable and redirect.refresh_leader
    assert redirect.leader_hint == "10.0.0.2:9101"
    assert isinstance(sequence, PreconditionFailedError) and not sequence.retriable
    assert isinstance(not_empty, PreconditionFailedError) and type(not_empty) is not type(sequence)


@pytest.mark.parametrize(
    "status", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED]
)
def test_transport_failures_map_by_status_and_name_the_address(status: grpc.StatusCode) -> None:
    """gRPC's own failures (no kq code) are retriable UnavailableErrors worded from the address."""
    error = from_rpc_error(FakeRpcError(status, "failed to connect to all addresses; ipv4:..."), ADDRESS)
    assert type(error) is UnavailableError and error.retriable
    assert error.error_code is None and error.status == status
    assert ADDRESS in str(error) and "ipv4" not in str(error)


def test_other_grpc_statuses_without_a_code_are_not_retried() -> None:
    """A status gRPC made for a reason retrying cannot fix (message too large) is not retriable."""
    error = from_rpc_error(
        FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "message larger than max"), ADDRESS
    )
    assert type(error) is KqClientError and not error.retriable


def test_an_unknown_code_from_a_newer_node_falls_back_to_the_status() -> None:
    """A code this version does not know is treated as no code at all."""
    metadata = ((ERROR_CODE_METADATA_KEY, "999"),)
    error = from_rpc_error(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "new", metadata), ADDRESS)
    assert type(error) is UnavailableError and error.error_code is None


def test_existing_names_still_catch_what_they_did() -> None:
    """Callers written against the old classes still catch the same failures."""
    assert isinstance(from_rpc_error(coded(ErrorCode.UNKNOWN_TOPIC), ADDRESS), TopicNotFoundError)
    assert isinstance(from_rpc_error(coded(ErrorCode.UNKNOWN_PARTITION), ADDRESS), InvalidRequestError)
    assert isinstance(from_rpc_error(coded(ErrorCode.INVALID_COMMAND), ADDRESS), InvalidRequestError)
    assert isinstance(from_rpc_error(coded(ErrorCode.QUEUE_FULL), ADDRESS), UnavailableError)
