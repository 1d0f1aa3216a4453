"""The validation shared by the edge and apply: one function per command type, the same code on both sides.

The rule (DESIGN.md, "The one rule"): whatever reaches the Raft log applies on every replica,
deterministically, in bounded time and memory. The gRPC edge builds each command and runs
`command_problem` (and `append_problem` for each produce request) before proposing it; a problem is
answered INVALID_ARGUMENT and nothing is proposed. `apply` runs the very same functions on every
committed entry and turns a problem into a deterministic rejection (a result code), never an
exception, so an entry the edge let through by mistake, or one written by another version, cannot
stop a replica.

Every check here is pure and bounded by the limits in `kq.proto.limits`: a record batch (Kafka's
RecordBatch v2) is checked by proto/records.py `check_batch`, which expands a compressed one at most
to APPEND_BYTES_MAX and walks every record once, a topic pattern is compiled by RE2 within
its memory bound (raft/patterns.py). Each function returns a one-line reason, or None when valid.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from itertools import pairwise

from kq.proto import kq_pb2
from kq.proto.limits import (
    APPEND_BYTES_MAX,
    APPENDS_PER_ENTRY_MAX,
    CLIENT_HOST_LENGTH_MAX,
    CLIENT_ID_LENGTH_MAX,
    CLUSTER_ID_LENGTH_MAX,
    COMPACT_BATCHES_PER_ENTRY_MAX,
    COMPACT_DROPPED_PER_ENTRY_MAX,
    CONSUMER_ASSIGNORS,
    CONSUMER_OWNED_PARTITIONS_MAX,
    GROUP_INSTANCE_ID_LENGTH_MAX,
    GROUP_MEMBERS_MAX,
    GROUP_PROTOCOLS_MAX,
    HEADER_NAME_BYTES_MAX,
    HEADERS_PER_RECORD_MAX,
    HOST_LENGTH_MAX,
    LEADER_EPOCH_MAX,
    LEGAL_NAMES_KEPT,
    MEMBER_ASSIGNMENT_BYTES_MAX,
    MEMBER_ID_LENGTH_MAX,
    MEMBER_METADATA_BYTES_MAX,
    NODE_ID_LENGTH_MAX,
    OFFSET_METADATA_BYTES_MAX,
    OFFSETS_PER_COMMIT_MAX,
    PARTITIONS_MAX,
    PASSED_BATCHES_BYTES_MAX,
    PASSED_BATCHES_KEPT,
    PROTOCOL_NAME_LENGTH_MAX,
    PROTOCOL_TYPE_LENGTH_MAX,
    RACK_ID_LENGTH_MAX,
    RACK_NAME_LENGTH_MAX,
    RAFT_GROUPS_MAX,
    REBALANCE_TIMEOUT_MS_MAX,
    REBALANCE_TIMEOUT_MS_MIN,
    RECORD_BYTES_MAX,
    RECORDS_PER_APPEND_MAX,
    SESSION_TIMEOUT_MS_MAX,
    SESSION_TIMEOUT_MS_MIN,
    SUBSCRIBED_TOPICS_MAX,
    TOPIC_ID_MAX,
    TOPIC_NAME_LENGTH_MAX,
)
from kq.proto.records import MalformedBatchError, WorkBudgetError, WorkMeter, check_batch
from kq.raft.assignors import ASSIGNORS
from kq.raft.auth import AUTH_COMMAND_KINDS, auth_command_problem
from kq.raft.commands import RecordsAppend
from kq.raft.patterns import pattern_problem
from kq.raft.topic_config import configs_problem

TOPIC_NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]+")  # A fixed, linear pattern: not user input.
NAME_PATTERN = TOPIC_NAME_PATTERN  # Node ids, rack names and hosts use the same alphabet.
CLUSTER_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]+")  # Kafka's cluster ids: URL-safe base64.


def topic_name_problem(name: str, what: str = "topic") -> str | None:
    """Why `name` is not a legal topic (or group: `what`) name, or None when it is.

    Legal names are remembered (at most LEGAL_NAMES_KEPT, then forgotten together): every produce
    request's topic is checked at the edge and in apply on every node, and the pattern's match cost
    ~2 µs. Only a legal name (at most TOPIC_NAME_LENGTH_MAX bytes) is kept."""
    if name in _LEGAL_NAMES:
        return None
    problem = _name_problem(name, what)
    if problem is None:
        if len(_LEGAL_NAMES) >= LEGAL_NAMES_KEPT:
            _LEGAL_NAMES.clear()
        _LEGAL_NAMES.add(name)
    return problem


_LEGAL_NAMES: set[str] = set()  # Any thread: a set's add and clear are atomic.


def _name_problem(name: str, what: str) -> str | None:
    if not name:
        return f"{what} name is empty"
    if len(name.encode(errors="surrogatepass")) > TOPIC_NAME_LENGTH_MAX:
        return f"{what} name is longer than {TOPIC_NAME_LENGTH_MAX} bytes"
    if name in (".", ".."):
        return f"{what} name cannot be '.' or '..'"
    if not TOPIC_NAME_PATTERN.fullmatch(name):
        return f"{what} name may contain only ASCII letters, digits, '.', '_' and '-'"
    return None


def partition_count_problem(partitions: int) -> str | None:
    """Why `partitions` is not a legal partition count."""
    if not 0 < partitions <= PARTITIONS_MAX:
        return f"partition count must be between 1 and {PARTITIONS_MAX}, got {partitions}"
    return None


class PassedBatches:
    """Batches this process's edge checked and passed, with the work their check cost: a memo of
    `check_batch`, so the leader's apply of an entry it proposed does not walk its batches again.

    `check_batch` is a pure function of a batch's bytes and the fixed limits, and its work count is
    too (WorkMeter), so a batch byte for byte equal to one that passed passes again at the same
    cost: `recall` answers only for equal bytes (found by length and CRC32C, then compared whole),
    and apply charges its entry's meter the same units, or checks in full when they do not fit
    (where the check would have stopped). Followers, which never saw the request, check in full;
    every replica reaches the same verdict, the one rule's condition. A batch is recalled once (one
    apply on this node); those never applied (refused, or leadership lost) age out, the oldest first,
    beyond PASSED_BATCHES_KEPT batches or PASSED_BATCHES_BYTES_MAX bytes. Any thread: the edge
    remembers on the serving loop or a gRPC worker, apply recalls on the tick thread.
    """

    def __init__(self, kept_max: int, bytes_max: int) -> None:
        self._kept_max = kept_max
        self._bytes_max = bytes_max
        self._lock = threading.Lock()
        self._batches: OrderedDict[tuple[int, bytes], tuple[bytes | memoryview, int]] = OrderedDict()
        self._bytes = 0

    def remember(self, records: bytes | memoryview, work: int) -> None:
        """Notes that `records` passed `check_batch` at a cost of `work` units."""
        if len(records) > self._bytes_max:
            return
        key = _batch_key(records)
        with self._lock:
            replaced = self._batches.pop(key, None)
            if replaced is not None:
                self._bytes -= len(replaced[0])
            self._batches[key] = (records, work)
            self._bytes += len(records)
            while len(self._batches) > self._kept_max or self._bytes > self._bytes_max:
                self._bytes -= len(self._batches.popitem(last=False)[1][0])

    def recall(self, records: bytes | memoryview) -> int | None:
        """The work units `records` cost when they passed, forgetting them; None if they did not."""
        key = _batch_key(records)
        with self._lock:
            found = self._batches.get(key)
            if found is None or found[0] != records:
                return None
            del self._batches[key]
            self._bytes -= len(records)
        return found[1]


def _batch_key(records: bytes | memoryview) -> tuple[int, bytes]:
    """A batch's length and the bytes where RecordBatch v2 keeps its CRC32C: few batches share both."""
    return len(records), bytes(records[17:21])


