"""`format("kq")` in a fresh PySpark program with no setup call: `import kq.spark`, then a plain
SparkSession reads and writes kq (Spark registers the source from the `pyspark_kq` module)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kq.client import KqClient
from kq.deploy.cluster import LocalCluster
from kq.spark.session import QUICK_JVM_OPTIONS

pytestmark = pytest.mark.system

PROGRAM = """
import sys
import kq.spark  # The one line: no register call, no PYSPARK_PYTHON in the environment.
from pyspark.sql import SparkSession

nodes, source, sink = sys.argv[1:4]
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.driver.extraJavaOptions", sys.argv[4])  # A quick JVM: the tests' start-up.
         .getOrCreate())
rows = spark.read.format("kq").option("kq.nodes", nodes).option("subscribe", source).load()
writer = rows.select("key", "value").write.format("kq").option("kq.nodes", nodes).option("topic", sink)
writer.mode("append").save()
print("copied", rows.count())
spark.stop()
"""
RUN_TIMEOUT_S = 240


def test_a_fresh_session_reads_and_writes_kq_after_one_import(
    spark_cluster: LocalCluster, topic_name: str
) -> None:
    copy = f"{topic_name}-copy"
    with KqClient(spark_cluster.bootstrap) as client:
        client.create_topic(topic_name, partitions=2)
        client.create_topic(copy, partitions=2)
        for i in range(20):
            client.send(topic_name, f"v{i}".encode(), key=f"k{i}".encode())
    environment = {
        k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    }
    arguments = [",".join(spark_cluster.bootstrap), topic_name, copy, QUICK_JVM_OPTIONS]
    finished = subprocess.run(
        [sys.executable, "-c", PROGRAM, *arguments],
        capture_output=True,
        text=True,
        env=environment,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "copied 20" in finished.stdout
    with KqClient(spark_cluster.bootstrap) as client:
        copied = sum(p.log_end_offset for p in client.describe_topic(copy).partitions)
    assert copied == 20
