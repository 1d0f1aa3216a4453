"""Reader admission in-process (the edge fixture: 4 reader slots and 1 per connection):
excess readers are refused at once, other calls keep their threads, slots come back on every exit, and
the client's consumer and stream paths back off and carry on instead of failing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

import kq.broker.service
from kq.client import Consumer, ConsumerRecord, KqClient, UnavailableError
from kq.deploy.cluster import free_ports
from kq.deploy.waiting import wait_for
from kq.proto import kq_pb2, kq_pb2_grpc
from kq.proto.errors import ErrorCode, code_from_metadata
from kq.proto.limits import UNARY_CALLS_MAX
from tests.broker.conftest import Edge, produce

REFUSAL_S_MAX = 1.0  # "At once": a refusal never waits for a slot.
OTHER_CALL_S_MAX = 2.0  # Produce, ListTopics and ClusterStatus must answer within this with readers waiting.
STUCK_PRODUCE_REQUESTS = 8  # Of 1 MiB each: far more than the stuck client's 64 KiB HTTP/2 window.
RELEASE_S_MAX = 5.0  # A cancel reaches the stream's coroutine at once; this only bounds a broken test.


def own_stub(edge: Edge) -> tuple[grpc.Channel, kq_pb2_grpc.BrokerStub]:
    """A channel on a TCP connection of its own (one gRPC peer): gRPC otherwise shares one per process."""
    channel = grpc.insecure_channel(edge.address, options=[("grpc.use_local_subchannel_pool", 1)])
    return channel, kq_pb2_grpc.BrokerStub(channel)


@pytest.fixture
def channels(edge: Edge) -> Iterator[list[grpc.Channel]]:
    """Channels a test opens; closed (cancelling their calls) when it ends."""
    opened: list[grpc.Channel] = []
    try:
        yield opened
    finally:
        for channel in opened:
            channel.close()


def open_stream(
    edge: Edge, channels: list[grpc.Channel], stub: kq_pb2_grpc.BrokerStub | None = None
) -> Any:
    """A FetchStream of partition 1 on `stub`, else on a connection of its own. The call starts at
    once; the caller keeps it (a call object dropped is cancelled)."""
    if stub is None:
        channel, stub = own_stub(edge)
        channels.append(channel)
    return stub.FetchStream(kq_pb2.FetchRequest(topic="t", partition=1, offset=0), timeout=30)


def refusal_code(call: Any) -> ErrorCode | None:
    """The kq error code a finished call failed with (None if it carried none)."""
    return code_from_metadata(call.trailing_metadata())


def assert_refused_at_once(call: Any) -> None:
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as caught:
        next(iter(call))
    assert time.monotonic() - started < REFUSAL_S_MAX
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert code_from_metadata(caught.value.trailing_metadata()) == ErrorCode.TOO_MANY_READERS


def fill_reader_slots(edge: Edge) -> list[str]:
    """Takes every reader slot directly (as waiting readers of other clients would); their peers."""
    peers = [f"ipv4:10.9.9.{number}:1" for number in range(edge.readers.limits.readers_max)]
    for peer in peers:
        edge.readers.acquire(peer)
    return peers


def test_past_the_limit_readers_are_refused_at_once_and_other_calls_still_answer(
    edge: Edge, channels: list[grpc.Channel]
) -> None:
    """Twice as many streams as slots: half are admitted, the rest refused at once with TOO_MANY_READERS,
    and Produce, ListTopics and ClusterStatus answer within 2 s; the admitted streams get the record."""
    readers_max = edge.readers.limits.readers_max
    calls = [open_stream(edge, channels) for _ in range(2 * readers_max)]

    def finished() -> list[Any]:
        return [call for call in calls if call.done()]

    wait_for(
        lambda: edge.readers.readers() == readers_max and len(finished()) == readers_max,
        "half the streams to be admitted and the rest refused",
        timeout_s=5,
        last_state=lambda: f"{edge.readers.readers()} admitted, {len(finished())} finished",
    )
    refused = finished()
    assert all(refusal_code(call) == ErrorCode.TOO_MANY_READERS for call in refused)
    assert_refused_at_once(open_stream(edge, channels))
    waiting_fetch = kq_pb2.FetchRequest(topic="t", partition=1, offset=0, wait_ms=10_000)
    with pytest.raises(grpc.RpcError) as caught:
        own_stub(edge)[1].Fetch(waiting_fetch, timeout=REFUSAL_S_MAX)
    assert code_from_metadata(caught.value.trailing_metadata()) == ErrorCode.TOO_MANY_READERS

    produced = edge.stub.Produce(produce("t", 1, b"pushed"), timeout=OTHER_CALL_S_MAX)
    assert [t.name for t in edge.stub.ListTopics(kq_pb2.ListTopicsRequest(), timeout=OTHER_CALL_S_MAX).topics]
    assert edge.stub.ClusterStatus(kq_pb2.ClusterStatusRequest(), timeout=OTHER_CALL_S_MAX).node_id == "1"
    # Fetches that need no wait take no slot: wait_ms 0, or records already there.
    assert edge.stub.Fetch(kq_pb2.FetchRequest(topic="t", partition=0, offset=0), timeout=OTHER_CALL_S_MAX)
    assert edge.stub.Fetch(waiting_fetch, timeout=OTHER_CALL_S_MAX).records[0].value == b"pushed"
    for call in calls:
        if call not in refused:
            batches = next(iter(call)).batches
            assert batches[0].base_offset == produced.base_offset == 0


def test_one_connection_gets_its_share_while_slots_remain_for_others(
    edge: Edge, channels: list[grpc.Channel]
) -> None:
    """A second waiting reader on one connection is refused (peer limit 1) while other connections
    are still admitted: one client cannot take every slot."""
    channel, stub = own_stub(edge)
    channels.append(channel)
    first = open_stream(edge, channels, stub)
    wait_for(lambda: edge.readers.readers() == 1, "the first stream to be admitted", timeout_s=5)
    assert_refused_at_once(open_stream(edge, channels, stub))
    with pytest.raises(grpc.RpcError) as caught:
        stub.Fetch(kq_pb2.FetchRequest(topic="t", partition=1, wait_ms=5_000), timeout=REFUSAL_S_MAX)
    assert code_from_metadata(caught.value.trailing_metadata()) == ErrorCode.TOO_MANY_READERS
    assert "this client connection" in str(caught.value.details())
    other = open_stream(edge, channels)  # Another connection (kept: a dropped call is cancelled).
    wait_for(lambda: edge.readers.readers() == 2, "another connection's stream to be admitted", timeout_s=5)
    assert edge.readers.peers() == 2 and not other.done()
    first.cancel()
    wait_for(lambda: edge.readers.peers() == 1, "the cancelled stream's peer to leave the map", RELEASE_S_MAX)


def test_slots_come_back_on_cancel_end_error_and_shutdown(
    edge: Edge, channels: list[grpc.Channel], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every way a waiting reader can end gives its slot back: a client cancel, the stream's time
    limit, a long-poll's wait running out, an error mid-stream, and the server stopping."""

    def all_free(what: str) -> None:
        wait_for(lambda: edge.readers.readers() == 0 and edge.readers.peers() == 0, what, RELEASE_S_MAX)

    cancelled = [open_stream(edge, channels) for _ in range(2)]
    wait_for(lambda: edge.readers.readers() == 2, "two streams to be admitted", timeout_s=5)
    for call in cancelled:
        call.cancel()
    all_free("cancelled streams to free their slots")

    monkeypatch.setattr(kq.broker.service, "FETCH_STREAM_S_MAX", 0.3)
    assert list(open_stream(edge, channels)) == []
    all_free("a stream at its time limit to free its slot")
    monkeypatch.undo()
    request = kq_pb2.FetchRequest(topic="t", partition=1, wait_ms=300)
    assert not own_stub(edge)[1].Fetch(request, timeout=5).records
    all_free("a long-poll that found nothing to free its slot")

    failing = open_stream(edge, channels)
    wait_for(lambda: edge.readers.readers() == 1, "a stream to be admitted", timeout_s=5)
    edge.stub.DeleteTopic(kq_pb2.DeleteTopicRequest(name="t"))  # Its next read fails: UNKNOWN_TOPIC.
    with pytest.raises(grpc.RpcError) as caught:
        list(failing)
    assert code_from_metadata(caught.value.trailing_metadata()) == ErrorCode.UNKNOWN_TOPIC
    all_free("a stream that failed to free its slot")

    edge.stub.CreateTopic(kq_pb2.CreateTopicRequest(name="t", partitions=2))
    stopped = [open_stream(edge, channels) for _ in range(2)]
    wait_for(lambda: edge.readers.readers() == 2, "two streams to be admitted", timeout_s=5)
    edge.front.stop()
    all_free("the stopped server's streams to free their slots")
    wait_for(lambda: all(call.done() for call in stopped), "the streams to end at the client", RELEASE_S_MAX)


