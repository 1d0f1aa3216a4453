"""Builders and the codec of the `Command` envelope (protobuf, versioned): the Raft log's format."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kq.proto import kq_pb2
from kq.proto.limits import COMMAND_VERSION


class UnknownCommandError(Exception):
    """A log entry this code cannot decode: every replica of this version refuses it alike."""


class NewerCommandError(Exception):
    """An entry written by a newer version of kq: this node must be upgraded before it can apply it."""


def encode(command: kq_pb2.Command) -> bytes:
    """Serializes a command for the Raft log."""
    return command.SerializeToString()


def decode(data: bytes) -> kq_pb2.Command:
    """Parses a log entry; raises UnknownCommandError for an entry this version cannot apply."""
    command = kq_pb2.Command()
    try:
        command.ParseFromString(data)
    except Exception as error:  # protobuf raises its own DecodeError hierarchy.
        raise UnknownCommandError(f"undecodable command: {error}") from error
    if command.version > COMMAND_VERSION:
        raise NewerCommandError(f"command version {command.version}, this node knows {COMMAND_VERSION}")
    if command.version != COMMAND_VERSION:
        raise UnknownCommandError(f"command version {command.version}, this node knows {COMMAND_VERSION}")
    if command.WhichOneof("kind") is None:
        raise UnknownCommandError("command has no kind")
    return command


def create_topic(
    name: str,
    partitions: int,
    created_ms: int,
    configs: Mapping[str, str] | None = None,
    topic_id: int = 0,
    groups: int = 1,
) -> kq_pb2.Command:
    """Command creating topic `name`, with config overrides by Kafka's names (raft/topic_config.py);
    `topic_id` set: with that id (another group's copy of a metadata group's topic), else a new one;
    `groups`: the Raft groups its partitions are spread over."""
    entries = [kq_pb2.ConfigEntry(name=key, value=value) for key, value in sorted((configs or {}).items())]
    return kq_pb2.Command(
        version=COMMAND_VERSION,
        create_topic=kq_pb2.CreateTopicCommand(
            name=name,
            partitions=partitions,
            created_ms=created_ms,
            configs=entries,
            topic_id=topic_id,
            groups=groups,
        ),
    )


def alter_topic_config(topic: str, set_configs: Mapping[str, str], remove: Sequence[str]) -> kq_pb2.Command:
    """Command setting and removing a topic's config overrides."""
    entries = [kq_pb2.ConfigEntry(name=key, value=value) for key, value in sorted(set_configs.items())]
    return kq_pb2.Command(
        version=COMMAND_VERSION,
        alter_topic_config=kq_pb2.AlterTopicConfigCommand(topic=topic, set=entries, remove=sorted(remove)),
    )


def grow_partitions(topic: str, partitions: int, topic_id: int = 0) -> kq_pb2.Command:
    """Grows a topic to `partitions` partitions (`topic_id`: a copy's, broker/topic_sync.py)."""
    return kq_pb2.Command(
        version=COMMAND_VERSION,
        grow_partitions=kq_pb2.GrowPartitionsCommand(topic=topic, partitions=partitions, topic_id=topic_id),
    )


def delete_topic(name: str, topic_id: int = 0) -> kq_pb2.Command:
    """Command deleting topic `name` and all its records (`topic_id` set: only if it has that id)."""
    return kq_pb2.Command(
        version=COMMAND_VERSION, delete_topic=kq_pb2.DeleteTopicCommand(name=name, topic_id=topic_id)
    )


def compact(
    topic: str, topic_id: int, partition: int, batches: Sequence[tuple[int, Sequence[int]]]
) -> kq_pb2.Command:
    """Command dropping records from a partition's stored batches: (base offset, offsetDeltas) each."""
    return kq_pb2.Command(
        version=COMMAND_VERSION,
        compact=kq_pb2.CompactCommand(
            topic=topic,
            topic_id=topic_id,
            partition=partition,
            batches=[kq_pb2.BatchCompaction(base_offset=b, dropped=list(d)) for b, d in batches],
        ),
    )


def purge_topic(topic_id: int) -> kq_pb2.Command:
    """Command deleting more of the batches a deleted topic left (PurgeTopicCommand)."""
    return kq_pb2.Command(version=COMMAND_VERSION, purge_topic=kq_pb2.PurgeTopicCommand(topic_id=topic_id))


def register_producer(registered_ms: int) -> kq_pb2.Command:
    """Command allocating a new idempotent producer id."""
    return kq_pb2.Command(
        version=COMMAND_VERSION,
        register_producer=kq_pb2.RegisterProducerCommand(registered_ms=registered_ms),
    )


def append(
    timestamp_ms: int, appends: Sequence[kq_pb2.PartitionAppend], leader_epoch: int = 0
) -> kq_pb2.Command:
    """Command appending several produce requests' records in one entry (group commit).

    Built in place: passing the appends to the messages' constructors copied each twice through a
    serialize and a parse (upb's MergeFrom), 3-6 ms for an entry of 3 MiB against 1.4 ms here."""
    command = kq_pb2.Command(version=COMMAND_VERSION)
    command.append.SetInParent()  # The oneof's case even for a timestamp of 0 and no appends.
    command.append.timestamp_ms = timestamp_ms
    command.append.leader_epoch = leader_epoch
    command.append.appends.extend(appends)
    return command


