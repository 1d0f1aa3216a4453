"""The LMDB environment of one node and typed transactions over it (layout: storage/__init__.py)."""

from __future__ import annotations

import functools
import itertools
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import lmdb

from kq.storage.errors import CorruptRecordError, StorageError, StoreFormatError
from kq.storage.offset_details import (
    NO_OFFSET_DETAILS,
    OffsetDetails,
    decode_offset_details,
    encode_offset_details,
)
from kq.storage.records import (
    HEADER_BYTES,
    StoredBatch,
    decode_batch,
    max_timestamp_of,
    offset_span_of,
    record_count_of,
    stamp_base_offset,
    stored_length_of,
)
from kq.storage.transactions import TRANSACTION_TABLES, TransactionReads, TransactionWrites
from kq.storage.usage import StoreUsage, measure

MAP_SIZE_BYTES_DEFAULT = 64 * 1024**3  # Address space only: LMDB files grow as data arrives.
MAX_DATABASES = 40  # The named databases below, with room to add some.
LEADER_EPOCHS_PER_PARTITION_MAX = 1_000  # `leader_epochs` rows a partition keeps: the newest.
MAX_READERS = 512  # gRPC worker threads and long-polls each hold a reader slot while they read.
PRODUCER_APPENDS_KEPT = 5  # Like Kafka: a retry of any of the last five appends is recognized.
# LMDB's header on each overflow page (PAGEHDRSZ on 64-bit builds): a stored piece of a batch is at most
# one page minus this, so it fills exactly one overflow page (storage/__init__.py, `record_pieces`).
OVERFLOW_PAGE_HEADER_BYTES = 16

_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
_TOPIC = struct.Struct(">QIq")
_PARTITION_KEY = struct.Struct(">QI")
_PARTITION_STATE = struct.Struct(">QQQ")
_RECORD_KEY = struct.Struct(">QIQ")
_NO_RECORD_LIMIT = 1 << 62  # `batches` without `max_records`: only the byte limit ends a read.
_PIECE_INDEX = struct.Struct(">I")  # After a _RECORD_KEY: a `record_pieces` key.
# The key suffixes of pieces 1 to 1,024, packed once: a 1 MB batch is ~250 pieces of a 4 KiB page.
_PIECE_SUFFIXES = tuple(_PIECE_INDEX.pack(index) for index in range(1, 1025))
_TIMESTAMP_KEY = struct.Struct(">QIQQ")  # topic_id, partition, INT64_MAX - maxTimestamp, base_offset
_INT64_MAX = 2**63 - 1
_PRODUCER_KEY = struct.Struct(">QIQ")  # topic_id, partition, producer_id: a topic's rows are one range.
_OLD_PRODUCER_KEY = struct.Struct(">QQI")  # producer_id, topic_id, partition: layout 1.
_PRODUCER_EPOCH = struct.Struct(">HB")  # epoch, count of the appends that follow
_PRODUCER_APPEND = struct.Struct(">IIQ")  # first sequence, record count, base offset
_PRODUCER_STAMP = struct.Struct(">q")  # last_append_ms: after the appends (a row without it: unstamped)

_LEADER_EPOCH_KEY = struct.Struct(">QII")  # topic_id, partition, leader epoch
_EPOCH_MAX = 2**32 - 1


def _producer_row_layout(count: int) -> struct.Struct:
    """A whole stamped `producers` row of `count` appends: the three producer layouts back to back."""
    return struct.Struct(">HB" + "IIQ" * count + "q")


_PRODUCER_ROWS = tuple(_producer_row_layout(count) for count in range(PRODUCER_APPENDS_KEPT + 1))

_APPLIED_INDEX = b"applied_index"
_NEXT_TOPIC_ID = b"next_topic_id"
_NEXT_PRODUCER_ID = b"next_producer_id"
_REJECTED_ENTRIES = b"rejected_entries"
_LAYOUT = b"layout"
_CLUSTER_ID = b"cluster_id"
_PRODUCER_SWEEP = b"producer_sweep"  # The `producers` key the next expiry entry starts at (none: the first).
_TXN_ID_SWEEP = b"txn_id_sweep"  # The `transactions` key the next id expiry entry starts at (none: first).
_COORDINATOR_EPOCH = b"coordinator_epoch"  # The newest transaction coordinator's epoch a marker named.
LAYOUT_VERSION = 2  # 2: producers keyed topic first, offset_topics; a store without the row is 1.
DATABASE_NAMES = (
    b"meta",
    b"topics",
    b"partitions",
    b"records",
    b"producers",
    b"groups",
    b"offsets",
    b"topic_configs",
    b"timestamps",
    b"purges",
    b"record_pieces",
    b"offset_topics",
    b"members",
    b"users",
    b"tokens",
    b"acls",
    b"topic_groups",
    *TRANSACTION_TABLES,
    b"offset_metadata",
    b"leader_epochs",
)
SECURITY_TABLES = (b"users", b"tokens", b"acls")  # raft/auth.py's rows: name, token id, encoded Acl -> value.
_GROUP_NAME_LENGTH = struct.Struct(">H")
_OFFSET_TAIL = struct.Struct(">QI")  # topic_id, partition
_COMMITTED = struct.Struct(">Qq")  # offset, commit time


class TopicMeta(NamedTuple):
    """A topic's metadata row.

    This, `PartitionState`, `ProducerAppend` and `ProducerWindow` are NamedTuples, not frozen
    dataclasses: apply reads each for every produce request, and a frozen dataclass's constructor
    costs three times a tuple's (~0.2 µs a field)."""

    name: str
    topic_id: int
    partitions: int
    created_ms: int
    # The Raft groups its partitions are spread over (raft/placement.py), fixed at its creation: 1 for
    # a topic created while the cluster had one group, whose partitions stay in group 0.
    groups: int = 1


class PartitionState(NamedTuple):
    """Where a partition log starts and ends; offsets in [log_start_offset, log_end_offset) exist
    (in a compacted partition, some of them are gaps: records compaction dropped)."""

    log_start_offset: int
    log_end_offset: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class BatchSpan:
    """Where a stored batch sits and what retention needs of it, read from its header alone."""

    base_offset: int
    offset_span: int  # lastOffsetDelta + 1: the offsets it holds, whether compaction dropped some or not.
    max_timestamp_ms: int
    size_bytes: int

    @property
    def end_offset(self) -> int:
        """The offset after the batch's last offset."""
        return self.base_offset + self.offset_span


class ProducerAppend(NamedTuple):
    """One remembered append of an idempotent producer to one partition."""

    first_sequence: int  # A batch's baseSequence: a non-negative int32.
    record_count: int
    base_offset: int


class ProducerWindow(NamedTuple):
    """What one partition remembers of an idempotent producer: its epoch there and its last appends."""

    epoch: int
    appends: tuple[ProducerAppend, ...]  # Oldest first; at most PRODUCER_APPENDS_KEPT (none: fenced).
    # The leader clock of the producer's last append or marker here (producer.id.expiration.ms counts
    # from it); None: a row written before rows carried it, stamped by the next expiry sweep.
    last_append_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ProducerSweep:
    """What one producer-expiry entry did to the `producers` rows it looked at (identical everywhere)."""

    looked: int  # Rows looked at (at most the entry's bound).
    expired: int  # Rows deleted: idle for the expiration time and no open transaction there.
    stamped: int  # Rows without a time (written before rows carried one), given the entry's time.
    wrapped: bool  # The sweep reached the table's end: the next entry starts again at its first row.


class _Writing:
    """`Store.write()`: the write transaction, begun; a StoreWriter over it on entry; commits when the
    block ends normally, aborts if it raises (as LMDB's own transaction context does). A class rather
    than a generator context: every applied entry opens one, and the generator's frames cost ~2 µs."""

    __slots__ = ("_piece_bytes", "_tables", "_transaction")

    def __init__(self, transaction: Any, tables: dict[str, Any], piece_bytes: int) -> None:
        self._transaction = transaction
        self._tables = tables
        self._piece_bytes = piece_bytes

    def __enter__(self) -> StoreWriter:
        return StoreWriter(self._transaction, self._tables, self._piece_bytes)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: Any) -> None:
        if kind is None:
            self._transaction.commit()
        else:
            self._transaction.abort()


