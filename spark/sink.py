"""`df.write.format("kq")` and `df.writeStream.format("kq")`: the sink, with Spark's Kafka sink schema.

Columns (by name; others are ignored, as Spark's Kafka sink ignores them):

    value      binary or string   required (a null value is a tombstone)
    key        binary or string   optional
    topic      string             optional; the `topic` option, when given, overrides it
    partition  int                optional; else the key's partition (Kafka's murmur2), or round-robin
    headers    array<struct<key string, value binary>>   optional

The driver checks the schema and the options before any task runs (`sink_options`, `check_schema`).
Each task (one Spark partition of the DataFrame, on an executor) writes its rows through one
`KqClient` and its idempotent `Producer`: a request retried inside the task (a timeout, a leader
change) never writes a record twice. A failed task that Spark runs again writes its rows again with a
new producer id, so the sink is at least once, like Spark's Kafka sink: rows a failed attempt had
written before it failed appear twice (tests/spark/test_sink.py measures it). A streaming query whose
driver dies re-runs the micro-batch it had not committed, with the same consequence.

A row that cannot be written (an unknown topic, a null topic, a partition the topic lacks, a record
over RECORD_BYTES_MAX) fails its task with a message naming the row (its position in the task) and
how many rows the task had written (acknowledged) before it; nothing after it is sent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import ArrayType, BinaryType, DataType, IntegerType, StringType, StructType

from kq.client import KqClient, KqClientError, Producer, TopicNotFoundError
from kq.client.producer import RecordFuture
from kq.proto.limits import (
    RECORD_BYTES_MAX,
    SPARK_WRITE_BATCH_BYTES,
    SPARK_WRITE_LINGER_MS,
    SPARK_WRITE_RETRY_TIMEOUT_S,
    SPARK_WRITE_RPC_TIMEOUT_S,
)
from kq.spark.options import KqSourceError, node_addresses, option_error, positive_int, reject_unknown
from kq.spark.schema import HEADER_SPARK_TYPE

logger = logging.getLogger(__name__)

SINK = "kq sink"
# checkpointLocation is Spark's (a streaming query's), passed along to the writer; the sink ignores it.
KNOWN_SINK_OPTIONS = {
    name.lower(): name for name in ("kq.nodes", "topic", "kq.debug.failAfterRows", "checkpointLocation")
}
VALUE_TYPES = (BinaryType(), StringType())


class KqSinkError(KqSourceError):
    """A write that cannot be done as asked: a bad option or column, or a row the cluster refused."""


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """Every option of one write, checked; picklable (it travels to the executors in the writer)."""

    nodes: tuple[str, ...]
    topic: str | None  # The `topic` option: every row's topic (the column is then ignored).
    # Testing only: the first attempt of each task fails once it has written this many rows (0: never).
    fail_after_rows: int = 0


@dataclass(frozen=True, slots=True)
class Columns:
    """Which of the sink's columns the DataFrame has (value always), and whether key and value are text."""

    key: bool
    topic: bool
    partition: bool
    headers: bool
    value_is_text: bool
    key_is_text: bool


@dataclass
class KqCommitMessage(WriterCommitMessage):
    """What one task wrote: its rows, by topic."""

    rows: int
    by_topic: dict[str, int]


def sink_options(options: Mapping[str, str]) -> SinkOptions:
    """The write's options; raises KqSinkError naming the bad one."""
    values = {key.lower(): str(value) for key, value in options.items()}
    reject_unknown(values, KNOWN_SINK_OPTIONS, SINK)
    topic = values.get("topic")
    if topic is not None and not topic.strip():
        raise option_error("topic", "empty: name the topic every row is written to, or leave it out", SINK)
    return SinkOptions(
        nodes=node_addresses(values.get("kq.nodes"), SINK),
        topic=topic.strip() if topic is not None else None,
        fail_after_rows=positive_int(values, "kq.debug.failAfterRows", None, SINK) or 0,
    )


