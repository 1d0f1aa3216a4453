"""The edge against hostile requests, in-process: each gets its specific status, one line, and no proposal."""

from __future__ import annotations

import logging

import grpc
import pytest

import kq.raft.state_machine
from kq.broker.edge import RateLimitedLog
from kq.proto import kq_pb2
from kq.proto.compression import GZIP, LZ4, SNAPPY, ZSTD
from kq.proto.errors import ErrorCode, code_from_metadata
from kq.proto.limits import PATTERN_NESTING_MAX, TOPIC_PATTERN_LENGTH_MAX
from kq.proto.records import NewRecord, assemble_batch, encode_batch
from tests.broker.conftest import Edge, expect, produce, status_of


def request_of(records: bytes) -> kq_pb2.ProduceRequest:
    return kq_pb2.ProduceRequest(topic="t", partition=0, records=records)


def test_compressed_batches_that_hold_nothing_or_lie_are_refused(edge: Edge) -> None:
    """Zero-record, truncated, count-lying, garbage, bomb and unknown-codec batches: INVALID_ARGUMENT,
    one line each, nothing proposed."""
    before, proposals = edge.store.dump(), edge.consensus.proposals
    two = encode_batch([NewRecord(None, b"a"), NewRecord(None, b"b")])[61:]  # Two encoded records.
    cases = []
    for codec in (GZIP, SNAPPY, LZ4, ZSTD):
        cases += [
            assemble_batch(b"", 0, 1, 1, codec),  # Like the 23-byte request that once killed every node.
            assemble_batch(b"", 1, 1, 1, codec),
            assemble_batch(two, 3, 1, 1, codec),
            assemble_batch(two[:-1], 2, 1, 1, codec),
            assemble_batch(b"\x00" * (8 << 20), 1, 1, 1, codec),  # A bomb: 8 MiB of zeros.
            encode_batch([NewRecord(None, b"a")], codec)[:-1],
        ]
    cases += [
        assemble_batch(two, 0, 1, 1),
        assemble_batch(two, 2, 1, 1, attributes=7),
        b"\x28\xb5\x2f\xfd" * 20,
    ]
    for records in cases:
        details = expect(grpc.StatusCode.INVALID_ARGUMENT, edge.stub.Produce, request_of(records))
        assert details and "\n" not in details
    assert edge.store.dump() == before and edge.consensus.proposals == proposals
    assert edge.stub.Produce(request_of(assemble_batch(two, 2, 1, 1, ZSTD))).base_offset == 3  # Moves on.


def join(pattern: str) -> kq_pb2.JoinGroupRequest:
    return kq_pb2.JoinGroupRequest(group="g", topic_pattern=pattern, client_id="c")


def test_topic_patterns_outside_the_bounds_are_refused_at_the_edge(edge: Edge) -> None:
    """Deep nesting, over-long, RE2-invalid (backreference) or oversized patterns never reach Raft."""
    proposals = edge.consensus.proposals
    for pattern in (
        "(" * (PATTERN_NESTING_MAX + 1) + "a" + ")" * (PATTERN_NESTING_MAX + 1),
        "(" * 400 + "a" + ")" * 400,
        "a" * (TOPIC_PATTERN_LENGTH_MAX + 1),
        r"(a)\1",
        "[",
        ".{1000}.{1000}",
    ):
        details = expect(grpc.StatusCode.INVALID_ARGUMENT, edge.stub.JoinGroup, join(pattern))
        assert "pattern" in details
    assert edge.consensus.proposals == proposals


def test_a_backtracking_pattern_joins_and_matches_in_linear_time(edge: Edge) -> None:
    """'(a+)+$' froze every node under Python's re; on RE2 the join completes and subscribes nothing."""
    long_name = "a" * 200 + "b"
    edge.stub.CreateTopic(kq_pb2.CreateTopicRequest(name=long_name, partitions=1))
    response = edge.stub.JoinGroup(join("(a+)+$"))
    assert response.generation == 1 and list(response.assignment) == []


def test_undecodable_request_bytes_get_invalid_argument_and_no_traceback(
    edge: Edge, caplog: pytest.LogCaptureFixture
) -> None:
    """Garbage, truncated and too-deeply-nested bytes: INVALID_ARGUMENT, nothing logged."""
    raw = edge.channel.unary_unary("/kq.v1.Broker/JoinGroup", None, None)
    nested = (
        b"\x7b" * 200 + b"\x7c" * 200
    )  # Unknown field 15 as groups nested 200 deep: over protobuf's limit.
    caplog.set_level(logging.DEBUG)
    for data in (b"\xff\xff\xff\xff", b"\x0a\x05ab", nested, b"\x08" + b"\xff" * 11):
        with pytest.raises(grpc.RpcError) as caught:
            raw(data)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
        assert "undecodable request" in str(caught.value.details())
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]


def test_a_bug_answers_internal_with_one_rate_limited_line(
    edge: Edge, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An unexpected exception answers INTERNAL; a burst of them logs one line, without a traceback."""

    def broken(*_: object) -> None:
        raise ZeroDivisionError("a planted bug")

    monkeypatch.setattr("kq.broker.service._partition_infos", broken)
    caplog.set_level(logging.INFO, logger="kq.broker.edge")
    for _ in range(20):
        expect(grpc.StatusCode.INTERNAL, edge.stub.ListOffsets, kq_pb2.ListOffsetsRequest(topic="t"))
    lines = [r for r in caplog.records if r.name == "kq.broker.edge"]
    assert len(lines) == 1 and "ZeroDivisionError" in lines[0].getMessage()
    assert not lines[0].exc_info


def test_rate_limited_log_counts_what_it_held_back(caplog: pytest.LogCaptureFixture) -> None:
    """One line per interval per key; the next line says how many were held back."""
    now = [0.0]
    log = RateLimitedLog(10.0, clock=lambda: now[0])
    caplog.set_level(logging.ERROR, logger="kq.broker.edge")
    assert log.report("m", "boom") and not log.report("m", "boom") and log.report("other", "boom")
    now[0] = 11.0
    assert log.report("m", "boom")
    assert caplog.records[-1].getMessage() == "boom (1 more since the last line)"


def test_an_entry_that_raises_in_apply_is_refused_and_the_log_moves_on(
    edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A planted bug in apply: the proposer gets INVALID_ARGUMENT naming it; the next request works."""
    original = kq.raft.state_machine._apply_delete_topic

    def explode(writer: object, command: kq_pb2.DeleteTopicCommand) -> object:
        if command.name == "poison":
            raise AssertionError("planted invariant")
        return original(writer, command)  # type: ignore[arg-type]

    monkeypatch.setattr(kq.raft.state_machine, "_apply_delete_topic", explode)
    edge.stub.CreateTopic(kq_pb2.CreateTopicRequest(name="poison", partitions=1))
    before = edge.store.dump()
    with pytest.raises(grpc.RpcError) as caught:
        edge.stub.DeleteTopic(kq_pb2.DeleteTopicRequest(name="poison"))
    assert status_of(caught.value) == grpc.StatusCode.INVALID_ARGUMENT
    # Refused by every replica after commit, not at the edge: the code says which.
    assert code_from_metadata(caught.value.trailing_metadata()) == ErrorCode.INVALID_COMMAND
    details = str(caught.value.details())
    assert "refused" in details and "planted invariant" in details
    with edge.store.read() as reader:
        assert reader.topic("poison") is not None and reader.rejected_entries() == 1
    assert [row for row in edge.store.dump() if row[0] != b"meta"] == [r for r in before if r[0] != b"meta"]
    assert edge.stub.Produce(produce("t", 0, b"after")).base_offset == 3
