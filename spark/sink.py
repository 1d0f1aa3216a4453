"""`df.write.format("kq")` and `df.writeStream.format("kq")`: the sink, with Spark's Kafka sink schema.

Columns (by name; others are ignored, as Spark's Kafka sink ignores them):

    value      binary or string   required (a null value is a tombstone)
    key        binary or string   optional
    topic      string             optional; the `topic` option, when given, overrides it
    partition  int                optional; else the key's partition (Kafka's murmur2), or round-robin
    headers    array<struct<key string, value binary>>   optional

The driver checks the schema and the options before any task runs (`sink_options`, `check_schema`).
Each task (one Spark partition of the DataFrame, on an executor) writes its rows through one
`KqClient` and its idempotent producer id: a request retried inside the task (a timeout, a leader
change) never writes a record twice. A failed task that Spark runs again writes its rows again with a
new producer id, so the sink is at least once, like Spark's Kafka sink: rows a failed attempt had
written before it failed appear twice (tests/spark/test_sink.py measures it). A streaming query whose
driver dies re-runs the micro-batch it had not committed, with the same consequence.

A row that cannot be written (an unknown topic, a null topic, a partition the topic lacks, a record
over RECORD_BYTES_MAX) fails its task with a message naming the row (its position in the task) and
how many rows the task had written (acknowledged) before it; the task sends nothing more.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import ArrayType, BinaryType, DataType, IntegerType, StringType, StructType

from kq.client import KqClient, KqClientError, ProducedBatch, TopicNotFoundError
from kq.client.partitioner import partition_for_key
from kq.proto.limits import (
    CLIENT_PRODUCE_MANY_BYTES_MAX,
    PRODUCE_MANY_REQUESTS_MAX,
    RECORD_BYTES_MAX,
    RECORDS_PER_APPEND_MAX,
    SPARK_WRITE_ARRAYS_ROWS_MIN,
    SPARK_WRITE_BATCH_BYTES,
    SPARK_WRITE_COALESCE_BYTES,
    SPARK_WRITE_IN_FLIGHT,
    SPARK_WRITE_OPEN_BYTES_MAX,
    SPARK_WRITE_RETRY_TIMEOUT_S,
    SPARK_WRITE_RPC_TIMEOUT_S,
)
from kq.proto.records import BatchBuilder, NewRecord, wall_clock_ms
from kq.spark.encoding import EncodedBatch, binary_column, encode_rows
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
    """Which of the sink's optional columns the DataFrame has (`value` it always has)."""

    key: bool
    topic: bool
    partition: bool
    headers: bool


@dataclass
class KqCommitMessage(WriterCommitMessage):
    """What one task wrote: its rows, by topic."""

    rows: int
    by_topic: dict[str, int]


def sink_options(options: Mapping[str, str]) -> SinkOptions:
    """The write's options; raises KqSourceError naming the bad one (`kq sink option ...`)."""
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
    """Sends the rows of `batches`, each partition's in row order; raises KqSinkError naming the first
    row that could not be written and the rows acknowledged before it.

    Rows are encoded into one RecordBatch per topic-partition (`_Encoder`), each sent once it holds
    SPARK_WRITE_BATCH_BYTES or RECORDS_PER_APPEND_MAX records (or the task's rows end) while the
    encoder goes on; the pieces ready together go as one ProduceMany call (`_Sender`), a partition
    has one piece in flight at a time (so its rows stay in order), and up to SPARK_WRITE_IN_FLIGHT
    calls are in flight together."""
    fail_after = options.fail_after_rows if options.fail_after_rows and _first_attempt() else 0
    rows = 0
    started = time.monotonic()
    with (
        KqClient(
            list(options.nodes),
            retry_timeout_s=SPARK_WRITE_RETRY_TIMEOUT_S,
            rpc_timeout_s=SPARK_WRITE_RPC_TIMEOUT_S,
        ) as client,
        ThreadPoolExecutor(SPARK_WRITE_IN_FLIGHT, thread_name_prefix="kq-sink") as pool,
    ):
        sender = _Sender(client, pool)
        encoder = _Encoder(client, options, columns)
        for batch in _coalesced(batches):
            sender.submit(encoder.encode(batch, rows, sender))
            rows += batch.num_rows
            if fail_after and rows >= fail_after:
                sender.submit(encoder.flush())
                sender.settle_all()
                raise KqSinkError(f"kq sink: kq.debug.failAfterRows: failing this attempt after {rows} rows")
        sender.submit(encoder.flush())
        sender.settle_all()
    logger.info("kq sink: task wrote %d rows in %.1f s", rows, time.monotonic() - started)
    return KqCommitMessage(rows, dict(sender.by_topic))


