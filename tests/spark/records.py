"""Producing known records and checking what Spark read against them: shared by the Spark system tests."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from pyspark.sql import Row

from kq.client import KqClient, ProducerRecord

BASE_TIMESTAMP_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: records carry their own (create) time.


@dataclass(frozen=True, slots=True)
class Sent:
    """A produced record and where it was written."""

    record: ProducerRecord
    partition: int
    offset: int


def produce(client: KqClient, topic: str, count: int, partitions: int, first: int = 0) -> list[Sent]:
    """`count` records numbered from `first` over `partitions`: some null keys, a null value, headers."""
    records = [
        ProducerRecord(
            value=None if i % 997 == 5 else f"value-{i}".encode(),
            key=None if i % 10 == 3 else f"key-{i % 13}".encode(),
            headers=tuple((f"h{j}", f"{i}-{j}".encode()) for j in range(i % 3)),
            timestamp_ms=BASE_TIMESTAMP_MS + i * 1_000,
            partition=i % partitions,
        )
        for i in range(first, first + count)
    ]
    metadata = client.send_batch(topic, records)
    return [Sent(record, m.partition, m.offset) for record, m in zip(records, metadata, strict=True)]


def assert_rows_match(rows: Iterable[Row], sent: Sequence[Sent], topic: str) -> None:
    """Each sent record is read exactly once, with its key, value, create timestamp and headers."""
    by_position = {(s.partition, s.offset): s.record for s in sent}
    seen: set[tuple[int, int]] = set()
    for row in rows:
        position = (row["partition"], row["offset"])
        assert position not in seen, f"offset {position} read twice"
        seen.add(position)
        record = by_position.get(position)
        assert record is not None, f"read {position}, which was not sent"
        assert row["topic"] == topic
        assert (row["key"], row["value"]) == (record.key, record.value), position
        assert record.timestamp_ms is not None
        # PySpark hands timestamps back as naive local times.
        assert row["timestamp"] == datetime.fromtimestamp(record.timestamp_ms / 1000), position
        assert row["timestampType"] == 0  # The producer chose the time: CreateTime.
        if "headers" in row.__fields__:
            assert [(h["key"], h["value"]) for h in row["headers"]] == list(record.headers), position
    assert seen == set(by_position), f"{len(set(by_position) - seen)} records not read"
