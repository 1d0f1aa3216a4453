"""Driver side: who the nodes are and who leads, the partitions a query reads, one snapshot of their offsets.

`ClusterView` and `read_candidates` are plain values and a pure function; `discover` and
`take_snapshot` are the driver's only calls to the cluster while planning: one ClusterStatus per
node named in kq.nodes, then one ListOffsets per topic, on the leader when there is one (so that an
acknowledged write is always in the snapshot, whichever node then serves the fetches).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from kq.client import (
    InvalidRequestError,
    KqClient,
    KqClientError,
    NodeStatus,
    PartitionOffsets,
    TopicNotFoundError,
    UnavailableError,
)
from kq.proto.limits import SPARK_PLANNING_RETRY_TIMEOUT_S, SPARK_PLANNING_RPC_TIMEOUT_S
from kq.spark.options import (
    KqSourceError,
    ReadFrom,
    SourceOptions,
    Subscription,
    SubscriptionKind,
    TopicPartition,
)
from kq.spark.options import option_error as _option_error

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The nodes (id and gRPC address, sorted by id) and the leader's id ("" when none is known)."""

    nodes: tuple[tuple[str, str], ...]
    leader_id: str

    @property
    def addresses(self) -> tuple[str, ...]:
        """Every node's address, in node id order."""
        return tuple(address for _, address in self.nodes)

    @property
    def leader_address(self) -> str | None:
        """The leader's address, or None."""
        return next((address for node_id, address in self.nodes if node_id == self.leader_id), None)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Log start and end of every partition a query reads, and the Raft index they were read at."""

    offsets: dict[TopicPartition, PartitionOffsets]
    applied_index: int

    def min_index(self, topic: str, partition: int) -> int:
        """The Raft index a node must have applied to serve the partition's planned range: the one
        the offsets were read at, which is group 0's. Raft indexes count per group, so a partition of
        another group (nodes with worker processes: DESIGN.md, "Scale-out") waits for none; a reader
        behind its planned end moves on to another node as for any range it cannot finish."""
        offsets = self.offsets.get(TopicPartition(topic, partition))
        return self.applied_index if offsets is None or offsets.group == 0 else 0


def read_candidates(view: ClusterView, read_from: ReadFrom, pinned_node: str, slot: int) -> tuple[str, ...]:
    """The nodes an input partition tries, in order; `slot` spreads input partitions over the nodes."""
    if read_from is ReadFrom.NODE:
        return (pinned_node,)
    leader = view.leader_address
    followers = [address for address in view.addresses if address != leader]
    if read_from is ReadFrom.ANY or leader is None or not followers:
        return _rotated(list(view.addresses), slot)
    if read_from is ReadFrom.LEADER:
        return (leader, *_rotated(followers, slot))
    return (*_rotated(followers, slot), leader)  # FOLLOWER: the leader only when no follower can serve.


def _rotated(addresses: list[str], slot: int) -> tuple[str, ...]:
    shift = slot % len(addresses)
    return tuple(addresses[shift:] + addresses[:shift])


def planning_client(options: SourceOptions) -> KqClient:
    """A client for the driver's planning calls (closed by the caller)."""
    return KqClient(
        list(options.nodes),
        retry_timeout_s=SPARK_PLANNING_RETRY_TIMEOUT_S,
        rpc_timeout_s=SPARK_PLANNING_RPC_TIMEOUT_S,
    )


def discover(client: KqClient) -> ClusterView:
    """The nodes every answering node of kq.nodes knows, and the leader the highest term reports."""
    statuses = [status for status in client.cluster_status() if isinstance(status, NodeStatus)]
    if not statuses:
        raise _option_error("kq.nodes", f"no node of {', '.join(client.bootstrap)} answered")
    addresses: dict[str, str] = {}
    for status in statuses:
        for peer in status.peers:
            addresses.setdefault(peer.node_id, peer.grpc_address)
    for status in statuses:  # The address the user gave wins over the one peers know a node by.
        addresses[status.node_id] = status.address
    leading = [status for status in statuses if status.leader_id]
    leader_id = max(leading, key=lambda status: status.term).leader_id if leading else ""
    return ClusterView(tuple(sorted(addresses.items())), leader_id)


def take_snapshot(
    client: KqClient, subscription: Subscription, leader: str | None, *, missing_ok: bool = False
) -> Snapshot:
    """The offsets of every partition the subscription reads, as the leader (else any node) sees them.

    A subscribed or assigned topic that does not exist is an error naming the option, unless
    `missing_ok` (a running stream, where a deleted topic is a matter for failOnDataLoss).
    """
    try:
        try:
            offsets = _offsets(client, subscription, leader, missing_ok)
        except UnavailableError as error:
            if leader is None:
                raise
            # The leader went away since discovery: any node's view will do (it may lag a little).
            logger.warning(
                "kq source: leader %s unavailable (%s); reading offsets from any node", leader, error
            )
            offsets = _offsets(client, subscription, None, missing_ok)
    except KqClientError as error:
        raise KqSourceError(
            f"kq source: cannot read the partitions' offsets from the cluster: {error}"
        ) from None
    return Snapshot(offsets, client.index_seen)


def _offsets(
    client: KqClient, subscription: Subscription, node: str | None, missing_ok: bool
) -> dict[TopicPartition, PartitionOffsets]:
    option = subscription.kind.value
    offsets: dict[TopicPartition, PartitionOffsets] = {}
    for topic in _topics(client, subscription, node):
        try:
            by_partition = client.list_offsets(topic, node)
        except TopicNotFoundError:
            if missing_ok:
                continue
            raise _option_error(option, f"unknown topic {topic!r}") from None
        except InvalidRequestError as error:
            raise _option_error(option, f"topic {topic!r}: {error}") from None
        offsets.update({TopicPartition(topic, p): o for p, o in by_partition.items()})
    if subscription.kind is not SubscriptionKind.ASSIGN:
        return offsets
    assigned = set(subscription.partitions)
    absent = [
        tp for tp in subscription.partitions if tp not in offsets and tp.topic in {t.topic for t in offsets}
    ]
    if absent and not missing_ok:
        raise _option_error(
            "assign", f"no such partition: {', '.join(f'{tp.topic}-{tp.partition}' for tp in absent)}"
        )
    return {tp: o for tp, o in offsets.items() if tp in assigned}


def _topics(client: KqClient, subscription: Subscription, node: str | None) -> list[str]:
    if subscription.kind is not SubscriptionKind.SUBSCRIBE_PATTERN:
        return list(subscription.topics)
    pattern = re.compile(subscription.pattern)
    return sorted(topic.name for topic in client.list_topics(node) if pattern.fullmatch(topic.name))
