"""The pure, deterministic `apply`: replayed on every node, so no clock, randomness, network or leadership.

Everything chosen once (timestamps, producer ids) was chosen by the proposer and is in the command.
User-level rejections are result codes (identical everywhere); a broken invariant raises, and the
adapter stops the node rather than let replicas diverge.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proto import kq_pb2
from proto.records import count_records
from raft import commands, groups
from raft.limits import (
    ENTRY_BYTES_MAX,
    PARTITIONS_MAX,
    RECORDS_PER_APPEND_MAX,
    TOPICS_MAX,
    topic_name_problem,
)
from raft.results import (
    AppendResult,
    ApplyResult,
    ErrorCode,
    GroupResult,
    PartitionAppendResult,
    ProducerResult,
    SkippedResult,
    TopicResult,
    TrimResult,
)
from storage import ProducerAppend, Store, StoreWriter


def apply(store: Store, index: int, data: bytes) -> ApplyResult:
    """Applies the log entry at Raft `index` in one write transaction that also records `index`.

    An entry at or below the stored applied index was applied before a restart and is skipped.
    """
    assert len(data) <= ENTRY_BYTES_MAX, f"entry of {len(data)} bytes exceeds ENTRY_BYTES_MAX"
    command = commands.decode(data)
    with store.write() as writer:
        if index <= writer.applied_index():
            return SkippedResult(index)
        result = _dispatch(writer, command, index)
        writer.set_applied_index(index)
    return result


def _dispatch(writer: StoreWriter, command: kq_pb2.Command, index: int) -> ApplyResult:
    kind = command.WhichOneof("kind")
    if kind == "append":
        return _apply_append(writer, command.append, index)
    if kind == "create_topic":
        return _apply_create_topic(writer, command.create_topic)
    if kind == "delete_topic":
        return _apply_delete_topic(writer, command.delete_topic)
    if kind == "trim":
        return _apply_trim(writer, command.trim)
    if kind in _GROUP_HANDLERS:
        return _GROUP_HANDLERS[kind](writer, getattr(command, kind))
    if kind == "register_producer":
        return ProducerResult(writer.allocate_producer_id())
    raise commands.UnknownCommandError(f"no handler for command kind {kind}")


_GROUP_HANDLERS: dict[str, Callable[[StoreWriter, Any], GroupResult]] = {
    "join_group": groups.apply_join,
    "leave_group": groups.apply_leave,
    "commit_offsets": groups.apply_commit,
    "reset_offsets": groups.apply_reset,
    "delete_group": groups.apply_delete_group,
}


def _apply_create_topic(writer: StoreWriter, command: kq_pb2.CreateTopicCommand) -> TopicResult:
    assert topic_name_problem(command.name) is None, f"illegal topic name {command.name!r} reached apply"
    assert 0 < command.partitions <= PARTITIONS_MAX, "partition count outside limits reached apply"
    existing = writer.topic(command.name)
    if existing is not None:
        return TopicResult(ErrorCode.TOPIC_EXISTS, existing)
    if len(writer.topics()) >= TOPICS_MAX:
        return TopicResult(ErrorCode.TOO_MANY_TOPICS)
    return TopicResult(
        ErrorCode.OK, writer.create_topic(command.name, command.partitions, command.created_ms)
    )


def _apply_delete_topic(writer: StoreWriter, command: kq_pb2.DeleteTopicCommand) -> TopicResult:
    topic = writer.topic(command.name)
    if topic is None:
        return TopicResult(ErrorCode.UNKNOWN_TOPIC)
    writer.delete_topic(topic)
    return TopicResult(ErrorCode.OK, topic)


def _apply_trim(writer: StoreWriter, command: kq_pb2.TrimCommand) -> TrimResult:
    topic = writer.topic(command.topic)
    if topic is None:
        return TrimResult(ErrorCode.UNKNOWN_TOPIC)
    if command.partition >= topic.partitions:
        return TrimResult(ErrorCode.UNKNOWN_PARTITION)
    state = writer.partition(topic.topic_id, command.partition)
    assert state is not None
    if command.before_offset > state.log_end_offset:
        return TrimResult(ErrorCode.OFFSET_OUT_OF_RANGE, state.log_start_offset)
    return TrimResult(ErrorCode.OK, writer.trim(topic.topic_id, command.partition, command.before_offset))


def _apply_append(writer: StoreWriter, command: kq_pb2.AppendCommand, index: int) -> AppendResult:
    appends = tuple(_apply_partition_append(writer, command.timestamp_ms, a) for a in command.appends)
    return AppendResult(appends, index)


def _apply_partition_append(
    writer: StoreWriter, timestamp_ms: int, append: kq_pb2.PartitionAppend
) -> PartitionAppendResult:
    assert 0 < append.record_count <= RECORDS_PER_APPEND_MAX, "record count outside limits reached apply"
    if (
        append.compression == kq_pb2.COMPRESSION_NONE
    ):  # A compressed batch was expanded and checked at the edge.
        assert count_records(append.records) == append.record_count, "batch and its count disagree"
    topic = writer.topic(append.topic)
    if topic is None:
        return PartitionAppendResult(ErrorCode.UNKNOWN_TOPIC)
    if append.partition >= topic.partitions:
        return PartitionAppendResult(ErrorCode.UNKNOWN_PARTITION)
    if append.producer_id:
        verdict = _check_sequence(writer, topic.topic_id, append)
        if verdict is not None:
            return verdict
    base_offset = writer.append(
        topic.topic_id,
        append.partition,
        append.records,
        append.record_count,
        timestamp_ms,
        append.compression,
    )
    if append.producer_id:
        remembered = ProducerAppend(append.sequence, append.record_count, base_offset)
        writer.remember_producer_append(append.producer_id, topic.topic_id, append.partition, remembered)
    return PartitionAppendResult(ErrorCode.OK, base_offset)


def _check_sequence(
    writer: StoreWriter, topic_id: int, append: kq_pb2.PartitionAppend
) -> PartitionAppendResult | None:
    """None when the append is the producer's next one; otherwise the duplicate or error result."""
    if not writer.producer_id_allocated(append.producer_id):
        return PartitionAppendResult(ErrorCode.UNKNOWN_PRODUCER)
    window = writer.producer_appends(append.producer_id, topic_id, append.partition)
    expected = window[-1].first_sequence + window[-1].record_count if window else 0
    if append.sequence == expected:
        return None
    if append.sequence > expected:
        return PartitionAppendResult(ErrorCode.OUT_OF_ORDER_SEQUENCE)
    for earlier in window:
        if earlier.first_sequence == append.sequence and earlier.record_count == append.record_count:
            return PartitionAppendResult(ErrorCode.OK, earlier.base_offset, duplicate=True)
    return PartitionAppendResult(ErrorCode.DUPLICATE_SEQUENCE)
