"""`Producer`: an asynchronous, batching, idempotent producer (the kafka-python `KafkaProducer` idiom).

`send` encodes the record into its partition's open batch (Kafka's RecordBatch v2: each record is
encoded once, at its position, by proto/records.py `BatchBuilder`) and returns a `RecordFuture` at
once; a record without a timestamp gets the clock at `send` (CreateTime). A sender thread (started
by the first `send`, by `start()` or by `with`, never by the constructor) ships a partition's batch
when it reaches `batch_size` bytes, when its oldest record has waited `linger_ms`, or on `flush`,
and with it the first batch of every other partition that has one (as Kafka's sender drains a
node): they go as one ProduceMany call (`KqClient.produce_batches`), whose cost to the leader is
about one Produce call's, whatever the number of partitions. At most one batch is in flight per
partition, which keeps the partition's records in send order and its idempotent sequence numbers
contiguous; up to `max_in_flight` calls are in flight at once. While a partition's batch is in
flight its next batch keeps filling, so batches grow with load by themselves.

Memory is bounded by what a pending record really costs, not only by its encoded bytes: each one
is charged an upper bound of its encoded size (`fields_size_max`: its position and timestamp delta
are not known before it joins a batch) plus `RECORD_OVERHEAD_BYTES` (and each batch
`BATCH_OVERHEAD_BYTES`) against `buffer_memory`, and at most `max_pending_records` may wait.
`send` blocks up to `max_block_ms` for room, then raises `BufferFullError` naming the bound that
was hit. A batch has one `concurrent.futures.Future` (`_BatchFuture`, which also keeps its records'
done callbacks); a record's `RecordFuture` is two references into it, so a pending record costs
about 130 B beyond its encoded bytes, where a Future per record cost ~1.8 KiB and filled the heap
with locks and lists that every full garbage collection had to scan.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from kq.client.client import KqClient
from kq.client.errors import KqClientError
from kq.client.types import ProducedBatch, RecordMetadata
from kq.proto.compression import CODECS
from kq.proto.limits import (
    CLIENT_PRODUCE_MANY_BYTES_MAX,
    CLIENT_REQUEST_BYTES_MAX,
    PRODUCE_MANY_REQUESTS_MAX,
    PRODUCER_ACKED_PARTITIONS_MAX,
    PRODUCER_IN_FLIGHT_MAX,
    RECORDS_PER_APPEND_MAX,
)
from kq.proto.records import BatchBuilder, fields_size_max, wall_clock_ms

logger = logging.getLogger(__name__)

LINGER_MS_DEFAULT = 5
# librdkafka's default batch.size (1,000,000 bytes), in MiB: a batch only grows this large under load
# (`linger_ms` sends it sooner otherwise), and fewer, larger requests cost the nodes less a record:
# 1 KiB records to six partitions went 50,070-50,922 -> 71,192-73,706 msgs/s from 256 KiB
# (bench/README.md, "What the other targets are made of").
BATCH_BYTES_DEFAULT = 1024 * 1024
IN_FLIGHT_DEFAULT = 5
BUFFER_BYTES_DEFAULT = 64 * 1024 * 1024  # Pending records at full cost; `send` blocks beyond it.
# A few seconds of a fast sender, plenty to keep every batch full. It caps the count of live objects
# (and so the GC's work) whatever the record size; with 100-byte records it binds near 27 MiB.
PENDING_RECORDS_DEFAULT = 100_000
MAX_BLOCK_MS_DEFAULT = 60_000
ACKS = ("all", "none")
# What one pending record costs beyond its encoded bytes, measured on CPython 3.11 as RSS growth over
# 10^6 pending 100-byte records with a stuck sender and every `RecordFuture` kept by the caller:
# 131 B per record. It is the bytes object's header and allocator rounding (~37 B), its slot in the
# batch's list (~9 B), the `RecordFuture` with its GC header (48 B) and position int (32 B), and the
# caller's reference to it (~9 B). The margin covers callers' containers and arena fragmentation.
RECORD_OVERHEAD_BYTES = 160
# What one batch costs beyond its records, measured with tracemalloc: its Future (a Condition, an
# RLock, lists; the records' callback list and its lock), the batch object and its list (~2.0 KiB;
# 2,223 B a one-record batch), and a partition's deque when the batch opens one (~0.8 KiB). Charged so
# that a tiny `batch_size` cannot escape the bound.
BATCH_OVERHEAD_BYTES = 3 * 1024


class ProducerClosedError(KqClientError):
    """`send` after `close`."""


class BufferFullError(KqClientError):
    """`send` found no room for `max_block_ms`; `bound` names the limit that was hit.

    `bound` is "max_pending_records" or "buffer_memory", so callers act on it without reading text.
    """

    def __init__(self, message: str, bound: str) -> None:
        super().__init__(message)
        self.bound = bound


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """A resolved batch's metadata, kept small because any one record's handle keeps it alive.

    The broker gives a batch consecutive offsets with one index, so the first record's metadata
    says it all and a record's own is built when asked. Only metadata that does not follow that
    pattern is kept whole (`listed`). A list of a `RecordMetadata` per record (~110 B each) would
    make one kept handle pin ~0.2 MiB for a full batch.
    """

    first: RecordMetadata
    listed: tuple[RecordMetadata, ...] | None = None

    @staticmethod
    def of(metadata: Sequence[RecordMetadata]) -> BatchMetadata:
        """The compact form of a batch's metadata, in send order (one entry per record)."""
        if isinstance(metadata, ProducedBatch):  # What `produce_batch` returns: consecutive by making.
            return BatchMetadata(metadata[0])
        first = metadata[0]
        topic, partition, offset, duplicate, index = (
            first.topic,
            first.partition,
            first.offset,
            first.duplicate,
            first.index,
        )
        consecutive = all(  # Field by field: comparing whole dataclasses costs ~40x more.
            item.offset == offset + position
            and item.index == index
            and item.duplicate == duplicate
            and item.partition == partition
            and item.topic == topic
            for position, item in enumerate(metadata)
        )
        return BatchMetadata(first) if consecutive else BatchMetadata(first, tuple(metadata))

    def at(self, position: int) -> RecordMetadata:
        """The metadata of the batch's record at `position`."""
        if self.listed is not None:
            return self.listed[position]
        return _following(self.first, position)


