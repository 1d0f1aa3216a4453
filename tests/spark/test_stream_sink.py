"""System test of the streaming sink: a rate source written to kq (spark/jobs/rate_to_kq.py) whose
driver is killed (SIGKILL, with its JVM) and started again on the same checkpoint: every input row is
in the topic afterwards; rows written twice (the micro-batch in flight at the kill) are counted."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from kq.client import KqClient
from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for

pytestmark = pytest.mark.system

ROWS_PER_SECOND = 400
FIRST_RUN_ROWS = 1_500  # Written before the first driver is killed.
SECOND_RUN_ROWS = 1_500  # More written by the second driver before it is killed too.
WAIT_S = 180.0  # A driver's start (JVM, session) on a busy machine, plus the rows at the rate above.
LOG_LINES = 30


def start_job(cluster: LocalCluster, topic: str, checkpoint: Path, log: Path) -> subprocess.Popen[bytes]:
    """The job's driver in a session of its own, so that its JVM can be killed with it."""
    command = [
        sys.executable,
        "-m",
        "kq.spark.jobs.rate_to_kq",
        "--nodes",
        ",".join(cluster.bootstrap),
        "--topic",
        topic,
        "--checkpoint",
        str(checkpoint),
        "--rows-per-second",
        str(ROWS_PER_SECOND),
        "--seconds",
        "0",
    ]
    with log.open("ab") as output:
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)


def kill_job(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL of the driver and its JVM: the process group the driver leads (its PID is the group's)."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def written(process: subprocess.Popen[bytes], client: KqClient, topic: str, target: int) -> bool:
    """Whether the topic holds `target` records; raises if the job exited by itself."""
    if process.poll() is not None:
        raise AssertionError(f"the job exited with {process.returncode}")
    return sum(p.log_end_offset for p in client.describe_topic(topic).partitions) >= target


def test_a_killed_driver_resumes_from_its_checkpoint_and_loses_no_row(
    spark_session: SparkSession, spark_cluster: LocalCluster, topic_name: str, tmp_path: Path
) -> None:
    log = tmp_path / "driver.log"
    checkpoint = tmp_path / "checkpoint"
    with KqClient(spark_cluster.bootstrap) as client:
        client.create_topic(topic_name, partitions=1)
        for target in (FIRST_RUN_ROWS, FIRST_RUN_ROWS + SECOND_RUN_ROWS):
            process = start_job(spark_cluster, topic_name, checkpoint, log)
            try:
                wait_for(
                    functools.partial(written, process, client, topic_name, target),
                    f"{target} rows written by the job (log: {log})",
                    WAIT_S,
                    poll_s=0.5,
                )
            except Exception:
                print("\n".join(log.read_text(errors="replace").splitlines()[-LOG_LINES:]))
                raise
            finally:
                kill_job(process)
    values = Counter(
        int(row["value"])
        for row in spark_session.read.format("kq")
        .option("kq.nodes", ",".join(spark_cluster.bootstrap))
        .option("subscribe", topic_name)
        .load()
        .collect()
    )
    assert set(values) == set(range(max(values) + 1)), "a row the source produced is missing"
    assert max(values) + 1 >= FIRST_RUN_ROWS + SECOND_RUN_ROWS / 2
    twice = sorted(value for value, seen in values.items() if seen > 1)
    assert max(values.values()) <= 2, "a row written more than twice"
    # The duplicates are the micro-batch the first driver was writing when it died, re-run at restart:
    # one contiguous range of at most one trigger's rows (plus the backlog a slow restart accumulates).
    if twice:
        assert twice == list(range(twice[0], twice[-1] + 1))
    print(f"rows {max(values) + 1}, written twice {len(twice)}: {twice[:1]}..{twice[-1:]}")
