"""Every named limit of kq in one module: the broker, raft (validation at the edge and in apply), the
client, the Spark source and the bench import them from here, so a limit is never copied.
"""

TOPIC_NAME_LENGTH_MAX = 249  # Kafka's limit, so topic names move between the two systems.
TOPICS_MAX = 10_000
PARTITIONS_MAX = 1_024
RECORD_BYTES_MAX = 1024 * 1024  # Key + value + headers of one record.
RECORDS_PER_APPEND_MAX = 10_000  # Records in one produce request.
# A batch of at least this many records is checked as arrays first (proto/arrays.py): below it,
# numpy's fixed cost a batch (about 110 µs) is more than the Python walk's (about 2 µs a record).
ARRAY_WALK_RECORDS_MIN = 64
# The array walk follows records' lengths one by one in Python (~0.23 µs a record) except over runs of
# records of one length (fixed-size values), which it takes whole once a numpy test confirms them
# (~8 µs a test): a test over ARRAY_RUN_PROBE_MIN records first, twice as many after each that held
# (at most ARRAY_RUN_PROBE_MAX). Where the next two records' lengths differ, or a test finds fewer
# than ARRAY_RUN_MIN alike, records are walked one by one, ARRAY_RUN_BACKOFF_MIN of them and twice as
# many after each further miss (at most ARRAY_RUN_BACKOFF_MAX), so records of varied lengths cost a
# few cheap looks a batch.
ARRAY_RUN_MIN = 16
ARRAY_RUN_PROBE_MIN = 64
ARRAY_RUN_PROBE_MAX = 4096
ARRAY_RUN_BACKOFF_MIN = 16
ARRAY_RUN_BACKOFF_MAX = 1024
APPEND_BYTES_MAX = 3 * 1024 * 1024  # One produce request's record batch, and its records once expanded.
# Produce requests in one ProduceMany call (Kafka's Produce names many partitions too); the call's
# whole size is bounded by GRPC_MESSAGE_BYTES_MAX, each request's records by APPEND_BYTES_MAX.
PRODUCE_MANY_REQUESTS_MAX = 1_000
# Blocks of one xerial-framed snappy batch (snappy-java writes 32 KiB blocks: ~100 for a full batch).
# Each costs a step of a Python loop, so a stream of empty blocks cannot make a check slow.
SNAPPY_XERIAL_BLOCKS_MAX = 4_096
ENTRY_BYTES_MAX = 3 * 1024 * 1024 + 512 * 1024  # One Raft entry: under the 4 MiB transport buffers.
HEADERS_PER_RECORD_MAX = 1_000
# Headers of all the records of one batch: a header can be two bytes, so a batch expanding to
# APPEND_BYTES_MAX could hold 1.5 million, and walking them took 2-9 s per batch in apply. Ten per
# record at RECORDS_PER_APPEND_MAX records (a Kafka producer's batch is rarely near either).
HEADERS_PER_BATCH_MAX = 100_000
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
TOPIC_CONFIG_VALUE_LENGTH_MAX = 255  # Characters of one topic config value (raft/topic_config.py).
APPENDS_PER_ENTRY_MAX = 1_000  # Produce requests the batcher packs into one Raft entry.
# Batches one trim deletes in apply; the log start moves at once, and retention proposes the trim again
# until the batches below it are gone, so one entry never deletes a whole large log.
TRIM_BATCHES_PER_ENTRY_MAX = 10_000
# Producer id expiry (Kafka's producer.id.expiration.ms, KIP-360): `producers` rows one expiry entry
# looks at in apply (each a read, at most a write); the next entry resumes where it stopped (the
# `producer_sweep` meta row), so a table of any size is swept by enough bounded entries.
PRODUCER_EXPIRY_ROWS_PER_ENTRY_MAX = 1_000
# Expiry entries a leader proposes in one check (a table this many times the bound above is swept
# over several checks).
PRODUCER_EXPIRY_ENTRIES_PER_CHECK_MAX = 100
# Kafka's producer.id.expiration.ms (a producer idle this long on a partition, with no open
# transaction there, loses its state there) and producer.id.expiration.check.interval.ms: the names
# and defaults of the node's flags (broker/config.py).
PRODUCER_ID_EXPIRATION_MS_DEFAULT = 86_400_000
PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS_DEFAULT = 600_000
# Apply's work on one append entry, in units of about a microsecond of this 2-core machine (measured
# with proto/records.py check_batch: ~3 us a record walked, ~0.7 us a header, ~3 ns a byte gunzipped).
# The edge measures each batch's work with the very meter apply runs; the batcher packs entries within
# ENTRY_WORK_MAX, and apply refuses the appends of an entry past it (only a crafted or foreign entry
# gets there). Without it one entry of 1,000 dense compressed batches froze apply for minutes.
WORK_PER_APPEND = 20  # Decoding the append, the topic lookup, the LMDB put and the producer window.
WORK_PER_RECORD = 3
WORK_PER_HEADER = 1
WORK_BYTES_PER_UNIT = 256  # Bytes checksummed and stored, and again bytes expanded, per unit.
# At least the costliest single append the other limits allow (RECORDS_PER_APPEND_MAX records with
# HEADERS_PER_BATCH_MAX headers, APPEND_BYTES_MAX stored and expanded: 154,596 units), so every batch
# the edge accepts fits an entry: ~0.15 s of apply here.
ENTRY_WORK_MAX = 160_000
# Batches a node's edge checked and passed, kept so that this node's apply of the entry holding one
# (the leader's, which proposed it) does not walk it again (raft/validation.py PassedBatches): at
# least the requests in flight to one leader, in count and in bytes.
PASSED_BATCHES_KEPT = 256
PASSED_BATCHES_BYTES_MAX = 32 * 1024 * 1024
# Topic configs parsed from their stored overrides, kept by those bytes (raft/topic_config.py
# `applied_config_of`, `ConfigParser`): apply and the edge parse a topic's configs for every produce
# request; a topic's stored overrides change rarely, and topics with none share one entry.
TOPIC_CONFIGS_PARSED_KEPT = 1024
# Topic and group names found legal, kept so that a produce request's topic is not matched against
# the name pattern again on every node (raft/validation.py `topic_name_problem`).
LEGAL_NAMES_KEPT = 4096
# REGULAR entries whose call a node remembers by the identity of their command bytes (raft/
# pysyncobj_adapter.py EntryCalls: built here, so neither the sender's canonical check nor apply
# unpickles them), and their arguments' bytes in all: the entries in flight between proposal (or
# receipt) and apply, a few at a time (PROPOSALS_IN_FLIGHT_MAX entries of at most ENTRY_BYTES_MAX on
# a leader); a miss only takes the longer way. Each argument is held beside its command: heap.
ENTRY_CALLS_KEPT = 8
ENTRY_CALLS_BYTES_MAX = 8 * 1024 * 1024
# Append entries a leader remembers by the identity of their bytes with the values it encoded them
# from (raft/commands.py AppendEntries: apply on the leader takes them instead of decoding), and the
# entries' bytes in all: as ENTRY_CALLS, the entries between proposal and apply. A miss decodes.
APPEND_ENTRIES_KEPT = 8
APPEND_ENTRIES_BYTES_MAX = 8 * 1024 * 1024
# A follower decodes an append entry without protobuf (raft/commands.py `decode_append`: each batch
# one slice) only when every batch is at least this long: its Python costs ~7 µs an entry and ~3 µs a
# batch, protobuf's C ~2.5 µs and ~0.5 µs plus two copies (2026-11-28, this VM: 1 MB, 37 against
# 75 µs; 60 KB, 9.1 against 6.6; ten 1 KB batches, 41 against 7.8).
APPEND_DECODE_BATCH_BYTES_MIN = 128 * 1024
OFFSETS_PER_COMMIT_MAX = 10_000
OFFSET_METADATA_BYTES_MAX = 4_096  # A committed offset's metadata string (Kafka's offset.metadata.max.bytes).
# Key compaction (raft CompactCommand, broker/compactor.py). One compaction entry rewrites batches
# within the work budget of one append entry (ENTRY_WORK_MAX, charged by compacted_batch as check_batch
# charges), so it holds apply, and produce behind it, no longer than one large batch does.
COMPACT_BATCHES_PER_ENTRY_MAX = 1_000
COMPACT_DROPPED_PER_ENTRY_MAX = 100_000  # offsetDeltas listed in one entry (~2 bytes each).
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

