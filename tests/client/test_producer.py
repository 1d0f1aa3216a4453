"""The batching Producer over a fake client: delivery, order, linger, in-flight and memory bounds."""

from __future__ import annotations

import logging
import threading
import time
import tracemalloc
from collections.abc import Sequence

import pytest

from kq.client import InvalidRequestError, KqClient, KqClientError, Producer, RecordMetadata, UnavailableError
from kq.client.producer import (
    BATCH_OVERHEAD_BYTES,
    RECORD_OVERHEAD_BYTES,
    BatchMetadata,
    BufferFullError,
    RecordFuture,
    _BatchFuture,
)
from kq.client.types import ProducedBatch
from kq.deploy.waiting import wait_for
from kq.proto.records import BatchSource, NewRecord, encode_record, parse_batch, record_size_max

BLOCK_MS = 200  # How long a full buffer makes `send` wait in these tests.
WAIT_S = 10.0  # A condition on the sender thread that has not held by then is a failure.


class FakeClient(KqClient):
    """Records every request (its records' values) instead of sending it; can hold requests or fail them."""

    def __init__(self) -> None:
        super().__init__(["127.0.0.1:1"])
        self.requests: list[tuple[str, int, list[bytes | None]]] = []
        self.release = threading.Event()
        self.release.set()
        self.fail = False
        self.lock = threading.Lock()
        self.in_flight: dict[int, int] = {}
        self.peak_in_flight = 0
        self.peak_per_partition = 0
        self.next_offset: dict[tuple[str, int], int] = {}
        self.attempts = 0
        self.calls: list[list[int]] = []  # The partitions of each produce_batches call, in call order.
        self.calls_in_flight = 0
        self.peak_calls = 0

    def choose_partition(self, topic: str, key: bytes | None, partition: int | None = None) -> int:
        return partition or 0

    def produce_batch(
        self, topic: str, partition: int, batch: BatchSource, compression: str | None = None
    ) -> ProducedBatch:
        records = [record.value for record in parse_batch(batch.build())]
        with self.lock:
            self.in_flight[partition] = self.in_flight.get(partition, 0) + 1
            self.peak_per_partition = max(self.peak_per_partition, self.in_flight[partition])
            self.peak_in_flight = max(self.peak_in_flight, sum(self.in_flight.values()))
        self.release.wait(10)
        with self.lock:
            self.in_flight[partition] -= 1
            self.attempts += 1
            if self.fail:
                raise UnavailableError("injected")
            self.requests.append((topic, partition, records))
            base = self.next_offset.get((topic, partition), 0)
            self.next_offset[(topic, partition)] = base + len(records)
        return ProducedBatch(topic, partition, base, len(records), False, 0)

    def produce_batches(
        self, batches: Sequence[tuple[str, int, BatchSource]], compression: str | None = None
    ) -> list[ProducedBatch | KqClientError]:
        with self.lock:
            self.calls.append([partition for _, partition, _ in batches])
            self.calls_in_flight += 1
            self.peak_calls = max(self.peak_calls, self.calls_in_flight)
        outcomes: list[ProducedBatch | KqClientError] = []
        try:
            for topic, partition, batch in batches:
                try:
                    outcomes.append(self.produce_batch(topic, partition, batch, compression))
                except KqClientError as error:
                    outcomes.append(error)
        finally:
            with self.lock:
                self.calls_in_flight -= 1
        return outcomes


def values_sent(fake: FakeClient, partition: int) -> list[bytes | None]:
    return [record for _, p, records in fake.requests if p == partition for record in records]


def test_flush_delivers_everything_in_send_order_per_partition() -> None:
    """After flush every future holds its offset, and each partition got its records in send order."""
    fake = FakeClient()
    with Producer(fake, linger_ms=1, batch_size=500) as producer:
        futures = [producer.send("t", f"{i}".encode(), partition=i % 3) for i in range(1_000)]
        producer.flush()
        assert all(future.done() for future in futures)
    for partition in range(3):
        offsets = [f.result().offset for i, f in enumerate(futures) if i % 3 == partition]
        assert offsets == list(range(len(offsets)))
        assert values_sent(fake, partition) == [f"{i}".encode() for i in range(partition, 1_000, 3)]


