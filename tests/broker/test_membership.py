"""Membership in-process: the view every RPC reads, apply of member commands, and AddNode/RemoveNode's
checks on the leader, with a fake Raft node whose voters change when told to."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from kq.broker.consensus import ConsensusStatus, Peer
from kq.broker.errors import InvalidArgumentError, MembershipError, NotLeaderError
from kq.broker.kafka.base import KafkaSettings
from kq.broker.membership import Membership, MembershipChanges, derived_cluster_id
from kq.proto import kq_pb2
from kq.raft import commands
from kq.raft.results import ErrorCode, MemberResult
from kq.raft.state_machine import apply
from kq.storage import Store
from tests.broker.fake_consensus import FakeConsensus

SELF = Peer("1", "127.0.0.1:7001", "127.0.0.1:8001", "127.0.0.1:9001")
TWO = Peer("2", "127.0.0.1:7002", "127.0.0.1:8002", "127.0.0.1:9002")
THREE = Peer("3", "127.0.0.1:7003", "127.0.0.1:8003", "127.0.0.1:9003")
NEW = kq_pb2.Member(
    node_id="4", raft_address="127.0.0.1:7004", grpc_address="127.0.0.1:8004", kafka_address="127.0.0.1:9004"
)


class Voters:
    """A Raft node's voter set that MEMBERSHIP proposals change at once (as a commit would)."""

    def __init__(self, addresses: set[str]) -> None:
        self.addresses = addresses
        self.on_change: Callable[[], None] = lambda: None
        self.handed_over = 0

    def current(self) -> frozenset[str]:
        return frozenset(self.addresses)

    def change_membership(self, kind: str, raft_address: str, callback: Callable[[Any, int], None]) -> None:
        (self.addresses.add if kind == "add" else self.addresses.discard)(raft_address)
        self.on_change()
        callback(None, 0)

    def hand_over_leadership(self, callback: Callable[[Any, int], None]) -> None:
        self.handed_over += 1
        callback(None, 0)


class Cluster:
    """One leader's parts: store, fake consensus (connected to the peers the test says), membership."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.consensus = ConnectedConsensus(store)
        self.voters = Voters({SELF.raft_address, TWO.raft_address, THREE.raft_address})
        self.membership = Membership(SELF, (TWO, THREE), store, self.voters.current)
        self.voters.on_change = self.membership.refresh
        self.consensus.after_apply = self.membership.on_applied
        self.probed: list[str] = []

    def changes(self, kafka: bool = True, answer_as: str = "4") -> MembershipChanges:
        def probe(address: str, timeout_s: float) -> kq_pb2.ClusterStatusResponse:
            self.probed.append(address)
            return kq_pb2.ClusterStatusResponse(node_id=answer_as, raft_address=NEW.raft_address)

        return MembershipChanges(self.voters, self.consensus, self.membership, kafka, probe)


class ConnectedConsensus(FakeConsensus):
    """A leader connected to the peers in `connected`; applied results go to `after_apply`."""

    def __init__(self, store: Store) -> None:
        super().__init__(store, lambda index: None)
        self.connected = {"2": True, "3": True, "4": True}
        self.after_apply: Callable[[Any], None] = lambda result: None

    def propose(self, data: bytes, callback: Callable[[Any, int], None]) -> None:
        def applied(result: Any, reason: int) -> None:
            self.after_apply(result)
            callback(result, reason)

        super().propose(data, applied)

    def status(self) -> ConsensusStatus:
        index = self.store.applied_index()
        return ConsensusStatus(
            "leader", "1", SELF.grpc_address, 1, index, index, dict(self.connected), True, 1
        )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    store = Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)
    try:
        yield Cluster(store)
    finally:
        store.close()


def test_the_view_maps_voters_to_addresses_and_keeps_the_first_cluster_id(cluster: Cluster) -> None:
    """Configured members until one registers; a registered voter is named; the cluster id recorded
    first stays, whatever later entries carry."""
    view = cluster.membership.view
    assert [peer.node_id for peer in view.members] == ["1", "2", "3"]
    assert view.cluster_id == derived_cluster_id([SELF.raft_address, TWO.raft_address, THREE.raft_address])
    first = view.cluster_id
    cluster.changes().add(NEW)
    view = cluster.membership.view
    assert [peer.node_id for peer in view.members] == ["1", "2", "3", "4"]
    assert view.member("4") == Peer("4", NEW.raft_address, NEW.grpc_address, NEW.kafka_address)
    assert view.cluster_id == first
    index = cluster.store.applied_index() + 1
    apply(cluster.store, index, commands.encode(commands.register_member(NEW, "another-id")))
    cluster.membership.refresh()
    assert cluster.membership.view.cluster_id == first
    brokers = KafkaSettings(lambda: cluster.membership.view, 1, True, 1).brokers
    assert [broker.broker_id for broker in brokers] == [1, 2, 3, 4]


def test_add_checks_the_node_answers_and_is_the_one_asked_for(cluster: Cluster) -> None:
    """The probe names another node: nothing is registered, no voter added."""
    with pytest.raises(MembershipError, match="is node 5"):
        cluster.changes(answer_as="5").add(NEW)
    assert cluster.probed == [NEW.grpc_address]
    assert cluster.voters.addresses == {SELF.raft_address, TWO.raft_address, THREE.raft_address}
    assert cluster.membership.view.registered == frozenset()


def test_add_is_idempotent_and_refuses_taken_ids_and_addresses(cluster: Cluster) -> None:
    changes = cluster.changes()
    changes.add(NEW)
    proposals = cluster.consensus.proposals
    assert changes.add(NEW).member("4") is not None
    assert cluster.consensus.proposals == proposals, "adding a member again proposes nothing"
    moved = kq_pb2.Member()
    moved.CopyFrom(NEW)
    moved.raft_address = "127.0.0.1:7999"
    with pytest.raises(MembershipError, match="a member already"):
        changes.add(moved)
    taken = kq_pb2.Member(node_id="5", raft_address=TWO.raft_address, grpc_address="127.0.0.1:8005")
    with pytest.raises(MembershipError, match="Raft address of node 2"):
        cluster.changes(kafka=False).add(taken)


def test_a_kafka_cluster_needs_integer_ids_and_kafka_addresses(cluster: Cluster) -> None:
    named = kq_pb2.Member(node_id="n4", raft_address="127.0.0.1:7004", grpc_address="127.0.0.1:8004")
    with pytest.raises(InvalidArgumentError, match="integer id and a Kafka address"):
        cluster.changes(kafka=True).add(named)
    with pytest.raises(InvalidArgumentError, match="Raft address must be host:port"):
        cluster.changes().add(kq_pb2.Member(node_id="4", raft_address="x", grpc_address="127.0.0.1:1"))


def test_changes_that_would_leave_no_majority_running_are_refused(cluster: Cluster) -> None:
    """Three voters, two down: adding a fourth leaves 2 of 4 running. One down: removing a live
    follower leaves 1 of 2; removing the down one leaves 2 of 2 and goes ahead."""
    cluster.consensus.connected = {"2": False, "3": False}
    with pytest.raises(MembershipError, match="no majority"):
        cluster.changes().add(NEW)
    cluster.consensus.connected = {"2": True, "3": False}
    with pytest.raises(MembershipError, match="no majority"):
        cluster.changes().remove("2")
    view = cluster.changes().remove("3")  # The dead node: 2 of 2 voters left running.
    assert [peer.node_id for peer in view.members] == ["1", "2"]
    assert cluster.voters.addresses == {SELF.raft_address, TWO.raft_address}


def test_removing_the_leader_hands_over_and_redirects(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader asked to remove itself hands its leadership over and answers NOT_LEADER, naming the
    new leader, without proposing anything."""
    cluster.consensus.leader = False
    cluster.consensus.leader_address = TWO.grpc_address
    with pytest.raises(NotLeaderError) as raised:
        cluster.changes().remove("1")
    assert raised.value.code == ErrorCode.NOT_LEADER and TWO.grpc_address in str(raised.value)
    assert cluster.voters.handed_over == 1 and cluster.consensus.proposals == 0


