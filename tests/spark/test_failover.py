"""System test: the follower being read is killed mid-read; the read still returns every record once."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import Row, SparkSession

from kq.client import KqClient
from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for
from tests.spark.records import assert_rows_match, produce

pytestmark = pytest.mark.system

RECORDS = 4_000
PARTITIONS = 4
FETCH_RECORDS = 50  # 20 fetches per partition...
FETCH_DELAY_MS = 100  # ...of at least 100 ms each: a partition takes 2 s or more, so the kill lands mid-read.
SERVED_BYTES_BEFORE_KILL = 6_000  # A few fetches' worth (~2.5 KB each); gRPC's own frames are far less.
READ_STARTED_TIMEOUT_S = 90.0
READ_TIMEOUT_S = 180.0
BYTES_SENT = re.compile(r"bytes_sent:(\d+)")


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A cluster of its own, since this test kills one of its nodes."""
    with LocalCluster(tmp_path / "cluster") as local:
        yield local


@pytest.fixture(autouse=True)
def _needs_ss() -> None:
    """The test watches the victim's sockets with iproute2's `ss`."""
    if shutil.which("ss") is None:
        pytest.skip("needs iproute2's ss to see when the victim node is serving the read")


def bytes_served(address: str) -> int:
    """Bytes the node at `address` has sent on its open gRPC connections (the kernel's count, via `ss`)."""
    port = address.rsplit(":", 1)[1]
    listing = subprocess.run(
        ["ss", "-tinH", "state", "established", f"( sport = :{port} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sum(int(sent) for sent in BYTES_SENT.findall(listing))


def wait_until_serving(address: str, reading: threading.Thread) -> None:
    """Returns once the node has sent a few fetch responses to the executors: the read is under way."""

    def serving() -> bool:
        assert reading.is_alive(), f"the read ended before {address} served it"
        return bytes_served(address) >= SERVED_BYTES_BEFORE_KILL

    wait_for(serving, f"{address} to serve the read", READ_STARTED_TIMEOUT_S, poll_s=0.02)


def test_killing_the_follower_being_read_loses_and_duplicates_nothing(
    spark_session: SparkSession, own_cluster: LocalCluster, topic_name: str
) -> None:
    """kill -9 of the follower serving partitions 0 and 2 mid-read: another node serves the rest."""
    with KqClient(own_cluster.bootstrap) as client:
        client.create_topic(topic_name, partitions=PARTITIONS)
        sent = produce(client, topic_name, RECORDS, PARTITIONS)
    leader = own_cluster.wait_ready()
    victim = min(node for node in own_cluster.nodes if node != leader)  # Input partition 0's first candidate.
    frame = (
        spark_session.read.format("kq")
        .option("kq.nodes", ",".join(own_cluster.bootstrap))
        .option("subscribe", topic_name)
        .option("includeHeaders", "true")
        .option("kq.readFrom", "follower")
        .option("kq.fetch.maxRecords", str(FETCH_RECORDS))
        .option("kq.debug.fetchDelayMs", str(FETCH_DELAY_MS))
        .option("kq.debug.servedBy", "true")
        .load()
    )
    result: list[Row] = []
    failure: list[BaseException] = []

    def read() -> None:
        try:
            result.extend(frame.collect())
        except BaseException as error:
            failure.append(error)

    reading = threading.Thread(target=read, name="spark-read")
    reading.start()
    wait_until_serving(own_cluster.nodes[victim].grpc_address, reading)
    own_cluster.kill_node(victim)
    reading.join(READ_TIMEOUT_S)
    assert not reading.is_alive(), "the read did not finish"
    assert not failure, failure
    assert len(result) == RECORDS
    assert_rows_match(result, sent, topic_name)
    served = {(row["partition"], row["servedBy"]) for row in result}
    by_victim = sum(1 for row in result if row["servedBy"] == victim)
    assert 0 < by_victim < RECORDS // 2, (
        f"node {victim} served {by_victim} rows: the kill did not land mid-read"
    )
    assert (0, victim) in served and any(p == 0 and node != victim for p, node in served), served