class _Reading:
    """`Store.read()`: a read transaction, begun; a StoreReader over it on entry; ended when the block
    ends (as `_Writing`: every produce request and fetch opens one)."""

    __slots__ = ("_tables", "_transaction")

    def __init__(self, transaction: Any, tables: dict[str, Any]) -> None:
        self._transaction = transaction
        self._tables = tables

    def __enter__(self) -> StoreReader:
        return StoreReader(self._transaction, self._tables)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: Any) -> None:
        self._transaction.abort()  # A read-only transaction: ending it is all LMDB's own exit does.


class Store:
    """One node's LMDB environment. Writes come only from `apply`; reads come from any thread."""

    def __init__(self, environment: Any, path: Path, map_size_bytes: int) -> None:
        self._environment = environment
        self.path = path
        self._map_size_bytes = map_size_bytes
        self._databases = {name: environment.open_db(name) for name in DATABASE_NAMES}
        self._tables = reader_tables(self._databases)
        self._piece_bytes = int(environment.stat()["psize"]) - OVERFLOW_PAGE_HEADER_BYTES

    @classmethod
    def open(
        cls,
        path: Path,
        map_size_bytes: int = MAP_SIZE_BYTES_DEFAULT,
        sync: bool = False,
        upgrade: bool = True,
    ) -> Store:
        """Opens (creating) the environment in directory `path`.

        `sync=False` skips the fsync at each commit: a commit still reaches the page cache, so it
        survives a killed process but not a power loss; replication is the durability (see DESIGN).
        After a power loss such an environment may be corrupt (LMDB's MDB_NOSYNC), so a node that
        lost power in `--durability=replicated` is wiped. `sync=True` (`--durability=fsync`) syncs
        each commit's data pages but not its meta page (MDB_NOMETASYNC): the store stays intact and
        a power loss may undo only the last commit, which the Raft journal replays; `sync()` makes
        that one durable too (before compaction drops its journal entries).

        `upgrade` brings a store written by an older kq to the current layout (and marks a new one
        with it); only a store copy's empty target skips it, as it takes the source's rows as they are.
        A store of a newer layout raises StoreFormatError before anything is written to it.
        """
        path.mkdir(parents=True, exist_ok=True)
        environment = _environment(
            path, map_size_bytes, sync=sync, metasync=False, writemap=False, map_async=False
        )
        try:
            check_layout(environment, path)  # Before anything is written: a newer store stays as it is.
        except StoreFormatError:
            environment.close()
            raise
        store = cls(environment, path, map_size_bytes)
        with environment.begin(write=False) as transaction:
            missing = _timestamp_index_missing(transaction, store._databases)
            old_layout = _layout_version(transaction, store._databases) < LAYOUT_VERSION
        if upgrade and (missing or old_layout):  # Written by an older kq (or new): brought up to date once.
            with environment.begin(write=True) as transaction:
                _upgrade(transaction, store._databases)
        return store

    @classmethod
    def open_reader(cls, path: Path, map_size_bytes: int) -> Store:
        """Opens an existing environment to read only, beside the process that writes it (LMDB's
        lock file coordinates them): another worker process of the node reading group 0's store
        (broker/topic_sync.py). Raises StorageError when there is none yet, StoreFormatError for a
        newer layout; never writes."""
        if not (path / "data.mdb").exists():
            raise StorageError(f"no store at {path} yet")
        environment = _environment(path, map_size_bytes, readonly=True)
        try:
            check_layout(environment, path)
            return cls(environment, path, map_size_bytes)
        except lmdb.Error as error:  # Its writer is still creating the databases.
            environment.close()
            raise StorageError(f"store at {path} not ready: {error}") from error
        except BaseException:
            environment.close()
            raise

    def map_size_bytes(self) -> int:
        """The address space reserved for the environment."""
        return self._map_size_bytes

    def usage(self) -> StoreUsage:
        """What the store holds of its map and of its disk (storage/usage.py); any thread."""
        return measure(self._environment, self._databases, self.path)

    def sync(self) -> None:
        """Flushes every commit (its meta page included) to disk."""
        self._environment.sync(True)

    def close(self) -> None:
        """Closes the environment; the store must not be used afterwards."""
        self._environment.close()

    def write(self) -> _Writing:
        """One write transaction (`with store.write() as writer:`): committed when the block ends
        normally, aborted if it raises."""
        return _Writing(self._environment.begin(write=True), self._tables, self._piece_bytes)

    def read(self) -> _Reading:
        """One consistent read-only view of the store (`with store.read() as reader:`)."""
        return _Reading(self._environment.begin(write=False, buffers=True), self._tables)

    def applied_index(self) -> int:
        """Raft index of the last applied entry, 0 for an empty store."""
        with self.read() as reader:
            return reader.applied_index()

    def begin_snapshot(self) -> Any:
        """Starts a read transaction that pins the current state for `copy_to` (possibly in a thread)."""
        return self._environment.begin(write=False)

    def applied_index_in(self, transaction: Any) -> int:
        """Applied index as seen by a transaction from `begin_snapshot`."""
        return StoreReader(transaction, self._tables).applied_index()

    def copy_to_fd(self, fd: int, transaction: Any) -> None:
        """Writes the state seen by `transaction` as a compacted LMDB file into `fd` (mdb_env_copyfd:
        C code that holds no GIL, so the node's other threads run on meanwhile). Into a pipe, the
        reader paces it, and closing the pipe's other end stops it (an lmdb.Error here)."""
        self._environment.copyfd(fd, compact=True, txn=transaction)

    def replace_with(self, other: Store) -> None:
        """Replaces every database's contents with `other`'s, in one write transaction."""
        with self._environment.begin(write=True) as transaction, other._environment.begin() as source:
            for name in DATABASE_NAMES:
                target_db = self._databases[name]
                transaction.drop(target_db, delete=False)
                cursor = source.cursor(db=other._databases[name])
                consumed, added = transaction.cursor(db=target_db).putmulti(iter(cursor), append=True)
                if added != consumed:  # MDB_APPEND skips a row out of order instead of raising.
                    raise StorageError(f"store replace: {consumed - added} rows of {name!r} not copied")
            _upgrade(transaction, self._databases)  # A copy from an older node.

    def dump(self) -> list[tuple[bytes, bytes, bytes]]:
        """Every (database, key, value) in order: for tests that compare replicas byte by byte."""
        rows: list[tuple[bytes, bytes, bytes]] = []
        with self._environment.begin() as transaction:
            for name in DATABASE_NAMES:
                rows += [(name, bytes(k), bytes(v)) for k, v in transaction.cursor(db=self._databases[name])]
        return rows


def check_layout(environment: Any, path: Path) -> None:
    """Raises StoreFormatError if the environment's layout is newer than LAYOUT_VERSION (or its row
    is unreadable). Reads only, in one read transaction: the named databases are opened (which may
    create them, a write) after this passed."""
    with environment.begin(write=False) as transaction:
        try:
            meta = environment.open_db(b"meta", txn=transaction, create=False)
        except lmdb.NotFoundError:
            return  # A new environment (or one without a single row yet): the current layout.
        raw = transaction.get(_LAYOUT, db=meta)
    if raw is None:
        return  # Layout 1, from before the row existed: upgraded at open.
    found = int(_U64.unpack(raw)[0]) if len(raw) == _U64.size else None
    if found is None or found > LAYOUT_VERSION:
        shown = f"layout {found}" if found is not None else f"an unreadable layout row {bytes(raw)!r}"
        supported = f"1-{LAYOUT_VERSION}"
        raise StoreFormatError(f"store {path} has {shown}; this kq reads layouts {supported}: upgrade kq")


def _environment(path: Path, map_size_bytes: int, **options: bool) -> Any:
    """LMDB's environment in directory `path`, with the options every opener of a store shares (its
    named databases and reader slots, no readahead, LMDB's lock file: writers and readers of other
    processes coordinate through it) and `options`."""
    return lmdb.open(
        str(path),
        map_size=map_size_bytes,
        max_dbs=MAX_DATABASES,
        max_readers=MAX_READERS,
        subdir=True,
        readahead=False,
        lock=True,
        **options,
    )


