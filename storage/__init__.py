"""storage: one LMDB environment per node holding everything the replicated state machine owns.

Named databases and their key/value layout (integers big-endian, so LMDB's byte order is numeric):

    meta        key: ASCII name
                  b"applied_index"     -> u64  Raft index of the last entry applied (0: none)
                  b"next_topic_id"     -> u64  topic ids are never reused, so a recreated topic is new
                  b"next_producer_id"  -> u64  idempotent producer ids, allocated from 1
                  b"rejected_entries"  -> u64  committed entries apply refused as a whole (a bug's trace)
                  b"layout"            -> u64  this layout's version, 2 (none: 1, upgraded at open;
                                               newer than LAYOUT_VERSION: refused at open, untouched)
                  b"producer_sweep"    -> a `producers` key: where the next producer expiry entry
                                          starts (none: at the first row); deleted at the table's end
                  b"txn_id_sweep"      -> a `transactions` key: the same for transactional id expiry
                  b"coordinator_epoch" -> u64  the newest transaction coordinator epoch (group 0's
                                               term) a marker applied in this group named (none: 0)
    topics      key: topic name (UTF-8, <= 249 bytes)
                value: topic_id u64 | partitions u32 | created_ms i64                      (20 bytes)
    partitions  key: topic_id u64 | partition u32                                           (12 bytes)
                value: log_start_offset u64 | log_end_offset u64 | size_bytes u64           (24 bytes)
    records     key: topic_id u64 | partition u32 | base_offset u64                         (20 bytes)
                value: one appended batch: Kafka's RecordBatch v2 exactly as the producer sent it,
                       its baseOffset (bytes 0-7) stamped to the key's base_offset and (appended by an
                       entry with a leader epoch) its partitionLeaderEpoch (bytes 12-15) to that epoch,
                       neither under its CRC, nothing added;
                       it carries its record count and its own CRC32C, verified on every read
                       (storage/records.py; the whole layout in proto/records.py). The batch holds
                       offsets base_offset .. base_offset + lastOffsetDelta. Only its first
                       `piece_bytes` (one LMDB page minus the 16-byte overflow page header: 4,080 on
                       4 KiB pages) are here, its header among them; the rest are in `record_pieces`
    record_pieces
                key: topic_id u64 | partition u32 | base_offset u64 | piece u32 (from 1)    (24 bytes)
                value: the batch's bytes after its first piece, `piece_bytes` a piece (the last one
                       shorter): the whole batch is its `records` value then its pieces in order,
                       12 + batchLength bytes in all. Why: LMDB keeps a value longer than half a page
                       on a run of contiguous overflow pages and extends the file when its free list
                       has no run that long; batches of mixed sizes, stored whole, made a node's file
                       keep growing under retention. One-page pieces fit any page a trim frees
                       (bench/lmdb_growth.py). A store written before pieces holds batches whole in
                       `records`; reads and deletes take both
    producers   key: topic_id u64 | partition u32 | producer_id u64                         (20 bytes)
                value: epoch u16 | count u8, then `count` x
                       (first_sequence u32 | record_count u32 | base_offset u64),
                       then last_append_ms i64                               (3 + 16 x count + 8 bytes)
                       the producer's epoch on that partition and its last PRODUCER_APPENDS_KEPT
                       appends there, oldest first; a higher epoch starts a new list (a transaction
                       marker of a new epoch: an empty one). last_append_ms: the leader clock of the
                       entry of its last append or marker there; producer id expiry deletes the row
                       once it is producer.id.expiration.ms old and the producer holds no open
                       transaction there (`txn_open`). The row's version is its length: a row of a kq
                       from before the time (3 + 16 x count bytes) reads as unstamped and is upgraded
                       in place by the first expiry sweep that meets it, which stamps it with that
                       entry's clock (so it never expires at once after an upgrade); the next append
                       rewrites it too. A kq from before reads a stamped row alike (it reads `count`
                       appends and no further), so the store's layout stays 2
    groups      key: group name (UTF-8)
                value: the group's state, serialized by raft/ (a `GroupState` protobuf, deterministic)
    offsets     key: name_length u16 | group name | topic_id u64 | partition u32
                value: committed_offset u64 | commit_time_ms i64                              (16 bytes)
    offset_topics
                key: topic_id u64 | partition u32 | name_length u16 | group name
                value: empty
                       one row per `offsets` row, its key's tail moved to the front: a topic's
                       committed offsets, found without reading every group's
    topic_configs
                key: topic_id u64                                                           (8 bytes)
                value: the topic's config overrides, a `TopicConfigs` protobuf, entries sorted by name
                       (raft/topic_config.py); no row: no override
    topic_groups
                key: topic_id u64                                                           (8 bytes)
                value: groups u16: the Raft groups the topic's partitions are spread over, fixed at
                       its creation (raft/placement.py); no row: 1, every partition in group 0 (a
                       topic created while the cluster had one group keeps its data where it is)
    timestamps  key: topic_id u64 | partition u32 | (2**63 - 1 - maxTimestamp) u64 | base_offset u64
                value: empty                                                          (28 + 0 bytes)
                       one row per stored batch whose header's maxTimestamp is not -1, written and
                       deleted with the batch (append, trim, topic deletion): a partition's first row
                       is its batch with the largest maxTimestamp, the earliest of those sharing it,
                       found in one seek (ListOffsets MAX_TIMESTAMP; rows of batches a bounded trim
                       left below the log start are skipped). A store written before the index
                       existed gets it built at open, from the batches alone

    leader_epochs
                key: topic_id u64 | partition u32 | leader_epoch u32                        (16 bytes)
                value: start_offset u64                                                       (8 bytes)
                       Kafka's leader-epoch cache (KIP-101): a row for each epoch (the proposing
                       leader's Raft term, raft/epochs.py) in which a batch was appended to the
                       partition, at that batch's base offset. Only rises are written, at most
                       LEADER_EPOCHS_PER_PARTITION_MAX (the oldest goes); a trim deletes the rows wholly
                       below the log start, and a topic's go with its purge. A store written before
                       leader epochs has none: its batches keep the partitionLeaderEpoch their producer
                       sent (-1), and its partitions answer OffsetForLeaderEpoch from the log end

    purges      key: topic_id u64                                                           (8 bytes)
                value: empty
                       a deleted topic whose rows are not all deleted yet (batches, producer state,
                       committed offsets: each a range that starts with the topic id): deleting a
                       topic (and each purge after it) deletes a bounded number of them; the row
                       goes with the last one
    transactions
                key: transactional id (UTF-8)
                value: the id's state, serialized by raft/ (a `TransactionState` protobuf,
                       deterministic): producer id and epoch, state, timeout, partitions and groups
                       (the coordinator's group: group 0, as consumer groups)
    offset_metadata
                key: an `offsets` key: name_length u16 | group name | topic_id u64 | partition u32
                value: leader_epoch i32 | metadata (UTF-8)          (4 + up to 4,096 bytes)
                       Kafka's metadata string and leader epoch of a committed offset, written and
                       deleted with its `offsets` row; a commit without them has no row (-1, "")
    txn_offsets key: producer_id u64 | name_length u16 | group name | topic_id u64 | partition u32
                value: offset u64 | commit_time_ms i64 | leader_epoch i32 | metadata (UTF-8)
                       an offset a transaction committed (TxnOffsetCommit), moved to `offsets` by
                       its COMMIT marker and dropped by its ABORT marker
    txn_open    key: topic_id u64 | partition u32 | producer_id u64                         (20 bytes)
                value: first_offset u64 | opened_ms i64 | producer_epoch u16                (18 bytes)
                       a transaction with records in the partition and no marker there yet: the
                       partition's last stable offset is the smallest first_offset (none: its end)
    txn_aborted key: topic_id u64 | partition u32 | last_offset u64 | producer_id u64       (28 bytes)
                value: first_offset u64                                                      (8 bytes)
                       an aborted transaction's records in the partition, first_offset to its ABORT
                       marker at last_offset (a read_committed Fetch answers them); deleted once
                       the log start passes the marker

Layout 1 (before `layout` existed) keyed `producers` producer first and had no `offset_topics`:
opening such a store, or receiving a copy of one, re-keys the one and builds the other (storage/store.py
`_upgrade`), a pure function of the rows, so replicas that upgrade stay equal. A store whose `layout`
is newer than this kq's LAYOUT_VERSION is refused at open (StoreFormatError, one line) before
anything is written to it (DESIGN.md, "On-disk formats and versions").

Every write goes through one LMDB write transaction per applied Raft entry, which also stores the
entry's index in `applied_index`: state and index move together or not at all.
"""

from kq.storage.errors import CorruptRecordError, FormatError, SnapshotError, StorageError, StoreFormatError
from kq.storage.records import StoredBatch
from kq.storage.store import (
    BatchSpan,
    PartitionState,
    ProducerAppend,
    ProducerSweep,
    ProducerWindow,
    Store,
    StoreReader,
    StoreWriter,
    TopicMeta,
)
from kq.storage.usage import StoreUsage

__all__ = [
    "BatchSpan",
    "CorruptRecordError",
    "FormatError",
    "PartitionState",
    "ProducerAppend",
    "ProducerSweep",
    "ProducerWindow",
    "SnapshotError",
    "StorageError",
    "Store",
    "StoreFormatError",
    "StoreReader",
    "StoreUsage",
    "StoreWriter",
    "StoredBatch",
    "TopicMeta",
]
