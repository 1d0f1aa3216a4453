"""Checks at the gRPC edge: the shared validation (raft/validation.py) raised as INVALID_ARGUMENT.

A request outside a limit is rejected here and never proposed; apply runs the same functions on
every committed entry, so what passes here cannot trip apply.
"""

from __future__ import annotations

from dataclasses import dataclass

from kq.broker.errors import BatchTooLargeError, InvalidArgumentError
from kq.proto import kq_pb2
from kq.proto.errors import ErrorCode
from kq.proto.limits import (
    APPEND_BYTES_MAX,
    ENTRY_WORK_MAX,
    FETCH_BYTES_DEFAULT,
    FETCH_BYTES_MAX,
    FETCH_RECORDS_DEFAULT,
    FETCH_RECORDS_MAX,
    FETCH_WAIT_MS_MAX,
    HEADER_NAME_BYTES_MAX,
    HEADERS_PER_RECORD_MAX,
    PRODUCE_MANY_REQUESTS_MAX,
    RECORD_BYTES_MAX,
    RECORDS_PER_APPEND_MAX,
)
from kq.proto.records import MalformedBatchError, WorkMeter, check_batch, read_header
from kq.raft import commands
from kq.raft.transactions import TRANSACTION_COMMAND_KINDS, transaction_problem
from kq.raft.validation import (
    append_problem,
    command_problem,
    partition_count_problem,
    topic_name_problem,
)


def check(problem: str | None) -> None:
    """Raises InvalidArgumentError for a problem found by the shared validation."""
    if problem is not None:
        raise InvalidArgumentError(problem)


def check_command(command: kq_pb2.Command) -> None:
    """Rejects a command that apply would refuse: every proposal passes here first."""
    if command.WhichOneof("kind") in TRANSACTION_COMMAND_KINDS:
        check(transaction_problem(command))
    else:
        check(command_problem(command))


def check_topic_name(name: str) -> None:
    """Rejects an illegal topic name."""
    check(topic_name_problem(name))


def check_group_name(group: str) -> None:
    """Rejects an illegal group name (the same rules as topic names)."""
    check(topic_name_problem(group, "group"))


def check_partition_count(partitions: int) -> None:
    """Rejects a partition count outside 1..PARTITIONS_MAX."""
    check(partition_count_problem(partitions))


@dataclass(frozen=True, slots=True)
class CheckedAppend:
    """A produce request's append that passed apply's check, and the work that check cost.

    `work` (proto/records.py WorkMeter units) is what apply will spend on it too: the batcher packs
    an entry's appends within ENTRY_WORK_MAX by it.
    """

    append: commands.RecordsAppend
    work: int


def checked_append(request: kq_pb2.ProduceRequest, records: bytes | None = None) -> CheckedAppend:
    """The produce request as the append apply will see, after apply's own check of it.

    The record batch (one Kafka RecordBatch v2) is checked whole here, on any node, by the function
    apply runs (`append_problem`, so proto/records.py `check_batch`: CRC32C, header, every record, a
    compressed batch expanded within APPEND_BYTES_MAX first), so an empty, truncated, count-lying or
    undecodable batch is refused with a one-line reason and what is replicated and stored is always
    readable. The check runs on a meter of a whole entry's budget, as the batch will be applied in
    the worst case alone; every batch within the limits fits (ENTRY_WORK_MAX says why). `records` is
    `request.records` when the caller has read it already (each read of the field copies the batch).
    """
    if not request.HasField("partition"):
        raise InvalidArgumentError("partition is required (the client library chooses one when you do not)")
    if records is None:
        records = request.records
    _check_batch_size(records)
    append = commands.RecordsAppend(request.topic, request.partition, records)  # No copy of the batch.
    meter = WorkMeter(ENTRY_WORK_MAX)
    check(append_problem(append, meter, edge=True, records=records))
    return CheckedAppend(append, meter.spent)


