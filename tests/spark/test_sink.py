"""System tests of the sink: `df.write.format("kq")` on three real nodes, read back with the source;
a task that fails after writing is run again (at least once, measured); bad input fails clearly."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StructField, StructType

from kq.client import KqClient
from kq.client.partitioner import partition_for_key
from kq.deploy.cluster import LocalCluster
from kq.proto.limits import RECORD_BYTES_MAX
from kq.spark.schema import HEADER_SPARK_TYPE

pytestmark = pytest.mark.system

PARTITIONS = 3
ROWS = 3_000
SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("partition", IntegerType()),
        StructField("headers", ArrayType(HEADER_SPARK_TYPE)),
    ]
)


def write(frame: DataFrame, cluster: LocalCluster, **options: str) -> None:
    """df.write.format("kq") with the cluster's nodes and `options`, appending."""
    frame.write.format("kq").option("kq.nodes", ",".join(cluster.bootstrap)).options(**options).mode(
        "append"
    ).save()


def read(session: SparkSession, cluster: LocalCluster, topic: str) -> list[Any]:
    """Every record of `topic`, with headers, through the source."""
    return (
        session.read.format("kq")
        .option("kq.nodes", ",".join(cluster.bootstrap))
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .load()
        .collect()
    )


def test_a_batch_write_reads_back_equal(
    spark_session: SparkSession, spark_cluster: LocalCluster, topic_name: str
) -> None:
    """Keys, values (a null one: a tombstone), headers and chosen partitions come back as written."""
    rows = [
        (
            None if i % 10 == 3 else f"key-{i}".encode(),
            None if i == 7 else f"value-{i}".encode(),
            i % PARTITIONS,
            [{"key": f"h{j}", "value": f"{i}-{j}".encode()} for j in range(i % 3)],
        )
        for i in range(ROWS)
    ]
    with KqClient(spark_cluster.bootstrap) as client:
        client.create_topic(topic_name, partitions=PARTITIONS)
    write(spark_session.createDataFrame(rows, SCHEMA).repartition(4), spark_cluster, topic=topic_name)
    back = read(spark_session, spark_cluster, topic_name)
    assert len(back) == ROWS
    written = Counter(
        (key, value, partition, tuple((h["key"], h["value"]) for h in headers))
        for key, value, partition, headers in rows
    )
    read_back = Counter(
        (
            row["key"],
            row["value"],
            row["partition"],
            tuple((h["key"], bytes(h["value"])) for h in row["headers"] or ()),
        )
        for row in back
    )
    assert read_back == written
    assert {row["topic"] for row in back} == {topic_name}


def test_string_columns_per_row_topics_and_keyed_partitions(
    spark_session: SparkSession, spark_cluster: LocalCluster, topic_name: str
) -> None:
    """String key and value, a `topic` column naming two topics, no partition column: each key's
    records share one partition, the one kq's client picks for that key."""
    other = f"{topic_name}-b"
    with KqClient(spark_cluster.bootstrap) as client:
        client.create_topic(topic_name, partitions=PARTITIONS)
        client.create_topic(other, partitions=PARTITIONS)
        rows = [(f"k{i % 17}", f"v{i}", topic_name if i % 2 else other) for i in range(600)]
        frame = spark_session.createDataFrame(rows, "key string, value string, topic string")
        write(frame.repartition(3), spark_cluster)
        for topic in (topic_name, other):
            back = read(spark_session, spark_cluster, topic)
            expected = {(key, value) for key, value, wanted in rows if wanted == topic}
            assert {(row["key"].decode(), row["value"].decode()) for row in back} == expected
            for row in back:
                probe = client.send(topic, b"probe", key=row["key"])
                assert probe.partition == row["partition"], f"key {row['key']!r} of {topic}"


def test_large_batches_of_keys_and_values_go_where_kafkas_partitioner_sends_them(
    spark_session: SparkSession, spark_cluster: LocalCluster, topic_name: str
) -> None:
    """Arrow batches of thousands of key-value rows to the `topic` option (the sink encodes them as
    arrays, spark/encoding.py): every row back once, keyed ones in Kafka's murmur2 partition, each
    partition's rows in row order."""
    with KqClient(spark_cluster.bootstrap) as client:
        client.create_topic(topic_name, partitions=PARTITIONS)
    count = 12_000
    frame = spark_session.range(count, numPartitions=1).selectExpr(
        "case when id % 10 = 0 then null else cast(id % 997 as string) end as key",
        "cast(id as string) as value",
    )
    write(frame, spark_cluster, topic=topic_name)
    back = read(spark_session, spark_cluster, topic_name)
    assert sorted(int(row["value"]) for row in back) == list(range(count))
    for row in back:
        if row["key"] is not None:
            assert row["partition"] == partition_for_key(row["key"], PARTITIONS), row["key"]
    by_partition: dict[int, list[int]] = {}
    for row in sorted(back, key=lambda row: (row["partition"], row["offset"])):
        by_partition.setdefault(row["partition"], []).append(int(row["value"]))
    assert all(values == sorted(values) for values in by_partition.values()), "a partition out of row order"


