"""Reading one node's copy of a partition, start to end: how tests, chaos and bench compare the nodes.

The one loop that walks a partition offset by offset from a named node (never "any node": the point
is to see what that node holds), shared by the system tests' identical-copies checks, the chaos
checker's reader and the soak's per-node digest.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from kq.client import ConsumerRecord, KqClient

READ_BATCH_RECORDS = 5_000
READ_BATCH_BYTES = 4 << 20


class PartitionReadError(RuntimeError):
    """A node kept returning no records below the end it was asked to read to."""


def read_partition(
    client: KqClient,
    topic: str,
    partition: int,
    node: str,
    start: int,
    end: int,
    *,
    min_index: int | None = None,
    wait_ms: int = 0,
    timeout_s: float = 0.0,
) -> Iterator[ConsumerRecord]:
    """The records of offsets `start` to `end` (exclusive) as the node at `node` holds them (in a
    compacted topic, offsets without a record are stepped over).

    Every fetch carries `min_index` (default: the highest index `client` has seen), so a node that
    has not applied it yet answers with no records rather than with older state. An empty answer is
    asked again (each fetch waiting up to `wait_ms`) until `timeout_s` has passed, then raises
    `PartitionReadError`; with the default 0 the first empty answer raises.
    """
    deadline = time.monotonic() + timeout_s
    offset = start
    while offset < end:
        batch = client.fetch(
            topic,
            partition,
            offset,
            max_records=READ_BATCH_RECORDS,
            max_bytes=READ_BATCH_BYTES,
            wait_ms=wait_ms,
            node=node,
            min_index=min_index,
        )
        if not batch.records and batch.next_offset > offset:
            offset = batch.next_offset  # Offsets compaction left without a record.
            continue
        if not batch.records:
            if time.monotonic() >= deadline:
                raise PartitionReadError(
                    f"node {node} returned nothing at {topic}/{partition} offset {offset} below {end}"
                )
            continue  # Not applied up to min_index yet: the fetch itself waited wait_ms.
        yield from (record for record in batch.records if record.offset < end)
        offset = batch.next_offset


def read_whole_partition(client: KqClient, topic: str, partition: int, node: str) -> list[ConsumerRecord]:
    """Every record of the partition as `node` holds it, from its log start to its log end."""
    offsets = client.list_offsets(topic, node)[partition]
    start, end = offsets.log_start_offset, offsets.log_end_offset
    return list(read_partition(client, topic, partition, node, start, end))
