"""Fuzz cases for every RPC of kq.v1.Broker: hostile field values, mutated batches, raw wire bytes.

`CaseGenerator.next_case()` draws one `Case` from a seeded generator: the RPC, the exact request
bytes, where to send it (the leader or a given node) and a one-line label for the failure report.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError, Message

from kq.proto import kq_pb2
from kq.proto.limits import PRODUCE_MANY_REQUESTS_MAX, RAFT_GROUPS_MAX
from tests.system.fuzz_batches import batch_case
from tests.system.fuzz_valid import FUZZ_TOPICS, VALID, swap_one_field, valid_produce
from tests.system.fuzz_values import BACKTRACKING_TOPICS, Hostile
from tests.system.fuzz_wire import (
    UNKNOWN_FIELD,
    length_delimited,
    mutate,
    nested_length_delimited,
    nested_unknown_groups,
    random_bytes,
    varint_field,
)

LEADER = "leader"
LABEL_VALUE_CHARACTERS = 40


@dataclass(frozen=True, slots=True)
class RpcSpec:
    """One RPC: its request and response types, whether it may propose, whether it streams (answers),
    whether requests stream (a case's payload is then the stream's one message)."""

    request: type[Message]
    response: type[Message]
    writes: bool
    streams: bool = False
    request_streams: bool = False


RPCS: dict[str, RpcSpec] = {
    "CreateTopic": RpcSpec(kq_pb2.CreateTopicRequest, kq_pb2.CreateTopicResponse, True),
    "DeleteTopic": RpcSpec(kq_pb2.DeleteTopicRequest, kq_pb2.DeleteTopicResponse, True),
    "ListTopics": RpcSpec(kq_pb2.ListTopicsRequest, kq_pb2.ListTopicsResponse, False),
    "DescribeTopic": RpcSpec(kq_pb2.DescribeTopicRequest, kq_pb2.DescribeTopicResponse, False),
    "Produce": RpcSpec(kq_pb2.ProduceRequest, kq_pb2.ProduceResponse, True),
    "ProduceMany": RpcSpec(kq_pb2.ProduceManyRequest, kq_pb2.ProduceManyResponse, True),
    "ProduceStream": RpcSpec(kq_pb2.ProduceRequest, kq_pb2.ProduceResponse, True, request_streams=True),
    "Fetch": RpcSpec(kq_pb2.FetchRequest, kq_pb2.FetchResponse, False),
    "FetchStream": RpcSpec(kq_pb2.FetchRequest, kq_pb2.FetchResponse, False, streams=True),
    "ListOffsets": RpcSpec(kq_pb2.ListOffsetsRequest, kq_pb2.ListOffsetsResponse, False),
    "DeleteRecords": RpcSpec(kq_pb2.DeleteRecordsRequest, kq_pb2.DeleteRecordsResponse, True),
    "RegisterProducer": RpcSpec(kq_pb2.RegisterProducerRequest, kq_pb2.RegisterProducerResponse, True),
    "ClusterStatus": RpcSpec(kq_pb2.ClusterStatusRequest, kq_pb2.ClusterStatusResponse, False),
    "JoinGroup": RpcSpec(kq_pb2.JoinGroupRequest, kq_pb2.JoinGroupResponse, True),
    "Heartbeat": RpcSpec(kq_pb2.HeartbeatRequest, kq_pb2.HeartbeatResponse, True),
    "LeaveGroup": RpcSpec(kq_pb2.LeaveGroupRequest, kq_pb2.LeaveGroupResponse, True),
    "CommitOffsets": RpcSpec(kq_pb2.CommitOffsetsRequest, kq_pb2.CommitOffsetsResponse, True),
    "FetchOffsets": RpcSpec(kq_pb2.FetchOffsetsRequest, kq_pb2.FetchOffsetsResponse, False),
    "ListGroups": RpcSpec(kq_pb2.ListGroupsRequest, kq_pb2.ListGroupsResponse, False),
    "DescribeGroup": RpcSpec(kq_pb2.DescribeGroupRequest, kq_pb2.DescribeGroupResponse, False),
    "ResetOffsets": RpcSpec(kq_pb2.ResetOffsetsRequest, kq_pb2.ResetOffsetsResponse, True),
    "DeleteGroup": RpcSpec(kq_pb2.DeleteGroupRequest, kq_pb2.DeleteGroupResponse, True),
    "AddNode": RpcSpec(kq_pb2.AddNodeRequest, kq_pb2.AddNodeResponse, True),
    "RemoveNode": RpcSpec(kq_pb2.RemoveNodeRequest, kq_pb2.RemoveNodeResponse, True),
    "AlterTopicConfig": RpcSpec(kq_pb2.AlterTopicConfigRequest, kq_pb2.AlterTopicConfigResponse, True),
    "CreatePartitions": RpcSpec(kq_pb2.CreatePartitionsRequest, kq_pb2.CreatePartitionsResponse, True),
    "PutUser": RpcSpec(kq_pb2.PutUserRequest, kq_pb2.PutUserResponse, True),
    "DeleteUser": RpcSpec(kq_pb2.DeleteUserRequest, kq_pb2.DeleteUserResponse, True),
    "AlterScramCredentials": RpcSpec(
        kq_pb2.AlterScramCredentialsRequest, kq_pb2.AlterScramCredentialsResponse, True
    ),
    "ListUsers": RpcSpec(kq_pb2.ListUsersRequest, kq_pb2.ListUsersResponse, False),
    "CreateToken": RpcSpec(kq_pb2.CreateTokenRequest, kq_pb2.CreateTokenResponse, True),
    "RevokeToken": RpcSpec(kq_pb2.RevokeTokenRequest, kq_pb2.RevokeTokenResponse, True),
    "ListTokens": RpcSpec(kq_pb2.ListTokensRequest, kq_pb2.ListTokensResponse, False),
    "AddAcls": RpcSpec(kq_pb2.AddAclsRequest, kq_pb2.AddAclsResponse, True),
    "RemoveAcls": RpcSpec(kq_pb2.RemoveAclsRequest, kq_pb2.RemoveAclsResponse, True),
    "ListAcls": RpcSpec(kq_pb2.ListAclsRequest, kq_pb2.ListAclsResponse, False),
    "WhoAmI": RpcSpec(kq_pb2.WhoAmIRequest, kq_pb2.WhoAmIResponse, False),
    "InitTransaction": RpcSpec(kq_pb2.InitTransactionRequest, kq_pb2.TransactionResponse, True),
    "AddToTransaction": RpcSpec(kq_pb2.AddToTransactionRequest, kq_pb2.TransactionResponse, True),
    "EndTransaction": RpcSpec(kq_pb2.EndTransactionRequest, kq_pb2.TransactionResponse, True),
    "TxnCommitOffsets": RpcSpec(kq_pb2.TxnCommitOffsetsRequest, kq_pb2.TransactionResponse, True),
    "WriteTxnMarkers": RpcSpec(kq_pb2.WriteTxnMarkersRequest, kq_pb2.WriteTxnMarkersResponse, True),
    "ListTransactions": RpcSpec(kq_pb2.ListTransactionsRequest, kq_pb2.ListTransactionsResponse, False),
}
assert set(RPCS) == {m.name for m in kq_pb2.DESCRIPTOR.services_by_name["Broker"].methods}, "fuzz every RPC"


@dataclass(frozen=True, slots=True)
class Case:
    """One request to send: `node` is a node id or LEADER (resolved when it is sent)."""

    rpc: str
    payload: bytes
    label: str
    node: str

    @property
    def spec(self) -> RpcSpec:
        return RPCS[self.rpc]


def short(value: object) -> str:
    """A value for a label: long strings and lists are abbreviated with their size."""
    if isinstance(value, str | bytes) and len(value) > LABEL_VALUE_CHARACTERS:
        head = value[:12]
        return f"{head!r}…(len {len(value)})"
    if isinstance(value, list | tuple) or type(value).__name__.startswith("Repeated"):
        items = list(value)  # type: ignore[call-overload]
        shown = ", ".join(short(item) for item in items[:2])
        return f"[{shown}{', …' if len(items) > 2 else ''}](n={len(items)})"
    if isinstance(value, Message):
        return "{" + describe(value) + "}"
    return repr(value)


def describe(message: Message) -> str:
    """The set fields of `message`, abbreviated."""
    return " ".join(f"{field.name}={short(value)}" for field, value in message.ListFields())


def _min_index(h: Hostile) -> int:
    # A min_index past the applied index makes the node wait (up to 2 s): keep those rare.
    return 0 if h.chance(0.7) else h.rng.choice([1, 5, 100]) if h.chance(0.7) else h.u64()


def _group_min_indexes(h: Hostile) -> dict[int, int]:
    """Read-your-writes indexes of other Raft groups: none mostly, groups the cluster lacks, huge
    group numbers and indexes, and now and then more entries than RAFT_GROUPS_MAX."""
    if h.chance(0.7):
        return {}
    if h.chance(0.05):
        return dict.fromkeys(range(RAFT_GROUPS_MAX + 1), 1)
    return {h.rng.choice([0, 1, 5, h.u32()]): _min_index(h) for _ in range(h.rng.choice([1, 2, 3]))}


def _create_topic(h: Hostile) -> Message:
    name = h.topic() if h.chance(0.5) else f"fz-{h.rng.randrange(40)}"
    partitions = h.rng.choice([1, 3]) if h.chance(0.5) else h.u32()
    return kq_pb2.CreateTopicRequest(name=name, partitions=partitions)


def _create_partitions(h: Hostile) -> Message:
    """A grow of a fuzz topic or a hostile name: counts that grow, do not, or pass PARTITIONS_MAX."""
    name = h.topic() if h.chance(0.5) else f"fz-{h.rng.randrange(40)}"
    partitions = h.rng.choice([1, 2, 4, 1024, 1025]) if h.chance(0.5) else h.u32()
    return kq_pb2.CreatePartitionsRequest(name=name, partitions=partitions, validate_only=h.chance(0.2))


def _delete_topic(h: Hostile) -> Message:
    name = h.topic()
    # Kept: group patterns are matched against the backtracking topics; most cases aim at fz-a and fz-b.
    kept = name in BACKTRACKING_TOPICS or (name in ("fz-a", "fz-b") and h.chance(0.8))
    return kq_pb2.DeleteTopicRequest(name=h.rng.choice(FUZZ_TOPICS) if kept else name)


def _produce(h: Hostile) -> kq_pb2.ProduceRequest:
    batch = batch_case(h.rng, large=h.huge(), producer=h.producer())
    request = kq_pb2.ProduceRequest(topic=h.topic(), records=batch.records)
    if h.chance(0.9):
        request.partition = h.partition()
    return request


def _produce_many(h: Hostile) -> Message:
    """Hostile produce requests in one call: none, a few (a partition maybe twice), or one past the
    count limit."""
    if h.chance(0.05):
        return kq_pb2.ProduceManyRequest(
            requests=[kq_pb2.ProduceRequest(topic="fz-a", partition=0)] * (PRODUCE_MANY_REQUESTS_MAX + 1)
        )
    count = h.rng.choice([0, 1, 2, 3, 4])
    return kq_pb2.ProduceManyRequest(requests=[_produce(h) for _ in range(count)])


def _fetch(h: Hostile) -> Message:
    return kq_pb2.FetchRequest(
        topic=h.topic(),
        partition=h.partition(),
        offset=h.offset(),
        max_records=h.rng.choice([0, 1, 10]) if h.chance(0.5) else h.u32(),
        max_bytes=h.rng.choice([0, 1, 1_000]) if h.chance(0.5) else h.u32(),
        wait_ms=h.wait_ms(),
        min_index=_min_index(h),
        as_batches=h.chance(0.5),
    )


def _join_group(h: Hostile) -> Message:
    group, member_id, _ = h.member()
    request = kq_pb2.JoinGroupRequest(
        group=group if h.chance(0.5) else h.group(),
        member_id=member_id if h.chance(0.4) else "",
        client_id=h.rng.choice(["", "fuzz"]) if h.chance(0.7) else h.text(),
        session_timeout_ms=h.rng.choice([0, 1_000]) if h.chance(0.5) else h.timeout_ms(),
        rebalance_timeout_ms=1_000 if h.chance(0.6) else h.timeout_ms(),
        assignor=h.assignor(),
    )
    roll = h.rng.random()
    if roll < 0.45 or roll > 0.9:  # Topics, or (past 0.9) both topics and a pattern.
        request.topics.extend(h.topic(huge_ok=False) for _ in range(min(h.count(), 1_001) or 1))
    if roll >= 0.45:
        request.topic_pattern = h.pattern()
    return request


def _commit_offsets(h: Hostile) -> Message:
    group, member_id, generation = h.member()
    offsets = [
        kq_pb2.OffsetEntry(
            topic=h.topic(huge_ok=False) if h.chance(0.3) else "fz-a",
            partition=h.partition(),
            offset=h.offset(),
        )
        for _ in range(h.count())
    ]
    return kq_pb2.CommitOffsetsRequest(
        group=group, member_id=member_id, generation=generation, offsets=offsets
    )


def _fetch_offsets(h: Hostile) -> Message:
    partitions = [
        kq_pb2.TopicPartition(topic=h.topic(huge_ok=False), partition=h.partition()) for _ in range(h.count())
    ]
    return kq_pb2.FetchOffsetsRequest(group=h.group(), partitions=partitions, min_index=_min_index(h))


def _heartbeat(h: Hostile) -> Message:
    group, member_id, generation = h.member()
    wait_ms = h.rng.choice([0, 0, 100]) if h.chance(0.7) else h.wait_ms()
    return kq_pb2.HeartbeatRequest(group=group, member_id=member_id, generation=generation, wait_ms=wait_ms)


def _leave_group(h: Hostile) -> Message:
    group, member_id, _ = h.member()
    return kq_pb2.LeaveGroupRequest(group=group, member_id=member_id)


def _reset_offsets(h: Hostile) -> Message:
    return kq_pb2.ResetOffsetsRequest(
        group=h.group(),
        topics=[h.topic(huge_ok=False) for _ in range(min(h.count(), 1_001))],
        target=h.enum(4),  # type: ignore[arg-type]
        offset=h.offset(),
        timestamp_ms=h.i64(),
    )


# Node ids that are never a member of the fuzzed cluster: a removal must not shrink it below a majority.
_STRANGER_IDS = ("4", "9", "0", "", "a b", "x" * 65)


def _address(h: Hostile) -> str:
    """A host:port on loopback (nothing, or a kq node that is not the one asked for, answers there),
    or a hostile one; never a name that would need a DNS lookup."""
    host = h.rng.choice(["127.0.0.1", "localhost", "", "::1", "[::1]", h.text()])
    return f"{host}:{h.rng.choice([h.u32(), 1, 0, 65535, 65536])}" if h.chance(0.8) else h.text()


def _scope(h: Hostile) -> int:
    """A membership change's scope: the cluster's (0), or one Raft group's part (internal: group 0's
    leader sends it to another group's; a cluster of one group answers INVALID_REQUEST)."""
    return h.rng.choice([0, 0, 0, 1, 2, h.u32()])


