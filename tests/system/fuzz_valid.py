"""Valid requests for every Broker RPC, and the same with one field swapped for a hostile value.

A hostile value inside an otherwise valid request gets past every other check, so it reaches the
deepest code that reads it (and the report names exactly one odd field). Valid requests also keep
real state moving: topics, groups with members, producers, trimmed logs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf.message import Message

from kq.client.security import acl, scram_credential
from kq.proto import kq_pb2
from tests.system.fuzz_batches import NOT_IDEMPOTENT, batch_case
from tests.system.fuzz_values import BACKTRACKING_TOPICS, Hostile

VALID_PATTERNS = ("fz-.*", "fz-[ab]", "a+-", "(a+)+-", "(a|a)*-", "(a|aa)+-", "(.*a){20}-", "a*a*a*a*a*a*b")
GROUPS = tuple(f"fz-g{number}" for number in range(4))
FUZZ_TOPICS = tuple(f"fz-{number}" for number in range(40))  # Created and deleted by the fuzz cases.


def valid_produce(h: Hostile) -> kq_pb2.ProduceRequest:
    with h.known.lock:
        producer_ids = list(h.known.producer_ids)
    producer = NOT_IDEMPOTENT
    if producer_ids and h.chance(0.3):  # Idempotent, in and out of sequence, up to where it wraps.
        producer = (
            h.rng.choice(producer_ids),
            h.rng.choice([0, 0, 1]),
            h.rng.choice([0, 0, 1, 5, 2**31 - 1]),
        )
    batch = batch_case(h.rng, large=False, producer=producer)
    while not batch.label.startswith("valid"):
        batch = batch_case(h.rng, large=False, producer=producer)
    return kq_pb2.ProduceRequest(topic=h.rng.choice(["fz-a", "fz-b"]), partition=0, records=batch.records)


def _produce_many(h: Hostile) -> Message:
    """Valid produce requests to distinct partitions in one call."""
    topics = h.rng.sample(["fz-a", "fz-b"], h.rng.choice([1, 2]))
    requests = [valid_produce(h) for _ in topics]
    for request, topic in zip(requests, topics, strict=True):
        request.topic = topic
    return kq_pb2.ProduceManyRequest(requests=requests)


def _fetch(h: Hostile) -> Message:
    return kq_pb2.FetchRequest(
        topic=h.rng.choice(["fz-a", "fz-b"]),
        partition=h.rng.randrange(3) if h.chance(0.3) else 0,
        offset=h.rng.randrange(30),
        max_records=h.rng.choice([1, 10, 500]),
        max_bytes=h.rng.choice([0, 100, 1 << 20]),
        as_batches=h.chance(0.5),
    )


def _join_group(h: Hostile) -> Message:
    request = kq_pb2.JoinGroupRequest(
        group=h.rng.choice(GROUPS),
        client_id="fuzz",
        session_timeout_ms=h.rng.choice([1_000, 3_000]),
        rebalance_timeout_ms=1_000,
        assignor=h.rng.choice(["", "range", "roundrobin", "sticky"]),
    )
    if h.chance(0.5):
        request.topics.extend(h.rng.sample(["fz-a", "fz-b", *BACKTRACKING_TOPICS], h.rng.randint(1, 3)))
    else:
        request.topic_pattern = h.rng.choice(VALID_PATTERNS)
    return request


def _member_request(h: Hostile, kind: type[Message]) -> Message:
    group, member_id, generation = h.member()
    fields = {"group": group, "member_id": member_id}
    if kind is not kq_pb2.LeaveGroupRequest:
        fields["generation"] = generation  # type: ignore[assignment]
    return kind(**fields)


def _commit_offsets(h: Hostile) -> Message:
    request = _member_request(h, kq_pb2.CommitOffsetsRequest)
    assert isinstance(request, kq_pb2.CommitOffsetsRequest)
    if h.chance(0.4):  # A commit outside group management: no member, generation 0.
        request.group, request.member_id, request.generation = h.rng.choice(GROUPS), "", 0
    # Offsets past the log end are legal to commit (Kafka allows it); lag must still be computable.
    offset = h.rng.randrange(25) if h.chance(0.7) else h.rng.choice([1_000, 2**63 - 1, 2**64 - 1])
    request.offsets.append(kq_pb2.OffsetEntry(topic="fz-a", partition=h.rng.choice([0, 0, 1]), offset=offset))
    return request


def _reset_offsets(h: Hostile) -> Message:
    return kq_pb2.ResetOffsetsRequest(
        group=h.rng.choice(GROUPS),
        topics=[h.rng.choice(["fz-a", "fz-b"])],
        target=h.rng.randrange(4),  # type: ignore[arg-type]
        offset=h.rng.randrange(5),
        timestamp_ms=h.rng.choice([0, 1_700_000_000_000]),
    )


_FUZZ_CREDENTIAL = scram_credential("SCRAM-SHA-256", "fz-password")


def _fuzz_acl(h: Hostile) -> kq_pb2.Acl:
    return acl(
        "User:fz-user",
        h.rng.choice(["read", "write", "describe", "all"]),
        h.rng.choice(["topic", "group"]),
        h.rng.choice(["fz-a", "fz-", "*"]),
        prefixed=h.chance(0.3),
        deny=h.chance(0.2),
    )


VALID: dict[str, Callable[[Hostile], Message]] = {
    "CreateTopic": lambda h: kq_pb2.CreateTopicRequest(
        name=h.rng.choice([*FUZZ_TOPICS, "fz-a", "fz-b"]), partitions=h.rng.choice([1, 3])
    ),
    "DeleteTopic": lambda h: kq_pb2.DeleteTopicRequest(name=h.rng.choice(FUZZ_TOPICS)),
    "ListTopics": lambda h: kq_pb2.ListTopicsRequest(),
    "DescribeTopic": lambda h: kq_pb2.DescribeTopicRequest(name=h.rng.choice(["fz-a", "fz-b"])),
    "Produce": valid_produce,
    "ProduceMany": _produce_many,
    "ProduceStream": valid_produce,
    "Fetch": _fetch,
    "FetchStream": _fetch,
    "ListOffsets": lambda h: kq_pb2.ListOffsetsRequest(topic=h.rng.choice(["fz-a", "fz-b"])),
    "DeleteRecords": lambda h: kq_pb2.DeleteRecordsRequest(
        topic=h.rng.choice(["fz-b", *FUZZ_TOPICS]), partition=0, before_offset=h.rng.randrange(3)
    ),
    "RegisterProducer": lambda h: kq_pb2.RegisterProducerRequest(),
    "ClusterStatus": lambda h: kq_pb2.ClusterStatusRequest(),
    "JoinGroup": _join_group,
    "Heartbeat": lambda h: _member_request(h, kq_pb2.HeartbeatRequest),
    "LeaveGroup": lambda h: _member_request(h, kq_pb2.LeaveGroupRequest),
    "CommitOffsets": _commit_offsets,
    "FetchOffsets": lambda h: kq_pb2.FetchOffsetsRequest(group=h.rng.choice(GROUPS)),
    "ListGroups": lambda h: kq_pb2.ListGroupsRequest(),
    "DescribeGroup": lambda h: kq_pb2.DescribeGroupRequest(group=h.rng.choice(GROUPS)),
    "ResetOffsets": _reset_offsets,
    "DeleteGroup": lambda h: kq_pb2.DeleteGroupRequest(group=h.rng.choice(GROUPS)),
    # Well formed, for a node nobody runs (refused: it does not answer) or one that is not a member.
    "AddNode": lambda h: kq_pb2.AddNodeRequest(
        member=kq_pb2.Member(node_id="9", raft_address="127.0.0.1:1", grpc_address="127.0.0.1:2")
    ),
    "RemoveNode": lambda h: kq_pb2.RemoveNodeRequest(node_id="9"),
    "CreatePartitions": lambda h: kq_pb2.CreatePartitionsRequest(
        name=h.rng.choice(FUZZ_TOPICS), partitions=h.rng.choice([2, 4, 8])
    ),
    "AlterTopicConfig": lambda h: kq_pb2.AlterTopicConfigRequest(
        name=h.rng.choice(["fz-a", "fz-b"]),
        set=[kq_pb2.ConfigEntry(name="retention.ms", value=h.rng.choice(["-1", "86400000"]))],
    ),
    # Users, tokens and ACLs: a user the cases create, delete, hold tokens of and grant to.
    "PutUser": lambda h: kq_pb2.PutUserRequest(name="fz-user", credentials=[_FUZZ_CREDENTIAL]),
    "DeleteUser": lambda h: kq_pb2.DeleteUserRequest(name="fz-user"),
    "AlterScramCredentials": lambda h: (
        kq_pb2.AlterScramCredentialsRequest(
            upsertions=[kq_pb2.ScramUpsertion(user="fz-user", credential=_FUZZ_CREDENTIAL)]
        )
        if h.rng.random() < 0.5
        else kq_pb2.AlterScramCredentialsRequest(
            deletions=[kq_pb2.ScramDeletion(user="fz-user", mechanism="SCRAM-SHA-512")]
        )
    ),
    "ListUsers": lambda h: kq_pb2.ListUsersRequest(),
    "CreateToken": lambda h: kq_pb2.CreateTokenRequest(user="fz-user", ttl_s=h.rng.choice([0, 60])),
    "RevokeToken": lambda h: kq_pb2.RevokeTokenRequest(token_id="0123456789abcdef"),
    "ListTokens": lambda h: kq_pb2.ListTokensRequest(user=h.rng.choice(["", "fz-user"])),
    "AddAcls": lambda h: kq_pb2.AddAclsRequest(acls=[_fuzz_acl(h)]),
    "RemoveAcls": lambda h: kq_pb2.RemoveAclsRequest(acls=[_fuzz_acl(h)]),
    "ListAcls": lambda h: kq_pb2.ListAclsRequest(),
    "WhoAmI": lambda h: kq_pb2.WhoAmIRequest(),
    # A transactional id the cases initialize, add to, commit offsets for and end (with the epochs and
    # producer ids they guess: most are fenced or unknown, some go through).
    "InitTransaction": lambda h: kq_pb2.InitTransactionRequest(transactional_id="fz-tx", timeout_ms=60_000),
    "AddToTransaction": lambda h: kq_pb2.AddToTransactionRequest(
        transactional_id="fz-tx",
        producer_id=h.rng.choice([1, 2, 3]),
        producer_epoch=h.rng.choice([0, 1]),
        partitions=[kq_pb2.TxnPartition(topic=h.rng.choice(["fz-a", "fz-b"]), partition=0)],
        groups=[h.rng.choice(GROUPS)] if h.chance(0.5) else [],
    ),
    "EndTransaction": lambda h: kq_pb2.EndTransactionRequest(
        transactional_id="fz-tx",
        producer_id=h.rng.choice([1, 2, 3]),
        producer_epoch=h.rng.choice([0, 1]),
        commit=h.chance(0.5),
    ),
    "TxnCommitOffsets": lambda h: kq_pb2.TxnCommitOffsetsRequest(
        transactional_id="fz-tx",
        producer_id=h.rng.choice([1, 2, 3]),
        producer_epoch=h.rng.choice([0, 1]),
        group=h.rng.choice(GROUPS),
        offsets=[kq_pb2.OffsetEntry(topic="fz-a", partition=0, offset=1, metadata="fz")],
        member_id=h.rng.choice(["", "fz-member"]),
        generation=h.rng.choice([-1, 0, 1]),
        group_instance_id=h.rng.choice(["", "fz-static"]),
    ),
    "WriteTxnMarkers": lambda h: kq_pb2.WriteTxnMarkersRequest(
        group=0,
        marker=kq_pb2.TransactionMarkerCommand(
            producer_id=h.rng.choice([1, 2, 3]),
            producer_epoch=h.rng.choice([0, 1]),
            commit=h.chance(0.5),
            partitions=[kq_pb2.TxnPartition(topic="fz-a", partition=0)],
            timestamp_ms=1,
            coordinator_epoch=h.rng.choice([0, 1, 2**32 - 1]),  # Past group 0's term: refused, retried.
        ),
    ),
    "ListTransactions": lambda h: kq_pb2.ListTransactionsRequest(
        transactional_id=h.rng.choice(["", "fz-tx"])
    ),
}


def swap_one_field(h: Hostile, valid: Message, hostile: Message) -> tuple[Message, str]:
    """`valid` with one field taken from `hostile` (cleared when `hostile` leaves it unset)."""
    fields: Sequence[Any] = valid.DESCRIPTOR.fields  # Two descriptor classes in the stubs (pure, upb).
    if not fields:
        return valid, "no fields"
    field = h.rng.choice(fields)
    result = type(valid)()
    result.CopyFrom(valid)
    result.ClearField(field.name)
    value = getattr(hostile, field.name)
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        getattr(result, field.name).update(value)  # A map (group_min_indexes): repeated, no extend.
    elif field.is_repeated:
        getattr(result, field.name).extend(value)
    elif field.message_type is not None:
        if hostile.HasField(field.name):
            getattr(result, field.name).CopyFrom(value)
    elif not field.has_presence or hostile.HasField(field.name):
        setattr(result, field.name, value)
    return result, field.name
