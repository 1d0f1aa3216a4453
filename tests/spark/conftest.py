"""Fixtures for the Spark data source tests: one quiet local SparkSession and one three-node cluster per run.

Without the `spark` extra (pyspark, pyarrow) these tests are skipped; CI installs it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from kq.deploy.cluster import LocalCluster
from kq.spark.session import local_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_topic_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def spark_session() -> Iterator[SparkSession]:
    """A local[2] session with format("kq") registered, running a failed task twice (the sink's retry
    test); stopped after the last Spark test."""
    session = local_session("kq-tests", quick_jvm=True, task_attempts=2)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three real `kq-node` processes shared by the Spark tests that kill no node; stopped by PID."""
    with LocalCluster(Path(tmp_path_factory.mktemp("kq-spark-cluster"))) as local:
        yield local


@pytest.fixture
def topic_name() -> str:
    """A topic name no other test in this run uses."""
    return f"spark-{next(_topic_numbers)}"
