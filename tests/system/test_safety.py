"""Requests that once crashed, froze or flooded a real cluster: each now gets a clear status, and the
cluster stays up, keeps committing, and keeps its data identical on every node."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kq.client import KqClient, ProducerRecord
from kq.deploy.cluster import LocalCluster
from kq.proto import kq_pb2, kq_pb2_grpc
from kq.proto.compression import GZIP, LZ4, SNAPPY, ZSTD
from kq.proto.records import assemble_batch
from tests.system.checks import read_everywhere

pytestmark = pytest.mark.system

TOPIC = "safety"
LONG_NAME = "a" * 200 + "b"  # Against '(a+)+$' a backtracking engine takes ~2^200 steps.


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(Path(tmp_path_factory.mktemp("safety")) / "cluster") as local:
        with KqClient(local.bootstrap) as client:
            client.create_topic(TOPIC, 2)
            client.create_topic(LONG_NAME, 1)
        yield local


def stubs(cluster: LocalCluster) -> Iterator[tuple[str, kq_pb2_grpc.BrokerStub, grpc.Channel]]:
    """A stub per node, leader and followers alike."""
    for node_id, spec in cluster.nodes.items():
        channel = grpc.insecure_channel(spec.grpc_address)
        try:
            yield node_id, kq_pb2_grpc.BrokerStub(channel), channel
        finally:
            channel.close()


def assert_healthy(cluster: LocalCluster, marker: bytes) -> None:
    """Every node runs, a write commits, and every node holds the same records, the new one included."""
    assert all(cluster.running(node_id) for node_id in cluster.nodes), "a node died"
    with KqClient(cluster.bootstrap, retry_timeout_s=20) as client:
        written = client.send_batch(TOPIC, [ProducerRecord(marker, partition=0)])[0]
        held = read_everywhere(client, TOPIC, 2, list(cluster.bootstrap))
    for records in held.values():
        assert records[0][written.offset].value == marker


def log_sizes(cluster: LocalCluster) -> dict[str, int]:
    return {node_id: cluster.log_path(node_id).stat().st_size for node_id in cluster.nodes}


def logged_since(cluster: LocalCluster, sizes: dict[str, int]) -> str:
    """What the nodes logged after `sizes` were taken."""
    text = ""
    for node_id, size in sizes.items():
        with cluster.log_path(node_id).open("rb") as log:
            log.seek(size)
            text += log.read().decode(errors="replace")
    return text


def refused(call: object, request: object) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        call(request)  # type: ignore[operator]
    assert caught.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION), (
        caught.value
    )
    return str(caught.value.details())


def test_compressed_batches_of_zero_records_are_refused(cluster: LocalCluster) -> None:
    """Item 1: a zstd (and lz4, gzip, snappy) batch of nothing answers INVALID_ARGUMENT; nobody exits."""
    for node_id, stub, _ in stubs(cluster):
        for codec in (ZSTD, LZ4, GZIP, SNAPPY):
            request = kq_pb2.ProduceRequest(
                topic=TOPIC, partition=0, records=assemble_batch(b"", 1, 1, 1, codec)
            )
            details = refused(stub.Produce, request)
            assert "record" in details or "leader" in details, (node_id, details)
    leader = cluster.leader_id()
    assert leader is not None
    with grpc.insecure_channel(cluster.nodes[leader].grpc_address) as channel:
        stub = kq_pb2_grpc.BrokerStub(channel)
        for codec in (ZSTD, LZ4, GZIP, SNAPPY):
            request = kq_pb2.ProduceRequest(
                topic=TOPIC, partition=0, records=assemble_batch(b"", 1, 1, 1, codec)
            )
            with pytest.raises(grpc.RpcError) as caught:
                stub.Produce(request)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert_healthy(cluster, b"after-empty-batches")


def test_a_deeply_nested_pattern_is_refused(cluster: LocalCluster) -> None:
    """Item 2: a pattern nested 400 parentheses deep answers INVALID_ARGUMENT; followers live on."""
    pattern = "(" * 400 + "a" + ")" * 400
    with KqClient(cluster.bootstrap) as client:
        leader = client.leader_address()
    assert leader is not None
    with grpc.insecure_channel(leader) as channel:
        details = refused(
            kq_pb2_grpc.BrokerStub(channel).JoinGroup,
            kq_pb2.JoinGroupRequest(group="deep", topic_pattern=pattern, client_id="c"),
        )
    assert "pattern" in details
    assert_healthy(cluster, b"after-deep-pattern")


def test_a_backtracking_pattern_joins_without_freezing_anyone(cluster: LocalCluster) -> None:
    """Item 3: '(a+)+$' against a 201-character topic name is matched by RE2 on every replica."""
    with KqClient(cluster.bootstrap) as client:
        leader = client.leader_address()
    assert leader is not None
    with grpc.insecure_channel(leader) as channel:
        response = kq_pb2_grpc.BrokerStub(channel).JoinGroup(
            kq_pb2.JoinGroupRequest(group="backtrack", topic_pattern="(a+)+$", client_id="c"), timeout=10
        )
    assert response.generation >= 1 and not response.rebalancing
    assert_healthy(cluster, b"after-backtracking-pattern")


def test_undecodable_bytes_answer_invalid_argument_without_a_traceback(cluster: LocalCluster) -> None:
    """Item 4: garbage and too-deeply-nested bytes for every method: INVALID_ARGUMENT, no log lines."""
    before = log_sizes(cluster)
    methods = [method.name for method in kq_pb2.DESCRIPTOR.services_by_name["Broker"].methods]
    payloads = [b"\xff\xff\xff\xff", b"\x0a\x7fshort", b"\x7b" * 300 + b"\x7c" * 300]
    for _, _, channel in stubs(cluster):
        for method in methods:
            for payload in payloads:
                call = channel.unary_unary(f"/kq.v1.Broker/{method}", None, None)
                if method == "ProduceStream":
                    bidi = channel.stream_stream(f"/kq.v1.Broker/{method}", None, None)
                    with pytest.raises(grpc.RpcError) as caught:
                        list(bidi(iter([payload]), timeout=5))
                elif method == "FetchStream":
                    stream = channel.unary_stream(f"/kq.v1.Broker/{method}", None, None)
                    with pytest.raises(grpc.RpcError) as caught:
                        list(stream(payload, timeout=5))
                else:
                    with pytest.raises(grpc.RpcError) as caught:
                        call(payload, timeout=5)
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (
                    method,
                    payload[:8],
                    caught.value,
                )
    added = logged_since(cluster, before)
    assert "Traceback" not in added and "deserializing" not in added, added[-2000:]
    assert_healthy(cluster, b"after-garbage")