# The client (client/): its own bounds, below or beside the broker's above.
CLIENT_REDIRECTS_MAX = 5  # `kq-leader` redirects followed in a row before backing off and rotating nodes.
CLIENT_BACKOFF_INITIAL_S = 0.05
CLIENT_BACKOFF_MAX_S = 0.25  # Retries during an election are cheap; a short cap finds the new leader sooner.
CLIENT_STREAM_BACKOFF_MAX_S = 1.0  # Longest pause before reopening a refused or broken stream.
CLIENT_RPC_TIMEOUT_S = 10.0  # One attempt; the server answers a stuck proposal within 5 s.
# Open ProduceStream calls a client keeps to one node (one per thread sending at once); a send beyond
# them is a unary Produce call. Each holds one of gRPC's threads (it feeds the stream) and, on the
# node, a produce stream slot (PRODUCE_STREAMS_MAX).
CLIENT_PRODUCE_STREAMS_MAX = 8
# How long a client sends each request of a ProduceMany call as its own Produce after a node answered
# ProduceMany UNIMPLEMENTED (an older version, during a rolling upgrade) before it asks again.
CLIENT_METHOD_RECHECK_S = 60.0
CLIENT_STREAM_WATCH_S = 0.05  # How often a client checks its streams' requests for their deadlines.
CLIENT_STREAM_WATCH_IDLE_S = 1.0  # The checking thread ends after this long without a request waiting.
CLIENT_RETRY_TIMEOUT_S = 30.0  # All attempts of one call.
CLIENT_STATUS_TIMEOUT_S = 2.0  # One ClusterStatus call to each bootstrap node.
CLIENT_REQUEST_BYTES_MAX = 2 * 1024 * 1024  # A produce request's records: room below APPEND_BYTES_MAX.
# Records of one ProduceMany call the client sends (the Producer, the Spark sink): under
# GRPC_MESSAGE_BYTES_MAX with room for the envelope; a batch alone may still be CLIENT_REQUEST_BYTES_MAX.
CLIENT_PRODUCE_MANY_BYTES_MAX = 4 * 1024 * 1024
CLIENT_CHANNELS_MAX = 64  # Channels kept open; beyond it the least recently used non-bootstrap one closes.
CLIENT_TOPICS_CACHED_MAX = TOPICS_MAX  # Partition counts remembered; the oldest is forgotten beyond it.
# Partitions an idempotent producer id keeps sequences for; one more starts a new producer id.
CLIENT_PRODUCER_PARTITIONS_MAX = 100_000
CLIENT_PARTITION_LOCKS = 1_024  # Lock stripes serializing one in-flight produce request per partition.
PRODUCER_IN_FLIGHT_MAX = 64  # ProduceMany calls a Producer has in flight at once (its max_in_flight).
PRODUCER_ACKED_PARTITIONS_MAX = 10_000  # acks="none": partitions whose shared resolved future is kept.
GROUP_JOIN_ATTEMPTS_MAX = 10  # JoinGroup calls one rejoin of a GroupConsumer makes before giving up.

# The kq command (cli/).
CLI_RPC_TIMEOUT_S_MAX = 10.0  # One attempt; the broker answers a stuck proposal within 5 s.
CLI_BOOTSTRAP_NODES_MAX = 64  # More is a typo (a pasted list): kq clusters have at most 9 nodes.
CLI_LINE_BYTES_MAX = 8 * 1024 * 1024  # One input line; refused before it fills memory.
CLI_PRODUCE_RECORDS_MAX = 1_000  # Records `kq produce` hands the client at once.
CLI_PRODUCE_BYTES_MAX = 4 * 1024 * 1024  # Bytes `kq produce` buffers; the client splits requests further.
CLI_FETCH_RECORDS_MAX = 2_000  # Records per fetch of `kq consume` (FETCH_RECORDS_MAX allows more).

# The Spark source (spark/).
SPARK_PLANNING_RETRY_TIMEOUT_S = 10.0  # All attempts of one planning call on the driver.
SPARK_PLANNING_RPC_TIMEOUT_S = 5.0  # One planning attempt.
SPARK_READ_RETRY_TIMEOUT_S = 1.0  # One node's retriable failures before the reader tries the next node.
SPARK_READ_RPC_TIMEOUT_S = 10.0  # One fetch, on top of its catch-up wait.
SPARK_CATCH_UP_WAIT_MS = 2_000  # How long one node may take to apply min_index before the reader moves on.
SPARK_READ_STALL_TIMEOUT_S = 60.0  # No node made progress for this long: the read fails.
SPARK_ROUND_BACKOFF_S = 0.5  # Pause after every candidate node failed once in a row.
SPARK_FETCH_DELAY_MS_MAX = 60_000  # kq.debug.fetchDelayMs: a debugging throttle, never minutes.
SPARK_MIN_PARTITIONS_MAX = 100_000  # Input partitions one read may be split into.
SPARK_WRITE_RETRY_TIMEOUT_S = 30.0  # A sink task's retries of one produce (a leader change takes ~1 s).
SPARK_WRITE_RPC_TIMEOUT_S = 10.0  # One produce request of a sink task.
# A sink task's produce request: its records' bytes at most (with 512 KiB a write was ~15 % slower).
SPARK_WRITE_BATCH_BYTES = 1024 * 1024
# A sink task joins Spark's Arrow batches (10,000 rows each) up to this size before encoding them.
SPARK_WRITE_COALESCE_BYTES = 4 * 1024 * 1024
SPARK_WRITE_IN_FLIGHT = 4  # A sink task's ProduceMany calls in flight (a partition in one at a time).
SPARK_WRITE_OPEN_BYTES_MAX = 16 * 1024 * 1024  # A sink task's requests being filled, in all.
# An Arrow batch of at least this many rows (to one topic) is encoded as arrays (spark/encoding.py);
# smaller ones go row by row and fill requests across batches (a stream's small micro-batches).
SPARK_WRITE_ARRAYS_ROWS_MIN = 512

# Limits of the node's own machinery (moved here from the modules that use them, so every wait,
# queue and size of kq is named in this one module).