PASSED_BATCHES = PassedBatches(PASSED_BATCHES_KEPT, PASSED_BATCHES_BYTES_MAX)


def append_problem(
    append: kq_pb2.PartitionAppend | RecordsAppend,
    meter: WorkMeter | None = None,
    *,
    edge: bool = False,
    records: bytes | memoryview | None = None,
) -> str | None:
    """Why one produce request's batch cannot be appended: not one valid RecordBatch v2, or over a limit.

    `check_batch` (proto/records.py) checks the whole batch: its CRC32C, attributes, producer fields
    and every record, a compressed one expanded within APPEND_BYTES_MAX first; so a batch that expands
    to nothing, to garbage, or to a different count than its header claims is refused. An entry
    written in kq's batch layout before RecordBatch v2 is refused here too (its bytes are no v2 batch).

    `meter` counts the check's work (proto/records.py WorkMeter): apply passes its entry's meter, so
    an entry's batches together stay within ENTRY_WORK_MAX; the edge passes a fresh one and packs
    entries by what it spent. The edge (`edge`, with a meter) remembers each batch that passes in
    PASSED_BATCHES, and apply (any meter) on the same node takes the verdict and its cost from there
    (PassedBatches says why that is the same answer). `records` is `append.records` when the caller
    has read it already: each read of the field copies the batch.
    """
    problem = topic_name_problem(append.topic)
    if problem is not None:
        return problem
    if records is None:
        records = append.records
    if not records:
        return "a produce request needs a record batch"
    if len(records) > APPEND_BYTES_MAX:
        return f"record batch of {len(records)} bytes exceeds the {APPEND_BYTES_MAX}-byte limit"
    if meter is not None and not edge:
        work = PASSED_BATCHES.recall(records)
        if work is not None and work <= meter.remaining:
            meter.spent += work
            return None
    spent = 0 if meter is None else meter.spent
    try:
        check_batch(
            records,
            RECORDS_PER_APPEND_MAX,
            HEADERS_PER_RECORD_MAX,
            RECORD_BYTES_MAX,
            HEADER_NAME_BYTES_MAX,
            APPEND_BYTES_MAX,
            meter,
        )
    except WorkBudgetError as error:
        return f"over the entry's work budget: {error}"
    except MalformedBatchError as error:
        return f"bad record batch: {error}"
    if edge and meter is not None:
        PASSED_BATCHES.remember(records, meter.spent - spent)
    return None


