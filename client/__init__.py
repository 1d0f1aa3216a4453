"""kq's Python client: `KqClient` (admin, idempotent produce, fetch) and `Consumer`.

from kq.client import KqClient, Consumer
with KqClient(["127.0.0.1:9101", "127.0.0.1:9102"]) as kq:
    kq.create_topic("events", partitions=3)
    kq.send("events", b"hello", key=b"user-1")
    for record in Consumer(kq, "events").poll(timeout_ms=1000):
        print(record.partition, record.offset, record.value)
"""

from kq.client.client import KqClient
from kq.client.consumer import Consumer
from kq.client.errors import (
    AuthenticationError,
    FencedInstanceError,
    GroupNotEmptyError,
    GroupNotFoundError,
    InvalidRequestError,
    KqClientError,
    LeaderUnknownError,
    LimitReachedError,
    MembershipChangePendingError,
    MembershipRefusedError,
    NotCaughtUpError,
    NotCommittedError,
    NotLeaderError,
    OffsetOutOfRangeError,
    OverloadedError,
    PermissionDeniedError,
    PreconditionFailedError,
    ProducerFencedError,
    ProducerSequenceError,
    RebalanceError,
    ServerError,
    StaleGenerationError,
    StorageFullError,
    TooManyReadersError,
    TopicExistsError,
    TopicNotFoundError,
    UnavailableError,
    UnknownMemberError,
    UnknownUserError,
)
from kq.client.group import GroupConsumer
from kq.client.producer import Producer
from kq.client.tls import TlsConfig, TlsConfigError
from kq.client.transactions import TransactionDescription
from kq.client.types import (
    ConsumerRecord,
    GroupDescription,
    GroupLeaderInfo,
    GroupSummary,
    NodeStatus,
    PartitionLag,
    PartitionOffsets,
    ProducedBatch,
    ProducerRecord,
    RecordMetadata,
    TopicConfigValue,
    TopicInfo,
    group_leaders,
)

__all__ = [
    "AuthenticationError",
    "Consumer",
    "ConsumerRecord",
    "FencedInstanceError",
    "GroupConsumer",
    "GroupDescription",
    "GroupLeaderInfo",
    "GroupNotEmptyError",
    "GroupNotFoundError",
    "GroupSummary",
    "InvalidRequestError",
    "KqClient",
    "KqClientError",
    "LeaderUnknownError",
    "LimitReachedError",
    "MembershipChangePendingError",
    "MembershipRefusedError",
    "NodeStatus",
    "NotCaughtUpError",
    "NotCommittedError",
    "NotLeaderError",
    "OffsetOutOfRangeError",
    "OverloadedError",
    "PartitionLag",
    "PartitionOffsets",
    "PermissionDeniedError",
    "PreconditionFailedError",
    "ProducedBatch",
    "Producer",
    "ProducerFencedError",
    "ProducerRecord",
    "ProducerSequenceError",
    "RebalanceError",
    "RecordMetadata",
    "ServerError",
    "StaleGenerationError",
    "StorageFullError",
    "TlsConfig",
    "TlsConfigError",
    "TooManyReadersError",
    "TopicConfigValue",
    "TopicExistsError",
    "TopicInfo",
    "TopicNotFoundError",
    "TransactionDescription",
    "UnavailableError",
    "UnknownMemberError",
    "UnknownUserError",
    "group_leaders",
]
