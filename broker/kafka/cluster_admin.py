"""Kafka's cluster-inspection and leadership APIs: DescribeLogDirs (API 35), DescribeTopicPartitions
(API 75, KIP-966) and ElectLeaders (API 43).

DescribeLogDirs: each broker (a node's process of one Raft group) has one log dir, its data
directory, and answers for the partitions its store holds (its group's): each one's size as the store
counts it (the stored batches' bytes), and offset lag 0 (kq has no future replicas: a partition never
moves between directories). v4's total and usable bytes are the data directory's file system's.

DescribeTopicPartitions is Metadata's topic part, paged: the topics (all of them, those the principal
may DESCRIBE, when none are named) by name, at most the request's partition limit and never more than
KAFKA_DESCRIBE_PARTITIONS_MAX partitions, then a cursor to where the next page starts.

ElectLeaders: a kq partition's leader is its Raft group's, and a group has no fixed preferred replica;
the preferred leader is where the leader balancer (broker/leader_balance.py) wants it, which is where
it is unless leadership is uneven. So a preferred election is ELECTION_NOT_NEEDED for a group whose
leader is already where balance wants it (always, with one group: nothing to balance), and otherwise
the balancer's move of that group: started at once when this process leads the group, else made by
the group leader's own balancer at its next round (the message says which node takes over). A group
electing a leader is PREFERRED_LEADER_NOT_AVAILABLE. kq's Raft never elects an unclean leader: an
unclean election is ELECTION_NOT_NEEDED while the group has a leader, else ELIGIBLE_LEADERS_NOT_AVAILABLE.

ACLs (Kafka's): DescribeLogDirs needs DESCRIBE on the cluster, ElectLeaders ALTER on the cluster
(else CLUSTER_AUTHORIZATION_FAILED), DescribeTopicPartitions DESCRIBE on each topic.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

from kq.broker.auth import CLUSTER, TOPIC
from kq.broker.kafka.authorize import CLUSTER_AUTHORIZATION_FAILED, TOPIC_AUTHORIZATION_FAILED, ApiKey
from kq.broker.kafka.build import build, response_module
from kq.broker.kafka.cluster import NO_AUTHORIZED_OPERATIONS, ClusterApis
from kq.broker.kafka.codes import INVALID_REQUEST, LEADER_NOT_AVAILABLE, NONE, UNKNOWN_TOPIC_OR_PARTITION
from kq.broker.kafka.framing import Request
from kq.broker.kafka.listener import Connection
from kq.broker.leader_balance import Election, LeaderBalancer
from kq.proto.limits import KAFKA_DESCRIBE_PARTITIONS_MAX, KAFKA_PARTITIONS_PER_REQUEST_MAX
from kq.raft.auth import CLUSTER_RESOURCE
from kq.raft.validation import topic_name_problem
from kq.storage import TopicMeta

DESCRIBE_LOG_DIRS, ELECT_LEADERS, DESCRIBE_TOPIC_PARTITIONS = 35, 43, 75
PREFERRED_LEADER_NOT_AVAILABLE = 80  # Kafka's error codes of ElectLeaders.
ELIGIBLE_LEADERS_NOT_AVAILABLE = 83
ELECTION_NOT_NEEDED = 84
UNCLEAN = 1  # ElectLeaders' election_type: 0 preferred, 1 unclean.


class ClusterAdminApis(ClusterApis):
    """DescribeLogDirs, DescribeTopicPartitions and ElectLeaders (see the module), with Metadata and
    the other cluster APIs."""

    # The node's leader balancer (broker/main.py sets it; None: one group, nothing to balance).
    balancer: LeaderBalancer | None = None

    # DescribeLogDirs ----------------------------------------------------------------------------

    async def describe_log_dirs(self, request: Request, connection: Connection) -> Any:
        """This broker's one log dir, its partitions (those named, or all) and their sizes."""
        module = response_module(DESCRIBE_LOG_DIRS, request.api_version)
        if not self._permitted(connection, ApiKey.DESCRIBE_LOG_DIRS, CLUSTER, CLUSTER_RESOURCE):
            return build(
                module.DescribeLogDirsResponse,
                throttle_time=0,
                error_code=CLUSTER_AUTHORIZATION_FAILED,
                results=(),
            )
        wanted = None
        if request.body.topics is not None:
            wanted = {topic.topic: set(topic.partitions) for topic in request.body.topics}
        sizes, total_bytes, usable_bytes = await self._in_reads(self._log_dir, wanted)
        topics = tuple(
            build(
                module.DescribeLogDirsTopic,
                name=name,
                partitions=tuple(
                    build(
                        module.DescribeLogDirsPartition,
                        partition_index=partition,
                        partition_size=size_bytes,
                        offset_lag=0,
                        is_future_key=False,
                    )
                    for partition, size_bytes in partitions
                ),
            )
            for name, partitions in sizes
        )
        result = build(
            module.DescribeLogDirsResult,
            error_code=NONE,
            log_dir=str(self._data_dir()),
            topics=topics,
            total_bytes=total_bytes,
            usable_bytes=usable_bytes,
            is_cordoned=False,
        )
        return build(module.DescribeLogDirsResponse, throttle_time=0, error_code=NONE, results=(result,))

    def _data_dir(self) -> Path:
        """This process's data directory (its store is `<data dir>/store`: raft/data_dir.py)."""
        return self._store.path.resolve().parent

    def _log_dir(
        self, wanted: dict[str, set[int]] | None
    ) -> tuple[list[tuple[str, list[tuple[int, int]]]], int, int]:
        """([(topic, [(partition, size in bytes)])] of the partitions this process's store holds
        among `wanted` (None: all), and its file system's total and free bytes (-1: unknown)."""
        found: list[tuple[str, list[tuple[int, int]]]] = []
        with self._store.read() as reader:
            for topic in reader.topics():
                if wanted is not None and topic.name not in wanted:
                    continue
                partitions = []
                for partition in range(topic.partitions):
                    if wanted is not None and partition not in wanted[topic.name]:
                        continue
                    state = reader.partition(topic.topic_id, partition)
                    if state is not None and self._groups.group_of(topic, partition) == self._groups.group:
                        partitions.append((partition, state.size_bytes))
                if partitions:
                    found.append((topic.name, partitions))
        try:
            usage = shutil.disk_usage(self._data_dir())
        except OSError:
            return found, -1, -1
        return found, usage.total, usage.free

    # DescribeTopicPartitions --------------------------------------------------------------------

    async def describe_topic_partitions(self, request: Request, connection: Connection) -> Any:
        """A page of the topics' partitions from the cursor on, and the cursor of the next page."""
        module = response_module(DESCRIBE_TOPIC_PARTITIONS, request.api_version)
        body = request.body
        limit = KAFKA_DESCRIBE_PARTITIONS_MAX
        if 0 < body.response_partition_limit < limit:
            limit = body.response_partition_limit
        names = None if not body.topics else sorted({topic.name for topic in body.topics})
        found = await self._in_reads(self._topics_for_metadata, names)
        listed: list[tuple[str, TopicMeta | None, int]] = []
        for name, topic in found:
            if names is None:
                if self._visible(connection, ApiKey.DESCRIBE_TOPIC_PARTITIONS, TOPIC, name or ""):
                    listed.append((name or "", topic, NONE))
            elif not self._permitted(connection, ApiKey.DESCRIBE_TOPIC_PARTITIONS, TOPIC, name or ""):
                listed.append((name or "", None, TOPIC_AUTHORIZATION_FAILED))
            else:
                listed.append((name or "", topic, NONE if topic is not None else UNKNOWN_TOPIC_OR_PARTITION))
        cursor = body.cursor
        if cursor is not None and not any(name == cursor.topic_name for name, _, _ in listed):
            answers = tuple(
                self._described_topic(module, name, None, INVALID_REQUEST, 0, 0) for name, _, _ in listed
            )
            return build(
                module.DescribeTopicPartitionsResponse, throttle_time=0, topics=answers, next_cursor=None
            )
        answers_list, next_cursor = self._page(module, listed, cursor, limit)
        return build(
            module.DescribeTopicPartitionsResponse,
            throttle_time=0,
            topics=tuple(answers_list),
            next_cursor=next_cursor,
        )

    def _page(
        self, module: Any, listed: list[tuple[str, TopicMeta | None, int]], cursor: Any, limit: int
    ) -> tuple[list[Any], Any]:
        """The topics of one page (from the cursor's topic and partition on) and the next cursor."""
        answers: list[Any] = []
        left = limit
        started = cursor is None
        for position, (name, topic, code) in enumerate(listed):
            first = 0
            if not started:
                if name != cursor.topic_name:
                    continue
                started, first = True, max(cursor.partition_index, 0)
            count = 0 if topic is None else max(topic.partitions - first, 0)
            if topic is not None and left == 0:
                return answers, build(module.Cursor, topic_name=name, partition_index=first)
            taken = min(count, left)
            answers.append(self._described_topic(module, name, topic, code, first, taken))
            left -= taken
            if taken < count:
                return answers, build(module.Cursor, topic_name=name, partition_index=first + taken)
            if left == 0 and position + 1 < len(listed):
                following, following_topic, _ = listed[position + 1]
                if following_topic is not None:
                    return answers, build(module.Cursor, topic_name=following, partition_index=0)
        return answers, None

    def _described_topic(
        self, module: Any, name: str, topic: TopicMeta | None, code: int, first: int, count: int
    ) -> Any:
        """A topic with its partitions first .. first + count - 1, each led by its Raft group's leader."""
        if topic is None:
            return build(
                module.DescribeTopicPartitionsResponseTopic,
                error_code=code,
                name=name,
                topic_id=uuid.UUID(int=0),
                is_internal=False,
                partitions=(),
                topic_authorized_operations=NO_AUTHORIZED_OPERATIONS,
            )
        partitions = []
        for index in range(first, first + count):
            group = self._groups.group_of(topic, index)
            leader = self._leader_broker(group)
            replicas = tuple(broker.broker_id for broker in self._group_brokers(group))
            live = self._live_broker_ids(group)
            partitions.append(
                build(
                    module.DescribeTopicPartitionsResponsePartition,
                    error_code=NONE if leader else LEADER_NOT_AVAILABLE,
                    partition_index=index,
                    leader_id=leader.broker_id if leader else -1,
                    leader_epoch=-1,
                    replica_nodes=replicas,
                    isr_nodes=live,
                    eligible_leader_replicas=None,
                    last_known_elr=None,
                    offline_replicas=tuple(r for r in replicas if r not in live),
                )
            )
        return build(
            module.DescribeTopicPartitionsResponseTopic,
            error_code=NONE,
            name=topic.name,
            topic_id=uuid.UUID(int=topic.topic_id),
            is_internal=False,
            partitions=tuple(partitions),
            topic_authorized_operations=NO_AUTHORIZED_OPERATIONS,
        )

    # ElectLeaders -------------------------------------------------------------------------------

    async def elect_leaders(self, request: Request, connection: Connection) -> Any:
        """Each partition's election as the module says (kq's leaders are its Raft groups')."""
        module = response_module(ELECT_LEADERS, request.api_version)
        body = request.body
        unclean = getattr(body, "election_type", 0) == UNCLEAN
        wanted = await self._in_reads(self._election_partitions, body.topic_partitions)
        code = NONE
        if not self._permitted(connection, ApiKey.ELECT_LEADERS, CLUSTER, CLUSTER_RESOURCE):
            code = CLUSTER_AUTHORIZATION_FAILED
        elif len(wanted) > KAFKA_PARTITIONS_PER_REQUEST_MAX:
            code = INVALID_REQUEST
        answers: list[tuple[int, str | None]]
        if code != NONE:
            answers = [(code, None)] * len(wanted)
        else:
            groups = {group for _, _, group in wanted if group is not None}
            elections = await self._in_workers(self._elections, sorted(groups), unclean)
            answers = [
                (UNKNOWN_TOPIC_OR_PARTITION, None) if group is None else elections[group]
                for _, _, group in wanted
            ]
        by_topic: dict[str, list[Any]] = {}
        for (name, partition, _), (partition_code, message) in zip(wanted, answers, strict=True):
            by_topic.setdefault(name, []).append(
                build(
                    module.PartitionResult,
                    partition_id=partition,
                    error_code=partition_code,
                    error_message=message,
                )
            )
        results = tuple(
            build(module.ReplicaElectionResult, topic=name, partition_result=tuple(partitions))
            for name, partitions in by_topic.items()
        )
        return build(
            module.ElectLeadersResponse, throttle_time=0, error_code=code, replica_election_results=results
        )

    def _election_partitions(self, named: Any) -> list[tuple[str, int, int | None]]:
        """(topic, partition, its Raft group; None: no such partition) of each partition named, or of
        every partition (null)."""
        with self._store.read() as reader:
            if named is None:
                return [
                    (topic.name, partition, self._groups.group_of(topic, partition))
                    for topic in reader.topics()
                    for partition in range(topic.partitions)
                ]
            wanted = []
            for entry in named:
                topic = None if topic_name_problem(entry.topic) else reader.topic(entry.topic)
                for partition in entry.partitions:
                    exists = topic is not None and 0 <= partition < topic.partitions
                    group = self._groups.group_of(topic, partition) if topic is not None and exists else None
                    wanted.append((entry.topic, partition, group))
            return wanted

    def _elections(self, groups: list[int], unclean: bool) -> dict[int, tuple[int, str | None]]:
        """(Kafka error code, message) of each group's election (on a worker: a hand-over may start)."""
        answers: dict[int, tuple[int, str | None]] = {}
        for group in groups:
            leader = self._leader_broker(group)
            if unclean:
                answers[group] = (
                    (ELECTION_NOT_NEEDED, None)
                    if leader is not None
                    else (ELIGIBLE_LEADERS_NOT_AVAILABLE, "Raft elects a leader once a majority is up")
                )
            elif self.balancer is None:
                answers[group] = (
                    (ELECTION_NOT_NEEDED, None)
                    if leader is not None
                    else (PREFERRED_LEADER_NOT_AVAILABLE, "the partition's Raft group is electing its leader")
                )
            else:
                answers[group] = _election_answer(group, self.balancer.elect(group))
        return answers


def _election_answer(group: int, election: Election) -> tuple[int, str | None]:
    """A group's preferred election, as ElectLeaders answers it (see the module)."""
    if election.leader is None:
        return PREFERRED_LEADER_NOT_AVAILABLE, "the partition's Raft group is electing its leader"
    if election.move is None:
        return ELECTION_NOT_NEEDED, None
    target = election.move.target
    if election.started:
        return NONE, f"group {group}'s leadership is being handed to node {target}"
    return (
        NONE,
        f"node {election.move.source}'s leader balancer hands group {group} to node {target} next round",
    )