def member_problem(member: kq_pb2.GroupMember) -> str | None:
    """Why a group member's subscription and settings are outside the limits."""
    if not 0 < len(member.member_id) <= MEMBER_ID_LENGTH_MAX:
        return f"member id must be 1 to {MEMBER_ID_LENGTH_MAX} characters"
    if len(member.client_id) > CLIENT_ID_LENGTH_MAX:
        return f"client id is longer than {CLIENT_ID_LENGTH_MAX} characters"
    if bool(member.topics) == bool(member.topic_pattern):
        return "subscribe with either a list of topics or a topic pattern"
    if len(member.topics) > SUBSCRIBED_TOPICS_MAX:
        return f"a member subscribes to at most {SUBSCRIBED_TOPICS_MAX} topics"
    for topic in member.topics:
        problem = topic_name_problem(topic)
        if problem is not None:
            return problem
    if member.topic_pattern:
        problem = pattern_problem(member.topic_pattern)
        if problem is not None:
            return problem
    if not SESSION_TIMEOUT_MS_MIN <= member.session_timeout_ms <= SESSION_TIMEOUT_MS_MAX:
        return f"session timeout must be {SESSION_TIMEOUT_MS_MIN}-{SESSION_TIMEOUT_MS_MAX} ms"
    if not REBALANCE_TIMEOUT_MS_MIN <= member.rebalance_timeout_ms <= REBALANCE_TIMEOUT_MS_MAX:
        return f"rebalance timeout must be {REBALANCE_TIMEOUT_MS_MIN}-{REBALANCE_TIMEOUT_MS_MAX} ms"
    if member.assignment:
        return "a joining member carries no assignment"
    return None


def assignor_problem(assignor: str) -> str | None:
    """Why `assignor` is not one of kq's assignors ("" means the group's current one)."""
    if assignor and assignor not in ASSIGNORS:
        return f"unknown assignor {assignor[:64]!r}; choose one of {', '.join(ASSIGNORS)}"
    return None