# broker/admission.py, broker/front.py, broker/main.py
# A waiting call (a FetchStream stream, a Fetch, Heartbeat or JoinGroup that waits) is a coroutine on
# the node's serving loop and holds no thread. It still costs memory (its call, at most one stream
# message, STREAM_MESSAGE_BYTES_MAX, waiting to be written), so a node admits at most READERS_MAX of
# them and one client connection (one gRPC peer) at most READERS_PER_CONNECTION_MAX; one more is
# refused at once (TOO_MANY_READERS, retriable).
READERS_MAX = 4_096
READERS_PER_CONNECTION_MAX = 1_024
# Plain-function handlers (proposals that wait for the commit, metadata reads) run on --grpc-workers
# threads; at most UNARY_CALLS_MAX such calls are in progress (running or queued for a thread),
# beyond it QUEUE_FULL at once.
# Open ProduceStream calls (broker/service.py), admitted apart from readers: each is an idle coroutine
# and its call between requests (a client keeps CLIENT_PRODUCE_STREAMS_MAX a node at most).
PRODUCE_STREAMS_MAX = 1_024
PRODUCE_STREAMS_PER_CONNECTION_MAX = 64
UNARY_CALLS_MAX = 4_096
# A produce request's batch of at most this is checked on the serving loop (broker/service.py
# `produce`): cheaper than the hand-off to a worker and back; a longer walk would hold up the loop.
# 64 KiB of records is at most about 3 ms of checking (10,000 records walked as arrays, proto/arrays.py).
# Measured, 1 KiB `Producer`, three A/B pairs against 16 KiB: 6-13 % more msgs/s, up to 12 % less CPU.
PRODUCE_CHECK_ON_LOOP_BYTES_MAX = 64 * 1024
# An uncompressed batch of at most these bytes and records is checked on the loop too (`checks_on_loop`):
# a worker walking it holds the GIL the loop then waits for, switch by switch (the check is Python and
# numpy calls, few of which let the GIL go), which cost more than the walk itself. A follower's apply
# checks the same batch on its loop, so the leader's loop takes a pause every replica already takes;
# the records bound keeps a walk in Python (records with headers, ~2.3 µs each) within ~5 ms, and a
# compressed batch, whose expansion can be far larger than its bytes, stays on a worker. Measured
# (bench/README.md, "Sixth session"): 1 KiB records through the Kafka port, librdkafka's batches of
# ~945 records, ~1 MB (one a request; counted in the store, "Seventh session"), the leader's CPU
# 6.4-7.1 -> 5.6 µs a record.
PRODUCE_CHECK_ON_LOOP_PLAIN_BYTES_MAX = 1024 * 1024
PRODUCE_CHECK_ON_LOOP_RECORDS_MAX = 2_048
GRPC_WORKERS_MIN = 4
GRPC_WORKERS_MAX = 1_024
GRPC_WORKERS_DEFAULT = 64  # Threads start on demand: an idle node runs a few.
READ_WORKERS = 4  # Threads reading records for waiting calls (LMDB read transactions).
# gRPC's own cap on the calls of the server, a backstop above the two counted by the edge (the health
# service's Watch streams are the only calls outside them).
GRPC_CONCURRENT_RPCS_MAX = READERS_MAX + UNARY_CALLS_MAX + 1_024
# Calls gRPC has accepted but not yet handed to a handler; beyond it gRPC cancels new ones, so it
# must hold a burst of streams opened at once (its default, 1,000, cancelled some of 2,000).
GRPC_PENDING_CALLS_MAX = READERS_MAX + UNARY_CALLS_MAX
LOOP_CALL_TIMEOUT_S = 10.0  # A thread waiting for the serving loop to run a call (health changes).

# broker/metrics.py, broker/http_endpoints.py: the node's HTTP port (/metrics, /healthz, /readyz).
# Series stay bounded whatever the cluster holds: topics counted by name (later ones as "_other"),
# partitions and groups a scrape reports (the rest counted in kq_metrics_series_dropped).
METRICS_TOPICS_MAX = 200
# Labelled metric children found once and kept (broker/metrics.py `child`): every label value is
# from a bounded set (topics above, request and method names), so all of them fit.
METRIC_CHILDREN_KEPT = 4096
METRICS_PARTITION_SERIES_MAX = 4_096
METRICS_GROUPS_MAX = 512
# /readyz: ready while this node's applied index is within this many entries of the commit index.
READY_APPLY_LAG_MAX = 1_000
HTTP_THREADS_MAX = 8  # Concurrent HTTP requests (scrapes and probes); one more waits for a slot.
HTTP_REQUEST_TIMEOUT_S = 10.0  # A client that sends its request slower than this is dropped.
# How often `kq-http`'s accept loop looks whether it is asked to stop: a node's shutdown waits this long
# at most for it (socketserver's default, 0.5 s, was half of a node's whole stop), for 20 idle
# wake-ups a second (~0.03 % of a core).
HTTP_STOP_POLL_S = 0.05
# A node process's threads besides its three pools (gRPC workers, readers, HTTP requests): the named
# threads of DESIGN.md's threads table (one of each, a `kq-raft-tick-<group>` per group it holds) and
# the gRPC core's own (its poller, timer and executor threads). The soak holds every node to
# NODE_THREADS_MAX (`python -m kq.bench.soak`): a thread that leaks per call or per client shows there.
NODE_FIXED_THREADS_MAX = 32
# broker/corruption.py: corrupt batches a node remembers having reported (one log line and one count
# each); past it the oldest is forgotten, and reported again if met again.
CORRUPT_BATCHES_REMEMBERED_MAX = 1_024
# broker/repair.py (`kq-repair`): corrupt batches waiting to be put back from another replica (more
# are left until a read meets them again), how long one fetch of a batch from a replica may take, and
# how long after a failed round (no replica answered whole) the batch is tried again.
REPAIR_QUEUE_MAX = 1_024
REPAIR_CALL_TIMEOUT_S = 10.0
REPAIR_RETRY_S = 2.0
# The scrubber (`kq-repair` between repairs): stored bytes whose checksums it checks per second
# (`--scrub-bytes-per-s`; 0: off), and at most this much in one read transaction, so a round never
# pins old pages for long. 1 MiB/s reads a 10 GiB store through in under 3 hours, for about 1 % of
# a core with 1 KiB batches (each batch costs a few microseconds of Python beside its C CRC).
SCRUB_BYTES_PER_S_DEFAULT = 1024 * 1024
# Each batch counts as at least this many bytes against the scrubber's rate: its cost is mostly the
# Python around the check (~2.5 µs a batch here), not its bytes, so small batches counted by their
# length alone made a scrub of 1 MiB/s check ~6,000 batches a second, ~1.5 % of a core on every node
# (24 µs of each node's CPU a record with one 100 B record in flight). At 1 KiB a batch it checks at
# most 1,024 a second (~0.3 % of a core); batches of 1 KiB and more are counted as before.
SCRUB_BATCH_BYTES_MIN = 1024
SCRUB_ROUND_BYTES_MAX = 4 * 1024 * 1024
SCRUB_BYTES_PER_S_MAX = 1024 * 1024 * 1024
SCRUB_TICK_S = 0.5  # How often an idle kq-repair wakes to scrub its share of bytes.
NODE_THREADS_MAX = GRPC_WORKERS_DEFAULT + READ_WORKERS + HTTP_THREADS_MAX + NODE_FIXED_THREADS_MAX

