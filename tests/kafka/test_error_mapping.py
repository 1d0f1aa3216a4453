"""broker/kafka/base.py `kafka_code`: kq's errors as the Kafka codes a client acts on (pure)."""

from __future__ import annotations

from kq.broker.errors import InvalidArgumentError, NotLeaderError, UnavailableError
from kq.broker.kafka.base import kafka_code
from kq.broker.kafka.codes import (
    NOT_CONTROLLER,
    NOT_COORDINATOR,
    NOT_LEADER_OR_FOLLOWER,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from kq.proto.errors import ErrorCode


def test_a_partition_whose_group_lacks_the_topic_yet_is_unknown_topic_or_partition() -> None:
    """A group's copy of a new topic not made yet: UNKNOWN_TOPIC_OR_PARTITION (retriable) for a
    partition request, as a Kafka broker answers for a topic it has not heard of; elsewhere the table's."""
    lagging = UnavailableError("topic t is not in group 2's copy yet; retry", ErrorCode.NOT_CAUGHT_UP)
    assert kafka_code(lagging, NOT_LEADER_OR_FOLLOWER) == UNKNOWN_TOPIC_OR_PARTITION
    assert kafka_code(lagging, NOT_CONTROLLER) == 78
    assert kafka_code(NotLeaderError("127.0.0.1:1"), NOT_COORDINATOR) == NOT_COORDINATOR
    too_large = InvalidArgumentError("a batch of 4 MiB", ErrorCode.MESSAGE_TOO_LARGE)
    assert kafka_code(too_large) == 10
