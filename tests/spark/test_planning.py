"""Pure planning: batch and stream ranges, data-loss checks, minPartitions splits, maxOffsetsPerTrigger."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kq.client import PartitionOffsets
from kq.spark.metadata import ClusterView, read_candidates
from kq.spark.options import DataLossError, KqSourceError, OffsetSpec, ReadFrom, TopicPartition
from kq.spark.planning import (
    OffsetRange,
    batch_ranges,
    initial_offsets,
    rate_limit,
    split_ranges,
    stream_ranges,
)

A0, A1 = TopicPartition("a", 0), TopicPartition("a", 1)
SNAPSHOT = {A0: PartitionOffsets(0, 10, 100), A1: PartitionOffsets(1, 0, 0)}


def specific(**offsets: int) -> OffsetSpec:
    """A specific OffsetSpec from partition-of-'a' keywords: specific(p0=5, p1=-2)."""
    return OffsetSpec("specific", tuple((TopicPartition("a", int(k[1:])), v) for k, v in offsets.items()))


def test_batch_defaults_read_everything_held_and_skip_empty_partitions() -> None:
    """earliest..latest by default; an empty partition plans no range."""
    assert batch_ranges(SNAPSHOT, None, None, fail_on_data_loss=True) == [OffsetRange("a", 0, 10, 100)]


def test_batch_specific_offsets_and_sentinels() -> None:
    """-2 and -1 in JSON mean earliest and latest."""
    ranges = batch_ranges(SNAPSHOT, specific(p0=20, p1=-2), specific(p0=-1, p1=-1), fail_on_data_loss=True)
    assert ranges == [OffsetRange("a", 0, 20, 100)]


def test_specific_offsets_must_name_every_partition_read() -> None:
    """As in Kafka: a partition missing from the JSON, or one not read, is an error naming the option."""
    with pytest.raises(KqSourceError, match="'startingOffsets': misses a-1"):
        batch_ranges(SNAPSHOT, specific(p0=20), None, fail_on_data_loss=True)
    with pytest.raises(KqSourceError, match="names a-7, which the query does not read"):
        batch_ranges(SNAPSHOT, None, specific(p0=-1, p1=-1, p7=3), fail_on_data_loss=True)


def test_ending_beyond_the_log_end_or_before_the_start_is_an_error() -> None:
    """An end past what is held, or before the start, names endingOffsets."""
    with pytest.raises(KqSourceError, match="'endingOffsets': offset 101 of a-0 is beyond its log end 100"):
        batch_ranges(SNAPSHOT, None, specific(p0=101, p1=-1), fail_on_data_loss=True)
    with pytest.raises(KqSourceError, match="before its starting offset 50"):
        batch_ranges(SNAPSHOT, specific(p0=50, p1=-2), specific(p0=40, p1=-1), fail_on_data_loss=True)


def test_starting_below_the_log_start_is_data_loss() -> None:
    """Deleted records fail the read, or are skipped with failOnDataLoss=false."""
    with pytest.raises(DataLossError, match="records below 10 were deleted; set failOnDataLoss=false"):
        batch_ranges(SNAPSHOT, specific(p0=3, p1=-2), None, fail_on_data_loss=True)
    ranges = batch_ranges(SNAPSHOT, specific(p0=3, p1=-2), None, fail_on_data_loss=False)
    assert ranges == [OffsetRange("a", 0, 10, 100)]


def test_stream_starts_at_latest_and_new_partitions_at_their_log_start() -> None:
    """A new query starts at latest; a partition absent from the start offsets is read from its log start."""
    assert initial_offsets(SNAPSHOT, None) == {A0: 100, A1: 0}
    grown = {A0: PartitionOffsets(0, 10, 150), A1: PartitionOffsets(1, 5, 9)}
    assert stream_ranges({A0: 100}, {A0: 150, A1: 9}, grown, fail_on_data_loss=True) == [
        OffsetRange("a", 0, 100, 150),
        OffsetRange("a", 1, 5, 9),
    ]


def test_stream_notices_deleted_topics_and_trimmed_records() -> None:
    """A topic gone, or records trimmed past the checkpoint, is data loss unless failOnDataLoss=false."""
    trimmed = {A0: PartitionOffsets(0, 120, 150)}
    with pytest.raises(DataLossError, match="a-1 no longer exist"):
        stream_ranges({A0: 100, A1: 0}, {A0: 150, A1: 0}, trimmed, fail_on_data_loss=True)
    with pytest.raises(DataLossError, match="records below 120 were deleted"):
        stream_ranges({A0: 100}, {A0: 150}, trimmed, fail_on_data_loss=True)
    ranges = stream_ranges({A0: 100, A1: 0}, {A0: 150, A1: 0}, trimmed, fail_on_data_loss=False)
    assert ranges == [OffsetRange("a", 0, 120, 150)]


def test_rate_limit_shares_by_backlog() -> None:
    """maxOffsetsPerTrigger splits the limit in proportion to each partition's backlog."""
    start = {A0: 0, A1: 0}
    assert rate_limit(start, {A0: 300, A1: 100}, 100) == {A0: 75, A1: 25}
    assert rate_limit(start, {A0: 30, A1: 10}, 100) == {A0: 30, A1: 10}


