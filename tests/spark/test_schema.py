"""Kafka's schema, the Arrow batches Spark accepts for it, and what travels to executors (no channels)."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from kq.client import ConsumerRecord
from kq.spark.metadata import ClusterView, Snapshot
from kq.spark.options import parse_options
from kq.spark.planning import OffsetRange
from kq.spark.schema import arrow_schema, record_batch, spark_schema
from kq.spark.source import KqBatchReader, KqInputPartition, _input_partitions

KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp,"
    " timestampType int"
)


def test_the_schema_is_spark_kafka_source_schema(spark_session: SparkSession) -> None:
    """Kafka's columns and types, headers only with includeHeaders, all nullable (DDL needs the JVM)."""
    assert spark_schema(include_headers=False, served_by=False) == StructType.fromDDL(KAFKA_SCHEMA)
    with_headers = StructType.fromDDL(f"{KAFKA_SCHEMA}, headers array<struct<key: string, value: binary>>")
    assert spark_schema(include_headers=True, served_by=False) == with_headers
    assert spark_schema(include_headers=True, served_by=True).fieldNames()[-1] == "servedBy"


@pytest.mark.parametrize(("headers", "served_by"), [(False, False), (True, False), (True, True)])
def test_arrow_schema_is_what_spark_checks_batches_against(headers: bool, served_by: bool) -> None:
    """Spark rejects a batch whose schema differs from to_arrow_schema(the Spark schema, UTC)."""
    expected = to_arrow_schema(spark_schema(headers, served_by), timezone="UTC")
    assert arrow_schema(headers, served_by).equals(expected)


def test_records_become_one_arrow_batch_with_nulls_and_headers() -> None:
    """Keys, values (null included), timestamps in microseconds, headers as key/value structs."""
    records = [
        ConsumerRecord("t", 3, 7, 1_700_000_000_123, 0, b"k", b"v", (("h", b"1"), ("h", b"2"))),
        ConsumerRecord("t", 3, 8, 1_700_000_000_456, 1, None, None, ()),
    ]
    batch = record_batch(records, arrow_schema(True, True), include_headers=True, served_by="2")
    assert batch.schema.equals(arrow_schema(True, True))
    assert batch.to_pylist()[0] == {
        "key": b"k",
        "value": b"v",
        "topic": "t",
        "partition": 3,
        "offset": 7,
        "timestamp": batch.column(5)[0].as_py(),
        "timestampType": 0,
        "headers": [{"key": "h", "value": b"1"}, {"key": "h", "value": b"2"}],
        "servedBy": "2",
    }
    assert batch.column(5).cast(pa.int64()).to_pylist() == [1_700_000_000_123_000, 1_700_000_000_456_000]
    assert batch.to_pylist()[1]["key"] is None and batch.to_pylist()[1]["headers"] == []


def test_readers_and_input_partitions_pickle_as_plain_values() -> None:
    """What Spark ships to executors holds options and offsets only: no gRPC channel, no client."""
    options = parse_options({"kq.nodes": "127.0.0.1:1", "subscribe": "t", "minPartitions": "3"})
    view = ClusterView((("1", "127.0.0.1:1"), ("2", "127.0.0.1:2")), leader_id="1")
    partitions = _input_partitions([OffsetRange("t", 0, 0, 30)], options, view, Snapshot({}, applied_index=9))
    assert [p.offset_range for p in partitions if isinstance(p, KqInputPartition)] == [
        OffsetRange("t", 0, 0, 10),
        OffsetRange("t", 0, 10, 20),
        OffsetRange("t", 0, 20, 30),
    ]
    for value in (KqBatchReader(options), *partitions):
        data = pickle.dumps(value)
        assert b"grpc" not in data and b"KqClient" not in data
        assert pickle.loads(data).__dict__ == value.__dict__