def _check_batch_size(records: bytes) -> None:
    """Refuses a batch over a size limit with the error Kafka answers for it, before the shared check
    (which refuses it too, as INVALID_REQUEST): over APPEND_BYTES_MAX, the default and the ceiling of
    every topic's max.message.bytes (Kafka's message.max.bytes), MESSAGE_TOO_LARGE as a topic's own
    override is answered (service.py `prepared_append`); over RECORDS_PER_APPEND_MAX records,
    BatchTooLargeError (Kafka's RECORD_LIST_TOO_LARGE). A header that does not parse is left to the
    shared check, which says what is wrong with it."""
    if len(records) > APPEND_BYTES_MAX:
        raise InvalidArgumentError(
            f"a record batch of {len(records)} bytes; max.message.bytes is at most {APPEND_BYTES_MAX}",
            ErrorCode.MESSAGE_TOO_LARGE,
        )
    try:
        count = read_header(records).record_count
    except MalformedBatchError:
        return
    if count > RECORDS_PER_APPEND_MAX:
        raise BatchTooLargeError(
            f"{count} records in one batch; a batch holds at most {RECORDS_PER_APPEND_MAX}"
        )


def only_a_record_too_large(records: bytes | memoryview) -> bool:
    """Whether a batch the shared check refused would pass if its records could be as large as a
    batch: a record over RECORD_BYTES_MAX (key, value and headers) is all that is wrong with it, Kafka's
    MESSAGE_TOO_LARGE (a record too large) rather than INVALID_RECORD. Two bounded walks of the batch:
    the Kafka edge asks only once a batch was refused, on a worker."""

    def passes(record_bytes_max: int) -> bool:
        try:
            check_batch(
                records,
                RECORDS_PER_APPEND_MAX,
                HEADERS_PER_RECORD_MAX,
                record_bytes_max,
                HEADER_NAME_BYTES_MAX,
                APPEND_BYTES_MAX,
                WorkMeter(ENTRY_WORK_MAX),
            )
        except MalformedBatchError:
            return False
        return True

    return not passes(RECORD_BYTES_MAX) and passes(APPEND_BYTES_MAX)


def check_produce_many(request: kq_pb2.ProduceManyRequest) -> None:
    """Rejects a ProduceMany call as a whole: more than PRODUCE_MANY_REQUESTS_MAX requests, or one
    (topic, partition) named twice (the order of two batches to one partition would then depend on
    which check ended first). Each request is checked on its own afterwards, as a Produce call."""
    if len(request.requests) > PRODUCE_MANY_REQUESTS_MAX:
        raise InvalidArgumentError(
            f"{len(request.requests)} produce requests in one call; at most {PRODUCE_MANY_REQUESTS_MAX}"
        )
    seen: set[tuple[str, int | None]] = set()
    for item in request.requests:
        key = (item.topic, item.partition if item.HasField("partition") else None)
        if key in seen:
            raise InvalidArgumentError(
                f"partition {item.partition} of topic {item.topic!r} is named twice in one call; "
                "send its next batch in the next call"
            )
        seen.add(key)


def fetch_limits(request: kq_pb2.FetchRequest) -> tuple[int, int, int]:
    """(max_records, max_bytes, wait_ms) of a fetch, defaults filled in; rejects values over the limits."""
    check_topic_name(request.topic)
    max_records = request.max_records or FETCH_RECORDS_DEFAULT
    max_bytes = request.max_bytes or FETCH_BYTES_DEFAULT
    if max_records > FETCH_RECORDS_MAX:
        raise InvalidArgumentError(f"max_records is at most {FETCH_RECORDS_MAX}")
    if max_bytes > FETCH_BYTES_MAX:
        raise InvalidArgumentError(f"max_bytes is at most {FETCH_BYTES_MAX}")
    if request.wait_ms > FETCH_WAIT_MS_MAX:
        raise InvalidArgumentError(f"wait_ms is at most {FETCH_WAIT_MS_MAX}")
    return max_records, max_bytes, request.wait_ms