def partition_append(topic: str, partition: int, records: bytes) -> kq_pb2.PartitionAppend:
    """One produce request's share of an AppendCommand: one Kafka RecordBatch v2 (proto/records.py)."""
    return kq_pb2.PartitionAppend(topic=topic, partition=partition, records=records)


def trim(topic: str, partition: int, before_offset: int, topic_id: int = 0) -> kq_pb2.Command:
    """Command deleting a partition's records below `before_offset` (of topic id `topic_id` only, when
    it is not 0: retention names the topic it measured)."""
    return kq_pb2.Command(
        version=COMMAND_VERSION,
        trim=kq_pb2.TrimCommand(
            topic=topic, partition=partition, before_offset=before_offset, topic_id=topic_id
        ),
    )


def join_group(group: str, member: kq_pb2.GroupMember, assignor: str, now_ms: int) -> kq_pb2.Command:
    """Command adding or refreshing a group member."""
    return kq_pb2.Command(
        version=COMMAND_VERSION,
        join_group=kq_pb2.JoinGroupCommand(group=group, member=member, assignor=assignor, now_ms=now_ms),
    )


def leave_group(group: str, member_ids: Sequence[str], now_ms: int, expired: bool = False) -> kq_pb2.Command:
    """Command removing members that left (or whose session or rebalance timed out)."""
    return kq_pb2.Command(
        version=COMMAND_VERSION,
        leave_group=kq_pb2.LeaveGroupCommand(
            group=group, member_ids=member_ids, now_ms=now_ms, expired=expired
        ),
    )


def commit_offsets(
    group: str,
    member_id: str,
    generation: int,
    offsets: Sequence[kq_pb2.OffsetEntry],
    now_ms: int,
    kafka: bool = False,
) -> kq_pb2.Command:
    """Command storing a group's committed offsets (`kafka`: a Kafka client's, under Kafka's rules)."""
    return kq_pb2.Command(
        version=COMMAND_VERSION,
        commit_offsets=kq_pb2.CommitOffsetsCommand(
            group=group,
            member_id=member_id,
            generation=generation,
            offsets=offsets,
            now_ms=now_ms,
            kafka=kafka,
        ),
    )


def kafka_join_group(
    group: str, member: kq_pb2.GroupMember, protocol_type: str, now_ms: int, new_member_id: bool
) -> kq_pb2.Command:
    """Command adding or refreshing a Kafka client's member (`new_member_id`: the leader chose its id)."""
    return kq_pb2.Command(
        version=COMMAND_VERSION,
        kafka_join_group=kq_pb2.KafkaJoinGroupCommand(
            group=group,
            member=member,
            protocol_type=protocol_type,
            now_ms=now_ms,
            new_member_id=new_member_id,
        ),
    )


def kafka_sync_group(
    group: str, member_id: str, generation: int, assignments: Sequence[kq_pb2.KafkaAssignment]
) -> kq_pb2.Command:
    """Command storing a Kafka group leader's assignments for its generation."""
    return kq_pb2.Command(
        version=COMMAND_VERSION,
        kafka_sync_group=kq_pb2.KafkaSyncGroupCommand(
            group=group, member_id=member_id, generation=generation, assignments=assignments
        ),
    )


def consumer_heartbeat(
    group: str,
    member: kq_pb2.GroupMember,
    member_epoch: int,
    now_ms: int,
    subscription_set: bool,
    owned: Sequence[kq_pb2.TopicPartition] | None,
) -> kq_pb2.Command:
    """Command applying a consumer-group member's heartbeat (KIP-848; `owned` None: unchanged)."""
    return kq_pb2.Command(
        version=COMMAND_VERSION,
        consumer_heartbeat=kq_pb2.ConsumerHeartbeatCommand(
            group=group,
            member=member,
            member_epoch=member_epoch,
            subscription_set=subscription_set,
            owned_set=owned is not None,
            owned=owned or (),
            now_ms=now_ms,
        ),
    )


def reset_offsets(group: str, offsets: Sequence[kq_pb2.OffsetEntry]) -> kq_pb2.Command:
    """Command setting the offsets of a group without members."""
    return kq_pb2.Command(
        version=COMMAND_VERSION, reset_offsets=kq_pb2.ResetOffsetsCommand(group=group, offsets=offsets)
    )


def delete_group(group: str) -> kq_pb2.Command:
    """Command deleting a group without members."""
    return kq_pb2.Command(version=COMMAND_VERSION, delete_group=kq_pb2.DeleteGroupCommand(group=group))


def offset_delete(
    group: str, partitions: Sequence[kq_pb2.TopicPartition], generation: int, phase: int
) -> kq_pb2.Command:
    """Forgets the group's committed offsets of `partitions`, if the group (with members) is still at
    `generation` and `phase` (Kafka's OffsetDelete)."""
    return kq_pb2.Command(
        version=COMMAND_VERSION,
        offset_delete=kq_pb2.OffsetDeleteCommand(
            group=group,
            partitions=partitions,
            generation=generation,
            phase=phase,  # type: ignore[arg-type]
        ),
    )


