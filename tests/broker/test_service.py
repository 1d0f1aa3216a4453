"""The gRPC edge in-process over a fake consensus: statuses for bad input, redirects, and no stored change."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable

import grpc
import pytest

import kq.broker.service
from kq.broker.service import BrokerService, checks_on_loop
from kq.broker.validation import CheckedAppend
from kq.proto import kq_pb2
from kq.proto.compression import GZIP
from kq.proto.errors import ERROR_CODE_METADATA_KEY, LEADER_METADATA_KEY, ErrorCode, metadata_value
from kq.proto.limits import (
    PARTITIONS_MAX,
    PRODUCE_CHECK_ON_LOOP_BYTES_MAX,
    PRODUCE_CHECK_ON_LOOP_PLAIN_BYTES_MAX,
    PRODUCE_CHECK_ON_LOOP_RECORDS_MAX,
    PRODUCE_MANY_REQUESTS_MAX,
    RECORD_BYTES_MAX,
    TOPIC_NAME_LENGTH_MAX,
)
from kq.proto.records import NewRecord, encode_batch
from tests.broker.conftest import Edge, expect, produce, status_of
from tests.raft.helpers import CLOCK_MS, batch


def test_bad_topic_requests_are_rejected_without_proposing(edge: Edge) -> None:
    """Illegal names and partition counts get INVALID_ARGUMENT and never reach Raft."""
    before, proposals = edge.store.dump(), edge.consensus.proposals
    for name in ("", "x" * (TOPIC_NAME_LENGTH_MAX + 1), "bad/name", "..", "sp ace"):
        expect(
            grpc.StatusCode.INVALID_ARGUMENT,
            edge.stub.CreateTopic,
            kq_pb2.CreateTopicRequest(name=name, partitions=1),
        )
    for partitions in (0, PARTITIONS_MAX + 1):
        expect(
            grpc.StatusCode.INVALID_ARGUMENT,
            edge.stub.CreateTopic,
            kq_pb2.CreateTopicRequest(name="ok", partitions=partitions),
        )
    expect(
        grpc.StatusCode.ALREADY_EXISTS,
        edge.stub.CreateTopic,
        kq_pb2.CreateTopicRequest(name="t", partitions=1),
    )
    expect(grpc.StatusCode.NOT_FOUND, edge.stub.DeleteTopic, kq_pb2.DeleteTopicRequest(name="missing"))
    expect(grpc.StatusCode.NOT_FOUND, edge.stub.DescribeTopic, kq_pb2.DescribeTopicRequest(name="missing"))
    assert edge.store.dump() == before and edge.consensus.proposals == proposals


def test_bad_produce_requests_are_rejected_without_proposing(edge: Edge) -> None:
    """Unknown topic, partition out of range, oversized or empty requests change nothing."""
    before, proposals = edge.store.dump(), edge.consensus.proposals
    one = batch(b"v")
    cases = [
        (grpc.StatusCode.NOT_FOUND, produce("missing", 0, b"v")),
        (grpc.StatusCode.INVALID_ARGUMENT, produce("t", 2, b"v")),
        (grpc.StatusCode.INVALID_ARGUMENT, kq_pb2.ProduceRequest(topic="t", records=one)),
        (grpc.StatusCode.INVALID_ARGUMENT, kq_pb2.ProduceRequest(topic="t", partition=0)),
        (grpc.StatusCode.INVALID_ARGUMENT, produce("t", 0, b"x" * (RECORD_BYTES_MAX + 1))),
        (grpc.StatusCode.INVALID_ARGUMENT, kq_pb2.ProduceRequest(topic="t", partition=0, records=one[:-1])),
        (
            grpc.StatusCode.INVALID_ARGUMENT,
            kq_pb2.ProduceRequest(topic="t", partition=0, records=b"\xff" * 9),
        ),
    ]
    for code, request in cases:
        expect(code, edge.stub.Produce, request)
    assert edge.store.dump() == before and edge.consensus.proposals == proposals


def test_fetch_outside_the_log_is_out_of_range(edge: Edge) -> None:
    """Below the log start (after DeleteRecords) and beyond the log end give OUT_OF_RANGE."""
    trimmed = edge.stub.DeleteRecords(kq_pb2.DeleteRecordsRequest(topic="t", partition=0, before_offset=2))
    assert trimmed.log_start_offset == 2
    before = edge.store.dump()
    expect(
        grpc.StatusCode.OUT_OF_RANGE, edge.stub.Fetch, kq_pb2.FetchRequest(topic="t", partition=0, offset=1)
    )
    expect(
        grpc.StatusCode.OUT_OF_RANGE, edge.stub.Fetch, kq_pb2.FetchRequest(topic="t", partition=0, offset=9)
    )
    expect(
        grpc.StatusCode.OUT_OF_RANGE,
        edge.stub.DeleteRecords,
        kq_pb2.DeleteRecordsRequest(topic="t", partition=0, before_offset=9),
    )
    expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        edge.stub.Fetch,
        kq_pb2.FetchRequest(topic="t", partition=5, offset=0),
    )
    expect(
        grpc.StatusCode.NOT_FOUND, edge.stub.Fetch, kq_pb2.FetchRequest(topic="nope", partition=0, offset=0)
    )
    response = edge.stub.Fetch(kq_pb2.FetchRequest(topic="t", partition=0, offset=2))
    assert [r.offset for r in response.records] == [2]
    assert edge.store.dump() == before


def test_a_follower_never_says_a_fetch_past_its_log_end_is_out_of_range(edge: Edge) -> None:
    """A follower may only lag (a node just restarted): past its log end it answers NOT_CAUGHT_UP,
    retriable, so a consumer asks another node instead of resetting its position (chaos run 14); the
    leader still answers OUT_OF_RANGE, and below the log start is out of range on any node."""
    edge.stub.DeleteRecords(kq_pb2.DeleteRecordsRequest(topic="t", partition=0, before_offset=1))
    edge.consensus.leader, edge.consensus.leader_address = False, "127.0.0.1:9999"
    with pytest.raises(grpc.RpcError) as caught:
        edge.stub.Fetch(kq_pb2.FetchRequest(topic="t", partition=0, offset=9))
    assert status_of(caught.value) == grpc.StatusCode.UNAVAILABLE
    code = metadata_value(caught.value.trailing_metadata(), ERROR_CODE_METADATA_KEY)
    assert int(code or 0) == ErrorCode.NOT_CAUGHT_UP
    expect(
        grpc.StatusCode.OUT_OF_RANGE, edge.stub.Fetch, kq_pb2.FetchRequest(topic="t", partition=0, offset=0)
    )
    assert [r.offset for r in edge.stub.Fetch(kq_pb2.FetchRequest(topic="t", partition=0, offset=1)).records]
    edge.consensus.leader = True
    expect(
        grpc.StatusCode.OUT_OF_RANGE, edge.stub.Fetch, kq_pb2.FetchRequest(topic="t", partition=0, offset=9)
    )


def test_writes_on_a_follower_redirect_to_the_leader(edge: Edge) -> None:
    """A follower answers FAILED_PRECONDITION with kq-leader; with no leader known, UNAVAILABLE."""
    edge.consensus.leader, edge.consensus.leader_address = False, "127.0.0.1:9999"
    request = produce("t", 0, b"v")
    with pytest.raises(grpc.RpcError) as caught:
        edge.stub.Produce(request)
    assert status_of(caught.value) == grpc.StatusCode.FAILED_PRECONDITION
    metadata = {str(item.key): str(item.value) for item in caught.value.trailing_metadata()}
    assert metadata.get("kq-leader") == "127.0.0.1:9999"
    edge.consensus.leader_address = None
    expect(grpc.StatusCode.UNAVAILABLE, edge.stub.Produce, request)
    response = edge.stub.Fetch(kq_pb2.FetchRequest(topic="t", partition=0, offset=0))  # Reads still served.
    assert len(response.records) == 3


def test_long_poll_returns_when_a_record_arrives(edge: Edge) -> None:
    """A fetch waiting at the log end answers with the record produced meanwhile."""
    future = edge.stub.Fetch.future(kq_pb2.FetchRequest(topic="t", partition=1, offset=0, wait_ms=10_000))
    edge.stub.Produce(produce("t", 1, b"late"))
    assert [r.value for r in future.result(timeout=10).records] == [b"late"]


def test_produce_many_answers_each_request_as_its_own_produce_would(edge: Edge) -> None:
    """One ProduceMany call: each request gets the result its own Produce call gets (the record
    stored, or the same error code), in order; a refused one costs the others nothing."""
    bad_batch = kq_pb2.ProduceRequest(topic="t", partition=1, records=batch(b"v")[:-1])
    requests = [
        produce("t", 0, b"a", b"b"),
        produce("missing", 0, b"v"),
        bad_batch,
        produce("t", 5, b"v"),
        kq_pb2.ProduceRequest(topic="t", records=batch(b"v")),  # No partition.
        produce("u", 0, b"c"),
    ]
    edge.stub.CreateTopic(kq_pb2.CreateTopicRequest(name="u", partitions=1))
    alone = []
    for request in requests[1:5]:
        with pytest.raises(grpc.RpcError) as caught:
            edge.stub.Produce(request)
        alone.append(int(metadata_value(caught.value.trailing_metadata(), ERROR_CODE_METADATA_KEY) or 0))
    before = edge.store.dump()
    response = edge.stub.ProduceMany(kq_pb2.ProduceManyRequest(requests=requests))
    codes = [result.error_code for result in response.results]
    assert codes == [ErrorCode.OK, *alone, ErrorCode.OK]
    assert alone == [
        ErrorCode.UNKNOWN_TOPIC,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.UNKNOWN_PARTITION,
        ErrorCode.INVALID_REQUEST,
    ]
    assert all(result.message for result in response.results[1:5])
    first, last = response.results[0].response, response.results[5].response
    assert (first.partition, first.base_offset, last.partition, last.base_offset) == (0, 3, 0, 0)
    assert edge.store.dump() != before
    read = edge.stub.Fetch(kq_pb2.FetchRequest(topic="t", partition=0, offset=3))
    assert [record.value for record in read.records] == [b"a", b"b"]
    assert [r.value for r in edge.stub.Fetch(kq_pb2.FetchRequest(topic="u", partition=0)).records] == [b"c"]
    assert not edge.stub.Fetch(kq_pb2.FetchRequest(topic="t", partition=1)).records


def test_a_produce_stream_answers_each_request_as_produce_would_then_ends_on_its_limit(
    edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests on one ProduceStream are answered one by one, in order, each as its Produce call would
    be; no call stays counted while the stream waits; past PRODUCE_STREAM_S_MAX the stream ends after
    an answer, and a request sent after it is never read (nothing proposed), and its produce stream
    slot is freed."""
    requests: queue.SimpleQueue[kq_pb2.ProduceRequest | None] = queue.SimpleQueue()
    responses = iter(edge.stub.ProduceStream(iter(requests.get, None)))
    for value in (b"a", b"b", b"c"):
        requests.put(produce("t", 1, value))
        answer = next(responses)
        assert (answer.partition, answer.base_offset) == (1, b"abc".index(value))
        # Counted only while the node works on a request: released when its handler asks for the next.
        assert _eventually(lambda: edge.front.edge.unary_calls == 0)
    assert edge.service._produce_streams.readers() == 1
    requests.put(None)
    assert list(responses) == []
    read = edge.stub.Fetch(kq_pb2.FetchRequest(topic="t", partition=1))
    assert [record.value for record in read.records] == [b"a", b"b", b"c"]

    monkeypatch.setattr(kq.broker.service, "PRODUCE_STREAM_S_MAX", 0.0)
    requests = queue.SimpleQueue()
    responses = iter(edge.stub.ProduceStream(iter(requests.get, None)))
    requests.put(produce("t", 1, b"d"))
    assert next(responses).base_offset == 3
    proposals = edge.consensus.proposals
    requests.put(produce("t", 1, b"never"))
    assert list(responses) == []  # Ended with OK after the answer: the next request was not read.
    assert edge.consensus.proposals == proposals and edge.service._produce_streams.readers() == 0
    requests.put(None)


