"""`KqClient`: admin calls, an idempotent producer and partition reads, over any node of the cluster.

Thread-safety: one client may be shared by any number of threads. Its mutable state is small and
each piece has one guard: the channels and the known leader (client/connection.py's lock); the
highest Raft index seen, the partition-count cache and the round-robin counter (`_state_lock`); the
idempotent producer's id and per-partition sequences (`_producer_lock`); and at most one produce
request in flight per partition (a lock stripe per partition, `_partition_locks`), which keeps a
partition's sequences in send order. No lock is held across another thread's call except a
partition's stripe, and the producer lock only while a producer id is being registered.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence

import grpc

from kq.client.connection import Connections
from kq.client.errors import (
    InvalidRequestError,
    KqClientError,
    TooManyReadersError,
    TopicNotFoundError,
    UnavailableError,
    error_of_code,
)
from kq.client.groups_api import GroupsApi
from kq.client.partitioner import partition_for_key
from kq.client.security import SecurityApi
from kq.client.tls import TlsConfig
from kq.client.transactions import TransactionsApi
from kq.client.types import (
    ConsumerRecord,
    FetchedBatches,
    FetchResult,
    GroupLeaderInfo,
    NodeStatus,
    PartitionOffsets,
    PeerState,
    ProducedBatch,
    ProducerRecord,
    RecordMetadata,
    TopicConfigValue,
    TopicDescription,
    TopicInfo,
)
from kq.proto import kq_pb2
from kq.proto.compression import CODECS
from kq.proto.errors import ErrorCode
from kq.proto.limits import (
    CLIENT_BACKOFF_INITIAL_S,
    CLIENT_BACKOFF_MAX_S,
    CLIENT_METHOD_RECHECK_S,
    CLIENT_PARTITION_LOCKS,
    CLIENT_PRODUCER_PARTITIONS_MAX,
    CLIENT_REQUEST_BYTES_MAX,
    CLIENT_RETRY_TIMEOUT_S,
    CLIENT_RPC_TIMEOUT_S,
    CLIENT_STATUS_TIMEOUT_S,
    CLIENT_TOPICS_CACHED_MAX,
    FETCH_RECORDS_MAX,
    MEMBERSHIP_CLIENT_TIMEOUT_S,
    RAFT_GROUPS_MAX,
    RECORDS_PER_APPEND_MAX,
)
from kq.proto.records import (
    BatchBuilder,
    BatchSource,
    NewRecord,
    next_sequence,
    parse_batch_as,
    read_header,
    record_size_max,
    wall_clock_ms,
)

RECORDS_UNCUT = 1 << 62  # A record limit no response reaches: every record of the served batches.
# The epoch this client's idempotent producer writes in every batch: it never bumps one (a failure
# with an unknown outcome starts a new producer id instead, whose sequences start at 0).
PRODUCER_EPOCH = 0


class KqClient(GroupsApi, SecurityApi, TransactionsApi):
    """A client of a kq cluster. Thread-safe (see the module docstring); one per process is enough.

    `bootstrap` lists some nodes as host:port; the leader is found from any of them. Produce is
    idempotent by default: a retry after a timeout or failover never writes a record twice. Records
    travel as Kafka RecordBatch v2 (proto/records.py): one batch per produce request, stamped with
    the producer id, epoch 0 and the partition's int32 sequence; a record without a timestamp gets
    the client's clock when sent (CreateTime, as Kafka clients do).

    `tls`: the cluster's CA (and a client certificate, for mutual TLS); `token`: a bearer token
    (`kq tokens create`) sent with every call to nodes that require authentication (`--auth`);
    `secret`: the cluster secret (`--secret` of the nodes), which makes this client a super-user
    (Node:admin): how an operator creates the first users and ACLs.
    """

    _connections: Connections  # The mixins see it as `Calls` (client/calls.py).

    def __init__(
        self,
        bootstrap: Sequence[str],
        *,
        idempotent: bool = True,
        retry_timeout_s: float = CLIENT_RETRY_TIMEOUT_S,
        rpc_timeout_s: float = CLIENT_RPC_TIMEOUT_S,
        tls: TlsConfig | None = None,
        token: str | None = None,
        secret: str | None = None,
    ) -> None:
        self._connections = Connections(bootstrap, retry_timeout_s, rpc_timeout_s, tls, token, secret)
        self._idempotent = idempotent
        self._producer_lock = threading.Lock()
        self._producer_id = 0  # 0: none registered yet (or the last one was given up).
        # (topic, partition) -> the next sequence of `_producer_id` there; bounded: one partition past
        # CLIENT_PRODUCER_PARTITIONS_MAX starts a new producer id, whose sequences all start at 0.
        self._sequences: dict[tuple[str, int], int] = {}
        self._partition_locks = tuple(threading.Lock() for _ in range(CLIENT_PARTITION_LOCKS))
        self._state_lock = threading.Lock()
        self._partition_counts: dict[str, int] = {}  # Oldest first; at most CLIENT_TOPICS_CACHED_MAX.
        # Each partition's Raft group, by topic, cached with the count (a cluster of several groups:
        # nodes with worker processes; all 0 otherwise): writes go to the group's leader, reads to a
        # process of the group, each with its group's read-your-writes index.
        self._partition_groups: dict[str, tuple[int, ...]] = {}
        # A random start, so short-lived clients sending one unkeyed record each do not all pick partition 0.
        self._round_robin = itertools.count(random.randrange(1 << 16))
        # Highest Raft index this client has seen: reads pass it as min_index, so a client always sees
        # its own writes and never reads older state than it saw before, whichever node answers. Raft
        # indexes count per group: `_index_seen` is group 0's (the cluster's state, and a cluster's
        # only group), `_group_indexes` the others' (at most RAFT_GROUPS_MAX).
        self._index_seen = 0
        self._group_indexes: dict[int, int] = {}
        # Until when ProduceMany is not asked for: a node answered UNIMPLEMENTED (an older version,
        # during a rolling upgrade); each request goes as its own Produce meanwhile.
        self._produce_many_unknown_until = 0.0

    def _saw(self, index: int, group: int = 0) -> None:
        with self._state_lock:  # A read-modify-write: unguarded, two threads could move it backwards.
            if group == 0:
                self._index_seen = max(self._index_seen, index)
            elif group in self._group_indexes or len(self._group_indexes) < RAFT_GROUPS_MAX:
                self._group_indexes[group] = max(self._group_indexes.get(group, 0), index)

    def _other_groups_seen(self) -> dict[int, int]:
        """The highest index seen of each Raft group but group 0: what a read of several groups'
        partitions asks the answering node's replicas to have applied (read-your-writes)."""
        with self._state_lock:
            return dict(self._group_indexes)

    def _index_of(self, group: int) -> int:
        """The highest index of Raft group `group` this client has seen."""
        with self._state_lock:
            return self._index_seen if group == 0 else self._group_indexes.get(group, 0)

    @property
    def index_seen(self) -> int:
        """The highest Raft index of group 0 (the cluster's state; a cluster's only group) this client
        has seen in any answer."""
        return self._index_seen

    def __enter__(self) -> KqClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connections."""
        self._connections.close()

    # Topics -------------------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int, configs: Mapping[str, str] | None = None) -> TopicInfo:
        """Creates a topic (on the leader, wherever the client first lands), with config overrides by
        Kafka's names (`retention.ms`, `cleanup.policy`, ...)."""
        entries = [kq_pb2.ConfigEntry(name=key, value=value) for key, value in (configs or {}).items()]
        response = self._connections.write(
            "CreateTopic", kq_pb2.CreateTopicRequest(name=name, partitions=partitions, configs=entries)
        )
        self._saw(response.index)
        return _topic_info(response.topic)

    def create_partitions(self, name: str, partitions: int, validate_only: bool = False) -> TopicInfo:
        """Grows a topic to `partitions` partitions (more than it has; the existing ones stay where they
        are); `validate_only`: only check. Returns the topic as it is (or would be) afterwards."""
        request = kq_pb2.CreatePartitionsRequest(
            name=name, partitions=partitions, validate_only=validate_only
        )
        response = self._connections.write("CreatePartitions", request)
        self._saw(response.index)
        self._forget_partition_count(name)
        return _topic_info(response.topic)

    def delete_topic(self, name: str) -> None:
        """Deletes a topic and all its records."""
        self._saw(self._connections.write("DeleteTopic", kq_pb2.DeleteTopicRequest(name=name)).index)
        self._forget_partition_count(name)

    def list_topics(self, node: str | None = None) -> list[TopicInfo]:
        """Every topic, by name."""
        request = kq_pb2.ListTopicsRequest(min_index=self._index_seen)
        response = self._connections.read("ListTopics", request, node)
        return [_topic_info(topic) for topic in response.topics]

    def describe_topic(self, name: str, node: str | None = None) -> TopicDescription:
        """A topic with per-partition log start and end, as `node` (or any node) sees it."""
        description = self._describe(name, node)
        self._saw(description.applied_index)
        return description

    def _describe(self, name: str, node: str | None = None) -> TopicDescription:
        """`describe_topic` without taking its index as seen: a look-up of a topic's partitions (their
        count and groups, `partition_count`) must not raise the index a later read of one node asks
        that node for (a fetch from a follower would then answer nothing until it caught up)."""
        request = kq_pb2.DescribeTopicRequest(
            name=name, min_index=self._index_seen, group_min_indexes=self._other_groups_seen()
        )
        response = self._connections.read("DescribeTopic", request, node)
        return TopicDescription(
            _topic_info(response.topic),
            tuple(_offsets(p) for p in response.partitions),
            response.served_by,
            response.applied_index,
            _config_values(response.configs),
        )

    def alter_topic_config(
        self,
        name: str,
        set_configs: Mapping[str, str] | None = None,
        remove: Sequence[str] = (),
        validate_only: bool = False,
    ) -> tuple[TopicConfigValue, ...]:
        """Sets and removes a topic's config overrides (a removed one falls back to the cluster
        default); returns every config in effect afterwards (or as it would be, with validate_only)."""
        request = kq_pb2.AlterTopicConfigRequest(
            name=name,
            set=[kq_pb2.ConfigEntry(name=key, value=value) for key, value in (set_configs or {}).items()],
            remove=list(remove),
            validate_only=validate_only,
        )
        response = self._connections.write("AlterTopicConfig", request)
        self._saw(response.index)
        return _config_values(response.configs)

    def list_offsets(self, topic: str, node: str | None = None) -> dict[int, PartitionOffsets]:
        """Log start and end per partition."""
        request = kq_pb2.ListOffsetsRequest(
            topic=topic, min_index=self._index_seen, group_min_indexes=self._other_groups_seen()
        )
        response = self._connections.read("ListOffsets", request, node)
        self._saw(response.applied_index)
        return {p.partition: _offsets(p) for p in response.partitions}

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        """Deletes a partition's records below `before_offset`; returns the new log start offset."""
        request = kq_pb2.DeleteRecordsRequest(topic=topic, partition=partition, before_offset=before_offset)
        group = self.partition_group(topic, partition)
        response = self._connections.write("DeleteRecords", request, group=group)
        self._saw(response.index, group)
        return int(response.log_start_offset)

    def partition_count(self, topic: str) -> int:
        """The topic's partition count (cached after the first look-up)."""
        with self._state_lock:
            count = self._partition_counts.get(topic)
        if count is not None:
            return count
        try:
            described = self._describe(topic)
        except TopicNotFoundError:  # Another process may have just created it: ask the leader.
            leader = self.leader_address()
            if leader is None:
                raise
            described = self._describe(topic, node=leader)
        count = described.topic.partitions
        groups = tuple(partition.group for partition in described.partitions)
        with self._state_lock:
            self._partition_counts[topic] = count
            self._partition_groups[topic] = groups if len(groups) == count else (0,) * count
            while len(self._partition_counts) > CLIENT_TOPICS_CACHED_MAX:
                forgotten = next(iter(self._partition_counts))
                del self._partition_counts[forgotten]
                self._partition_groups.pop(forgotten, None)
        return count

    def partition_group(self, topic: str, partition: int) -> int:
        """The Raft group that holds a partition (0 in a cluster of one group; cached with the
        partition count): its writes go to that group's leader. An unknown topic or partition is 0:
        the call then fails as it would have."""
        try:
            self.partition_count(topic)
        except KqClientError:
            return 0
        with self._state_lock:
            groups = self._partition_groups.get(topic, ())
        return groups[partition] if 0 <= partition < len(groups) else 0

    def _forget_partition_count(self, topic: str) -> None:
        with self._state_lock:
            self._partition_counts.pop(topic, None)
            self._partition_groups.pop(topic, None)

    def leader_address(self) -> str | None:
        """The leader's gRPC address as the answering node with the highest term reports it, or None."""
        statuses = [s for s in self.cluster_status() if isinstance(s, NodeStatus) and s.leader_address]
        return max(statuses, key=lambda status: status.term).leader_address if statuses else None

    def group_leader_address(self, group: int) -> str | None:
        """The gRPC address of Raft group `group`'s leader, as the answering node with the highest term
        for that group reports it (group 0: the cluster's leader), or None while none is known."""
        statuses = [s for s in self.cluster_status() if isinstance(s, NodeStatus)]
        leaders = [
            leader
            for status in statuses
            for leader in status.group_leaders
            if leader.group == group and leader.leader_address
        ]
        if leaders:
            return max(leaders, key=lambda leader: leader.term).leader_address
        if group != 0:
            return None
        statuses = [s for s in statuses if s.leader_address]
        return max(statuses, key=lambda status: status.term).leader_address if statuses else None

    # Produce ------------------------------------------------------------------------------------

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        *,
        partition: int | None = None,
        headers: Iterable[tuple[str, bytes]] = (),
        timestamp_ms: int | None = None,
    ) -> RecordMetadata:
        """Sends one record and waits until it is committed; returns where it was written."""
        record = ProducerRecord(value, key, tuple(headers), timestamp_ms, partition)
        return self.send_batch(topic, [record])[0]

    def send_batch(self, topic: str, records: Sequence[ProducerRecord]) -> list[RecordMetadata]:
        """Sends records (one request per partition and chunk) and returns their metadata in input order.

        A record's partition is its own, else murmur2(key) like Kafka, else round-robin per batch.
        """
        by_partition: dict[int, list[int]] = {}
        for position, record in enumerate(records):
            chosen = self.choose_partition(topic, record.key, record.partition)
            by_partition.setdefault(chosen, []).append(position)
        results: list[RecordMetadata | None] = [None] * len(records)
        now_ms = wall_clock_ms()  # The CreateTime of records without a timestamp, read once.
        for partition, positions in by_partition.items():
            new_records = [new_record(records[i], now_ms) for i in positions]
            for start, end in _chunks([record_size_max(pending) for pending in new_records]):
                batch = BatchBuilder()
                for pending in new_records[start:end]:
                    batch.append(pending)
                metadata = self.produce_batch(topic, partition, batch)
                for position, item in zip(positions[start:end], metadata, strict=True):
                    results[position] = item
        return [item for item in results if item is not None]

    def choose_partition(self, topic: str, key: bytes | None, partition: int | None = None) -> int:
        """The partition a record goes to: `partition` if given, else murmur2(key) like Kafka, else the
        next one in turn."""
        if partition is not None:
            return partition
        count = self.partition_count(topic)
        if key is not None:
            return partition_for_key(key, count)
        with self._state_lock:
            return next(self._round_robin) % count

    def produce_batch(
        self, topic: str, partition: int, batch: BatchSource, compression: str | None = None
    ) -> ProducedBatch:
        """Sends one batch's records to one partition as one request and waits for it; idempotent
        unless disabled (what `send_batch`, the `Producer` and the Spark sink send through).

        The batch's header gets the producer id, epoch and the partition's next sequence here, under
        the partition's lock, so sequences follow the order the requests are sent in.
        """
        codec = CODECS[compression or "none"]
        count = batch.record_count
        group = self.partition_group(topic, partition)
        if not self._idempotent:
            request = kq_pb2.ProduceRequest(topic=topic, partition=partition, records=batch.build(codec))
            response = self._connections.write_produce(request, group)
            self._saw(response.index, group)
            return _metadata(topic, response, count)
        key = (topic, partition)
        # One request in flight per partition keeps its sequences in send order. Two partitions may
        # share a stripe; that only serializes them, it never reorders one.
        with self._partition_locks[hash(key) % len(self._partition_locks)]:
            producer_id, sequence = self._next_sequence(key)
            records = batch.build(codec, producer_id, PRODUCER_EPOCH, sequence)
            request = kq_pb2.ProduceRequest(topic=topic, partition=partition, records=records)
            try:
                response = self._connections.write_produce(request, group)
            except KqClientError as error:
                self._settled(key, producer_id, sequence, count, error)
                raise
            outcome = self._settled(key, producer_id, sequence, count, response)
            assert isinstance(outcome, ProducedBatch)
            return outcome

    def produce_batches(
        self, batches: Sequence[tuple[str, int, BatchSource]], compression: str | None = None
    ) -> list[ProducedBatch | KqClientError]:
        """Sends several partitions' batches, each (topic, partition) once, in one ProduceMany call and
        waits for all of them; each gets its own outcome, in order: its `ProducedBatch`, or the error
        `produce_batch` would have raised for it alone. One call costs the leader about what one
        Produce does, so the `Producer` and the Spark sink send a call per round of partitions.

        Idempotent unless disabled, as `produce_batch`: the partitions' locks are held from taking
        their sequences to the answer, a retriable failure of one request is sent again (alone, with
        the same sequence) until the client's retry timeout, and a request whose outcome stays
        unknown starts a new producer id.
        """
        keys = [(topic, partition) for topic, partition, _ in batches]
        if len(set(keys)) != len(keys):
            raise ValueError("each (topic, partition) may be named once per call")
        codec = CODECS[compression or "none"]
        if not self._idempotent:
            requests = [(topic, partition, batch.build(codec)) for topic, partition, batch in batches]
            results: list[ProducedBatch | KqClientError] = []
            for (topic, partition, batch), outcome in zip(batches, self._produce_many(requests), strict=True):
                if isinstance(outcome, KqClientError):
                    results.append(outcome)
                    continue
                self._saw(outcome.index, self.partition_group(topic, partition))
                results.append(_metadata(topic, outcome, batch.record_count))
            return results
        stripes = sorted({hash(key) % len(self._partition_locks) for key in keys})  # One order: no deadlock.
        with contextlib.ExitStack() as held:
            for stripe in stripes:
                held.enter_context(self._partition_locks[stripe])
            taken = [self._next_sequence(key) for key in keys]
            requests = [
                (topic, partition, batch.build(codec, producer_id, PRODUCER_EPOCH, sequence))
                for (topic, partition, batch), (producer_id, sequence) in zip(batches, taken, strict=True)
            ]
            outcomes = self._produce_many(requests)
            return [
                self._settled(key, producer_id, sequence, batch.record_count, outcome)
                for (_, _, batch), key, (producer_id, sequence), outcome in zip(
                    batches, keys, taken, outcomes, strict=True
                )
            ]

    def _settled(
        self,
        key: tuple[str, int],
        producer_id: int,
        sequence: int,
        count: int,
        outcome: kq_pb2.ProduceResponse | KqClientError,
    ) -> ProducedBatch | KqClientError:
        """An idempotent request's outcome taken into the producer's state (its partition's lock held):
        a refused batch (refused before apply wrote it: nothing was written) forgets the topic's
        partition count; any other failure leaves the outcome unknown, so the producer id is given up
        and the next records can never be mistaken for retries of these; a success advances the
        partition's sequence. Returns the batch's metadata, or the error."""
        if isinstance(outcome, InvalidRequestError | TopicNotFoundError):
            self._forget_partition_count(key[0])
            return outcome
        if isinstance(outcome, KqClientError):
            self._reset_producer(producer_id)
            return outcome
        self._advance_sequence(key, producer_id, next_sequence(sequence, count))
        self._saw(outcome.index, self.partition_group(*key))
        return _metadata(key[0], outcome, count)

    def _produce_many(
        self, requests: list[tuple[str, int, bytes]]
    ) -> list[kq_pb2.ProduceResponse | KqClientError]:
        """Each request's (topic, partition, records) response or final error, through a ProduceMany
        call per Raft group the partitions are in (to its leader: `_produce_many_in`), in order."""
        by_group: dict[int, list[int]] = {}
        for position, (topic, partition, _) in enumerate(requests):
            by_group.setdefault(self.partition_group(topic, partition), []).append(position)
        outcomes: list[kq_pb2.ProduceResponse | KqClientError | None] = [None] * len(requests)
        for group, positions in by_group.items():
            answered = self._produce_many_in(group, [requests[position] for position in positions])
            for position, outcome in zip(positions, answered, strict=True):
                outcomes[position] = outcome
        return [outcome for outcome in outcomes if outcome is not None]

    def _produce_many_in(
        self, group: int, requests: list[tuple[str, int, bytes]]
    ) -> list[kq_pb2.ProduceResponse | KqClientError]:
        """Each request's (topic, partition, records) response or final error, through ProduceMany
        calls to the leader of Raft group `group`, which holds every partition named: the call itself
        is retried and redirected as every write is; a request that failed retriably alone is sent
        again in the next call (after a doubling backoff) until the client's retry timeout. Each
        call's requests are built in place (a ProduceRequest added to a call is copied whole, records
        and all)."""
        outcomes: list[kq_pb2.ProduceResponse | KqClientError | None] = [None] * len(requests)
        deadline = time.monotonic() + self._connections.retry_timeout_s
        pending, backoff_s = list(range(len(requests))), CLIENT_BACKOFF_INITIAL_S
        while pending:
            if time.monotonic() < self._produce_many_unknown_until:
                for i in pending:
                    outcomes[i] = self._produce_alone(*requests[i], group)
                break
            call = kq_pb2.ProduceManyRequest()
            for i in pending:
                topic, partition, records = requests[i]
                call.requests.add(topic=topic, partition=partition, records=records)
            try:
                response = self._connections.write("ProduceMany", call, group=group)
                if len(response.results) != len(pending):
                    raise KqClientError(
                        f"{len(response.results)} results for {len(pending)} produce requests"
                    )
            except KqClientError as call_error:
                if call_error.status == grpc.StatusCode.UNIMPLEMENTED:  # Nothing of it was proposed.
                    self._produce_many_unknown_until = time.monotonic() + CLIENT_METHOD_RECHECK_S
                    continue
                for i in pending:
                    outcomes[i] = call_error
                break
            again = []
            for i, result in zip(pending, response.results, strict=True):
                if result.error_code == ErrorCode.OK:
                    outcomes[i] = result.response
                    continue
                error = error_of_code(result.error_code, result.message)
                if error.retriable and time.monotonic() + backoff_s < deadline:
                    again.append(i)
                else:
                    outcomes[i] = error
            pending = again
            if pending:
                time.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, CLIENT_BACKOFF_MAX_S)
        return [outcome for outcome in outcomes if outcome is not None]

    def _produce_alone(
        self, topic: str, partition: int, records: bytes, group: int
    ) -> kq_pb2.ProduceResponse | KqClientError:
        """One request of a ProduceMany call sent as a Produce call: its response or final error."""
        request = kq_pb2.ProduceRequest(topic=topic, partition=partition, records=records)
        try:
            response: kq_pb2.ProduceResponse = self._connections.write_produce(request, group)
        except KqClientError as error:
            return error
        return response

    def _next_sequence(self, key: tuple[str, int]) -> tuple[int, int]:
        """(producer id, sequence) for the next request to `key`, registering a producer id if needed."""
        with self._producer_lock:
            if key not in self._sequences and len(self._sequences) >= CLIENT_PRODUCER_PARTITIONS_MAX:
                self._producer_id = 0  # Bound the sequences kept: a new id starts every partition at 0.
            if not self._producer_id:
                response = self._connections.write("RegisterProducer", kq_pb2.RegisterProducerRequest())
                self._producer_id = response.producer_id
                self._sequences.clear()
            return self._producer_id, self._sequences.get(key, 0)

    def _advance_sequence(self, key: tuple[str, int], producer_id: int, sequence: int) -> None:
        """Records `key`'s next sequence, unless the producer id changed while the request was out."""
        with self._producer_lock:
            if self._producer_id == producer_id:
                self._sequences[key] = sequence

    def _reset_producer(self, producer_id: int) -> None:
        """Gives up `producer_id` (not a newer one another thread may have registered since)."""
        with self._producer_lock:
            if self._producer_id == producer_id:
                self._producer_id = 0
                self._sequences.clear()

    # Fetch --------------------------------------------------------------------------------------

    def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1024 * 1024,
        wait_ms: int = 0,
        node: str | None = None,
        min_index: int | None = None,
        whole_batches: bool = False,
    ) -> FetchResult:
        """Reads records from `offset`, from `node` or any node; waits up to `wait_ms` for new ones.

        `min_index` (default: the highest index this client has seen) makes a node that has not
        applied it yet answer with no records rather than with older state. A node serves whole
        stored batches until they hold `max_records`; `whole_batches` returns every record of them
        instead of cutting the last batch at `max_records`, so a reader that reads on (the Spark
        source) starts its next fetch at a batch's start and decodes each batch once.
        """
        fetched = self.fetch_batches(
            topic,
            partition,
            offset,
            max_records=max_records,
            max_bytes=max_bytes,
            wait_ms=wait_ms,
            node=node,
            min_index=min_index,
        )
        limit = RECORDS_UNCUT if whole_batches else max_records
        records, next_offset = decode_batches(topic, partition, fetched.batches, offset, limit)
        return FetchResult(
            tuple(records),
            fetched.log_start_offset,
            fetched.log_end_offset,
            fetched.served_by,
            fetched.applied_index,
            next_offset,
        )

    def fetch_batches(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1024 * 1024,
        wait_ms: int = 0,
        node: str | None = None,
        min_index: int | None = None,
    ) -> FetchedBatches:
        """`fetch`'s stored batches as served, neither checked nor decoded: for a reader that decodes
        them itself (the Spark source builds Arrow columns from them, spark/columns.py), and must
        check them as `decode_batches` does. The first batch may start before `offset`."""
        group = self.partition_group(topic, partition)
        request = kq_pb2.FetchRequest(
            topic=topic,
            partition=partition,
            offset=offset,
            max_records=max_records,
            max_bytes=max_bytes,
            wait_ms=wait_ms,
            min_index=self._index_of(group) if min_index is None else min_index,
            as_batches=True,
        )
        if wait_ms:
            response = self._waiting_fetch(request, node, group)
        else:
            response = self._connections.read("Fetch", request, node, group=group)
        self._saw(response.applied_index, group)
        return FetchedBatches(
            tuple(batch.data for batch in response.batches),
            response.log_start_offset,
            response.log_end_offset,
            response.served_by,
            response.applied_index,
        )

    def _waiting_fetch(
        self, request: kq_pb2.FetchRequest, node: str | None, group: int
    ) -> kq_pb2.FetchResponse:
        """A Fetch that may wait `request.wait_ms`; refused a wait for that long, one that does not wait.

        A node holding its maximum of waiting readers refuses the wait (TOO_MANY_READERS). The retries,
        with backoff, for at most the wait may find a free slot, another node, or records (a fetch with
        records to answer needs no slot); after that, a fetch that does not wait answers (no node
        refuses it for want of slots), as a long-poll that found nothing would have. Any other
        retriable failure keeps the client's whole retry policy, as for every read.
        """
        wait_s = request.wait_ms / 1000
        timeout_s = self._connections.rpc_timeout_s + wait_s
        retry_s = self._connections.retry_timeout_s
        started = time.monotonic()
        try:
            response: kq_pb2.FetchResponse = self._connections.read(
                "Fetch", request, node, timeout_s, retry_timeout_s=min(wait_s, retry_s), group=group
            )
        except TooManyReadersError:
            plain = kq_pb2.FetchRequest()
            plain.CopyFrom(request)
            plain.wait_ms = 0
            response = self._connections.read("Fetch", plain, node, group=group)
        except UnavailableError:
            remaining_s = retry_s - (time.monotonic() - started)
            if remaining_s <= 0:
                raise
            response = self._connections.read(
                "Fetch", request, node, timeout_s, retry_timeout_s=remaining_s, group=group
            )
        return response

    def stream(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        node: str | None = None,
        max_bytes: int = 4 * 1024 * 1024,
    ) -> Iterator[ConsumerRecord]:
        """Yields the partition's records from `offset` on, forever; the node pushes batches as applied.

        Reopens the stream from the next offset whenever it ends; after a retriable failure (a node
        holding its maximum of readers, or down) on the next node unless `node` is pinned, with a
        backoff growing to CLIENT_STREAM_BACKOFF_MAX_S (client/connection.py).
        """

        group = self.partition_group(topic, partition)

        def next_request() -> kq_pb2.FetchRequest:
            return kq_pb2.FetchRequest(
                topic=topic,
                partition=partition,
                offset=offset,
                max_records=FETCH_RECORDS_MAX,
                max_bytes=max_bytes,
                min_index=self._index_of(group),
            )

        for response in self._connections.stream("FetchStream", next_request, node, group):
            self._saw(response.applied_index, group)
            batches = [batch.data for batch in response.batches]
            records, next_offset = decode_batches(topic, partition, batches, offset)
            for record in records:
                offset = record.offset + 1
                yield record
            offset = next_offset

    # Cluster ------------------------------------------------------------------------------------

    def cluster_status(self) -> list[NodeStatus | KqClientError]:
        """The own status of every bootstrap node and of every member they name (a node added since the
        bootstrap list was written), or the error reaching it."""
        return [outcome for _, outcome in self.cluster_status_by_address()]

    def cluster_status_by_address(self) -> list[tuple[str, NodeStatus | KqClientError]]:
        """`cluster_status` with the gRPC address each answer (or error) came from."""
        request = kq_pb2.ClusterStatusRequest()
        outcomes = self._connections.call_each("ClusterStatus", request, CLIENT_STATUS_TIMEOUT_S)
        asked = {address for address, _ in outcomes}
        named = {
            peer.grpc_address
            for _, outcome in outcomes
            if not isinstance(outcome, KqClientError)
            for peer in outcome.peers
            if peer.grpc_address
        }
        more = sorted(named - asked)
        outcomes += self._connections.call_each("ClusterStatus", request, CLIENT_STATUS_TIMEOUT_S, more)
        return [
            (address, outcome if isinstance(outcome, KqClientError) else _node_status(address, outcome))
            for address, outcome in outcomes
        ]

    def add_node(
        self, node_id: str, raft_address: str, grpc_address: str, kafka_address: str = "", rack: str = ""
    ) -> list[PeerState]:
        """Adds a running node (started with `--join`) to the cluster's voters; the members afterwards.

        Adding a member again is no error. Raises MembershipRefusedError when the id or an address is
        another member's, the node does not answer, or the cluster would be left without a majority."""
        member = kq_pb2.Member(
            node_id=node_id,
            raft_address=raft_address,
            grpc_address=grpc_address,
            kafka_address=kafka_address,
            rack=rack,
        )
        response = self._connections.write(
            "AddNode", kq_pb2.AddNodeRequest(member=member), timeout_s=MEMBERSHIP_CLIENT_TIMEOUT_S
        )
        self._saw(response.index)
        return [_peer_state(peer) for peer in response.members]

    def remove_node(self, node_id: str) -> list[PeerState]:
        """Removes a node (running or not) from the cluster's voters; the members afterwards. Removing
        the leader first hands its leadership to another node."""
        response = self._connections.write(
            "RemoveNode", kq_pb2.RemoveNodeRequest(node_id=node_id), timeout_s=MEMBERSHIP_CLIENT_TIMEOUT_S
        )
        self._saw(response.index)
        return [_peer_state(peer) for peer in response.members]

    def node_status(self, node: str) -> NodeStatus:
        """One node's status."""
        return _node_status(
            node, self._connections.read("ClusterStatus", kq_pb2.ClusterStatusRequest(), node)
        )

    @property
    def bootstrap(self) -> tuple[str, ...]:
        """The addresses this client was given."""
        return self._connections.bootstrap


