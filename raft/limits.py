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
GROUPS_MAX = 10_000
GROUP_MEMBERS_MAX = 1_000
SUBSCRIBED_TOPICS_MAX = 1_000
TOPIC_PATTERN_LENGTH_MAX = 1_024
OFFSETS_PER_COMMIT_MAX = 10_000
SESSION_TIMEOUT_MS_MIN = 1_000
SESSION_TIMEOUT_MS_MAX = 300_000
SESSION_TIMEOUT_MS_DEFAULT = 10_000
REBALANCE_TIMEOUT_MS_MIN = 1_000
REBALANCE_TIMEOUT_MS_MAX = 600_000
REBALANCE_TIMEOUT_MS_DEFAULT = 30_000
HEARTBEAT_WAIT_MS_MAX = 30_000
COMMAND_VERSION = 1  # Version of the Command envelope this code writes and applies.


def topic_name_problem(name: str, what: str = "topic") -> str | None:
    """Why `name` is not a legal topic (or group: `what`) name, or None when it is."""
    if not name:
        return f"{what} name is empty"
    if len(name.encode()) > TOPIC_NAME_LENGTH_MAX:
        return f"{what} name is longer than {TOPIC_NAME_LENGTH_MAX} bytes"
    if name in (".", ".."):
        return f"{what} name cannot be '.' or '..'"
    if not TOPIC_NAME_PATTERN.fullmatch(name):
        return f"{what} name may contain only ASCII letters, digits, '.', '_' and '-'"
    return None
