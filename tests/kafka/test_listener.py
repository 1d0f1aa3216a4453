"""The Kafka listener on real nodes: versions as advertised, metadata and admin APIs, bad frames."""

from __future__ import annotations

import re
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
from kio.schema.api_versions.v0.request import ApiVersionsRequest as ApiVersionsV0
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.types import TopicName
from kio.static.primitive import i8

from kq.broker.kafka.apis import API_VERSIONS
from kq.broker.kafka.build import request_module
from kq.deploy.cluster import LocalCluster
from tests.kafka.wire import call, decode_response, read_frame, request_frame

pytestmark = pytest.mark.system

# The list: exactly these are served (DescribeConfigs v0 from broker/kafka/kio_gaps.py).
EXPECTED_VERSIONS = {
    0: (3, 9),
    1: (4, 12),
    2: (1, 7),
    3: (4, 12),
    8: (2, 9),
    9: (1, 9),
    10: (0, 3),
    11: (0, 5),
    12: (0, 3),
    13: (0, 3),
    14: (0, 3),
    15: (0, 5),
    16: (0, 5),
    17: (0, 1),
    18: (0, 3),
    19: (2, 5),
    20: (1, 4),
    21: (0, 2),
    22: (0, 4),
    23: (2, 4),
    24: (0, 3),
    25: (0, 3),
    26: (0, 3),
    28: (0, 3),
    29: (1, 3),
    30: (1, 3),
    31: (1, 3),
    32: (0, 4),
    33: (0, 2),
    35: (1, 4),
    36: (0, 2),
    37: (0, 3),
    42: (0, 2),
    43: (0, 2),
    44: (0, 1),
    47: (0, 0),
    50: (0, 0),
    51: (0, 0),
    60: (0, 1),
    61: (0, 0),
    65: (0, 0),
    66: (0, 1),
    68: (0, 1),
    69: (0, 1),
    75: (0, 0),
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three nodes, each with a Kafka listener."""
    with LocalCluster(tmp_path_factory.mktemp("kafka-listener") / "cluster") as local:
        yield local


def _address(cluster: LocalCluster, node_id: str = "1") -> str:
    return cluster.nodes[node_id].kafka_address


def test_api_versions_advertise_what_is_served(cluster: LocalCluster) -> None:
    """ApiVersions v3 lists each served API with its version range, and nothing else."""
    response = call(
        _address(cluster), ApiVersionsRequest(client_software_name="t", client_software_version="1")
    )
    assert response.error_code == 0
    advertised = {key.api_key: (key.min_version, key.max_version) for key in response.api_keys}
    served = {key: (low, high) for key, (low, high) in advertised.items() if key in EXPECTED_VERSIONS}
    assert served == {key: value for key, value in EXPECTED_VERSIONS.items() if key in advertised}
    assert set(advertised) <= set(EXPECTED_VERSIONS)
    assert {0, 1, 2, 3, 10, 18, 19, 20, 22, 32, 60} <= set(advertised)


def test_unsupported_api_versions_version_gets_a_v0_answer(cluster: LocalCluster) -> None:
    """ApiVersions v4 (not served) is answered UNSUPPORTED_VERSION in v0 form, with the served list."""
    host, _, port = _address(cluster).rpartition(":")
    request = ApiVersionsRequest(client_software_name="t", client_software_version="1")
    frame = bytearray(request_frame(request))
    struct.pack_into(">h", frame, 6, 4)  # The version field of the header: 4.
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(bytes(frame))
        _, response = decode_response(read_frame(sock), API_VERSIONS, 0)
    assert response.error_code == 35
    assert any(key.api_key == API_VERSIONS and key.max_version == 3 for key in response.api_keys)
    assert call(_address(cluster), ApiVersionsV0()).error_code == 0


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">i", 200 * 1024 * 1024),  # Over the frame limit: refused before any body is read.
        struct.pack(">i", -5),
        struct.pack(">i", 3) + b"abc",  # Shorter than a header.
        struct.pack(">i", 12) + struct.pack(">hhi", 999, 0, 1) + b"\0\0\0\0",  # Unknown API key.
        struct.pack(">i", 10) + struct.pack(">hhi", 3, 12, 1) + b"\xff\xff",  # Undecodable Metadata.
    ],
    ids=["oversized", "negative", "short", "unknown-api", "undecodable"],
)
def test_bad_frames_close_only_their_connection(cluster: LocalCluster, frame: bytes) -> None:
    """A frame no response can answer closes that connection; the node serves the next one."""
    host, _, port = _address(cluster).rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(frame)
        assert sock.recv(1) == b""  # Closed by the broker.
    assert call(_address(cluster), ApiVersionsV0()).error_code == 0
    assert all(cluster.running(node_id) for node_id in cluster.nodes)


def test_metadata_names_the_raft_leader_and_every_node(cluster: LocalCluster) -> None:
    """Every broker is listed; the Raft leader leads every partition and is the controller."""
    leader = cluster.wait_ready()
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap, client_id="kq-test")
    try:
        admin.create_topics([NewTopic("meta-t", num_partitions=3, replication_factor=1)])
        created = cluster.statuses()[leader]
        assert created is not None
        cluster.wait_applied(created.applied_index, list(cluster.nodes))  # A follower may lag behind.
        for node_id in cluster.nodes:
            request = MetadataRequest(
                topics=(MetadataRequestTopic(topic_id=None, name=TopicName("meta-t")),),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
            response = call(_address(cluster, node_id), request)
            assert {broker.node_id for broker in response.brokers} == {1, 2, 3}
            assert response.controller_id == int(leader)
            (topic,) = response.topics
            assert topic.error_code == 0 and len(topic.partitions) == 3
            assert {partition.leader_id for partition in topic.partitions} == {int(leader)}
            assert all(set(partition.replica_nodes) == {1, 2, 3} for partition in topic.partitions)
        cluster_view = admin.describe_cluster()
        assert cluster_view["controller_id"] == int(leader)
        configs = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, "meta-t")], config_filter="all"
        )
        assert "cleanup.policy" in str(configs)
        admin.delete_topics(["meta-t"])
        assert "meta-t" not in admin.list_topics()
    finally:
        admin.close()


@pytest.mark.parametrize("version", [0, 1, 4])
def test_describe_configs_answers_every_version(cluster: LocalCluster, version: int) -> None:
    """DescribeConfigs v0 (kio has no schema; kq declares it in kio's form) answers like v1-4: v0 says
    is_default where later versions give a config source; an unknown topic gets its error."""
    leader = cluster.wait_ready()
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap, client_id="kq-test")
    try:
        admin.create_topics([NewTopic(f"configs-{version}", num_partitions=1, replication_factor=1)])
    finally:
        admin.close()
    module = request_module(32, version)
    request = module.DescribeConfigsRequest(
        resources=tuple(
            module.DescribeConfigsResource(resource_type=i8(2), resource_name=name, configuration_keys=None)
            for name in (f"configs-{version}", "no-such")
        ),
        **({} if version == 0 else {"include_synonyms": False}),
    )
    known, unknown = call(_address(cluster, leader), request).results
    assert known.error_code == 0 and unknown.error_code == 3
    configs = {config.name: config for config in known.configs}
    assert configs["cleanup.policy"].value == "delete"
    if version == 0:
        assert configs["cleanup.policy"].is_default
    else:
        assert configs["cleanup.policy"].config_source == 5


def test_metadata_auto_creates_a_named_topic(cluster: LocalCluster) -> None:
    """Metadata for an unknown topic with auto-creation allowed creates it with default partitions."""
    leader = cluster.wait_ready()
    request = MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name=TopicName("auto-made")),),
        allow_auto_topic_creation=True,
        include_topic_authorized_operations=False,
    )
    response = call(_address(cluster, leader), request)
    (topic,) = response.topics
    assert topic.error_code == 0 and len(topic.partitions) == 1
    invalid = MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name=TopicName("bad name!")),),
        allow_auto_topic_creation=True,
        include_topic_authorized_operations=False,
    )
    assert call(_address(cluster, leader), invalid).topics[0].error_code == 17


def test_node_refuses_a_kafka_listener_without_integer_ids(tmp_path: Path) -> None:
    """Kafka names brokers by number: a node with a non-numeric id and a Kafka address will not start."""
    import subprocess
    import sys

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kq.broker",
            "--node-id",
            "a",
            "--grpc-address",
            "127.0.0.1:1",
            "--raft-address",
            "127.0.0.1:2",
            "--peers",
            "a=127.0.0.1:2=127.0.0.1:1=127.0.0.1:3",
            "--data-dir",
            str(tmp_path),
            "--secret",
            "s",
            "--kafka-address",
            "127.0.0.1:3",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "node ids must be integers" in result.stderr


def test_the_readme_table_lists_every_served_api_with_its_versions() -> None:
    """README's Kafka table (key | API | versions) is exactly EXPECTED_VERSIONS: what ApiVersions
    advertises (checked above against a node), so the README can't fall behind a new API."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (\w+) \| (\d+)(?:\u2013(\d+))? \|", readme, re.MULTILINE)
    listed = {int(key): (int(low), int(high or low)) for key, _, low, high in rows}
    assert listed == EXPECTED_VERSIONS
