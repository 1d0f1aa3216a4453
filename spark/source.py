"""`format("kq")`: the PySpark data source, its batch and stream readers (and writers: spark/sink.py).

Spark calls `partitions()` (batch) or `latestOffset()`/`partitions()` (streaming) on the driver, and
`read()` on the executors, with a pickled copy of the reader. The readers therefore hold only their
options; every gRPC channel is opened inside a call and closed before it returns (`read()` opens one
client per input partition).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from kq.client import KqClient
from kq.proto.limits import SPARK_READ_RETRY_TIMEOUT_S, SPARK_READ_RPC_TIMEOUT_S
from kq.spark.fetching import ReadPolicy, RowShape, read_range
from kq.spark.metadata import ClusterView, Snapshot, discover, planning_client, read_candidates, take_snapshot
from kq.spark.options import (
    KqSourceError,
    SourceOptions,
    TopicPartition,
    check_batch,
    check_streaming,
    option_error,
    parse_options,
)
from kq.spark.planning import (
    OffsetRange,
    batch_ranges,
    initial_offsets,
    rate_limit,
    split_ranges,
    stream_ranges,
)
from kq.spark.schema import arrow_schema, spark_schema
from kq.spark.sink import KqBatchWriter, KqSinkError, KqStreamWriter, check_schema, sink_options

logger = logging.getLogger(__name__)


StreamOffset = dict[str, dict[str, int]]  # Kafka's JSON: {"topic": {"partition": offset}}.


@dataclass(frozen=True)
class KqInputPartition(InputPartition):
    """One offset range and everything its executor needs to read it (plain values only)."""

    offset_range: OffsetRange
    nodes: tuple[str, ...]  # Candidate node addresses, in the order to try them.
    min_index: int  # A node serves the range once it has applied this Raft index.


class KqDataSource(DataSource):
    """kq topics as a Spark source, with the schema and options of Spark's Kafka source."""

    @classmethod
    def name(cls) -> str:
        """The format name: `spark.read.format("kq")`."""
        return "kq"

    def schema(self) -> StructType:
        """Kafka's schema, plus `headers` with includeHeaders=true (and `servedBy` with kq.debug.servedBy)."""
        options = parse_options(self.options)
        return spark_schema(options.include_headers, options.debug_served_by)

    def reader(self, schema: StructType) -> DataSourceReader:
        """The batch reader (`spark.read`)."""
        options = parse_options(self.options)
        check_batch(options)
        _check_schema(schema, options)
        return KqBatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802 - Spark's name.
        """The stream reader (`spark.readStream`)."""
        options = parse_options(self.options)
        check_streaming(options)
        _check_schema(schema, options)
        return KqStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """The batch writer (`df.write`, spark/sink.py): append only, as Spark's Kafka sink."""
        options = sink_options(self.options)
        _refuse_overwrite(overwrite)
        return KqBatchWriter(options, check_schema(schema, options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        """The stream writer (`df.writeStream`, spark/sink.py): append only."""
        options = sink_options(self.options)
        _refuse_overwrite(overwrite)
        return KqStreamWriter(options, check_schema(schema, options))


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise KqSinkError(
            "kq sink: a topic is a log: rows are appended, never overwritten; use mode 'append'"
        )


def _check_schema(schema: StructType, options: SourceOptions) -> None:
    expected = spark_schema(options.include_headers, options.debug_served_by)
    if schema != expected:
        raise KqSourceError(
            f"kq source: the schema is fixed ({expected.simpleString()}); do not set one with .schema()"
        )


class KqBatchReader(DataSourceReader):
    """Reads offset ranges fixed at planning time: startingOffsets to endingOffsets."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        """One input partition per topic-partition range (split further by minPartitions)."""
        with planning_client(self.options) as client:
            view = discover(client)
            snapshot = take_snapshot(client, self.options.subscription, view.leader_address)
        ranges = batch_ranges(
            snapshot.offsets, self.options.starting, self.options.ending, self.options.fail_on_data_loss
        )
        return _input_partitions(ranges, self.options, view, snapshot)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The range's records as Arrow record batches (runs on an executor)."""
        return read_partition(self.options, partition)


class KqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches between Kafka-shaped JSON offsets, which Spark keeps in its checkpoint."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._available_now_target: dict[TopicPartition, int] | None = None

    def initialOffset(self) -> StreamOffset:  # noqa: N802 - Spark's name.
        """Where a new query starts: startingOffsets (default latest)."""
        with planning_client(self.options) as client:
            view = discover(client)
            snapshot = take_snapshot(client, self.options.subscription, view.leader_address)
        return _to_json(initial_offsets(snapshot.offsets, self.options.starting))

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - Spark's name.
        """maxOffsetsPerTrigger, when set."""
        if self.options.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's name.
        """Trigger.AvailableNow: fix the end of what this run reads to the log ends right now."""
        self._available_now_target = self._latest()[0]

    def latestOffset(self, start: StreamOffset, limit: ReadLimit) -> StreamOffset:  # noqa: N802 - Spark's name.
        """The end of the next micro-batch: the log ends, capped by availableNow's target and the limit."""
        latest, log_starts = self._latest()
        if self._available_now_target is not None:
            target = self._available_now_target
            latest = {tp: min(end, target.get(tp, log_starts[tp])) for tp, end in latest.items()}
        begin = {**log_starts, **_from_json(start)}
        latest = {tp: max(end, begin[tp]) for tp, end in latest.items()}  # Never move backwards.
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit({tp: begin[tp] for tp in latest}, latest, limit.max_rows)
        return _to_json(latest)

    def _latest(self) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
        """Log end and log start of every partition read now (topics gone since are left out)."""
        snapshot = self._snapshot()[1]
        ends = {tp: offsets.log_end_offset for tp, offsets in snapshot.offsets.items()}
        return ends, {tp: offsets.log_start_offset for tp, offsets in snapshot.offsets.items()}

    def _snapshot(self) -> tuple[ClusterView, Snapshot]:
        with planning_client(self.options) as client:
            view = discover(client)
            return view, take_snapshot(
                client, self.options.subscription, view.leader_address, missing_ok=True
            )

    def partitions(self, start: StreamOffset, end: StreamOffset) -> Sequence[InputPartition]:
        """The micro-batch's ranges; one list-offsets call supplies the Raft index and data-loss checks."""
        begin, stop = _from_json(start), _from_json(end)
        if begin == stop:
            return []
        view, snapshot = self._snapshot()
        ranges = stream_ranges(begin, stop, snapshot.offsets, self.options.fail_on_data_loss)
        return _input_partitions(ranges, self.options, view, snapshot)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The range's records as Arrow record batches (runs on an executor)."""
        return read_partition(self.options, partition)

    def commit(self, end: StreamOffset) -> None:
        """Nothing to do: kq keeps no state for this reader; Spark's checkpoint holds the offsets."""


def _input_partitions(
    ranges: list[OffsetRange], options: SourceOptions, view: ClusterView, snapshot: Snapshot
) -> list[InputPartition]:
    pieces = split_ranges(ranges, options.min_partitions)
    partitions: list[InputPartition] = [
        KqInputPartition(
            piece,
            read_candidates(view, options.read_from, options.pinned_node, slot),
            snapshot.min_index(piece.topic, piece.partition),
        )
        for slot, piece in enumerate(pieces)
    ]
    logger.info(
        "kq source: %d input partitions over %d records at index %d, leader %s",
        len(partitions),
        sum(piece.size for piece in pieces),
        snapshot.applied_index,
        view.leader_id or "unknown",
    )
    return partitions


def read_partition(options: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """Reads one input partition; the client (and its channels) lives only as long as this iterator.

    A read with nothing to read (every partition empty) plans no input partition, and Spark then calls
    `read` once with a plain `InputPartition(None)`: no rows."""
    if not isinstance(partition, KqInputPartition) and getattr(partition, "value", None) is None:
        return
    assert isinstance(partition, KqInputPartition), f"not a kq input partition: {partition!r}"
    shape = RowShape(
        arrow_schema(options.include_headers, options.debug_served_by),
        options.include_headers,
        options.debug_served_by,
    )
    policy = ReadPolicy(
        fetch_max_records=options.fetch_max_records,
        whole_batches=options.fetch_whole_batches,
        fail_on_data_loss=options.fail_on_data_loss,
        fetch_delay_ms=options.debug_fetch_delay_ms,
    )
    with KqClient(
        list(partition.nodes),
        retry_timeout_s=SPARK_READ_RETRY_TIMEOUT_S,
        rpc_timeout_s=SPARK_READ_RPC_TIMEOUT_S,
    ) as client:
        chunks = read_range(
            client, partition.offset_range, partition.nodes, partition.min_index, policy, shape
        )
        for chunk in chunks:
            yield chunk.rows


def _to_json(offsets: Mapping[TopicPartition, int]) -> StreamOffset:
    result: StreamOffset = {}
    for tp, offset in sorted(offsets.items()):
        result.setdefault(tp.topic, {})[str(tp.partition)] = offset
    return result


def _from_json(offsets: Mapping[str, Any]) -> dict[TopicPartition, int]:
    """Offsets from Spark's checkpoint (written by `_to_json`, or by hand); a bad one names the checkpoint."""
    result: dict[TopicPartition, int] = {}
    for topic, by_partition in offsets.items():
        if not isinstance(by_partition, Mapping):
            raise option_error("checkpoint", f"offsets of {topic!r} are not a JSON object: {by_partition!r}")
        for partition, offset in by_partition.items():
            result[TopicPartition(topic, int(partition))] = int(offset)
    return result
