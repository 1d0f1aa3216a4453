"""Pure planning: offset ranges from a snapshot of log starts and ends, split and rate-limited.

No I/O here: the driver takes one snapshot of the partitions (`spark.metadata`), and these functions
turn it and the options into ranges, the way Spark's Kafka source does (KafkaOffsetRangeCalculator,
rate limiting by `maxOffsetsPerTrigger`), with data-loss checks governed by `failOnDataLoss`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kq.client import PartitionOffsets
from kq.spark.options import EARLIEST, LATEST, DataLossError, OffsetSpec, TopicPartition, option_error

Snapshot = Mapping[TopicPartition, PartitionOffsets]
DATA_LOSS_HINT = "set failOnDataLoss=false to skip what is gone"


@dataclass(frozen=True, slots=True, order=True)
class OffsetRange:
    """Offsets [start, end) of one partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        """Records in the range."""
        return self.end - self.start


# Batch --------------------------------------------------------------------------------------------


def batch_ranges(
    snapshot: Snapshot, starting: OffsetSpec | None, ending: OffsetSpec | None, fail_on_data_loss: bool
) -> list[OffsetRange]:
    """The non-empty ranges of a batch read (defaults: from earliest to latest)."""
    starts = _specific(snapshot, starting, "startingOffsets")
    ends = _specific(snapshot, ending, "endingOffsets")
    ranges = []
    for tp, offsets in sorted(snapshot.items()):
        start = _resolve(starting, starts.get(tp), offsets, default=EARLIEST)
        end = _resolve(ending, ends.get(tp), offsets, default=LATEST)
        if end > offsets.log_end_offset:
            raise option_error(
                "endingOffsets", f"offset {end} of {_name(tp)} is beyond its log end {offsets.log_end_offset}"
            )
        if end < start:
            raise option_error(
                "endingOffsets", f"offset {end} of {_name(tp)} is before its starting offset {start}"
            )
        start = _checked_start(tp, start, offsets, fail_on_data_loss, "startingOffsets")
        if end > start:
            ranges.append(OffsetRange(tp.topic, tp.partition, start, end))
    return ranges


def _specific(snapshot: Snapshot, spec: OffsetSpec | None, name: str) -> dict[TopicPartition, int]:
    """Specific offsets, which (as in Kafka) must name exactly the partitions read."""
    if spec is None or spec.kind != "specific":
        return {}
    offsets = spec.as_dict()
    missing = sorted(set(snapshot) - set(offsets))
    extra = sorted(set(offsets) - set(snapshot))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"misses {', '.join(map(_name, missing))}")
        if extra:
            parts.append(f"names {', '.join(map(_name, extra))}, which the query does not read")
        raise option_error(
            name, f"{' and '.join(parts)}; give every partition read (-2 for earliest, -1 for latest)"
        )
    return offsets


def _resolve(spec: OffsetSpec | None, specific: int | None, offsets: PartitionOffsets, default: int) -> int:
    if specific is not None:
        value = specific
    elif spec is None:
        value = default
    else:
        value = EARLIEST if spec.kind == "earliest" else LATEST
    if value == EARLIEST:
        return offsets.log_start_offset
    if value == LATEST:
        return offsets.log_end_offset
    return value


def _checked_start(
    tp: TopicPartition, start: int, offsets: PartitionOffsets, fail_on_data_loss: bool, source: str
) -> int:
    """`start`, or where reading can resume when records before it are gone (unless that must fail)."""
    if start < offsets.log_start_offset:
        if fail_on_data_loss:
            raise DataLossError(
                f"kq source: {source} wants offset {start} of {_name(tp)}, but records below "
                f"{offsets.log_start_offset} were deleted; {DATA_LOSS_HINT}"
            )
        return offsets.log_start_offset
    if start > offsets.log_end_offset:
        if fail_on_data_loss:
            raise DataLossError(
                f"kq source: {source} wants offset {start} of {_name(tp)}, beyond its log end "
                f"{offsets.log_end_offset} (was the topic deleted and recreated?); {DATA_LOSS_HINT}"
            )
        return offsets.log_start_offset
    return start


# Streaming ----------------------------------------------------------------------------------------