def register_member(member: kq_pb2.Member, cluster_id: str) -> kq_pb2.Command:
    """Command recording a cluster member's addresses (and, the first time, the cluster id)."""
    return kq_pb2.Command(
        version=COMMAND_VERSION,
        register_member=kq_pb2.RegisterMemberCommand(member=member, cluster_id=cluster_id),
    )


def unregister_member(node_id: str) -> kq_pb2.Command:
    """Command forgetting a member's addresses once it left the Raft voters."""
    return kq_pb2.Command(
        version=COMMAND_VERSION, unregister_member=kq_pb2.UnregisterMemberCommand(node_id=node_id)
    )


def put_user(name: str, credentials: Sequence[kq_pb2.ScramCredential]) -> kq_pb2.Command:
    """Command creating user `name`, or replacing its credentials."""
    return kq_pb2.Command(
        version=COMMAND_VERSION, put_user=kq_pb2.PutUserCommand(name=name, credentials=credentials)
    )


def delete_user(name: str) -> kq_pb2.Command:
    """Command deleting user `name` and its tokens."""
    return kq_pb2.Command(version=COMMAND_VERSION, delete_user=kq_pb2.DeleteUserCommand(name=name))


def put_token(token: kq_pb2.Token) -> kq_pb2.Command:
    """Command storing a token (its secret's hash only)."""
    return kq_pb2.Command(version=COMMAND_VERSION, put_token=kq_pb2.PutTokenCommand(token=token))


def delete_token(token_id: str) -> kq_pb2.Command:
    """Command revoking a token."""
    return kq_pb2.Command(version=COMMAND_VERSION, delete_token=kq_pb2.DeleteTokenCommand(token_id=token_id))


def alter_scram(
    upsertions: Sequence[kq_pb2.ScramUpsertion], deletions: Sequence[kq_pb2.ScramDeletion]
) -> kq_pb2.Command:
    """Command setting or removing users' SCRAM credentials, one mechanism per user."""
    return kq_pb2.Command(
        version=COMMAND_VERSION,
        alter_scram=kq_pb2.AlterScramCommand(upsertions=upsertions, deletions=deletions),
    )


def add_acls(acls: Sequence[kq_pb2.Acl]) -> kq_pb2.Command:
    """Command adding ACLs (those already there stay once)."""
    return kq_pb2.Command(version=COMMAND_VERSION, add_acls=kq_pb2.AddAclsCommand(acls=acls))


def remove_acls(acls: Sequence[kq_pb2.Acl]) -> kq_pb2.Command:
    """Command removing the ACLs equal to these."""
    return kq_pb2.Command(version=COMMAND_VERSION, remove_acls=kq_pb2.RemoveAclsCommand(acls=acls))


def expire_producers(now_ms: int, expiration_ms: int) -> kq_pb2.Command:
    """Command expiring the producer windows idle for `expiration_ms` at `now_ms` (ExpireProducersCommand)."""
    expiry = kq_pb2.ExpireProducersCommand(now_ms=now_ms, expiration_ms=expiration_ms)
    return kq_pb2.Command(version=COMMAND_VERSION, expire_producers=expiry)


def expire_transactional_ids(now_ms: int, expiration_ms: int) -> kq_pb2.Command:
    """Command forgetting the idle transactional ids (ExpireTransactionalIdsCommand)."""
    expiry = kq_pb2.ExpireTransactionalIdsCommand(now_ms=now_ms, expiration_ms=expiration_ms)
    return kq_pb2.Command(version=COMMAND_VERSION, expire_transactional_ids=expiry)


def barrier(proposed_ms: int) -> kq_pb2.Command:
    """A no-op entry a leader commits before a read that must not be stale (BarrierCommand)."""
    return kq_pb2.Command(version=COMMAND_VERSION, barrier=kq_pb2.BarrierCommand(proposed_ms=proposed_ms))


TransactionMessage = (
    kq_pb2.InitTransactionCommand
    | kq_pb2.AddToTransactionCommand
    | kq_pb2.EndTransactionCommand
    | kq_pb2.CompleteTransactionCommand
    | kq_pb2.TransactionMarkerCommand
    | kq_pb2.TxnCommitOffsetsCommand
)
_TRANSACTION_KINDS: dict[type, str] = {
    kq_pb2.InitTransactionCommand: "init_transaction",
    kq_pb2.AddToTransactionCommand: "add_to_transaction",
    kq_pb2.EndTransactionCommand: "end_transaction",
    kq_pb2.CompleteTransactionCommand: "complete_transaction",
    kq_pb2.TransactionMarkerCommand: "transaction_marker",
    kq_pb2.TxnCommitOffsetsCommand: "txn_commit_offsets",
}


def transaction(message: TransactionMessage) -> kq_pb2.Command:
    """Command carrying one of the transaction steps (raft/transactions.py), by its message's type."""
    command = kq_pb2.Command(version=COMMAND_VERSION)
    getattr(command, _TRANSACTION_KINDS[type(message)]).CopyFrom(message)
    return command
