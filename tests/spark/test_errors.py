"""System test: bad options fail the Spark query with one clear message naming the option."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from kq.client import KqClient
from kq.deploy.cluster import LocalCluster

pytestmark = pytest.mark.system


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "no-such-topic"}, "kq source option 'subscribe': unknown topic 'no-such-topic'"),
        (
            {"subscribe": "{topic}", "startingOffsets": '{"{topic}": {"0": 1'},
            "kq source option 'startingOffsets': expected 'earliest', 'latest' or JSON like",
        ),
        (
            {"subscribe": "{topic}", "assign": '{"{topic}": [0]}'},
            "kq source option 'subscribe': give exactly one of 'subscribe', 'subscribePattern', 'assign'",
        ),
        ({"assign": '{"{topic}": [0, 9]}'}, "kq source option 'assign': no such partition: {topic}-9"),
        ({"subscribe": "{topic}", "startingOffsets": "latest"}, "'startingOffsets': 'latest' is not allowed"),
    ],
)
def test_bad_options_fail_with_the_option_named(
    spark_session: SparkSession,
    spark_cluster: LocalCluster,
    topic_name: str,
    options: dict[str, str],
    message: str,
) -> None:
    """The query fails; the error Spark raises carries kq's one-line message."""
    with KqClient(spark_cluster.bootstrap) as client:
        client.create_topic(topic_name, partitions=2)
    given = {key: value.replace("{topic}", topic_name) for key, value in options.items()}
    with pytest.raises(Exception) as raised:  # Spark wraps it in its own exception types.
        spark_session.read.format("kq").option("kq.nodes", ",".join(spark_cluster.bootstrap)).options(
            **given
        ).load().collect()
    assert message.replace("{topic}", topic_name) in str(raised.value)