def offsets_problem(offsets: list[kq_pb2.OffsetEntry], allow_empty: bool = False) -> str | None:
    """Why a list of committed offsets is too long, empty, or names an illegal topic."""
    if len(offsets) > OFFSETS_PER_COMMIT_MAX or (not offsets and not allow_empty):
        return f"a commit carries 1 to {OFFSETS_PER_COMMIT_MAX} offsets"
    for entry in offsets:
        problem = topic_name_problem(entry.topic) or offset_metadata_problem(entry)
        if problem is not None:
            return problem
    return None


def offset_metadata_problem(entry: kq_pb2.OffsetEntry) -> str | None:
    """Why a committed offset's metadata or leader epoch cannot be kept (Kafka's
    OFFSET_METADATA_TOO_LARGE for the first), or None."""
    if len(entry.metadata.encode(errors="surrogatepass")) > OFFSET_METADATA_BYTES_MAX:
        return f"offset metadata is longer than {OFFSET_METADATA_BYTES_MAX} bytes"
    if entry.HasField("leader_epoch") and entry.leader_epoch < -1:
        return f"leader epoch {entry.leader_epoch} (-1 means none)"
    return None


def offset_delete_problem(command: kq_pb2.OffsetDeleteCommand) -> str | None:
    """Why an OffsetDelete cannot be applied: a bad group name, 1 to OFFSETS_PER_COMMIT_MAX partitions
    of legal topic names (the limit of a commit, whose offsets it deletes)."""
    problem = topic_name_problem(command.group, "group")
    if problem is not None:
        return problem
    if not 0 < len(command.partitions) <= OFFSETS_PER_COMMIT_MAX:
        return f"an offset deletion names 1 to {OFFSETS_PER_COMMIT_MAX} partitions"
    for entry in command.partitions:
        problem = topic_name_problem(entry.topic)
        if problem is not None:
            return problem
    return None


def _join_problem(command: kq_pb2.JoinGroupCommand) -> str | None:
    return (
        topic_name_problem(command.group, "group")
        or member_problem(command.member)
        or assignor_problem(command.assignor)
    )


def _leave_problem(command: kq_pb2.LeaveGroupCommand) -> str | None:
    if not 0 < len(command.member_ids) <= GROUP_MEMBERS_MAX:
        return f"a leave names 1 to {GROUP_MEMBERS_MAX} members"
    if any(not 0 < len(member_id) <= MEMBER_ID_LENGTH_MAX for member_id in command.member_ids):
        return f"member id must be 1 to {MEMBER_ID_LENGTH_MAX} characters"
    return topic_name_problem(command.group, "group")


def _commit_problem(command: kq_pb2.CommitOffsetsCommand) -> str | None:
    if len(command.member_id) > MEMBER_ID_LENGTH_MAX:
        return f"member id is longer than {MEMBER_ID_LENGTH_MAX} characters"
    return topic_name_problem(command.group, "group") or offsets_problem(list(command.offsets))


def _utf8_length(text: str) -> int:
    return len(text.encode(errors="surrogatepass"))


def member_id_problem(member_id: str) -> str | None:
    """Why `member_id` cannot name a group member (empty, or longer than MEMBER_ID_LENGTH_MAX)."""
    if not 0 < _utf8_length(member_id) <= MEMBER_ID_LENGTH_MAX:
        return f"member id must be 1 to {MEMBER_ID_LENGTH_MAX} bytes"
    return None


def group_instance_id_problem(instance_id: str) -> str | None:
    """Why a Kafka group.instance.id is illegal ("" means none): Kafka's own rule, a topic-like name."""
    if not instance_id:
        return None
    if _utf8_length(instance_id) > GROUP_INSTANCE_ID_LENGTH_MAX:
        return f"group instance id is longer than {GROUP_INSTANCE_ID_LENGTH_MAX} bytes"
    if not TOPIC_NAME_PATTERN.fullmatch(instance_id):
        return "group instance id may contain only ASCII letters, digits, '.', '_' and '-'"
    return None


