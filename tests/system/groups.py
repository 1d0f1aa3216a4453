"""What the system tests of worker processes (`kq-node --processes`) ask each worker: its status,
and each Raft group's leader once the group's running replicas agree on it."""

from __future__ import annotations

import grpc

from kq.broker.workers import shifted
from kq.deploy.cluster import LocalCluster
from kq.proto import kq_pb2, kq_pb2_grpc


def group_status(cluster: LocalCluster, node_id: str, group: int) -> kq_pb2.ClusterStatusResponse | None:
    """ClusterStatus of `node_id`'s worker of `group` (None: it does not answer)."""
    address = shifted(cluster.nodes[node_id].grpc_address, group)
    with grpc.insecure_channel(address) as channel:
        try:
            return kq_pb2_grpc.BrokerStub(channel).ClusterStatus(kq_pb2.ClusterStatusRequest(), timeout=2)
        except grpc.RpcError:
            return None


def agreed_leaders(cluster: LocalCluster, node_ids: list[str]) -> dict[int, str] | None:
    """Each group's leader when every worker of `node_ids` answers and its group agrees on one."""
    leaders: dict[int, str] = {}
    for group in range(cluster.processes):
        statuses = [group_status(cluster, node_id, group) for node_id in node_ids]
        named = {status.leader_id for status in statuses if status is not None}
        if None in statuses or len(named) != 1 or "" in named:
            return None
        leaders[group] = named.pop()
    return leaders
