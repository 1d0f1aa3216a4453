"""kcat (Debian's package, librdkafka's command-line client) against kq: -L, -P and -C, also after
the admin APIs changed a topic (kcat has no admin commands of its own)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions

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


def test_kcat_sees_grown_and_trimmed_partitions(kafka_cluster: LocalCluster) -> None:
    """After CreatePartitions and DeleteRecords (confluent-kafka's AdminClient): `kcat -L` lists the
    new partitions, `kcat -P` writes to one, and `kcat -C -o beginning` starts at the low watermark."""
    lines = [f"line {i}" for i in range(5)]
    _kcat(kafka_cluster, "-P", "-t", "kcat-admin", "-p", "0", stdin="\n".join(lines) + "\n")
    client = AdminClient({"bootstrap.servers": kafka_cluster.kafka_bootstrap})
    client.create_partitions([NewPartitions("kcat-admin", 3)])["kcat-admin"].result(TIMEOUT_S)
    assert "3 partitions" in _kcat(kafka_cluster, "-L", "-t", "kcat-admin")
    _kcat(kafka_cluster, "-P", "-t", "kcat-admin", "-p", "2", stdin="new\n")
    grown = _kcat(kafka_cluster, "-C", "-t", "kcat-admin", "-p", "2", "-o", "beginning", "-e")
    assert grown.splitlines() == ["new"]
    trimmed = client.delete_records([TopicPartition("kcat-admin", 0, 3)])
    assert next(iter(trimmed.values())).result(TIMEOUT_S).low_watermark == 3
    consumed = _kcat(kafka_cluster, "-C", "-t", "kcat-admin", "-p", "0", "-o", "beginning", "-e")
    assert consumed.splitlines() == lines[3:]