def _add_node(h: Hostile) -> Message:
    member = kq_pb2.Member(
        node_id=h.rng.choice([*_STRANGER_IDS, "1", h.text()]),
        raft_address=_address(h),
        grpc_address=_address(h),
        kafka_address=_address(h) if h.chance(0.5) else "",
        rack=h.rng.choice(["", "a", h.text()]),
    )
    return kq_pb2.AddNodeRequest(member=member, group=_scope(h))


_CONFIG_NAMES = ("retention.ms", "retention.bytes", "cleanup.policy", "max.message.bytes", "segment.ms")


def _config_entry(h: Hostile) -> kq_pb2.ConfigEntry:
    value = h.rng.choice(["1", "-1", "0", "compact", "delete", "compact,delete", str(h.i64()), h.text()])
    return kq_pb2.ConfigEntry(name=h.rng.choice([*_CONFIG_NAMES, "", h.text()]), value=value)


def _alter_topic_config(h: Hostile) -> Message:
    return kq_pb2.AlterTopicConfigRequest(
        name=h.topic(),
        set=[_config_entry(h) for _ in range(h.rng.choice([0, 1, 1, 2, 40]))],
        remove=[h.rng.choice([*_CONFIG_NAMES, h.text()]) for _ in range(h.rng.choice([0, 0, 1, 2]))],
    )