# console/ (`kq console`): what one page shows and what the console keeps.
CONSOLE_RECORDS_MAX = 100  # Records one browse page shows (the next page starts after them).
CONSOLE_VALUE_BYTES_MAX = 2_048  # Bytes of one key, value or header shown; the rest is cut, and says so.
CONSOLE_PRODUCE_BYTES_MAX = 64 * 1024  # A key or value typed into the produce form.
CONSOLE_LAG_SAMPLE_S = 2.0  # How often the console samples each group's total lag (the lag chart).
CONSOLE_LAG_SAMPLES_MAX = 300  # Samples kept a group: ten minutes at CONSOLE_LAG_SAMPLE_S.
CONSOLE_GROUPS_SAMPLED_MAX = 100  # Groups whose lag is sampled; the chart of others says so.
CONSOLE_TIMEOUT_S = 5.0  # One cluster call of a page; past it the page says the cluster did not answer.

# broker/config.py
PEERS_MAX = 9  # Raft clusters beyond this size only slow commits down.

# deploy/certs.py (`kq certs init`)
CERT_DAYS_MAX = 3_650  # Certificates valid for at most ten years.
CERT_NODES_MAX = PEERS_MAX * 4  # Node certificates one call makes (room for replacements).
CERT_HOSTS_MAX = 16  # Subject alternative names of one node certificate.

# broker/membership.py, raft/validation.py `member_problem`
# Registered members' addresses kept (the voters, plus a few left behind by changes cut short).
MEMBERS_MAX = 2 * PEERS_MAX
NODE_ID_LENGTH_MAX = 64  # A node id: letters, digits, '.', '_', '-' (an integer with a Kafka listener).
HOST_LENGTH_MAX = 253  # A DNS name's length; addresses are host:port with a host of [A-Za-z0-9.-_].
CLUSTER_ID_LENGTH_MAX = 64
MEMBERSHIP_CHANGE_TIMEOUT_S = 15.0  # An add or remove not committed by then is answered UNAVAILABLE.
MEMBER_PROBE_TIMEOUT_S = 2.0  # The leader asks a node it is about to add whether it is up.
MEMBER_JOIN_WAIT_S = 10.0  # With worker processes: the new node's workers of other groups start answering.

# Kafka leader epochs (raft/epochs.py): a group's Raft term, stamped in each appended batch; Kafka's are
# int32. A partition keeps at most storage's LEADER_EPOCHS_PER_PARTITION_MAX epoch rows.
LEADER_EPOCH_MAX = 2**31 - 1

# Security: users, tokens and ACLs (raft/auth.py, broker/auth.py), checked at the edge and in apply.
USERS_MAX = 10_000
TOKENS_MAX = 10_000
ACLS_MAX = 10_000
ACLS_PER_REQUEST_MAX = 100  # ACLs one AddAcls or RemoveAcls names.
USER_NAME_LENGTH_MAX = 64  # Letters, digits, '.', '_', '-': a principal is "User:<name>".
TOKEN_DESCRIPTION_LENGTH_MAX = 200
TOKEN_TTL_S_MAX = 10 * 365 * 24 * 3600
TOKEN_SECRET_BYTES = 32  # A token's random secret; only its SHA-256 is stored.
SCRAM_SALT_BYTES_MIN = 16
SCRAM_SALT_BYTES_MAX = 64
# SCRAM's iteration count: RFC 7677's minimum, and a ceiling because SASL PLAIN makes the node run
# PBKDF2 with it for every login.
SCRAM_ITERATIONS_MIN = 4_096
SCRAM_ITERATIONS_MAX = 100_000
# Kafka's own bounds on an AlterUserScramCredentials upsertion (ScramMechanism's min and max
# iterations): within kq's, and what the Kafka edge answers UNACCEPTABLE_CREDENTIAL outside of.
KAFKA_SCRAM_ITERATIONS_MIN = 4_096
KAFKA_SCRAM_ITERATIONS_MAX = 16_384
SCRAM_ALTERATIONS_MAX = 100  # Users one AlterScram command (AlterUserScramCredentials) changes.
AUTH_DENIAL_LOG_INTERVAL_S = 60.0  # One log line per (principal, resource) denied, per minute.
AUTH_DENIAL_KEYS_MAX = 10_000  # (principal, resource) pairs the denial log remembers.

# broker/edge.py
LOG_INTERVAL_S = 10.0  # At most one line per method per interval for unexpected errors.
REASON_CHARS_MAX = 200  # Characters of a decoder's message quoted back to the client.

# broker/group_service.py
MEMBER_ID_PREFIX_MAX = 64  # Characters of the client id kept in a new member id.
JOIN_WAIT_S = 5.0  # A join answers within this (below the client's RPC timeout), rebalanced or not.

# broker/groups.py
COORDINATOR_TICK_S = 0.1
EXPIRY_RETRY_S = 2.0  # An expiry proposal not applied by then is proposed again.

# broker/main.py
HEALTH_POLL_S = 0.2
SHUTDOWN_GRACE_S = 2.0

# broker/retention.py
RETENTION_CHECK_S_DEFAULT = 60.0  # The leader's retention round (`--retention-check-ms`; Kafka's is 5 min).

# broker/compactor.py
COMPACTION_CHECK_S_DEFAULT = 15.0  # The leader's compaction round (`--compaction-check-ms`; Kafka's 15 s).
# Keys one compaction pass remembers (a 16-byte digest and an offset each, ~150 bytes in a dict): a
# partition's dirty part with more distinct keys is compacted over several passes (Kafka's dedupe buffer).
COMPACTION_KEYS_MAX = 500_000
COMPACTION_SCAN_BATCHES_MAX = 100_000  # Batches one pass reads from one partition (the rest: next pass).
COMPACTION_READ_BATCHES = 1_000  # Batches per read transaction: none pins old pages for long.

# broker/proposals.py
PROPOSAL_TIMEOUT_S = 5.0  # A proposal not committed by then is answered UNAVAILABLE (it may still commit).
# A client's AddNode/RemoveNode attempt: the probe, two proposals and the membership entry's commit.
MEMBERSHIP_CALL_TIMEOUT_S = MEMBER_PROBE_TIMEOUT_S + 2 * PROPOSAL_TIMEOUT_S + MEMBERSHIP_CHANGE_TIMEOUT_S + 3
# With worker processes (broker/group_membership.py): the metadata group's leader makes a change in the
# other Raft groups first, each through its leader; not done in all of them by then, it answers
# UNAVAILABLE and a retry goes on from where it stopped. A client's call waits for both parts.
MEMBERSHIP_GROUPS_TIMEOUT_S = 30.0
MEMBERSHIP_CLIENT_TIMEOUT_S = MEMBERSHIP_CALL_TIMEOUT_S + MEMBERSHIP_GROUPS_TIMEOUT_S
LEADERSHIP_CHECK_S = 0.1  # A waiting request checks this often that this node still leads.
BATCHER_QUEUE_MAX = 10_000  # Produce requests waiting for the batcher; beyond it RESOURCE_EXHAUSTED.
# The most the batcher waits for the rest of a Kafka Produce request of several partitions to queue
# (`Batcher.hold`: each partition is submitted apart; a compressed one is checked on a worker first).
BATCHER_HOLD_WAIT_S = 0.05
# Behind an entry in flight, kq-batcher waits up to BATCHER_GATHER_WAIT_S for more requests before
# packing the next: as many as are queued plus those the last commit answered (each answered client
# may send its next) less those queued since that commit (a client that waits for each answer has
# sent its next already), BATCHER_GATHER_REQUESTS at most, or until BATCHER_GATHER_BYTES (or half an
# entry's work) are queued: an entry that large spends most of its cost on its bytes, and a big
# request's producer sends the next one many milliseconds later. A Kafka producer keeps up to 5
# requests in flight on its connection; packed at once, whatever it sent during the last round took an
# entry, each a Raft round on every node. A lone request (nothing in flight) never waits. Measured
# (bench/README.md, "Ninth session"): one librdkafka producer of 16 KiB batches, 1.75 -> 3 requests
# an entry, -26 % CPU a record; 3 or 8 requests, 1 or 4 ms, or a stop after 0.5 ms without an arrival
# did less; two threads sending one record at a time: p99 +1.5-2 ms.
BATCHER_GATHER_REQUESTS = 4
BATCHER_GATHER_WAIT_S = 0.002
BATCHER_GATHER_BYTES = 256 * 1024
# Produce entries proposed but not yet committed; more requests queue up and share the next entry.
# One: with two, a producer's pipelined requests (broker/kafka/listener.py) mostly found a free slot
# and took an entry each (1.17 requests an entry); with one they share entries (1.75), and each
# entry costs every node a Raft round (bench/README.md, "Eighth session").
PROPOSALS_IN_FLIGHT_MAX = 1
ENTRY_OVERHEAD_BYTES = 64  # Envelope bytes outside the appends, a generous bound.