def protocol_type_problem(protocol_type: str) -> str | None:
    """Why a Kafka group's protocol type is illegal (empty is: kq's own groups have none)."""
    if not 0 < _utf8_length(protocol_type) <= PROTOCOL_TYPE_LENGTH_MAX:
        return f"protocol type must be 1 to {PROTOCOL_TYPE_LENGTH_MAX} bytes"
    return None


def protocols_problem(protocols: Sequence[kq_pb2.KafkaProtocol]) -> str | None:
    """Why a Kafka member's protocols are illegal: none, too many, unnamed, repeated or too big."""
    if not 0 < len(protocols) <= GROUP_PROTOCOLS_MAX:
        return f"a member offers 1 to {GROUP_PROTOCOLS_MAX} protocols"
    names = set()
    metadata_bytes = 0
    for protocol in protocols:
        if not 0 < _utf8_length(protocol.name) <= PROTOCOL_NAME_LENGTH_MAX:
            return f"protocol name must be 1 to {PROTOCOL_NAME_LENGTH_MAX} bytes"
        if protocol.name in names:
            return f"protocol {protocol.name[:64]!r} is offered twice"
        names.add(protocol.name)
        metadata_bytes += len(protocol.metadata)
    if metadata_bytes > MEMBER_METADATA_BYTES_MAX:
        return f"protocol metadata of {metadata_bytes} bytes exceeds {MEMBER_METADATA_BYTES_MAX}"
    return None


def kafka_member_problem(member: kq_pb2.GroupMember) -> str | None:
    """Why a Kafka client's member (JoinGroup) is outside the limits or carries kq-only fields."""
    problem = (
        member_id_problem(member.member_id)
        or group_instance_id_problem(member.group_instance_id)
        or protocols_problem(member.protocols)
    )
    if problem is not None:
        return problem
    if _utf8_length(member.client_id) > CLIENT_ID_LENGTH_MAX:
        return f"client id is longer than {CLIENT_ID_LENGTH_MAX} bytes"
    if _utf8_length(member.client_host) > CLIENT_HOST_LENGTH_MAX:
        return f"client host is longer than {CLIENT_HOST_LENGTH_MAX} bytes"
    if member.topics or member.topic_pattern or member.assignment or member.kafka_assignment:
        return "a Kafka member carries no kq subscription and no assignment when it joins"
    if not SESSION_TIMEOUT_MS_MIN <= member.session_timeout_ms <= SESSION_TIMEOUT_MS_MAX:
        return f"session timeout must be {SESSION_TIMEOUT_MS_MIN}-{SESSION_TIMEOUT_MS_MAX} ms"
    if not REBALANCE_TIMEOUT_MS_MIN <= member.rebalance_timeout_ms <= REBALANCE_TIMEOUT_MS_MAX:
        return f"rebalance timeout must be {REBALANCE_TIMEOUT_MS_MIN}-{REBALANCE_TIMEOUT_MS_MAX} ms"
    return None


def _kafka_join_problem(command: kq_pb2.KafkaJoinGroupCommand) -> str | None:
    return (
        topic_name_problem(command.group, "group")
        or protocol_type_problem(command.protocol_type)
        or kafka_member_problem(command.member)
    )


def assignments_problem(assignments: Sequence[kq_pb2.KafkaAssignment]) -> str | None:
    """Why a Kafka leader's assignments are illegal: too many, unnamed or repeated members, too big."""
    if len(assignments) > GROUP_MEMBERS_MAX:
        return f"a SyncGroup assigns to at most {GROUP_MEMBERS_MAX} members"
    members = set()
    for assignment in assignments:
        problem = member_id_problem(assignment.member_id)
        if problem is not None:
            return problem
        if assignment.member_id in members:
            return "a SyncGroup assigns to the same member twice"
        members.add(assignment.member_id)
        if len(assignment.assignment) > MEMBER_ASSIGNMENT_BYTES_MAX:
            size = len(assignment.assignment)
            return f"an assignment of {size} bytes exceeds {MEMBER_ASSIGNMENT_BYTES_MAX}"
    return None


def _kafka_sync_problem(command: kq_pb2.KafkaSyncGroupCommand) -> str | None:
    return (
        topic_name_problem(command.group, "group")
        or member_id_problem(command.member_id)
        or assignments_problem(command.assignments)
    )


