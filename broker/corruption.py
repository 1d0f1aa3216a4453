"""What a node does when a read meets a stored batch that fails its checksum (on-disk corruption).

Every read of the store verifies each batch's CRC32C (storage/records.py `decode_batch`), so a flipped
bit is found before a byte of it is served. The read then fails for that partition only: gRPC answers
DATA_LOSS (`CORRUPT_DATA`, retriable: kq's client moves on to another node, whose copy is whole) and
the Kafka port KAFKA_STORAGE_ERROR (56), which Kafka clients retry after refreshing their metadata, as
they do when a Kafka broker's log directory fails. Each corrupt batch is logged once (one ERROR line
naming the topic, partition and offset) and counted once (`kq_corrupt_batches_found_total`), however
often readers meet it: a consumer retrying every few milliseconds must not flood the log. The first
time a batch is met it is handed to the repairer (broker/repair.py), which puts it back from another
replica; once repaired it is forgotten here, so damage found there later is reported again.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

from kq.broker.errors import CorruptDataError
from kq.broker.metrics import CORRUPT_BATCHES_FOUND, CORRUPT_BATCHES_REPAIRED
from kq.proto.limits import CORRUPT_BATCHES_REMEMBERED_MAX
from kq.storage import CorruptRecordError

logger = logging.getLogger(__name__)

BatchAt = tuple[int, int, int]  # (topic id, partition, the batch's key offset) in this process's store.


class CorruptionLog:
    """The corrupt batches this process has reported, oldest first (at most `remembered_max`)."""

    def __init__(self, remembered_max: int = CORRUPT_BATCHES_REMEMBERED_MAX) -> None:
        self._remembered_max = remembered_max
        self._seen: OrderedDict[BatchAt, None] = OrderedDict()
        self._lock = threading.Lock()  # Read threads and the serving loop report concurrently.
        # Gets each newly found batch (with its topic's name): the repairer's queue. Set once at start.
        self.on_found: Callable[[BatchAt, str], None] | None = None

    def found(self, error: CorruptRecordError, topic: str, partition: int) -> bool:
        """Records `error` met reading `topic`/`partition`; True (and one log line, one count, one
        repair) the first time this batch is met."""
        where = error.batch if error.batch is not None else (-1, partition, -1)
        with self._lock:
            if where in self._seen:
                return False
            self._seen[where] = None
            if len(self._seen) > self._remembered_max:
                self._seen.popitem(last=False)
        CORRUPT_BATCHES_FOUND.inc()
        offset = f" at offset {where[2]}" if where[2] >= 0 else ""
        logger.error("corrupt batch in %s/%d%s: %s; not served", topic, partition, offset, error)
        if self.on_found is not None and error.batch is not None:
            self.on_found(error.batch, topic)
        return True

    def repaired(self, where: BatchAt, topic: str, source: str) -> None:
        """The repairer put `where` back from `source`: one log line, one count, and the batch is
        forgotten (reads serve it again; new damage there is a new report)."""
        with self._lock:
            self._seen.pop(where, None)
        CORRUPT_BATCHES_REPAIRED.inc()
        logger.warning(
            "repaired the corrupt batch in %s/%d at offset %d from %s", topic, where[1], where[2], source
        )

    def forget(self, where: BatchAt) -> None:
        """Drops `where` without a repair (no longer stored, or whole again): met again, it is reported."""
        with self._lock:
            self._seen.pop(where, None)

    def error(self, error: CorruptRecordError, topic: str, partition: int) -> CorruptDataError:
        """`found`, then the gRPC error the read answers."""
        self.found(error, topic, partition)
        return CorruptDataError(
            f"{topic}/{partition}: a stored batch failed its checksum on this node; read it from another node"
        )


CORRUPTION = CorruptionLog()  # The process's one log: every reader reports to it.