def _layout_version(transaction: Any, databases: dict[bytes, Any]) -> int:
    raw = transaction.get(_LAYOUT, db=databases[b"meta"])
    return 1 if raw is None else int(_U64.unpack(raw)[0])


def _upgrade(transaction: Any, databases: dict[bytes, Any]) -> None:
    """Brings a store written by an older kq to the current layout, from its own rows alone (a pure
    function of them, so replicas that upgrade end equal): the `timestamps` index, then layout 2."""
    if _timestamp_index_missing(transaction, databases):
        _build_timestamp_index(transaction, databases)
    if _layout_version(transaction, databases) < 2:
        producers = databases[b"producers"]
        rows = [(bytes(key), bytes(value)) for key, value in transaction.cursor(db=producers)]
        transaction.drop(producers, delete=False)
        for key, value in rows:
            producer_id, topic_id, partition = _OLD_PRODUCER_KEY.unpack(key)
            transaction.put(_PRODUCER_KEY.pack(topic_id, partition, producer_id), value, db=producers)
        for key in transaction.cursor(db=databases[b"offsets"]).iternext(values=False):
            transaction.put(_offset_topic_key(bytes(key)), b"", db=databases[b"offset_topics"])
    transaction.put(_LAYOUT, _U64.pack(LAYOUT_VERSION), db=databases[b"meta"])


def _offset_topic_key(offset_key: bytes) -> bytes:
    """The `offset_topics` row of an `offsets` key: its topic and partition first, then its group."""
    split = len(offset_key) - _OFFSET_TAIL.size
    return offset_key[split:] + offset_key[:split]


def _timestamp_index_missing(transaction: Any, databases: dict[bytes, Any]) -> bool:
    """Whether the store holds batches but no `timestamps` rows (written by a kq without the index)."""
    has_records = transaction.cursor(db=databases[b"records"]).first()
    return bool(has_records) and not transaction.cursor(db=databases[b"timestamps"]).first()


def _build_timestamp_index(transaction: Any, databases: dict[bytes, Any]) -> None:
    """Indexes every stored batch by its maxTimestamp: a pure function of the batches, so every replica
    that builds it ends with the same rows that `append` would have written."""
    index = databases[b"timestamps"]
    for raw_key, raw in transaction.cursor(db=databases[b"records"]):
        key = _timestamp_key(raw_key, raw)
        if key is not None:
            transaction.put(key, b"", db=index)


def _timestamp_key(record_key: bytes | memoryview, batch: bytes | memoryview) -> bytes | None:
    """The `timestamps` key of the batch stored under `record_key`, or None when its maxTimestamp is -1
    (no timestamp)."""
    topic_id, partition, base_offset = _RECORD_KEY.unpack(record_key)
    max_timestamp_ms = max_timestamp_of(batch)
    if max_timestamp_ms < 0:
        return None
    return _TIMESTAMP_KEY.pack(topic_id, partition, _INT64_MAX - max_timestamp_ms, base_offset)


def reader_tables(databases: dict[bytes, Any]) -> dict[str, Any]:
    """A store's named databases by the attribute a StoreReader reads each by: built once per Store,
    then set on each reader in one call (every applied entry opens one; 20 lookups a transaction
    cost as much as two LMDB reads)."""
    return {
        "_meta": databases[b"meta"],
        "_topics": databases[b"topics"],
        "_partitions": databases[b"partitions"],
        "_records": databases[b"records"],
        "_producers": databases[b"producers"],
        "_groups": databases[b"groups"],
        "_offsets": databases[b"offsets"],
        "_topic_configs": databases[b"topic_configs"],
        "_topic_groups": databases[b"topic_groups"],
        "_timestamps": databases[b"timestamps"],
        "_purges": databases[b"purges"],
        "_pieces": databases[b"record_pieces"],
        "_offset_topics": databases[b"offset_topics"],
        "_members": databases[b"members"],
        "_leader_epochs": databases[b"leader_epochs"],
        "_security": {name: databases[name] for name in SECURITY_TABLES},
        "_txn_tables": {name: databases[name] for name in TRANSACTION_TABLES},
        "_offset_metadata": databases[b"offset_metadata"],
    }


