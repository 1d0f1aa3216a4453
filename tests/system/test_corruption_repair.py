"""A follower whose store has a flipped byte: it never serves the bad bytes, and repairs itself."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for
from kq.proto import kq_pb2, kq_pb2_grpc
from kq.proto.errors import ERROR_CODE_METADATA_KEY, ErrorCode, metadata_value
from tests.raft.helpers import batch

REPAIR_TIMEOUT_S = 60.0  # Issue 39: the node serves the original bytes again within a minute.


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One three-node cluster for both tests (each uses a topic of its own)."""
    with LocalCluster(tmp_path_factory.mktemp("corruption") / "cluster") as local:
        yield local


def _flip_everywhere(path: Path, needle: bytes) -> int:
    """Flips one byte of every copy of `needle` in the file at `path` (a bad disk under a running
    node: LMDB reads its file through a shared map, so the node sees the write); how many."""
    data = path.read_bytes()
    places = []
    start = data.find(needle)
    while start >= 0:
        places.append(start)
        start = data.find(needle, start + 1)
    with path.open("r+b") as file:
        for place in places:
            at = place + len(needle) // 2
            os.pwrite(file.fileno(), bytes([data[at] ^ 0x5A]), at)
    return len(places)


def _fetch(address: str, topic: str) -> kq_pb2.FetchResponse:
    with grpc.insecure_channel(address) as channel:
        request = kq_pb2.FetchRequest(topic=topic, partition=0, offset=0, max_records=10)
        response: kq_pb2.FetchResponse = kq_pb2_grpc.BrokerStub(channel).Fetch(request, timeout=10)
        return response


def test_a_flipped_byte_in_a_followers_store_answers_data_loss_and_is_repaired(
    cluster: LocalCluster,
) -> None:
    """A byte flipped in a follower's LMDB file under a stored record: a read there answers DATA_LOSS
    with CORRUPT_DATA, never the damaged bytes; the node puts the batch back from another replica by
    itself, then serves the original bytes; its log says so once each (found, repaired)."""
    leader = cluster.wait_ready()
    follower = next(node_id for node_id in cluster.nodes if node_id != leader)
    address = cluster.nodes[follower].grpc_address
    topic = f"bits-{uuid.uuid4().hex[:6]}"
    value = f"flip-me-{uuid.uuid4().hex}".encode() * 4
    with grpc.insecure_channel(cluster.nodes[leader].grpc_address) as channel:
        stub = kq_pb2_grpc.BrokerStub(channel)
        stub.CreateTopic(kq_pb2.CreateTopicRequest(name=topic, partitions=1), timeout=10)
        produced = stub.Produce(
            kq_pb2.ProduceRequest(topic=topic, partition=0, records=batch(value)), timeout=10
        )
    cluster.wait_applied(produced.index, [follower])
    assert [r.value for r in _fetch(address, topic).records] == [value]

    assert _flip_everywhere(cluster.store_path(follower) / "data.mdb", value) >= 1

    def answer() -> tuple[grpc.StatusCode, int] | bytes:
        try:
            return b"".join(r.value for r in _fetch(address, topic).records)
        except grpc.RpcError as error:
            code = metadata_value(error.trailing_metadata(), ERROR_CODE_METADATA_KEY)
            return error.code(), int(code or 0)

    first = answer()
    assert first in ((grpc.StatusCode.DATA_LOSS, ErrorCode.CORRUPT_DATA), value), first
    wait_for(lambda: answer() == value, "the follower to serve the original bytes again", REPAIR_TIMEOUT_S)
    log = cluster.log_path(follower).read_text()
    assert log.count(f"kq.broker.corruption: corrupt batch in {topic}/0 at offset 0") == 1
    assert log.count(f"kq.broker.corruption: repaired the corrupt batch in {topic}/0 at offset 0") == 1


def test_a_flipped_byte_in_a_followers_journal_is_cut_and_the_follower_catches_up_from_its_peers(
    cluster: LocalCluster,
) -> None:
    """A byte flipped in a stopped follower's Raft journal, under a record in the middle of it: at
    start the node keeps the journal up to the damaged record (each record has a CRC32C) and drops the
    rest, with one log line; its peers send it again what it lacks, its store skips what it had
    applied, and it serves every record, the damaged one's included, byte for byte."""
    leader = cluster.wait_ready()
    follower = next(node_id for node_id in cluster.nodes if node_id != leader)
    topic = f"journal-{uuid.uuid4().hex[:6]}"
    values = [f"entry-{i}-{uuid.uuid4().hex}".encode() * 4 for i in range(20)]
    with grpc.insecure_channel(cluster.nodes[leader].grpc_address) as channel:
        stub = kq_pb2_grpc.BrokerStub(channel)
        stub.CreateTopic(kq_pb2.CreateTopicRequest(name=topic, partitions=1), timeout=10)
        last = None
        for value in values:
            request = kq_pb2.ProduceRequest(topic=topic, partition=0, records=batch(value))
            last = stub.Produce(request, timeout=10)
    assert last is not None
    cluster.wait_applied(last.index, [follower])
    cluster.stop_node(follower)
    journal = cluster.nodes[follower].data_dir / "raft" / "journal.kq"
    assert _flip_everywhere(journal, values[5]) >= 1
    cluster.start_node(follower)
    cluster.wait_ready()
    address = cluster.nodes[follower].grpc_address

    def served() -> list[bytes]:
        with grpc.insecure_channel(address) as channel:
            request = kq_pb2.FetchRequest(topic=topic, partition=0, offset=0, max_records=100)
            response = kq_pb2_grpc.BrokerStub(channel).Fetch(request, timeout=10)
            return [r.value for r in response.records]

    wait_for(lambda: served() == values, "the follower to serve every record again", REPAIR_TIMEOUT_S)
    assert "dropping a torn tail" in cluster.log_path(follower).read_text()
