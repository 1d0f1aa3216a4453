"""`Producer`: an asynchronous, batching, idempotent producer (the kafka-python `KafkaProducer` idiom).

`send` encodes the record, appends it to its partition's open batch and returns a Future at once.
A sender thread ships a partition's batch when it reaches `batch_size` bytes, when its oldest record
has waited `linger_ms`, or on `flush`. At most one request is in flight per partition, which keeps
the partition's records in send order and its idempotent sequence numbers contiguous; up to
`max_in_flight` partitions are sent concurrently. While a partition's request is in flight its next
batch keeps filling, so batches grow with load by themselves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from client.client import KqClient
from client.errors import KqClientError
from client.types import ProducerRecord, RecordMetadata

logger = logging.getLogger(__name__)

LINGER_MS_DEFAULT = 5
BATCH_BYTES_DEFAULT = 256 * 1024
BATCH_BYTES_MAX = 2 * 1024 * 1024  # The client's REQUEST_BYTES_MAX: one batch is one request.
BATCH_RECORDS_MAX = 10_000  # The broker's RECORDS_PER_APPEND_MAX.
IN_FLIGHT_DEFAULT = 5
IN_FLIGHT_MAX = 64
BUFFER_BYTES_DEFAULT = 64 * 1024 * 1024  # Encoded records waiting to be sent; `send` blocks beyond it.
MAX_BLOCK_S_DEFAULT = 60.0
ACKS = ("all", "none")


class ProducerClosedError(KqClientError):
    """`send` after `close`."""


class BufferFullError(KqClientError):
    """The producer's buffer stayed full for `max_block_s`."""


@dataclass(slots=True)
class _Batch:
    records: list[bytes] = field(default_factory=list)
    futures: list[Future[RecordMetadata]] = field(default_factory=list)
    size_bytes: int = 0
    opened: float = 0.0