class StoreReader(TransactionReads):
    """Typed reads inside one transaction."""

    # The store's named databases (`reader_tables`).
    _meta: Any
    _topics: Any
    _partitions: Any
    _records: Any
    _producers: Any
    _groups: Any
    _offsets: Any
    _topic_configs: Any
    _topic_groups: Any
    _timestamps: Any
    _purges: Any
    _pieces: Any
    _offset_topics: Any
    _members: Any
    _leader_epochs: Any
    _security: dict[bytes, Any]
    _txn_tables: dict[bytes, Any]
    _offset_metadata: Any

    def __init__(self, transaction: Any, tables: dict[str, Any]) -> None:
        self.__dict__.update(tables)  # Every attribute `reader_tables` names.
        self._transaction = transaction

    def _meta_u64(self, name: bytes) -> int:
        raw = self._transaction.get(name, db=self._meta)
        return 0 if raw is None else int(_U64.unpack(raw)[0])

    def applied_index(self) -> int:
        """Raft index of the last applied entry."""
        return self._meta_u64(_APPLIED_INDEX)

    def rejected_entries(self) -> int:
        """How many committed entries apply refused as a whole (identical on every replica)."""
        return self._meta_u64(_REJECTED_ENTRIES)

    def coordinator_epoch(self) -> int:
        """The newest coordinator epoch (group 0's term) a transaction marker applied here named (0:
        none): a marker of an older one comes from a deposed coordinator (raft/transactions.py)."""
        return self._meta_u64(_COORDINATOR_EPOCH)

    def members(self) -> list[tuple[str, bytes]]:
        """Every registered cluster member: (node id, its encoded `Member`), by node id."""
        return [(bytes(key).decode(), bytes(raw)) for key, raw in self._transaction.cursor(db=self._members)]

    def security_rows(self, table: bytes) -> list[tuple[bytes, bytes]]:
        """Every row of a security table (SECURITY_TABLES), by key."""
        return [(bytes(key), bytes(raw)) for key, raw in self._transaction.cursor(db=self._security[table])]

    def security_row(self, table: bytes, key: bytes) -> bytes | None:
        """One row of a security table, or None."""
        raw = self._transaction.get(key, db=self._security[table])
        return None if raw is None else bytes(raw)

    def security_count(self, table: bytes) -> int:
        """Rows in a security table."""
        return int(self._transaction.stat(self._security[table])["entries"])

    def cluster_id(self) -> str:
        """The cluster id the first registered member recorded ("": none yet)."""
        raw = self._transaction.get(_CLUSTER_ID, db=self._meta)
        return "" if raw is None else bytes(raw).decode()

    def topic(self, name: str) -> TopicMeta | None:
        """The topic called `name`, or None."""
        raw = self._transaction.get(name.encode(), db=self._topics)
        if raw is None:
            return None
        topic_id, partitions, created_ms = _TOPIC.unpack(raw)
        return TopicMeta(name, topic_id, partitions, created_ms, self._topic_group_count(topic_id))

    def topics(self) -> list[TopicMeta]:
        """Every topic, ordered by name."""
        result = []
        for key, raw in self._transaction.cursor(db=self._topics):
            topic_id, partitions, created_ms = _TOPIC.unpack(raw)
            groups = self._topic_group_count(topic_id)
            result.append(TopicMeta(bytes(key).decode(), topic_id, partitions, created_ms, groups))
        return result

    def _topic_group_count(self, topic_id: int) -> int:
        """The Raft groups a topic's partitions are spread over (its `topic_groups` row; none: 1)."""
        raw = self._transaction.get(_U64.pack(topic_id), db=self._topic_groups)
        return 1 if raw is None else int(_U16.unpack(raw)[0])

    def topic_configs(self, topic_id: int) -> bytes | None:
        """The topic's stored config overrides (raft/topic_config.py `encode_overrides`), or None."""
        raw = self._transaction.get(_U64.pack(topic_id), db=self._topic_configs)
        return None if raw is None else bytes(raw)

    def partition(self, topic_id: int, partition: int) -> PartitionState | None:
        """The partition's offsets, or None when it does not exist."""
        raw = self._transaction.get(_PARTITION_KEY.pack(topic_id, partition), db=self._partitions)
        return None if raw is None else PartitionState(*_PARTITION_STATE.unpack(raw))

    def leader_epochs(self, topic_id: int, partition: int) -> list[tuple[int, int]]:
        """The partition's (leader epoch, start offset) rows, oldest first: each epoch in which a batch
        was appended, and the offset of its first batch (at most LEADER_EPOCHS_PER_PARTITION_MAX)."""
        prefix = _PARTITION_KEY.pack(topic_id, partition)
        cursor = self._transaction.cursor(db=self._leader_epochs)
        epochs: list[tuple[int, int]] = []
        if cursor.set_range(prefix):
            while bytes(cursor.key()[: len(prefix)]) == prefix:
                epochs.append((_LEADER_EPOCH_KEY.unpack(cursor.key())[2], _U64.unpack(cursor.value())[0]))
                if not cursor.next():
                    break
        return epochs

    def latest_leader_epoch(self, topic_id: int, partition: int) -> int | None:
        """The partition's newest `leader_epochs` row's epoch; None: no batch was stamped with one."""
        cursor = self._transaction.cursor(db=self._leader_epochs)
        prefix = _PARTITION_KEY.pack(topic_id, partition)
        if cursor.set_range(_LEADER_EPOCH_KEY.pack(topic_id, partition, _EPOCH_MAX)):
            if bytes(cursor.key()[: len(prefix)]) == prefix:  # The epoch 2**32 - 1 itself.
                return int(_LEADER_EPOCH_KEY.unpack(cursor.key())[2])
            if not cursor.prev():
                return None
        elif not cursor.last():
            return None
        if bytes(cursor.key()[: len(prefix)]) != prefix:
            return None
        return int(_LEADER_EPOCH_KEY.unpack(cursor.key())[2])

    def oldest_batches(self, topic_id: int, partition: int, count_max: int) -> Iterator[BatchSpan]:
        """The partition's first `count_max` stored batches, oldest first, read lazily (headers only;
        batches a trim left below the log start included, so retention sees what is still to delete).
        Consume it inside the read transaction."""
        return self.batch_spans(topic_id, partition, 0, count_max)

    def batch_spans(self, topic_id: int, partition: int, offset: int, count_max: int) -> Iterator[BatchSpan]:
        """The spans of the partition's first `count_max` batches from `offset` on (its batch holding
        `offset` included), oldest first, read lazily from their headers alone (no piece read).
        Consume it inside the read transaction."""
        prefix = _PARTITION_KEY.pack(topic_id, partition)
        cursor = self._transaction.cursor(db=self._records)
        if not self._seek_batch(cursor, topic_id, partition, offset):
            return
        for _ in range(count_max):
            key, head = cursor.item()
            if bytes(key[:12]) != prefix:
                return
            base_offset = _RECORD_KEY.unpack(key)[2]
            yield BatchSpan(base_offset, offset_span_of(head), max_timestamp_of(head), stored_length_of(head))
            if not cursor.next():
                return

    def producer_window(self, producer_id: int, topic_id: int, partition: int) -> ProducerWindow | None:
        """The producer's epoch and remembered appends on this partition, or None if it never appended."""
        raw = self._transaction.get(_PRODUCER_KEY.pack(topic_id, partition, producer_id), db=self._producers)
        if raw is None:
            return None
        return _producer_window(bytes(raw))

    def has_producer_windows(self) -> bool:
        """Whether any partition remembers any producer (the expiry sweep has something to look at)."""
        return bool(self._transaction.cursor(db=self._producers).first())

    def producer_windows(
        self, topic_id: int, partition: int, rows_max: int
    ) -> list[tuple[int, ProducerWindow]]:
        """Up to `rows_max` producers that appended to the partition, by id, with their windows."""
        prefix = _PARTITION_KEY.pack(topic_id, partition)
        found: list[tuple[int, ProducerWindow]] = []
        cursor = self._transaction.cursor(db=self._producers)
        if not cursor.set_range(prefix):
            return found
        for key in cursor.iternext(keys=True, values=False):
            if bytes(key[: len(prefix)]) != prefix or len(found) >= rows_max:
                break
            producer_id = _PRODUCER_KEY.unpack(bytes(key))[2]
            window = self.producer_window(producer_id, topic_id, partition)
            assert window is not None
            found.append((producer_id, window))
        return found

    def batches(
        self, topic_id: int, partition: int, offset: int, max_bytes: int, max_records: int | None = None
    ) -> list[StoredBatch]:
        """Batches from the one holding `offset` (or, when compaction removed that one, the first after
        it) on, stopping once `max_bytes` of them are read, or once they hold `max_records` records
        from `offset` on (None: no record limit); a reader that serves at most that many reads no more.

        At least one batch is returned when the log holds one at or after `offset`, even if it alone
        exceeds `max_bytes`, so a reader always makes progress (Kafka's rule). Every checksum is
        verified. Batches follow each other without a hole unless compaction removed one whole.
        """
        cursor = self._transaction.cursor(db=self._records)
        prefix = _PARTITION_KEY.pack(topic_id, partition)
        if not self._seek_batch(cursor, topic_id, partition, offset):
            return []
        result: list[StoredBatch] = []
        total_bytes = records = 0
        records_max = _NO_RECORD_LIMIT if max_records is None else max_records
        for raw_key, head in cursor:
            if bytes(raw_key[:12]) != prefix:
                break
            if result and (total_bytes >= max_bytes or records >= records_max):
                break
            base_offset = _RECORD_KEY.unpack(raw_key)[2]
            raw = self._whole(raw_key, head)
            try:
                batch = decode_batch(raw, base_offset)
            except CorruptRecordError as error:
                raise CorruptRecordError(str(error), (topic_id, partition, base_offset)) from None
            if result:
                assert base_offset >= result[-1].next_offset, f"batches overlap at offset {base_offset}"
            result.append(batch)
            total_bytes += len(raw)
            records += batch.next_offset - max(offset, batch.base_offset)
        return result

    def stored_batches(
        self, topic_id: int, partition: int, offset: int, count_max: int
    ) -> Iterator[tuple[int, bytes | memoryview]]:
        """(base offset, stored bytes) of the partition's first `count_max` batches from `offset` on
        (its batch holding `offset` included), oldest first, read lazily and unchecked: what the
        compactor scans. Consume it inside the read transaction."""
        prefix = _PARTITION_KEY.pack(topic_id, partition)
        cursor = self._transaction.cursor(db=self._records)
        if not self._seek_batch(cursor, topic_id, partition, offset):
            return
        for _ in range(count_max):
            if bytes(cursor.key()[:12]) != prefix:
                return
            yield _RECORD_KEY.unpack(cursor.key())[2], self._whole(cursor.key(), cursor.value())
            if not cursor.next():
                return

    def batches_from_key(
        self, topic_id: int, partition: int, key_offset: int
    ) -> Iterator[tuple[int, bytes | memoryview]]:
        """(key offset, stored bytes) of the partition's batches stored under keys from `key_offset` on,
        oldest first, unchecked and read lazily: what the scrubber checks (broker/repair.py). Unlike
        `stored_batches` it never goes back to the batch holding `key_offset`, so it moves past a batch
        whose damaged header misstates its offsets. Consume it inside the read transaction."""
        prefix = _PARTITION_KEY.pack(topic_id, partition)
        cursor = self._transaction.cursor(db=self._records)
        if not cursor.set_range(_RECORD_KEY.pack(topic_id, partition, key_offset)):
            return
        for key, head in cursor:
            if bytes(key[:12]) != prefix:
                return
            yield _RECORD_KEY.unpack(key)[2], self._whole(key, head)

    def stored_batch(self, topic_id: int, partition: int, base_offset: int) -> bytes | None:
        """The batch stored at exactly `base_offset`, unchecked, or None."""
        key = _RECORD_KEY.pack(topic_id, partition, base_offset)
        raw = self._transaction.get(key, db=self._records)
        return None if raw is None else bytes(self._whole(key, raw))

    def _whole(self, record_key: bytes | memoryview, head: bytes | memoryview) -> bytes | memoryview:
        """The stored batch whose `records` value is `head`: `head` itself, or `head` followed by its
        `record_pieces` (a batch longer than one piece). Reads no more pieces than its header's
        batchLength asks for; a piece missing or a length the pieces do not add up to leaves it
        short or long, which `decode_batch` reports as corrupt."""
        if len(head) < HEADER_BYTES or len(head) >= stored_length_of(head):
            return head  # Whole, or too short to say (decode_batch reports that).
        total = stored_length_of(head)
        parts = [head]
        size = len(head)
        cursor = self._transaction.cursor(db=self._pieces)
        prefix = bytes(record_key)
        if not cursor.set_range(prefix + _PIECE_INDEX.pack(1)):
            return bytes(head)
        for key, piece in cursor.iternext():  # Views into the map: joined (copied) once, below.
            if size >= total or key[: len(prefix)] != prefix:
                break
            parts.append(piece)
            size += len(piece)
        return b"".join(parts)

    def _seek_batch(self, cursor: Any, topic_id: int, partition: int, offset: int) -> bool:
        """Puts `cursor` on the partition's batch holding `offset`, else on its first batch after it
        (compaction removed the one holding it); False when there is none."""
        prefix = _PARTITION_KEY.pack(topic_id, partition)
        key = _RECORD_KEY.pack(topic_id, partition, offset)
        found = cursor.set_range(key)
        if found and bytes(cursor.key()) == key:
            return True
        # Unless a batch starts exactly at `offset`, the one holding it is the previous key (if ours).
        if (
            (cursor.prev() if found else cursor.last())
            and bytes(cursor.key()[:12]) == prefix
            and _RECORD_KEY.unpack(cursor.key())[2] + offset_span_of(cursor.value()) > offset
        ):
            return True
        return bool(cursor.set_range(key)) and bytes(cursor.key()[:12]) == prefix

    def max_timestamp(
        self, topic_id: int, partition: int, log_start_offset: int, rows_max: int
    ) -> tuple[int, int] | None:
        """(maxTimestamp, base offset) of the stored batch with the largest maxTimestamp header, the first
        of those that share it, among the batches not wholly below `log_start_offset`; None when there
        is none, or when it is not within the first `rows_max` rows of the `timestamps` index: what
        ListOffsets' MAX_TIMESTAMP (KIP-734) answers from. One seek; every row skipped is a batch a
        bounded trim left below the log start (retention deletes those), so the read is bounded."""
        prefix = _PARTITION_KEY.pack(topic_id, partition)
        cursor = self._transaction.cursor(db=self._timestamps)
        if not cursor.set_range(prefix):
            return None
        for _ in range(rows_max):
            key = bytes(cursor.key())
            if key[: len(prefix)] != prefix:
                return None
            _, _, inverted, base_offset = _TIMESTAMP_KEY.unpack(key)
            raw = self._transaction.get(_RECORD_KEY.pack(topic_id, partition, base_offset), db=self._records)
            if raw is not None and base_offset + offset_span_of(raw) > log_start_offset:
                return _INT64_MAX - inverted, base_offset
            if not cursor.next():
                return None
        return None

    def purges(self) -> list[int]:
        """Ids of deleted topics whose rows (batches, producer state, committed offsets) are not all
        deleted yet."""
        cursor = self._transaction.cursor(db=self._purges)
        return [_U64.unpack(key)[0] for key in cursor.iternext(values=False)]

    def group(self, name: str) -> bytes | None:
        """The group's serialized state (opaque to storage), or None."""
        raw = self._transaction.get(name.encode(), db=self._groups)
        return None if raw is None else bytes(raw)

    def groups(self) -> list[tuple[str, bytes]]:
        """Every group's (name, serialized state), by name."""
        return [(bytes(key).decode(), bytes(raw)) for key, raw in self._transaction.cursor(db=self._groups)]

    def offset_details(self, group: str) -> dict[tuple[int, int], OffsetDetails]:
        """The group's committed offsets' metadata and leader epochs, by (topic_id, partition): only
        those committed with any (the others are NO_OFFSET_DETAILS)."""
        prefix = _group_prefix(group)
        cursor = self._transaction.cursor(db=self._offset_metadata)
        found: dict[tuple[int, int], OffsetDetails] = {}
        if not cursor.set_range(prefix):
            return found
        for key, raw in cursor:
            if bytes(key[: len(prefix)]) != prefix:
                break
            found[_OFFSET_TAIL.unpack_from(key, len(prefix))] = decode_offset_details(bytes(raw))
        return found

    def committed_offsets(self, group: str) -> list[tuple[int, int, int, int]]:
        """The group's committed offsets as (topic_id, partition, offset, commit_time_ms)."""
        prefix = _group_prefix(group)
        cursor = self._transaction.cursor(db=self._offsets)
        result: list[tuple[int, int, int, int]] = []
        if not cursor.set_range(prefix):
            return result
        for key, raw in cursor:
            if bytes(key[: len(prefix)]) != prefix:
                break
            topic_id, partition = _OFFSET_TAIL.unpack_from(key, len(prefix))
            offset, commit_time_ms = _COMMITTED.unpack(raw)
            result.append((topic_id, partition, offset, commit_time_ms))
        return result