# broker/service.py
PRODUCE_STREAM_S_MAX = 600.0  # A ProduceStream ends after this (after an answer); the client opens another.
FETCH_STREAM_S_MAX = 600.0  # A stream ends after this; the client opens a new one from where it was.
# A waiting call is woken by the entries that concern it (broker/waiters.py) and ends at once when its
# client cancels. A group wait also re-reads this often unwoken, to notice what no entry announces
# (this node losing its leadership); a record wait, this much more rarely (a safety net only).
WAIT_RECHECK_S = 1.0
READER_RECHECK_S = 30.0
# HTTP/2 keepalive pings from the node on idle connections: a client that vanished (no FIN: a dead
# host, a partition) is noticed within KEEPALIVE_TIME_S + KEEPALIVE_TIMEOUT_S and its calls end,
# freeing their reader slots. A client that is there but reads nothing keeps its stream (and slot).
GRPC_KEEPALIVE_TIME_S = 60.0
GRPC_KEEPALIVE_TIMEOUT_S = 20.0
STREAM_MESSAGE_BYTES_MAX = 1024 * 1024  # A stream message's record bytes (the first batch may be larger).

# broker/service_base.py
CATCH_UP_WAIT_S = 2.0  # How long a metadata read waits for this node to apply the caller's index.
# A read waiting for this node's replica of another Raft group (another process) polls it this often.
REPLICA_CATCH_UP_POLL_S = 0.005

# broker/storage_guard.py: disk bounds (`--max-disk-bytes`, README "Disk bounds"). The bound is the LMDB
# map size, so the store can never grow past it; the leader refuses writes that grow the store
# (STORAGE_FULL) once less than the headroom is left, in the map or on the data directory's
# filesystem. The headroom holds what was accepted before the refusal and is still on its way to
# apply (PROPOSALS_IN_FLIGHT_MAX entries of ENTRY_BYTES_MAX, and the batcher's queue), the pages that
# deletes and trims need (LMDB copies every page it changes, even to free others), and group and
# producer writes, which are never refused.
MAX_DISK_BYTES_MIN = 64 * 1024 * 1024  # A smaller bound would be mostly headroom.
MAX_DISK_BYTES_MAX = 16 * 1024**4  # Address space: a store copy being sent or restored maps as much again.
DISK_HEADROOM_SHARE = 0.05  # Of the bound (Redpanda's storage_space_alert_free_threshold_percent is 5).
DISK_HEADROOM_BYTES_MIN = 16 * 1024 * 1024
DISK_HEADROOM_BYTES_MAX = 1024**3
# Once refusing, the leader takes writes again only when this much more than the headroom is free (one
# full entry), so a store at the edge does not take small writes while it refuses large ones.
DISK_RESUME_MARGIN_BYTES = ENTRY_BYTES_MAX
# How stale the leader's measure of its store may be: it is taken again on the first write after this
# (a read transaction and a statvfs, tens of microseconds), and what was accepted since counts against it.
DISK_CHECK_INTERVAL_S = 0.25
# A store write that fails (LMDB reports only EIO when a commit's pages find no room on the disk) while
# the data directory's filesystem has less than this free is reported as a full disk (raft/faults.py).
DISK_FULL_FREE_BYTES_MAX = 2 * ENTRY_BYTES_MAX

# broker/validation.py
FETCH_RECORDS_DEFAULT = 500
FETCH_BYTES_DEFAULT = 1024 * 1024