def _following(first: RecordMetadata, position: int) -> RecordMetadata:
    """The metadata of the record `position` places after `first` in a consecutively stored batch."""
    if position == 0:
        return first
    return RecordMetadata(first.topic, first.partition, first.offset + position, first.duplicate, first.index)


class _BatchFuture(Future[BatchMetadata]):
    """A batch's Future, which also keeps its records' done callbacks apart from its own.

    A caller that hangs a callback on every record (a delivery report, a counter: the benchmarks do)
    would otherwise put one callback object on the Future per record, each taking its Condition to
    register, being called through the Future's callback loop, and taking the Condition again for each
    `exception()` or `result()` it asks: ~4 µs of the sending and sender threads a record, as much
    again as `send` itself. Here a record's callback is one append under a plain lock, the batch's one
    callback of its own calls them all in order, and once the outcome is known it is read without a
    lock (`known`, `error`, `metadata`, set before any record's callback runs).
    """

    def __init__(self) -> None:
        super().__init__()
        self.known = False
        self.error: BaseException | None = None
        self.metadata: BatchMetadata | None = None
        self._record_lock = threading.Lock()
        self._record_callbacks: list[tuple[RecordFuture, Callable[[RecordFuture], object]]] | None = []
        super().add_done_callback(_resolved)

    def add_record_callback(self, record: RecordFuture, callback: Callable[[RecordFuture], object]) -> None:
        """Calls `callback(record)` once the batch is resolved: at once, here, if it already is."""
        with self._record_lock:
            waiting = self._record_callbacks
            if waiting is not None:
                waiting.append((record, callback))
                return
        _call(record, callback)

    def note_outcome(self) -> None:
        """Run once, by whichever thread resolved the batch: notes the outcome, then calls the records'
        callbacks in the order they were added."""
        try:
            self.error = self.exception(timeout=0)
        except CancelledError as cancelled:  # The Producer never cancels a batch; kept whole regardless.
            self.error = cancelled
        if self.error is None:
            self.metadata = self.result(timeout=0)
        self.known = True
        with self._record_lock:
            waiting, self._record_callbacks = self._record_callbacks, None
        for record, callback in waiting or ():
            _call(record, callback)


