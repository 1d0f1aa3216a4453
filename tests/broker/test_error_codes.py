"""Typed errors on the wire: every RPC's failures carry `kq-error-code`, a redirect `kq-leader`; the table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import grpc
import pytest

import kq.broker.service_base
from kq.broker.auth import Principal, Security
from kq.broker.errors import KqError, ResourceExhaustedError, error_for_code, error_metadata
from kq.broker.proposals import wall_clock_ms
from kq.client.security import acl, scram_credential
from kq.proto import kq_pb2
from kq.proto.errors import (
    ERROR_CODE_METADATA_KEY,
    ERROR_TABLE,
    LEADER_METADATA_KEY,
    ErrorCode,
    code_from_metadata,
    metadata_value,
)
from kq.raft.results import ApplyResult
from tests.broker.conftest import Edge, produce

LEADER = "10.0.0.2:9101"
APPLY_CODES = range(1, 16)  # The rejections apply decides (raft/state_machine.py, raft/groups.py).


def follower(edge: Edge) -> None:
    edge.consensus.leader = False
    edge.consensus.leader_address = LEADER


def leaderless(edge: Edge) -> None:
    edge.consensus.leader = False
    edge.consensus.leader_address = None


def member(edge: Edge) -> None:
    """Group "g" gets one member, "m0", at generation 1."""
    response = edge.stub.JoinGroup(kq_pb2.JoinGroupRequest(group="g", topics=["t"], client_id="m0"))
    assert response.generation == 1


def empty_group(edge: Edge) -> None:
    """Group "g" exists without members (an offset committed from outside group management)."""
    entry = kq_pb2.OffsetEntry(topic="t", partition=0, offset=1)
    edge.stub.CommitOffsets(kq_pb2.CommitOffsetsRequest(group="g", offsets=[entry]))


def producer(edge: Edge) -> None:
    """Producer id 1 exists (and has sent nothing)."""
    assert edge.stub.RegisterProducer(kq_pb2.RegisterProducerRequest()).producer_id == 1


def producer_at_sequence_1(edge: Edge) -> None:
    """Producer id 1 exists and has written sequence 0: its next batch is sequence 1 (Kafka accepts
    a first batch at any sequence from a producer the partition has no state of, KIP-360, so a gap
    needs an earlier batch)."""
    producer(edge)
    edge.stub.Produce(_produce_as(1, 0))


def fenced_producer(edge: Edge) -> None:
    """Producer id 1 exists and has written in epoch 1, fencing its epoch 0."""
    producer(edge)
    edge.stub.Produce(_produce_as(1, 0, epoch=1))


def readers_full(edge: Edge) -> None:
    """Every reader slot of the node is taken (by other clients' waiting readers)."""
    for number in range(edge.readers.limits.readers_max):
        edge.readers.acquire(f"ipv4:10.0.0.{number}:1")


def streams_full(edge: Edge) -> None:
    """Every produce stream slot of the node is taken (readers do not count there)."""
    admission = edge.service._produce_streams
    for number in range(admission.limits.readers_max):
        admission.acquire(f"ipv4:10.0.0.{number}:1")


class _Bob(Security):
    """Authentication on; every call is from User:bob, who holds no ACL."""

    def authenticate(self, metadata: object, auth_context: object) -> Principal | None:
        return Principal("User:bob", False)


def unauthenticated(edge: Edge) -> None:
    """The node requires authentication; the test's calls present nothing."""
    edge.front.edge._security = Security(edge.store, True, (), "secret", wall_clock_ms)


def as_bob(edge: Edge) -> None:
    """The node requires authentication; the calls are User:bob's, who holds no ACL."""
    edge.front.edge._security = _Bob(edge.store, True, (), "secret", wall_clock_ms)


def unapplied_reads_wait_briefly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kq.broker.service_base, "CATCH_UP_WAIT_S", 0.05)


@dataclass(frozen=True)
class Case:
    rpc: str
    request: object  # A request message, or bytes sent as they are.
    status: grpc.StatusCode
    code: ErrorCode
    setup: Callable[[Edge], None] | None = None


