"""Fuzzing the Kafka listener of real nodes: random and mutated frames of every served API and version.

Requests are drawn by hypothesis from kio's own request classes (every field of the version, random
values), then sent as they are or mutated (bits flipped, cut short, extended with garbage, wrong
API version, or replaced by random bytes), to a random node. After each: every node process is
alive. At the end: every node answers ApiVersions, the canary records written over gRPC before the
fuzzing are unchanged on every node, and no node log has a CRITICAL line or a traceback.
Replay a failure with the seed hypothesis prints (`--hypothesis-seed=N`); KQ_KAFKA_FUZZ_EXAMPLES sets
the number of cases (default 300).
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.strategies._internal import types
from kio.schema.api_versions.v0.request import ApiVersionsRequest as ApiVersionsV0
from kio.schema.errors import ErrorCode
from kio.schema.offset_commit.v5.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import Records, i8, i32, i64

from kq.client import KqClient, ProducerRecord
from kq.deploy.cluster import LocalCluster
from tests.kafka.wire import call, request_class, request_frame

pytestmark = pytest.mark.system

EXAMPLES = int(os.environ.get("KQ_KAFKA_FUZZ_EXAMPLES", "300"))
ANSWER_TIMEOUT_S = 0.5  # Long-polls and group waits are cut short: the next case goes on.
CANARY_TOPIC = "kafka-fuzz-canary"
CANARY_RECORDS = [ProducerRecord(f"canary-{i}".encode(), f"k{i}".encode()) for i in range(20)]
SERVED: dict[int, tuple[int, int]] = {}  # From the nodes' own ApiVersions answer.

st.register_type_strategy(Records, st.binary(max_size=512))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three nodes with Kafka listeners, a canary topic with records, and the served API table."""
    with LocalCluster(tmp_path_factory.mktemp("kafka-fuzz") / "cluster") as local:
        with KqClient(local.bootstrap) as client:
            client.create_topic(CANARY_TOPIC, partitions=1)
            client.send_batch(CANARY_TOPIC, CANARY_RECORDS)
        versions = call(local.nodes["1"].kafka_address, ApiVersionsV0())
        SERVED.update({key.api_key: (key.min_version, key.max_version) for key in versions.api_keys})
        yield local


# Kafka's admin APIs (broker/kafka/admin.py, group_admin.py, cluster_admin.py): fuzzed on their own
# too, so each gets more than its share of the cases (their commands are new Raft commands).
ADMIN_APIS = (21, 35, 37, 42, 43, 47, 75)


# The admin and leader-epoch APIs of issue 38 (ACLs, SCRAM credentials, OffsetForLeaderEpoch): fuzzed
# on their own too, so each gets many cases whatever the size of the served table.
FOCUSED_KEYS = (23, 29, 30, 31, 50, 51)
# Kafka's ACL enums' codes (and some past them), so that many creations and filters are valid ones.
ACL_CODES = st.integers(0, 15).map(i8)


@st.composite
def frames(draw: st.DrawFn, keys: tuple[int, ...] = ()) -> bytes:
    """One request frame: a random request of a served API version (of `keys` when given), maybe mutated."""
    api_key = draw(st.sampled_from(sorted(key for key in SERVED if not keys or key in keys)))
    low, high = SERVED[api_key]
    version = draw(st.integers(low, high))
    request = draw(st.from_type(request_class(api_key, version)))
    frame = bytearray(request_frame(request, correlation_id=draw(st.integers(0, 2**31 - 1))))
    mutation = draw(st.sampled_from(["none", "none", "flip", "cut", "extend", "version", "random"]))
    if mutation == "flip":
        position = draw(st.integers(4, len(frame) - 1))
        frame[position] ^= 1 << draw(st.integers(0, 7))
    elif mutation == "cut":
        frame = frame[: draw(st.integers(4, len(frame)))]
        struct.pack_into(">i", frame, 0, len(frame) - 4)
    elif mutation == "extend":
        frame += draw(st.binary(min_size=1, max_size=64))
        struct.pack_into(">i", frame, 0, len(frame) - 4)
    elif mutation == "version":
        struct.pack_into(">h", frame, 6, draw(st.integers(-2, 40)))
    elif mutation == "random":
        body = draw(st.binary(min_size=0, max_size=256))
        frame = bytearray(struct.pack(">i", len(body)) + body)
    return bytes(frame)


