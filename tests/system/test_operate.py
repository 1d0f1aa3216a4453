"""Operating a real cluster: each node's /metrics under load (series exist and move, the group lag
equals `kq groups describe`), /healthz and /readyz with the gRPC health service agreeing, and JSON
logs that parse line by line."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import grpc
from confluent_kafka import Producer as KafkaProducer
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from kq.client import KqClient, Producer
from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for

TOPIC = "operated"
OTHER_TOPIC = "operated-by-kafka"  # Auto-created by the Kafka producer's Metadata request.
GROUP = "metered"
PARTITIONS = 3
WAIT_S = 30.0
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(http_address: str) -> Samples:
    """Every sample of a node's /metrics, by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://{http_address}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(value for (key, found), value in samples.items() if key == name and wanted <= set(found))


def names(samples: Iterable[tuple[str, tuple[tuple[str, str], ...]]]) -> set[str]:
    return {name for name, _ in samples}


def http_get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def cli_group_lag(cluster: LocalCluster) -> dict[str, object]:
    """`kq groups describe GROUP --format json`, run as a user runs it."""
    command = [str(Path(sys.executable).parent / "kq"), "--bootstrap", ",".join(cluster.bootstrap)]
    result = subprocess.run(
        [*command, "groups", "describe", GROUP, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    document: dict[str, object] = json.loads(result.stdout)
    return document


def check_node(
    node: str, samples: Samples, ends: dict[int, int], described: dict[str, object], index: int
) -> float:
    """One node's scrape-time series after the load: offsets as ListOffsets says, lag as the CLI says,
    Raft and storage series present; returns its kq_raft_role{role="leader"}."""
    partitions = described["partitions"]
    assert isinstance(partitions, list)
    lags = [int(p["lag"]) for p in partitions]
    for partition, end in ends.items():
        key = {"topic": TOPIC, "partition": str(partition)}
        assert total(samples, "kq_kafka_max_offset", **key) == end, node
        assert total(samples, "kq_kafka_start_offset", **key) == 0
        assert total(samples, "kq_kafka_partition_size_bytes", **key) > 0
    assert total(samples, "kq_kafka_consumer_group_lag_sum", group=GROUP) == described["total_lag"], node
    assert total(samples, "kq_kafka_consumer_group_lag_max", group=GROUP) == max(lags)
    assert total(samples, "kq_kafka_consumer_group_committed_offset", group=GROUP, partition="0") == 100
    assert total(samples, "kq_raft_applied_index") >= index
    assert total(samples, "kq_raft_term") >= 1
    assert total(samples, "kq_raft_leader_known") == 1
    assert total(samples, "kq_storage_lmdb_used_bytes") > 0
    assert total(samples, "kq_storage_disk_free_bytes") > 0
    assert total(samples, "kq_process_resident_memory_bytes") > 0
    assert total(samples, "kq_metrics_series_dropped") == 0
    present = names(samples)
    for name in (
        "kq_raft_commit_index",
        "kq_raft_apply_lag",
        "kq_raft_snapshots_total",
        "kq_raft_leadership_changes_total",
        "kq_raft_proposal_queue_depth",
        "kq_kafka_consumer_group_consumers",
    ):
        assert name in present, (node, name)
    return total(samples, "kq_raft_role", role="leader")


def test_metrics_exist_and_move_under_load_and_the_lag_equals_the_clis(tmp_path: Path) -> None:
    """Records produced grows between scrapes; offsets, Raft and storage series are there on every
    node; each node's group lag equals `kq groups describe`."""
    with LocalCluster(tmp_path / "cluster") as cluster:
        cluster.wait_ready()
        http = {node_id: spec.http_address for node_id, spec in cluster.nodes.items()}
        with KqClient(cluster.bootstrap) as client:
            client.create_topic(TOPIC, partitions=PARTITIONS)
            with Producer(client) as producer:
                for i in range(3_000):
                    producer.send(TOPIC, f"v{i}".encode(), key=f"k{i % 50}".encode())
                producer.flush(WAIT_S)
            before = {node: scrape(address) for node, address in http.items()}
            produced_before = sum(
                total(s, "kq_kafka_records_produced_total", topic=TOPIC) for s in before.values()
            )
            assert produced_before == 3_000  # Counted once, on the node that proposed each batch.
            with Producer(client) as producer:
                for i in range(2_000):
                    producer.send(TOPIC, f"w{i}".encode(), key=f"k{i % 50}".encode())
                producer.flush(WAIT_S)
            client.commit_offsets(GROUP, {(TOPIC, 0): 100, (TOPIC, 1): 7})
            sent = client.send(TOPIC, b"last", partition=2)
            cluster.wait_applied(sent.index, list(cluster.nodes), timeout_s=WAIT_S)
            ends = {p: o.log_end_offset for p, o in client.list_offsets(TOPIC).items()}
            records = client.fetch(TOPIC, 0, 0, max_records=500).records
            assert records
        kafka = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap})
        kafka.produce(OTHER_TOPIC, b"through Kafka", key=b"k")
        assert kafka.flush(WAIT_S) == 0
        after = {node: scrape(address) for node, address in http.items()}
        produced_after = sum(total(s, "kq_kafka_records_produced_total", topic=TOPIC) for s in after.values())
        assert produced_after == 5_001 > produced_before
        assert (
            sum(total(s, "kq_kafka_records_produced_total", topic=OTHER_TOPIC) for s in after.values()) == 1
        )
        kafka_latency = "kq_kafka_request_latency_seconds_count"
        assert sum(total(s, kafka_latency, request="produce") for s in after.values()) >= 1
        assert sum(total(s, kafka_latency, request="metadata") for s in after.values()) >= 1
        assert sum(total(s, "kq_kafka_records_fetched_total", topic=TOPIC) for s in after.values()) >= len(
            records
        )
        assert sum(total(s, "kq_kafka_request_bytes_total", request="produce") for s in after.values()) > 0
        assert (
            sum(total(s, "kq_grpc_request_latency_seconds_count", request="Produce") for s in after.values())
            > 0
        )
        described = cli_group_lag(cluster)
        assert isinstance(described["total_lag"], int) and described["total_lag"] > 0
        roles = [check_node(node, samples, ends, described, sent.index) for node, samples in after.items()]
        assert sorted(roles) == [0, 0, 1]