def test_linger_holds_a_partial_batch_until_flush() -> None:
    """With a long linger only full batches go out; the partial one waits for flush."""
    fake = FakeClient()
    record_bytes = record_size_max(NewRecord(None, b"x" * 90))  # What `batch_size` counts per record.
    producer = Producer(fake, linger_ms=60_000, batch_size=10 * record_bytes)
    for _ in range(95):
        producer.send("t", b"x" * 90)
    wait_for(lambda: len(fake.requests) == 9, "nine full requests", WAIT_S, poll_s=0.005)
    assert [len(records) for _, _, records in fake.requests] == [10] * 9
    assert len(fake.requests) == 9  # The five-record remainder is still lingering.
    producer.flush()
    assert [len(records) for _, _, records in fake.requests] == [10] * 9 + [5]
    producer.close()


def test_one_batch_per_partition_in_flight_and_max_in_flight_calls() -> None:
    """Calls are concurrent up to max_in_flight; a partition never has two batches in flight."""
    fake = FakeClient()
    fake.release.clear()
    producer = Producer(fake, linger_ms=0, max_in_flight=3)
    for partition in range(3):  # One call each: the sender takes what is there when it wakes.
        producer.send("t", b"v", partition=partition)
        calls = partition + 1
        wait_for(lambda: fake.calls_in_flight == calls, "one more call", WAIT_S, poll_s=0.005)  # noqa: B023
    for i in range(200):
        producer.send("t", b"v", partition=i % 6)
    time.sleep(0.05)
    assert fake.calls_in_flight == 3  # The rest wait for a call to return.
    fake.release.set()
    producer.flush()
    assert fake.peak_calls == 3 and fake.peak_per_partition == 1
    assert sum(len(records) for _, _, records in fake.requests) == 203
    producer.close()


def test_a_due_batch_takes_every_partitions_batch_along() -> None:
    """Once one partition's batch is due, the others' batches go in the same call (Kafka drains a
    node alike): one call for six partitions, however far each is from its linger."""
    fake = FakeClient()
    record_bytes = record_size_max(NewRecord(None, b"x" * 90))
    producer = Producer(fake, linger_ms=60_000, batch_size=10 * record_bytes)
    for partition in range(1, 6):
        producer.send("t", b"x" * 90, partition=partition)
    for _ in range(10):  # Partition 0's batch fills: it is due, and takes the five others along.
        producer.send("t", b"x" * 90, partition=0)
    wait_for(lambda: len(fake.calls) == 1, "one call", WAIT_S, poll_s=0.005)
    assert sorted(fake.calls[0]) == [0, 1, 2, 3, 4, 5]
    producer.flush()
    assert len(fake.calls) == 1
    producer.close()


def test_one_failed_batch_of_a_call_fails_only_its_own_futures() -> None:
    """Each batch of a call has its own outcome: a refused partition fails its records alone."""

    class OnePartitionRefused(FakeClient):
        def produce_batch(
            self, topic: str, partition: int, batch: BatchSource, compression: str | None = None
        ) -> ProducedBatch:
            if partition == 1:
                raise InvalidRequestError("refused")
            return super().produce_batch(topic, partition, batch, compression)

    fake = OnePartitionRefused()
    with Producer(fake, linger_ms=50) as producer:
        futures = [producer.send("t", b"v", partition=i % 3) for i in range(30)]
        producer.flush()
    assert len(fake.calls) == 1
    for i, future in enumerate(futures):
        if i % 3 == 1:
            assert isinstance(future.exception(), InvalidRequestError)
        else:
            assert future.result().offset == i // 3


def test_a_failed_request_fails_its_futures() -> None:
    """When the client gives up on a batch, every future of that batch carries the error."""
    fake = FakeClient()
    fake.fail = True
    with Producer(fake, linger_ms=0) as producer:
        futures = [producer.send("t", b"v") for _ in range(5)]
        producer.flush()
    assert all(isinstance(future.exception(), UnavailableError) for future in futures)


def test_send_after_close_is_refused() -> None:
    """A closed producer refuses new records instead of losing them."""
    producer = Producer(FakeClient())
    producer.close()
    with pytest.raises(Exception, match="closed"):
        producer.send("t", b"late")


