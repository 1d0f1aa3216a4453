"""Builders and the codec of the `Command` envelope (protobuf, versioned): the Raft log's format."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from kq.proto import kq_pb2
from kq.proto.limits import APPEND_ENTRIES_BYTES_MAX, APPEND_ENTRIES_KEPT, COMMAND_VERSION


class UnknownCommandError(Exception):
    """A log entry this code cannot decode: every replica of this version refuses it alike."""


class NewerCommandError(Exception):
    """An entry written by a newer version of kq: this node must be upgraded before it can apply it."""


def encode(command: kq_pb2.Command) -> bytes:
    """Serializes a command for the Raft log."""
    return command.SerializeToString()


def decode(data: bytes | memoryview) -> kq_pb2.Command:
    """Parses a log entry; raises UnknownCommandError for an entry this version cannot apply."""
    command = kq_pb2.Command()
    try:
        command.ParseFromString(data)  # type: ignore[arg-type]  # upb reads any buffer (a follower's view).
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


class RecordsAppend(NamedTuple):
    """One produce request's share of an append entry as plain values: a `PartitionAppend`'s fields.

    The edge checks it and the batcher encodes it (`encode_append`) without a protobuf message: each
    message built, extended into another, serialized and read back copied the batch once more."""

    topic: str
    partition: int
    records: bytes | memoryview  # A view of the entry's bytes when `decode_append` read it.


class AppendEntry(NamedTuple):
    """An append entry's `AppendCommand` as plain values (`decode_append`)."""

    timestamp_ms: int
    leader_epoch: int
    appends: tuple[RecordsAppend, ...]


# The append entry's bytes, as protobuf writes them (field numbers in kq.proto): tags of the fields.
_VERSION_TAG = b"\x08"  # Command.version, varint.
_APPEND_TAG = b"\x22"  # Command.append (4), length-delimited.
_TIMESTAMP_TAG = b"\x08"  # AppendCommand.timestamp_ms (1), varint.
_APPENDS_TAG = b"\x12"  # AppendCommand.appends (2), length-delimited, repeated.
_EPOCH_TAG = b"\xc0\x02"  # AppendCommand.leader_epoch (40), varint.
_TOPIC_TAG = b"\x0a"  # PartitionAppend.topic (1), length-delimited.
_PARTITION_TAG = b"\x10"  # PartitionAppend.partition (2), varint.
_RECORDS_TAG = b"\x2a"  # PartitionAppend.records (5), length-delimited.
_UINT32_MAX = 2**32 - 1
_UINT64 = 2**64


def _encoded_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL_VARINTS = tuple(_encoded_varint(value) for value in range(1 << 14))  # One and two bytes: a lookup.


def varint(value: int) -> bytes:
    """Protobuf's varint of a value in [0, 2**64) (an int64 below 0 is written as value + 2**64)."""
    return _SMALL_VARINTS[value] if value < 16384 else _encoded_varint(value)


def _append_head(append: RecordsAppend) -> bytes:
    """The serialized `PartitionAppend` of `append` up to its records' bytes (the records follow)."""
    topic, partition, records = append
    head = b""
    if topic:
        name = topic.encode()
        head = _TOPIC_TAG + varint(len(name)) + name
    if partition:
        head += _PARTITION_TAG + varint(partition)
    if records:
        head += _RECORDS_TAG + varint(len(records))
    return head


def append_size(append: RecordsAppend) -> int:
    """The bytes of `append` in an entry: its PartitionAppend's `ByteSize()` and the field around it."""
    size = len(_append_head(append)) + len(append.records)
    return len(_APPENDS_TAG) + len(varint(size)) + size


def encode_append(timestamp_ms: int, appends: Sequence[RecordsAppend], leader_epoch: int = 0) -> bytes:
    """`encode(append(...))` of these appends, byte for byte, with each batch copied once: into the
    entry (a join). Protobuf's serializer writes known fields in field-number order and leaves out
    proto3 zero values; this writes the same (tests/raft/test_append_codec.py proves the equality on
    generated entries). Values are the caller's to bound: the batcher's come from checked requests,
    and `check_command`'s envelope limits are checked on the plain values (append_envelope_problem)."""
    body: list[bytes | memoryview] = []
    size = 0
    if timestamp_ms:
        stamp = _TIMESTAMP_TAG + varint(timestamp_ms % _UINT64)
        body.append(stamp)
        size += len(stamp)
    for append in appends:
        head = _append_head(append)
        records = append.records
        field = _APPENDS_TAG + varint(len(head) + len(records)) + head
        body += (field, records)
        size += len(field) + len(records)
    if leader_epoch:
        epoch = _EPOCH_TAG + varint(leader_epoch)
        body.append(epoch)
        size += len(epoch)
    version = _VERSION_TAG + varint(COMMAND_VERSION) if COMMAND_VERSION else b""
    return b"".join((version, _APPEND_TAG, varint(size), *body))