def _producer_window(raw: bytes) -> ProducerWindow:
    """A `producers` value: its epoch, appends and (a row of this kq) its last append time."""
    epoch, count = _PRODUCER_EPOCH.unpack_from(raw, 0)
    start = _PRODUCER_EPOCH.size
    end = start + count * _PRODUCER_APPEND.size
    appends = tuple(map(_new_producer_append, _PRODUCER_APPEND.iter_unpack(raw[start:end])))
    stamped = len(raw) >= end + _PRODUCER_STAMP.size  # A row written before the time was added has none.
    last_append_ms = _PRODUCER_STAMP.unpack_from(raw, end)[0] if stamped else None
    return ProducerWindow(epoch, appends, last_append_ms)


# `ProducerAppend` from its unpacked fields, as its `_make` does without the Python call and check.
_new_producer_append = functools.partial(tuple.__new__, ProducerAppend)


def _producer_row(epoch: int, appends: Iterable[ProducerAppend], last_append_ms: int) -> bytes:
    """A `producers` value (storage/__init__.py): epoch, count, the appends, the last append time."""
    kept = tuple(appends)
    layout = _PRODUCER_ROWS[len(kept)] if len(kept) < len(_PRODUCER_ROWS) else _producer_row_layout(len(kept))
    return layout.pack(epoch, len(kept), *itertools.chain.from_iterable(kept), last_append_ms)  # One call.


def _group_prefix(group: str) -> bytes:
    name = group.encode()
    return _GROUP_NAME_LENGTH.pack(len(name)) + name