def record_cost(fake: FakeClient, value: bytes) -> int:
    """What one record of `value` is charged against buffer_memory: its largest encoding and overhead."""
    return record_size_max(NewRecord(None, value)) + RECORD_OVERHEAD_BYTES


def test_send_blocks_then_raises_when_max_pending_records_is_reached() -> None:
    """With the sender stuck, the record past max_pending_records waits max_block_ms, then is refused."""
    fake = FakeClient()
    fake.release.clear()
    producer = Producer(fake, linger_ms=0, max_pending_records=10, max_block_ms=BLOCK_MS)
    handles = [producer.send("t", b"v") for _ in range(10)]
    started = time.monotonic()
    with pytest.raises(BufferFullError) as refused:
        producer.send("t", b"one too many")
    assert time.monotonic() - started >= BLOCK_MS / 1000 * 0.9
    assert refused.value.bound == "max_pending_records"
    assert "max_pending_records=10" in str(refused.value)
    assert producer.pending_records == 10
    fake.release.set()
    producer.flush()
    assert [handle.result().offset for handle in handles] == list(range(10))
    producer.close()


def test_a_blocked_send_goes_through_once_a_batch_completes() -> None:
    """A send waiting for room proceeds as soon as an acknowledged batch frees it, within max_block_ms."""
    fake = FakeClient()
    fake.release.clear()
    producer = Producer(fake, linger_ms=0, max_pending_records=3, max_block_ms=10_000)
    for _ in range(3):
        producer.send("t", b"v")
    outcome: list[RecordFuture] = []
    waiter = threading.Thread(target=lambda: outcome.append(producer.send("t", b"late")))
    waiter.start()
    wait_for(lambda: producer._blocked == 1, "the sender blocked", WAIT_S, poll_s=0.005)
    assert not outcome
    fake.release.set()
    waiter.join(timeout=10)
    producer.flush()
    assert outcome[0].result().offset == 3
    producer.close()


def test_the_byte_bound_charges_each_record_its_overhead() -> None:
    """buffer_memory fills at encoded bytes + RECORD_OVERHEAD_BYTES per record, not at encoded bytes alone."""
    fake = FakeClient()
    fake.release.clear()
    cost = record_cost(fake, b"v")
    buffer_bytes = 2 * BATCH_OVERHEAD_BYTES + 5 * cost  # One batch and five records at full cost.
    producer = Producer(fake, linger_ms=60_000, buffer_memory=buffer_bytes, max_block_ms=BLOCK_MS)
    for _ in range(5):
        producer.send("t", b"v")
    assert producer.pending_bytes == BATCH_OVERHEAD_BYTES + 5 * cost
    with pytest.raises(BufferFullError) as refused:
        producer.send("t", b"v")  # By encoded bytes alone, hundreds more would fit.
    assert refused.value.bound == "buffer_memory"
    fake.release.set()
    producer.flush()
    assert producer.pending_bytes == 0 and producer.pending_records == 0
    producer.close()


def test_every_batch_is_charged_its_own_overhead() -> None:
    """With one record per batch, each batch adds BATCH_OVERHEAD_BYTES, so tiny batches stay bounded."""
    fake = FakeClient()
    fake.release.clear()
    producer = Producer(fake, linger_ms=60_000, batch_size=1)
    for _ in range(4):
        producer.send("t", b"v")
    assert producer.pending_bytes == 4 * (BATCH_OVERHEAD_BYTES + record_cost(fake, b"v"))
    fake.release.set()
    producer.close()


def test_record_overhead_bytes_covers_what_a_pending_record_allocates() -> None:
    """A pending record, its handle kept, allocates at most RECORD_OVERHEAD_BYTES beyond its bytes."""
    fake = FakeClient()
    fake.release.clear()
    producer = Producer(fake, linger_ms=60_000, batch_size=1_000_000)
    value, count = b"x" * 100, 2_000
    encoded_bytes = len(encode_record(NewRecord(None, value), 0, 0))  # What the batch holds per record.
    producer.send("t", value)  # The partition's queue exists before measuring.
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        handles = [producer.send("t", value) for _ in range(count)]
        per_record_bytes = (tracemalloc.get_traced_memory()[0] - before) / count
    finally:
        tracemalloc.stop()
    assert len(handles) == count
    assert per_record_bytes - encoded_bytes <= RECORD_OVERHEAD_BYTES
    fake.release.set()
    producer.close()