def test_health_endpoints_and_json_logs(tmp_path: Path) -> None:
    """/healthz and /readyz answer on every node, agree with gRPC health, and a node cut off from the
    majority turns not ready; with --log-format json every line of every node's log is a JSON object."""
    cluster = LocalCluster(tmp_path / "cluster", node_args=("--log-format", "json"))
    try:
        cluster.start()
        cluster.wait_ready()
        for spec in cluster.nodes.values():
            assert http_get(f"http://{spec.http_address}/healthz") == (200, {"alive": True})
            ready_url = f"http://{spec.http_address}/readyz"
            wait_for(lambda url=ready_url: http_get(url)[0] == 200, "ready", WAIT_S)  # type: ignore[misc]
            status, body = http_get(f"http://{spec.http_address}/nothing")
            assert status == 404 and "/readyz" in str(body["error"])
        survivor, *others = list(cluster.nodes)
        for node in others:
            cluster.stop_node(node)
        address = cluster.nodes[survivor].http_address

        def not_ready() -> bool:
            status, body = http_get(f"http://{address}/readyz")
            return status == 503 and body["ready"] is False and "leader" in str(body["reason"])

        wait_for(not_ready, "the lone node reports not ready", WAIT_S)
        with grpc.insecure_channel(cluster.nodes[survivor].grpc_address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)

            def not_serving() -> bool:
                answer = stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
                return bool(answer.status == health_pb2.HealthCheckResponse.NOT_SERVING)

            wait_for(not_serving, "gRPC health NOT_SERVING", WAIT_S)
    finally:
        cluster.stop()
    for node in cluster.nodes:
        lines = [line for line in cluster.log_path(node).read_text().splitlines() if line.strip()]
        assert len(lines) > 3
        for line in lines:
            entry = json.loads(line)
            assert {"ts", "level", "node", "logger", "message"} <= set(entry), line
            assert entry["node"] == node
        assert any(json.loads(line)["message"].startswith("serving gRPC") for line in lines)