def _send(address: str, frame: bytes) -> None:
    """Sends a frame and reads whatever comes back, briefly; the outcome does not matter, only the node."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=ANSWER_TIMEOUT_S) as sock:
        try:
            sock.sendall(frame)
            sock.recv(65536)
        except OSError:
            pass  # Closed by the broker, or no answer yet (a long-poll): both fine.


def test_an_offset_commit_of_a_negative_partition_is_unknown_not_a_traceback(cluster: LocalCluster) -> None:
    """A partition index below 0 (a fuzzed OffsetCommit v5 had -24928) is UNKNOWN_TOPIC_OR_PARTITION,
    as Kafka answers, beside a good one that commits; building its Raft command once failed with a
    traceback."""
    partitions = tuple(
        OffsetCommitRequestPartition(partition_index=i32(i), committed_offset=i64(1), committed_metadata="")
        for i in (-24928, 0)
    )
    request = OffsetCommitRequest(
        group_id=GroupId("fz-negative-partition"),
        generation_id_or_member_epoch=i32(-1),
        member_id="",
        topics=(OffsetCommitRequestTopic(name=TopicName(CANARY_TOPIC), partitions=partitions),),
    )
    leader = cluster.wait_ready()
    answer = call(cluster.nodes[leader].kafka_address, request)
    codes = [partition.error_code for partition in answer.topics[0].partitions]
    assert codes == [ErrorCode.unknown_topic_or_partition, ErrorCode.none]
    assert "Traceback" not in cluster.log_path(leader).read_text(errors="replace")


def test_fuzzed_frames_never_break_a_node(cluster: LocalCluster) -> None:
    """No frame kills a node, corrupts stored data or logs a traceback."""
    _fuzz(cluster, frames())


def test_fuzzed_admin_frames_never_break_a_node(cluster: LocalCluster) -> None:
    """The same for the admin APIs alone: DeleteRecords, DescribeLogDirs, CreatePartitions,
    DeleteGroups, ElectLeaders, OffsetDelete and DescribeTopicPartitions."""
    assert set(ADMIN_APIS) <= set(SERVED)
    _fuzz(cluster, frames(ADMIN_APIS))


def test_fuzzed_acl_scram_and_epoch_frames_never_break_a_node(cluster: LocalCluster) -> None:
    """The same for DescribeAcls, CreateAcls, DeleteAcls, the SCRAM credential APIs and
    OffsetForLeaderEpoch alone (what they write goes through Raft: the nodes stay alive and agree)."""
    kio_i8 = types._global_type_lookup[i8]  # kio's own (every int8); put back after this test.
    st.register_type_strategy(i8, ACL_CODES)
    try:
        _fuzz(cluster, frames(FOCUSED_KEYS))
    finally:
        st.register_type_strategy(i8, kio_i8)


def _fuzz(cluster: LocalCluster, drawn: st.SearchStrategy[bytes]) -> None:
    """Sends EXAMPLES frames drawn from `drawn` to random nodes; then every node answers, holds the
    canary records and has logged no traceback."""
    node_ids = sorted(cluster.nodes)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
        database=None,
    )
    @given(frame=drawn, node=st.sampled_from(node_ids))
    def one(frame: bytes, node: str) -> None:
        _send(cluster.nodes[node].kafka_address, frame)
        dead = [node_id for node_id in node_ids if not cluster.running(node_id)]
        assert not dead, f"nodes {dead} died after a {len(frame)}-byte frame: {frame[:64]!r}"

    one()
    for node_id in node_ids:
        assert call(cluster.nodes[node_id].kafka_address, ApiVersionsV0()).error_code == 0
    with KqClient(cluster.bootstrap) as client:
        for node_id in node_ids:
            fetched = client.fetch(
                CANARY_TOPIC, 0, 0, max_records=100, node=cluster.nodes[node_id].grpc_address, wait_ms=2000
            )
            assert [(r.key, r.value) for r in fetched.records] == [(r.key, r.value) for r in CANARY_RECORDS]
    for node_id in node_ids:
        log = cluster.log_path(node_id).read_text(errors="replace")
        assert "CRITICAL" not in log and "Traceback" not in log, f"node {node_id}'s log: {log[-2000:]}"