def test_handles_resolve_to_their_own_records_metadata() -> None:
    """Each handle yields its own record's topic, partition and offset across many batches and topics."""
    fake = FakeClient()
    called: list[RecordFuture] = []
    with Producer(fake, linger_ms=0, batch_size=64) as producer:
        sent = [
            (f"t{i % 2}", i % 3, producer.send(f"t{i % 2}", b"%d" % i, partition=i % 3)) for i in range(300)
        ]
        sent[-1][2].add_done_callback(called.append)
        producer.flush()
    assert len({id(records) for _, _, records in fake.requests}) == len(fake.requests) > 3 * 2
    offsets: dict[tuple[str, int], int] = {}
    for topic, partition, handle in sent:
        expected = offsets.get((topic, partition), 0)
        assert handle.done() and handle.result(timeout=0) == RecordMetadata(topic, partition, expected)
        offsets[(topic, partition)] = expected + 1
    assert called == [sent[-1][2]]


def test_a_failure_reaches_every_handle_of_the_batch() -> None:
    """One failed request fails every record of its batch: result raises and callbacks see the error."""
    fake = FakeClient()
    fake.fail = True
    failed: list[BaseException | None] = []
    with Producer(fake, linger_ms=60_000) as producer:
        handles = [producer.send("t", b"v") for _ in range(50)]
        for handle in handles:
            handle.add_done_callback(lambda done: failed.append(done.exception()))
        producer.flush()
    assert fake.attempts == 1  # All fifty records were one batch.
    errors = [handle.exception(timeout=0) for handle in handles]
    assert isinstance(errors[0], UnavailableError) and all(error is errors[0] for error in errors)
    assert failed == errors
    with pytest.raises(UnavailableError):
        handles[-1].result(timeout=0)


def test_acks_none_handles_are_resolved_at_once_and_records_still_go() -> None:
    """With acks="none" a handle is done on return (offset -1) and the record is still delivered."""
    fake = FakeClient()
    fake.release.clear()
    producer = Producer(fake, linger_ms=0, acks="none")
    handles = [producer.send("t", b"v", partition=i % 2) for i in range(6)]
    assert all(handle.done() for handle in handles)
    assert [handle.result(timeout=0) for handle in handles] == [
        RecordMetadata("t", i % 2, -1) for i in range(6)
    ]
    fake.release.set()
    producer.close()
    assert sum(len(records) for _, _, records in fake.requests) == 6


def test_a_kept_handle_does_not_pin_its_batchs_per_record_metadata() -> None:
    """One kept handle of a resolved 2,000-record batch holds a few KiB, not a RecordMetadata per record."""
    fake = FakeClient()
    producer = Producer(fake, linger_ms=60_000, batch_size=1_000_000)
    producer.send("t", b"v")
    producer.flush()  # The sender's pool thread exists before measuring.
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [producer.send("t", b"v") for _ in range(2_000)][-1]
        producer.flush()
        fake.requests.clear()  # The fake's copy of the records is not the producer's.
        retained_bytes = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    producer.close()
    assert kept.result(timeout=0) == RecordMetadata("t", 0, 2_000)
    assert retained_bytes < 4 * BATCH_OVERHEAD_BYTES  # A list of 2,000 RecordMetadata is ~200 KiB.


def test_batch_metadata_keeps_only_irregular_batches_whole() -> None:
    """Consecutive offsets are kept as the first record's metadata; anything else is kept as given."""
    regular = [RecordMetadata("t", 1, 40 + i, False, 7) for i in range(5)]
    compact = BatchMetadata.of(regular)
    assert compact.listed is None and [compact.at(i) for i in range(5)] == regular
    irregular = [*regular[:2], RecordMetadata("t", 1, 42, True, 7), *regular[3:]]
    whole = BatchMetadata.of(irregular)
    assert whole.listed is not None and [whole.at(i) for i in range(5)] == irregular


