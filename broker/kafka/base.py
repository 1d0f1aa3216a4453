"""What every Kafka API handler shares: the node's parts, the cluster as Kafka sees it, error mapping.

The Kafka handlers call the same broker layer as gRPC (`ServiceBase`'s parts and `BrokerService`'s
operations), so produce, fetch, topics, offsets and groups have one implementation, and every
request passes the same validation before anything reaches Raft. A `KqError` becomes the Kafka
error code of its row in kq's one error table (proto/errors.py); the codes the handlers answer
themselves are in broker/kafka/codes.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from kq.broker.consensus import Peer
from kq.broker.deadlines import capped
from kq.broker.errors import KqError, UnavailableError
from kq.broker.kafka.authorize import ApiKey, access
from kq.broker.kafka.codes import (
    COORDINATOR_NOT_AVAILABLE,
    FENCED_LEADER_EPOCH,
    LEADER_NOT_AVAILABLE,
    NOT_CONTROLLER,
    NOT_COORDINATOR,
    NOT_LEADER_OR_FOLLOWER,
    UNKNOWN_LEADER_EPOCH,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from kq.broker.kafka.forward import LeaderForwarder
from kq.broker.kafka.listener import Connection
from kq.broker.membership import MembershipView
from kq.broker.service import BrokerService
from kq.broker.service_base import ServiceBase
from kq.broker.workers import shifted
from kq.proto import kq_pb2
from kq.proto.errors import ErrorCode, spec_of
from kq.proto.limits import CATCH_UP_WAIT_S, CONSUMER_HEARTBEAT_INTERVAL_MS, CONSUMER_SESSION_TIMEOUT_MS
from kq.raft.placement import METADATA_GROUP
from kq.raft.validation import topic_name_problem

logger = logging.getLogger(__name__)


BROKER_ID_MAX = 2**31 - 1  # Kafka's broker ids are int32.


@dataclass(frozen=True, slots=True)
class KafkaBrokerInfo:
    """One node as Kafka clients see it: a number and the address of its Kafka listener."""

    broker_id: int
    node_id: str
    host: str
    port: int
    grpc_address: str
    rack: str | None = None


@dataclass(slots=True)
class FetchTotals:
    """What this node's Kafka Fetch answers served since it started (changed on the loop only), logged
    when the listener stops: how an operator (and tests/kafka/test_follower_fetch.py) sees which node
    served a rack's consumers."""

    fetches: int = 0
    records: int = 0  # Records of the batches served (a batch starting before the fetch offset counts whole).
    record_bytes: int = 0
    redirected: int = 0  # Fetches answered with a preferred read replica (KIP-392) instead of records.
    lagging: int = 0  # Fetches past this node's log end but within the leader's, waited for (not refused).


class KafkaSettings:
    """The listener's configuration (node flags), and the cluster's brokers: the members that have a
    Kafka address and an integer id, rebuilt when the membership changes (broker/membership.py)."""

    def __init__(
        self,
        view: Callable[[], MembershipView],
        self_broker_id: int,
        auto_create_topics: bool,
        default_partitions: int,
        forward_credentials: grpc.ChannelCredentials | None = None,
        forward_metadata: tuple[tuple[str, str], ...] = (),
        sasl_mechanisms: Sequence[str] = (),
        broker_id_of: Callable[[str], int] = int,
        consumer_heartbeat_interval_ms: int = CONSUMER_HEARTBEAT_INTERVAL_MS,
        consumer_session_timeout_ms: int = CONSUMER_SESSION_TIMEOUT_MS,
    ) -> None:
        self._view = view
        # A member's broker id from its node id: the id itself, or with worker processes its process
        # of this process's group (broker/workers.py `broker_id`).
        self._broker_id_of = broker_id_of
        self.sasl_mechanisms = tuple(sasl_mechanisms)  # `--kafka-sasl`: what clients must use; () for none.
        self.forward_credentials = forward_credentials  # The node's TLS for calls to the leader.
        self.forward_metadata = forward_metadata  # The node's proof (broker/auth.py) on those calls.
        self.self_broker_id = self_broker_id
        self.auto_create_topics = auto_create_topics
        self.default_partitions = default_partitions
        # Kafka's group.consumer.heartbeat.interval.ms and group.consumer.session.timeout.ms (node flags).
        self.consumer_heartbeat_interval_ms = consumer_heartbeat_interval_ms
        self.consumer_session_timeout_ms = consumer_session_timeout_ms
        self._brokers: tuple[MembershipView | None, tuple[KafkaBrokerInfo, ...]] = (None, ())

    @property
    def brokers(self) -> tuple[KafkaBrokerInfo, ...]:
        """Every member serving Kafka, this node included, by broker id (any thread)."""
        view = self._view()
        built_from, brokers = self._brokers
        if built_from is not view:
            brokers = kafka_brokers(view.members, self._broker_id_of)
            self._brokers = (view, brokers)  # One reference swap: readers see the old or the new pair.
        return brokers

    @property
    def cluster_id(self) -> str:
        """Kafka's cluster id: the one the cluster recorded, else derived from --peers."""
        return self._view().cluster_id


