"""The batching Producer over a fake client: delivery, per-partition order, linger and in-flight bounds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from client import KqClient, Producer, RecordMetadata, UnavailableError
from client.types import ProducerRecord


class FakeClient(KqClient):
    """Records every request instead of sending it; can hold requests or fail them."""

    def __init__(self) -> None:
        super().__init__(["127.0.0.1:1"])
        self.requests: list[tuple[str, int, list[bytes]]] = []
        self.release = threading.Event()
        self.release.set()
        self.fail = False
        self.lock = threading.Lock()
        self.in_flight: dict[int, int] = {}
        self.peak_in_flight = 0
        self.peak_per_partition = 0
        self.next_offset: dict[int, int] = {}

    def _choose_partition(self, topic: str, record: ProducerRecord) -> int:
        return record.partition or 0

    def _produce(
        self, topic: str, partition: int, records: list[bytes], compression: str | None = None
    ) -> list[RecordMetadata]:
        with self.lock:
            self.in_flight[partition] = self.in_flight.get(partition, 0) + 1
            self.peak_per_partition = max(self.peak_per_partition, self.in_flight[partition])
            self.peak_in_flight = max(self.peak_in_flight, sum(self.in_flight.values()))
        self.release.wait(10)
        with self.lock:
            self.in_flight[partition] -= 1
            if self.fail:
                raise UnavailableError("injected")
            self.requests.append((topic, partition, list(records)))
            base = self.next_offset.get(partition, 0)
            self.next_offset[partition] = base + len(records)
        return [RecordMetadata(topic, partition, base + i) for i in range(len(records))]


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def values_sent(fake: FakeClient, partition: int) -> list[bytes]:
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
        encoded = values_sent(fake, partition)
        assert len(encoded) == len(offsets)
        assert encoded == [
            fake._encode_record(ProducerRecord(f"{i}".encode())) for i in range(partition, 1_000, 3)
        ]


def test_linger_holds_a_partial_batch_until_flush() -> None:
    """With a long linger only full batches go out; the partial one waits for flush."""
    fake = FakeClient()
    record_bytes = len(fake._encode_record(ProducerRecord(b"x" * 90)))
    producer = Producer(fake, linger_ms=60_000, batch_size=10 * record_bytes)
    for _ in range(95):
        producer.send("t", b"x" * 90)
    wait_until(lambda: len(fake.requests) == 9)
    assert [len(records) for _, _, records in fake.requests] == [10] * 9
    assert len(fake.requests) == 9  # The five-record remainder is still lingering.
    producer.flush()
    assert [len(records) for _, _, records in fake.requests] == [10] * 9 + [5]
    producer.close()


def test_one_request_per_partition_and_max_in_flight_overall() -> None:
    """Requests are concurrent across partitions up to max_in_flight, never within one partition."""
    fake = FakeClient()
    fake.release.clear()
    producer = Producer(fake, linger_ms=0, max_in_flight=3)
    for i in range(200):
        producer.send("t", b"v", partition=i % 6)
    wait_until(lambda: sum(fake.in_flight.values()) == 3)
    fake.release.set()
    producer.flush()
    assert fake.peak_in_flight == 3 and fake.peak_per_partition == 1
    assert sum(len(records) for _, _, records in fake.requests) == 200
    producer.close()


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
