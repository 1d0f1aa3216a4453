"""A three-node cluster with Kafka listeners, shared by a test module (nodes stopped by PID)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kq.deploy.cluster import LocalCluster


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three nodes, each with a Kafka listener (`kafka_bootstrap`)."""
    with LocalCluster(tmp_path_factory.mktemp("kafka") / "cluster") as local:
        yield local