def kafka_brokers(
    members: Iterable[Peer], broker_id_of: Callable[[str], int] = int
) -> tuple[KafkaBrokerInfo, ...]:
    """The members that can be Kafka brokers (an integer id, a Kafka address), by broker id."""
    brokers = []
    for peer in members:
        if peer.node_id.isdigit() and int(peer.node_id) <= BROKER_ID_MAX and peer.kafka_address:
            host, _, port = peer.kafka_address.rpartition(":")
            brokers.append(
                KafkaBrokerInfo(
                    broker_id_of(peer.node_id),
                    peer.node_id,
                    host,
                    int(port),
                    peer.grpc_address,
                    peer.rack or None,
                )
            )
    return tuple(sorted(brokers, key=lambda broker: broker.broker_id))


def kafka_code(error: KqError, not_leader: int = NOT_LEADER_OR_FOLLOWER) -> int:
    """The Kafka error code of a kq error; a write that reached a follower answers `not_leader`
    (NOT_LEADER_OR_FOLLOWER for partitions, NOT_COORDINATOR for groups, NOT_CONTROLLER for topics).
    A partition's group whose copy of the topic is not made yet (NOT_CAUGHT_UP, broker/topic_sync.py)
    answers UNKNOWN_TOPIC_OR_PARTITION, retriable, as a Kafka broker that has not heard of a new topic
    does (the table's OFFSET_NOT_AVAILABLE is what a producer would not retry)."""
    if error.code == ErrorCode.NOT_LEADER:
        return not_leader
    if error.code == ErrorCode.NOT_CAUGHT_UP and not_leader == NOT_LEADER_OR_FOLLOWER:
        return UNKNOWN_TOPIC_OR_PARTITION
    if error.code == ErrorCode.LEADER_UNKNOWN:
        return {NOT_COORDINATOR: COORDINATOR_NOT_AVAILABLE, NOT_CONTROLLER: NOT_CONTROLLER}.get(
            not_leader, LEADER_NOT_AVAILABLE
        )
    return spec_of(error.code).kafka_code