def _chunks(sizes: list[int]) -> Iterable[tuple[int, int]]:
    """(start, end) slices of records of `sizes` (encoded, at most) that fit one produce request."""
    start, size_bytes = 0, 0
    for position, size in enumerate(sizes):
        if position > start and (
            position - start >= RECORDS_PER_APPEND_MAX or size_bytes + size > CLIENT_REQUEST_BYTES_MAX
        ):
            yield start, position
            start, size_bytes = position, 0
        size_bytes += size
    if start < len(sizes):
        yield start, len(sizes)


def new_record(record: ProducerRecord, now_ms: int) -> NewRecord:
    """`record` as the batch encoder takes it; without a timestamp it gets `now_ms` (CreateTime)."""
    timestamp_ms = now_ms if record.timestamp_ms is None else record.timestamp_ms
    return NewRecord(record.key, record.value, record.headers, timestamp_ms)


def _metadata(topic: str, response: kq_pb2.ProduceResponse, count: int) -> ProducedBatch:
    return ProducedBatch(
        topic, response.partition, response.base_offset, count, response.duplicate, response.index
    )


def _topic_info(topic: kq_pb2.TopicInfo) -> TopicInfo:
    return TopicInfo(topic.name, topic.partitions, topic.topic_id, topic.created_ms)


