"""Raft timing options: combinations PySyncObj refuses are refused as usage errors before a node starts,
and long election timeouts (above PySyncObj's default connection timeout) run a working cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kq.broker.main import main
from kq.client import KqClient
from kq.deploy.cluster import LocalCluster


def node_arguments(tmp_path: Path) -> list[str]:
    arguments = ["--node-id", "1", "--grpc-address", "127.0.0.1:1", "--raft-address", "127.0.0.1:2"]
    return [*arguments, "--peers", "1=127.0.0.1:2=127.0.0.1:1", "--data-dir", str(tmp_path), "--secret", "s"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--election-timeout-min-ms", "900", "--election-timeout-max-ms", "800"], "must be below"),
        (["--election-timeout-min-ms", "150", "--heartbeat-ms", "50"], "three times --heartbeat-ms"),
        (
            ["--leader-fallback-ms", "100", "--heartbeat-ms", "100", "--election-timeout-min-ms", "500"],
            "--leader-fallback-ms must be above --heartbeat-ms",
        ),
        (
            ["--group-consumer-heartbeat-interval-ms", "9000", "--group-consumer-session-timeout-ms", "9000"],
            "must be below --group-consumer-session-timeout-ms",
        ),
    ],
)
def test_timings_pysyncobj_refuses_are_usage_errors(tmp_path: Path, options: list[str], message: str) -> None:
    """Exit 2 with a one-line reason, nothing written: never PySyncObj's AssertionError at start."""
    result = CliRunner().invoke(main, node_arguments(tmp_path) + options)
    assert result.exit_code == 2 and message in result.output, result.output
    assert not any(tmp_path.iterdir())


def test_a_cluster_with_long_election_timeouts_elects_and_commits(tmp_path: Path) -> None:
    """--election-timeout-max-ms above 1,500 (PySyncObj's connection timeout as kq set it) once
    stopped every node with an AssertionError; now the connection timeout follows it."""
    options = ("--election-timeout-min-ms", "1600", "--election-timeout-max-ms", "3000")
    with LocalCluster(tmp_path / "cluster", node_args=options) as cluster:
        cluster.wait_ready()
        with KqClient(cluster.bootstrap) as client:
            client.create_topic("slow-elections", partitions=1)
            sent = client.send("slow-elections", b"v", partition=0)
        cluster.wait_applied(sent.index, list(cluster.nodes), timeout_s=60)