class KafkaBase(ServiceBase):
    """The parts of one node, shared with its gRPC service, and the cluster's Kafka brokers."""

    def __init__(self, service: BrokerService, settings: KafkaSettings) -> None:
        super().__init__(
            service._node,
            service._membership,
            service._store,
            service._consensus,
            service._batcher,
            service._notifier,
            service._coordinator,
            service._readers,
            service._workers,
            service._reads,
            security=service._security,
            groups=service._groups,
        )
        self._service = service
        self._settings = settings
        self._forwarder = LeaderForwarder(settings.forward_credentials, settings.forward_metadata)
        self._fetch_totals = FetchTotals()

    def _leader_broker(self, group: int | None = None) -> KafkaBrokerInfo | None:
        """The Kafka broker of the leader of `group` (None: this process's own) this process knows of:
        the controller is group 0's, a consumer group's coordinator its coordinator group's."""
        if group is None or group == self._groups.group:
            if self._consensus.is_leader():
                address: str | None = self._node.grpc_address
            else:
                address = self._consensus.leader_grpc_address()
            return next((broker for broker in self._settings.brokers if broker.grpc_address == address), None)
        leader = self._groups.leader(group).leader_id
        return self._group_broker(leader, group) if leader else None

    def _brokers(self) -> tuple[KafkaBrokerInfo, ...]:
        """Every broker of the cluster: each member's process of each group, by broker id (a
        member's processes of the other groups have its addresses moved: broker/workers.py)."""
        members = self._settings.brokers
        if not self._groups.several:
            return members
        return tuple(
            sorted(
                (self._moved(broker, group) for broker in members for group in range(self._groups.count)),
                key=lambda broker: broker.broker_id,
            )
        )

    def _group_brokers(self, group: int) -> tuple[KafkaBrokerInfo, ...]:
        """The brokers that replicate `group`: each member's process of it."""
        if not self._groups.several:
            return self._settings.brokers
        return tuple(self._moved(broker, group) for broker in self._settings.brokers)

    def _group_broker(self, node_id: str, group: int) -> KafkaBrokerInfo | None:
        """Node `node_id`'s process of `group` as a broker (None: not a member)."""
        broker = next((b for b in self._settings.brokers if b.node_id == node_id), None)
        return None if broker is None else self._moved(broker, group)

    def _moved(self, broker: KafkaBrokerInfo, group: int) -> KafkaBrokerInfo:
        """A member's broker in this process's group, as its process of `group`."""
        offset = group - self._groups.group
        if offset == 0:
            return broker  # Its id is already its process's of this group (KafkaSettings.brokers).
        return KafkaBrokerInfo(
            self._groups.broker_id(broker.node_id, group),
            broker.node_id,
            broker.host,
            broker.port + offset,
            shifted(broker.grpc_address, offset),
            broker.rack,
        )

    def _live_broker_ids(self, group: int | None = None) -> tuple[int, ...]:
        """The in-sync replicas this process reports for `group` (None: its own): for its own group the
        brokers it is connected to over Raft, and itself; for another, every replica (its connections
        are its sibling's to know)."""
        if group is not None and group != self._groups.group:
            return tuple(broker.broker_id for broker in self._group_brokers(group))
        connected = self._consensus.status().connected
        return tuple(
            broker.broker_id
            for broker in self._settings.brokers
            if broker.node_id == self._node.node_id or connected.get(broker.node_id, False)
        )

    # Leader epochs (raft/epochs.py) ------------------------------------------------------------------

    def _leader_epoch(self, group: int) -> int:
        """`group`'s current Kafka leader epoch: its Raft term as this process knows it (-1: none yet)."""
        term = self._consensus.term() if group == self._groups.group else self._groups.leader(group).term
        return term if term > 0 else -1

    def _fenced(self, wanted: Iterable[tuple[str, int, int]]) -> dict[tuple[str, int], int]:
        """Kafka's check of the current leader epochs a client sends (Fetch, ListOffsets,
        OffsetForLeaderEpoch): for each (topic, partition, epoch) this process's group holds, with an
        epoch given (not -1), FENCED_LEADER_EPOCH when it is older than the group's, UNKNOWN_LEADER_EPOCH
        when newer (the client's metadata is ahead of this replica). On the read pool."""
        given = [(topic, partition, epoch) for topic, partition, epoch in wanted if epoch >= 0]
        if not given:
            return {}
        current = self._leader_epoch(self._groups.group)
        fenced: dict[tuple[str, int], int] = {}
        with self._store.read() as reader:
            for name, partition, epoch in given:
                topic = None if topic_name_problem(name) else reader.topic(name)
                if topic is None or self._groups.group_of(topic, partition) != self._groups.group:
                    continue  # Unknown here, or another group's: the read answers that.
                if epoch != current:
                    code = FENCED_LEADER_EPOCH if epoch < current else UNKNOWN_LEADER_EPOCH
                    fenced[(name, partition)] = code
        return fenced

    # Authorization (broker/kafka/authorize.py) -------------------------------------------------------

    def _permitted(self, connection: Connection, api_key: ApiKey, resource_type: int, name: str) -> bool:
        """Whether the connection's principal may do what `api_key` needs on the resource; a denial is
        logged (once a minute per principal and resource)."""
        principal = connection.principal
        if principal is None:  # KafkaApis.answer lets no request of an unknown principal this far.
            return False
        return self._security.denied(principal, [access(api_key, resource_type, name)]) is None

    def _refused(
        self, connection: Connection, api_key: ApiKey, resource_type: int, names: Iterable[str]
    ) -> frozenset[str]:
        """The names among `names` the connection may not use as `api_key` needs (each logged)."""
        return frozenset(
            name for name in set(names) if not self._permitted(connection, api_key, resource_type, name)
        )

    def _visible(self, connection: Connection, api_key: ApiKey, resource_type: int, name: str) -> bool:
        """Whether a listing (Metadata of every topic, ListGroups) shows the resource: not logged, the
        others are simply left out, as Kafka does."""
        principal = connection.principal
        needed = access(api_key, resource_type, name)
        return principal is not None and self._security.allowed(principal, needed)

    async def _security_seen(self, index: int) -> None:
        """Read-your-writes on this node: waits (at most CATCH_UP_WAIT_S, and never past the request's
        timeout: broker/deadlines.py) until this process applied
        the leader's security entry, so a DescribeAcls, DeleteAcls or
        DescribeUserScramCredentials that follows sees the change.
        Only group 0's processes hold the security view's source; the others answer at once."""
        if self._groups.group == METADATA_GROUP:
            await self._in_reads(self._notifier.wait_until, index, capped(CATCH_UP_WAIT_S))

    async def _security_view(self) -> tuple[list[kq_pb2.Acl], dict[str, list[tuple[str, int]]]]:
        """The cluster's ACLs, and each user's (SCRAM mechanism, iterations): this process's view in
        group 0's processes; asked of group 0's leader (ListAcls, ListUsers) from another group's
        process, whose store holds no security rows."""
        if self._groups.group == METADATA_GROUP:
            state = self._security.state
            users = {
                name: [(credential.mechanism, credential.iterations) for credential in user.credentials]
                for name, user in state.users.items()
            }
            return list(state.acls), users
        acls = await self._on_leader("ListAcls", kq_pb2.ListAclsRequest())
        listed = await self._on_leader("ListUsers", kq_pb2.ListUsersRequest())
        users = {
            user.name: list(zip(user.mechanisms, user.iterations, strict=False)) for user in listed.users
        }
        return list(acls.acls), users

    async def _on_leader(self, method: str, request: Any) -> Any:
        """BrokerService's `method` (a write to the cluster's state: group 0's) here when this process
        leads group 0, else on the process that does (forward.py)."""
        if self._groups.group == METADATA_GROUP and self._consensus.is_leader():
            return await self._in_workers(getattr(self._service, method), request, None)
        if self._groups.group == METADATA_GROUP:
            leader = self._consensus.leader_grpc_address()
        else:
            process = self._groups.leader_process(METADATA_GROUP)
            leader = process.grpc_address if process is not None else None
        if leader is None:
            raise UnavailableError("no leader is elected right now; retry", ErrorCode.LEADER_UNKNOWN)
        return await self._forwarder.call(leader, method, request)

    async def close(self) -> None:
        """Closes the channels to the leader and logs the fetch totals (on the loop, when the listener
        stops)."""
        totals = self._fetch_totals
        logger.info(
            "node %s served %d Kafka fetches: %d records (%d bytes); %d answered with a preferred read "
            "replica; %d past this node's log end waited for the leader's records",
            self._node.node_id,
            totals.fetches,
            totals.records,
            totals.record_bytes,
            totals.redirected,
            totals.lagging,
        )
        await self._forwarder.close()
