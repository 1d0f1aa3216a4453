"""The in-process edge: a BrokerService over a fake consensus and a real store, with the interceptor."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from kq.broker.admission import ReaderAdmission, ReaderLimits
from kq.broker.consensus import Peer
from kq.broker.front import FrontEnd, Registration
from kq.broker.group_membership import ClusterChanges
from kq.broker.groups import GroupCoordinator
from kq.broker.groups_view import GroupsView
from kq.broker.membership import Membership, MembershipChanges
from kq.broker.proposals import Batcher, wall_clock_ms
from kq.broker.service import BrokerService
from kq.broker.waiters import AppliedNotifier
from kq.proto import kq_pb2, kq_pb2_grpc
from kq.storage import Store
from tests.broker.fake_consensus import FakeConsensus
from tests.raft.helpers import batch


def produce(
    topic: str, partition: int, *values: bytes, producer: tuple[int, int, int] = (-1, -1, -1)
) -> kq_pb2.ProduceRequest:
    """A produce request for `values` (idempotent when `producer` gives an id, epoch and sequence)."""
    return kq_pb2.ProduceRequest(topic=topic, partition=partition, records=batch(*values, producer=producer))


EDGE_WORKERS = 8  # The in-process server's worker threads.
EDGE_READERS = ReaderLimits(readers_max=4, peer_readers_max=1)  # Small, so tests reach the limits.


@dataclass
class Edge:
    stub: kq_pb2_grpc.BrokerStub
    consensus: FakeConsensus
    store: Store
    channel: grpc.Channel
    address: str
    readers: ReaderAdmission
    front: FrontEnd
    service: BrokerService


class NoVoters:
    """The in-process node's Raft for membership changes: it has no voters to change."""

    def change_membership(self, kind: str, raft_address: str, callback: Callable[[Any, int], None]) -> None:
        """Refused, as PySyncObj refuses a change while another is pending."""
        callback(None, 6)

    def hand_over_leadership(self, callback: Callable[[Any, int], None]) -> None:
        """No follower to hand over to."""
        callback(None, 6)


class _Unreachable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE


def no_answer(grpc_address: str, timeout_s: float) -> kq_pb2.ClusterStatusResponse:
    """No node answers at any address."""
    raise _Unreachable()


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[Edge]:
    store = Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)
    notifier = AppliedNotifier(0)
    consensus = FakeConsensus(store, notifier.notify)
    batcher = Batcher(consensus, wall_clock_ms)
    readers = ReaderAdmission(EDGE_READERS)
    coordinator = GroupCoordinator(store, consensus, wall_clock_ms)
    services: list[Registration] = []
    front = FrontEnd("127.0.0.1:0", EDGE_WORKERS, notifier, services)
    node = Peer("1", "127.0.0.1:1", "127.0.0.1:2")
    membership = Membership(node, (), store)
    service = BrokerService(
        node,
        membership,
        store,
        consensus,
        batcher,
        notifier,
        coordinator,
        readers,
        front.workers,
        front.reads,
        membership_changes=ClusterChanges(
            MembershipChanges(NoVoters(), consensus, membership, kafka=False, probe=no_answer),
            GroupsView(0, 1, lambda: membership.view, consensus.status),
        ),
    )
    services.append(lambda server: kq_pb2_grpc.add_BrokerServicer_to_server(service, server))
    batcher.start()
    coordinator.start()
    address = f"127.0.0.1:{front.start()}"
    channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 8 << 20)])
    stub = kq_pb2_grpc.BrokerStub(channel)
    stub.CreateTopic(kq_pb2.CreateTopicRequest(name="t", partitions=2))
    stub.Produce(produce("t", 0, b"v", b"v", b"v"))
    try:
        yield Edge(stub, consensus, store, channel, address, readers, front, service)
    finally:
        channel.close()
        front.stop()
        batcher.stop()
        coordinator.stop()
        front.close_loop()
        store.close()


def status_of(call: object) -> grpc.StatusCode:
    assert isinstance(call, grpc.RpcError)
    code: grpc.StatusCode = call.code()
    return code


def expect(code: grpc.StatusCode, method: object, request: object) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        method(request)  # type: ignore[operator]
    assert status_of(caught.value) == code, caught.value
    details = str(caught.value.details())
    assert "\n" not in details
    return details
