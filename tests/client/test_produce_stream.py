"""The client's produce streams (client/connection.py), against a tiny in-process server: requests go
on one open ProduceStream, a stuck request times out by the watchdog and is retried, a stream the
node ended is replaced, and a node without the method gets unary Produce calls."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from kq.broker.errors import abort_with_code
from kq.client import KqClient
from kq.client.errors import UnavailableError
from kq.proto import kq_pb2, kq_pb2_grpc
from kq.proto.errors import ErrorCode
from kq.proto.records import BatchBuilder, NewRecord


class StreamingBroker(kq_pb2_grpc.BrokerServicer):
    """Answers Produce (unary) and, when `streams`, ProduceStream: each request with the next offset;
    `stall` holds the next streamed request unanswered; `end_after`: a stream ends after the answer
    that makes this many streamed answers in all."""

    def __init__(self, streams: bool) -> None:
        self.streams = streams
        self.stall = threading.Event()  # Set: the next streamed request waits until released.
        self.release = threading.Event()
        self.end_after: int | None = None
        self.unary = 0
        self.streamed = 0
        self.opened = 0
        self.many_calls = 0
        self.full = False  # Refuse streams as a node whose produce stream slots are taken.
        self._lock = threading.Lock()
        self._offset = 0

    def _answer(self, request: kq_pb2.ProduceRequest) -> kq_pb2.ProduceResponse:
        with self._lock:
            self._offset += 1
            return kq_pb2.ProduceResponse(partition=request.partition, base_offset=self._offset - 1)

    def Produce(  # noqa: N802 - the proto's name.
        self, request: kq_pb2.ProduceRequest, context: grpc.ServicerContext
    ) -> kq_pb2.ProduceResponse:
        self.unary += 1
        return self._answer(request)

    def ProduceMany(  # noqa: N802 - the proto's name.
        self, request: kq_pb2.ProduceManyRequest, context: grpc.ServicerContext
    ) -> kq_pb2.ProduceManyResponse:
        self.many_calls += 1  # An older node's answer: it does not know the method.
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")

    def ProduceStream(  # noqa: N802 - the proto's name.
        self, request_iterator: Iterator[kq_pb2.ProduceRequest], context: grpc.ServicerContext
    ) -> Iterator[kq_pb2.ProduceResponse]:
        if not self.streams:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        if self.full:
            abort_with_code(
                context, ErrorCode.TOO_MANY_READERS, "this node serves its maximum of 0 produce streams"
            )
        self.opened += 1
        for request in request_iterator:
            if self.stall.is_set():
                self.stall.clear()
                self.release.wait(10)
                return
            self.streamed += 1
            yield self._answer(request)
            if self.end_after is not None and self.streamed >= self.end_after:
                return


def _serve(servicer: StreamingBroker) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    kq_pb2_grpc.add_BrokerServicer_to_server(servicer, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    return server, address


@pytest.fixture
def streaming() -> Iterator[tuple[StreamingBroker, str]]:
    servicer = StreamingBroker(streams=True)  # type: ignore[abstract]  # Other RPCs: UNIMPLEMENTED.
    server, address = _serve(servicer)
    try:
        yield servicer, address
    finally:
        servicer.release.set()
        server.stop(None)


def _batch(value: bytes) -> BatchBuilder:
    batch = BatchBuilder()
    batch.append(NewRecord(None, value, ()))
    return batch


def test_requests_go_on_one_stream_and_a_node_that_ends_it_gets_a_new_one(
    streaming: tuple[StreamingBroker, str],
) -> None:
    """Sequential sends share one stream; when the node ends it (its time limit), the request it never
    read goes as a unary call and the next send opens a new stream."""
    servicer, address = streaming
    servicer.end_after = 6
    with KqClient([address], idempotent=False) as client:
        offsets = [client.produce_batch("t", 0, _batch(b"v%d" % n)).base_offset for n in range(5)]
        assert offsets == [0, 1, 2, 3, 4]
        assert (servicer.opened, servicer.streamed, servicer.unary) == (1, 5, 0)
        client.produce_batch("t", 0, _batch(b"x"))
        client.produce_batch("t", 0, _batch(b"y"))  # The stream has ended: this one is sent unary.
        assert (servicer.streamed, servicer.unary) == (6, 1)
        client.produce_batch("t", 0, _batch(b"z"))
        assert (servicer.opened, servicer.streamed, servicer.unary) == (2, 7, 1)


def test_a_stuck_request_times_out_and_is_retried_on_a_new_stream(
    streaming: tuple[StreamingBroker, str],
) -> None:
    """A streamed request the node never answers fails after the client's RPC timeout (the watchdog
    cancels the stream), and the retry goes on a new stream."""
    servicer, address = streaming
    with KqClient([address], idempotent=False, rpc_timeout_s=0.3, retry_timeout_s=5.0) as client:
        client.produce_batch("t", 0, _batch(b"a"))
        servicer.stall.set()
        started = time.monotonic()
        produced = client.produce_batch("t", 0, _batch(b"b"))
        assert time.monotonic() - started >= 0.3
        assert produced.base_offset == 1 and servicer.opened == 2
    with KqClient([address], idempotent=False, rpc_timeout_s=0.3, retry_timeout_s=0.2) as client:
        servicer.stall.set()
        with pytest.raises(UnavailableError, match="did not answer in time"):
            client.produce_batch("t", 0, _batch(b"c"))


def test_a_node_without_produce_streams_gets_unary_calls() -> None:
    """An older node answers ProduceStream UNIMPLEMENTED: the request goes as Produce, and so do later
    ones, without asking again."""
    servicer = StreamingBroker(streams=False)  # type: ignore[abstract]
    server, address = _serve(servicer)
    try:
        with KqClient([address], idempotent=False) as client:
            offsets = [client.produce_batch("t", 0, _batch(b"v")).base_offset for _ in range(3)]
        assert offsets == [0, 1, 2] and servicer.unary == 3 and servicer.opened == 0
    finally:
        server.stop(None)


def test_threads_sending_at_once_each_get_a_stream_up_to_the_limit(
    streaming: tuple[StreamingBroker, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concurrent sends use a stream each, at most CLIENT_PRODUCE_STREAMS_MAX to a node; beyond them,
    unary calls; closing the client ends its streams."""
    import kq.client.connection

    monkeypatch.setattr(kq.client.connection, "CLIENT_PRODUCE_STREAMS_MAX", 2)
    servicer, address = streaming
    with KqClient([address], idempotent=False) as client:
        with futures.ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda n: client.produce_batch("t", n % 3, _batch(b"v")), range(300)))
        assert servicer.streamed + servicer.unary == 300
        assert servicer.opened <= 2 and servicer.streamed > 0
        connections = client._connections
    assert not connections._idle_streams and not connections._busy_streams


