"""KqClient's shared state under concurrency and its bounds, over fake connections (no sockets):
producer ids and sequences, the caches, and constructors that start no thread."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import kq.client.client
import kq.client.connection
from kq.client import (
    GroupConsumer,
    KqClient,
    NotCommittedError,
    PartitionOffsets,
    ProducedBatch,
    Producer,
    ProducerRecord,
    TopicNotFoundError,
)
from kq.proto import kq_pb2
from kq.proto.errors import ErrorCode
from kq.proto.records import BatchBuilder, NewRecord, parse_batch, read_header


class FakeConnections:
    """Answers RegisterProducer and Produce in memory; a Produce can be held or failed per partition."""

    bootstrap = ("fake:1",)
    rpc_timeout_s = 1.0
    retry_timeout_s = 1.0

    def __init__(self) -> None:
        self.producer_ids = 0
        self.produced: list[tuple[int, int, int]] = []  # (partition, producer id, sequence) as sent.
        self.hold: dict[int, threading.Event] = {}  # Partition -> released when set.
        self.entered: dict[int, threading.Event] = {}
        self.fail: set[int] = set()
        self.scripted: dict[int, list[ErrorCode]] = {}  # Partition -> codes its next requests get.
        self.calls: list[list[int]] = []  # The partitions of each ProduceMany call.
        self._lock = threading.Lock()

    groups = (0,) * 8  # Each partition's Raft group (a cluster of several: nodes with worker processes).

    def write_produce(self, request: Any, group: int = 0) -> Any:
        return self.write("Produce", request, group=group)

    def read(self, method: str, request: Any, node: str | None = None, **_: Any) -> Any:
        assert method == "DescribeTopic", method
        partitions = [kq_pb2.PartitionInfo(partition=p, group=g) for p, g in enumerate(self.groups)]
        topic = kq_pb2.TopicInfo(name=request.name, partitions=len(self.groups), topic_id=1)
        return kq_pb2.DescribeTopicResponse(topic=topic, partitions=partitions)

    def write(self, method: str, request: Any, timeout_s: float | None = None, group: int = 0) -> Any:
        if method in ("ProduceMany", "Produce"):
            items = request.requests if method == "ProduceMany" else [request]
            assert {self.groups[item.partition] for item in items} == {group}, "sent to another group"
        if method == "ProduceMany":
            self.calls.append([item.partition for item in request.requests])
            results = [self._produce_one(item, group) for item in request.requests]
            return kq_pb2.ProduceManyResponse(results=results)
        if method == "RegisterProducer":
            with self._lock:
                self.producer_ids += 1
                return kq_pb2.RegisterProducerResponse(producer_id=self.producer_ids)
        assert method == "Produce"
        partition = request.partition
        if partition in self.hold:
            self.entered[partition].set()
            self.hold[partition].wait(5)
        if partition in self.fail:
            raise NotCommittedError("injected")
        header = read_header(request.records)  # The producer id and sequence travel in the batch header.
        assert header.producer_epoch == (0 if header.producer_id >= 0 else -1)  # -1: not idempotent.
        assert header.record_count == len(parse_batch(request.records))
        with self._lock:
            self.produced.append((partition, header.producer_id, header.base_sequence))
        return kq_pb2.ProduceResponse(partition=partition, base_offset=0, index=1)

    def _produce_one(self, request: kq_pb2.ProduceRequest, group: int) -> kq_pb2.ProduceResult:
        script = self.scripted.get(request.partition)
        if script:
            code = script.pop(0)
            return kq_pb2.ProduceResult(error_code=code, message=f"scripted {code.name}")
        try:
            return kq_pb2.ProduceResult(response=self.write("Produce", request, group=group))
        except NotCommittedError as error:
            return kq_pb2.ProduceResult(error_code=ErrorCode.NOT_COMMITTED, message=str(error))

    def close(self) -> None:
        pass


def fake_client() -> tuple[KqClient, FakeConnections]:
    client = KqClient(["fake:1"])
    fake = FakeConnections()
    client._connections = fake  # type: ignore[assignment]
    return client, fake


def test_a_request_in_flight_across_a_producer_reset_does_not_leak_its_sequence() -> None:
    """A partition's request that completes after another partition reset the producer id leaves no
    sequence behind: the next request there starts the new id at 0 (else OUT_OF_ORDER_SEQUENCE)."""
    client, fake = fake_client()
    client.send("t", b"a", partition=0)
    fake.hold[0], fake.entered[0] = threading.Event(), threading.Event()
    slow = threading.Thread(target=client.send, args=("t", b"b"), kwargs={"partition": 0})
    slow.start()
    assert fake.entered[0].wait(5)  # Partition 0's request (id 1, sequence 1) is in flight.
    fake.fail.add(1)
    with pytest.raises(NotCommittedError):
        client.send("t", b"x", partition=1)  # Outcome unknown: the client gives up producer id 1.
    fake.fail.clear()
    client.send("t", b"y", partition=1)  # Registers producer id 2.
    fake.hold[0].set()
    slow.join(5)
    client.send("t", b"c", partition=0)
    assert fake.produced[-1] == (0, 2, 0)


def test_a_failure_of_an_old_producer_id_does_not_reset_the_new_one() -> None:
    """Only the id a failed request used is given up; a newer one another thread registered stays."""
    client, fake = fake_client()
    client.send("t", b"a", partition=0)
    client._reset_producer(1)
    client.send("t", b"b", partition=1)  # Producer id 2.
    client._reset_producer(1)  # A late failure report for id 1.
    client.send("t", b"c", partition=1)
    assert fake.produced[-2:] == [(1, 2, 0), (1, 2, 1)]


def test_sequences_are_bounded_by_starting_a_new_producer_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past CLIENT_PRODUCER_PARTITIONS_MAX partitions the client starts a new id instead of growing."""
    monkeypatch.setattr(kq.client.client, "CLIENT_PRODUCER_PARTITIONS_MAX", 2)
    client, fake = fake_client()
    for partition in (0, 1, 0, 2, 2):
        client.send("t", b"v", partition=partition)
    assert fake.produced == [(0, 1, 0), (1, 1, 0), (0, 1, 1), (2, 2, 0), (2, 2, 1)]
    assert len(client._sequences) <= 2


