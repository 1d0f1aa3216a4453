"""System tests: batch reads of a 4-partition topic on three real nodes, from followers."""

from __future__ import annotations

import pytest
from pyspark.sql import DataFrame, SparkSession

from kq.client import KqClient
from kq.deploy.cluster import LocalCluster
from tests.spark.records import assert_rows_match, produce

pytestmark = pytest.mark.system

RECORDS = 4_000
PARTITIONS = 4
STABLE_LEADER_ATTEMPTS = 3


def kq_read(session: SparkSession, cluster: LocalCluster, topic: str, **options: str) -> DataFrame:
    """spark.read.format("kq") of `topic` with the given options."""
    return (
        session.read.format("kq")
        .option("kq.nodes", ",".join(cluster.bootstrap))
        .option("subscribe", topic)
        .options(**options)
        .load()
    )


def test_follower_read_returns_every_record_once_served_by_followers(
    spark_session: SparkSession, spark_cluster: LocalCluster, topic_name: str
) -> None:
    """N records in 4 partitions: a follower read returns each once, intact; no row came from the leader."""
    with KqClient(spark_cluster.bootstrap) as client:
        client.create_topic(topic_name, partitions=PARTITIONS)
        sent = produce(client, topic_name, RECORDS, PARTITIONS)
    frame = kq_read(
        spark_session, spark_cluster, topic_name, includeHeaders="true", **{"kq.debug.servedBy": "true"}
    )
    for _ in range(STABLE_LEADER_ATTEMPTS):  # On a starved machine an election may move the leader mid-read.
        leader = spark_cluster.wait_ready()
        rows = frame.collect()
        if spark_cluster.leader_id() == leader:
            break
    else:
        pytest.fail(f"the leader changed during each of {STABLE_LEADER_ATTEMPTS} reads")
    assert len(rows) == RECORDS
    assert_rows_match(rows, sent, topic_name)
    served_by = {(row["partition"], row["servedBy"]) for row in rows}
    followers = set(spark_cluster.nodes) - {leader}
    assert {node for _, node in served_by} == followers, f"leader {leader}; rows served by {served_by}"
    assert len({partition for partition, _ in served_by}) == PARTITIONS


def test_ranges_and_min_partitions(
    spark_session: SparkSession, spark_cluster: LocalCluster, topic_name: str
) -> None:
    """Specific starting/ending offsets bound the read; minPartitions splits it without changing the rows."""
    with KqClient(spark_cluster.bootstrap) as client:
        client.create_topic(topic_name, partitions=PARTITIONS)
        sent = produce(client, topic_name, 400, PARTITIONS)
    whole = kq_read(spark_session, spark_cluster, topic_name, minPartitions="10")
    assert whole.rdd.getNumPartitions() >= 10
    assert_rows_match(whole.collect(), sent, topic_name)
    bounded = kq_read(
        spark_session,
        spark_cluster,
        topic_name,
        startingOffsets=f'{{"{topic_name}": {{"0": 10, "1": -2, "2": 99, "3": -2}}}}',
        endingOffsets=f'{{"{topic_name}": {{"0": 20, "1": 5, "2": -1, "3": -1}}}}',
    )
    expected = [
        s
        for s in sent
        if (s.partition == 0 and 10 <= s.offset < 20)
        or (s.partition == 1 and s.offset < 5)
        or (s.partition == 2 and s.offset >= 99)
        or s.partition == 3
    ]
    assert_rows_match(bounded.collect(), expected, topic_name)


def test_an_empty_topic_reads_as_no_rows(
    spark_session: SparkSession, spark_cluster: LocalCluster, topic_name: str
) -> None:
    """Nothing to read plans no input partition; Spark then reads one empty partition of its own."""
    with KqClient(spark_cluster.bootstrap) as client:
        client.create_topic(topic_name, partitions=PARTITIONS)
    assert kq_read(spark_session, spark_cluster, topic_name).collect() == []