def test_produced_batch_is_the_list_of_its_records_metadata() -> None:
    """What `produce_batch` returns answers as the list of a `RecordMetadata` a record would."""
    listed = [RecordMetadata("t", 1, 40 + i, True, 7) for i in range(5)]
    produced = ProducedBatch("t", 1, 40, 5, True, 7)
    assert len(produced) == 5 and list(produced) == listed and produced == listed
    assert produced[0] == listed[0] and produced[-1] == listed[-1] and produced[1:4] == listed[1:4]
    assert produced[::-2] == listed[::-2] and produced[7:] == []
    for outside in (5, -6):
        with pytest.raises(IndexError):
            produced[outside]
    assert produced != ProducedBatch("t", 1, 40, 5, False, 7) and produced != listed[:4]
    assert produced == ProducedBatch("t", 1, 40, 5, True, 7) and ProducedBatch("t", 1, 0, 0, False, 0) == []
    compact = BatchMetadata.of(produced)
    assert compact.listed is None and [compact.at(i) for i in range(5)] == listed


def test_a_one_record_batch_allocates_less_than_its_charged_overhead() -> None:
    """What a batch allocates (its Future, callback list, builder), one record included, is within
    BATCH_OVERHEAD_BYTES: what `buffer_memory` charges it is not an undercount."""
    fake = FakeClient()
    fake.release.clear()
    producer = Producer(fake, linger_ms=60_000, batch_size=1)
    producer.send("t", b"v")  # The partition's queue exists before measuring.
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        handles = [producer.send("t", b"v") for _ in range(1_000)]
        per_batch_bytes = (tracemalloc.get_traced_memory()[0] - before) / len(handles)
    finally:
        tracemalloc.stop()
    assert per_batch_bytes <= BATCH_OVERHEAD_BYTES
    fake.release.set()
    producer.close()


def test_record_callbacks_run_once_each_in_order_and_a_raising_one_stops_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Callbacks hung on a batch's records run in the order added, each once, when it resolves; one
    that raises is logged and the rest still run; one added afterwards runs at once, on the caller."""
    batch = _BatchFuture()
    handles = [RecordFuture(batch, position) for position in range(5)]
    called: list[int] = []

    def note(handle: RecordFuture) -> None:
        called.append(handle.result(timeout=0).offset)
        if handle is handles[1]:
            raise RuntimeError("a caller's bug")

    for handle in handles:
        handle.add_done_callback(note)
    assert not called and not handles[0].done()
    with caplog.at_level(logging.ERROR, logger="kq.client.producer"):
        batch.set_result(BatchMetadata(RecordMetadata("t", 0, 10)))
    assert called == [10, 11, 12, 13, 14]
    assert [record.getMessage() for record in caplog.records] == ["a record's done callback raised"]
    handles[2].add_done_callback(note)
    assert called[-1] == 12 and handles[2].exception(timeout=0) is None and not handles[2].cancelled()


def test_a_failed_batch_gives_every_record_its_error_without_waiting() -> None:
    """Once a batch has failed, each record's result raises the error and exception returns it."""
    batch = _BatchFuture()
    error = UnavailableError("no leader")
    batch.set_exception(error)
    handle = RecordFuture(batch, 3)
    assert handle.done() and handle.exception() is error
    with pytest.raises(UnavailableError):
        handle.result()


def test_callbacks_added_from_threads_while_the_batch_resolves_each_run_once() -> None:
    """Threads adding callbacks across the moment the batch resolves: none is lost, none runs twice."""
    for _ in range(20):
        assert resolve_while_threads_add(records=4_000, threads=4) == [1] * 4_000


def resolve_while_threads_add(records: int, threads: int) -> list[int]:
    """How many times each record's callback ran when `threads` threads hang one on each of `records`
    records of one batch while the main thread resolves it."""
    batch = _BatchFuture()
    counts = [0] * records
    lock = threading.Lock()
    start = threading.Barrier(threads + 1)

    def count(handle: RecordFuture) -> None:
        with lock:
            counts[handle.result(timeout=0).offset] += 1

    def add(first: int) -> None:
        start.wait()
        for position in range(first, records, threads):
            RecordFuture(batch, position).add_done_callback(count)

    adders = [threading.Thread(target=add, args=(first,)) for first in range(threads)]
    for adder in adders:
        adder.start()
    start.wait()
    batch.set_result(BatchMetadata(RecordMetadata("t", 0, 0)))
    for adder in adders:
        adder.join()
    return counts