def initial_offsets(snapshot: Snapshot, starting: OffsetSpec | None) -> dict[TopicPartition, int]:
    """Where a new streaming query starts (default: latest, as in Kafka)."""
    starts = _specific(snapshot, starting, "startingOffsets")
    return {
        tp: _resolve(starting, starts.get(tp), offsets, default=LATEST)
        for tp, offsets in sorted(snapshot.items())
    }


def stream_ranges(
    start: Mapping[TopicPartition, int],
    end: Mapping[TopicPartition, int],
    snapshot: Snapshot,
    fail_on_data_loss: bool,
) -> list[OffsetRange]:
    """The non-empty ranges of one micro-batch; a partition new since `start` is read from its log start."""
    gone = sorted(tp for tp in set(start) | set(end) if tp not in snapshot)
    if gone and fail_on_data_loss:
        raise DataLossError(f"kq source: {', '.join(map(_name, gone))} no longer exist; {DATA_LOSS_HINT}")
    ranges = []
    for tp, end_offset in sorted(end.items()):
        offsets = snapshot.get(tp)
        if offsets is None:
            continue
        begin = _checked_start(
            tp, start.get(tp, offsets.log_start_offset), offsets, fail_on_data_loss, "the query"
        )
        stop = min(end_offset, offsets.log_end_offset)
        if stop < end_offset and fail_on_data_loss:
            raise DataLossError(
                f"kq source: the query ends {_name(tp)} at {end_offset}, beyond its log end "
                f"{offsets.log_end_offset} (was the topic deleted and recreated?); {DATA_LOSS_HINT}"
            )
        if stop > begin:
            ranges.append(OffsetRange(tp.topic, tp.partition, begin, stop))
    return ranges


def rate_limit(
    start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], limit: int
) -> dict[TopicPartition, int]:
    """End offsets at most `limit` records past `start`, shared in proportion to each partition's backlog.

    Like Kafka's `maxOffsetsPerTrigger`, but never above the limit and always moving on: the
    records are shared by largest remainder, so a non-empty backlog advances by min(limit, backlog).
    `start` must name every partition of `latest` (a new partition at its log start).
    """
    assert limit >= 1
    backlog = {tp: max(end - start.get(tp, end), 0) for tp, end in latest.items()}
    total = sum(backlog.values())
    if total <= limit:
        return dict(latest)
    shares = {tp: limit * size // total for tp, size in backlog.items()}
    spare = limit - sum(shares.values())
    by_remainder = sorted(backlog, key=lambda tp: (-(limit * backlog[tp] % total), tp))
    for tp in by_remainder[:spare]:
        shares[tp] += 1
    return {tp: start.get(tp, end) + shares[tp] if backlog[tp] else end for tp, end in latest.items()}


# Splitting ----------------------------------------------------------------------------------------


def split_ranges(ranges: Iterable[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """One range per partition, or more when `minPartitions` asks for more: big ranges split first.

    Every offset stays in exactly one piece, no piece is empty, and there are at least
    min(min_partitions, total records) pieces.
    """
    pieces = [r for r in ranges if r.size > 0]
    if min_partitions is None or len(pieces) >= min_partitions:
        return pieces
    total = sum(r.size for r in pieces)
    counts = [min(r.size, max(1, r.size * min_partitions // total)) for r in pieces]
    # Hand out the missing pieces one at a time to the range whose pieces are currently largest.
    heap = [(-pieces[i].size / counts[i], i) for i in range(len(pieces)) if counts[i] < pieces[i].size]
    heapq.heapify(heap)
    while sum(counts) < min_partitions and heap:
        _, i = heapq.heappop(heap)
        counts[i] += 1
        if counts[i] < pieces[i].size:
            heapq.heappush(heap, (-pieces[i].size / counts[i], i))
    return [piece for r, count in zip(pieces, counts, strict=True) for piece in _split(r, count)]


def _split(offset_range: OffsetRange, count: int) -> list[OffsetRange]:
    assert 1 <= count <= offset_range.size
    bounds = [offset_range.start + offset_range.size * i // count for i in range(count + 1)]
    return [
        OffsetRange(offset_range.topic, offset_range.partition, low, high)
        for low, high in itertools.pairwise(bounds)
    ]


def _name(tp: TopicPartition) -> str:
    return f"{tp.topic}-{tp.partition}"
