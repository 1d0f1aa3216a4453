"""System tests: the example batch jobs aggregate a topic read from followers (to Parquet, or back to kq);
their numbers add up."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from kq.client import KqClient
from kq.deploy.cluster import LocalCluster
from kq.spark.jobs import key_counts_to_kq
from kq.spark.jobs.demo_data import DEMO_KEYS, ensure_topic, produce_demo
from kq.spark.jobs.key_minute_stats import run

pytestmark = pytest.mark.system

RECORDS = 3_000


def test_key_minute_stats_counts_every_record_once(
    spark_session: SparkSession, spark_cluster: LocalCluster, topic_name: str, tmp_path: Path
) -> None:
    """Counts and bytes per key and minute add up to the topic's; no row came from the leader."""
    nodes = ",".join(spark_cluster.bootstrap)
    with KqClient(spark_cluster.bootstrap) as client:
        ensure_topic(client, topic_name)
        produce_demo(client, topic_name, RECORDS)
    leader = spark_cluster.wait_ready()
    summary = run(spark_session, nodes, topic_name, str(tmp_path / "out"))
    assert summary.records == RECORDS and summary.leader_id == leader
    assert leader not in summary.served_by and sum(summary.served_by.values()) == RECORDS
    written = spark_session.read.parquet(str(tmp_path / "out"))
    assert written.columns == ["key", "minute", "records", "bytes"]
    totals = written.groupBy().sum("records", "bytes").collect()[0]
    raw = spark_session.read.format("kq").option("kq.nodes", nodes).option("subscribe", topic_name).load()
    expected_bytes = raw.selectExpr("sum(length(key) + length(value))").collect()[0][0]
    assert (totals[0], totals[1]) == (RECORDS, expected_bytes)
    assert written.select("key").distinct().count() <= DEMO_KEYS
    assert summary.output_rows == written.count() > DEMO_KEYS  # Several minutes per key.


def test_key_counts_to_kq_writes_one_count_per_key_that_adds_up(
    spark_session: SparkSession, spark_cluster: LocalCluster, topic_name: str
) -> None:
    """The read-aggregate-write example: one record per key in the output topic, with the source as a
    header; the counts and bytes add up to the input topic's."""
    nodes = ",".join(spark_cluster.bootstrap)
    output = f"{topic_name}-counts"
    with KqClient(spark_cluster.bootstrap) as client:
        ensure_topic(client, topic_name)
        ensure_topic(client, output)
        produce_demo(client, topic_name, RECORDS)
    result = key_counts_to_kq.run(spark_session, nodes, topic_name, output)
    raw = spark_session.read.format("kq").option("kq.nodes", nodes).option("subscribe", topic_name).load()
    assert sum(counts["records"] for counts in result.values()) == RECORDS
    expected_bytes = raw.selectExpr("sum(length(value))").collect()[0][0]
    assert sum(counts["value_bytes"] for counts in result.values()) == expected_bytes
    assert len(result) == raw.select("key").distinct().count() <= DEMO_KEYS
    written = (
        spark_session.read.format("kq")
        .option("kq.nodes", nodes)
        .option("subscribe", output)
        .option("includeHeaders", "true")
        .load()
        .collect()
    )
    assert len(written) == len(result)
    assert all(
        [(h["key"], bytes(h["value"])) for h in row["headers"]] == [("source", topic_name.encode())]
        for row in written
    )
