"""Membership changes of nodes with worker processes (broker/group_membership.py): AddNode and RemoveNode
change the voters of every Raft group, groups 1.. first and group 0 last, and a change cut short
between groups is completed by asking again."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kq.broker.workers import shifted
from kq.client import KqClient, MembershipRefusedError
from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for
from kq.proto import kq_pb2, kq_pb2_grpc
from tests.system.checks import read_everywhere
from tests.system.groups import agreed_leaders, group_status
from tests.system.test_operate import http_get

pytestmark = pytest.mark.system

PROCESSES = 2
PARTITIONS = 4
RECORDS = 40
WAIT_S = 60.0
ELECTION_TIMEOUT_MAX_S = 1.0  # The nodes' default --election-timeout-max-ms.


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", processes=PROCESSES) as local:
        yield local


def voters(cluster: LocalCluster, node_id: str, group: int) -> set[str] | None:
    """The voters of `group` as `node_id`'s process of it sees them (None: it does not answer)."""
    status = group_status(cluster, node_id, group)
    if status is None:
        return None
    return {status.node_id, *(peer.node_id for peer in status.peers)}


def every_group_has(cluster: LocalCluster, expected: set[str]) -> bool:
    """Whether every running member's process of every group sees exactly `expected` as voters."""
    return all(
        voters(cluster, node_id, group) == expected
        for node_id in cluster.nodes
        if cluster.running(node_id)
        for group in range(PROCESSES)
    )


def one_group_part(
    cluster: LocalCluster, group: int, request: kq_pb2.AddNodeRequest | kq_pb2.RemoveNodeRequest
) -> None:
    """What group 0's leader sends a group's leader: that group's part of a change alone (a change cut
    short after it); sent again while the leader moves (the balancer spreads leaders after a start)."""

    def sent() -> bool:
        status = group_status(cluster, "1", group)
        if status is None or not status.leader_address:
            return False
        with grpc.insecure_channel(status.leader_address) as channel:
            stub = kq_pb2_grpc.BrokerStub(channel)
            try:
                if isinstance(request, kq_pb2.AddNodeRequest):
                    stub.AddNode(request, timeout=WAIT_S)
                else:
                    stub.RemoveNode(request, timeout=WAIT_S)
            except grpc.RpcError as error:
                if error.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE):
                    return False  # Not the leader (any more), or none.
                raise
        return True

    wait_for(sent, f"group {group}'s part of the change", WAIT_S)