def _offsets(partition: kq_pb2.PartitionInfo) -> PartitionOffsets:
    return PartitionOffsets(
        partition.partition,
        partition.log_start_offset,
        partition.log_end_offset,
        partition.size_bytes,
        partition.group,
    )


def decode_batches(
    topic: str, partition: int, batches: Iterable[bytes], offset: int, limit: int = RECORDS_UNCUT
) -> tuple[list[ConsumerRecord], int]:
    """At most `limit` records of served batches from `offset` on (a first batch may start before it),
    and the offset to read from next: past the last record returned when `limit` cut them short, else
    past the last batch (a compacted batch's last offsets may hold no record), and `offset` when no
    batch was served.

    Each batch is a stored RecordBatch v2, checked whole (its CRC32C included) as it is decoded;
    parse_batch_as's limits are those every stored batch passed. Each record is built once, as
    the ConsumerRecord returned (a consumer's cost per record is mostly the objects it builds).
    """
    records: list[ConsumerRecord] = []
    next_offset = offset
    for data in batches:
        if len(records) >= limit:
            break
        header = read_header(data)
        base_offset = header.base_offset
        if header.is_control:  # A transaction marker (Kafka's consumers skip them too).
            next_offset = max(next_offset, base_offset + header.last_offset_delta + 1)
            continue
        timestamp_type = 1 if header.log_append_time else 0  # Kafka's numbers.

        def build(
            offset_delta: int,
            timestamp_ms: int,
            key: bytes | None,
            value: bytes | None,
            headers: tuple[tuple[str, bytes], ...],
            _size_bytes: int,
            base_offset: int = base_offset,
            timestamp_type: int = timestamp_type,
        ) -> ConsumerRecord:
            at = base_offset + offset_delta
            return ConsumerRecord(topic, partition, at, timestamp_ms, timestamp_type, key, value, headers)

        decoded = parse_batch_as(data, build)
        if base_offset < offset:  # Only a first batch can start before the offset asked for.
            decoded = [record for record in decoded if record.offset >= offset]
        records += decoded
        next_offset = max(next_offset, base_offset + header.last_offset_delta + 1)
    if len(records) > limit:
        return records[:limit], records[limit].offset
    return records, next_offset


def _node_status(address: str, response: kq_pb2.ClusterStatusResponse) -> NodeStatus:
    return NodeStatus(
        address=address,
        node_id=response.node_id,
        role=response.role,
        leader_id=response.leader_id,
        leader_address=response.leader_address,
        term=response.term,
        commit_index=response.commit_index,
        applied_index=response.applied_index,
        ready=response.ready,
        raft_log_entries=response.raft_log_entries,
        peers=tuple(_peer_state(peer) for peer in response.peers),
        raft_address=response.raft_address,
        cluster_id=response.cluster_id,
        group=response.group,
        group_leaders=tuple(
            GroupLeaderInfo(leader.group, leader.leader_id, leader.leader_address, leader.term)
            for leader in response.group_leaders
        ),
    )


def _peer_state(peer: kq_pb2.PeerStatus) -> PeerState:
    return PeerState(
        peer.node_id,
        peer.grpc_address,
        peer.connected,
        peer.raft_address,
        peer.kafka_address,
        peer.rack,
        peer.match_index,
    )


def _config_values(values: Iterable[kq_pb2.TopicConfigValue]) -> tuple[TopicConfigValue, ...]:
    return tuple(TopicConfigValue(value.name, value.value, value.is_default) for value in values)