def consumer_member_problem(member: kq_pb2.GroupMember) -> str | None:
    """Why a consumer-group member from a ConsumerGroupHeartbeat is outside the limits (KIP-848).

    Its subscription may be empty (a member of nothing, as Kafka allows); a rebalance timeout of 0
    means "unchanged"; the group's session timeout is the edge's (CONSUMER_SESSION_TIMEOUT_MS)."""
    problem = member_id_problem(member.member_id) or group_instance_id_problem(member.group_instance_id)
    if problem is not None:
        return problem
    if _utf8_length(member.client_id) > CLIENT_ID_LENGTH_MAX:
        return f"client id is longer than {CLIENT_ID_LENGTH_MAX} bytes"
    if _utf8_length(member.client_host) > CLIENT_HOST_LENGTH_MAX:
        return f"client host is longer than {CLIENT_HOST_LENGTH_MAX} bytes"
    if _utf8_length(member.rack_id) > RACK_ID_LENGTH_MAX:
        return f"rack id is longer than {RACK_ID_LENGTH_MAX} bytes"
    if member.server_assignor and member.server_assignor not in CONSUMER_ASSIGNORS:
        return f"server assignor must be one of {', '.join(CONSUMER_ASSIGNORS)}"
    if member.topics and member.topic_pattern:
        return "subscribe with either a list of topics or a topic pattern"
    if len(member.topics) > SUBSCRIBED_TOPICS_MAX:
        return f"a member subscribes to at most {SUBSCRIBED_TOPICS_MAX} topics"
    for topic in member.topics:
        problem = topic_name_problem(topic)
        if problem is not None:
            return problem
    if member.topic_pattern and (problem := pattern_problem(member.topic_pattern)) is not None:
        return problem
    if not SESSION_TIMEOUT_MS_MIN <= member.session_timeout_ms <= SESSION_TIMEOUT_MS_MAX:
        return f"session timeout must be {SESSION_TIMEOUT_MS_MIN}-{SESSION_TIMEOUT_MS_MAX} ms"
    if member.rebalance_timeout_ms and not (
        REBALANCE_TIMEOUT_MS_MIN <= member.rebalance_timeout_ms <= REBALANCE_TIMEOUT_MS_MAX
    ):
        return f"rebalance timeout must be {REBALANCE_TIMEOUT_MS_MIN}-{REBALANCE_TIMEOUT_MS_MAX} ms"
    if (
        member.protocols
        or member.kafka_assignment
        or member.assignment
        or member.revoking
        or member.target
        or member.member_epoch
        or member.previous_member_epoch
        or member.member_state
        or member.revoking_since_ms
        or member.static_left
    ):
        return "a heartbeat carries no protocols, assignment or epochs of the member's"
    return None


def _consumer_heartbeat_problem(command: kq_pb2.ConsumerHeartbeatCommand) -> str | None:
    if command.member_epoch < -2:
        return "member epoch must be -2 or more"
    if len(command.owned) > CONSUMER_OWNED_PARTITIONS_MAX:
        return f"a heartbeat names at most {CONSUMER_OWNED_PARTITIONS_MAX} owned partitions"
    if command.owned and not command.owned_set:
        return "owned partitions are named only when owned_set"
    if (command.member.topics or command.member.topic_pattern) and not command.subscription_set:
        return "a subscription is named only when subscription_set"
    for owned in command.owned:
        problem = topic_name_problem(owned.topic)
        if problem is not None:
            return problem
    return topic_name_problem(command.group, "group") or consumer_member_problem(command.member)


def _alter_topic_config_problem(command: kq_pb2.AlterTopicConfigCommand) -> str | None:
    """A config change names a topic and changes something, within raft/topic_config.py's rules."""
    if not command.set and not command.remove:
        return "a config change sets or removes at least one config"
    return topic_name_problem(command.topic) or configs_problem(command.set, command.remove)


def _append_command_problem(command: kq_pb2.AppendCommand) -> str | None:
    """The envelope of an append entry; each PartitionAppend is checked on its own (append_problem)."""
    return append_envelope_problem(len(command.appends), command.leader_epoch)