def decode_append(data: bytes | memoryview, batch_bytes_min: int = 0) -> AppendEntry | None:
    """The append entry in `data` when it is in exactly the form `encode_append` writes; None for any
    other bytes (another command, or an append in another encoding), which `decode` then parses, and
    for an entry with a batch shorter than `batch_bytes_min` (where protobuf's parse is faster).

    Each batch is a view of `data` (no copy: `data` is the entry's bytes, or a view of the command
    that holds them, which never change), where protobuf's parse copied it into its arena and each
    read of the field copied it again. Accepting only the canonical form (tags in field order, zero
    values left out, shortest varints, nothing after the message) makes the answer protobuf's own: a
    byte string has one canonical parse. tests/raft/test_append_codec.py checks it on entries
    and on their mutations against `decode`."""
    reader = WireReader(data)
    if COMMAND_VERSION and (not reader.tag(_VERSION_TAG) or reader.varint() != COMMAND_VERSION):
        return None
    if not reader.tag(_APPEND_TAG) or reader.length() != reader.left():
        return None
    timestamp_ms = 0
    if reader.tag(_TIMESTAMP_TAG):
        timestamp_ms = reader.varint()
        if timestamp_ms == 0:
            return None
        if timestamp_ms >= 2**63:
            timestamp_ms -= _UINT64
    appends: list[RecordsAppend] = []
    while reader.tag(_APPENDS_TAG):
        size = reader.length()
        end = reader.offset + size
        append = _partition_append(reader, end, batch_bytes_min)
        if append is None or reader.offset != end:
            return None
        appends.append(append)
    leader_epoch = 0
    if reader.tag(_EPOCH_TAG):
        leader_epoch = reader.varint()
        if not 0 < leader_epoch <= _UINT32_MAX:
            return None
    if reader.failed or reader.left():
        return None
    return AppendEntry(timestamp_ms, leader_epoch, tuple(appends))


def _partition_append(reader: WireReader, end: int, batch_bytes_min: int) -> RecordsAppend | None:
    """The canonical PartitionAppend from the reader's offset up to `end`; None for any other bytes."""
    topic = ""
    if reader.offset < end and reader.tag(_TOPIC_TAG):
        raw = reader.take(reader.length())
        try:
            topic = raw.decode()
        except UnicodeDecodeError:
            return None
        if not topic:
            return None
    partition = 0
    if reader.offset < end and reader.tag(_PARTITION_TAG):
        partition = reader.varint()
        if not 0 < partition <= _UINT32_MAX:
            return None
    records: bytes | memoryview = b""
    if reader.offset < end and reader.tag(_RECORDS_TAG):
        size = reader.length()
        if size < batch_bytes_min:
            return None
        records = reader.view(size)
        if not records:
            return None
    if reader.failed or reader.offset > end or len(records) < batch_bytes_min:
        return None
    return RecordsAppend(topic, partition, records)


class WireReader:
    """Reads protobuf's wire format from `data` (bytes, or a view: raft/wire.py reads a received frame's,
    and a follower's entry may be a view of its command); any malformed or non-canonical read sets
    `failed` (and returns zero values), so the caller checks once at the end."""

    __slots__ = ("data", "failed", "offset")

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = data
        self.offset = 0
        self.failed = False

    def left(self) -> int:
        return len(self.data) - self.offset

    def tag(self, tag: bytes) -> bool:
        """Whether the next bytes are `tag` (read past them when they are)."""
        if self.failed or self.data[self.offset : self.offset + len(tag)] != tag:
            return False
        self.offset += len(tag)
        return True

    def varint(self) -> int:
        """The next varint, shortest form only, below 2**64."""
        value, shift, data = 0, 0, self.data
        while self.offset < len(data) and shift < 64:
            byte = data[self.offset]
            self.offset += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if (byte == 0 and shift) or value >= _UINT64:  # A padded varint, or one past 64 bits.
                    break
                return value
            shift += 7
        self.failed = True
        return 0

    def length(self) -> int:
        """A length prefix: a varint no larger than what is left."""
        size = self.varint()
        if size > self.left():
            self.failed = True
            return 0
        return size

    def take(self, size: int) -> bytes:
        """The next `size` bytes (a copy)."""
        chunk = bytes(self.data[self.offset : self.offset + size])
        self.offset += size
        return chunk

    def view(self, size: int) -> memoryview:
        """The next `size` bytes, as a view of `data` (no copy: `data`, bytes or a view of a command's
        bytes, never changes)."""
        chunk = memoryview(self.data)[self.offset : self.offset + size]
        self.offset += size
        return chunk


class AppendEntries:
    """The plain values of the append entries this process encoded lately (a leader's proposals),
    found by the identity of their bytes: apply on the leader gets the very object it proposed
    (raft/pysyncobj_adapter.py EntryCalls), and takes the entry from here instead of decoding it, so
    its batches are the edge's own objects (and PassedBatches knows them without comparing bytes).
    `decode_append` of those bytes gives these values (encode_append's round trip, tested), so the
    answer is the same. Bounded by APPEND_ENTRIES_KEPT entries and APPEND_ENTRIES_BYTES_MAX bytes of
entries, oldest out first. Any thread."""

    def __init__(self, kept: int = APPEND_ENTRIES_KEPT, bytes_max: int = APPEND_ENTRIES_BYTES_MAX) -> None:
        self._kept = kept
        self._bytes_max = bytes_max
        self._lock = threading.Lock()
        self._entries: deque[tuple[bytes, AppendEntry]] = deque()
        self._bytes = 0

    def encoded(self, timestamp_ms: int, appends: Sequence[RecordsAppend], leader_epoch: int) -> bytes:
        """`encode_append(...)`, remembered."""
        data = encode_append(timestamp_ms, appends, leader_epoch)
        with self._lock:
            self._entries.append((data, AppendEntry(timestamp_ms, leader_epoch, tuple(appends))))
            self._bytes += len(data)
            entries = self._entries
            while len(entries) > self._kept or (self._bytes > self._bytes_max and len(entries) > 1):
                self._bytes -= len(self._entries.popleft()[0])
        return data

    def recall(self, data: bytes | memoryview) -> AppendEntry | None:
        """The entry `data` was encoded from, if it is one of those remembered (this very object)."""
        with self._lock:
            for encoded, entry in reversed(self._entries):
                if encoded is data:
                    return entry
        return None


APPEND_ENTRIES = AppendEntries()


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