def _user(h: Hostile) -> str:
    return h.rng.choice(["fz-user", "alice", "", "ANONYMOUS", "a b", "x" * 65, h.text()])


def _scram(h: Hostile) -> kq_pb2.ScramCredential:
    """SCRAM credentials: sizes and counts around the limits, mechanisms known and not."""
    size = h.rng.choice([32, 64, 0, 31, 65, 1_000])
    return kq_pb2.ScramCredential(
        mechanism=h.rng.choice(["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", "", h.text()]),
        salt=h.rng.randbytes(h.rng.choice([16, 24, 64, 0, 15, 65, 10_000])),
        stored_key=h.rng.randbytes(size),
        server_key=h.rng.randbytes(h.rng.choice([size, 32, 64])),
        iterations=h.rng.choice([4_096, 100_000, 0, 4_095, 100_001, h.u32()]),
    )


def _acls(h: Hostile) -> list[kq_pb2.Acl]:
    """ACLs: plausible ones, and every field hostile (open enums, odd principals and names)."""
    return [
        kq_pb2.Acl(
            principal=h.rng.choice(["User:fz-user", "User:*", "fz-user", "User:", "Node:1", h.text()]),
            resource_type=h.enum(4),  # type: ignore[arg-type]
            resource_name=h.rng.choice(["fz-a", "*", "kq-cluster", "", h.topic()]),
            pattern_type=h.enum(3),  # type: ignore[arg-type]
            operation=h.enum(8),  # type: ignore[arg-type]
            permission=h.enum(3),  # type: ignore[arg-type]
        )
        for _ in range(h.rng.choice([1, 1, 2, 0, 101]))
    ]