# raft/node.py
# A tick waits at most this long for socket events; a proposal wakes it at once (PySyncObj's pipe).
TICK_WAIT_S = 0.01
# Ticking on the serving loop (a node process), ticks follow events, and a timer ticks when the
# leader's next AppendEntries is due (heartbeat, commit notice), else after this long: elections
# (0.5-1 s), keepalives and timeouts need no finer clock. An idle node: 2.6 -> 1.3 % of a core.
LOOP_TICK_IDLE_S = 0.05
# A node's sys.setswitchinterval (Python's default: 5 ms). A thread that gave up the GIL for a system
# call (the Raft tick thread's sends, polls and loop wake-ups) waits at most this long to get it back
# from a busy one. Measured, 1 KiB `Producer`, three A/B pairs: 25,000 -> 28,500 msgs/s (medians).
GIL_SWITCH_INTERVAL_S = 0.001
# The leader tells followers an entry committed with the next entry or heartbeat, at most this late
# (raft/pysyncobj_adapter.py `commit_notice`), plus a tick: what an idle follower's readers wait at worst.
COMMIT_NOTICE_DELAY_S = 0.005
TICK_FAILED_PAUSE_S = 0.01  # After a tick raised (logged), as PySyncObj's own tick thread pauses.
# A follower whose connection to its leader closed (the leader's process died: its kernel closed the
# socket) stands for election after this delay, not after the election timeout (0.5-1 s), one slot
# later for each voter before it in line (raft/node.py `leader_lost_delay_s`: an order of its own in
# each group), plus up to the jitter, so the followers do not stand together (a split vote waits for
# the timeout): with delays drawn from 0.05-0.2 s instead, one pair of followers in five stood within
# 12 ms of each other, and one group failover in eight took over 0.85 s (2-core VM, chaos load).
LEADER_LOST_ELECTION_DELAY_S = 0.05
LEADER_LOST_ELECTION_SLOT_S = 0.1
LEADER_LOST_ELECTION_JITTER_S = 0.03
# A new group's voters stand for its first election in the same line once a majority is connected
# (raft/node.py `_first_election_line`), the line drawn for this election timeout (kq-node's default
# minimum) and stretched in proportion to a node's own: a node given a longer timeout (a test's
# patient follower) stays that much more patient.
FIRST_ELECTION_LINE_TIMEOUT_S = 0.5
# A leader answers a vote request from a node that is not one of its voters (a removed node still
# running) with NOT_A_VOTER only when its voters are committed: no MEMBERSHIP entry after its commit
# index. It reads at most this many uncommitted entries to know; a longer tail: no answer this time
# (the node asks again at its next election). raft/node.py, DESIGN.md "A removed node".
REMOVED_NOTICE_SCAN_ENTRIES_MAX = 1_000
TRANSPORT_BUFFER_BYTES = 4 * 1024 * 1024  # Socket buffers (PySyncObj's 64 KiB default broke big entries).
# A journal record whose command is at most this long is written in one call, its header joined to
# it (raft/journal.py `add`): the copy costs less than a second system call; a longer one is written
# in two, so that its megabytes are not copied.
JOURNAL_JOINED_WRITE_BYTES_MAX = 16 * 1024
# The commands a Raft journal holds in memory, the newest entries' (raft/journal.py): older ones are
# read back from its file when asked for (a lagging follower's catch-up, a compaction), so a group's
# log costs this much RAM, not its compaction threshold's 128 MiB, and the heap reuses what an entry
# freed instead of faulting in fresh pages for each new one (~2 µs a page on the VM). At least
# ENTRY_CALLS_BYTES_MAX and a few of the largest entries: the entries between proposal and apply
# stay held (apply takes their calls by identity).
JOURNAL_HELD_BYTES_MAX = 16 * 1024 * 1024
# What a Raft journal reads of its file at once when it opens (its records checked a window at a
# time) or compacts (the retained records copied to the new file a window at a time): opening or
# compacting a log of its compaction threshold's 128 MiB costs this and JOURNAL_HELD_BYTES_MAX of
# RAM, not the file's size twice over. A window always holds at least one whole record.
JOURNAL_READ_BYTES = 4 * 1024 * 1024
# Journal files a compaction replaced whose descriptors wait for `kq-journal-closer` (raft/journal.py
# `Disk.retire`): closing the last descriptor of a replaced 128 MiB journal frees its pages, which
# waits for their writeback (up to ~140 ms alone on the VM, ~60 ms on average in a node under a 1 KiB
# producer) and so stalled the serving loop at every compaction. Past this many waiting, the tick
# thread closes the file itself.
JOURNAL_RETIRED_FILES_MAX = 4
COMMANDS_QUEUE_MAX = 10_000  # Proposals waiting for the tick thread; beyond it QUEUE_FULL.
# PySyncObj drops a peer connection idle for connectionTimeout at its next use. Followers never talk
# to each other while a leader lives, so the first vote request after the leader dies was lost and
# most elections needed a second round (measured: 11 of 12). A small message of a type PySyncObj
# ignores keeps every connection warm.
KEEPALIVE_PERIOD_S = 0.4
# A connected follower that lags behind the compaction point keeps the entries it still needs, up to
# these bounds (beyond them it is sent a copy of the store instead), so compaction does not turn
# every short lag into a full copy. At most half the compaction trigger's entries are kept, so
# the log left after compacting never re-triggers compaction by itself.
# A leader's AppendEntries round (raft/pysyncobj_adapter.py, the round override) sends each
# peer one message (or the store-copy chunks the send rate allows): a peer still behind gets the next
# round within CATCH_UP_ROUND_S, unless this many bytes wait in its transport queue already. One
# message holds at most RAFT_ENTRIES_PER_ROUND_MAX entries and PySyncObj's batch of bytes; to a
# follower that lacks committed entries (it is catching up), at most CATCH_UP_BYTES_PER_ROUND (or
# one entry) and CATCH_UP_ENTRIES_PER_ROUND: sending a megabyte takes the tick thread ~2.5 ms on
# loopback (2-core VM), and an entry no longer in ENTRY_CALLS ~7 us to encode (one message of 4,096
# held it 40 ms), which every acknowledgement waiting behind it pays.
CATCH_UP_ROUND_S = 0.005
CATCH_UP_QUEUED_BYTES_MAX = TRANSPORT_BUFFER_BYTES
CATCH_UP_BYTES_PER_ROUND = 256 * 1024
CATCH_UP_ENTRIES_PER_ROUND = 128
RAFT_ENTRIES_PER_ROUND_MAX = 4096
COMPACTION_RETAIN_SHARE = 0.5
COMPACTION_RETAIN_BYTES_MAX = 32 * 1024 * 1024
BIND_RETRY_S = 0.1  # A Raft port still held (a node restarted at once) is tried again this often,
BIND_ATTEMPTS_MAX = 50  # this many times; then the node refuses to start.

# raft/transport.py and raft/wire.py: the Raft transport between nodes (DESIGN.md, "Raft transport").
# A frame holds one message: PySyncObj packs entries into an append until they reach its batch
# (TRANSPORT_BUFFER_BYTES), so the largest is just under that plus one more entry of ENTRY_BYTES_MAX.
RAFT_FRAME_OVERHEAD_BYTES = 64 * 1024  # Terms, indexes and field tags around the entries.
RAFT_FRAME_BYTES_MAX = TRANSPORT_BUFFER_BYTES + ENTRY_BYTES_MAX + RAFT_FRAME_OVERHEAD_BYTES
# Entries in one append: each entry's command is at least a byte, and PySyncObj's batch stops at
# TRANSPORT_BUFFER_BYTES of commands.
RAFT_ENTRIES_PER_MESSAGE_MAX = TRANSPORT_BUFFER_BYTES
RAFT_CHUNK_BYTES_MAX = TRANSPORT_BUFFER_BYTES // 4  # One chunk of a store copy (raft/snapshot.py).
RAFT_METHODS = 1  # kq's @replicated methods (`RaftNode._apply_entry`, PySyncObj's id 0); a test checks it.
RAFT_FAIL_REASON_MAX = 7  # PySyncObj's FAIL_REASON values are 0..7 (UNKNOWN_OUTCOME).
RAFT_NONCE_BYTES = 32  # The handshake's challenge, each way.
RAFT_HANDSHAKE_TIMEOUT_S = 5.0  # A connection not authenticated by then is closed.
RAFT_PENDING_CONNECTIONS_MAX = 64  # Incoming connections still in their handshake; more are closed at once.
# Bytes queued for one peer that its socket has not taken: beyond it the connection is dropped (the
# peer reconnects and the leader resends), so a stuck peer cannot grow the leader's memory.
RAFT_SEND_BUFFER_BYTES_MAX = 128 * 1024 * 1024
RAFT_RECEIVE_BYTES = 256 * 1024  # One recv() call's bytes.
RAFT_RECEIVE_LARGE_BYTES_MIN = 64 * 1024  # A frame this large is received straight into its own buffer.
# An AppendEntries whose regular entries each carry an argument this large is parsed split (raft/wire.py
# `_split_parsed`): the arguments stay views of the received frame until each is joined into its
# command, once; a frame with a smaller one is parsed whole by protobuf (for many small entries the
# split's Python costs more than the copies it saves). At least pysyncobj_adapter's
# `_JOIN_ARGUMENT_BYTES_MIN`, so that every argument split out is joined, never pickled.
RAFT_SPLIT_ARGUMENT_BYTES_MIN = 64 * 1024
# A received Raft frame up to this size is measured for the canonical check by encoding it whole
# (raft/wire.py `_whole_parsed`: its arguments' copies are cheaper than taking them out and adding
# their sizes back); a larger one's arguments are taken out first.
RAFT_WHOLE_MEASURE_BYTES_MAX = 16 * 1024
RAFT_SEND_BYTES = 256 * 1024  # One send() call's bytes.
RAFT_SEND_PIECES_MAX = 64  # Pieces of queued frames one sendmsg() call takes (the kernel allows 1,024).
RAFT_SEND_PIECE_BYTES_MIN = 4 * 1024  # A frame's piece this large is sent from where it is, not joined.
# A frame before the handshake completed (Hello, Proof: an address, a nonce, a MAC): an unauthenticated
# peer cannot make the node buffer more than this per connection.
RAFT_HANDSHAKE_FRAME_BYTES_MAX = 1024
RAFT_BAD_PEER_LOG_S = 10.0  # One log line per reason this often, for refused connections and frames.

