"""Named limits of the replicated state machine: checked at the gRPC edge, asserted again in apply."""

import re

TOPIC_NAME_LENGTH_MAX = 249  # Kafka's limit, so topic names move between the two systems.
TOPIC_NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]+")
TOPICS_MAX = 10_000
PARTITIONS_MAX = 1_024
RECORD_BYTES_MAX = 1024 * 1024  # Key + value + headers of one record.
RECORDS_PER_APPEND_MAX = 10_000  # Records in one produce request.
APPEND_BYTES_MAX = 3 * 1024 * 1024  # Encoded size of one produce request's records.
ENTRY_BYTES_MAX = 3 * 1024 * 1024 + 512 * 1024  # One Raft entry: under the 4 MiB transport buffers.
HEADERS_PER_RECORD_MAX = 1_000
HEADER_NAME_BYTES_MAX = 1_024
FETCH_RECORDS_MAX = 10_000
FETCH_BYTES_MAX = 4 * 1024 * 1024
FETCH_WAIT_MS_MAX = 30_000
GRPC_MESSAGE_BYTES_MAX = 8 * 1024 * 1024  # Above every request and response size limit.
COMMAND_VERSION = 1  # Version of the Command envelope this code writes and applies.


def topic_name_problem(name: str) -> str | None:
    """Why `name` is not a legal topic name, or None when it is."""
    if not name:
        return "topic name is empty"
    if len(name.encode()) > TOPIC_NAME_LENGTH_MAX:
        return f"topic name is longer than {TOPIC_NAME_LENGTH_MAX} bytes"
    if name in (".", ".."):
        return "topic name cannot be '.' or '..'"
    if not TOPIC_NAME_PATTERN.fullmatch(name):
        return "topic name may contain only ASCII letters, digits, '.', '_' and '-'"
    return None
