"""Builders shared by the state-machine tests."""

from __future__ import annotations

from kq.proto.records import encode_batch, encode_record
from kq.raft import commands


def batch(*values: bytes, key: bytes | None = None) -> bytes:
    """A record batch with the given values (and one key for all)."""
    return encode_batch(encode_record(key, value) for value in values)


def append(topic: str, partition: int, *values: bytes, producer_id: int = 0, sequence: int = 0) -> bytes:
    """An encoded AppendCommand with one partition append."""
    part = commands.partition_append(topic, partition, batch(*values), len(values), producer_id, sequence)
    return commands.encode(commands.append(1_000, [part]))


def create(name: str, partitions: int) -> bytes:
    """An encoded CreateTopicCommand."""
    return commands.encode(commands.create_topic(name, partitions, 1_000))
