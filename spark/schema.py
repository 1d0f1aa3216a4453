"""The rows' schema (Spark's Kafka source schema, exactly) and records turned into Arrow record batches.

    key binary, value binary, topic string, partition int, offset long, timestamp timestamp,
    timestampType int[, headers array<struct<key string, value binary>>][, servedBy string]

`headers` comes with includeHeaders=true, as in Spark's Kafka source; `servedBy` (the id of the node
whose fetch returned the row) only with kq.debug.servedBy=true. Every field is nullable, as in
Kafka's. Spark checks that each batch's Arrow schema equals the one it derives from the Spark
schema (timestamps in microseconds, UTC), so both come from the same field list here.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kq.client import ConsumerRecord

SERVED_BY_COLUMN = "servedBy"
MICROS_PER_MILLI = 1_000

HEADER_SPARK_TYPE = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
HEADER_ARROW_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
TIMESTAMP_ARROW_TYPE = pa.timestamp("us", tz="UTC")


def spark_schema(include_headers: bool, served_by: bool) -> StructType:
    """The Spark schema of the rows."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", ArrayType(HEADER_SPARK_TYPE)))
    if served_by:
        fields.append(StructField(SERVED_BY_COLUMN, StringType()))
    return StructType(fields)


def arrow_schema(include_headers: bool, served_by: bool) -> pa.Schema:
    """The Arrow schema of the record batches (what Spark derives from `spark_schema`)."""
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", TIMESTAMP_ARROW_TYPE),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", pa.list_(HEADER_ARROW_TYPE)))
    if served_by:
        fields.append(pa.field(SERVED_BY_COLUMN, pa.string()))
    return pa.schema(fields)


def record_batch(
    records: Sequence[ConsumerRecord], schema: pa.Schema, include_headers: bool, served_by: str | None
) -> pa.RecordBatch:
    """One Arrow record batch of `records` (all of one partition), in `schema`.

    The records are named tuples: `zip(*records)` turns them into columns in one pass of C, and the
    timestamps are scaled to microseconds by Arrow, so no Python loop runs per record here."""
    count = len(records)
    topic, partition = records[0].topic, records[0].partition
    _, _, offsets, timestamps_ms, timestamp_types, keys, values, headers = zip(*records, strict=True)
    timestamps = pc.multiply(pa.array(timestamps_ms, pa.int64()), MICROS_PER_MILLI)
    columns = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array([topic] * count, pa.string()),
        pa.array([partition] * count, pa.int32()),
        pa.array(offsets, pa.int64()),
        timestamps.cast(TIMESTAMP_ARROW_TYPE),
        pa.array(timestamp_types, pa.int32()),
    ]
    if include_headers:
        pairs = [[{"key": name, "value": value} for name, value in fields] for fields in headers]
        columns.append(pa.array(pairs, pa.list_(HEADER_ARROW_TYPE)))
    if served_by is not None:
        columns.append(pa.array([served_by] * count, pa.string()))
    return pa.RecordBatch.from_arrays(columns, schema=schema)