# raft/pysyncobj_adapter.py
ENTRY_COMMAND_OVERHEAD_BYTES = 64  # An entry command's bytes beyond its argument (a generous bound).

# raft/snapshot.py
COPY_CHUNK_BYTES = 1024 * 1024  # The copy thread's reads of LMDB's copy.
COPY_SEND_CHUNK_BYTES = 256 * 1024  # One chunk sent to a follower (CATCH_UP_BYTES_PER_ROUND's reason).
HEADER_BYTES_MAX = 16 * 1024 * 1024
TRANSMISSION_TIMEOUT_S = 600.0  # A transmission not finished by then is dropped; compaction resumes.
COPY_RETRY_S = 5.0  # After a failed copy (disk full?), the next one starts no sooner than this.
# Sending a store copy to a follower: at most COPY_SEND_BYTES_PER_S (a burst of two chunks), so the
# leader's tick thread, which sends it, never spends a tick on a whole copy (PySyncObj sends every
# chunk it is given in one loop: a 290 MB copy held acknowledgements 1.5 s), and the copy's CPU on the
# leader and the follower (~2.5 ms a megabyte each on loopback) leaves room for acknowledgements:
# with 300 MB sent, the p99 of one record in flight was 2.05x its p99 without a copy at 64 MiB/s,
# 1.82-2.05x at 32 MiB/s (5 runs), 1.67-1.74x at 20 MiB/s (3 runs) (`python -m kq.bench.store_copy`,
# 2-core VM, bench/README.md). 300 MB take ~15 s.
# After a follower got a whole copy it is sent no other for COPY_RESTORE_WAIT_S unless it disconnects
# or catches up past it: it is restoring that one (a 290 MB copy was once started twice, 4 s apart).
COPY_SEND_BYTES_PER_S = 20 * 1024 * 1024
COPY_RESTORE_WAIT_S = 60.0

# The Kafka listener (broker/kafka/).
KAFKA_FRAME_BYTES_DEFAULT = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes; --kafka-frame-bytes-max.
KAFKA_FRAME_BYTES_MIN = 64 * 1024
# The most elements one array of a Kafka request may declare (broker/kafka/array_bounds.py): kio's
# native reader reserves room for a declared length before reading, and a hostile one aborted the
# node. Kafka's largest real arrays (a Fetch's or ListOffsets' partitions) are far below.
KAFKA_ARRAY_ELEMENTS_MAX = 1_000_000
# kio's request and response classes found by (API key, version), kept: the served versions of every
# API (the handler looks one up only for a version it serves), with room to spare.
KAFKA_SCHEMAS_KEPT = 1024
# A Kafka connection's receive buffer (broker/kafka/listener.py FrameStream): a request frame up to
# this size is read out of it; a larger one into a buffer of its own size. Held while bytes are in
# it (a connection waiting for its next request has none).
KAFKA_RECEIVE_BUFFER_BYTES = 16 * 1024
KAFKA_CONNECTIONS_MAX = 10_000  # Open Kafka client connections per node; one more is closed at once.
KAFKA_IDLE_CONNECTION_S = 600.0  # Kafka's connections.max.idle.ms: a silent connection is closed.
KAFKA_PARTITIONS_PER_REQUEST_MAX = 10_000  # Partitions named in one Produce, Fetch or ListOffsets.
# Partitions one DescribeTopicPartitions answer lists (Kafka's max.request.partition.size.limit): a
# client asking for more gets this many and a cursor to the rest.
KAFKA_DESCRIBE_PARTITIONS_MAX = 2_000
# Rows of the timestamps index one MAX_TIMESTAMP answer reads, skipping batches a trim left below the log
# start (a trim deletes at most TRIM_BATCHES_PER_ENTRY_MAX); past it, -1/-1 until retention deletes them.
KAFKA_MAX_TIMESTAMP_ROWS_MAX = TRIM_BATCHES_PER_ENTRY_MAX
KAFKA_FETCH_WATCHED_PARTITIONS_MAX = 64  # A long-poll over more partitions wakes on every append.
KAFKA_LAG_CHECK_TOPICS_MAX = 16  # Topics of one Fetch a lagging follower asks the leader about (KIP-392).
RACK_NAME_LENGTH_MAX = 64  # A node's --rack (Kafka's broker.rack): letters, digits, '.', '_', '-'.
KAFKA_DEFAULT_PARTITIONS = 1  # Kafka's num.partitions: auto-created topics; --default-partitions.
KAFKA_UNACKNOWLEDGED_APPENDS_MAX = 10_000  # acks=0 appends in progress per node; more are dropped.
# A connection's Produce requests handed to the batcher and waiting for their commit while the listener
# reads the next (broker/kafka/listener.py, "pipelined"), and the request bytes they may hold: past
# either, the next frame is read once the oldest is answered. Kafka's producers keep 5 in flight.
KAFKA_PIPELINED_PRODUCES_MAX = 8
KAFKA_PIPELINED_BYTES_MAX = 4 * 1024 * 1024
# SASL on the Kafka listener (`--kafka-sasl`, broker/kafka/sasl.py). Before a connection authenticates
# it may send only ApiVersions and the SASL APIs, in frames of at most this many bytes (Kafka's
# sasl.server.max.receive.size is 512 KiB; a SASL exchange needs a few hundred bytes), and it must
# authenticate within KAFKA_AUTHENTICATION_S of connecting, so that unauthenticated connections hold
# neither memory nor connection slots for long.
KAFKA_UNAUTHENTICATED_FRAME_BYTES_MAX = 64 * 1024
KAFKA_AUTHENTICATION_S = 30.0
KAFKA_SASL_TOKEN_BYTES_MAX = 8 * 1024  # One SaslAuthenticate token (SCRAM's and PLAIN's are ~100-400 bytes).
KAFKA_SASL_ROUNDS_MAX = 4  # SaslAuthenticate requests per connection: SCRAM takes 2, PLAIN 1.

# Kafka consumer groups (broker/kafka/groups.py, raft/kafka_groups.py): checked by the shared validation.
GROUP_INSTANCE_ID_LENGTH_MAX = 249  # Kafka's limit; the characters of a topic name (Kafka's rule too).
CLIENT_HOST_LENGTH_MAX = 255
PROTOCOL_TYPE_LENGTH_MAX = 255  # "consumer", "connect", ...
PROTOCOL_NAME_LENGTH_MAX = 255  # "range", "cooperative-sticky", ...
GROUP_PROTOCOLS_MAX = 16  # Protocols one member offers in a JoinGroup.
MEMBER_METADATA_BYTES_MAX = 64 * 1024  # All of a member's protocol metadata (its subscription).
MEMBER_ASSIGNMENT_BYTES_MAX = 256 * 1024  # One member's assignment bytes in a SyncGroup.
KAFKA_PENDING_MEMBERS_MAX = 10_000  # Member ids handed out with MEMBER_ID_REQUIRED, not yet joined.
KAFKA_PENDING_MEMBER_S = 300.0  # A handed-out member id not used within this is forgotten.
KAFKA_JOIN_GRACE_S = 2.0  # A JoinGroup waits its rebalance timeout plus this (the expiry's tick).
KAFKA_GROUP_WAIT_S_MAX = 600.0  # No JoinGroup or SyncGroup waits longer, whatever the client asks.