def test_a_consumer_keeps_polling_while_every_slot_is_taken(edge: Edge) -> None:
    """Consumer.poll with no slot free anywhere: its long-polls are refused, so it polls without
    waiting and returns within its timeout (not after the client's 30 s of retries), records included."""
    fill_reader_slots(edge)
    with KqClient([edge.address]) as client:
        consumer = Consumer(client, "t", partitions=[1])
        started = time.monotonic()
        assert consumer.poll(timeout_ms=500) == []
        assert time.monotonic() - started < 3.0
        edge.stub.Produce(produce("t", 1, b"a", b"b"))
        assert [r.value for r in consumer.poll(timeout_ms=500)] == [b"a", b"b"]
        started = time.monotonic()
        assert client.fetch("t", 1, 2, wait_ms=300).records == ()
        assert time.monotonic() - started < 3.0


def test_a_refused_stream_backs_off_and_is_admitted_once_a_slot_frees(
    edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KqClient.stream refused for want of slots retries with a growing pause (not at a fixed 50 ms),
    then reads once a slot is free; stopping the iteration gives the slot back."""
    held = fill_reader_slots(edge)
    attempts: list[float] = []
    acquire = edge.readers.acquire

    def counted(peer: str) -> None:
        attempts.append(time.monotonic())
        acquire(peer)

    monkeypatch.setattr(edge.readers, "acquire", counted)
    received: list[ConsumerRecord] = []
    with KqClient([edge.address]) as client:

        def read_one() -> None:
            for record in client.stream("t", 1, 0):
                received.append(record)
                return

        reader = threading.Thread(target=read_one, daemon=True)
        reader.start()
        wait_for(lambda: len(attempts) >= 5, "five refused attempts", timeout_s=10)
        # Backoff 0.05 + 0.1 + 0.2 + 0.4 s before the fifth; a fixed 50 ms pause would take 0.2 s.
        assert attempts[4] - attempts[0] >= 0.6
        for peer in held:
            edge.readers.release(peer)
        wait_for(lambda: edge.readers.readers() == 1, "the stream to be admitted", timeout_s=5)
        edge.stub.Produce(produce("t", 1, b"late"))
        wait_for(lambda: received, "the streamed record", timeout_s=10)
        reader.join(timeout=10)
        assert [r.value for r in received] == [b"late"]
        wait_for(lambda: edge.readers.readers() == 0, "the stopped stream to free its slot", RELEASE_S_MAX)


def test_a_waiting_fetch_to_a_node_that_is_down_keeps_the_clients_retry_budget() -> None:
    """Only a refused wait is cut short: a node that does not answer is retried for the client's
    whole retry budget, as for any read (not merely for the fetch's wait)."""
    dead = f"127.0.0.1:{free_ports(1)[0]}"  # Nothing listens there.
    with KqClient([dead], retry_timeout_s=1.0, rpc_timeout_s=0.5) as client:
        started = time.monotonic()
        with pytest.raises(UnavailableError):
            client.fetch("t", 0, 0, wait_ms=100)
        assert time.monotonic() - started >= 0.9


def test_a_stuck_stream_holds_one_message_and_slows_no_one_and_resumes_when_read(
    edge: Edge, channels: list[grpc.Channel]
) -> None:
    """A client that opens a stream and reads nothing: HTTP/2 flow control stops the node's writes to
    it, while another stream on the node keeps receiving every record and Produce keeps answering;
    when the stuck client reads at last, it gets every record, in order, none twice."""
    # No BDP probing: the client's window stays at HTTP/2's 64 KiB (gRPC would otherwise grow it).
    stuck_channel = grpc.insecure_channel(
        edge.address, options=[("grpc.use_local_subchannel_pool", 1), ("grpc.http2.bdp_probe", 0)]
    )
    channels.append(stuck_channel)
    stuck = open_stream(edge, channels, kq_pb2_grpc.BrokerStub(stuck_channel))  # Not read until the end.
    reading = iter(open_stream(edge, channels))
    wait_for(lambda: edge.readers.readers() == 2, "both streams to be admitted", timeout_s=5)
    value = b"x" * (512 * 1024)
    for number in range(STUCK_PRODUCE_REQUESTS):  # Far more than the stuck client's window.
        started = time.monotonic()
        edge.stub.Produce(produce("t", 1, value, value), timeout=OTHER_CALL_S_MAX)
        assert time.monotonic() - started < OTHER_CALL_S_MAX
        assert next(reading).batches[0].base_offset == 2 * number  # The other stream is served all along.
    assert edge.readers.readers() == 2 and not stuck.done()
    offsets: list[int] = []
    for response in stuck:
        for batch in response.batches:
            offsets.extend(range(batch.base_offset, batch.base_offset + batch.record_count))
        if len(offsets) >= 2 * STUCK_PRODUCE_REQUESTS:
            break
    assert offsets == list(range(2 * STUCK_PRODUCE_REQUESTS))


def test_blocking_calls_past_their_cap_are_refused_with_queue_full_and_readers_are_not(edge: Edge) -> None:
    """Calls that run on worker threads (Produce, metadata) are capped at UNARY_CALLS_MAX in progress:
    one more is answered QUEUE_FULL at once instead of queueing; reads on the loop are not counted."""
    edge.front.edge.unary_calls = UNARY_CALLS_MAX  # As if that many were in progress.
    try:
        for call in (
            lambda: edge.stub.Produce(produce("t", 1, b"v"), timeout=REFUSAL_S_MAX),
            lambda: edge.stub.ListTopics(kq_pb2.ListTopicsRequest(), timeout=REFUSAL_S_MAX),
        ):
            with pytest.raises(grpc.RpcError) as caught:
                call()
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert code_from_metadata(caught.value.trailing_metadata()) == ErrorCode.QUEUE_FULL
        assert edge.stub.Fetch(kq_pb2.FetchRequest(topic="t", partition=0), timeout=REFUSAL_S_MAX).records
    finally:
        edge.front.edge.unary_calls = 0
    assert edge.stub.Produce(produce("t", 1, b"v"), timeout=OTHER_CALL_S_MAX).base_offset == 0