def test_a_node_of_workers_joins_every_group_and_the_leader_leaves_them_all(cluster: LocalCluster) -> None:
    """A 4th node with two workers joins both groups (a change cut short after group 1 is completed by
    asking again), catches up every partition of both groups and is named in Kafka's metadata; then
    group 0's leader node is removed from both groups (it hands over first; a removal cut short after
    group 1 completes too) and writes to every partition go on."""
    topic = f"m-{uuid.uuid4().hex[:8]}"
    with KqClient(cluster.bootstrap) as client:
        client.create_topic(topic, partitions=PARTITIONS)
        assert {client.partition_group(topic, p) for p in range(PARTITIONS)} == set(range(PROCESSES))
        last: dict[int, int] = {}  # The last write's Raft index, by group.
        for i in range(RECORDS):
            sent = client.send(topic, f"v{i}".encode(), partition=i % PARTITIONS)
            last[client.partition_group(topic, sent.partition)] = sent.index

    spec = cluster.new_node_spec()
    cluster.start_joining(spec.node_id, WAIT_S)
    wait_for(lambda: group_status(cluster, spec.node_id, 1), "the new node's worker of group 1", WAIT_S)
    member = kq_pb2.Member(
        node_id=spec.node_id,
        raft_address=shifted(spec.raft_address, 1),
        grpc_address=shifted(spec.grpc_address, 1),
        kafka_address=shifted(spec.kafka_address, 1),
    )
    one_group_part(cluster, 1, kq_pb2.AddNodeRequest(member=member, group=1))
    assert voters(cluster, "1", 1) == {"1", "2", "3", "4"}  # Cut short: group 1 only.
    assert voters(cluster, "1", 0) == {"1", "2", "3"}
    with KqClient(cluster.bootstrap) as client:
        members = client.add_node(spec.node_id, spec.raft_address, spec.grpc_address, spec.kafka_address)
        assert sorted(m.node_id for m in members) == ["1", "2", "3", "4"]
        wait_for(lambda: every_group_has(cluster, {"1", "2", "3", "4"}), "every group's voters", WAIT_S)
        cluster.wait_ready(WAIT_S)
        for group, index in last.items():
            cluster.wait_applied(index, [spec.node_id], WAIT_S, group=group)
        held = read_everywhere(client, topic, PARTITIONS, [spec.grpc_address, *cluster.bootstrap[:1]])
        assert sum(map(len, held[spec.grpc_address].values())) == RECORDS

    confluent_kafka = pytest.importorskip("confluent_kafka.admin")
    admin = confluent_kafka.AdminClient({"bootstrap.servers": spec.kafka_address})
    brokers = wait_for(
        lambda: b if len(b := admin.list_topics(timeout=10).brokers) == 8 else None, "8 brokers", WAIT_S
    )
    assert sorted(brokers) == [1, 2, 3, 4, 1001, 1002, 1003, 1004]

    leader = cluster.wait_ready(WAIT_S)  # Group 0's.
    one_group_part(cluster, 1, kq_pb2.RemoveNodeRequest(node_id=leader, group=1))
    remaining = {"1", "2", "3", "4"} - {leader}
    assert voters(cluster, spec.node_id, 1) == remaining
    others = [s.grpc_address for n, s in cluster.nodes.items() if n != leader]
    with KqClient(others) as client:
        members = client.remove_node(leader)  # Handed over, retried at group 0's next leader.
        assert {m.node_id for m in members} == remaining
    cluster.stop_node(leader)
    del cluster.nodes[leader]
    wait_for(lambda: every_group_has(cluster, remaining), "every group's voters after the removal", WAIT_S)
    with KqClient([s.grpc_address for s in cluster.nodes.values()]) as client:
        after = [client.send(topic, b"after", partition=p) for p in range(PARTITIONS)]
        assert [r.offset for r in after] == [RECORDS // PARTITIONS] * PARTITIONS
        with pytest.raises(MembershipRefusedError, match="not a member"):
            client.remove_node("9")


def test_a_node_with_another_number_of_workers_is_refused(cluster: LocalCluster) -> None:
    """A node started with --processes 1 cannot join a cluster of two groups: MEMBERSHIP_REFUSED with
    the flag to start it with, and no group's voters change."""
    spec = cluster.new_node_spec()
    cluster.set_node_args(spec.node_id, ("--processes", "1"))
    cluster.start_joining(spec.node_id, WAIT_S)
    with KqClient(cluster.bootstrap) as client, pytest.raises(MembershipRefusedError, match="--processes 2"):
        client.add_node(spec.node_id, spec.raft_address, spec.grpc_address, spec.kafka_address)
    cluster.stop_node(spec.node_id)
    del cluster.nodes[spec.node_id]
    assert every_group_has(cluster, {"1", "2", "3"})


def test_a_removed_node_that_still_runs_says_so_in_every_group(cluster: LocalCluster) -> None:
    """A node removed while it runs (not stopped) hears it from each group's leader: every worker
    reports the role `removed` and logs it once, /readyz says not ready with the reason, its terms stop
    growing, and the other nodes keep committing and keep their terms while its elections come due."""
    topic = f"r-{uuid.uuid4().hex[:8]}"
    cluster.wait_ready(WAIT_S)

    def spread() -> dict[int, str] | None:
        """The groups' leaders once the balancer gave them to two nodes: the third then leads none,
        and removing it leaves nothing to move (a hand-over would raise a term)."""
        leaders = agreed_leaders(cluster, list(cluster.nodes))
        return leaders if leaders is not None and len(set(leaders.values())) == PROCESSES else None

    leaders = wait_for(spread, "the leaders spread over two nodes", WAIT_S)
    removed = next(node for node in cluster.nodes if node not in leaders.values())
    others = [spec.grpc_address for node, spec in cluster.nodes.items() if node != removed]
    with KqClient(others) as client:
        client.create_topic(topic, partitions=PARTITIONS)
        members = client.remove_node(removed)  # Not stopped afterwards.
        assert removed not in {member.node_id for member in members}

    def roles() -> list[str]:
        statuses = [group_status(cluster, removed, group) for group in range(PROCESSES)]
        return [status.role if status is not None else "" for status in statuses]

    wait_for(lambda: roles() == ["removed"] * PROCESSES, "every worker of the removed node to know", WAIT_S)
    terms = _terms(cluster, [removed])
    kept = _terms(cluster, [node for node in cluster.nodes if node != removed])
    status, body = http_get(f"http://{cluster.nodes[removed].http_address}/readyz")
    assert status == 503 and "removed" in str(body["reason"])
    # Bounded polling, no timing asserted: writes commit while several of its elections come due.
    until = time.monotonic() + 4 * ELECTION_TIMEOUT_MAX_S
    with KqClient(others) as client:
        sent = 0
        while time.monotonic() < until or sent < RECORDS:
            client.send(topic, f"v{sent}".encode(), partition=sent % PARTITIONS)
            sent += 1
    assert _terms(cluster, [removed]) == terms, "the removed node stood for election"
    assert _terms(cluster, [node for node in cluster.nodes if node != removed]) == kept, "a re-election"
    assert roles() == ["removed"] * PROCESSES
    assert cluster.log_path(removed).read_text().count("was removed from the cluster") == PROCESSES


def _terms(cluster: LocalCluster, node_ids: list[str]) -> list[int]:
    """The Raft term of each worker of each of `node_ids` (-1: it does not answer)."""
    statuses = [group_status(cluster, node, group) for node in node_ids for group in range(PROCESSES)]
    return [status.term if status is not None else -1 for status in statuses]
