"""Executor side: read one offset range from the nodes, failing over when a node is down or behind.

A node serves a range only once it has applied the Raft index the driver planned at (`min_index`):
then it holds every record of the range, at the same offsets as every other node. A node that has
not applied it answers with no records after waiting up to SPARK_CATCH_UP_WAIT_MS; the reader then
moves to the next candidate node. The reader stays on a node while it makes progress, moves on when
that node fails, and gives up only when no node has made progress for SPARK_READ_STALL_TIMEOUT_S.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa

from kq.client import (
    KqClientError,
    OffsetOutOfRangeError,
    PartitionOffsets,
    TopicNotFoundError,
)
from kq.client.client import RECORDS_UNCUT
from kq.client.types import FetchedBatches
from kq.proto.limits import (
    FETCH_BYTES_MAX,
    SPARK_CATCH_UP_WAIT_MS,
    SPARK_READ_STALL_TIMEOUT_S,
    SPARK_ROUND_BACKOFF_S,
)
from kq.spark.columns import fetched_rows
from kq.spark.options import DataLossError, KqSourceError
from kq.spark.planning import DATA_LOSS_HINT, OffsetRange

logger = logging.getLogger(__name__)


class Fetcher(Protocol):
    """What the reader needs of `client.KqClient`."""

    def fetch_batches(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = ...,
        max_bytes: int = ...,
        wait_ms: int = ...,
        node: str | None = ...,
        min_index: int | None = ...,
    ) -> FetchedBatches: ...

    def list_offsets(self, topic: str, node: str | None = None) -> dict[int, PartitionOffsets]: ...


@dataclass(frozen=True, slots=True)
class ReadPolicy:
    """How one range is read."""

    fetch_max_records: int
    fail_on_data_loss: bool
    whole_batches: bool = False  # Each fetch's last batch whole, not cut at fetch_max_records.
    catch_up_wait_ms: int = SPARK_CATCH_UP_WAIT_MS
    stall_timeout_s: float = SPARK_READ_STALL_TIMEOUT_S
    fetch_delay_ms: int = 0  # kq.debug.fetchDelayMs: a pause before each fetch, to test failover mid-read.


@dataclass(frozen=True, slots=True)
class RowShape:
    """The rows a read yields: Arrow record batches in `schema` (spark/schema.py)."""

    schema: pa.Schema
    include_headers: bool
    served_by: bool  # kq.debug.servedBy: a column naming the node that served each row.


@dataclass(frozen=True, slots=True)
class Chunk:
    """Consecutive records of a range, as rows, and the node id that served them."""

    rows: pa.RecordBatch
    served_by: str


def read_range(
    fetcher: Fetcher,
    offset_range: OffsetRange,
    nodes: Sequence[str],
    min_index: int,
    policy: ReadPolicy,
    shape: RowShape,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[Chunk]:
    """Every record of `offset_range`, exactly once and in offset order, from the first node that can."""
    assert nodes, "an input partition names at least one node"
    position, current = offset_range.start, 0
    failures: dict[str, str] = {}
    failed_in_a_row = 0
    stall_deadline = time.monotonic() + policy.stall_timeout_s
    while position < offset_range.end:
        node = nodes[current % len(nodes)]
        if policy.fetch_delay_ms:
            sleep(policy.fetch_delay_ms / 1000)
        outcome = _fetch(fetcher, offset_range, position, node, min_index, policy)
        if isinstance(outcome, FetchedBatches):
            limit = RECORDS_UNCUT if policy.whole_batches else _max_records(offset_range, position, policy)
            served_by = outcome.served_by if shape.served_by else None
            rows, next_offset = fetched_rows(
                offset_range.topic,
                offset_range.partition,
                outcome.batches,
                position,
                limit,
                shape.schema,
                shape.include_headers,
                served_by,
            )
            if next_offset > position:
                rows = _checked(rows, position, offset_range.end, node)
                if rows is not None:
                    yield Chunk(rows, outcome.served_by)
                position = next_offset  # Past the records, and past any compaction left empty.
                failed_in_a_row, stall_deadline = 0, time.monotonic() + policy.stall_timeout_s
                continue
        if isinstance(outcome, int):  # Records below `outcome` are gone and failOnDataLoss=false.
            position = outcome
            continue
        failures[node] = outcome if isinstance(outcome, str) else _behind(outcome, min_index, policy)
        logger.info(
            "kq source: %s-%d at %d: node %s: %s; trying the next node",
            offset_range.topic,
            offset_range.partition,
            position,
            node,
            failures[node],
        )
        if time.monotonic() >= stall_deadline and failed_in_a_row + 1 >= len(nodes):  # Each node had a go.
            raise KqSourceError(
                f"kq source: no node served {offset_range.topic}-{offset_range.partition} at offset "
                f"{position} for {policy.stall_timeout_s:.0f} s: "
                + "; ".join(f"{address}: {problem}" for address, problem in sorted(failures.items()))
            )
        current, failed_in_a_row = current + 1, failed_in_a_row + 1
        if failed_in_a_row % len(nodes) == 0:
            sleep(SPARK_ROUND_BACKOFF_S)


def _max_records(offset_range: OffsetRange, position: int, policy: ReadPolicy) -> int:
    return min(policy.fetch_max_records, offset_range.end - position)


def _fetch(
    fetcher: Fetcher, offset_range: OffsetRange, position: int, node: str, min_index: int, policy: ReadPolicy
) -> FetchedBatches | str | int:
    """One fetch: its result, a reason to try another node, or (data loss allowed) where to resume.

    The node serves whole batches until they hold the records asked for; with `whole_batches` every
    record of them is read (the next fetch starts at a batch's start: each batch is fetched and
    decoded once), else they are cut there."""
    try:
        return fetcher.fetch_batches(
            offset_range.topic,
            offset_range.partition,
            position,
            max_records=_max_records(offset_range, position, policy),
            max_bytes=FETCH_BYTES_MAX,
            wait_ms=policy.catch_up_wait_ms,
            node=node,
            min_index=min_index,
        )
    except OffsetOutOfRangeError:
        return _after_data_loss(fetcher, offset_range, position, node, policy.fail_on_data_loss)
    except TopicNotFoundError as error:
        # A follower that has not applied the topic's creation says NOT_FOUND too: not proof of deletion.
        return f"topic not found ({error})"
    except KqClientError as error:
        return f"{error.error_code.name if error.error_code is not None else type(error).__name__}: {error}"


def _after_data_loss(
    fetcher: Fetcher, offset_range: OffsetRange, position: int, node: str, fail_on_data_loss: bool
) -> int | str:
    """Where to resume after OUT_OF_RANGE at `position` (records deleted, or the topic recreated)."""
    try:
        offsets = fetcher.list_offsets(offset_range.topic, node)[offset_range.partition]
    except (KqClientError, KeyError) as error:
        return f"out of range at {position}, then {error}"
    name = f"{offset_range.topic}-{offset_range.partition}"
    held = f"{offsets.log_start_offset}..{offsets.log_end_offset - 1}"
    if offsets.log_start_offset <= position <= offsets.log_end_offset:
        return f"out of range at {position} (node {node} holds {held})"
    if fail_on_data_loss:
        raise DataLossError(
            f"kq source: offsets {position}..{offset_range.end - 1} of {name} were planned, but node {node} "
            f"now holds {held}; {DATA_LOSS_HINT}"
        )
    if position < offsets.log_start_offset:
        return min(offsets.log_start_offset, offset_range.end)
    return offset_range.end  # The log is shorter than planned: the topic was recreated; skip the rest.


def _checked(rows: pa.RecordBatch | None, position: int, end: int, node: str) -> pa.RecordBatch | None:
    """The rows below `end` (None: none); their offsets must rise from `position` on (consecutive,
    except where compaction dropped records of a compacted topic: gaps, as in Kafka)."""
    if rows is None:
        return None
    offsets = rows.column("offset").to_numpy()
    if (offsets[1:] <= offsets[:-1]).any() or offsets[0] < position:
        raise KqSourceError(
            f"kq source: node {node} answered a fetch at offset {position} with offsets "
            f"{offsets[0]}..{offsets[-1]} out of order or before it (a broker bug)"
        )
    if offsets[-1] >= end:
        rows = rows.slice(0, int(np.searchsorted(offsets, end)))
    return rows if rows.num_rows else None


def _behind(result: FetchedBatches, min_index: int, policy: ReadPolicy) -> str:
    if result.applied_index < min_index:
        return (
            f"behind (applied index {result.applied_index} < {min_index} after {policy.catch_up_wait_ms} ms)"
        )
    return f"no records (log end {result.log_end_offset}, applied index {result.applied_index})"
