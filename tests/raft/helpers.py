"""Builders shared by the state-machine tests."""

from __future__ import annotations

from proto import kq_pb2
from raft import commands


def records(*values: bytes, key: bytes | None = None) -> list[kq_pb2.Record]:
    """Protobuf records with the given values (and one key for all)."""
    result = []
    for value in values:
        record = kq_pb2.Record(value=value)
        if key is not None:
            record.key = key
        result.append(record)
    return result


def append(topic: str, partition: int, *values: bytes, producer_id: int = 0, sequence: int = 0) -> bytes:
    """An encoded AppendCommand with one partition append."""
    part = commands.partition_append(topic, partition, records(*values), producer_id, sequence)
    return commands.encode(commands.append(1_000, [part]))


def create(name: str, partitions: int) -> bytes:
    """An encoded CreateTopicCommand."""
    return commands.encode(commands.create_topic(name, partitions, 1_000))