def _resolved(future: Future[BatchMetadata]) -> None:
    """A `_BatchFuture`'s own done callback (a function, not a bound method: no reference cycle)."""
    assert isinstance(future, _BatchFuture)
    future.note_outcome()


def _call(record: RecordFuture, callback: Callable[[RecordFuture], object]) -> None:
    """One record's done callback; what it raises is logged, as `Future` does, and never stops the rest."""
    try:
        callback(record)
    except Exception:
        logger.exception("a record's done callback raised")


class RecordFuture:
    """One record's outcome: its batch's single Future seen at the record's position.

    What `send` returns. It answers like a `concurrent.futures.Future` of the record's
    `RecordMetadata` (`result`, `exception`, `done`, `cancelled`, `add_done_callback`), but holds two
    references and no lock of its own, which is what keeps a pending record cheap.
    """

    __slots__ = ("_batch_future", "_position")

    def __init__(self, batch_future: _BatchFuture, position: int) -> None:
        self._batch_future = batch_future
        self._position = position

    def result(self, timeout: float | None = None) -> RecordMetadata:
        """The record's metadata once its batch is acknowledged; raises the batch's error if it failed."""
        batch = self._batch_future
        metadata = batch.metadata if batch.known else batch.result(timeout)
        if metadata is None:  # Known, and failed.
            return batch.result(0).at(self._position)  # Raises the batch's error, as Future does.
        return metadata.at(self._position)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The batch's error, or None once it succeeded; waits up to `timeout` seconds."""
        batch = self._batch_future
        return batch.error if batch.known else batch.exception(timeout)

    def done(self) -> bool:
        """Whether the record's batch has been resolved (acknowledged or failed)."""
        batch = self._batch_future
        return batch.known or batch.done()

    def cancelled(self) -> bool:
        """Always False: a queued record cannot be withdrawn (kept for Future-like callers)."""
        return False

    def add_done_callback(self, callback: Callable[[RecordFuture], object]) -> None:
        """Calls `callback(self)` once the batch is resolved (at once if it already is).

        Each callback costs a small tuple until the batch resolves; it is not charged to the buffer.
        """
        self._batch_future.add_record_callback(self, callback)


@dataclass(slots=True)
class _Batch:
    """One partition's records sent together as one request, and the Future all their handles share."""

    opened: float
    records: BatchBuilder = field(default_factory=BatchBuilder)  # Each record encoded once, in order.
    future: _BatchFuture = field(default_factory=_BatchFuture)
    size_bytes: int = 0  # Encoded bytes (upper bounds): what `batch_size` limits.
    cost_bytes: int = BATCH_OVERHEAD_BYTES  # Encoded bytes and overheads: what `buffer_memory` limits.