# Scale-out: Raft groups and their leaders (raft/placement.py, broker/leader_balance.py).
# Data groups of one cluster: each is a PySyncObj instance on each of its replicas (a tick thread, a
# journal, an LMDB environment and a Raft port per replica), so a node holds at most this many.
RAFT_GROUPS_MAX = 1_024
# Leadership transfers one node starts in one balancing round: each is a short election of its group
# (writes to it pause for about a round trip), so a round moves a few and waits for the result.
LEADER_MOVES_PER_ROUND = 4
LEADER_BALANCE_PERIOD_S = 1.0  # How often a node compares the groups' leaders.
# The leaders a node sees must stay unbalanced and unchanged this long before it moves one: an
# election in progress, or a node that just came back and is still catching up, is left alone.
LEADER_BALANCE_SETTLE_S = 3.0
LEADER_MOVE_COOLDOWN_S = 5.0  # After a round that moved leaders, the next waits at least this long.
# A topic id a command carries (a group's copy of a metadata group's topic): stored as u64, kept
# where the next id (one more) still fits.
TOPIC_ID_MAX = 2**63 - 1
# broker/topic_sync.py: a group's leader compares its copy of the topics with group 0's this often,
# and proposes at most this many changes a round (the rest next round).
TOPIC_SYNC_PERIOD_S = 0.5
TOPIC_SYNC_CHANGES_MAX = 100
# CreateTopic answers once this node's replica of every group holds the topic, or after this long.
TOPIC_COPY_WAIT_S = 5.0
TOPIC_COPY_POLL_S = 0.02
# A new topic spreads over every group once each has a leader; CreateTopic waits this long for them.
TOPIC_SPREAD_WAIT_S = 5.0
LEADER_BOARD_TTL_S = 0.2  # A worker reads its siblings' published group leaders at most this often.
# Worker processes of one node (`--processes`, broker/workers.py): one Raft group each.
PROCESSES_MAX = 64
# `--processes auto` on a new data directory: the usable cores, at most this many (each worker is a
# process of its own, ~90 MiB and a port of each kind); a bigger machine names its count.
PROCESSES_AUTO_MAX = 8
# Kafka broker id of a node's worker of group g: node id + g x this (node ids stay below it).
BROKER_ID_GROUP_STRIDE = 1_000
WORKER_POLL_S = 0.2  # How often a node's supervisor looks for a worker that ended.
# A worker given SIGTERM stops within this (its front's grace, then Raft and the store), else SIGKILL.
WORKER_STOP_S = 10.0

# Kafka transactions (raft/transactions.py, broker/transactions.py) ------------------------------------
TRANSACTIONAL_IDS_MAX = 10_000  # Transactional ids the cluster keeps (one open transaction each).
# Kafka's transactional.id.expiration.ms (name and default: 7 days): an id with no transaction in
# progress, unchanged this long, is forgotten (group 0's leader proposes it: broker/producer_expiry.py),
# so ids that came and went do not hold TRANSACTIONAL_IDS_MAX forever.
TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT = 604_800_000
TXN_ID_EXPIRY_ROWS_PER_ENTRY_MAX = 1_000  # Transactional ids one id expiry entry looks at in apply.
TRANSACTIONAL_ID_BYTES_MAX = 255  # A transactional id's UTF-8 bytes (Kafka has none; kq keys rows by it).
TXN_PARTITIONS_MAX = 1_000  # Partitions in one transaction (each gets a marker).
TXN_GROUPS_MAX = 16  # Consumer groups one transaction commits offsets for (AddOffsetsToTxn).
TXN_PENDING_OFFSETS_MAX = 10_000  # Offsets one transaction holds for its groups until its marker.
TXN_TIMEOUT_MS_MIN = 1_000
TXN_TIMEOUT_MS_MAX = 900_000  # Kafka's transaction.max.timeout.ms default (15 minutes).
TXN_OPEN_PER_PARTITION_MAX = 10_000  # Open transactions read for a partition's LSO.
TXN_ABORTED_PER_FETCH_MAX = 1_000  # Aborted-transaction rows a read_committed fetch of a partition looks at.
COMPACTION_ABORTED_ROWS_MAX = 10_000  # Aborted transactions one compaction pass of a partition reads.
TXN_LIST_MAX = 10_000  # Transactions one ListTransactions (or DescribeTransactions) answer holds.
DESCRIBED_PRODUCERS_MAX = 1_000  # Producers one DescribeProducers answer lists for a partition.
TXN_DRIVER_PERIOD_S = 0.2  # How often the coordinator completes decided transactions and aborts expired ones.
TXN_FINISH_LOCKS = 64  # Locks (by the id's hash) that let one finisher at a time write an id's markers.
TXN_MARKER_TIMEOUT_S = 10.0  # One WriteTxnMarkers call to a group's leader.
MARKER_CHANNELS_MAX = 1_024  # gRPC channels the coordinator keeps to groups' leaders (then all closed).
TXN_END_WAIT_S = 5.0  # EndTxn waits this long for its markers before answering (the outcome is decided).
# A partition's leader aborts a transaction open there longer than this (a producer whose coordinator
# never added the partition, or lost: Kafka's "hanging transaction"), so its last stable offset moves on.
TXN_HANGING_ABORT_MS = 2 * TXN_TIMEOUT_MS_MAX
TXN_HANGING_CHECK_S = 60.0  # How often a group's leader looks for such transactions.
TXN_HANGING_ROWS_MAX = 10_000  # Open transactions one such look reads.

# Kafka's consumer-group protocol (KIP-848: broker/kafka/consumer_groups.py, raft/consumer_groups.py).
# Kafka's group.consumer.heartbeat.interval.ms and group.consumer.session.timeout.ms (its defaults, and
# those of `--group-consumer-heartbeat-interval-ms` and `--group-consumer-session-timeout-ms`): the
# interval every ConsumerGroupHeartbeat answer gives, and the silence after which the leader's
# coordinator expires a member (the group's setting: the protocol lets no member choose its own). The
# interval is at least CONSUMER_HEARTBEAT_INTERVAL_MS_MIN and below the session timeout, which is within
# SESSION_TIMEOUT_MS_MIN .. SESSION_TIMEOUT_MS_MAX (apply's bounds on a member's).
CONSUMER_HEARTBEAT_INTERVAL_MS = 5_000
CONSUMER_HEARTBEAT_INTERVAL_MS_MIN = 100
CONSUMER_SESSION_TIMEOUT_MS = 45_000
CONSUMER_GROUP_MEMBERS_MAX = GROUP_MEMBERS_MAX  # Kafka's group.consumer.max.size.
# A member subscribes to at most SUBSCRIBED_TOPICS_MAX topics by name (or one pattern); the target
# assignment costs apply members x subscribed partitions (at most ASSIGNMENT_WORK_MAX). One heartbeat
# names at most this many owned partitions (and a ConsumerGroupDescribe answers at most this many per
# member).
CONSUMER_OWNED_PARTITIONS_MAX = 10_000
RACK_ID_LENGTH_MAX = 255  # A consumer's client.rack.
CONSUMER_ASSIGNORS = ("uniform", "range")  # Kafka's group.consumer.assignors; the first is the default.
