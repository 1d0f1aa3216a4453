"""Reader admission on real nodes started with --max-readers 4 --max-readers-per-connection 1."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from kq.client import KqClient, ProducerRecord
from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for
from kq.proto import kq_pb2, kq_pb2_grpc
from kq.proto.errors import ErrorCode, code_from_metadata
from kq.proto.records import parse_batch

pytestmark = pytest.mark.system

READERS_MAX = 4
NODE_ARGS = ("--max-readers", str(READERS_MAX), "--max-readers-per-connection", "1")
STREAMS = 12  # More than the node admits.
REFUSAL_S_MAX = 1.0  # "At once": a refusal never waits.
OTHER_CALL_S_MAX = 2.0
RECORDS = 20


class Streams:
    """FetchStream calls to one node, each on a TCP connection of its own (its own gRPC peer; gRPC
    would otherwise share one connection among a process's channels), with when each call ended."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.channels: list[grpc.Channel] = []
        self.calls: list[Any] = []
        self.opened_s: list[float] = []
        self.ended_s: dict[int, float] = {}
        self._lock = threading.Lock()

    def open(self, offset: int = 0) -> Any:
        channel = grpc.insecure_channel(self.address, options=[("grpc.use_local_subchannel_pool", 1)])
        number = len(self.calls)
        self.channels.append(channel)
        self.opened_s.append(time.monotonic())
        call: Any = kq_pb2_grpc.BrokerStub(channel).FetchStream(
            kq_pb2.FetchRequest(topic="readers", partition=0, offset=offset), timeout=60
        )
        call.add_done_callback(lambda _: self._ended(number))
        self.calls.append(call)
        return call

    def _ended(self, number: int) -> None:
        with self._lock:
            self.ended_s[number] = time.monotonic()

    def ended(self) -> list[int]:
        with self._lock:
            return sorted(self.ended_s)

    def close(self) -> None:
        for call in self.calls:
            call.cancel()
        for channel in self.channels:
            channel.close()


def streamed_values(call: Any, count: int) -> list[tuple[int, bytes | None]]:
    """(offset, value) of the first `count` records a stream pushes."""
    values: list[tuple[int, bytes | None]] = []
    for response in call:
        for batch in response.batches:
            records = parse_batch(batch.data)
            values += [(batch.base_offset + record.offset_delta, record.value) for record in records]
        if len(values) >= count:
            return values[:count]
    return values


def timed(call: Any) -> Any:
    started = time.monotonic()
    result = call()
    assert time.monotonic() - started < OTHER_CALL_S_MAX
    return result


def excess_refused_at_once(streams: Streams, readers_max: int) -> list[Any]:
    """Opens STREAMS streams; all but `readers_max` must be refused at once. The admitted calls."""
    for _ in range(STREAMS):
        streams.open()
    wait_for(
        lambda: len(streams.ended()) == STREAMS - readers_max,
        f"{STREAMS - readers_max} of {STREAMS} streams to be refused",
        timeout_s=10,
        last_state=lambda: f"{len(streams.ended())} ended",
    )
    refused = streams.ended()
    for number in refused:
        call = streams.calls[number]
        assert call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert code_from_metadata(call.trailing_metadata()) == ErrorCode.TOO_MANY_READERS
        assert streams.ended_s[number] - streams.opened_s[number] < REFUSAL_S_MAX
    one_more = streams.open()
    wait_for(one_more.done, "one more stream to be refused", timeout_s=REFUSAL_S_MAX)
    assert code_from_metadata(one_more.trailing_metadata()) == ErrorCode.TOO_MANY_READERS
    return [streams.calls[number] for number in range(STREAMS) if number not in refused]


def other_calls_answer(leader: str, leader_id: str) -> None:
    """Produce, ListTopics and ClusterStatus on the full node each answer within OTHER_CALL_S_MAX."""
    with KqClient([leader], retry_timeout_s=OTHER_CALL_S_MAX, rpc_timeout_s=OTHER_CALL_S_MAX) as client:
        for i in range(RECORDS):
            timed(lambda i=i: client.send_batch("readers", [ProducerRecord(f"r{i}".encode())]))
            assert "readers" in [topic.name for topic in timed(lambda: client.list_topics(node=leader))]
            assert timed(lambda: client.node_status(leader)).node_id == leader_id


def slots_come_back(streams: Streams, readers_max: int, last: tuple[int, bytes]) -> None:
    """After the admitted streams were cancelled, `readers_max` new ones are admitted (each reads)."""
    readmitted: list[Any] = []

    def one_more_admitted() -> bool:
        call = streams.open(offset=last[0])
        try:
            assert streamed_values(call, 1) == [last]
        except grpc.RpcError as error:  # Still held: a cancelled handler notices within a wait slice.
            assert code_from_metadata(error.trailing_metadata()) == ErrorCode.TOO_MANY_READERS
            return False
        readmitted.append(call)
        return len(readmitted) == readers_max

    wait_for(one_more_admitted, "the cancelled streams' slots to come back", timeout_s=10, poll_s=0.2)


def test_a_node_full_of_readers_refuses_the_excess_at_once_and_keeps_answering(tmp_path: Path) -> None:
    """More streams than the node admits: the excess is refused at once (TOO_MANY_READERS),
    Produce, ListTopics and ClusterStatus on that node answer within 2 s, the admitted streams get the
    records, and cancelled streams give their slots back."""
    readers_max = READERS_MAX
    with LocalCluster(tmp_path / "c", size=3, node_args=NODE_ARGS) as cluster:
        leader_id = cluster.wait_ready()
        leader = cluster.nodes[leader_id].grpc_address
        log = cluster.log_path(leader_id).read_text()
        assert f"at most {readers_max} waiting readers, 1 per client connection" in log
        with KqClient(cluster.bootstrap) as admin:
            admin.create_topic("readers", partitions=1)
        streams = Streams(leader)
        try:
            admitted = excess_refused_at_once(streams, readers_max)
            other_calls_answer(leader, leader_id)
            expected = [(offset, f"r{offset}".encode()) for offset in range(RECORDS)]
            for call in admitted:
                assert streamed_values(call, RECORDS) == expected
                call.cancel()
            slots_come_back(streams, readers_max, expected[-1])
        finally:
            streams.close()
