"""Reads every partition of a topic, and a group's committed offsets, from every node, for the checker.

Retention and compaction keep working after the load stops (the leader trims or compacts what has
become due), and every node must be read in the same state: a read counts only when every node
reported the same applied Raft index before it and after it, so no entry, and with it no trim or
compaction, was applied anywhere while the nodes were read. Otherwise it is read again, a little
later, a bounded number of times. Every client reaches the nodes with the run's `tls` (None: plain
text).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kq.chaos.checker import NodeLogs, PartitionLog
from kq.client import ConsumerRecord, KqClient, OffsetOutOfRangeError, TlsConfig

logger = logging.getLogger(__name__)

READ_RETRY_TIMEOUT_S = 10.0
READ_ATTEMPTS_MAX = 10  # Reads of every node until one is stable (see the module docstring).
READ_AGAIN_AFTER_S = 1.0  # Pause before reading again: longer than the retention and compaction checks.
READ_BATCH_RECORDS = 5_000
READ_BATCH_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class StableRead:
    """Every node's logs, and whether they were read in one state (else the last attempt's logs)."""

    logs: NodeLogs
    stable: bool
    attempts: int
    applied_index: int  # The one applied index every node held while read (of the last attempt).


class _AfterIndexClient(KqClient):
    """A client to one node whose reads wait until the node applied `min_index` (else UNAVAILABLE)."""

    def __init__(self, address: str, min_index: int, tls: TlsConfig | None) -> None:
        super().__init__([address], retry_timeout_s=READ_RETRY_TIMEOUT_S, tls=tls)
        self._saw(min_index)  # Reads carry the highest index seen as their min_index.


def _partition_log(
    client: KqClient, topic: str, partition: int, node: str, start: int, end: int
) -> PartitionLog:
    """The records of one partition as `node` holds them, from `start` to `end` (its log start and end).

    Offsets may skip (compaction leaves gaps: each answer says where to read next), and an answer
    without records or a next offset beyond the one asked means the node holds nothing more below
    `end`: reads pass min_index 0, so a node never answers empty for want of an index. The checker
    judges what is missing.
    """
    records: list[ConsumerRecord] = []
    offset = start
    while offset < end:
        batch = client.fetch(
            topic,
            partition,
            offset,
            max_records=READ_BATCH_RECORDS,
            max_bytes=READ_BATCH_BYTES,
            node=node,
            min_index=0,
        )
        if batch.next_offset <= offset:
            break
        records += (record for record in batch.records if record.offset < end)
        offset = batch.next_offset
    return PartitionLog(start, end, tuple(records))


def _applied_index(topic: str, address: str, tls: TlsConfig | None) -> int:
    """The Raft index `address`'s store has applied (which also proves the topic is there)."""
    with KqClient([address], retry_timeout_s=READ_RETRY_TIMEOUT_S, tls=tls) as client:
        return client.describe_topic(topic, address).applied_index


def _read_once(
    topic: str, nodes: dict[str, str], partitions: Sequence[int] | None, tls: TlsConfig | None
) -> NodeLogs:
    """node id -> partition -> log, for every node id -> gRPC address in `nodes`."""
    logs: dict[str, dict[int, PartitionLog]] = {}
    for node_id, address in nodes.items():
        with KqClient([address], retry_timeout_s=READ_RETRY_TIMEOUT_S, tls=tls) as client:
            offsets = client.list_offsets(topic, address)
            chosen = partitions if partitions is not None else sorted(offsets)
            logs[node_id] = {
                p: _partition_log(
                    client, topic, p, address, offsets[p].log_start_offset, offsets[p].log_end_offset
                )
                for p in chosen
            }
    return logs


def read_everything(
    topic: str,
    nodes: dict[str, str],
    partitions: Sequence[int] | None = None,
    attempts: int = READ_ATTEMPTS_MAX,
    tls: TlsConfig | None = None,
) -> StableRead:
    """Every node's logs of `topic`, read in one state of the cluster (see the module docstring)."""
    logs: NodeLogs = {}
    indexes: set[int] = set()
    for attempt in range(1, attempts + 1):
        before = {node: _applied_index(topic, address, tls) for node, address in nodes.items()}
        try:
            logs = _read_once(topic, nodes, partitions, tls)
        except OffsetOutOfRangeError as error:  # A trim moved a log start while the node was read.
            logger.info("read attempt %d: %s", attempt, error)
            indexes = set()
        else:
            after = {node: _applied_index(topic, address, tls) for node, address in nodes.items()}
            indexes = set(before.values()) | set(after.values())
            if len(indexes) == 1:
                return StableRead(logs, True, attempt, indexes.pop())
            logger.info("read attempt %d: applied indexes moved: %s then %s", attempt, before, after)
        time.sleep(READ_AGAIN_AFTER_S)
    if not logs:  # Every attempt met a trim: one more read, unchecked for stability.
        logs = _read_once(topic, nodes, partitions, tls)
    return StableRead(logs, False, attempts, max(indexes, default=0))


def read_group_offsets(
    group: str, topic: str, nodes: dict[str, str], tls: TlsConfig | None = None
) -> dict[str, dict[int, int]]:
    """node id -> partition -> the group's committed offset on `topic`, as each node holds it.

    Every node is asked at one Raft index (FetchOffsets' min_index): the highest applied index any
    node's store reports. Not the leader's commit index: that counts Raft's own no-op entries (one
    per election), which a store never records, so a node would wait for it forever.
    """
    applied_index = 0
    for address in nodes.values():
        with KqClient([address], retry_timeout_s=READ_RETRY_TIMEOUT_S, tls=tls) as client:
            client.committed_offsets(group, node=address)
            applied_index = max(applied_index, client.index_seen)
    offsets: dict[str, dict[int, int]] = {}
    for node_id, address in nodes.items():
        with _AfterIndexClient(address, applied_index, tls) as client:
            committed = client.committed_offsets(group, node=address)
        offsets[node_id] = {p: offset for (t, p), offset in committed.items() if t == topic}
    return offsets