def _produce_as(producer_id: int, sequence: int, epoch: int = 0) -> kq_pb2.ProduceRequest:
    return produce("t", 0, b"v", producer=(producer_id, epoch, sequence))


_AHEAD = 10**9  # A Raft index no node of the test has applied.
_ONE_OFFSET = [kq_pb2.OffsetEntry(topic="t", partition=0, offset=1)]
_NEW_NODE = kq_pb2.Member(node_id="4", raft_address="127.0.0.1:7004", grpc_address="127.0.0.1:8004")
_BAD_NODE = kq_pb2.Member(node_id="4", raft_address="127.0.0.1:70000", grpc_address="127.0.0.1:8004")
_S = grpc.StatusCode
_E = ErrorCode
CASES = [
    Case(
        "CreateTopic", kq_pb2.CreateTopicRequest(name="t", partitions=1), _S.ALREADY_EXISTS, _E.TOPIC_EXISTS
    ),
    Case(
        "CreateTopic",
        kq_pb2.CreateTopicRequest(name="a/b", partitions=1),
        _S.INVALID_ARGUMENT,
        _E.INVALID_REQUEST,
    ),
    Case(
        "CreateTopic",
        kq_pb2.CreateTopicRequest(name="n", partitions=1),
        _S.UNAVAILABLE,
        _E.LEADER_UNKNOWN,
        leaderless,
    ),
    Case("DeleteTopic", kq_pb2.DeleteTopicRequest(name="missing"), _S.NOT_FOUND, _E.UNKNOWN_TOPIC),
    Case("DeleteTopic", kq_pb2.DeleteTopicRequest(name="t"), _S.FAILED_PRECONDITION, _E.NOT_LEADER, follower),
    Case("ListTopics", kq_pb2.ListTopicsRequest(min_index=_AHEAD), _S.UNAVAILABLE, _E.NOT_CAUGHT_UP),
    Case("DescribeTopic", kq_pb2.DescribeTopicRequest(name="missing"), _S.NOT_FOUND, _E.UNKNOWN_TOPIC),
    Case(
        "DescribeTopic",
        kq_pb2.DescribeTopicRequest(name="t", min_index=_AHEAD),
        _S.UNAVAILABLE,
        _E.NOT_CAUGHT_UP,
    ),
    Case("Produce", produce("t", 2, b"v"), _S.INVALID_ARGUMENT, _E.UNKNOWN_PARTITION),
    Case("Produce", produce("missing", 0, b"v"), _S.NOT_FOUND, _E.UNKNOWN_TOPIC),
    Case("Produce", kq_pb2.ProduceRequest(topic="t", partition=0), _S.INVALID_ARGUMENT, _E.INVALID_REQUEST),
    Case("Produce", produce("t", 0, b"v"), _S.FAILED_PRECONDITION, _E.NOT_LEADER, follower),
    Case("Produce", produce("t", 0, b"v"), _S.UNAVAILABLE, _E.LEADER_UNKNOWN, leaderless),
    Case(
        "ProduceMany",
        kq_pb2.ProduceManyRequest(requests=[produce("t", 0, b"v"), produce("t", 0, b"w")]),
        _S.INVALID_ARGUMENT,
        _E.INVALID_REQUEST,
    ),
    Case(
        "ProduceMany",
        kq_pb2.ProduceManyRequest(requests=[produce("t", 0, b"v")]),
        _S.FAILED_PRECONDITION,
        _E.NOT_LEADER,
        follower,
    ),
    Case(
        "ProduceMany",
        kq_pb2.ProduceManyRequest(requests=[produce("t", 0, b"v")]),
        _S.UNAVAILABLE,
        _E.LEADER_UNKNOWN,
        leaderless,
    ),
    # A stream of produce requests ends with the status the failing request's Produce call would have.
    Case("ProduceStream", produce("t", 0, b"v"), _S.FAILED_PRECONDITION, _E.NOT_LEADER, follower),
    Case("ProduceStream", produce("missing", 0, b"v"), _S.NOT_FOUND, _E.UNKNOWN_TOPIC),
    Case("ProduceStream", kq_pb2.ProduceRequest(topic="t"), _S.INVALID_ARGUMENT, _E.INVALID_REQUEST),
    Case("ProduceStream", b"\xff\xff\xff\xff", _S.INVALID_ARGUMENT, _E.INVALID_REQUEST),
    Case("ProduceStream", produce("t", 0, b"v"), _S.PERMISSION_DENIED, _E.PERMISSION_DENIED, as_bob),
    Case("ProduceStream", produce("t", 0, b"v"), _S.UNAUTHENTICATED, _E.UNAUTHENTICATED, unauthenticated),
    Case("ProduceStream", produce("t", 0, b"v"), _S.RESOURCE_EXHAUSTED, _E.TOO_MANY_READERS, streams_full),
    Case(
        "ProduceStream",
        _produce_as(1, 5),
        _S.FAILED_PRECONDITION,
        _E.OUT_OF_ORDER_SEQUENCE,
        producer_at_sequence_1,
    ),
    Case("Produce", _produce_as(7, 0), _S.FAILED_PRECONDITION, _E.UNKNOWN_PRODUCER),
    Case(
        "Produce", _produce_as(1, 5), _S.FAILED_PRECONDITION, _E.OUT_OF_ORDER_SEQUENCE, producer_at_sequence_1
    ),
    Case("Produce", _produce_as(1, 1), _S.FAILED_PRECONDITION, _E.INVALID_PRODUCER_EPOCH, fenced_producer),
    Case(
        "Fetch",
        kq_pb2.FetchRequest(topic="t", partition=0, offset=9),
        _S.OUT_OF_RANGE,
        _E.OFFSET_OUT_OF_RANGE,
    ),
    Case("Fetch", kq_pb2.FetchRequest(topic="t", partition=5), _S.INVALID_ARGUMENT, _E.UNKNOWN_PARTITION),
    Case("Fetch", kq_pb2.FetchRequest(topic="t", max_records=10**6), _S.INVALID_ARGUMENT, _E.INVALID_REQUEST),
    Case("FetchStream", kq_pb2.FetchRequest(topic="missing"), _S.NOT_FOUND, _E.UNKNOWN_TOPIC),
    Case(
        "FetchStream",
        kq_pb2.FetchRequest(topic="t"),
        _S.RESOURCE_EXHAUSTED,
        _E.TOO_MANY_READERS,
        readers_full,
    ),
    Case(
        "Fetch",
        kq_pb2.FetchRequest(topic="t", partition=1, wait_ms=5_000),
        _S.RESOURCE_EXHAUSTED,
        _E.TOO_MANY_READERS,
        readers_full,
    ),
    Case("ListOffsets", kq_pb2.ListOffsetsRequest(topic="missing"), _S.NOT_FOUND, _E.UNKNOWN_TOPIC),
    Case(
        "DeleteRecords",
        kq_pb2.DeleteRecordsRequest(topic="t", partition=0, before_offset=9),
        _S.OUT_OF_RANGE,
        _E.OFFSET_OUT_OF_RANGE,
    ),
    Case(
        "AlterTopicConfig",
        kq_pb2.AlterTopicConfigRequest(name="t", set=[kq_pb2.ConfigEntry(name="retention.ms", value="soon")]),
        _S.INVALID_ARGUMENT,
        _E.INVALID_REQUEST,
    ),
    Case(
        "AlterTopicConfig",
        kq_pb2.AlterTopicConfigRequest(name="missing", remove=["retention.ms"]),
        _S.NOT_FOUND,
        _E.UNKNOWN_TOPIC,
    ),
    Case(
        "CreatePartitions",
        kq_pb2.CreatePartitionsRequest(name="t", partitions=1),  # It has 2: the count must grow.
        _S.INVALID_ARGUMENT,
        _E.INVALID_REQUEST,
    ),
    Case(
        "CreatePartitions",
        kq_pb2.CreatePartitionsRequest(name="missing", partitions=3),
        _S.NOT_FOUND,
        _E.UNKNOWN_TOPIC,
    ),
    Case(
        "CreateTopic",
        kq_pb2.CreateTopicRequest(
            name="configured", partitions=1, configs=[kq_pb2.ConfigEntry(name="no.such", value="1")]
        ),
        _S.INVALID_ARGUMENT,
        _E.INVALID_REQUEST,
    ),
    Case(
        "RegisterProducer", kq_pb2.RegisterProducerRequest(), _S.FAILED_PRECONDITION, _E.NOT_LEADER, follower
    ),
    Case("ClusterStatus", b"\xff\xff\xff\xff", _S.INVALID_ARGUMENT, _E.INVALID_REQUEST),
    Case("JoinGroup", kq_pb2.JoinGroupRequest(group="g", topics=["missing"]), _S.NOT_FOUND, _E.UNKNOWN_TOPIC),
    Case(
        "JoinGroup",
        kq_pb2.JoinGroupRequest(group="g", topics=["t"], member_id="gone"),
        _S.ABORTED,
        _E.UNKNOWN_MEMBER,
        member,
    ),
    Case("Heartbeat", kq_pb2.HeartbeatRequest(group="g", member_id="gone"), _S.ABORTED, _E.UNKNOWN_MEMBER),
    Case(
        "LeaveGroup",
        kq_pb2.LeaveGroupRequest(group="g", member_id="m"),
        _S.FAILED_PRECONDITION,
        _E.NOT_LEADER,
        follower,
    ),
    Case(
        "CommitOffsets",
        kq_pb2.CommitOffsetsRequest(group="g", offsets=_ONE_OFFSET),
        _S.FAILED_PRECONDITION,
        _E.GROUP_HAS_MEMBERS,
        member,
    ),
    Case(
        "CommitOffsets",
        kq_pb2.CommitOffsetsRequest(group="g", member_id="gone", generation=1, offsets=_ONE_OFFSET),
        _S.ABORTED,
        _E.UNKNOWN_MEMBER,
        member,
    ),
    Case(
        "FetchOffsets", kq_pb2.FetchOffsetsRequest(group="bad/name"), _S.INVALID_ARGUMENT, _E.INVALID_REQUEST
    ),
    Case("ListGroups", kq_pb2.ListGroupsRequest(min_index=_AHEAD), _S.UNAVAILABLE, _E.NOT_CAUGHT_UP),
    Case("DescribeGroup", kq_pb2.DescribeGroupRequest(group="missing"), _S.NOT_FOUND, _E.UNKNOWN_GROUP),
    Case(
        "ResetOffsets",
        kq_pb2.ResetOffsetsRequest(group="g", topics=["t"], target=kq_pb2.RESET_EARLIEST),
        _S.FAILED_PRECONDITION,
        _E.GROUP_HAS_MEMBERS,
        member,
    ),
    Case(
        "ResetOffsets",
        kq_pb2.ResetOffsetsRequest(group="g", topics=["t"], target=kq_pb2.RESET_OFFSET, offset=9),
        _S.OUT_OF_RANGE,
        _E.OFFSET_OUT_OF_RANGE,
    ),
    Case("DeleteGroup", kq_pb2.DeleteGroupRequest(group="missing"), _S.NOT_FOUND, _E.UNKNOWN_GROUP),
    Case(
        "DeleteGroup",
        kq_pb2.DeleteGroupRequest(group="g"),
        _S.FAILED_PRECONDITION,
        _E.GROUP_HAS_MEMBERS,
        member,
    ),
    Case("AddNode", kq_pb2.AddNodeRequest(member=_NEW_NODE), _S.FAILED_PRECONDITION, _E.NOT_LEADER, follower),
    Case("AddNode", kq_pb2.AddNodeRequest(member=_BAD_NODE), _S.INVALID_ARGUMENT, _E.INVALID_REQUEST),
    # The node to add does not answer (the fixture's probe): it is not added.
    Case("AddNode", kq_pb2.AddNodeRequest(member=_NEW_NODE), _S.FAILED_PRECONDITION, _E.MEMBERSHIP_REFUSED),
    Case("RemoveNode", kq_pb2.RemoveNodeRequest(node_id="9"), _S.FAILED_PRECONDITION, _E.MEMBERSHIP_REFUSED),
    Case("RemoveNode", kq_pb2.RemoveNodeRequest(node_id="a b"), _S.INVALID_ARGUMENT, _E.INVALID_REQUEST),
    Case(
        "RemoveNode", kq_pb2.RemoveNodeRequest(node_id="1"), _S.FAILED_PRECONDITION, _E.NOT_LEADER, follower
    ),
    # The fixture's one node leads and no follower can take over: removing it cannot go ahead yet.
    Case("RemoveNode", kq_pb2.RemoveNodeRequest(node_id="1"), _S.UNAVAILABLE, _E.NOT_COMMITTED),
    Case("PutUser", kq_pb2.PutUserRequest(name="a b"), _S.INVALID_ARGUMENT, _E.INVALID_REQUEST),
    Case("PutUser", kq_pb2.PutUserRequest(name="alice"), _S.INVALID_ARGUMENT, _E.INVALID_REQUEST),
    Case(
        "PutUser",
        kq_pb2.PutUserRequest(name="alice", credentials=[scram_credential("SCRAM-SHA-256", "pw")]),
        _S.FAILED_PRECONDITION,
        _E.NOT_LEADER,
        follower,
    ),
    Case("PutUser", kq_pb2.PutUserRequest(name="alice"), _S.PERMISSION_DENIED, _E.PERMISSION_DENIED, as_bob),
    Case("DeleteUser", kq_pb2.DeleteUserRequest(name="zed"), _S.NOT_FOUND, _E.UNKNOWN_USER),
    Case("ListUsers", kq_pb2.ListUsersRequest(), _S.UNAUTHENTICATED, _E.UNAUTHENTICATED, unauthenticated),
    Case("CreateToken", kq_pb2.CreateTokenRequest(user="zed"), _S.NOT_FOUND, _E.UNKNOWN_USER),
    Case("CreateToken", kq_pb2.CreateTokenRequest(), _S.INVALID_ARGUMENT, _E.INVALID_REQUEST),
    Case(
        "CreateToken",
        kq_pb2.CreateTokenRequest(user="alice"),
        _S.PERMISSION_DENIED,
        _E.PERMISSION_DENIED,
        as_bob,
    ),
    Case(
        "RevokeToken", kq_pb2.RevokeTokenRequest(token_id="0123456789abcdef"), _S.NOT_FOUND, _E.UNKNOWN_TOKEN
    ),
    Case("RevokeToken", kq_pb2.RevokeTokenRequest(token_id="x"), _S.INVALID_ARGUMENT, _E.INVALID_REQUEST),
    Case(
        "ListTokens",
        kq_pb2.ListTokensRequest(user="alice"),
        _S.PERMISSION_DENIED,
        _E.PERMISSION_DENIED,
        as_bob,
    ),
    Case("AddAcls", kq_pb2.AddAclsRequest(), _S.INVALID_ARGUMENT, _E.INVALID_REQUEST),
    Case(
        "AddAcls",
        kq_pb2.AddAclsRequest(acls=[acl("User:bob", "read", "topic", "t")]),
        _S.PERMISSION_DENIED,
        _E.PERMISSION_DENIED,
        as_bob,
    ),
    Case(
        "RemoveAcls",
        kq_pb2.RemoveAclsRequest(acls=[acl("bob", "read", "topic", "t")]),
        _S.INVALID_ARGUMENT,
        _E.INVALID_REQUEST,
    ),
    Case("ListAcls", kq_pb2.ListAclsRequest(), _S.PERMISSION_DENIED, _E.PERMISSION_DENIED, as_bob),
    Case(
        "AlterScramCredentials",
        kq_pb2.AlterScramCredentialsRequest(),
        _S.INVALID_ARGUMENT,
        _E.INVALID_REQUEST,
    ),
    Case(
        "AlterScramCredentials",
        kq_pb2.AlterScramCredentialsRequest(
            deletions=[kq_pb2.ScramDeletion(user="bob", mechanism="SCRAM-SHA-256")]
        ),
        _S.PERMISSION_DENIED,
        _E.PERMISSION_DENIED,
        as_bob,
    ),
    Case("WhoAmI", kq_pb2.WhoAmIRequest(), _S.UNAUTHENTICATED, _E.UNAUTHENTICATED, unauthenticated),
    Case(
        "InitTransaction",
        kq_pb2.InitTransactionRequest(transactional_id="tx", timeout_ms=10),
        _S.INVALID_ARGUMENT,
        _E.INVALID_TRANSACTION_TIMEOUT,
    ),
    Case(
        "AddToTransaction",
        kq_pb2.AddToTransactionRequest(transactional_id="never-initialized", producer_id=1),
        _S.FAILED_PRECONDITION,
        _E.INVALID_PRODUCER_ID_MAPPING,
    ),
    Case(
        "EndTransaction",
        kq_pb2.EndTransactionRequest(transactional_id="tx", commit=True),
        _S.FAILED_PRECONDITION,
        _E.NOT_LEADER,
        follower,
    ),
    Case(
        "TxnCommitOffsets",
        kq_pb2.TxnCommitOffsetsRequest(transactional_id="", group="g", offsets=_ONE_OFFSET),
        _S.INVALID_ARGUMENT,
        _E.INVALID_REQUEST,
    ),
    Case(
        "WriteTxnMarkers",
        kq_pb2.WriteTxnMarkersRequest(marker=kq_pb2.TransactionMarkerCommand(producer_id=1)),
        _S.UNAVAILABLE,
        _E.LEADER_UNKNOWN,
        leaderless,
    ),
    Case(  # A coordinator epoch past group 0's term here would fence every later coordinator's markers.
        "WriteTxnMarkers",
        kq_pb2.WriteTxnMarkersRequest(
            marker=kq_pb2.TransactionMarkerCommand(producer_id=1, coordinator_epoch=2)
        ),
        _S.UNAVAILABLE,
        _E.NOT_CAUGHT_UP,
    ),
    Case(
        "ListTransactions",
        kq_pb2.ListTransactionsRequest(),
        _S.PERMISSION_DENIED,
        _E.PERMISSION_DENIED,
        as_bob,
    ),
    Case("Produce", produce("t", 0, b"v"), _S.PERMISSION_DENIED, _E.PERMISSION_DENIED, as_bob),
    Case(
        "Fetch",
        kq_pb2.FetchRequest(topic="t", partition=0),
        _S.PERMISSION_DENIED,
        _E.PERMISSION_DENIED,
        as_bob,
    ),
    Case(
        "FetchStream",
        kq_pb2.FetchRequest(topic="t", partition=0),
        _S.PERMISSION_DENIED,
        _E.PERMISSION_DENIED,
        as_bob,
    ),
    Case(
        "CreateTopic",
        kq_pb2.CreateTopicRequest(name="n", partitions=1),
        _S.UNAUTHENTICATED,
        _E.UNAUTHENTICATED,
        unauthenticated,
    ),
]


