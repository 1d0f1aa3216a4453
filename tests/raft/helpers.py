"""Builders shared by the state-machine tests."""

from __future__ import annotations

from kq.proto.records import NO_PRODUCER_ID, NewRecord, encode_batch
from kq.raft import commands

CLOCK_MS = 1_000  # Every batch's clock, so the same call builds the same bytes.


def batch(*values: bytes, key: bytes | None = None, producer: tuple[int, int, int] = (-1, -1, -1)) -> bytes:
    """A RecordBatch v2 with the given values (and one key for all), stamped with (id, epoch, sequence)."""
    return encode_batch([NewRecord(key, value) for value in values], 0, *producer, base_timestamp_ms=CLOCK_MS)


def append(
    topic: str,
    partition: int,
    *values: bytes,
    producer_id: int = NO_PRODUCER_ID,
    sequence: int = 0,
    epoch: int = 0,
) -> bytes:
    """An encoded AppendCommand with one partition append; idempotent when `producer_id` is not -1."""
    producer = (-1, -1, -1) if producer_id == NO_PRODUCER_ID else (producer_id, epoch, sequence)
    part = commands.partition_append(topic, partition, batch(*values, producer=producer))
    return commands.encode(commands.append(CLOCK_MS, [part]))


def create(name: str, partitions: int) -> bytes:
    """An encoded CreateTopicCommand."""
    return commands.encode(commands.create_topic(name, partitions, CLOCK_MS))