def check_schema(schema: StructType, options: SinkOptions) -> Columns:
    """The DataFrame's sink columns, checked against Spark's Kafka sink schema; raises KqSinkError."""
    fields = {field.name: field.dataType for field in schema.fields}
    if "value" not in fields:
        raise KqSinkError(
            "kq sink: the DataFrame has no 'value' column (binary or string); "
            f"its columns: {', '.join(fields)}"
        )
    _expect(fields, "value", VALUE_TYPES, "binary or string")
    _expect(fields, "key", VALUE_TYPES, "binary or string")
    _expect(fields, "topic", (StringType(),), "string")
    _expect(fields, "partition", (IntegerType(),), "int")
    _expect(fields, "headers", (ArrayType(HEADER_SPARK_TYPE),), "array<struct<key: string, value: binary>>")
    if options.topic is None and "topic" not in fields:
        raise KqSinkError("kq sink: no topic: set the 'topic' option or give the DataFrame a 'topic' column")
    return Columns(
        key="key" in fields,
        topic="topic" in fields and options.topic is None,
        partition="partition" in fields,
        headers="headers" in fields,
        value_is_text=fields["value"] == StringType(),
        key_is_text=fields.get("key") == StringType(),
    )


def _expect(fields: Mapping[str, DataType], name: str, allowed: Sequence[DataType], spelled: str) -> None:
    found = fields.get(name)
    if found is not None and not any(_same_type(found, wanted) for wanted in allowed):
        raise KqSinkError(f"kq sink: column '{name}' is {found.simpleString()}; it must be {spelled}")


def _same_type(found: DataType, wanted: DataType) -> bool:
    """Equal types, ignoring nullability (Spark's Kafka sink accepts nullable and non-null alike)."""
    if isinstance(found, ArrayType) and isinstance(wanted, ArrayType):
        return _same_type(found.elementType, wanted.elementType)
    if isinstance(found, StructType) and isinstance(wanted, StructType):
        return [(f.name, f.dataType) for f in found.fields] == [(f.name, f.dataType) for f in wanted.fields]
    return found == wanted


