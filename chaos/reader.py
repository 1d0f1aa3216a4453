"""Reads every partition of a topic, and a group's committed offsets, from every node, for the checker."""

from __future__ import annotations

from collections.abc import Sequence

from kq.chaos.checker import NodeLogs, PartitionLog
from kq.client import ConsumerRecord, KqClient

READ_BATCH_RECORDS = 5_000
READ_BATCH_BYTES = 4 << 20
READ_RETRY_TIMEOUT_S = 10.0


class _AfterIndexClient(KqClient):
    """A client to one node whose reads wait until the node applied `min_index` (else UNAVAILABLE)."""

    def __init__(self, address: str, min_index: int) -> None:
        super().__init__([address], retry_timeout_s=READ_RETRY_TIMEOUT_S)
        self._saw(min_index)  # Reads carry the highest index seen as their min_index.


class ReadError(RuntimeError):
    """A node returned no records below the log end it reported."""


def read_partition(
    client: KqClient, topic: str, partition: int, node: str, log_start: int, log_end: int
) -> PartitionLog:
    """The records of one partition as `node` holds them, from `log_start` to `log_end`."""
    records: list[ConsumerRecord] = []
    offset = log_start
    while offset < log_end:
        batch = client.fetch(
            topic,
            partition,
            offset,
            max_records=READ_BATCH_RECORDS,
            max_bytes=READ_BATCH_BYTES,
            node=node,
            min_index=0,
        )
        if not batch.records:
            raise ReadError(f"node {node} returned nothing at offset {offset} below its log end {log_end}")
        records += (record for record in batch.records if record.offset < log_end)
        offset = batch.records[-1].offset + 1
    return PartitionLog(log_start, log_end, tuple(records))


def read_everything(topic: str, nodes: dict[str, str], partitions: Sequence[int] | None = None) -> NodeLogs:
    """node id -> partition -> log, for every node id -> gRPC address in `nodes`."""
    logs: dict[str, dict[int, PartitionLog]] = {}
    for node_id, address in nodes.items():
        with KqClient([address], retry_timeout_s=READ_RETRY_TIMEOUT_S) as client:
            offsets = client.list_offsets(topic, address)
            chosen = partitions if partitions is not None else sorted(offsets)
            logs[node_id] = {
                p: read_partition(
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