def _eventually(condition: Callable[[], bool], within_s: float = 5.0) -> bool:
    """Whether `condition` holds within `within_s` (the node's loop runs beside the test)."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_produce_many_refuses_a_call_it_cannot_take_whole(edge: Edge) -> None:
    """Too many requests, a partition named twice, a follower: the call fails as a whole (a follower
    names the leader), nothing is proposed; an empty call is answered empty."""
    before, proposals = edge.store.dump(), edge.consensus.proposals
    too_many = [produce("t", 0, b"v")] * (PRODUCE_MANY_REQUESTS_MAX + 1)
    for requests in (too_many, [produce("t", 0, b"v"), produce("t", 1, b"v"), produce("t", 0, b"w")]):
        details = expect(
            grpc.StatusCode.INVALID_ARGUMENT,
            edge.stub.ProduceMany,
            kq_pb2.ProduceManyRequest(requests=requests),
        )
        assert "partition 0" in details or str(PRODUCE_MANY_REQUESTS_MAX) in details
    assert not edge.stub.ProduceMany(kq_pb2.ProduceManyRequest()).results
    edge.consensus.leader, edge.consensus.leader_address = False, "127.0.0.1:9999"
    with pytest.raises(grpc.RpcError) as caught:
        edge.stub.ProduceMany(kq_pb2.ProduceManyRequest(requests=[produce("t", 0, b"v")]))
    assert status_of(caught.value) == grpc.StatusCode.FAILED_PRECONDITION
    assert metadata_value(caught.value.trailing_metadata(), LEADER_METADATA_KEY) == "127.0.0.1:9999"
    assert edge.store.dump() == before and edge.consensus.proposals == proposals


def test_a_batch_is_checked_on_the_loop_unless_compressed_or_large_and_answers_alike(
    edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the edge checks a produce request's batch (`checks_on_loop`): on the serving loop when it
    is small, or uncompressed within PRODUCE_CHECK_ON_LOOP_PLAIN_BYTES_MAX and _RECORDS_MAX; on a
    worker when it is compressed, has more records or more bytes. Either way the answer is the same:
    stored at the next offsets, or refused with nothing proposed."""
    where: list[str] = []
    prepared = BrokerService.prepared_append

    def recording(service: BrokerService, request: kq_pb2.ProduceRequest, records: bytes) -> CheckedAppend:
        where.append(threading.current_thread().name)
        return prepared(service, request, records)

    monkeypatch.setattr(BrokerService, "prepared_append", recording)
    values = [os.urandom(1_000) for _ in range(200)]  # Random: gzip leaves them over 64 KiB.
    plain = encode_batch([NewRecord(None, value) for value in values], base_timestamp_ms=CLOCK_MS)
    gzipped = encode_batch([NewRecord(None, value) for value in values], GZIP, base_timestamp_ms=CLOCK_MS)
    many = encode_batch(
        [NewRecord(None, b"x" * 30)] * (PRODUCE_CHECK_ON_LOOP_RECORDS_MAX + 1), base_timestamp_ms=CLOCK_MS
    )
    large = encode_batch([NewRecord(None, value) for value in values * 6], base_timestamp_ms=CLOCK_MS)
    assert min(len(gzipped), len(many)) > PRODUCE_CHECK_ON_LOOP_BYTES_MAX
    assert len(large) > PRODUCE_CHECK_ON_LOOP_PLAIN_BYTES_MAX >= len(plain)
    assert [checks_on_loop(data) for data in (plain, gzipped, many, large)] == [True, False, False, False]
    assert not checks_on_loop(b"\xff" * (PRODUCE_CHECK_ON_LOOP_BYTES_MAX + 1))  # No header: a worker says.
    assert checks_on_loop(batch(b"v"))

    offsets = []
    for data in (plain, gzipped, many, large):
        offsets.append(edge.stub.Produce(produce_of(data)).base_offset)
    counts = [len(values), len(values), PRODUCE_CHECK_ON_LOOP_RECORDS_MAX + 1, 6 * len(values)]
    assert offsets == [sum(counts[:at]) for at in range(4)]
    assert where[0] == "kq-grpc-loop" and all(name.startswith("kq-grpc_") for name in where[1:]), where

    before, proposals = edge.store.dump(), edge.consensus.proposals
    torn = bytearray(plain)
    torn[-1] ^= 0xFF  # The CRC no longer matches: refused on the loop as on a worker.
    expect(grpc.StatusCode.INVALID_ARGUMENT, edge.stub.Produce, produce_of(bytes(torn)))
    assert where[-1] == "kq-grpc-loop"
    assert edge.store.dump() == before and edge.consensus.proposals == proposals


def produce_of(records: bytes) -> kq_pb2.ProduceRequest:
    """A produce request to partition 1 of `t` carrying `records` as they are."""
    return kq_pb2.ProduceRequest(topic="t", partition=1, records=records)
