"""Reads every partition of a topic, and a group's committed offsets, from every node, for the checker."""

from __future__ import annotations

from collections.abc import Sequence

from kq.chaos.checker import NodeLogs, PartitionLog
from kq.client import KqClient
from kq.deploy.reading import read_partition

READ_RETRY_TIMEOUT_S = 10.0


class _AfterIndexClient(KqClient):
    """A client to one node whose reads wait until the node applied `min_index` (else UNAVAILABLE)."""

    def __init__(self, address: str, min_index: int) -> None:
        super().__init__([address], retry_timeout_s=READ_RETRY_TIMEOUT_S)
        self._saw(min_index)  # Reads carry the highest index seen as their min_index.


def _partition_log(
    client: KqClient, topic: str, partition: int, node: str, start: int, end: int
) -> PartitionLog:
    """The records of one partition as `node` holds them, from `start` to `end` (its log start and end)."""
    records = read_partition(client, topic, partition, node, start, end, min_index=0)
    return PartitionLog(start, end, tuple(records))


def read_everything(topic: str, nodes: dict[str, str], partitions: Sequence[int] | None = None) -> NodeLogs:
    """node id -> partition -> log, for every node id -> gRPC address in `nodes`."""
    logs: dict[str, dict[int, PartitionLog]] = {}
    for node_id, address in nodes.items():
        with KqClient([address], retry_timeout_s=READ_RETRY_TIMEOUT_S) as client:
            offsets = client.list_offsets(topic, address)
            chosen = partitions if partitions is not None else sorted(offsets)
            logs[node_id] = {
                p: _partition_log(
                    client, topic, p, address, offsets[p].log_start_offset, offsets[p].log_end_offset
                )
                for p in chosen
            }
    return logs


def read_group_offsets(group: str, topic: str, nodes: dict[str, str]) -> dict[str, dict[int, int]]:
    """node id -> partition -> the group's committed offset on `topic`, as each node holds it.

    Every node is asked at one Raft index (FetchOffsets' min_index): the highest applied index any
    node's store reports. Not the leader's commit index: that counts Raft's own no-op entries (one
    per election), which a store never records, so a node would wait for it forever.
    """
    applied_index = 0
    for address in nodes.values():
        with KqClient([address], retry_timeout_s=READ_RETRY_TIMEOUT_S) as client:
            client.committed_offsets(group, node=address)
            applied_index = max(applied_index, client.index_seen)
    offsets: dict[str, dict[int, int]] = {}
    for node_id, address in nodes.items():
        with _AfterIndexClient(address, applied_index) as client:
            committed = client.committed_offsets(group, node=address)
        offsets[node_id] = {p: offset for (t, p), offset in committed.items() if t == topic}
    return offsets