def append_envelope_problem(appends: int, leader_epoch: int) -> str | None:
    """The envelope of an append entry of `appends` produce requests (the batcher's proposal, and
    apply of an entry decoded with or without protobuf: raft/commands.py `decode_append`)."""
    if not 0 < appends <= APPENDS_PER_ENTRY_MAX:
        return f"an append entry carries 1 to {APPENDS_PER_ENTRY_MAX} produce requests"
    if leader_epoch > LEADER_EPOCH_MAX:
        return f"a leader epoch is at most {LEADER_EPOCH_MAX} (Kafka's int32)"
    return None


def _compact_problem(command: kq_pb2.CompactCommand) -> str | None:
    """A compaction entry's shape: bounded counts, strictly ascending base offsets and offsetDeltas
    within a batch's reach. Whether the batches and records exist is apply's to find (it skips what
    is gone); that the records may go is the proposing leader's decision (broker/compactor.py)."""
    if not 0 < len(command.batches) <= COMPACT_BATCHES_PER_ENTRY_MAX:
        return f"a compaction entry names 1 to {COMPACT_BATCHES_PER_ENTRY_MAX} batches"
    if sum(len(batch.dropped) for batch in command.batches) > COMPACT_DROPPED_PER_ENTRY_MAX:
        return f"a compaction entry drops at most {COMPACT_DROPPED_PER_ENTRY_MAX} records"
    previous = -1
    for batch in command.batches:
        if batch.base_offset <= previous:
            return f"batch {batch.base_offset} is not after batch {previous}"
        previous = batch.base_offset
        if not batch.dropped:
            return f"batch {batch.base_offset}: no record to drop"
        deltas = list(batch.dropped)
        if deltas[-1] >= RECORDS_PER_APPEND_MAX or any(a >= b for a, b in pairwise(deltas)):
            return f"batch {batch.base_offset}: offsetDeltas must rise, each below {RECORDS_PER_APPEND_MAX}"
    return topic_name_problem(command.topic)


def node_id_problem(node_id: str) -> str | None:
    """Why `node_id` is not a legal node id (`--node-id`, a member's id), or None."""
    if not 0 < len(node_id) <= NODE_ID_LENGTH_MAX or not NAME_PATTERN.fullmatch(node_id):
        return f"a node id is 1 to {NODE_ID_LENGTH_MAX} letters, digits, '.', '_' or '-', got {node_id!r}"
    return None


def address_problem(address: str, what: str) -> str | None:
    """Why `address` is not `host:port` (a host of letters, digits, '.', '_', '-'; a port 1-65535).

    The host's alphabet is narrower than DNS allows on purpose: a member's Raft address becomes a
    PySyncObj node (`TCPNode` splits it at the last ':') on every replica, so nothing it cannot parse
    may reach the log."""
    host, _, port = address.rpartition(":")
    if (
        not 0 < len(host) <= HOST_LENGTH_MAX
        or not NAME_PATTERN.fullmatch(host)
        or not (port.isascii() and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536)
    ):
        return f"{what} must be host:port, got {address!r}"
    return None


def rack_problem(rack: str, what: str) -> str | None:
    """Why `rack` is not a rack name ("" for none), or None."""
    if rack and (len(rack) > RACK_NAME_LENGTH_MAX or not NAME_PATTERN.fullmatch(rack)):
        return f"{what} must be 1 to {RACK_NAME_LENGTH_MAX} letters, digits, '.', '_' or '-', got {rack!r}"
    return None


def cluster_member_problem(member: kq_pb2.Member) -> str | None:
    """Why `member` cannot be registered: its id, addresses and rack (the Kafka address may be "")."""
    return (
        node_id_problem(member.node_id)
        or address_problem(member.raft_address, "a Raft address")
        or address_problem(member.grpc_address, "a gRPC address")
        or (address_problem(member.kafka_address, "a Kafka address") if member.kafka_address else None)
        or rack_problem(member.rack, "a rack")
    )


