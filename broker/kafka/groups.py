"""Kafka's classic consumer-group protocol and offset APIs over kq's replicated groups.

JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, ListGroups and
DescribeGroups. The Raft leader coordinates every group (FindCoordinator names it), so a request
that reaches a follower answers NOT_COORDINATOR (COORDINATOR_NOT_AVAILABLE when no leader is
known) and the client looks for the coordinator again.

What is decided where:
- The edge (here, on the leader) checks a request with the shared validation (raft/validation.py),
  chooses what must be chosen once (a new member's id, the clock) and proposes one command:
  `kafka_join_group`, `kafka_sync_group` (the leader member's only), `leave_group`,
  `commit_offsets` (kafka=True). Kafka's rules on membership, generations, the protocol and the
  leader member are applied in apply (raft/kafka_groups.py), identically on every replica.
- Heartbeats are not replicated: they refresh the leader's `GroupCoordinator`, which proposes the
  expiry of silent members (session timeout) and of members that do not rejoin a rebalance in time
  (rebalance timeout), as it does for kq's own groups.
- JoinGroup and SyncGroup wait for the group to change as coroutines on the applied notifier
  (`_until_answered`): no thread is held while they wait, only a reader slot.
- Member ids handed out with MEMBER_ID_REQUIRED (JoinGroup v4+) are remembered in memory on the
  leader until used (at most KAFKA_PENDING_MEMBERS_MAX, each for KAFKA_PENDING_MEMBER_S): a join
  naming an id the group does not hold and the leader did not hand out answers UNKNOWN_MEMBER_ID.
  After a failover the new leader knows none of them: the client gets UNKNOWN_MEMBER_ID and joins
  again from scratch, as Kafka clients do.
"""

from __future__ import annotations

import datetime
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from kq.broker.auth import GROUP, TOPIC
from kq.broker.errors import KqError
from kq.broker.kafka.authorize import GROUP_AUTHORIZATION_FAILED, TOPIC_AUTHORIZATION_FAILED, ApiKey
from kq.broker.kafka.base import KafkaBase, KafkaSettings, kafka_code
from kq.broker.kafka.build import build, response_module
from kq.broker.kafka.codes import (
    COORDINATOR_NOT_AVAILABLE,
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_GROUP_ID,
    INVALID_REQUEST,
    INVALID_SESSION_TIMEOUT,
    MEMBER_ID_REQUIRED,
    NONE,
    NOT_COORDINATOR,
    OFFSET_OUT_OF_RANGE,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from kq.broker.kafka.framing import Request
from kq.broker.kafka.listener import Connection
from kq.broker.proposals import propose_and_wait, wall_clock_ms
from kq.broker.service import BrokerService
from kq.broker.waiters import METADATA
from kq.proto import kq_pb2
from kq.proto.errors import ErrorCode
from kq.proto.limits import (
    CLIENT_ID_LENGTH_MAX,
    KAFKA_GROUP_WAIT_S_MAX,
    KAFKA_JOIN_GRACE_S,
    KAFKA_PENDING_MEMBER_S,
    KAFKA_PENDING_MEMBERS_MAX,
    MEMBER_ID_PREFIX_MAX,
    OFFSETS_PER_COMMIT_MAX,
    PROPOSAL_TIMEOUT_S,
    REBALANCE_TIMEOUT_MS_MAX,
    REBALANCE_TIMEOUT_MS_MIN,
    SESSION_TIMEOUT_MS_MAX,
    SESSION_TIMEOUT_MS_MIN,
    TRANSACTIONAL_IDS_MAX,
    TXN_PENDING_OFFSETS_MAX,
    WAIT_RECHECK_S,
)
from kq.raft import commands
from kq.raft.consumer_groups import STALE_MEMBER_EPOCH, is_consumer_group
from kq.raft.kafka_groups import DEAD, FENCED_INSTANCE_ID, find, state_name
from kq.raft.results import ApplyResult, GroupResult, KafkaGroupResult
from kq.raft.transactions import ONGOING, PREPARED
from kq.raft.validation import (
    assignments_problem,
    kafka_member_problem,
    member_id_problem,
    offset_metadata_problem,
    topic_name_problem,
)
from kq.storage import StoreReader
from kq.storage.offset_details import NO_OFFSET_DETAILS, OffsetDetails

OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP = 8, 9, 11, 12, 13
SYNC_GROUP, DESCRIBE_GROUPS, LIST_GROUPS = 14, 15, 16
KQ_PROTOCOL_TYPE = "kq"  # What Kafka clients see as the protocol type of kq's own groups with members.
NO_AUTHORIZED_OPERATIONS = -(2**31)

PendingKey = tuple[str, str]  # (group, member id)


def _ms(value: datetime.timedelta | int | None, default: int) -> int:
    """Milliseconds of a kio duration field (None or a version without it: `default`)."""
    if value is None:
        return default
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)