def test_a_task_run_again_after_writing_duplicates_what_it_wrote(
    spark_session: SparkSession, spark_cluster: LocalCluster, topic_name: str
) -> None:
    """At least once, measured: one task's first attempt fails after writing (and having acknowledged)
    its first rows; Spark runs it again; every row is there, and exactly that prefix twice."""
    with KqClient(spark_cluster.bootstrap) as client:
        client.create_topic(topic_name, partitions=1)
    count = 25_000
    frame = spark_session.range(count).selectExpr("cast(id as string) as value").coalesce(1)
    write(frame, spark_cluster, topic=topic_name, **{"kq.debug.failAfterRows": "5000"})
    values = Counter(int(row["value"]) for row in read(spark_session, spark_cluster, topic_name))
    assert set(values) == set(range(count)), "a row is missing"
    twice = sorted(value for value, seen in values.items() if seen == 2)
    assert max(values.values()) == 2
    assert twice == list(range(len(twice))) and len(twice) >= 5_000, "the failed attempt's rows, in order"


@pytest.mark.parametrize(
    ("columns", "options", "message"),
    [
        ("key string", {"topic": "t"}, "has no 'value' column"),
        ("value int", {"topic": "t"}, "column 'value' is int; it must be binary or string"),
        ("value string, partition long", {"topic": "t"}, "column 'partition' is bigint; it must be int"),
        ("value string", {}, "no topic: set the 'topic' option or give the DataFrame a 'topic' column"),
        ("value string", {"topic": "t", "subscribe": "t"}, "kq sink option 'subscribe': unknown option"),
        ("value string", {"topic": " "}, "kq sink option 'topic': empty"),
    ],
)
def test_bad_columns_and_options_fail_before_any_task(
    spark_session: SparkSession,
    spark_cluster: LocalCluster,
    columns: str,
    options: dict[str, str],
    message: str,
) -> None:
    frame = spark_session.createDataFrame([], columns)
    with pytest.raises(Exception, match=message):
        write(frame, spark_cluster, **options)


def test_rows_the_cluster_cannot_take_fail_the_write_naming_them(
    spark_session: SparkSession, spark_cluster: LocalCluster, topic_name: str
) -> None:
    """An unknown topic, a record over the size limit, a partition the topic lacks, a null topic; and
    overwrite mode: each fails with a message that names it."""
    with KqClient(spark_cluster.bootstrap) as client:
        client.create_topic(topic_name, partitions=1)
    small = spark_session.createDataFrame([("a",)], "value string").coalesce(1)
    with pytest.raises(Exception, match="topic 'no-such-topic' does not exist"):
        write(small, spark_cluster, topic="no-such-topic")
    huge = spark_session.createDataFrame([("a",), ("b" * (RECORD_BYTES_MAX + 1),)], "value string").coalesce(
        1
    )
    with pytest.raises(
        Exception, match=rf"row 1 of this task cannot be written: its record is {RECORD_BYTES_MAX + 1} bytes"
    ):
        write(huge, spark_cluster, topic=topic_name)
    misplaced = spark_session.createDataFrame([("a", 5)], "value string, partition int").coalesce(1)
    with pytest.raises(
        Exception,
        match=f"row 0 of this task cannot be written: topic '{topic_name}' has partitions 0 to 0, not 5",
    ):
        write(misplaced, spark_cluster, topic=topic_name)
    no_topic = spark_session.createDataFrame([("a", None)], "value string, topic string").coalesce(1)
    with pytest.raises(Exception, match="row 0 of this task cannot be written: its topic is null"):
        write(no_topic, spark_cluster)
    with pytest.raises(Exception, match="never overwritten; use mode 'append'"):
        small.write.format("kq").option("kq.nodes", spark_cluster.bootstrap[0]).option(
            "topic", topic_name
        ).mode("overwrite").save()
    # Each row is checked while its Arrow batch is encoded: nothing of a batch with a bad row was sent.
    assert read(spark_session, spark_cluster, topic_name) == []
