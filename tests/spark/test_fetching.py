"""The executor's read loop against fake nodes: failover when a node is down or behind, data loss rules."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kq.client import (
    OffsetOutOfRangeError,
    PartitionOffsets,
    TopicNotFoundError,
    UnavailableError,
)
from kq.client.types import FetchedBatches
from kq.proto.records import NewRecord, encode_batch, with_base_offset
from kq.spark.fetching import Chunk, ReadPolicy, RowShape, read_range
from kq.spark.options import DataLossError, KqSourceError
from kq.spark.planning import OffsetRange
from kq.spark.schema import arrow_schema

MIN_INDEX = 50
SHAPE = RowShape(arrow_schema(False, False), include_headers=False, served_by=False)


def record(offset: int) -> NewRecord:
    """The record every fake node holds at `offset`."""
    return NewRecord(b"k", f"v{offset}".encode(), timestamp_ms=1_000 + offset)


@dataclass
class FakeNode:
    """A node holding offsets [log_start, log_end) at `applied_index`; `down` nodes raise UNAVAILABLE."""

    node_id: str
    applied_index: int = MIN_INDEX
    log_start: int = 0
    log_end: int = 1_000
    down: bool = False
    fetches_before_death: int | None = None
    fetches: list[int] = field(default_factory=list)


class FakeCluster:
    """Implements the reader's Fetcher protocol over FakeNodes, by address."""

    def __init__(self, *nodes: FakeNode) -> None:
        self.nodes = {f"n{node.node_id}": node for node in nodes}

    def fetch_batches(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
        wait_ms: int = 0,
        node: str | None = None,
        min_index: int | None = None,
    ) -> FetchedBatches:
        """Like a broker: UNAVAILABLE when down, nothing when behind min_index, OUT_OF_RANGE below start;
        else one batch of the records from `offset`, at most `max_records`."""
        assert node is not None and min_index is not None
        fake = self.nodes[node]
        if fake.fetches_before_death is not None and len(fake.fetches) >= fake.fetches_before_death:
            fake.down = True
        if fake.down:
            raise UnavailableError(f"cannot reach {node}")
        fake.fetches.append(offset)
        if offset < fake.log_start:
            raise OffsetOutOfRangeError(f"offset {offset} is below the log start {fake.log_start}")
        batches: tuple[bytes, ...] = ()
        records = [record(o) for o in range(offset, min(offset + max_records, fake.log_end))]
        if fake.applied_index >= min_index and records:
            batches = (with_base_offset(encode_batch(records), offset),)
        return FetchedBatches(batches, fake.log_start, fake.log_end, fake.node_id, fake.applied_index)

    def list_offsets(self, topic: str, node: str | None = None) -> dict[int, PartitionOffsets]:
        """The node's log start and end of partition 0."""
        assert node is not None
        fake = self.nodes[node]
        return {0: PartitionOffsets(0, fake.log_start, fake.log_end)}


def read_all(cluster: FakeCluster, offset_range: OffsetRange, policy: ReadPolicy) -> list[Chunk]:
    """Every chunk read, with no real sleeping."""
    return list(
        read_range(cluster, offset_range, list(cluster.nodes), MIN_INDEX, policy, SHAPE, sleep=lambda _: None)
    )


def offsets_by_node(chunks: list[Chunk]) -> dict[str, list[int]]:
    """node id -> offsets it served, in order."""
    result: dict[str, list[int]] = {}
    for chunk in chunks:
        result.setdefault(chunk.served_by, []).extend(chunk.rows.column("offset").to_pylist())
    return result


POLICY = ReadPolicy(fetch_max_records=100, fail_on_data_loss=True)


def test_reads_the_range_exactly_from_the_first_node() -> None:
    """A healthy first candidate serves the whole range, in fetches of at most fetch_max_records."""
    cluster = FakeCluster(FakeNode("1"), FakeNode("2"))
    chunks = read_all(cluster, OffsetRange("t", 0, 150, 420), POLICY)
    assert offsets_by_node(chunks) == {"1": list(range(150, 420))}
    assert cluster.nodes["n1"].fetches == [150, 250, 350]


def test_a_node_dying_mid_range_hands_over_at_the_next_offset() -> None:
    """The first node dies after two fetches; the second serves the rest: every offset once."""
    cluster = FakeCluster(FakeNode("1", fetches_before_death=2), FakeNode("2"))
    chunks = read_all(cluster, OffsetRange("t", 0, 0, 500), POLICY)
    assert offsets_by_node(chunks) == {"1": list(range(200)), "2": list(range(200, 500))}


def test_a_node_behind_the_planned_index_is_skipped() -> None:
    """A node that has not applied min_index returns nothing; the next node serves."""
    cluster = FakeCluster(FakeNode("1", applied_index=MIN_INDEX - 1), FakeNode("2", down=True), FakeNode("3"))
    chunks = read_all(cluster, OffsetRange("t", 0, 0, 250), POLICY)
    assert offsets_by_node(chunks) == {"3": list(range(250))}


def test_no_node_serving_fails_after_the_stall_timeout_naming_each_node() -> None:
    """Every node down or behind: the read fails, saying why for each node."""
    cluster = FakeCluster(FakeNode("1", applied_index=0), FakeNode("2", down=True))
    policy = ReadPolicy(fetch_max_records=100, fail_on_data_loss=True, stall_timeout_s=0.0)
    with pytest.raises(KqSourceError) as raised:
        read_all(cluster, OffsetRange("t", 0, 0, 10), policy)
    message = str(raised.value)
    assert "no node served t-0 at offset 0" in message
    assert (
        "n1: behind (applied index 0 < 50" in message and "n2: UnavailableError: cannot reach n2" in message
    )


def test_records_deleted_under_the_reader_are_data_loss() -> None:
    """Records trimmed after planning: failOnDataLoss fails the read, or the reader skips to the log start."""
    with pytest.raises(DataLossError, match=r"now holds 300\.\.999; set failOnDataLoss=false"):
        read_all(FakeCluster(FakeNode("1", log_start=300)), OffsetRange("t", 0, 100, 500), POLICY)
    skipping = ReadPolicy(fetch_max_records=100, fail_on_data_loss=False)
    chunks = read_all(FakeCluster(FakeNode("1", log_start=300)), OffsetRange("t", 0, 100, 500), skipping)
    assert offsets_by_node(chunks) == {"1": list(range(300, 500))}


def test_topic_not_found_on_a_lagging_node_moves_on() -> None:
    """NOT_FOUND may only mean the node has not applied the topic yet: another node is tried."""

    class NewTopicCluster(FakeCluster):
        def fetch_batches(self, topic: str, partition: int, offset: int, **kwargs: object) -> FetchedBatches:
            if kwargs["node"] == "n1":
                raise TopicNotFoundError("unknown topic t")
            return super().fetch_batches(topic, partition, offset, **kwargs)  # type: ignore[arg-type]

    chunks = read_all(NewTopicCluster(FakeNode("1"), FakeNode("2")), OffsetRange("t", 0, 0, 10), POLICY)
    assert offsets_by_node(chunks) == {"2": list(range(10))}