def _new_member_id(prefix: str) -> str:
    """A fresh member id, as Kafka makes them: the client (or instance) id, shortened, and a UUID."""
    short = prefix.encode()[:MEMBER_ID_PREFIX_MAX].decode(errors="ignore") or "member"
    return f"{short}-{uuid.uuid4()}"


def _client_host(connection: Connection) -> str:
    """The client's address as Kafka shows it ("/127.0.0.1")."""
    address = connection.peer.removeprefix("kafka:").rpartition(":")[0]
    return f"/{address}" if address else ""


def _metadata(member: kq_pb2.GroupMember, protocol: str) -> bytes:
    """The member's metadata for the group's chosen protocol (empty before one is chosen)."""
    return next((p.metadata for p in member.protocols if p.name == protocol), b"")


OFFSET_METADATA_TOO_LARGE = 12  # Kafka's code for a metadata string over offset.metadata.max.bytes.
UNSTABLE_OFFSET_COMMIT = 88  # Kafka's: an open transaction holds an offset of the partition (retriable).
OPEN_PHASES = (ONGOING, *PREPARED)  # A transaction whose offsets may still be pending.


class GroupApis(KafkaBase):
    """Kafka's consumer-group and offset APIs (see the module)."""

    def __init__(self, service: BrokerService, settings: KafkaSettings) -> None:
        super().__init__(service, settings)
        # Member ids handed out with MEMBER_ID_REQUIRED and not yet joined -> when (monotonic s). Loop only.
        self._pending: OrderedDict[PendingKey, float] = OrderedDict()

    # Shared steps -------------------------------------------------------------------------------

    def _coordinator_code(self, group: str) -> int:
        """NONE on the leader of the group's coordinator group (raft/placement.py; this process's when
        the cluster has one group); else the code that sends a Kafka client looking for the coordinator."""
        if self._groups.coordinator_of(group) != self._groups.group:
            return NOT_COORDINATOR
        if self._consensus.is_leader():
            return NONE
        return NOT_COORDINATOR if self._consensus.leader_grpc_address() else COORDINATOR_NOT_AVAILABLE

    @staticmethod
    def _error_code(error: KqError) -> int:
        """A kq error as a group API answers it: retriable ones make the client find the coordinator."""
        code = kafka_code(error, NOT_COORDINATOR)
        if error.retriable and code not in (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE):
            return COORDINATOR_NOT_AVAILABLE
        return code

    async def _propose(self, command: kq_pb2.Command) -> ApplyResult:
        """Checks (shared validation), proposes and waits for the result on a worker thread."""
        return await self._in_workers(propose_and_wait, self._consensus, command, PROPOSAL_TIMEOUT_S)

    async def _kafka_result(self, command: kq_pb2.Command) -> int:
        """Proposes a command answered by a KafkaGroupResult: Kafka's error code either way."""
        try:
            result = await self._propose(command)
        except KqError as error:
            return self._error_code(error)
        assert isinstance(result, KafkaGroupResult), f"a Kafka group command answered {result!r}"
        return result.kafka_error

    async def _group(self, name: str) -> kq_pb2.GroupState | None:
        return await self._in_reads(self._read_group, name)

    def _read_group(self, name: str) -> kq_pb2.GroupState | None:
        with self._store.read() as reader:
            return _state(reader, name)

    def _remember_pending(self, key: PendingKey) -> None:
        now = time.monotonic()
        while self._pending and (
            len(self._pending) >= KAFKA_PENDING_MEMBERS_MAX
            or next(iter(self._pending.values())) < now - KAFKA_PENDING_MEMBER_S
        ):
            self._pending.popitem(last=False)
        self._pending[key] = now

    def _is_pending(self, key: PendingKey) -> bool:
        seen = self._pending.get(key)
        return seen is not None and seen >= time.monotonic() - KAFKA_PENDING_MEMBER_S

    async def _wait_for_group(
        self,
        connection: Connection,
        step: Callable[[bool], Awaitable[Any | None]],
        wait_s: float,
        on_error: Callable[[int], Any],
    ) -> Any:
        """`step` until it answers (see ServiceBase._until_answered); kq errors answer `on_error`."""
        deadline = time.monotonic() + min(wait_s, KAFKA_GROUP_WAIT_S_MAX)
        try:
            return await self._until_answered(
                connection.peer, step, lambda: METADATA, deadline, WAIT_RECHECK_S
            )
        except KqError as error:
            return on_error(self._error_code(error))

    # JoinGroup ----------------------------------------------------------------------------------

    async def join_group(self, request: Request, connection: Connection) -> Any:
        """Joins (or rejoins) a member and waits until the group's join phase ends."""
        body = request.body
        module = response_module(JOIN_GROUP, request.api_version)

        def answer(code: int, member_id: str, **fields: Any) -> Any:
            values: dict[str, Any] = {"generation_id": -1, "protocol_name": "", "leader": "", "members": ()}
            values.update(fields)
            return build(
                module.JoinGroupResponse, throttle_time=0, error_code=code, member_id=member_id, **values
            )

        member_id = body.member_id or ""
        code = self._coordinator_code(body.group_id) or self._join_request_code(body)
        if code != NONE:
            return answer(code, member_id)
        instance_id = getattr(body, "group_instance_id", None) or ""
        new_member_id = not member_id
        if new_member_id:
            member_id = _new_member_id(instance_id or request.client_id or "")
            if request.api_version >= 4 and not instance_id:
                self._remember_pending((body.group_id, member_id))  # KIP-394: the client joins with it.
                return answer(MEMBER_ID_REQUIRED, member_id)
        else:
            code = await self._known_member_code(body.group_id, member_id, instance_id)
            if code != NONE:
                return answer(code, member_id)
        member = self._joining_member(request, connection, member_id, instance_id)
        problem = kafka_member_problem(member)
        if problem is not None:
            return answer(INVALID_REQUEST, member_id)
        command = commands.kafka_join_group(
            body.group_id, member, body.protocol_type, wall_clock_ms(), new_member_id
        )
        code = await self._kafka_result(command)
        if code != NONE:
            return answer(code, member_id)
        self._pending.pop((body.group_id, member_id), None)
        self._coordinator.heard_from(body.group_id, member_id)

        async def step(last: bool) -> Any | None:
            return await self._join_step(module, body.group_id, command, last, answer)

        wait_s = member.rebalance_timeout_ms / 1000 + KAFKA_JOIN_GRACE_S
        return await self._wait_for_group(connection, step, wait_s, lambda c: answer(c, member_id))

    @staticmethod
    def _join_request_code(body: Any) -> int:
        """Kafka's checks of a JoinGroup before anything is proposed."""
        if topic_name_problem(body.group_id, "group"):
            return INVALID_GROUP_ID
        session_ms = _ms(body.session_timeout, 0)
        if not SESSION_TIMEOUT_MS_MIN <= session_ms <= SESSION_TIMEOUT_MS_MAX:
            return INVALID_SESSION_TIMEOUT
        if not body.protocol_type or not body.protocols:
            return INCONSISTENT_GROUP_PROTOCOL
        return NONE

    async def _known_member_code(self, group: str, member_id: str, instance_id: str) -> int:
        """NONE when a join's member id is the group's or one this leader handed out."""
        if member_id_problem(member_id):
            return UNKNOWN_MEMBER_ID
        state = await self._group(group)
        if state is not None and find(state, member_id) is not None:
            return NONE
        if self._is_pending((group, member_id)):
            return NONE
        if (
            instance_id
            and state is not None
            and any(m.group_instance_id == instance_id for m in state.members)
        ):
            return FENCED_INSTANCE_ID  # Another instance took this static member's place.
        return UNKNOWN_MEMBER_ID

    def _joining_member(
        self, request: Request, connection: Connection, member_id: str, instance_id: str
    ) -> kq_pb2.GroupMember:
        body = request.body
        session_ms = _ms(body.session_timeout, 0)
        rebalance_ms = _ms(getattr(body, "rebalance_timeout", None), session_ms)
        client_id = (request.client_id or "").encode()[:CLIENT_ID_LENGTH_MAX].decode(errors="ignore")
        return kq_pb2.GroupMember(
            member_id=member_id,
            client_id=client_id,
            client_host=_client_host(connection),
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=min(max(rebalance_ms, REBALANCE_TIMEOUT_MS_MIN), REBALANCE_TIMEOUT_MS_MAX),
            group_instance_id=instance_id,
            protocols=[kq_pb2.KafkaProtocol(name=p.name, metadata=p.metadata) for p in body.protocols],
        )

    async def _join_step(
        self, module: Any, group: str, command: kq_pb2.Command, last: bool, answer: Callable[..., Any]
    ) -> Any | None:
        """The JoinGroup answer once the join phase ended; None to wait for the group to change."""
        member_id = command.kafka_join_group.member.member_id
        self._coordinator.heard_from(group, member_id)
        state = await self._group(group)
        mine = None if state is None else find(state, member_id)
        if state is None or mine is None:
            return answer(UNKNOWN_MEMBER_ID, member_id)  # Expired or removed while joining.
        if not self._consensus.is_leader():
            return answer(self._coordinator_code(group), member_id)
        if state.phase == kq_pb2.GROUP_REBALANCING and not state.awaiting_sync:
            if not mine.rejoined:
                # Another member's change began a new rebalance after ours ended: join it as well.
                rejoin = kq_pb2.Command()
                rejoin.CopyFrom(command)
                rejoin.kafka_join_group.new_member_id = False
                rejoin.kafka_join_group.now_ms = wall_clock_ms()
                code = await self._kafka_result(rejoin)
                return None if code == NONE else answer(code, member_id)
            return answer(REBALANCE_IN_PROGRESS, member_id) if last else None
        members = ()
        if member_id == state.leader_member_id:
            members = tuple(
                build(
                    module.JoinGroupResponseMember,
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id or None,
                    metadata=_metadata(m, state.protocol),
                )
                for m in state.members
            )
        return answer(
            NONE,
            member_id,
            generation_id=state.generation,
            protocol_name=state.protocol,
            leader=state.leader_member_id,
            members=members,
        )

    # SyncGroup ----------------------------------------------------------------------------------

    async def sync_group(self, request: Request, connection: Connection) -> Any:
        """The leader member's assignments are stored; every member waits for its own."""
        body = request.body
        module = response_module(SYNC_GROUP, request.api_version)

        def answer(code: int, assignment: bytes = b"") -> Any:
            return build(module.SyncGroupResponse, throttle_time=0, error_code=code, assignment=assignment)

        group, member_id, generation = body.group_id, body.member_id, body.generation_id
        state = None if self._coordinator_code(group) else await self._group(group)
        code = (
            self._coordinator_code(group)
            or _group_id_code(group)
            or _member_code(state, member_id, generation, getattr(body, "group_instance_id", None))
        )
        if code != NONE or state is None:
            return answer(code or UNKNOWN_MEMBER_ID)
        self._coordinator.heard_from(group, member_id)
        if state.awaiting_sync and member_id == state.leader_member_id:
            assignments = [
                kq_pb2.KafkaAssignment(member_id=a.member_id, assignment=a.assignment)
                for a in body.assignments
            ]
            if assignments_problem(assignments) is not None:
                return answer(INVALID_REQUEST)
            code = await self._kafka_result(
                commands.kafka_sync_group(group, member_id, generation, assignments)
            )
            if code != NONE:
                return answer(code)

        async def step(last: bool) -> Any | None:
            self._coordinator.heard_from(group, member_id)
            now = await self._group(group)
            mine = None if now is None else find(now, member_id)
            if now is None or mine is None:
                return answer(UNKNOWN_MEMBER_ID)
            if now.generation != generation or (
                now.phase == kq_pb2.GROUP_REBALANCING and not now.awaiting_sync
            ):
                return answer(REBALANCE_IN_PROGRESS)  # A new rebalance began: the member rejoins.
            if now.phase == kq_pb2.GROUP_STABLE:
                return answer(NONE, mine.kafka_assignment)
            if last or not self._consensus.is_leader():
                return answer(REBALANCE_IN_PROGRESS)
            return None

        mine = find(state, member_id)
        assert mine is not None
        wait_s = mine.rebalance_timeout_ms / 1000 + KAFKA_JOIN_GRACE_S
        return await self._wait_for_group(connection, step, wait_s, answer)

    # Heartbeat and LeaveGroup -------------------------------------------------------------------

    async def heartbeat(self, request: Request, connection: Connection) -> Any:
        """A sign of life, kept in memory by the leader's coordinator; tells a member to rejoin."""
        body = request.body
        module = response_module(HEARTBEAT, request.api_version)
        code = self._coordinator_code(body.group_id) or _group_id_code(body.group_id)
        if code == NONE:
            state = await self._group(body.group_id)
            code = _member_code(
                state, body.member_id, body.generation_id, getattr(body, "group_instance_id", None)
            )
            if code != UNKNOWN_MEMBER_ID:
                self._coordinator.heard_from(body.group_id, body.member_id)
            if code == NONE and state is not None and state.phase == kq_pb2.GROUP_REBALANCING:
                code = NONE if state.awaiting_sync else REBALANCE_IN_PROGRESS
        return build(module.HeartbeatResponse, throttle_time=0, error_code=code)

    async def leave_group(self, request: Request, connection: Connection) -> Any:
        """Removes members at once (v3: several, by member id or group instance id)."""
        body = request.body
        module = response_module(LEAVE_GROUP, request.api_version)
        leaving: list[tuple[str, str | None]] = (
            [(m.member_id, m.group_instance_id) for m in body.members]
            if request.api_version >= 3
            else [(body.member_id, None)]
        )
        top, codes = await self._leave(body.group_id, leaving)
        if request.api_version < 3:
            return build(module.LeaveGroupResponse, throttle_time=0, error_code=top or codes[0])
        members = tuple(
            build(module.MemberResponse, member_id=member_id, group_instance_id=instance_id, error_code=code)
            for (member_id, instance_id), code in zip(leaving, codes, strict=True)
        )
        return build(module.LeaveGroupResponse, throttle_time=0, error_code=top, members=members)

    async def _leave(self, group: str, leaving: list[tuple[str, str | None]]) -> tuple[int, list[int]]:
        """(the request's error code, each member's); the members found are removed in one command."""
        code = self._coordinator_code(group)
        if code == NONE and topic_name_problem(group, "group"):
            code = INVALID_GROUP_ID
        if code != NONE:
            return code, [code] * len(leaving)
        state = await self._group(group)
        resolved = [_leaving_member(state, member_id, instance_id) for member_id, instance_id in leaving]
        ids = sorted({member_id for member_id, code in resolved if code == NONE})
        codes = [code for _, code in resolved]
        if not ids:
            return NONE, codes
        try:
            result = await self._propose(commands.leave_group(group, ids, wall_clock_ms()))
        except KqError as error:
            failed = self._error_code(error)
            return failed, [failed] * len(leaving)
        assert isinstance(result, GroupResult), f"a leave answered {result!r}"
        if result.error != ErrorCode.OK:  # Gone meanwhile (expired): Kafka's answer for an unknown member.
            codes = [UNKNOWN_MEMBER_ID if code == NONE else code for code in codes]
        return NONE, codes

    # Offsets ------------------------------------------------------------------------------------

    async def offset_commit(self, request: Request, connection: Connection) -> Any:
        """Commits offsets of a member's generation (or, generation -1, outside group management).

        Each offset's metadata string and leader epoch (v6+) are kept beside it and answered by
        OffsetFetch (a metadata string over OFFSET_METADATA_BYTES_MAX is OFFSET_METADATA_TOO_LARGE, as
        Kafka answers); retention times (v2-v4) are ignored: committed offsets stay until the group is
        deleted.
        """
        body = request.body
        module = response_module(OFFSET_COMMIT, request.api_version)
        wanted = [
            (topic.name, p.partition_index, p.committed_offset)
            for topic in body.topics
            for p in topic.partitions
        ]
        if not self._permitted(connection, ApiKey.OFFSET_COMMIT, GROUP, body.group_id):
            codes = [GROUP_AUTHORIZATION_FAILED] * len(wanted)
        else:
            refused = self._refused(connection, ApiKey.OFFSET_COMMIT, TOPIC, [name for name, _, _ in wanted])
            committed = iter(await self._commit(body, [entry for entry in wanted if entry[0] not in refused]))
            codes = [
                TOPIC_AUTHORIZATION_FAILED if name in refused else next(committed) for name, _, _ in wanted
            ]
        topics: dict[str, list[Any]] = {}
        for (name, partition, _), code in zip(wanted, codes, strict=True):
            topics.setdefault(name, []).append(
                build(module.OffsetCommitResponsePartition, partition_index=partition, error_code=code)
            )
        return build(
            module.OffsetCommitResponse,
            throttle_time=0,
            topics=tuple(
                build(module.OffsetCommitResponseTopic, name=name, partitions=tuple(partitions))
                for name, partitions in topics.items()
            ),
        )

    async def _commit(self, body: Any, wanted: list[tuple[str, int, int]]) -> list[int]:
        """Each offset's error code; the valid ones are committed in one command."""
        code = self._coordinator_code(body.group_id)
        if code == NONE and topic_name_problem(body.group_id, "group"):
            code = INVALID_GROUP_ID
        if code == NONE and len(wanted) > OFFSETS_PER_COMMIT_MAX:
            code = INVALID_REQUEST
        generation, member_id = body.generation_id_or_member_epoch, body.member_id or ""
        if generation < 0:
            generation, member_id = 0, ""  # Kafka's "simple" commit: kq's member "" of generation 0.
        elif code == NONE and member_id_problem(member_id):
            code = UNKNOWN_MEMBER_ID
        if code != NONE:
            return [code] * len(wanted)
        codes = await self._in_reads(self._offset_codes, wanted)
        details = committed_details(body)
        offsets = []
        for index, (name, partition, offset) in enumerate(wanted):
            if codes[index] != NONE:  # A partition that is not one (-24928 once) has no OffsetEntry.
                continue
            entry = kq_pb2.OffsetEntry(topic=name, partition=partition, offset=offset)
            entry.metadata, epoch = details.get((name, partition), ("", -1))
            if epoch >= 0:
                entry.leader_epoch = epoch
            if offset_metadata_problem(entry) is not None:
                codes[index] = OFFSET_METADATA_TOO_LARGE
            else:
                offsets.append(entry)
        if not offsets:
            return codes
        if member_id:
            self._coordinator.heard_from(body.group_id, member_id)
        command = commands.commit_offsets(
            body.group_id, member_id, generation, offsets, wall_clock_ms(), kafka=True
        )
        result = await self._kafka_result(command)
        return [result if code == NONE else code for code in codes]

    def _offset_codes(self, wanted: list[tuple[str, int, int]]) -> list[int]:
        """Per offset: NONE, or why it cannot be committed (unknown partition, beyond the log end)."""
        codes = []
        with self._store.read() as reader:
            for name, partition, offset in wanted:
                topic = None if topic_name_problem(name) else reader.topic(name)
                log = (
                    None
                    if topic is None or not 0 <= partition < topic.partitions
                    else self._groups.partition_state(reader, topic, partition)
                )
                if log is None:
                    codes.append(UNKNOWN_TOPIC_OR_PARTITION)
                elif not 0 <= offset <= log.log_end_offset:
                    codes.append(OFFSET_OUT_OF_RANGE)
                else:
                    codes.append(NONE)
        return codes

    async def offset_fetch(self, request: Request, connection: Connection) -> Any:
        """The committed offsets of the named partitions (-1: none), or all of the group's (null).

        v8+ asks for several groups at once; v9 names the member of a consumer group (KIP-848) and
        its epoch, which must be the member's (UNKNOWN_MEMBER_ID, STALE_MEMBER_EPOCH), as Kafka checks.
        """
        body = request.body
        module = response_module(OFFSET_FETCH, request.api_version)
        if request.api_version < 8:
            code, topics = await self._fetched(
                module,
                connection,
                body.group_id,
                body.topics,
                None,
                -1,
                v8=False,
                stable=bool(getattr(body, "require_stable", False)),
            )
            return build(module.OffsetFetchResponse, throttle_time=0, topics=topics, error_code=code)
        groups = []
        for group in body.groups:
            code, topics = await self._fetched(
                module,
                connection,
                group.group_id,
                group.topics,
                getattr(group, "member_id", None),
                getattr(group, "member_epoch", -1),
                v8=True,
                stable=bool(body.require_stable),
            )
            answer = build(
                module.OffsetFetchResponseGroup, group_id=group.group_id, topics=topics, error_code=code
            )
            groups.append(answer)
        return build(module.OffsetFetchResponse, throttle_time=0, groups=tuple(groups))

    async def _fetched(
        self,
        module: Any,
        connection: Connection,
        group: str,
        asked: Any,
        member_id: str | None,
        member_epoch: int,
        v8: bool,
        stable: bool = False,
    ) -> tuple[int, tuple[Any, ...]]:
        """One group's error code and committed offsets, as OffsetFetch answers them. `stable`
        (require_stable, KIP-447, v7+: a read_committed consumer asks it): a partition whose offset an
        open transaction has committed and not yet marked answers UNSTABLE_OFFSET_COMMIT (retriable),
        as Kafka does, instead of the offset before the transaction."""
        code = self._coordinator_code(group)
        if code == NONE and topic_name_problem(group, "group"):
            code = INVALID_GROUP_ID
        if code == NONE and not self._permitted(connection, ApiKey.OFFSET_FETCH, GROUP, group):
            code = GROUP_AUTHORIZATION_FAILED
        if code == NONE and (member_id or member_epoch >= 0):
            code = consumer_fetch_code(await self._group(group), member_id, member_epoch)
        committed: dict[tuple[str, int], tuple[int, OffsetDetails]] = {}
        unstable: frozenset[tuple[str, int]] = frozenset()
        if code == NONE:  # Every OffsetFetch: a deposed coordinator must not answer older offsets.
            code = await self._read_barrier()
        if code == NONE:
            committed = await self._in_reads(self._committed, group)
            if stable:
                unstable = await self._in_reads(self._pending_partitions, group)
        refused: frozenset[str] = frozenset()
        if asked is None:  # All of the group's: those of topics the principal may not DESCRIBE left out.
            wanted: dict[str, list[int]] = {}
            for name, partition in sorted(committed):
                if self._visible(connection, ApiKey.OFFSET_FETCH, TOPIC, name):
                    wanted.setdefault(name, []).append(partition)
        else:
            wanted = {topic.name: list(topic.partition_indexes) for topic in asked}
            if code == NONE:
                refused = self._refused(connection, ApiKey.OFFSET_FETCH, TOPIC, wanted)
        if v8 and code != NONE:  # As Kafka: a group's error and no partitions, never offsets of -1 with NONE.
            wanted = {}
        partition_class = module.OffsetFetchResponsePartitions if v8 else module.OffsetFetchResponsePartition
        topic_class = module.OffsetFetchResponseTopics if v8 else module.OffsetFetchResponseTopic
        topics = tuple(
            build(
                topic_class,
                name=name,
                partitions=tuple(
                    build(
                        partition_class,
                        partition_index=partition,
                        committed_offset=-1 if name in refused else found[0],
                        committed_leader_epoch=found[1].leader_epoch,
                        metadata=found[1].metadata,
                        error_code=(
                            TOPIC_AUTHORIZATION_FAILED
                            if name in refused
                            else UNSTABLE_OFFSET_COMMIT
                            if (name, partition) in unstable
                            else NONE
                        )
                        if v8
                        else code
                        or (
                            TOPIC_AUTHORIZATION_FAILED
                            if name in refused
                            else UNSTABLE_OFFSET_COMMIT
                            if (name, partition) in unstable
                            else NONE
                        ),
                    )
                    for partition in partitions
                    for found in [
                        (-1, NO_OFFSET_DETAILS)
                        if name in refused or (name, partition) in unstable
                        else committed.get((name, partition), (-1, NO_OFFSET_DETAILS))
                    ]
                ),
            )
            for name, partitions in wanted.items()
        )
        return code, topics

    async def _read_barrier(self) -> int:
        """NONE once a no-op entry proposed now has been applied here: this store then holds every
        commit acknowledged before the request, which `is_leader()` alone does not prove (a leader
        paused or cut off answers from its old store until it learns it was deposed: the chaos
        exactly-once scenario read committed offsets going back that way). Else the code that sends
        the client to look for the coordinator again. Every OffsetFetch pays this Raft round (a
        consumer sends one when it is assigned partitions, not per poll)."""
        try:
            await self._in_workers(
                propose_and_wait, self._consensus, commands.barrier(wall_clock_ms()), PROPOSAL_TIMEOUT_S
            )
        except KqError as error:
            return self._error_code(error)
        return NONE

    def _pending_partitions(self, group: str) -> frozenset[tuple[str, int]]:
        """The group's partitions whose offsets an open (ONGOING or prepared) transaction committed and
        its marker has not applied yet (raft/transactions.py), from this process's store."""
        pending: set[tuple[str, int]] = set()
        with self._store.read() as reader:
            names = {topic.topic_id: topic.name for topic in reader.topics()}
            for _, raw in reader.transaction_states(TRANSACTIONAL_IDS_MAX):
                state = kq_pb2.TransactionState.FromString(raw)
                if state.phase not in OPEN_PHASES or group not in state.groups:
                    continue
                for row in reader.pending_offsets(state.producer_id, TXN_PENDING_OFFSETS_MAX):
                    if row.group == group and row.topic_id in names:
                        pending.add((names[row.topic_id], row.partition))
        return frozenset(pending)

    def _committed(self, group: str) -> dict[tuple[str, int], tuple[int, OffsetDetails]]:
        """The group's committed offsets with their metadata and leader epochs, by (topic, partition)."""
        with self._store.read() as reader:
            names = {topic.topic_id: topic.name for topic in reader.topics()}
            details = reader.offset_details(group)
            return {
                (names[topic_id], partition): (offset, details.get((topic_id, partition), NO_OFFSET_DETAILS))
                for topic_id, partition, offset, _ in reader.committed_offsets(group)
                if topic_id in names
            }

    # ListGroups and DescribeGroups --------------------------------------------------------------

    async def list_groups(self, request: Request, connection: Connection) -> Any:
        """Every group, from the leader (which coordinates them all); other nodes list none. A principal
        with DESCRIBE on the cluster sees every group, another those it may DESCRIBE (as Kafka)."""
        module = response_module(LIST_GROUPS, request.api_version)
        wanted = {state.lower() for state in getattr(request.body, "states_filter", None) or ()}
        types = {kind.lower() for kind in getattr(request.body, "types_filter", None) or ()}
        states = await self._in_reads(self._all_groups) if self._consensus.is_leader() else []
        principal = connection.principal
        every_group = principal is not None and self._security.lists_every_group(principal)
        groups = tuple(
            build(
                module.ListedGroup,
                group_id=state.name,
                protocol_type=_protocol_type(state),
                group_state=state_name(state),
                group_type=_group_type(state),
            )
            for state in states
            if (not wanted or state_name(state).lower() in wanted)
            and (not types or _group_type(state) in types)
            and (every_group or self._visible(connection, ApiKey.LIST_GROUPS, GROUP, state.name))
        )
        return build(module.ListGroupsResponse, throttle_time=0, error_code=NONE, groups=groups)

    def _all_groups(self) -> list[kq_pb2.GroupState]:
        with self._store.read() as reader:
            return [state for name, _ in reader.groups() if (state := _state(reader, name)) is not None]

    async def describe_groups(self, request: Request, connection: Connection) -> Any:
        """Each group's state, protocol and members (metadata and assignment bytes of Kafka members)."""
        module = response_module(DESCRIBE_GROUPS, request.api_version)
        described = []
        for name in request.body.groups:
            code = self._coordinator_code(name)
            group_code = code or (INVALID_GROUP_ID if topic_name_problem(name, "group") else NONE)
            if group_code == NONE and not self._permitted(connection, ApiKey.DESCRIBE_GROUPS, GROUP, name):
                group_code = GROUP_AUTHORIZATION_FAILED
            state = await self._group(name) if group_code == NONE else None
            described.append(self._described(module, name, group_code, state))
        return build(module.DescribeGroupsResponse, throttle_time=0, groups=tuple(described))

    @staticmethod
    def _described(module: Any, name: str, code: int, state: kq_pb2.GroupState | None) -> Any:
        if state is None:
            return build(
                module.DescribedGroup,
                error_code=code,
                group_id=name,
                group_state=DEAD if code == NONE else "",
                protocol_type="",
                protocol_data="",
                members=(),
                authorized_operations=NO_AUTHORIZED_OPERATIONS,
            )
        kafka = bool(state.protocol_type)
        members = tuple(
            build(
                module.DescribedGroupMember,
                member_id=m.member_id,
                group_instance_id=m.group_instance_id or None,
                client_id=m.client_id,
                client_host=m.client_host,
                member_metadata=_metadata(m, state.protocol) if kafka else b"",
                member_assignment=m.kafka_assignment if kafka else b"",
            )
            for m in state.members
        )
        protocol = state.protocol if kafka else (state.assignor or "range") if state.members else ""
        return build(
            module.DescribedGroup,
            error_code=NONE,
            group_id=name,
            group_state=state_name(state),
            protocol_type=_protocol_type(state),
            protocol_data=protocol,
            members=members,
            authorized_operations=NO_AUTHORIZED_OPERATIONS,
        )