def test_removing_a_configured_node_again_is_no_error(cluster: Cluster) -> None:
    """A retry after the leader died having committed the removal of a node from --peers (never
    registered): done already, nothing proposed."""
    cluster.changes().remove("3")
    proposals = cluster.consensus.proposals
    assert cluster.changes().remove("3").member("3") is None
    assert cluster.consensus.proposals == proposals


def test_a_registered_node_that_left_the_voters_is_forgotten_on_remove(cluster: Cluster) -> None:
    """A removal cut short after the MEMBERSHIP entry: removing again forgets the addresses."""
    cluster.changes().add(NEW)
    cluster.voters.addresses.discard(NEW.raft_address)
    cluster.membership.refresh()
    view = cluster.changes().remove("4")
    assert view.registered == frozenset() and view.member("4") is None


def test_apply_refuses_an_address_of_another_registered_member(tmp_path: Path) -> None:
    """Deterministic, on every replica: the second member with the same gRPC address is refused."""
    store = Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)
    try:
        assert apply(store, 1, commands.encode(commands.register_member(NEW, ""))) == MemberResult(
            ErrorCode.OK
        )
        clash = kq_pb2.Member(node_id="5", raft_address="127.0.0.1:7005", grpc_address=NEW.grpc_address)
        refused = apply(store, 2, commands.encode(commands.register_member(clash, "")))
        assert refused == MemberResult(ErrorCode.MEMBERSHIP_REFUSED)
        with store.read() as reader:
            assert [node_id for node_id, _ in reader.members()] == ["4"] and reader.cluster_id() == ""
        assert apply(store, 3, commands.encode(commands.unregister_member("4"))) == MemberResult(ErrorCode.OK)
        with store.read() as reader:
            assert reader.members() == []
    finally:
        store.close()


def test_probe_failures_are_refusals_with_the_reason(cluster: Cluster) -> None:
    """A gRPC error from the probe becomes MEMBERSHIP_REFUSED naming the status (not INTERNAL)."""

    class Refused(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

    def probe(address: str, timeout_s: float) -> kq_pb2.ClusterStatusResponse:
        raise Refused()

    changes = MembershipChanges(cluster.voters, cluster.consensus, cluster.membership, True, probe)
    with pytest.raises(MembershipError, match=r"does not answer at 127.0.0.1:8004 \(UNAVAILABLE\)"):
        changes.add(NEW)
    assert cluster.consensus.proposals == 0