def _transactional_id(h: Hostile) -> str:
    return h.rng.choice(["fz-tx", "", "x" * 256, h.text()])


def _txn_partitions(h: Hostile) -> list[kq_pb2.TxnPartition]:
    return [
        kq_pb2.TxnPartition(topic=h.topic(), partition=h.partition())
        for _ in range(h.rng.choice([0, 1, 3, 1_001]))
    ]


BUILDERS: dict[str, Callable[[Hostile], Message]] = {
    "CreateTopic": _create_topic,
    "DeleteTopic": _delete_topic,
    "ListTopics": lambda h: kq_pb2.ListTopicsRequest(min_index=_min_index(h)),
    "DescribeTopic": lambda h: kq_pb2.DescribeTopicRequest(
        name=h.topic(), min_index=_min_index(h), group_min_indexes=_group_min_indexes(h)
    ),
    "Produce": _produce,
    "ProduceMany": _produce_many,
    "ProduceStream": _produce,
    "Fetch": _fetch,
    "FetchStream": _fetch,
    "ListOffsets": lambda h: kq_pb2.ListOffsetsRequest(
        topic=h.topic(), min_index=_min_index(h), group_min_indexes=_group_min_indexes(h)
    ),
    "DeleteRecords": lambda h: kq_pb2.DeleteRecordsRequest(
        topic=h.topic(), partition=h.partition(), before_offset=h.offset()
    ),
    "RegisterProducer": lambda h: kq_pb2.RegisterProducerRequest(),
    "ClusterStatus": lambda h: kq_pb2.ClusterStatusRequest(),
    "JoinGroup": _join_group,
    "Heartbeat": _heartbeat,
    "LeaveGroup": _leave_group,
    "CommitOffsets": _commit_offsets,
    "FetchOffsets": _fetch_offsets,
    "ListGroups": lambda h: kq_pb2.ListGroupsRequest(min_index=_min_index(h)),
    "DescribeGroup": lambda h: kq_pb2.DescribeGroupRequest(group=h.group(), min_index=_min_index(h)),
    "ResetOffsets": _reset_offsets,
    "DeleteGroup": lambda h: kq_pb2.DeleteGroupRequest(group=h.group()),
    "AddNode": _add_node,
    "RemoveNode": lambda h: kq_pb2.RemoveNodeRequest(
        node_id=h.rng.choice([*_STRANGER_IDS, h.text()]), group=_scope(h)
    ),
    "AlterTopicConfig": _alter_topic_config,
    "CreatePartitions": _create_partitions,
    "PutUser": lambda h: kq_pb2.PutUserRequest(
        name=_user(h), credentials=[_scram(h) for _ in range(h.rng.choice([1, 2, 0, 3]))]
    ),
    "DeleteUser": lambda h: kq_pb2.DeleteUserRequest(name=_user(h)),
    "AlterScramCredentials": lambda h: kq_pb2.AlterScramCredentialsRequest(
        upsertions=[
            kq_pb2.ScramUpsertion(user=_user(h), credential=_scram(h)) for _ in range(h.rng.choice([0, 1, 2]))
        ],
        deletions=[
            kq_pb2.ScramDeletion(
                user=_user(h), mechanism=h.rng.choice(["SCRAM-SHA-256", "SCRAM-SHA-512", h.text()])
            )
            for _ in range(h.rng.choice([0, 1, 2]))
        ],
    ),
    "ListUsers": lambda h: kq_pb2.ListUsersRequest(),
    "CreateToken": lambda h: kq_pb2.CreateTokenRequest(
        user=_user(h), ttl_s=h.u64(), description=h.rng.choice(["", "fuzz", h.text()])
    ),
    "RevokeToken": lambda h: kq_pb2.RevokeTokenRequest(
        token_id=h.rng.choice(["0123456789abcdef", "", "0123456789ABCDEF", h.text()])
    ),
    "ListTokens": lambda h: kq_pb2.ListTokensRequest(user=_user(h)),
    "AddAcls": lambda h: kq_pb2.AddAclsRequest(acls=_acls(h)),
    "RemoveAcls": lambda h: kq_pb2.RemoveAclsRequest(acls=_acls(h)),
    "ListAcls": lambda h: kq_pb2.ListAclsRequest(principal=h.rng.choice(["", "User:fz-user", h.text()])),
    "WhoAmI": lambda h: kq_pb2.WhoAmIRequest(),
    "InitTransaction": lambda h: kq_pb2.InitTransactionRequest(
        transactional_id=_transactional_id(h), timeout_ms=h.rng.choice([0, 999, 60_000, 900_001, h.u32()])
    ),
    "AddToTransaction": lambda h: kq_pb2.AddToTransactionRequest(
        transactional_id=_transactional_id(h),
        producer_id=h.u64(),
        producer_epoch=h.u32(),
        partitions=_txn_partitions(h),
        groups=[h.group() for _ in range(h.rng.choice([0, 1, 17]))],
    ),
    "EndTransaction": lambda h: kq_pb2.EndTransactionRequest(
        transactional_id=_transactional_id(h),
        producer_id=h.u64(),
        producer_epoch=h.u32(),
        commit=h.chance(0.5),
    ),
    "TxnCommitOffsets": lambda h: kq_pb2.TxnCommitOffsetsRequest(
        transactional_id=_transactional_id(h),
        producer_id=h.u64(),
        producer_epoch=h.u32(),
        group=h.group(),
        offsets=[
            kq_pb2.OffsetEntry(topic=h.topic(), partition=h.partition(), offset=h.offset(), metadata=h.text())
            for _ in range(h.rng.choice([0, 1, 3]))
        ],
        member_id=h.member()[1],  # KIP-447's consumer: a live member, or hostile ids.
        generation=h.rng.choice([-1, 0, 1, 2, 2**31 - 1, -(2**31)]),
        group_instance_id=h.rng.choice(["", "fz-static", h.text()]),
    ),
    "WriteTxnMarkers": lambda h: kq_pb2.WriteTxnMarkersRequest(
        group=h.rng.choice([0, 1, h.u32()]),
        marker=kq_pb2.TransactionMarkerCommand(
            producer_id=h.u64(),
            producer_epoch=h.u32(),
            commit=h.chance(0.5),
            partitions=_txn_partitions(h),
            groups=[h.group()],
            timestamp_ms=h.i64(),
            coordinator_epoch=h.u32(),
            opened_at=h.rng.choice([None, 0, -1, h.rng.randrange(50), h.i64()]),  # An int64: never u64's.
        ),
    ),
    "ListTransactions": lambda h: kq_pb2.ListTransactionsRequest(transactional_id=_transactional_id(h)),
}
assert set(BUILDERS) == set(RPCS), "every RPC has a builder"