def _state(reader: StoreReader, name: str) -> kq_pb2.GroupState | None:
    """The stored group, or None; a name no group may have (empty, too long for a key) names none."""
    if topic_name_problem(name, "group") is not None:
        return None
    raw = reader.group(name)
    if raw is None:
        return None
    state = kq_pb2.GroupState()
    state.ParseFromString(raw)
    return state


def consumer_fetch_code(state: kq_pb2.GroupState | None, member_id: str | None, member_epoch: int) -> int:
    """Kafka's OffsetFetch v9 check of a consumer group's member (ConsumerGroup.validateOffsetFetch):
    epoch -1 comes from outside the group and names no member; otherwise the member must be in the
    group at that epoch. Classic groups check nothing."""
    if state is None or not is_consumer_group(state):
        return NONE
    if member_epoch < 0:
        return UNKNOWN_MEMBER_ID if member_id else NONE
    member = find(state, member_id or "")
    if member is None:
        return UNKNOWN_MEMBER_ID
    return NONE if member.member_epoch == member_epoch else STALE_MEMBER_EPOCH


def _group_type(state: kq_pb2.GroupState) -> str:
    """ListGroups v5's type (KIP-1043): "consumer" for consumer groups, "classic" for the others."""
    return "consumer" if is_consumer_group(state) else "classic"


