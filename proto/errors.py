"""kq's error codes and the one table that gives each its gRPC status, Kafka error code and retry policy.

Where codes come from: `apply` decides the deterministic rejections (the same on every replica:
UNKNOWN_TOPIC .. INVALID_COMMAND, values 1-15, and INVALID_PRODUCER_EPOCH, 24, returned inside
results); the gRPC edge adds the conditions only a node can see (INVALID_REQUEST to TOO_MANY_READERS,
16-23: a malformed request, not the leader, no leader, a proposal that did not commit, a full queue,
a bug, too many waiting readers; and STORAGE_FULL, 26: the leader's disk is nearly full).

How they travel: every non-OK status the broker answers carries the trailing metadata
`kq-error-code` with the code's number in decimal (numbers never change meaning; names may be
renamed), and a redirect carries `kq-leader: host:port` as well. The client maps the number back
to one exception class, once (client/errors.py); the status message is for people only, and no code
reads it. A status without `kq-error-code` was made by gRPC itself (connection refused, deadline,
cancelled, message too large) and is mapped by its status alone.

Numbers are part of the protocol: never renumber or reuse one; add new codes at the end.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import grpc

ERROR_CODE_METADATA_KEY = "kq-error-code"  # Trailing metadata: the ErrorCode's number, in decimal.
LEADER_METADATA_KEY = "kq-leader"  # Trailing metadata of a NOT_LEADER answer: the leader's gRPC host:port.


class ErrorCode(enum.IntEnum):
    """Why a request failed. 1-15, 24, 25, 27, 31-37, 39-40 and 42 are decided in apply (the same on every
    node); 16-23, 26-30, 38 and 41 at the edge."""

    OK = 0
    UNKNOWN_TOPIC = 1
    UNKNOWN_PARTITION = 2
    TOPIC_EXISTS = 3
    TOO_MANY_TOPICS = 4
    UNKNOWN_PRODUCER = 5
    OUT_OF_ORDER_SEQUENCE = 6
    DUPLICATE_SEQUENCE = 7  # A retry older than the remembered window: cannot return its offset.
    OFFSET_OUT_OF_RANGE = 8
    UNKNOWN_GROUP = 9
    UNKNOWN_MEMBER = 10
    STALE_GENERATION = 11
    GROUP_HAS_MEMBERS = 12
    TOO_MANY_GROUPS = 13
    GROUP_FULL = 14
    INVALID_COMMAND = 15  # The shared validation (raft/validation.py) refused it: the edge should have.
    INVALID_REQUEST = 16  # Refused at the edge: malformed, undecodable, or outside a limit; never proposed.
    NOT_LEADER = 17  # A write reached a follower; `kq-leader` names the leader.
    LEADER_UNKNOWN = 18  # No leader is elected right now.
    NOT_COMMITTED = 19  # The proposal did not commit in time, or this node lost its leadership: it may still.
    NOT_CAUGHT_UP = 20  # This node has not applied the index the reader already saw (read-your-writes).
    QUEUE_FULL = 21  # The leader's produce queue (or the node's calls in progress) is full.
    INTERNAL_ERROR = 22  # A bug in the node (logged there); nothing about the request is known to be wrong.
    TOO_MANY_READERS = 23  # The node (or this client connection) holds its maximum of waiting readers.
    INVALID_PRODUCER_EPOCH = 24  # Decided in apply: a newer epoch of this producer id wrote to the partition.
    MESSAGE_TOO_LARGE = 25  # Decided in apply: the batch is over its topic's max.message.bytes.
    STORAGE_FULL = 26  # The leader's store is within its headroom of --max-disk-bytes or of a full disk.
    # A membership change that cannot be made as asked (a taken id or address, no such member, a change
    # that would leave no majority up): decided at the edge, and in apply for the registered addresses.
    MEMBERSHIP_REFUSED = 27
    MEMBERSHIP_CHANGE_PENDING = 28  # At the edge: the previous membership change has not committed yet.
    # Security (broker/auth.py): the call carried no valid credentials (no client certificate or
    # token, an unknown, expired or wrong token) while the node requires them (`--auth`).
    UNAUTHENTICATED = 29
    PERMISSION_DENIED = 30  # At the edge: the principal lacks an ACL allowing the call; nothing changed.
    UNKNOWN_USER = 31  # Decided in apply: no user of that name.
    UNKNOWN_TOKEN = 32  # Decided in apply: no token of that id.
    # Decided in apply: the cluster holds its maximum of users, tokens or ACLs (proto/limits.py).
    SECURITY_LIMIT_REACHED = 33
    # Transactions (raft/transactions.py), decided in apply by the coordinator's group.
    PRODUCER_FENCED = 34  # A newer instance of the transactional id has bumped its epoch.
    CONCURRENT_TRANSACTIONS = 35  # The previous transaction of the id is still being completed: retry.
    INVALID_TXN_STATE = 36  # The request does not fit the transaction's state (commit of an aborting one).
    INVALID_PRODUCER_ID_MAPPING = 37  # The producer id is not the transactional id's.
    INVALID_TRANSACTION_TIMEOUT = 38  # At the edge: transaction.timeout.ms outside the broker's bounds.
    TRANSACTIONAL_ID_NOT_FOUND = 39  # No transaction of that id.
    TRANSACTION_LIMIT_REACHED = 40  # Too many transactional ids, or partitions or groups in one transaction.
    # At the edge: a batch this node stores failed its checksum (on-disk corruption); the node serves
    # no byte of it, and another replica holds it whole: retriable there.
    CORRUPT_DATA = 41
    # Decided in apply: a static member's group.instance.id is held by another member id now (a newer
    # instance of the consumer joined): the older one is fenced (TxnOffsetCommit, KIP-447).
    FENCED_INSTANCE_ID = 42


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    """One row of the table: how a code is answered on the wire and what a client does about it.

    `retriable`: the same request may succeed if sent again (to the leader, or after a pause); a
    non-retriable one fails the same way until something else changes.
    """

    status: grpc.StatusCode
    kafka_code: int  # Kafka's protocol error code with the same meaning (for bridges and for people).
    retriable: bool
    meaning: str


_S = grpc.StatusCode

ERROR_TABLE: dict[ErrorCode, ErrorSpec] = {
    ErrorCode.OK: ErrorSpec(_S.OK, 0, False, "no error"),
    ErrorCode.UNKNOWN_TOPIC: ErrorSpec(_S.NOT_FOUND, 3, False, "unknown topic"),
    ErrorCode.UNKNOWN_PARTITION: ErrorSpec(_S.INVALID_ARGUMENT, 3, False, "the topic has no such partition"),
    ErrorCode.TOPIC_EXISTS: ErrorSpec(_S.ALREADY_EXISTS, 36, False, "a topic of that name exists"),
    ErrorCode.TOO_MANY_TOPICS: ErrorSpec(
        _S.RESOURCE_EXHAUSTED, 44, False, "the cluster holds its maximum number of topics"
    ),
    ErrorCode.UNKNOWN_PRODUCER: ErrorSpec(_S.FAILED_PRECONDITION, 59, False, "unknown producer id"),
    ErrorCode.OUT_OF_ORDER_SEQUENCE: ErrorSpec(
        _S.FAILED_PRECONDITION, 45, False, "an idempotent producer's sequence is out of order"
    ),
    ErrorCode.DUPLICATE_SEQUENCE: ErrorSpec(
        _S.FAILED_PRECONDITION, 46, False, "a producer sequence too old to deduplicate"
    ),
    ErrorCode.OFFSET_OUT_OF_RANGE: ErrorSpec(
        _S.OUT_OF_RANGE, 1, False, "an offset below the log start or beyond the log end"
    ),
    ErrorCode.UNKNOWN_GROUP: ErrorSpec(_S.NOT_FOUND, 69, False, "unknown consumer group"),
    ErrorCode.UNKNOWN_MEMBER: ErrorSpec(
        _S.ABORTED, 25, False, "the member is unknown to its group: join again without a member id"
    ),
    ErrorCode.STALE_GENERATION: ErrorSpec(
        _S.ABORTED, 22, False, "the group rebalanced since the member's generation: rejoin"
    ),
    ErrorCode.GROUP_HAS_MEMBERS: ErrorSpec(
        _S.FAILED_PRECONDITION, 68, False, "the operation needs a group without active members"
    ),
    ErrorCode.TOO_MANY_GROUPS: ErrorSpec(
        _S.RESOURCE_EXHAUSTED, 44, False, "the cluster holds its maximum number of groups"
    ),
    ErrorCode.GROUP_FULL: ErrorSpec(
        _S.RESOURCE_EXHAUSTED, 81, False, "the group holds its maximum number of members"
    ),
    ErrorCode.INVALID_COMMAND: ErrorSpec(
        _S.INVALID_ARGUMENT, 42, False, "every replica refused the committed request"
    ),
    ErrorCode.INVALID_REQUEST: ErrorSpec(
        _S.INVALID_ARGUMENT, 42, False, "a malformed request, or one outside a limit"
    ),
    ErrorCode.NOT_LEADER: ErrorSpec(
        _S.FAILED_PRECONDITION, 6, True, "this node is not the leader; kq-leader names it"
    ),
    ErrorCode.LEADER_UNKNOWN: ErrorSpec(_S.UNAVAILABLE, 5, True, "no leader is elected right now"),
    ErrorCode.NOT_COMMITTED: ErrorSpec(
        _S.UNAVAILABLE, 7, True, "the write did not commit in time; it may still commit"
    ),
    ErrorCode.NOT_CAUGHT_UP: ErrorSpec(
        _S.UNAVAILABLE, 78, True, "this node has not applied the index the reader already saw"
    ),
    ErrorCode.QUEUE_FULL: ErrorSpec(
        _S.RESOURCE_EXHAUSTED, 89, True, "the produce queue, or the node's calls in progress, is full"
    ),
    ErrorCode.INTERNAL_ERROR: ErrorSpec(_S.INTERNAL, -1, False, "a bug in the node; see its log"),
    # Kafka's THROTTLING_QUOTA_EXCEEDED: nothing was read; retry later, or on another node.
    ErrorCode.TOO_MANY_READERS: ErrorSpec(
        _S.RESOURCE_EXHAUSTED, 89, True, "the node holds its maximum of waiting readers (streams, long-polls)"
    ),
    # Kafka's INVALID_PRODUCER_EPOCH: the producer was fenced by a newer epoch of its own id.
    ErrorCode.INVALID_PRODUCER_EPOCH: ErrorSpec(
        _S.FAILED_PRECONDITION, 47, False, "a newer epoch of this producer id has written to the partition"
    ),
    # Kafka's MESSAGE_TOO_LARGE: the batch (as sent, compressed) is over the topic's max.message.bytes.
    ErrorCode.MESSAGE_TOO_LARGE: ErrorSpec(
        _S.INVALID_ARGUMENT, 10, False, "the record batch is larger than the topic's max.message.bytes"
    ),
    # Kafka's KAFKA_STORAGE_ERROR (retriable there too): the leader refuses what would grow its store
    # until retention, DeleteRecords or a deleted topic frees space (broker/storage_guard.py).
    ErrorCode.STORAGE_FULL: ErrorSpec(
        _S.RESOURCE_EXHAUSTED, 56, True, "the leader's disk, or its --max-disk-bytes, is nearly full"
    ),
    # Kafka has no membership API; its nearest codes are INVALID_REQUEST and REBALANCE_IN_PROGRESS.
    ErrorCode.MEMBERSHIP_REFUSED: ErrorSpec(
        _S.FAILED_PRECONDITION, 42, False, "the membership change cannot be made as asked"
    ),
    ErrorCode.MEMBERSHIP_CHANGE_PENDING: ErrorSpec(
        _S.UNAVAILABLE, 27, True, "the previous membership change has not committed yet"
    ),
    # Kafka's SASL_AUTHENTICATION_FAILED.
    ErrorCode.UNAUTHENTICATED: ErrorSpec(
        _S.UNAUTHENTICATED, 58, False, "no valid client certificate or token; this node requires one"
    ),
    # Kafka's TOPIC_AUTHORIZATION_FAILED (its group and cluster twins are 30 and 31).
    ErrorCode.PERMISSION_DENIED: ErrorSpec(
        _S.PERMISSION_DENIED, 29, False, "the principal has no ACL allowing this operation"
    ),
    # Kafka's RESOURCE_NOT_FOUND.
    ErrorCode.UNKNOWN_USER: ErrorSpec(_S.NOT_FOUND, 91, False, "unknown user"),
    ErrorCode.UNKNOWN_TOKEN: ErrorSpec(_S.NOT_FOUND, 91, False, "unknown token"),
    ErrorCode.SECURITY_LIMIT_REACHED: ErrorSpec(
        _S.RESOURCE_EXHAUSTED, 44, False, "the cluster holds its maximum of users, tokens or ACLs"
    ),
    ErrorCode.PRODUCER_FENCED: ErrorSpec(
        _S.FAILED_PRECONDITION, 90, False, "a newer instance of this transactional id fenced the producer"
    ),
    ErrorCode.CONCURRENT_TRANSACTIONS: ErrorSpec(
        _S.UNAVAILABLE, 51, True, "the previous transaction of this id is still being completed"
    ),
    ErrorCode.INVALID_TXN_STATE: ErrorSpec(
        _S.FAILED_PRECONDITION, 48, False, "the request does not fit the transaction's state"
    ),
    ErrorCode.INVALID_PRODUCER_ID_MAPPING: ErrorSpec(
        _S.FAILED_PRECONDITION, 49, False, "the producer id is not this transactional id's"
    ),
    ErrorCode.INVALID_TRANSACTION_TIMEOUT: ErrorSpec(
        _S.INVALID_ARGUMENT, 50, False, "transaction.timeout.ms is outside the broker's bounds"
    ),
    ErrorCode.TRANSACTIONAL_ID_NOT_FOUND: ErrorSpec(_S.NOT_FOUND, 105, False, "unknown transactional id"),
    # Kafka has no such limits; its nearest code, as for kq's other cluster limits, is POLICY_VIOLATION.
    ErrorCode.TRANSACTION_LIMIT_REACHED: ErrorSpec(
        _S.RESOURCE_EXHAUSTED,
        44,
        False,
        "too many transactional ids, or partitions or groups in one transaction",
    ),
    # Kafka's KAFKA_STORAGE_ERROR (retriable: the client goes to another replica, as a Kafka client
    # refreshes its metadata and finds a healthy leader). DATA_LOSS: what the read met on this node.
    ErrorCode.CORRUPT_DATA: ErrorSpec(
        _S.DATA_LOSS, 56, True, "a batch this node stores failed its checksum; another replica has it"
    ),
    # Kafka's FENCED_INSTANCE_ID.
    ErrorCode.FENCED_INSTANCE_ID: ErrorSpec(
        _S.ABORTED, 82, False, "a newer member holds this group.instance.id: this consumer is fenced"
    ),
}


def spec_of(code: ErrorCode) -> ErrorSpec:
    """The table's row for `code` (every code has one: tests/broker/test_error_codes.py checks)."""
    return ERROR_TABLE[code]


def code_from_metadata(metadata: object) -> ErrorCode | None:
    """The ErrorCode in a call's trailing metadata, or None when there is none this version knows.

    None means gRPC made the status itself (or a newer node sent a code added since): the caller
    then goes by the status alone.
    """
    value = metadata_value(metadata, ERROR_CODE_METADATA_KEY)
    if value is None or not value.isdigit():
        return None
    try:
        return ErrorCode(int(value))
    except ValueError:
        return None


def metadata_value(metadata: object, key: str) -> str | None:
    """The first value of `key` in gRPC metadata (a sequence of key/value pairs, or None)."""
    if not isinstance(metadata, tuple | list):
        return None
    for item in metadata:
        if len(item) == 2 and item[0] == key:
            value = item[1]
            return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
    return None