class Producer:
    """Sends records to a kq cluster in batches; thread-safe."""

    def __init__(
        self,
        client: KqClient,
        *,
        linger_ms: int = LINGER_MS_DEFAULT,
        batch_size: int = BATCH_BYTES_DEFAULT,
        max_in_flight: int = IN_FLIGHT_DEFAULT,
        acks: str = "all",
        compression: str | None = None,
        buffer_memory: int = BUFFER_BYTES_DEFAULT,
        max_block_s: float = MAX_BLOCK_S_DEFAULT,
    ) -> None:
        if acks not in ACKS:
            raise ValueError(f"acks must be one of {ACKS}")
        if not 0 < batch_size <= BATCH_BYTES_MAX:
            raise ValueError(f"batch_size must be 1..{BATCH_BYTES_MAX} bytes")
        if not 0 < max_in_flight <= IN_FLIGHT_MAX:
            raise ValueError(f"max_in_flight must be 1..{IN_FLIGHT_MAX}")
        if linger_ms < 0:
            raise ValueError("linger_ms must not be negative")
        if compression not in (None, "none", "zstd", "lz4"):
            raise ValueError("compression must be None, 'zstd' or 'lz4'")
        self._client = client
        self._linger_s = linger_ms / 1000
        self._batch_bytes = batch_size
        self._acks = acks
        self._compression = compression
        self._buffer_bytes_max = buffer_memory
        self._max_block_s = max_block_s
        self._changed = threading.Condition()
        self._open: dict[tuple[str, int], deque[_Batch]] = {}  # Oldest first; only the last one fills.
        self._in_flight: set[tuple[str, int]] = set()
        self._buffered_bytes = 0
        self._flushing = 0
        self._closed = False
        self._max_in_flight = max_in_flight
        self._pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="kq-producer")
        self._sender = threading.Thread(target=self._run, name="kq-producer-sender", daemon=True)
        self._sender.start()

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        *,
        partition: int | None = None,
        headers: Iterable[tuple[str, bytes]] = (),
        timestamp_ms: int | None = None,
    ) -> Future[RecordMetadata]:
        """Queues one record; the Future resolves to its metadata once committed (acks="all")."""
        record = ProducerRecord(value, key, tuple(headers), timestamp_ms, partition)
        chosen = self._client._choose_partition(topic, record)
        encoded = self._client._encode_record(record)
        future: Future[RecordMetadata] = Future()
        with self._changed:
            self._wait_for_room(len(encoded))
            queue = self._open.setdefault((topic, chosen), deque())
            opened = not queue or self._full(queue[-1], len(encoded))
            if opened:
                queue.append(_Batch(opened=time.monotonic()))
            batch = queue[-1]
            was_short = batch.size_bytes < self._batch_bytes
            batch.records.append(encoded)
            batch.futures.append(future)
            batch.size_bytes += len(encoded)
            self._buffered_bytes += len(encoded)
            if opened or (was_short and batch.size_bytes >= self._batch_bytes):
                # The sender only needs waking for a new linger deadline or a batch that became full.
                self._changed.notify_all()
        if self._acks == "none":
            future.set_result(RecordMetadata(topic, chosen, -1))
        return future

    def _full(self, batch: _Batch, adding_bytes: int) -> bool:
        """Whether `batch` is sealed: one more record would pass `batch_size` (or the request limits)."""
        if not batch.records:
            return False
        return len(batch.records) >= BATCH_RECORDS_MAX or batch.size_bytes + adding_bytes > self._batch_bytes

    def _wait_for_room(self, size_bytes: int) -> None:
        if self._closed:
            raise ProducerClosedError("the producer is closed")
        room = self._changed.wait_for(
            lambda: (
                self._closed or self._buffered_bytes + size_bytes <= self._buffer_bytes_max or not self._open
            ),
            timeout=self._max_block_s,
        )
        if not room:
            raise BufferFullError(f"producer buffer full for {self._max_block_s:.0f} s")
        if self._closed:
            raise ProducerClosedError("the producer is closed")

    def flush(self, timeout_s: float | None = None) -> None:
        """Sends everything buffered now and waits until every earlier `send` is resolved."""
        with self._changed:
            self._flushing += 1
            self._changed.notify_all()
            try:
                done = self._changed.wait_for(
                    lambda: not self._open and not self._in_flight, timeout=timeout_s
                )
            finally:
                self._flushing -= 1
        if not done:
            raise TimeoutError(f"flush did not finish within {timeout_s} s")

    def close(self, timeout_s: float | None = None) -> None:
        """Flushes, then stops the sender; later `send` calls fail."""
        if self._closed:
            return
        self.flush(timeout_s)
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._sender.join(timeout=timeout_s)
        self._pool.shutdown(wait=True)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _run(self) -> None:
        with self._changed:
            while not (self._closed and not self._open):
                ready, wait_s = self._ready_batches(time.monotonic())
                for key in ready:
                    queue = self._open[key]
                    batch = queue.popleft()
                    if not queue:
                        del self._open[key]
                    self._in_flight.add(key)
                    self._pool.submit(self._ship, key, batch)
                if ready:
                    self._changed.notify_all()  # Senders blocked on a full batch may open a new one.
                self._changed.wait(timeout=wait_s)

    def _ready_batches(self, now: float) -> tuple[list[tuple[str, int]], float | None]:
        """Partitions whose batch should go now, and how long until the next one is due."""
        ready: list[tuple[str, int]] = []
        next_due: float | None = None
        for key, queue in self._open.items():
            if key in self._in_flight or len(self._in_flight) + len(ready) >= self._max_in_flight:
                continue
            batch = queue[0]
            due = batch.opened + self._linger_s
            sealed = len(queue) > 1 or batch.size_bytes >= self._batch_bytes
            if self._flushing or self._closed or sealed or due <= now:
                ready.append(key)
            else:
                next_due = due - now if next_due is None else min(next_due, due - now)
        return ready, next_due

    def _ship(self, key: tuple[str, int], batch: _Batch) -> None:
        topic, partition = key
        try:
            metadata = self._client._produce(topic, partition, batch.records, self._compression)
            if self._acks == "all":
                for future, item in zip(batch.futures, metadata, strict=True):
                    future.set_result(item)
        except Exception as error:
            if self._acks == "all":
                for future in batch.futures:
                    future.set_exception(error)
            else:
                logger.warning("fire-and-forget batch to %s/%d failed: %s", topic, partition, error)
        finally:
            with self._changed:
                self._in_flight.discard(key)
                self._buffered_bytes -= batch.size_bytes
                self._changed.notify_all()