def fail(edge: Edge, rpc: str, request: object) -> grpc.RpcError:
    """The error `rpc` answers `request` with (bytes are sent as they are, bypassing the serializer)."""
    with pytest.raises(grpc.RpcError) as caught:
        if isinstance(request, bytes) and rpc == "ProduceStream":
            next(iter(edge.channel.stream_stream(f"/kq.v1.Broker/{rpc}", None, None)(iter([request]))))
        elif isinstance(request, bytes):
            edge.channel.unary_unary(f"/kq.v1.Broker/{rpc}", None, None)(request)
        elif rpc == "ProduceStream":
            assert isinstance(request, kq_pb2.ProduceRequest)
            next(iter(edge.stub.ProduceStream(iter([request]))))
        elif isinstance(request, kq_pb2.FetchRequest) and rpc == "FetchStream":
            next(iter(edge.stub.FetchStream(request)))
        else:
            getattr(edge.stub, rpc)(request)
    return caught.value


def code_of(error: grpc.RpcError) -> ErrorCode | None:
    return code_from_metadata(error.trailing_metadata())


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case.rpc}-{case.code.name}")
def test_each_rpc_failure_carries_its_status_and_error_code(
    edge: Edge, case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each RPC's failure answers the table's status for its code, and the code in `kq-error-code`."""
    unapplied_reads_wait_briefly(monkeypatch)
    if case.setup is not None:
        case.setup(edge)
    error = fail(edge, case.rpc, case.request)
    assert (error.code(), code_of(error)) == (case.status, case.code), error
    assert ERROR_TABLE[case.code].status == case.status
    leader = metadata_value(error.trailing_metadata(), LEADER_METADATA_KEY)
    assert leader == (LEADER if case.code == ErrorCode.NOT_LEADER else None)


def test_every_rpc_of_the_broker_service_has_a_failure_case() -> None:
    """The cases above cover every method of kq.v1.Broker, so a new RPC cannot go untested."""
    methods = {method.name for method in kq_pb2.DESCRIPTOR.services_by_name["Broker"].methods}
    assert {case.rpc for case in CASES} == methods


def test_stale_generation_is_aborted_with_its_own_code(edge: Edge) -> None:
    """A commit from an older generation answers ABORTED with STALE_GENERATION, not UNKNOWN_MEMBER."""
    joined = edge.stub.JoinGroup(kq_pb2.JoinGroupRequest(group="g", topics=["t"], client_id="m0"))
    request = kq_pb2.CommitOffsetsRequest(
        group="g", member_id=joined.member_id, generation=joined.generation + 1, offsets=_ONE_OFFSET
    )
    error = fail(edge, "CommitOffsets", request)
    assert (error.code(), code_of(error)) == (grpc.StatusCode.ABORTED, ErrorCode.STALE_GENERATION)


def test_a_bug_answers_internal_error(edge: Edge, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unexpected exception in a handler answers INTERNAL with INTERNAL_ERROR."""

    def broken(*_: object) -> None:
        raise ZeroDivisionError("a planted bug")

    monkeypatch.setattr("kq.broker.service._partition_infos", broken)
    error = fail(edge, "ListOffsets", kq_pb2.ListOffsetsRequest(topic="t"))
    assert (error.code(), code_of(error)) == (grpc.StatusCode.INTERNAL, ErrorCode.INTERNAL_ERROR)


def test_a_full_produce_queue_answers_queue_full(edge: Edge, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batcher's queue-full error (constructed without a code) answers RESOURCE_EXHAUSTED, QUEUE_FULL."""

    def full(*_: object) -> None:
        raise ResourceExhaustedError("produce queue is full; retry later")

    monkeypatch.setattr("kq.broker.proposals.Batcher.submit", full)
    error = fail(edge, "Produce", produce("t", 0, b"v"))
    assert (error.code(), code_of(error)) == (grpc.StatusCode.RESOURCE_EXHAUSTED, ErrorCode.QUEUE_FULL)


def test_a_proposal_that_does_not_commit_answers_not_committed(edge: Edge) -> None:
    """A proposal the consensus drops answers UNAVAILABLE with NOT_COMMITTED (it may still commit)."""

    def dropped(data: bytes, callback: Callable[[ApplyResult | None, int], None]) -> None:
        callback(None, 1)  # PySyncObj's "request denied": not committed.

    edge.consensus.propose = dropped  # type: ignore[method-assign]
    error = fail(edge, "CreateTopic", kq_pb2.CreateTopicRequest(name="n", partitions=1))
    assert (error.code(), code_of(error)) == (grpc.StatusCode.UNAVAILABLE, ErrorCode.NOT_COMMITTED)


def test_the_table_has_a_sane_row_for_every_code() -> None:
    """Every ErrorCode has a row; only OK maps to OK; retriable codes have transient statuses."""
    assert set(ERROR_TABLE) == set(ErrorCode)
    # DATA_LOSS (CORRUPT_DATA): this node's copy is damaged; another replica serves the same read.
    transient = {_S.UNAVAILABLE, _S.RESOURCE_EXHAUSTED, _S.FAILED_PRECONDITION, _S.DATA_LOSS}
    for code, spec in ERROR_TABLE.items():
        assert (spec.status == _S.OK) == (code == ErrorCode.OK), code
        assert (spec.kafka_code == 0) == (code == ErrorCode.OK), code
        assert spec.meaning, code
        if spec.retriable:
            assert spec.status in transient, code
        if spec.status == _S.UNAVAILABLE:
            assert spec.retriable, code  # Clients and tools read UNAVAILABLE as "try again".
    assert [code for code, spec in ERROR_TABLE.items() if spec.status == _S.ABORTED] == [
        ErrorCode.UNKNOWN_MEMBER,
        ErrorCode.STALE_GENERATION,
        ErrorCode.FENCED_INSTANCE_ID,  # The group's membership refused the caller, as the two above.
    ]


def test_known_kafka_error_codes() -> None:
    """The Kafka numbers are Kafka's own, for the codes with an exact Kafka counterpart."""
    expected = {
        ErrorCode.UNKNOWN_TOPIC: 3,  # UNKNOWN_TOPIC_OR_PARTITION
        ErrorCode.TOPIC_EXISTS: 36,  # TOPIC_ALREADY_EXISTS
        ErrorCode.FENCED_INSTANCE_ID: 82,
        ErrorCode.OFFSET_OUT_OF_RANGE: 1,
        ErrorCode.NOT_LEADER: 6,  # NOT_LEADER_OR_FOLLOWER
        ErrorCode.LEADER_UNKNOWN: 5,  # LEADER_NOT_AVAILABLE
        ErrorCode.NOT_COMMITTED: 7,  # REQUEST_TIMED_OUT
        ErrorCode.OUT_OF_ORDER_SEQUENCE: 45,
        ErrorCode.DUPLICATE_SEQUENCE: 46,
        ErrorCode.UNKNOWN_PRODUCER: 59,
        ErrorCode.UNKNOWN_MEMBER: 25,
        ErrorCode.STALE_GENERATION: 22,  # ILLEGAL_GENERATION
        ErrorCode.GROUP_HAS_MEMBERS: 68,  # NON_EMPTY_GROUP
        ErrorCode.UNKNOWN_GROUP: 69,  # GROUP_ID_NOT_FOUND
        ErrorCode.GROUP_FULL: 81,  # GROUP_MAX_SIZE_REACHED
        ErrorCode.INVALID_REQUEST: 42,
        ErrorCode.INTERNAL_ERROR: -1,  # UNKNOWN_SERVER_ERROR
    }
    assert {code: ERROR_TABLE[code].kafka_code for code in expected} == expected


@pytest.mark.parametrize("code", [code for code in ErrorCode if code != ErrorCode.OK], ids=lambda c: c.name)
def test_metadata_round_trips_every_code(code: ErrorCode) -> None:
    """What the broker writes into trailing metadata, the client's parser reads back as the same code."""
    metadata = error_metadata(code, LEADER)
    assert metadata_value(metadata, ERROR_CODE_METADATA_KEY) == str(int(code))
    assert code_from_metadata(metadata) == code
    assert metadata_value(metadata, LEADER_METADATA_KEY) == LEADER


def test_unknown_or_missing_codes_parse_as_none() -> None:
    """A status gRPC made itself (no kq metadata), or a code this version does not know, yields None."""
    assert code_from_metadata(None) is None
    assert code_from_metadata(()) is None
    assert code_from_metadata(((ERROR_CODE_METADATA_KEY, "9999"),)) is None
    assert code_from_metadata(((ERROR_CODE_METADATA_KEY, "NOT_LEADER"),)) is None


@pytest.mark.parametrize("number", APPLY_CODES)
def test_each_apply_rejection_becomes_an_error_with_that_code(number: int) -> None:
    """error_for_code keeps apply's code, so the status and the wire code follow from the table."""
    error = error_for_code(ErrorCode(number), "t/0")
    assert isinstance(error, KqError)
    assert error.code == ErrorCode(number)
    assert error.status_code == ERROR_TABLE[ErrorCode(number)].status
    assert error_for_code(ErrorCode.OK, "t/0") is None