def _group_id_code(group: str) -> int:
    """INVALID_GROUP_ID for a group id kq cannot hold (the characters and length of a topic name)."""
    return INVALID_GROUP_ID if topic_name_problem(group, "group") else NONE


def _protocol_type(state: kq_pb2.GroupState) -> str:
    """A Kafka group's own type; "kq" for kq's groups with members; "" for groups holding only offsets."""
    if state.protocol_type:
        return state.protocol_type
    return KQ_PROTOCOL_TYPE if state.members else ""


def _member_code(
    state: kq_pb2.GroupState | None, member_id: str, generation: int, instance_id: str | None
) -> int:
    """Kafka's checks of a member's request against its group: unknown, fenced, stale generation."""
    mine = None if state is None else find(state, member_id)
    if state is None or mine is None or is_consumer_group(state):
        return UNKNOWN_MEMBER_ID  # A consumer group's members speak only ConsumerGroupHeartbeat.
    if instance_id and mine.group_instance_id != instance_id:
        return FENCED_INSTANCE_ID
    if generation != state.generation:
        return ILLEGAL_GENERATION
    return NONE


def _leaving_member(
    state: kq_pb2.GroupState | None, member_id: str, instance_id: str | None
) -> tuple[str, int]:
    """The member id a LeaveGroup entry removes, and NONE; or Kafka's reason it removes none."""
    if state is None or is_consumer_group(state):
        return "", UNKNOWN_MEMBER_ID  # A consumer group's members leave with a heartbeat (epoch -1).
    if instance_id:
        static = next((m for m in state.members if m.group_instance_id == instance_id), None)
        if static is None:
            return "", UNKNOWN_MEMBER_ID
        if member_id and member_id != static.member_id:
            return "", FENCED_INSTANCE_ID
        return static.member_id, NONE
    if find(state, member_id) is None:
        return "", UNKNOWN_MEMBER_ID
    return member_id, NONE


def committed_details(body: Any) -> dict[tuple[str, int], tuple[str, int]]:
    """(metadata, leader epoch) of each offset of an OffsetCommit or TxnOffsetCommit request body
    (before v6 no epoch: -1; a null metadata: "")."""
    return {
        (topic.name, int(p.partition_index)): (
            p.committed_metadata or "",
            int(getattr(p, "committed_leader_epoch", -1)),
        )
        for topic in body.topics
        for p in topic.partitions
    }