def test_sequences_wrap_from_the_int32_maximum_to_zero() -> None:
    """Like Kafka's producer: after 2**31 - 1 a partition's next sequence is 0."""
    client, fake = fake_client()
    client.send("t", b"first", partition=0)
    client._sequences[("t", 0)] = 2**31 - 1  # As if 2**31 - 1 records had been sent there.
    client.send_batch("t", [ProducerRecord(b"a", partition=0), ProducerRecord(b"b", partition=0)])
    client.send("t", b"c", partition=0)
    assert fake.produced[1:] == [(0, 1, 2**31 - 1), (0, 1, 1)]


def test_concurrent_sends_to_one_partition_use_contiguous_sequences() -> None:
    """Many threads sending to the same partitions: each (producer id, partition) gets 0, 1, 2, ... once."""
    client, fake = fake_client()

    def send_many(thread: int) -> None:
        for i in range(200):
            client.send("t", b"%d-%d" % (thread, i), partition=i % 3)

    threads = [threading.Thread(target=send_many, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for partition in range(3):
        sequences = [sequence for p, _, sequence in fake.produced if p == partition]
        assert sorted(sequences) == list(range(len(sequences)))
    assert fake.producer_ids == 1


def test_the_index_seen_never_moves_backwards_under_concurrent_updates() -> None:
    """`_saw` from many threads leaves the highest index, whatever the interleaving."""
    client, _ = fake_client()

    def see(base: int) -> None:
        for i in range(1000):
            client._saw(base + i)

    threads = [threading.Thread(target=see, args=(n * 1000,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert client.index_seen == 7999


def test_the_partition_count_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The topic -> partition count (and groups) cache forgets its oldest entry beyond its bound."""
    monkeypatch.setattr(kq.client.client, "CLIENT_TOPICS_CACHED_MAX", 3)
    client, _ = fake_client()
    monkeypatch.setattr(client, "_describe", lambda topic, node=None: _described(topic))
    for number in range(10):
        assert client.partition_count(f"t{number}") == 4
    assert list(client._partition_counts) == ["t7", "t8", "t9"]
    assert list(client._partition_groups) == ["t7", "t8", "t9"]


def _described(topic: str) -> Any:
    class Described:
        class topic:  # noqa: N801 - mimics TopicDescription.topic.
            partitions = 4

        partitions = tuple(PartitionOffsets(partition, 0, 0) for partition in range(4))

    return Described()


def test_the_channel_cache_is_bounded_and_keeps_the_bootstrap_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leader hints to ever new addresses cannot grow the channel cache past its bound."""
    monkeypatch.setattr(kq.client.connection, "CLIENT_CHANNELS_MAX", 4)
    connections = kq.client.connection.Connections(["127.0.0.1:1", "127.0.0.1:2"])
    try:
        connections.stub("127.0.0.1:1")
        connections.stub("127.0.0.1:2")
        for port in range(3, 40):
            connections.stub(f"127.0.0.1:{port}")
        assert len(connections._channels) == 4
        assert {"127.0.0.1:1", "127.0.0.1:2"} <= set(connections._channels)
    finally:
        connections.close()


def test_constructors_start_no_thread() -> None:
    """Producer and GroupConsumer start their threads on first use, never in the constructor."""
    client, _ = fake_client()
    before = threading.active_count()
    producer = Producer(client)
    consumer = GroupConsumer(client, "g", ["t"])
    assert threading.active_count() == before
    producer.send("t", b"v", partition=0)
    assert threading.active_count() > before  # The sender started with the first send.
    producer.close()
    consumer.close()


def one_record(value: bytes) -> BatchBuilder:
    builder = BatchBuilder()
    builder.append(NewRecord(None, value))
    return builder


def test_produce_batches_retries_alone_what_failed_retriably_with_the_same_sequence() -> None:
    """One call, four partitions: a QUEUE_FULL one is sent again alone with its sequence (and then
    written); an unknown topic's is refused, not retried, its sequence kept; one whose outcome stays
    unknown (NOT_COMMITTED until the retry timeout) gives up the producer id. Outcomes keep their order."""
    client, fake = fake_client()
    client.send("t", b"warm", partition=0)  # Producer id 1; partition 0 at sequence 1.
    fake.scripted = {
        1: [ErrorCode.QUEUE_FULL],
        2: [ErrorCode.UNKNOWN_TOPIC],
        3: [ErrorCode.NOT_COMMITTED] * 100,
    }
    outcomes = client.produce_batches([("t", p, one_record(b"%d" % p)) for p in range(4)])
    assert isinstance(outcomes[0], ProducedBatch) and isinstance(outcomes[1], ProducedBatch)
    assert isinstance(outcomes[2], TopicNotFoundError) and isinstance(outcomes[3], NotCommittedError)
    assert fake.calls[0] == [0, 1, 2, 3] and fake.calls[1] == [1, 3]
    assert all(call == [3] for call in fake.calls[2:])  # Only the unknown outcome kept being retried.
    assert fake.produced[1:] == [(0, 1, 1), (1, 1, 0)]  # Partition 1 sent again with sequence 0.
    assert client._producer_id == 0  # Given up: partition 3's outcome is unknown.
    client.send("t", b"next", partition=2)
    assert fake.produced[-1] == (2, 2, 0)


def test_produce_batches_names_each_partition_once() -> None:
    """Two batches for one partition in one call would race each other: refused before sending."""
    client, fake = fake_client()
    with pytest.raises(ValueError, match="once"):
        client.produce_batches([("t", 0, one_record(b"a")), ("t", 0, one_record(b"b"))])
    assert not fake.calls and not fake.produced


def test_produce_batches_sees_each_written_index_idempotent_or_not() -> None:
    """Read-your-writes: a later fetch asks for the index a produced batch's entry had, whichever way
    the client produces."""
    for idempotent in (True, False):
        client = KqClient(["fake:1"], idempotent=idempotent)
        fake = FakeConnections()
        client._connections = fake  # type: ignore[assignment]
        outcomes = client.produce_batches([("t", 0, one_record(b"a")), ("t", 1, one_record(b"b"))])
        assert all(isinstance(outcome, ProducedBatch) for outcome in outcomes)
        assert client._index_seen == 1, idempotent  # FakeConnections answers index 1.


def test_a_round_of_partitions_goes_as_one_call_per_raft_group_to_each_groups_leader() -> None:
    """In a cluster of several Raft groups the partitions of one ProduceMany round are split by group
    (as DescribeTopic names each partition's), each call sent to its group's leader (the fake asserts
    the group of every request), every record acknowledged in order of the round."""
    client, fake = fake_client()
    fake.groups = (0, 1, 2, 0, 1, 2, 0, 1)
    outcomes = client.produce_batches([("t", partition, one_record(b"v")) for partition in range(8)])
    assert all(not isinstance(outcome, Exception) for outcome in outcomes)
    assert sorted(map(sorted, fake.calls)) == [[0, 3, 6], [1, 4, 7], [2, 5]]
    assert [client.partition_group("t", partition) for partition in range(8)] == list(fake.groups)