def _coalesced(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`batches` joined, in order, into batches of about SPARK_WRITE_COALESCE_BYTES (one larger alone):
    Spark hands a writer 10,000 rows at a time (`spark.sql.execution.arrow.maxRecordsPerBatch`), and
    the encoder's and the nodes' costs per batch, per numpy call and per request then came to a third
    of a 100-byte row's cost (a 5,000,000-row write went from ~250,000 to ~300,000 rows/s joined)."""
    held: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        held.append(batch)
        size += batch.nbytes
        if size >= SPARK_WRITE_COALESCE_BYTES:
            yield held[0] if len(held) == 1 else pa.concat_batches(held)
            held, size = [], 0
    if held:
        yield held[0] if len(held) == 1 else pa.concat_batches(held)


@dataclass(slots=True)
class _Piece:
    """One request's worth of rows for one partition: the encoded batch and the rows' positions."""

    topic: str
    partition: int
    builder: BatchBuilder | EncodedBatch = field(default_factory=BatchBuilder)
    rows: list[int] = field(default_factory=list)
    size: int = 0


class _Sender:
    """Sends pieces as ProduceMany calls on the pool (`KqClient.produce_batches`: one call carries a
    piece of each partition an Arrow batch's rows went to), a partition's pieces one at a time (so
    its rows stay in order), at most SPARK_WRITE_IN_FLIGHT calls at once; counts what was acknowledged."""

    def __init__(self, client: KqClient, pool: ThreadPoolExecutor) -> None:
        self._client = client
        self._pool = pool
        self._calls: deque[_Call] = deque()  # In flight, oldest first.
        self._in_flight: dict[tuple[str, int], _Call] = {}  # Each partition's call in flight.
        self.by_topic: Counter[str] = Counter()

    @property
    def acknowledged(self) -> int:
        """Rows acknowledged so far."""
        return sum(self.by_topic.values())

    def submit(self, pieces: Sequence[_Piece]) -> None:
        """Sends `pieces` (in order) in as few calls as the limits allow, each once the calls before it
        holding one of its partitions are answered (raising if one of those failed)."""
        for call in _calls_of(pieces):
            for piece in call:
                earlier = self._in_flight.get((piece.topic, piece.partition))
                if earlier is not None:
                    self._settle_through(earlier)
            if len(self._calls) >= SPARK_WRITE_IN_FLIGHT:
                self._settle_through(self._calls[0])
            sources = [(piece.topic, piece.partition, piece.builder) for piece in call]
            sent = _Call(call, self._pool.submit(self._client.produce_batches, sources))
            self._calls.append(sent)
            for piece in call:
                self._in_flight[(piece.topic, piece.partition)] = sent

    def settle_all(self) -> None:
        """Waits for every call in flight; raises for the first piece that failed."""
        if self._calls:
            self._settle_through(self._calls[-1])

    def _settle_through(self, last: _Call) -> None:
        """Waits for the calls in flight up to and including `last`, oldest first."""
        while self._calls:
            call = self._calls.popleft()
            for piece in call.pieces:
                self._in_flight.pop((piece.topic, piece.partition), None)
            self._settle(call)
            if call is last:
                return

    def _settle(self, call: _Call) -> None:
        error = call.future.exception()
        outcomes = [error] * len(call.pieces) if error is not None else call.future.result()
        for piece, outcome in zip(call.pieces, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                raise KqSinkError(
                    f"kq sink: row {piece.rows[0]} of this task (topic {piece.topic!r}, partition "
                    f"{piece.partition}) was not written, with {len(piece.rows) - 1} rows after it: "
                    f"{type(outcome).__name__}: {outcome} "
                    f"({self.acknowledged} rows acknowledged before them)"
                ) from outcome
            self.by_topic[piece.topic] += len(piece.rows)


@dataclass(frozen=True, slots=True)
class _Call:
    """One ProduceMany call in flight: its pieces, and each one's outcome when it is answered."""

    pieces: list[_Piece]
    future: Future[list[ProducedBatch | KqClientError]]


def _calls_of(pieces: Sequence[_Piece]) -> list[list[_Piece]]:
    """`pieces` cut, in order, into calls of distinct partitions within PRODUCE_MANY_REQUESTS_MAX
    pieces and CLIENT_PRODUCE_MANY_BYTES_MAX bytes (a piece of a partition already in the call starts
    the next one)."""
    calls: list[list[_Piece]] = []
    call: list[_Piece] = []
    keys: set[tuple[str, int]] = set()
    size = 0
    for piece in pieces:
        key = (piece.topic, piece.partition)
        if call and (
            key in keys
            or len(call) >= PRODUCE_MANY_REQUESTS_MAX
            or size + piece.size > CLIENT_PRODUCE_MANY_BYTES_MAX
        ):
            calls.append(call)
            call, keys, size = [], set(), 0
        call.append(piece)
        keys.add(key)
        size += piece.size
    if call:
        calls.append(call)
    return calls


class _Encoder:
    """Turns Arrow batches into per-partition pieces: partition by the `partition` column, else the
    key (Kafka's murmur2), else one partition per Arrow batch and topic, rotating (Kafka's sticky
    partitioner); every row checked first (topic, size, partition)."""

    def __init__(self, client: KqClient, options: SinkOptions, columns: Columns) -> None:
        self._client = client
        self._options = options
        self._columns = columns
        self._partitions: dict[str, int] = {}  # Partition count by topic (the topics this task writes).
        self._sticky: Counter[str] = Counter()
        # Pieces filling across Arrow batches (one per partition), up to SPARK_WRITE_OPEN_BYTES_MAX in all.
        self._open: dict[tuple[str, int], _Piece] = {}
        self._open_bytes = 0

    def encode(self, batch: pa.RecordBatch, first_row: int, sender: _Sender) -> list[_Piece]:
        """The batch's rows as pieces, in the order to send them."""
        count = batch.num_rows
        columns = self._columns
        plain = not (columns.topic or columns.partition or columns.headers)  # Key and value at most.
        if count >= SPARK_WRITE_ARRAYS_ROWS_MIN and plain:
            pieces = self._encode_as_arrays(batch, first_row, sender)
            if pieces is not None:
                return pieces
        values = _column(batch, "value", count)
        keys = _column(batch, "key", count) if columns.key else [None] * count
        topics = _column(batch, "topic", count) if columns.topic else [self._options.topic] * count
        chosen = _column(batch, "partition", count) if columns.partition else [None] * count
        headers = _column(batch, "headers", count) if columns.headers else [None] * count
        now_ms = wall_clock_ms()
        open_pieces = self._open
        done: list[_Piece] = []
        sticky: dict[str, int] = {}
        for offset in range(count):
            row = first_row + offset
            topic = topics[offset]
            if topic is None:
                raise _row_error(row, sender, "its topic is null")
            value = _as_bytes(values[offset])
            key = _as_bytes(keys[offset])
            pairs = tuple((pair["key"] or "", pair["value"] or b"") for pair in headers[offset] or ())
            size = len(value or b"") + len(key or b"") + sum(len(k) + len(v) for k, v in pairs)
            if size > RECORD_BYTES_MAX:
                raise _row_error(row, sender, f"its record is {size} bytes, over {RECORD_BYTES_MAX}")
            partitions = self._partition_count(topic, row, sender)
            partition = chosen[offset]
            if partition is None:
                if key is not None:
                    partition = partition_for_key(key, partitions)
                else:
                    if topic not in sticky:
                        sticky[topic] = self._next_sticky(topic, partitions)
                    partition = sticky[topic]
            elif not 0 <= partition < partitions:
                raise _row_error(
                    row, sender, f"topic {topic!r} has partitions 0 to {partitions - 1}, not {partition}"
                )
            piece = open_pieces.get((topic, partition))
            if (
                piece is None
                or piece.size + size > SPARK_WRITE_BATCH_BYTES
                or len(piece.rows) == RECORDS_PER_APPEND_MAX
            ):
                if piece is not None:
                    done.append(piece)
                    self._open_bytes -= piece.size
                piece = open_pieces[(topic, partition)] = _Piece(topic, partition)
            assert isinstance(piece.builder, BatchBuilder), "the row encoder fills only its own pieces"
            added = piece.builder.append(NewRecord(key, value, pairs), now_ms)
            piece.size += added
            self._open_bytes += added
            piece.rows.append(row)
        if self._open_bytes > SPARK_WRITE_OPEN_BYTES_MAX:
            done += self.flush()
        return done

    def _encode_as_arrays(
        self, batch: pa.RecordBatch, first_row: int, sender: _Sender
    ) -> list[_Piece] | None:
        """The rows of a batch to the `topic` option's topic, with a value and maybe a key column and no
        other, encoded as arrays (spark/encoding.py); None where the row encoder must (a row too large).

        Pieces still filling are sent first: they hold earlier rows of the same partitions."""
        topic = self._options.topic
        assert topic is not None, "without a topic column, the topic option names the topic"
        partitions = self._partition_count(topic, first_row, sender)
        chunks = encode_rows(
            binary_column(batch, "key") if self._columns.key else None,
            binary_column(batch, "value"),
            partitions,
            lambda: self._next_sticky(topic, partitions),
            wall_clock_ms(),
        )
        if chunks is None:
            return None
        pieces = self.flush()
        for chunk in chunks:
            rows = (chunk.rows + first_row).tolist()
            pieces.append(_Piece(topic, chunk.partition, chunk.batch, rows, chunk.size))
        return pieces

    def flush(self) -> list[_Piece]:
        """The pieces still filling, to send now (the task's rows are all encoded, or too many wait)."""
        pieces = list(self._open.values())
        self._open.clear()
        self._open_bytes = 0
        return pieces

    def _partition_count(self, topic: str, row: int, sender: _Sender) -> int:
        count = self._partitions.get(topic)
        if count is None:
            try:
                count = self._client.partition_count(topic)
            except TopicNotFoundError as error:
                missing = f"topic {topic!r} does not exist (create it first: kq topics create)"
                raise _row_error(row, sender, missing) from error
            self._partitions[topic] = count
        return count

    def _next_sticky(self, topic: str, partitions: int) -> int:
        partition = self._sticky[topic] % partitions
        self._sticky[topic] += 1
        return partition


def _row_error(row: int, sender: _Sender, problem: str) -> KqSinkError:
    return KqSinkError(
        f"kq sink: row {row} of this task cannot be written: {problem}; the task sends nothing more "
        f"({sender.acknowledged} rows acknowledged before it)"
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
