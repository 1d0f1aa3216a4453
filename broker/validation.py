"""Checks at the gRPC edge: a request outside a limit is rejected here and never proposed."""

from __future__ import annotations

from broker.errors import InvalidArgumentError
from proto import kq_pb2
from proto.compression import CompressionError, decompress
from proto.records import MalformedBatchError, validate_batch
from raft.limits import (
    APPEND_BYTES_MAX,
    FETCH_BYTES_MAX,
    FETCH_RECORDS_MAX,
    FETCH_WAIT_MS_MAX,
    HEADER_NAME_BYTES_MAX,
    HEADERS_PER_RECORD_MAX,
    PARTITIONS_MAX,
    RECORD_BYTES_MAX,
    RECORDS_PER_APPEND_MAX,
    topic_name_problem,
)

FETCH_RECORDS_DEFAULT = 500
FETCH_BYTES_DEFAULT = 1024 * 1024


def check_topic_name(name: str) -> None:
    """Rejects an illegal topic name."""
    problem = topic_name_problem(name)
    if problem is not None:
        raise InvalidArgumentError(problem)


def check_partition_count(partitions: int) -> None:
    """Rejects a partition count outside 1..PARTITIONS_MAX."""
    if not 0 < partitions <= PARTITIONS_MAX:
        raise InvalidArgumentError(
            f"partition count must be between 1 and {PARTITIONS_MAX}, got {partitions}"
        )


def check_produce(request: kq_pb2.ProduceRequest) -> None:
    """Rejects a produce request that is empty, malformed, too large, or has an oversized record.

    Every record is decoded here, on the leader, so that what is replicated and stored is always
    readable: apply only walks the length prefixes again.
    """
    check_topic_name(request.topic)
    if not request.HasField("partition"):
        raise InvalidArgumentError("partition is required (the client library chooses one when you do not)")
    if not request.records:
        raise InvalidArgumentError("a produce request needs at least one record")
    if request.compression not in (kq_pb2.COMPRESSION_NONE, kq_pb2.COMPRESSION_ZSTD, kq_pb2.COMPRESSION_LZ4):
        raise InvalidArgumentError(f"unknown compression {request.compression}")
    if len(request.records) > APPEND_BYTES_MAX:
        raise InvalidArgumentError(
            f"request of {len(request.records)} bytes exceeds the {APPEND_BYTES_MAX}-byte limit"
        )
    try:
        records = decompress(request.records, request.compression, APPEND_BYTES_MAX)
    except CompressionError as error:
        raise InvalidArgumentError(f"bad record batch: {error}") from error
    try:
        count = validate_batch(
            records, RECORDS_PER_APPEND_MAX, HEADERS_PER_RECORD_MAX, RECORD_BYTES_MAX, HEADER_NAME_BYTES_MAX
        )
    except MalformedBatchError as error:
        raise InvalidArgumentError(f"bad record batch: {error}") from error
    if count != request.record_count:
        raise InvalidArgumentError(f"record_count says {request.record_count}; the batch holds {count}")


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
