"""`Consumer`: reads one topic's partitions from chosen offsets, kafka-python style (`poll`, iteration)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from kq.client.client import KqClient
from kq.client.errors import InvalidRequestError
from kq.client.types import ConsumerRecord

POLL_WAIT_SLICE_MS = 100  # Long-poll one partition this long before looking at the others again.


class Consumer:
    """Reads `topic` from `start` ("earliest", "latest" or an offset) on each partition.

    `node` pins the node that serves the reads (a follower, to keep load off the leader). Not
    thread-safe: its positions belong to the one thread that polls (the client it uses may be shared).
    """

    def __init__(
        self,
        client: KqClient,
        topic: str,
        *,
        partitions: Sequence[int] | None = None,
        start: str | int = "earliest",
        node: str | None = None,
        max_records: int = 500,
    ) -> None:
        self._client = client
        self.topic = topic
        self._node = node
        self._max_records = max_records
        offsets = client.list_offsets(topic, node)
        chosen = list(partitions) if partitions is not None else sorted(offsets)
        unknown = [p for p in chosen if p not in offsets]
        if unknown:
            raise InvalidRequestError(f"topic {topic} has no partition {unknown[0]} (it has {len(offsets)})")
        self._positions: dict[int, int] = {}
        for partition in chosen:
            if start == "earliest":
                self._positions[partition] = offsets[partition].log_start_offset
            elif start == "latest":
                self._positions[partition] = offsets[partition].log_end_offset
            else:
                self._positions[partition] = int(start)
        self._turn = 0

    def position(self, partition: int) -> int:
        """The offset of the next record this consumer will return from `partition`."""
        return self._positions[partition]

    def seek(self, partition: int, offset: int) -> None:
        """Moves `partition` to `offset`."""
        self._positions[partition] = offset

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[ConsumerRecord]:
        """Records from the assigned partitions, waiting up to `timeout_ms` when none are there yet."""
        limit = max_records or self._max_records
        deadline = time.monotonic() + timeout_ms / 1000
        partitions = list(self._positions)
        while True:
            records: list[ConsumerRecord] = []
            for partition in partitions:
                records += self._fetch(partition, limit - len(records), 0)
                if len(records) >= limit:
                    break
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if records or remaining_ms <= 0:
                return records
            self._turn = (self._turn + 1) % len(partitions)
            waited = self._fetch(partitions[self._turn], limit, min(remaining_ms, POLL_WAIT_SLICE_MS))
            if waited:
                return waited

    def _fetch(self, partition: int, limit: int, wait_ms: int) -> list[ConsumerRecord]:
        if limit <= 0:
            return []
        result = self._client.fetch(
            self.topic,
            partition,
            self._positions[partition],
            max_records=limit,
            wait_ms=wait_ms,
            node=self._node,
        )
        self._positions[partition] = max(self._positions[partition], result.next_offset)
        return list(result.records)

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """Yields records forever, waiting for new ones."""
        while True:
            yield from self.poll(timeout_ms=1000)