class StoreWriter(StoreReader, TransactionWrites):
    """Typed writes inside the one write transaction of an applied entry."""

    def __init__(self, transaction: Any, tables: dict[str, Any], piece_bytes: int) -> None:
        super().__init__(transaction, tables)
        self._piece_bytes = piece_bytes
        self._applied_index: int | None = None  # Read once (`applied_index`).

    def _put_batch(
        self,
        record_key: bytes,
        value: bytes | memoryview,
        base_offset: int | None = None,
        leader_epoch: int | None = None,
    ) -> None:
        """Stores a batch under `record_key`: its first `piece_bytes` in `records`, the rest in
        `record_pieces`, one page-sized piece per value, so that every value that LMDB keeps on
        overflow pages takes exactly one page and any page a trim frees fits any later piece.
        `base_offset` (and `leader_epoch`): stamped into the first piece as it is stored (the batch
        itself is not copied), which must then be a new row: a taken offset raises AssertionError
        before anything is written (LMDB's put checks it, where a read before it cost a lookup)."""
        view = memoryview(value)
        piece = self._piece_bytes
        head = (
            view[:piece]
            if base_offset is None
            else stamp_base_offset(view[:piece], base_offset, leader_epoch)
        )
        if not self._transaction.put(record_key, head, db=self._records, overwrite=base_offset is None):
            raise AssertionError(f"an offset was already taken: {_RECORD_KEY.unpack(record_key)}")
        starts = range(piece, len(value), piece)  # Piece i (from 1) starts at i * piece.
        if not starts:
            return
        suffixes = (  # Each piece's key suffix from the table (no call a piece), past it packed.
            _PIECE_SUFFIXES
            if len(starts) <= len(_PIECE_SUFFIXES)
            else [_PIECE_INDEX.pack(index) for index in range(1, len(starts) + 1)]
        )
        pieces = [
            (record_key + suffix, view[start : start + piece])
            for suffix, start in zip(suffixes, starts, strict=False)  # As many as `starts`.
        ]
        self._transaction.cursor(db=self._pieces).putmulti(pieces)  # One call into LMDB for them all.

    def _delete_pieces(self, record_key: bytes | memoryview, head: bytes | memoryview) -> None:
        """Deletes the `record_pieces` of the batch whose `records` row is `head` (the caller deletes
        or replaces that row)."""
        if len(head) >= stored_length_of(head):
            return
        prefix = bytes(record_key)
        cursor = self._transaction.cursor(db=self._pieces)
        if cursor.set_range(prefix + _PIECE_INDEX.pack(1)):
            while bytes(cursor.key()[: len(prefix)]) == prefix:
                if not cursor.delete():
                    break

    def _put_meta_u64(self, name: bytes, value: int) -> None:
        self._transaction.put(name, _U64.pack(value), db=self._meta)

    def applied_index(self) -> int:
        """Raft index of the last applied entry; read once a transaction (only `set_applied_index`
        changes it, and apply reads it before it applies an entry and checks it as it records one)."""
        if self._applied_index is None:
            self._applied_index = self._meta_u64(_APPLIED_INDEX)
        return self._applied_index

    def set_applied_index(self, index: int) -> None:
        """Records that the entry at `index` is applied; it only ever grows."""
        assert index > self.applied_index(), "applied index must only move forward"
        self._put_meta_u64(_APPLIED_INDEX, index)
        self._applied_index = index

    def raise_coordinator_epoch(self, epoch: int) -> None:
        """Records `epoch` as the newest coordinator epoch when it is newer than the one recorded."""
        if epoch > self.coordinator_epoch():
            self._put_meta_u64(_COORDINATOR_EPOCH, epoch)

    def count_rejected_entry(self) -> None:
        """Counts one entry that apply refused as a whole (its index is still recorded as applied)."""
        self._put_meta_u64(_REJECTED_ENTRIES, self.rejected_entries() + 1)

    def producer_id_allocated(self, producer_id: int) -> bool:
        """Whether `producer_id` was handed out by `allocate_producer_id`."""
        return 0 < producer_id < (self._meta_u64(_NEXT_PRODUCER_ID) or 1)

    def allocate_producer_id(self) -> int:
        """Returns a new producer id (from 1) and advances the counter."""
        producer_id = self._meta_u64(_NEXT_PRODUCER_ID) or 1
        self._put_meta_u64(_NEXT_PRODUCER_ID, producer_id + 1)
        return producer_id

    def topic_id_used(self, topic_id: int) -> bool:
        """Whether `topic_id` is below the next id: given to a topic here before (ids are never reused)."""
        return topic_id < (self._meta_u64(_NEXT_TOPIC_ID) or 1)

    def create_topic(
        self, name: str, partitions: int, created_ms: int, topic_id: int = 0, groups: int = 1
    ) -> TopicMeta:
        """Creates a topic with empty partitions; the caller checked that the name is free. `topic_id`
        0: the next id; else that id (a copy of another group's topic), the next id moved past it.
        `groups`: the Raft groups its partitions are spread over (a `topic_groups` row when above 1)."""
        next_id = self._meta_u64(_NEXT_TOPIC_ID) or 1
        topic_id = topic_id or next_id
        self._put_meta_u64(_NEXT_TOPIC_ID, max(next_id, topic_id + 1))
        self._transaction.put(name.encode(), _TOPIC.pack(topic_id, partitions, created_ms), db=self._topics)
        if groups > 1:
            self._transaction.put(_U64.pack(topic_id), _U16.pack(groups), db=self._topic_groups)
        for partition in range(partitions):
            self._put_partition(topic_id, partition, PartitionState(0, 0, 0))
        return TopicMeta(name, topic_id, partitions, created_ms, max(groups, 1))

    def grow_partitions(self, topic: TopicMeta, partitions: int) -> TopicMeta:
        """Adds empty partitions to `topic` up to `partitions` (more than it has: the caller checked)."""
        assert partitions > topic.partitions, "a topic's partitions only grow"
        row = _TOPIC.pack(topic.topic_id, partitions, topic.created_ms)
        self._transaction.put(topic.name.encode(), row, db=self._topics)
        for partition in range(topic.partitions, partitions):
            self._put_partition(topic.topic_id, partition, PartitionState(0, 0, 0))
        return TopicMeta(topic.name, topic.topic_id, partitions, topic.created_ms, topic.groups)

    def put_member(self, node_id: str, member: bytes) -> None:
        """Stores a member's encoded addresses under its node id (replacing any)."""
        self._transaction.put(node_id.encode(), member, db=self._members)

    def delete_member(self, node_id: str) -> bool:
        """Forgets a member; whether it was registered."""
        return bool(self._transaction.delete(node_id.encode(), db=self._members))

    def put_security_row(self, table: bytes, key: bytes, value: bytes) -> None:
        """Stores a row of a security table (replacing any)."""
        self._transaction.put(key, value, db=self._security[table])

    def delete_security_row(self, table: bytes, key: bytes) -> bool:
        """Deletes a row of a security table; whether it was there."""
        return bool(self._transaction.delete(key, db=self._security[table]))

    def set_cluster_id(self, cluster_id: str) -> None:
        """Records the cluster id (the caller checked that none is recorded)."""
        self._transaction.put(_CLUSTER_ID, cluster_id.encode(), db=self._meta)

    def set_topic_configs(self, topic_id: int, overrides: bytes) -> None:
        """Stores a topic's config overrides (empty bytes: none)."""
        if overrides:
            self._transaction.put(_U64.pack(topic_id), overrides, db=self._topic_configs)
        else:
            self._transaction.delete(_U64.pack(topic_id), db=self._topic_configs)

    def delete_topic(self, topic: TopicMeta, batches_max: int) -> bool:
        """Removes the topic, its configs and its partitions, and at most `batches_max` of its rows left
        (batches, producer state, groups' committed offsets); the rest stay, unreachable (topic ids are
        never reused), under a `purges` row until `purge` deletes them. Returns whether every row is
        gone."""
        self._transaction.delete(topic.name.encode(), db=self._topics)
        self._transaction.delete(_U64.pack(topic.topic_id), db=self._topic_configs)
        self._transaction.delete(_U64.pack(topic.topic_id), db=self._topic_groups)
        for partition in range(topic.partitions):
            self._transaction.delete(_PARTITION_KEY.pack(topic.topic_id, partition), db=self._partitions)
        self._transaction.put(_U64.pack(topic.topic_id), b"", db=self._purges)
        return self.purge(topic.topic_id, batches_max)

    def purge(self, topic_id: int, rows_max: int) -> bool:
        """Deletes at most `rows_max` rows of a deleted topic: its batches (with their pieces and
        `timestamps` rows), then its producer state, then the groups' committed offsets of it (with
        their `offset_topics` rows); when none is left, its `purges` row too. Returns whether none is
        left. A topic without a `purges` row (a live one, or one purged already) is left alone."""
        prefix = _U64.pack(topic_id)
        if self._transaction.get(prefix, db=self._purges) is None:
            return True
        budget = [rows_max]
        for database, delete_one in (
            (self._records, self._delete_stored_batch),
            (self._producers, None),
            (self._txn_tables[b"txn_open"], None),
            (self._txn_tables[b"txn_aborted"], None),
            (self._leader_epochs, None),
            (self._offset_topics, self._delete_committed_offset),
        ):
            if not self._delete_topic_rows(database, prefix, budget, delete_one):
                return False
        self._transaction.delete(prefix, db=self._purges)
        return True

    def _delete_topic_rows(
        self, database: Any, prefix: bytes, budget: list[int], delete_one: Callable[[Any, Any], None] | None
    ) -> bool:
        """Deletes the rows of `database` under `prefix` while `budget[0]` lasts (calling `delete_one`
        with each row's key and value first, for what goes with it); whether none is left."""
        cursor = self._transaction.cursor(db=database)
        if not cursor.set_range(prefix):
            return True
        while bytes(cursor.key()[: len(prefix)]) == prefix:
            if budget[0] == 0:
                return False
            if delete_one is not None:
                delete_one(cursor.key(), cursor.value())
            budget[0] -= 1
            if not cursor.delete():
                break
        return True

    def _delete_stored_batch(self, record_key: Any, head: Any) -> None:
        """What goes with a `records` row: its `timestamps` row and its pieces."""
        timestamp_key = _timestamp_key(record_key, head)
        if timestamp_key is not None:
            self._transaction.delete(timestamp_key, db=self._timestamps)
        self._delete_pieces(record_key, head)

    def _delete_committed_offset(self, offset_topic_key: Any, _: Any) -> None:
        """What an `offset_topics` row stands for: the group's `offsets` row."""
        key = bytes(offset_topic_key)
        offsets_key = key[_OFFSET_TAIL.size :] + key[: _OFFSET_TAIL.size]
        self._transaction.delete(offsets_key, db=self._offsets)
        self._transaction.delete(offsets_key, db=self._offset_metadata)

    def _put_partition(self, topic_id: int, partition: int, state: PartitionState) -> None:
        self._transaction.put(
            _PARTITION_KEY.pack(topic_id, partition),
            _PARTITION_STATE.pack(state.log_start_offset, state.log_end_offset, state.size_bytes),
            db=self._partitions,
        )

    def append(self, topic_id: int, partition: int, batch: bytes | memoryview, leader_epoch: int = 0) -> int:
        """Appends a RecordBatch v2 at the partition's end, its base offset stamped; returns that offset.

        The base offset is the partition's log end: a pure function of the store's state, so every
        replica stamps the same one. `batch` passed proto/records.py `check_batch` (apply runs it
        first), so its header's record count is at least one. A `leader_epoch` (the proposer's Raft
        term; 0: none) is stamped as its partitionLeaderEpoch, raised to the partition's newest
        epoch if lower (a term read just before a re-election), so a partition's epochs never go
        down; a rise is recorded in `leader_epochs`.
        """
        state = self.partition(topic_id, partition)
        assert state is not None, "append to a partition that does not exist"
        base_offset = state.log_end_offset
        record_count = record_count_of(batch)  # A producer's batch: as many as its offsets.
        assert 0 < record_count == offset_span_of(batch), "apply appends only checked batches"
        record_key = _RECORD_KEY.pack(topic_id, partition, base_offset)
        epoch = self._stamped_epoch(topic_id, partition, leader_epoch, base_offset) if leader_epoch else None
        self._put_batch(record_key, batch, base_offset, epoch)  # A new row, as `stamp_base_offset` makes it.
        timestamp_key = _timestamp_key(record_key, batch)  # The header's maxTimestamp: not stamped.
        if timestamp_key is not None:
            self._transaction.put(timestamp_key, b"", db=self._timestamps)
        self._put_partition(
            topic_id,
            partition,
            PartitionState(state.log_start_offset, base_offset + record_count, state.size_bytes + len(batch)),
        )
        return base_offset

    def _stamped_epoch(self, topic_id: int, partition: int, leader_epoch: int, base_offset: int) -> int:
        """The epoch a batch appended at `base_offset` carries; records a new one (dropping the oldest
        row past LEADER_EPOCHS_PER_PARTITION_MAX: its range then reads as its successor's start)."""
        latest = self.latest_leader_epoch(topic_id, partition)
        if latest is not None and leader_epoch <= latest:
            return latest
        key = _LEADER_EPOCH_KEY.pack(topic_id, partition, leader_epoch)
        self._transaction.put(key, _U64.pack(base_offset), db=self._leader_epochs)
        epochs = self.leader_epochs(topic_id, partition)
        for old_epoch, _ in epochs[: max(0, len(epochs) - LEADER_EPOCHS_PER_PARTITION_MAX)]:
            self._delete_leader_epoch(topic_id, partition, old_epoch)
        return leader_epoch

    def _trim_leader_epochs(self, topic_id: int, partition: int, log_start: int) -> None:
        """Deletes the epochs wholly below the log start: those whose successor starts at or below it
        (the one covering the log start stays), as Kafka trims its leader-epoch cache."""
        epochs = self.leader_epochs(topic_id, partition)
        for (epoch, _), (_, next_start) in itertools.pairwise(epochs):
            if next_start > log_start:
                break
            self._delete_leader_epoch(topic_id, partition, epoch)

    def _delete_leader_epoch(self, topic_id: int, partition: int, epoch: int) -> None:
        self._transaction.delete(_LEADER_EPOCH_KEY.pack(topic_id, partition, epoch), db=self._leader_epochs)

    def trim(self, topic_id: int, partition: int, before_offset: int, batches_max: int) -> int:
        """Moves the log start up to `before_offset` (never down), deleting at most `batches_max` of the
        batches wholly below the log start, oldest first.

        A batch that straddles the new log start stays; reads skip its records below the start. Batches
        left below it by the bound stay until the next trim (retention proposes one; they are never
        read). Returns the log start offset.
        """
        state = self.partition(topic_id, partition)
        assert state is not None and before_offset <= state.log_end_offset
        log_start = max(before_offset, state.log_start_offset)
        cursor = self._transaction.cursor(db=self._records)
        prefix = _PARTITION_KEY.pack(topic_id, partition)
        freed_bytes = 0
        deleted = 0
        if cursor.set_range(prefix):
            while deleted < batches_max and bytes(cursor.key()[:12]) == prefix:
                span = offset_span_of(cursor.value())  # From the stored v2 header.
                if _RECORD_KEY.unpack(cursor.key())[2] + span > log_start:
                    break
                freed_bytes += stored_length_of(cursor.value())
                deleted += 1
                self._delete_stored_batch(cursor.key(), cursor.value())
                if not cursor.delete():
                    break
        self._put_partition(
            topic_id,
            partition,
            PartitionState(log_start, state.log_end_offset, state.size_bytes - freed_bytes),
        )
        self.trim_aborted_transactions(topic_id, partition, log_start, batches_max)
        self._trim_leader_epochs(topic_id, partition, log_start)
        return log_start

    def repair_batch(self, topic_id: int, partition: int, base_offset: int, value: bytes) -> bool:
        """Puts back the batch stored at `base_offset`, whose stored bytes failed their checksum, as
        `value`: another replica's copy, checked whole by the caller (broker/repair.py). Not an entry's
        effect: every replica already holds these bytes, so the stores stay equal. False when no batch
        is stored there any more (retention or a compaction removed it meanwhile).

        The damaged row's pieces go whatever its header says (the damage may be in its length); the
        partition's size changes only when the damaged header still names the same offsets (a
        compacted copy is shorter), else the size recorded at the append stands."""
        key = _RECORD_KEY.pack(topic_id, partition, base_offset)
        old = self._transaction.get(key, db=self._records)
        state = self.partition(topic_id, partition)
        if old is None or state is None:
            return False
        old = bytes(old)
        cursor = self._transaction.cursor(db=self._pieces)
        if cursor.set_range(key + _PIECE_INDEX.pack(1)):
            while bytes(cursor.key()[: len(key)]) == key:
                if not cursor.delete():
                    break
        same_header = len(old) >= HEADER_BYTES and offset_span_of(old) == offset_span_of(value)
        grown = len(value) - stored_length_of(old) if same_header else 0
        self._put_batch(key, value)
        if grown:
            self._put_partition(
                topic_id,
                partition,
                PartitionState(state.log_start_offset, state.log_end_offset, state.size_bytes + grown),
            )
        return True

    def rewrite_batch(self, topic_id: int, partition: int, base_offset: int, value: bytes | None) -> int:
        """Replaces the batch stored at `base_offset` with `value` (compaction's rewrite of it, spanning
        the same offsets), or deletes it when `value` is None; returns the bytes freed. The log's start
        and end stay; its size follows."""
        state = self.partition(topic_id, partition)
        key = _RECORD_KEY.pack(topic_id, partition, base_offset)
        old = self._transaction.get(key, db=self._records)
        assert state is not None and old is not None, "rewrite of a batch that is not stored"
        old_size = stored_length_of(old)
        if value is None:
            self._delete_stored_batch(key, old)
            self._transaction.delete(key, db=self._records)
        else:
            header = (offset_span_of(value), max_timestamp_of(value))
            # A rewrite keeps the batch's offsets and its maxTimestamp, hence its `timestamps` row.
            assert header == (offset_span_of(old), max_timestamp_of(old)), "a rewrite changed the header"
            self._delete_pieces(key, old)
            self._put_batch(key, value)
        freed_bytes = old_size - (0 if value is None else len(value))
        self._put_partition(
            topic_id,
            partition,
            PartitionState(state.log_start_offset, state.log_end_offset, state.size_bytes - freed_bytes),
        )
        return freed_bytes

    def put_group(self, name: str, state: bytes) -> None:
        """Stores a group's serialized state."""
        self._transaction.put(name.encode(), state, db=self._groups)

    def delete_group(self, name: str) -> None:
        """Removes a group and all its committed offsets."""
        self._transaction.delete(name.encode(), db=self._groups)
        prefix = _group_prefix(name)
        cursor = self._transaction.cursor(db=self._offsets)
        if not cursor.set_range(prefix):
            return
        while bytes(cursor.key()[: len(prefix)]) == prefix:
            self._transaction.delete(_offset_topic_key(bytes(cursor.key())), db=self._offset_topics)
            self._transaction.delete(bytes(cursor.key()), db=self._offset_metadata)
            if not cursor.delete():
                break

    def delete_offset(self, group: str, topic_id: int, partition: int) -> None:
        """Forgets the group's committed offset for one partition (none stored: nothing to do)."""
        key = _group_prefix(group) + _OFFSET_TAIL.pack(topic_id, partition)
        self._transaction.delete(key, db=self._offsets)
        self._transaction.delete(key, db=self._offset_metadata)
        self._transaction.delete(_offset_topic_key(key), db=self._offset_topics)

    def commit_offset(
        self,
        group: str,
        topic_id: int,
        partition: int,
        offset: int,
        commit_time_ms: int,
        details: OffsetDetails = NO_OFFSET_DETAILS,
    ) -> None:
        """Stores the group's committed offset for one partition, with Kafka's metadata string and
        leader epoch when there are any (`offset_metadata`; a commit without them removes old ones)."""
        key = _group_prefix(group) + _OFFSET_TAIL.pack(topic_id, partition)
        self._transaction.put(key, _COMMITTED.pack(offset, commit_time_ms), db=self._offsets)
        self._transaction.put(_offset_topic_key(key), b"", db=self._offset_topics)
        if details == NO_OFFSET_DETAILS:
            self._transaction.delete(key, db=self._offset_metadata)
        else:
            self._transaction.put(key, encode_offset_details(details), db=self._offset_metadata)

    def fence_producer(
        self, producer_id: int, topic_id: int, partition: int, epoch: int, marked_ms: int
    ) -> None:
        """Raises the producer's epoch on the partition to `epoch` (a transaction marker's), so that its
        batches of an older epoch are refused from now on; its next batch starts a new window at
        sequence 0 when the epoch is new. A lower or equal epoch keeps the window's epoch and appends.
        Either way the window's time becomes `marked_ms` (the marker entry's clock), as a Kafka marker
        updates its producer's last timestamp: producer expiry counts from it."""
        window = self.producer_window(producer_id, topic_id, partition)
        if window is not None and window.epoch >= epoch:
            raw = _producer_row(window.epoch, window.appends, marked_ms)
        else:
            raw = _producer_row(epoch, (), marked_ms)
        self._transaction.put(_PRODUCER_KEY.pack(topic_id, partition, producer_id), raw, db=self._producers)

    def remember_producer_append(
        self,
        producer_id: int,
        topic_id: int,
        partition: int,
        epoch: int,
        append: ProducerAppend,
        window: ProducerWindow | None,
        *,
        appended_ms: int,
    ) -> None:
        """Adds `append` to the producer's window for the partition, dropping the oldest beyond the limit.

        `window` is that window as read in this transaction since its last change (None: it has none);
        apply reads it to check the sequence first. An epoch other than the remembered one starts a new
        window (apply only lets a higher one through: a producer's new epoch starts its sequences again
        at 0, as in Kafka). `appended_ms` (the entry's leader clock) is stored with the window, in the
        same row: producer expiry counts from it (no other write per append).
        """
        earlier = window.appends if window is not None and window.epoch == epoch else ()
        appends = [*earlier, append][-PRODUCER_APPENDS_KEPT:]
        raw = _producer_row(epoch, appends, appended_ms)
        self._transaction.put(_PRODUCER_KEY.pack(topic_id, partition, producer_id), raw, db=self._producers)

    def expire_producers(self, now_ms: int, expiration_ms: int, rows_max: int) -> ProducerSweep:
        """Looks at up to `rows_max` `producers` rows from where the last call stopped (the
        `producer_sweep` meta row; at the table's end the next call starts again at its first row), and
        deletes each window idle for `expiration_ms` or more at `now_ms` whose producer holds no open
        transaction in that partition (Kafka's producer.id.expiration.ms). A row without a time (written
        before rows carried one) is not expired but stamped with `now_ms`: it expires at the earliest
        `expiration_ms` after this sweep. A pure function of the rows and the arguments (apply passes
        the entry's values), so every replica deletes the same rows."""
        meta = self._meta
        start = self._transaction.get(_PRODUCER_SWEEP, db=meta)
        cursor = self._transaction.cursor(db=self._producers)
        found = cursor.set_range(bytes(start)) if start is not None else cursor.first()
        rows: list[tuple[bytes, bytes]] = []
        while found and len(rows) < rows_max:
            rows.append((bytes(cursor.key()), bytes(cursor.value())))
            found = cursor.next()
        next_key = bytes(cursor.key()) if found else None
        expired = stamped = 0
        for key, raw in rows:
            window = _producer_window(raw)
            if window.last_append_ms is None:
                self._transaction.put(
                    key, _producer_row(window.epoch, window.appends, now_ms), db=self._producers
                )
                stamped += 1
                continue
            if now_ms - window.last_append_ms < expiration_ms:
                continue
            topic_id, partition, producer_id = _PRODUCER_KEY.unpack(key)
            if self.open_transaction(topic_id, partition, producer_id) is not None:
                continue  # Kafka keeps a producer with an ongoing transaction, however old.
            self._transaction.delete(key, db=self._producers)
            expired += 1
        if next_key is None:
            self._transaction.delete(_PRODUCER_SWEEP, db=meta)
        else:
            self._transaction.put(_PRODUCER_SWEEP, next_key, db=meta)
        return ProducerSweep(len(rows), expired, stamped, next_key is None)

    def sweep_transaction_states(self, rows_max: int) -> tuple[list[tuple[str, bytes]], bool]:
        """Up to `rows_max` transactional ids and their states from where the last call stopped (the
        `txn_id_sweep` meta row, moved past them; at the table's end it is deleted, so the next call
        starts at the first id), and whether this call reached the end. Transactional id expiry
        (raft/transactions.py) judges them; a pure function of the rows."""
        table = self._txn_tables[b"transactions"]
        start = self._transaction.get(_TXN_ID_SWEEP, db=self._meta)
        cursor = self._transaction.cursor(db=table)
        found = cursor.set_range(bytes(start)) if start is not None else cursor.first()
        rows: list[tuple[str, bytes]] = []
        while found and len(rows) < rows_max:
            rows.append((bytes(cursor.key()).decode(), bytes(cursor.value())))
            found = cursor.next()
        if found:
            self._transaction.put(_TXN_ID_SWEEP, bytes(cursor.key()), db=self._meta)
        else:
            self._transaction.delete(_TXN_ID_SWEEP, db=self._meta)
        return rows, not found

    def delete_transaction_state(self, transactional_id: str) -> None:
        """Forgets a transactional id (expired: raft/transactions.py); InitProducerId makes it anew."""
        self._transaction.delete(transactional_id.encode(), db=self._txn_tables[b"transactions"])