class Producer:
    """Sends records to a kq cluster in batches; thread-safe: any threads may `send` and `flush` at once."""

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
        max_pending_records: int = PENDING_RECORDS_DEFAULT,
        max_block_ms: int = MAX_BLOCK_MS_DEFAULT,
    ) -> None:
        _validate(linger_ms, batch_size, max_in_flight, acks, compression)
        if buffer_memory <= 0 or max_pending_records <= 0 or max_block_ms < 0:
            raise ValueError("buffer_memory and max_pending_records must be positive; max_block_ms >= 0")
        self._client = client
        self._linger_s = linger_ms / 1000
        self._batch_bytes = batch_size
        self._acks = acks
        self._compression = compression
        self._buffer_bytes_max = buffer_memory
        self._pending_records_max = max_pending_records
        self._max_block_s = max_block_ms / 1000
        self._changed = threading.Condition()
        self._open: dict[tuple[str, int], deque[_Batch]] = {}  # Oldest first; only the last one fills.
        self._in_flight: set[tuple[str, int]] = set()  # Partitions with a batch in a call in flight.
        self._calls_in_flight = 0
        self._acknowledged_now: dict[tuple[str, int], _BatchFuture] = {}  # acks="none".
        self._pending_bytes = 0  # Cost of every record and batch not yet resolved.
        self._pending_records = 0
        self._flushing = 0
        self._blocked = 0  # Senders waiting for room: the sender then ships without lingering.
        self._closed = False
        self._max_in_flight = max_in_flight
        # The pool makes its threads on first use; the sender thread starts in `start()`.
        self._pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="kq-producer")
        self._sender: threading.Thread | None = None

    def start(self) -> None:
        """Starts the sender thread, once; `send` (and `with`) call it, so calling it is optional."""
        with self._changed:
            self._start_sender()

    def _start_sender(self) -> None:
        """Starts the sender thread if it is not running (the caller holds the lock)."""
        if self._sender is None and not self._closed:
            self._sender = threading.Thread(target=self._run, name="kq-producer-sender", daemon=True)
            self._sender.start()

    @property
    def pending_records(self) -> int:
        """Records sent but not yet acknowledged or failed."""
        return self._pending_records

    @property
    def pending_bytes(self) -> int:
        """What the pending records and their batches are charged against `buffer_memory`."""
        return self._pending_bytes

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        *,
        partition: int | None = None,
        headers: Iterable[tuple[str, bytes]] = (),
        timestamp_ms: int | None = None,
    ) -> RecordFuture:
        """Queues one record; its RecordFuture resolves to the metadata once committed (acks="all").

        Blocks while the buffer is full, up to `max_block_ms`, then raises `BufferFullError`.
        """
        # Field by field, without a ProducerRecord or a NewRecord: two objects a record were a sixth of
        # the sending thread's time (bench/README.md, "What the other targets are made of").
        headers = tuple(headers)
        chosen = self._client.choose_partition(topic, key, partition)
        created_ms = wall_clock_ms() if timestamp_ms is None else timestamp_ms
        size_bytes = fields_size_max(key, value, headers)
        cost_bytes = size_bytes + RECORD_OVERHEAD_BYTES
        with self._changed:
            if self._closed or not self._has_room(cost_bytes):
                self._wait_for_room(cost_bytes)
            self._start_sender()
            batch = self._batch_for((topic, chosen), size_bytes)
            was_short = batch.size_bytes < self._batch_bytes
            position = batch.records.record_count
            batch.records.add(key, value, headers, created_ms)  # Encoded here, at its position.
            batch.size_bytes += size_bytes
            batch.cost_bytes += cost_bytes
            self._pending_bytes += cost_bytes
            self._pending_records += 1
            if position == 0 or (was_short and batch.size_bytes >= self._batch_bytes):
                # The sender only needs waking for a new linger deadline or a batch that became full.
                self._changed.notify_all()
        if self._acks == "none":
            return RecordFuture(self._acknowledged((topic, chosen)), 0)
        return RecordFuture(batch.future, position)

    def _batch_for(self, key: tuple[str, int], adding_bytes: int) -> _Batch:
        """The partition's filling batch, opening (and charging) a new one when the last is sealed."""
        queue = self._open.setdefault(key, deque())
        if not queue or self._full(queue[-1], adding_bytes):
            queue.append(_Batch(opened=time.monotonic()))
            self._pending_bytes += BATCH_OVERHEAD_BYTES
        return queue[-1]

    def _acknowledged(self, key: tuple[str, int]) -> _BatchFuture:
        """acks="none": one resolved Future per partition that every record of it points at."""
        future = self._acknowledged_now.get(key)
        if future is None:
            if len(self._acknowledged_now) >= PRODUCER_ACKED_PARTITIONS_MAX:
                self._acknowledged_now.clear()  # Each is only a resolved Future: made again on demand.
            future = _BatchFuture()
            future.set_result(BatchMetadata(RecordMetadata(key[0], key[1], -1)))
            self._acknowledged_now[key] = future
        return future

    def _full(self, batch: _Batch, adding_bytes: int) -> bool:
        """Whether `batch` is sealed: one more record would pass `batch_size` (or the request limits)."""
        if not batch.records.record_count:
            return False
        if batch.records.record_count >= RECORDS_PER_APPEND_MAX:
            return True
        return batch.size_bytes + adding_bytes > self._batch_bytes

    def _has_room(self, cost_bytes: int) -> bool:
        """Whether one more record of `cost_bytes` fits both bounds (or nothing at all is pending).

        An empty buffer always takes one record, so a record larger than `buffer_memory` still goes
        out (alone) instead of waiting forever; it is refused by the request limits if too large.
        """
        if self._pending_records == 0:
            return True
        return (
            self._pending_records < self._pending_records_max
            and self._pending_bytes + cost_bytes + BATCH_OVERHEAD_BYTES <= self._buffer_bytes_max
        )

    def _wait_for_room(self, cost_bytes: int) -> None:
        """Blocks (the lock held by the caller is released while waiting) until the record fits."""
        if self._closed:
            raise ProducerClosedError("the producer is closed")
        self._blocked += 1
        self._changed.notify_all()  # Lingering batches go now: waiting for them would only block longer.
        try:
            room = self._changed.wait_for(
                lambda: self._closed or self._has_room(cost_bytes), timeout=self._max_block_s
            )
        finally:
            self._blocked -= 1
        if self._closed:
            raise ProducerClosedError("the producer is closed")
        if not room:
            raise self._buffer_full_error()

    def _buffer_full_error(self) -> BufferFullError:
        waited_ms = round(self._max_block_s * 1000)
        if self._pending_records >= self._pending_records_max:
            return BufferFullError(
                f"producer buffer full for {waited_ms} ms: {self._pending_records} records pending "
                f"(max_pending_records={self._pending_records_max})",
                "max_pending_records",
            )
        return BufferFullError(
            f"producer buffer full for {waited_ms} ms: {self._pending_bytes} bytes pending at "
            f"{RECORD_OVERHEAD_BYTES} B overhead per record (buffer_memory={self._buffer_bytes_max})",
            "buffer_memory",
        )

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
            sender = self._sender
        if sender is not None:
            sender.join(timeout=timeout_s)
        self._pool.shutdown(wait=True)

    def __enter__(self) -> Producer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _run(self) -> None:
        with self._changed:
            while not (self._closed and not self._open):
                calls, wait_s = self._ready_calls(time.monotonic())
                for keys in calls:
                    self._in_flight.update(keys)
                    self._calls_in_flight += 1
                    # No local name for the batches: this thread would keep their records alive while waiting.
                    self._pool.submit(self._ship, [(key, self._take_oldest(key)) for key in keys])
                if calls:
                    self._changed.notify_all()  # Senders blocked on a full batch may open a new one.
                self._changed.wait(timeout=wait_s)

    def _take_oldest(self, key: tuple[str, int]) -> _Batch:
        """Removes and returns the partition's oldest batch (the lock is held by the caller)."""
        queue = self._open[key]
        batch = queue.popleft()
        if not queue:
            del self._open[key]
        return batch

    def _ready_calls(self, now: float) -> tuple[list[list[tuple[str, int]]], float | None]:
        """The calls to send now, each a list of partitions (one batch each), and how long until the
        next batch is due. Once one partition's batch is due (full, lingered, or flushing), every
        partition with a batch and none in flight joins, in calls of at most PRODUCE_MANY_REQUESTS_MAX
        batches and CLIENT_PRODUCE_MANY_BYTES_MAX bytes, up to `max_in_flight` calls in flight."""
        idle = [key for key in self._open if key not in self._in_flight]
        hurry = self._flushing or self._blocked or self._closed
        next_due: float | None = None
        due_now = bool(hurry)
        for key in idle if not due_now else ():
            queue = self._open[key]
            due = queue[0].opened + self._linger_s
            if len(queue) > 1 or queue[0].size_bytes >= self._batch_bytes or due <= now:
                due_now = True
                break
            next_due = due - now if next_due is None else min(next_due, due - now)
        calls: list[list[tuple[str, int]]] = []
        if not idle or not due_now or self._calls_in_flight >= self._max_in_flight:
            return calls, next_due
        call: list[tuple[str, int]] = []
        call_bytes = 0
        for key in idle:
            size = self._open[key][0].size_bytes
            if call and (
                len(call) >= PRODUCE_MANY_REQUESTS_MAX or call_bytes + size > CLIENT_PRODUCE_MANY_BYTES_MAX
            ):
                calls.append(call)
                if self._calls_in_flight + len(calls) >= self._max_in_flight:
                    return calls, None  # The rest go when a call returns (it notifies).
                call, call_bytes = [], 0
            call.append(key)
            call_bytes += size
        calls.append(call)
        return calls, None

    def _ship(self, items: list[tuple[tuple[str, int], _Batch]]) -> None:
        """Sends one call's batches and resolves each batch's Future (so every record of it) with its
        own outcome."""
        try:
            sources = [(topic, partition, batch.records) for (topic, partition), batch in items]
            outcomes: Sequence[ProducedBatch | Exception] = self._client.produce_batches(
                sources, self._compression
            )
        except Exception as error:  # Whatever went wrong must reach every record, or callers hang.
            outcomes = [error] * len(items)
        try:
            for ((topic, partition), batch), outcome in zip(items, outcomes, strict=True):
                count = batch.records.record_count
                result = outcome
                if not isinstance(result, Exception) and len(result) != count:
                    result = KqClientError(f"{len(result)} offsets returned for {count} records")
                if isinstance(result, Exception):
                    batch.future.set_exception(result)
                    if self._acks == "none":
                        logger.warning("fire-and-forget batch to %s/%d failed: %s", topic, partition, result)
                else:
                    batch.future.set_result(BatchMetadata.of(result))
        finally:
            with self._changed:
                self._calls_in_flight -= 1
                for key, batch in items:
                    self._in_flight.discard(key)
                    self._pending_bytes -= batch.cost_bytes
                    self._pending_records -= batch.records.record_count
                    batch.records.clear()  # No longer charged, so no longer held, whoever still refers to it.
                self._changed.notify_all()


def _validate(
    linger_ms: int, batch_size: int, max_in_flight: int, acks: str, compression: str | None
) -> None:
    """Raises ValueError for a setting outside its range."""
    if acks not in ACKS:
        raise ValueError(f"acks must be one of {ACKS}")
    if not 0 < batch_size <= CLIENT_REQUEST_BYTES_MAX:  # One batch is one request.
        raise ValueError(f"batch_size must be 1..{CLIENT_REQUEST_BYTES_MAX} bytes")
    if not 0 < max_in_flight <= PRODUCER_IN_FLIGHT_MAX:
        raise ValueError(f"max_in_flight must be 1..{PRODUCER_IN_FLIGHT_MAX}")
    if linger_ms < 0:
        raise ValueError("linger_ms must not be negative")
    if compression is not None and compression not in CODECS:
        raise ValueError(f"compression must be None or one of {', '.join(map(repr, CODECS))}")
