"""Fixtures for the `kq` CLI tests: one real 3-node cluster for the whole run, and a runner for `kq`.

tests/cli has no `__init__.py` on purpose: with one, pytest would import this folder as a package
named `cli` and hide the real `cli` package.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kq.cli.main import kq
from kq.client import KqClient
from kq.deploy.cluster import LocalCluster

CLI_RETRY_TIMEOUT_S = 10.0
RunKq = Callable[..., Result]
_topic_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three real `kq-node` processes on free loopback ports, stopped (by PID) after the last test."""
    with LocalCluster(Path(tmp_path_factory.mktemp("kq-cli-cluster"))) as local:
        yield local


@pytest.fixture(scope="session")
def client(cluster: LocalCluster) -> Iterator[KqClient]:
    """A client of the test cluster, to set up and check what the CLI did."""
    with KqClient(cluster.bootstrap) as kq_client:
        yield kq_client


@pytest.fixture
def run_kq(cluster: LocalCluster) -> RunKq:
    """Runs `kq --bootstrap <cluster> ARGS...` in-process; `stdin` is fed to it (str or bytes)."""

    def run(*args: str, stdin: str | bytes | None = None) -> Result:
        bootstrap = ",".join(cluster.bootstrap)
        arguments = ["--bootstrap", bootstrap, "--timeout", str(CLI_RETRY_TIMEOUT_S), *args]
        return CliRunner().invoke(kq, arguments, input=stdin, catch_exceptions=True)

    return run


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses (from the test's name, made legal)."""
    stem = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60]
    return f"{stem}-{next(_topic_numbers)}"