def test_a_node_without_produce_many_gets_each_request_as_produce(
    streaming: tuple[StreamingBroker, str],
) -> None:
    """An older node answers ProduceMany UNIMPLEMENTED: each request goes as its own Produce (on a
    stream), each with its own outcome, and later calls do not ask for ProduceMany again."""
    servicer, address = streaming
    with KqClient([address], idempotent=False) as client:
        for _ in range(2):
            outcomes = client.produce_batches([("t", p, _batch(b"v")) for p in range(3)])
            assert [getattr(outcome, "partition", outcome) for outcome in outcomes] == [0, 1, 2]
        assert servicer.streamed == 6 and servicer.many_calls == 1


def test_a_node_whose_stream_slots_are_taken_gets_unary_calls(streaming: tuple[StreamingBroker, str]) -> None:
    """A stream refused for the node's stream slots (TOO_MANY_READERS): the request goes as Produce."""
    servicer, address = streaming
    servicer.full = True
    with KqClient([address], idempotent=False) as client:
        assert client.produce_batch("t", 0, _batch(b"v")).base_offset == 0
        servicer.full = False
        assert client.produce_batch("t", 0, _batch(b"w")).base_offset == 1
    assert (servicer.opened, servicer.unary, servicer.streamed) == (1, 1, 1)


def test_the_watchdog_ends_when_no_request_waits_and_starts_again(
    streaming: tuple[StreamingBroker, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kq-client-streams thread ends after CLIENT_STREAM_WATCH_IDLE_S without a waiting request,
    even for a client never closed, and the next request starts it again."""
    import kq.client.connection

    monkeypatch.setattr(kq.client.connection, "CLIENT_STREAM_WATCH_IDLE_S", 0.1)
    _, address = streaming

    def watching() -> bool:
        return any(thread.name == "kq-client-streams" for thread in threading.enumerate())

    client = KqClient([address], idempotent=False)
    client.produce_batch("t", 0, _batch(b"a"))
    assert watching()
    deadline = time.monotonic() + 5
    while watching() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not watching()
    assert client.produce_batch("t", 0, _batch(b"b")).base_offset == 1 and watching()
    client.close()
    assert not watching()
