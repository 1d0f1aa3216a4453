"""kcat (Debian's package, librdkafka's command-line client) against kq: -L, -P and -C."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from kq.deploy.cluster import LocalCluster

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed (apt-get install kcat)"),
]
TIMEOUT_S = 60


def _kcat(cluster: LocalCluster, *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        ["kcat", "-b", cluster.kafka_bootstrap, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_kcat_lists_produces_and_consumes(kafka_cluster: LocalCluster) -> None:
    """`kcat -L` shows the brokers; `-P` writes keyed lines; `-C -e` reads them back in order."""
    leader = kafka_cluster.wait_ready()
    listing = _kcat(kafka_cluster, "-L")
    assert "3 brokers" in listing and f"broker {leader} at" in listing
    lines = [f"key{i}:value {i}" for i in range(20)]
    _kcat(kafka_cluster, "-P", "-t", "kcat-topic", "-K", ":", "-p", "0", stdin="\n".join(lines) + "\n")
    consumed = _kcat(kafka_cluster, "-C", "-t", "kcat-topic", "-p", "0", "-o", "beginning", "-e", "-K", ":")
    assert consumed.splitlines() == lines
    assert "kcat-topic" in _kcat(kafka_cluster, "-L", "-t", "kcat-topic")
