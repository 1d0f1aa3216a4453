"""Fixtures that start real kq-node clusters; every node is stopped by PID when the test ends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kq.deploy.cluster import LocalCluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A started three-node cluster."""
    with LocalCluster(tmp_path / "cluster") as local:
        yield local


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A started three-node cluster shared by a module's tests that stop no node and name their own
    topics and groups (each start costs the suite ~2 s)."""
    with LocalCluster(tmp_path_factory.mktemp("shared") / "cluster") as local:
        yield local