def cluster_id_problem(cluster_id: str) -> str | None:
    """Why `cluster_id` is not a cluster id ("" for none), or None."""
    too_long = len(cluster_id) > CLUSTER_ID_LENGTH_MAX
    if cluster_id and (too_long or not CLUSTER_ID_PATTERN.fullmatch(cluster_id)):
        return f"a cluster id is 1 to {CLUSTER_ID_LENGTH_MAX} letters, digits, '_' or '-'"
    return None


def topic_groups_problem(groups: int) -> str | None:
    """Why a topic cannot be spread over `groups` Raft groups (0 and 1 both mean one)."""
    return None if groups <= RAFT_GROUPS_MAX else f"a topic spans at most {RAFT_GROUPS_MAX} Raft groups"


def topic_id_problem(topic_id: int) -> str | None:
    """Why a topic id a command carries cannot be one (0 means none is carried)."""
    return None if topic_id <= TOPIC_ID_MAX else f"a topic id is at most {TOPIC_ID_MAX}"


def _expire_producers_problem(
    command: kq_pb2.ExpireProducersCommand | kq_pb2.ExpireTransactionalIdsCommand,
    name: str = "producer.id.expiration.ms",
) -> str | None:
    """Kafka's producer.id.expiration.ms (and transactional.id.expiration.ms) is at least 1; a clock
    before 1970 is no leader's."""
    if command.expiration_ms < 1:
        return f"{name} {command.expiration_ms} is below 1"
    if command.now_ms < 0:
        return f"an expiry at {command.now_ms} ms, before 1970"
    return None


def command_problem(command: kq_pb2.Command) -> str | None:
    """Why `command` must not be applied, or None. Appends' batches are checked by `append_problem`."""
    kind = command.WhichOneof("kind")
    if kind == "create_topic":
        create = command.create_topic
        return (
            topic_name_problem(create.name)
            or partition_count_problem(create.partitions)
            or configs_problem(create.configs)
            or topic_id_problem(create.topic_id)
            or topic_groups_problem(create.groups)
        )
    if kind == "alter_topic_config":
        return _alter_topic_config_problem(command.alter_topic_config)
    if kind == "grow_partitions":
        grow = command.grow_partitions
        return (
            topic_name_problem(grow.topic)
            or partition_count_problem(grow.partitions)
            or topic_id_problem(grow.topic_id)
        )
    if kind == "delete_topic":
        delete = command.delete_topic
        return topic_name_problem(delete.name) or topic_id_problem(delete.topic_id)
    if kind == "append":
        return _append_command_problem(command.append)
    if kind == "trim":
        return topic_name_problem(command.trim.topic)
    if kind == "compact":
        return _compact_problem(command.compact)
    if kind == "purge_topic":
        return None if command.purge_topic.topic_id else "a purge names a topic id (from 1)"
    if kind == "expire_producers":
        return _expire_producers_problem(command.expire_producers)
    if kind == "expire_transactional_ids":
        return _expire_producers_problem(command.expire_transactional_ids, "transactional.id.expiration.ms")
    if kind == "join_group":
        return _join_problem(command.join_group)
    if kind == "leave_group":
        return _leave_problem(command.leave_group)
    if kind == "commit_offsets":
        return _commit_problem(command.commit_offsets)
    if kind == "reset_offsets":
        reset = command.reset_offsets
        return topic_name_problem(reset.group, "group") or offsets_problem(list(reset.offsets))
    if kind == "delete_group":
        return topic_name_problem(command.delete_group.group, "group")
    if kind == "offset_delete":
        return offset_delete_problem(command.offset_delete)
    if kind == "kafka_join_group":
        return _kafka_join_problem(command.kafka_join_group)
    if kind == "kafka_sync_group":
        return _kafka_sync_problem(command.kafka_sync_group)
    if kind == "consumer_heartbeat":
        return _consumer_heartbeat_problem(command.consumer_heartbeat)
    if kind in ("register_producer", "barrier"):
        return None
    if kind == "register_member":
        register = command.register_member
        return cluster_member_problem(register.member) or cluster_id_problem(register.cluster_id)
    if kind == "unregister_member":
        return node_id_problem(command.unregister_member.node_id)
    if kind in AUTH_COMMAND_KINDS:
        return auth_command_problem(command)
    return f"unknown command kind {kind}"