@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 1_000)), min_size=1, max_size=8),
    st.integers(1, 2_000),
)
def test_rate_limit_never_exceeds_the_limit_and_always_moves(
    backlogs: list[tuple[int, int]], limit: int
) -> None:
    """Every micro-batch reads min(limit, backlog) records, none past the latest offsets."""
    start = {TopicPartition("t", i): begin for i, (begin, _) in enumerate(backlogs)}
    latest = {TopicPartition("t", i): begin + size for i, (begin, size) in enumerate(backlogs)}
    ends = rate_limit(start, latest, limit)
    assert all(start[tp] <= ends[tp] <= latest[tp] for tp in latest)
    assert sum(ends[tp] - start[tp] for tp in latest) == min(limit, sum(size for _, size in backlogs))


@given(
    st.lists(st.tuples(st.integers(0, 1_000), st.integers(0, 500)), min_size=1, max_size=6),
    st.one_of(st.none(), st.integers(1, 64)),
)
def test_split_covers_every_offset_once(sizes: list[tuple[int, int]], min_partitions: int | None) -> None:
    """Pieces are non-empty, cover each offset once, and number at least min(minPartitions, records)."""
    ranges = [OffsetRange("t", i, start, start + size) for i, (start, size) in enumerate(sizes)]
    pieces = split_ranges(ranges, min_partitions)
    assert all(piece.size > 0 for piece in pieces)
    covered = sorted(
        (piece.partition, offset) for piece in pieces for offset in range(piece.start, piece.end)
    )
    assert covered == sorted((r.partition, offset) for r in ranges for offset in range(r.start, r.end))
    non_empty = sum(1 for r in ranges if r.size)
    total = sum(r.size for r in ranges)
    wanted = non_empty if min_partitions is None else max(non_empty, min(min_partitions, total))
    assert len(pieces) >= wanted


def test_split_gives_big_ranges_more_pieces() -> None:
    """minPartitions=4 over 900 + 100 records: three pieces for the big range, one for the small."""
    pieces = split_ranges([OffsetRange("t", 0, 0, 900), OffsetRange("t", 1, 0, 100)], 4)
    assert [(p.partition, p.start, p.end) for p in pieces] == [
        (0, 0, 300),
        (0, 300, 600),
        (0, 600, 900),
        (1, 0, 100),
    ]


VIEW = ClusterView((("1", "h:1"), ("2", "h:2"), ("3", "h:3")), leader_id="2")


def test_follower_reads_spread_over_followers_with_the_leader_last() -> None:
    """readFrom=follower: followers rotated per input partition, the leader only as the last resort."""
    assert read_candidates(VIEW, ReadFrom.FOLLOWER, "", 0) == ("h:1", "h:3", "h:2")
    assert read_candidates(VIEW, ReadFrom.FOLLOWER, "", 1) == ("h:3", "h:1", "h:2")
    assert read_candidates(VIEW, ReadFrom.LEADER, "", 1) == ("h:2", "h:3", "h:1")
    assert read_candidates(VIEW, ReadFrom.ANY, "", 2) == ("h:3", "h:1", "h:2")
    assert read_candidates(VIEW, ReadFrom.NODE, "h:9", 0) == ("h:9",)
    leaderless = ClusterView(VIEW.nodes, leader_id="")
    assert read_candidates(leaderless, ReadFrom.FOLLOWER, "", 1) == ("h:2", "h:3", "h:1")