class KqBatchWriter(DataSourceArrowWriter):
    """`df.write.format("kq")`: each task writes its rows (`write_rows`); commit and abort only log."""

    def __init__(self, options: SinkOptions, columns: Columns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KqCommitMessage:
        """Writes one task's rows (on an executor)."""
        return write_rows(self.options, self.columns, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every task succeeded: logs what was written."""
        _log_outcome("write committed", messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """A task failed for good: what the other tasks wrote stays in kq (logged)."""
        _log_outcome("write aborted; rows written by tasks that succeeded stay in kq", messages)


class KqStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("kq")`: each micro-batch's tasks write as the batch writer's do."""

    def __init__(self, options: SinkOptions, columns: Columns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KqCommitMessage:
        """Writes one task's rows of a micro-batch (on an executor)."""
        return write_rows(self.options, self.columns, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """The micro-batch is written; Spark records it in the checkpoint."""
        _log_outcome(f"micro-batch {batchId} committed", messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """The micro-batch failed; Spark runs it again (its rows already written appear twice)."""
        _log_outcome(f"micro-batch {batchId} aborted", messages)


def _log_outcome(what: str, messages: Sequence[WriterCommitMessage | None]) -> None:
    rows = sum(message.rows for message in messages if isinstance(message, KqCommitMessage))
    logger.info("kq sink: %s: %d rows from %d tasks", what, rows, len(messages))


def write_rows(options: SinkOptions, columns: Columns, batches: Iterator[pa.RecordBatch]) -> KqCommitMessage:
    """Sends the rows of `batches` in order, checking each Arrow batch's outcome while the next one is
    sent; raises KqSinkError naming the first row that failed and the rows acknowledged before it."""
    fail_after = options.fail_after_rows if options.fail_after_rows and _first_attempt() else 0
    sent = 0
    by_topic: dict[str, int] = {}
    started = time.monotonic()
    with (
        KqClient(
            list(options.nodes),
            retry_timeout_s=SPARK_WRITE_RETRY_TIMEOUT_S,
            rpc_timeout_s=SPARK_WRITE_RPC_TIMEOUT_S,
        ) as client,
        Producer(client, linger_ms=SPARK_WRITE_LINGER_MS, batch_size=SPARK_WRITE_BATCH_BYTES) as producer,
    ):
        previous: list[tuple[int, RecordFuture]] = []
        for batch in batches:
            current = _send_batch(producer, options, columns, batch, sent, by_topic)
            sent += batch.num_rows
            _check_outcomes(previous, by_topic)
            previous = current
            if fail_after and sent >= fail_after:
                producer.flush()
                _check_outcomes(previous, by_topic)
                raise KqSinkError(f"kq sink: kq.debug.failAfterRows: failing this attempt after {sent} rows")
        producer.flush()
        _check_outcomes(previous, by_topic)
    logger.info("kq sink: task wrote %d rows in %.1f s", sent, time.monotonic() - started)
    return KqCommitMessage(sent, by_topic)


def _send_batch(
    producer: Producer,
    options: SinkOptions,
    columns: Columns,
    batch: pa.RecordBatch,
    first_row: int,
    by_topic: dict[str, int],
) -> list[tuple[int, RecordFuture]]:
    """Queues one Arrow batch's rows; returns each row's position in the task and its future."""
    count = batch.num_rows
    values = _column(batch, "value", count)
    keys = _column(batch, "key", count) if columns.key else [None] * count
    topics = _column(batch, "topic", count) if columns.topic else [options.topic] * count
    partitions = _column(batch, "partition", count) if columns.partition else [None] * count
    headers = _column(batch, "headers", count) if columns.headers else [None] * count
    futures: list[tuple[int, RecordFuture]] = []
    for offset in range(count):
        row = first_row + offset
        topic = topics[offset]
        if topic is None:
            raise _row_error(row, first_row, by_topic, "its topic is null")
        value = _as_bytes(values[offset])
        key = _as_bytes(keys[offset])
        pairs = [(pair["key"] or "", pair["value"] or b"") for pair in headers[offset] or ()]
        size = len(value or b"") + len(key or b"") + sum(len(k) + len(v) for k, v in pairs)
        if size > RECORD_BYTES_MAX:
            raise _row_error(row, first_row, by_topic, f"its record is {size} bytes, over {RECORD_BYTES_MAX}")
        try:
            future = producer.send(topic, value, key, partition=partitions[offset], headers=pairs)
        except TopicNotFoundError as error:
            raise _row_error(
                row,
                first_row,
                by_topic,
                f"topic {topic!r} does not exist (create it first: kq topics create)",
            ) from error
        except KqClientError as error:
            raise _row_error(row, first_row, by_topic, f"{type(error).__name__}: {error}") from error
        futures.append((row, future))
    return futures


def _check_outcomes(futures: list[tuple[int, RecordFuture]], by_topic: dict[str, int]) -> None:
    """Waits for each row's outcome in order; counts the acknowledged ones; raises at the first failure."""
    for row, future in futures:
        error = future.exception()
        if error is not None:
            raise KqSinkError(
                f"kq sink: row {row} of this task was not written: {type(error).__name__}: {error} "
                f"({sum(by_topic.values())} rows acknowledged before it)"
            ) from error
        metadata = future.result()
        by_topic[metadata.topic] = by_topic.get(metadata.topic, 0) + 1


def _row_error(row: int, first_row: int, by_topic: dict[str, int], problem: str) -> KqSinkError:
    return KqSinkError(
        f"kq sink: row {row} of this task cannot be written: {problem} (rows {first_row}-{row - 1} of "
        f"its batch were queued; {sum(by_topic.values())} rows acknowledged before them); nothing after "
        "it is sent"
    )


def _column(batch: pa.RecordBatch, name: str, count: int) -> list[Any]:
    values: list[Any] = batch.column(name).to_pylist()
    assert len(values) == count
    return values


def _as_bytes(value: object) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise KqSinkError(f"kq sink: expected binary or string, got {type(value).__name__}")


def _first_attempt() -> bool:
    """Whether this task runs for the first time (kq.debug.failAfterRows fails only that attempt)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context is None or context.attemptNumber() == 0