# Repeated message fields of the requests: the only places where a parser recurses into a message.
NESTED_FIELDS = {"CommitOffsets": 4, "FetchOffsets": 2}


def _deep_nesting(rng: random.Random, rpc: str) -> tuple[bytes, str]:
    """Deeply nested bytes: through a message field where the schema has one, else unknown fields."""
    depth = rng.choice([200, 1_000, 20_000])
    field = NESTED_FIELDS.get(rpc)
    if field is not None and rng.random() < 0.5:
        leaf = length_delimited(UNKNOWN_FIELD, b"") if rng.random() < 0.5 else b""
        # The outer level is the message field; below it the same number is an unknown field of the entry.
        return nested_length_delimited(field, depth, leaf), f"field {field} nested {depth} deep"
    if rng.random() < 0.5:
        return nested_unknown_groups(depth), f"unknown groups nested {depth} deep"
    return nested_length_delimited(UNKNOWN_FIELD, depth), f"unknown field nested {depth} deep"


class CaseGenerator:
    """Draws cases: batch mutations, valid requests, valid ones with one hostile field, hostile values
    throughout, and raw wire bytes (mutations of valid and hostile requests, random, deeply nested)."""

    def __init__(self, hostile: Hostile, node_ids: list[str]) -> None:
        self.hostile = hostile
        self.rng = hostile.rng
        self.node_ids = node_ids
        self.rpc_names = sorted(RPCS)

    def _node(self) -> str:
        return LEADER if self.rng.random() < 0.6 else self.rng.choice(self.node_ids)

    def next_case(self) -> Case:
        """The next case; never one that removes a member of the cluster (a random name, a mutation
        or raw bytes can spell "1"): a removed node rightly stops serving, and the end checks expect
        every node to serve the canary (the membership tests cover removal)."""
        while True:
            case = self._any_case()
            if not self._removes_a_member(case):
                return case

    def _removes_a_member(self, case: Case) -> bool:
        if case.rpc != "RemoveNode":
            return False
        try:
            request = kq_pb2.RemoveNodeRequest.FromString(case.payload)
        except DecodeError:
            return False
        return request.node_id in self.node_ids

    def _any_case(self) -> Case:
        roll = self.rng.random()
        if roll < 0.15:
            return self._batch_case()
        rpc = self.rng.choice(self.rpc_names)
        if roll < 0.25:
            message = VALID[rpc](self.hostile)
            return Case(rpc, message.SerializeToString(), f"valid: {describe(message)}", self._node())
        if roll < 0.45:
            message, field = swap_one_field(
                self.hostile, VALID[rpc](self.hostile), BUILDERS[rpc](self.hostile)
            )
            label = f"valid but {field}: {describe(message)}"
            return Case(rpc, message.SerializeToString(), label, self._node())
        if roll < 0.7:
            message = BUILDERS[rpc](self.hostile)
            return Case(rpc, message.SerializeToString(), describe(message), self._node())
        return self._raw_case(rpc)

    def _batch_case(self) -> Case:
        """A produce request to a partition that exists, so the batch itself is what gets checked."""
        batch = batch_case(self.rng, large=self.hostile.huge(), producer=self.hostile.producer())
        request = kq_pb2.ProduceRequest(
            topic=self.rng.choice(["fz-a", "fz-b"]), partition=0, records=batch.records
        )
        label = f"topic={request.topic} partition=0 records: {batch.label}"
        node = LEADER if self.rng.random() < 0.8 else self._node()
        if self.rng.random() < 0.25:  # The same batch inside a ProduceMany call, beside a valid request.
            other = "fz-b" if request.topic == "fz-a" else "fz-a"
            beside = valid_produce(self.hostile)
            beside.topic = other
            many = kq_pb2.ProduceManyRequest(requests=[request, beside][:: self.rng.choice([1, -1])])
            return Case("ProduceMany", many.SerializeToString(), f"ProduceMany of {label}", node)
        if self.rng.random() < 0.2:  # The same batch as a message of a produce stream.
            return Case("ProduceStream", request.SerializeToString(), f"ProduceStream of {label}", node)
        return Case("Produce", request.SerializeToString(), label, node)

    def _raw_case(self, rpc: str) -> Case:
        kind = self.rng.random()
        if kind < 0.2:
            payload, label = random_bytes(self.rng)
        elif kind < 0.35:
            payload, label = _deep_nesting(self.rng, rpc)
        elif kind < 0.45:
            payload, label = _raw_fields(self.rng), "fields with arbitrary numbers and values"
        else:
            builder = VALID[rpc] if self.rng.random() < 0.5 else BUILDERS[rpc]
            message = builder(self.hostile)
            payload, what = mutate(self.rng, message.SerializeToString())
            label = f"{what} of {{{describe(message)}}}"
        return Case(rpc, payload, f"raw: {label}", self._node())


def _raw_fields(rng: random.Random) -> bytes:
    """Well-formed wire bytes whose field numbers and values ignore the schema."""
    parts: list[bytes] = []
    for _ in range(rng.randint(1, 6)):
        field = rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 100, 2**29 - 1])
        if rng.random() < 0.5:
            parts.append(varint_field(field, rng.choice([0, 1, -1, 2**63, 2**64 - 1])))
        else:
            parts.append(length_delimited(field, rng.randbytes(rng.choice([0, 1, 10]))))
    return b"".join(parts)


def parse_response(rpc: str, data: bytes) -> Any:
    """The response message of `rpc` decoded from `data` (raises DecodeError when malformed)."""
    return RPCS[rpc].response.FromString(data)
