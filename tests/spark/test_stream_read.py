"""System test: an availableNow stream reads everything; restarted from its checkpoint, only what is new."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from kq.client import KqClient
from kq.deploy.cluster import LocalCluster
from tests.spark.records import assert_rows_match, produce

pytestmark = pytest.mark.system

PARTITIONS = 4
FIRST_RECORDS = 2_000
MORE_RECORDS = 700
MAX_OFFSETS_PER_TRIGGER = 1_200  # Two micro-batches in the first run, one in the second.
QUERY_TIMEOUT_S = 120


def run_available_now(
    session: SparkSession, cluster: LocalCluster, topic: str, output: Path
) -> StreamingQuery:
    """One availableNow run into Parquet (an idempotent sink) with a checkpoint; waits for its end."""
    query = (
        session.readStream.format("kq")
        .option("kq.nodes", ",".join(cluster.bootstrap))
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(MAX_OFFSETS_PER_TRIGGER))
        .option("includeHeaders", "true")
        .load()
        .writeStream.format("parquet")
        .option("path", str(output / "data"))
        .option("checkpointLocation", str(output / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(QUERY_TIMEOUT_S), "the availableNow query did not finish"
    assert query.exception() is None, query.exception()
    return query


def test_restarted_stream_reads_exactly_the_new_records(
    spark_session: SparkSession, spark_cluster: LocalCluster, topic_name: str, tmp_path: Path
) -> None:
    """Run 1 reads all (micro-batches of at most maxOffsetsPerTrigger); run 2 reads only the new ones."""
    with KqClient(spark_cluster.bootstrap) as client:
        client.create_topic(topic_name, partitions=PARTITIONS)
        first = produce(client, topic_name, FIRST_RECORDS, PARTITIONS)
        query = run_available_now(spark_session, spark_cluster, topic_name, tmp_path)
        batches = [progress["numInputRows"] for progress in query.recentProgress]
        assert sum(batches) == FIRST_RECORDS and max(batches) <= MAX_OFFSETS_PER_TRIGGER, batches
        assert_rows_match(spark_session.read.parquet(str(tmp_path / "data")).collect(), first, topic_name)
        kafka_shaped = {topic_name: {str(p): FIRST_RECORDS // PARTITIONS for p in range(PARTITIONS)}}
        assert json.loads(query.recentProgress[-1]["sources"][0]["endOffset"]) == kafka_shaped
        last_batch = max((tmp_path / "checkpoint" / "offsets").glob("[0-9]*"), key=lambda p: int(p.name))
        assert json.loads(last_batch.read_text().splitlines()[-1]) == kafka_shaped  # Spark's checkpoint.

        more = produce(client, topic_name, MORE_RECORDS, PARTITIONS, first=FIRST_RECORDS)
        query = run_available_now(spark_session, spark_cluster, topic_name, tmp_path)
    assert sum(progress["numInputRows"] for progress in query.recentProgress) == MORE_RECORDS
    assert_rows_match(spark_session.read.parquet(str(tmp_path / "data")).collect(), first + more, topic_name)
