"""`kq-repair`: puts a corrupt stored batch back from another replica's copy (issue 39).

A read that meets a batch failing its checksum (broker/corruption.py) hands it here once. Every
replica of the Raft group holds the same bytes for it (they are the effect of the same committed
entry), so this thread asks another replica of its group for that one batch, the leader first: a
gRPC Fetch of the batch's offset, whole batches, with `min_index` at this store's applied index (the
replica has applied at least what this one has). The copy is checked whole (CRC32C, layout, base
offset) before it is used; then the tick thread, the store's only writer,
puts it in place of the damaged row (`StoreWriter.repair_batch`). Reads serve it again at once, and
one log line and `kq_corrupt_batches_repaired_total` say so.

A replica ahead of this one may hold the batch already compacted (a `CompactCommand` this store has
not applied yet): the copy spans the same offsets and keeps fewer records, and applying that command
here later rewrites it to the same bytes. A batch no longer stored (trimmed meanwhile) is dropped. A
round in which no replica answered with a whole copy is tried again after REPAIR_RETRY_S, for as long
as the node runs; at most REPAIR_QUEUE_MAX batches wait (more are reported and left until a read
meets them again).

Between repairs the same thread scrubs: at `--scrub-bytes-per-s` (SCRUB_BYTES_PER_S_DEFAULT; 0: off;
each batch counted as at least SCRUB_BATCH_BYTES_MIN, so that small batches cannot make it a CPU
cost) it reads the stored batches of every partition in turn, each round one read transaction of at
most SCRUB_ROUND_BYTES_MAX, checks each batch's CRC32C, and reports a corrupt one as a read would
(so it is repaired before a consumer meets it); `kq_scrubbed_bytes_total` counts what it checked. Where it
stopped is kept in memory: a restarted node starts over from the first partition.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from kq.broker.corruption import BatchAt, CorruptionLog
from kq.broker.membership import node_channel
from kq.broker.metrics import SCRUBBED_BYTES
from kq.proto import kq_pb2, kq_pb2_grpc
from kq.proto.limits import (
    REPAIR_CALL_TIMEOUT_S,
    REPAIR_QUEUE_MAX,
    REPAIR_RETRY_S,
    SCRUB_BATCH_BYTES_MIN,
    SCRUB_BYTES_PER_S_DEFAULT,
    SCRUB_ROUND_BYTES_MAX,
    SCRUB_TICK_S,
)
from kq.storage import CorruptRecordError, Store
from kq.storage.records import decode_batch

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Job:
    where: BatchAt
    topic: str


class BatchRepairer:
    """The repair queue and its thread, for this process's store."""

    def __init__(
        self,
        store: Store,
        corruption: CorruptionLog,
        sources: Callable[[], list[str]],
        on_tick: Callable[[Callable[[], None]], None],
        credentials: grpc.ChannelCredentials | None = None,
        metadata: tuple[tuple[str, str], ...] = (),
        scrub_bytes_per_s: int = SCRUB_BYTES_PER_S_DEFAULT,
    ) -> None:
        """`sources()`: the gRPC addresses of the other replicas of this process's group, the leader
        first; `on_tick(f)`: runs `f` on the tick thread (raft/node.py `call_on_tick`);
        `credentials` and `metadata`: this node's TLS as a client and its node proof;
        `scrub_bytes_per_s`: the scrubber's rate (0: off)."""
        self._store = store
        self._corruption = corruption
        self._sources = sources
        self._on_tick = on_tick
        self._credentials = credentials
        self._metadata = metadata
        self._jobs: queue.Queue[_Job | None] = queue.Queue(REPAIR_QUEUE_MAX)  # None: wakes it to stop.
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._scrub_rate = scrub_bytes_per_s
        self._scrub_at: tuple[int, int, int] = (0, 0, 0)  # (topic id, partition, key offset) to read next.

    def submit(self, where: BatchAt, topic: str) -> None:
        """Queues a corrupt batch (any thread); a full queue leaves it for a later read to find."""
        try:
            self._jobs.put_nowait(_Job(where, topic))
        except queue.Full:
            self._corruption.forget(where)

    def start(self) -> None:
        """Starts `kq-repair`."""
        self._thread = threading.Thread(target=self._run, name="kq-repair", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread after the batch in hand (a fetch is bounded by REPAIR_CALL_TIMEOUT_S)."""
        self._stopping.set()
        with contextlib.suppress(queue.Full):  # Wakes an idle thread now (a full queue: it is busy).
            self._jobs.put_nowait(None)
        if self._thread is not None:
            self._thread.join(REPAIR_CALL_TIMEOUT_S + 1.0)

    def _run(self) -> None:
        scrubbed_s = time.monotonic()
        while not self._stopping.is_set():
            if self._scrub_rate:
                now_s = time.monotonic()
                budget = min(int((now_s - scrubbed_s) * self._scrub_rate), SCRUB_ROUND_BYTES_MAX)
                if budget > 0:
                    self.scrub(budget)
                    scrubbed_s = now_s
            try:
                job = self._jobs.get(timeout=SCRUB_TICK_S)
            except queue.Empty:
                continue
            if job is None:
                return
            try:
                done = self._repair(job)
            except Exception:  # A bug: logged, and the batch left for a later read to find again.
                logger.exception("repairing %s/%d at offset %d failed", job.topic, job.where[1], job.where[2])
                self._corruption.forget(job.where)
                continue
            if not done and not self._stopping.wait(REPAIR_RETRY_S):
                self.submit(job.where, job.topic)

    def scrub(self, budget: int) -> int:
        """Checks at least `budget` bytes of stored batches (one more batch past it at most) from where
        the last round stopped, in one read transaction; reports each corrupt one; the bytes checked.
        Each batch counts against `budget` as at least SCRUB_BATCH_BYTES_MIN: what bounds the round's
        CPU is the count of batches more than their bytes. A round that reaches the last partition
        goes on from the first."""
        checked = charged = 0
        with self._store.read() as reader:
            partitions = sorted((t.topic_id, p, t.name) for t in reader.topics() for p in range(t.partitions))
            if not partitions:
                return 0
            at_topic, at_partition, key_offset = self._scrub_at
            first = next(
                (i for i, (t, p, _) in enumerate(partitions) if (t, p) >= (at_topic, at_partition)), 0
            )
            if partitions[first][:2] != (at_topic, at_partition):
                key_offset = 0
            for step in range(len(partitions)):
                topic_id, partition, name = partitions[(first + step) % len(partitions)]
                start = key_offset if step == 0 else 0
                for base_offset, raw in reader.batches_from_key(topic_id, partition, start):
                    checked += len(raw)
                    charged += max(len(raw), SCRUB_BATCH_BYTES_MIN)
                    try:
                        decode_batch(raw, base_offset)
                    except CorruptRecordError as error:
                        self._corruption.found(
                            CorruptRecordError(str(error), (topic_id, partition, base_offset)),
                            name,
                            partition,
                        )
                    if charged >= budget:
                        self._scrub_at = (topic_id, partition, base_offset + 1)
                        SCRUBBED_BYTES.inc(checked)
                        return checked
                following = partitions[(first + step + 1) % len(partitions)]
                self._scrub_at = (following[0], following[1], 0)
        SCRUBBED_BYTES.inc(checked)
        return checked

    def _repair(self, job: _Job) -> bool:
        """One round for `job`; False when no replica gave a whole copy (tried again later)."""
        if not self._still_corrupt(job):
            self._corruption.forget(job.where)
            return True
        for source in self._sources():
            copy = self._fetch(source, job)
            if copy is None:
                continue
            stored = self._put_back(job.where, copy)
            if stored is None:
                return False
            if stored:
                self._corruption.repaired(job.where, job.topic, source)
            else:
                self._corruption.forget(job.where)
            return True
        return False

    def _put_back(self, where: BatchAt, copy: bytes) -> bool | None:
        """Writes `copy` in place of the damaged row on the tick thread; whether a batch was stored
        there, or None when the tick thread did not get to it in time (the node is stopping)."""
        done = threading.Event()
        stored: list[bool] = []

        def put_back() -> None:
            try:
                with self._store.write() as writer:
                    stored.append(writer.repair_batch(*where, copy))
            finally:
                done.set()

        self._on_tick(put_back)
        if not done.wait(REPAIR_CALL_TIMEOUT_S) or not stored:
            return None
        return stored[0]

    def _still_corrupt(self, job: _Job) -> bool:
        """Whether this store still holds the batch, and still damaged."""
        topic_id, partition, base_offset = job.where
        with self._store.read() as reader:
            try:
                reader.batches(topic_id, partition, base_offset, 1)
            except CorruptRecordError as error:
                return error.batch == job.where
        return False

    def _fetch(self, source: str, job: _Job) -> bytes | None:
        """The batch as the replica at `source` stores it, checked whole; None if it cannot give one."""
        _, partition, base_offset = job.where
        request = kq_pb2.FetchRequest(
            topic=job.topic,
            partition=partition,
            offset=base_offset,
            max_records=1,
            max_bytes=1,
            as_batches=True,
            min_index=self._store.applied_index(),
        )
        try:
            with node_channel(source, self._credentials) as channel:
                response = kq_pb2_grpc.BrokerStub(channel).Fetch(
                    request, timeout=REPAIR_CALL_TIMEOUT_S, metadata=self._metadata
                )
        except grpc.RpcError as error:
            logger.debug("no copy of %s/%d@%d from %s: %s", job.topic, partition, base_offset, source, error)
            return None
        for batch in response.batches:
            if batch.base_offset != base_offset:
                continue
            data = bytes(batch.data)
            try:
                decode_batch(data, base_offset)
            except CorruptRecordError:
                return None  # That replica's copy is damaged too: try another.
            return data
        return None
