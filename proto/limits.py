"""Every named limit of kq in one module: the broker, raft (validation at the edge and in apply), the
client, the Spark source and the bench import them from here, so a limit is never copied.
"""

TOPIC_NAME_LENGTH_MAX = 249  # Kafka's limit, so topic names move between the two systems.
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
TOPIC_PATTERN_LENGTH_MAX = 1_024  # Bytes of a group's topic pattern (RE2 syntax, raft/patterns.py).
PATTERN_NESTING_MAX = 32  # Parenthesis depth of a topic pattern.
PATTERN_PROGRAM_SIZE_MAX = 4_096  # RE2 instructions: one match costs at most this x the name length.
PATTERN_MEMORY_BYTES_MAX = 2 * 1024 * 1024  # RE2's max_mem for compiling one pattern.
PATTERN_CACHE_MAX = 1_024  # Compiled patterns kept per process.
MEMBER_ID_LENGTH_MAX = 255  # Member ids are chosen by the leader; longer ones are refused.
CLIENT_ID_LENGTH_MAX = 255
APPENDS_PER_ENTRY_MAX = 1_000  # Produce requests the batcher packs into one Raft entry.
OFFSETS_PER_COMMIT_MAX = 10_000
SESSION_TIMEOUT_MS_MIN = 1_000
SESSION_TIMEOUT_MS_MAX = 300_000
SESSION_TIMEOUT_MS_DEFAULT = 10_000
REBALANCE_TIMEOUT_MS_MIN = 1_000
REBALANCE_TIMEOUT_MS_MAX = 600_000
REBALANCE_TIMEOUT_MS_DEFAULT = 30_000
HEARTBEAT_WAIT_MS_MAX = 30_000
COMMAND_VERSION = 1  # Version of the Command envelope this code writes and applies.

GROUP_STATE_BYTES_MAX = 4 * 1024 * 1024  # A group's serialized state; a join that would pass it is refused.
# Members x subscribed partitions one rebalance may assign: bounds the assignors' time inside apply.
ASSIGNMENT_WORK_MAX = 2_000_000
