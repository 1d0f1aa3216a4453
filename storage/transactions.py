"""The rows of Kafka transactions (KIP-98) in a node's store: read and written inside the store's
transactions (StoreReader and StoreWriter take these as mixins). Layout in storage/__init__.py.

Two kinds of rows, in two kinds of Raft group:

- the coordinator's (`transactions`, `txn_offsets`): each transactional id's state, as raft/ encodes
  it (opaque bytes here), and the offsets a transaction committed for consumer groups, pending until
  its marker; in the group that coordinates transactions (group 0, as consumer groups);
- a partition's (`txn_open`, `txn_aborted`): the transactions with records in the partition and no
  marker yet (the last stable offset is the first offset of the oldest), and the offset ranges of
  aborted ones (a read_committed Fetch names them); in the partition's group.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from kq.storage.offset_details import (
    NO_OFFSET_DETAILS,
    OffsetDetails,
    decode_offset_details,
    encode_offset_details,
)

_TXN_PARTITION_KEY = struct.Struct(">QIQ")  # topic_id, partition, producer_id
_TXN_OPEN = struct.Struct(">QqH")  # first_offset, opened_ms, producer_epoch
_ABORTED_KEY = struct.Struct(">QIQQ")  # topic_id, partition, last_offset, producer_id
_ABORTED = struct.Struct(">Q")  # first_offset
_PENDING_OFFSET = struct.Struct(">Qq")  # offset, commit_time_ms
_OFFSET_TAIL = struct.Struct(">QI")  # topic_id, partition
_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
_PARTITION = struct.Struct(">QI")
TRANSACTION_TABLES = (b"transactions", b"txn_open", b"txn_aborted", b"txn_offsets")


@dataclass(frozen=True, slots=True)
class OpenTransaction:
    """A producer's transaction with records in a partition and no marker there yet."""

    producer_id: int
    first_offset: int
    opened_ms: int  # The leader's clock when its first batch in the partition was appended.
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class AbortedTransaction:
    """The offsets an aborted transaction spans in a partition (its marker is at `last_offset`)."""

    producer_id: int
    first_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class PendingOffset:
    """An offset a transaction committed for a consumer group, applied when its marker commits it."""

    group: str
    topic_id: int
    partition: int
    offset: int
    commit_time_ms: int
    details: OffsetDetails = NO_OFFSET_DETAILS


def _pending_key(producer_id: int, group: str, topic_id: int, partition: int) -> bytes:
    name = group.encode()
    return _U64.pack(producer_id) + _U16.pack(len(name)) + name + _OFFSET_TAIL.pack(topic_id, partition)


class TransactionReads:
    """Reads of the transaction rows (a mixin of StoreReader: `_transaction` is its LMDB transaction)."""

    _transaction: Any
    _txn_tables: dict[bytes, Any]

    def transaction_state(self, transactional_id: str) -> bytes | None:
        """A transactional id's state as raft/ stored it, or None for an id never initialized."""
        raw = self._transaction.get(transactional_id.encode(), db=self._txn_tables[b"transactions"])
        return None if raw is None else bytes(raw)

    def transaction_states(self, rows_max: int) -> list[tuple[str, bytes]]:
        """Up to `rows_max` transactional ids and their states, by id."""
        rows: list[tuple[str, bytes]] = []
        cursor = self._transaction.cursor(db=self._txn_tables[b"transactions"])
        for key, value in cursor:
            if len(rows) >= rows_max:
                break
            rows.append((bytes(key).decode(), bytes(value)))
        return rows

    def transaction_count(self) -> int:
        """How many transactional ids the store holds."""
        return int(self._transaction.stat(self._txn_tables[b"transactions"])["entries"])

    def open_transaction(self, topic_id: int, partition: int, producer_id: int) -> OpenTransaction | None:
        """The producer's open transaction in the partition, or None."""
        key = _TXN_PARTITION_KEY.pack(topic_id, partition, producer_id)
        raw = self._transaction.get(key, db=self._txn_tables[b"txn_open"])
        if raw is None:
            return None
        return OpenTransaction(producer_id, *_TXN_OPEN.unpack(bytes(raw)))

    def open_transactions(self, topic_id: int, partition: int, rows_max: int) -> list[OpenTransaction]:
        """Up to `rows_max` open transactions of the partition, by producer id."""
        prefix = _PARTITION.pack(topic_id, partition)
        found: list[OpenTransaction] = []
        cursor = self._transaction.cursor(db=self._txn_tables[b"txn_open"])
        if not cursor.set_range(prefix):
            return found
        for key, value in cursor:
            if bytes(key[: len(prefix)]) != prefix or len(found) >= rows_max:
                break
            producer_id = _TXN_PARTITION_KEY.unpack(bytes(key))[2]
            found.append(OpenTransaction(producer_id, *_TXN_OPEN.unpack(bytes(value))))
        return found

    def every_open_transaction(self, rows_max: int) -> list[tuple[int, int, OpenTransaction]]:
        """Up to `rows_max` open transactions of every partition: (topic_id, partition, transaction)."""
        found: list[tuple[int, int, OpenTransaction]] = []
        for key, value in self._transaction.cursor(db=self._txn_tables[b"txn_open"]):
            if len(found) >= rows_max:
                break
            topic_id, partition, producer_id = _TXN_PARTITION_KEY.unpack(bytes(key))
            found.append((topic_id, partition, OpenTransaction(producer_id, *_TXN_OPEN.unpack(bytes(value)))))
        return found

    def last_stable_offset(self, topic_id: int, partition: int, log_end_offset: int, rows_max: int) -> int:
        """The partition's last stable offset: the first offset of its oldest open transaction, else its
        log end (Kafka's LSO: a read_committed consumer reads below it)."""
        opened = self.open_transactions(topic_id, partition, rows_max)
        return min([log_end_offset, *(t.first_offset for t in opened)])

    def aborted_transactions(
        self, topic_id: int, partition: int, from_offset: int, to_offset: int, rows_max: int
    ) -> list[AbortedTransaction]:
        """The aborted transactions with records in [from_offset, to_offset): those whose marker is at
        or after `from_offset` and whose first offset is before `to_offset`, ordered by marker offset;
        at most `rows_max` rows are looked at (a fetch's bound)."""
        prefix = _PARTITION.pack(topic_id, partition)
        found: list[AbortedTransaction] = []
        cursor = self._transaction.cursor(db=self._txn_tables[b"txn_aborted"])
        if not cursor.set_range(_ABORTED_KEY.pack(topic_id, partition, max(from_offset, 0), 0)):
            return found
        for looked, (key, value) in enumerate(cursor):
            if bytes(key[: len(prefix)]) != prefix or looked >= rows_max:
                break
            _, _, last_offset, producer_id = _ABORTED_KEY.unpack(bytes(key))
            first_offset = _ABORTED.unpack(bytes(value))[0]
            if first_offset < to_offset:
                found.append(AbortedTransaction(producer_id, first_offset, last_offset))
        return found

    def pending_offsets(self, producer_id: int, rows_max: int) -> list[PendingOffset]:
        """Up to `rows_max` offsets the producer's open transaction committed for consumer groups."""
        prefix = _U64.pack(producer_id)
        found: list[PendingOffset] = []
        cursor = self._transaction.cursor(db=self._txn_tables[b"txn_offsets"])
        if not cursor.set_range(prefix):
            return found
        for raw_key, value in cursor:
            key = bytes(raw_key)
            if key[: len(prefix)] != prefix or len(found) >= rows_max:
                break
            length = _U16.unpack_from(key, 8)[0]
            group = key[10 : 10 + length].decode()
            topic_id, partition = _OFFSET_TAIL.unpack_from(key, 10 + length)
            raw = bytes(value)
            offset, commit_time_ms = _PENDING_OFFSET.unpack_from(raw)
            details = decode_offset_details(raw[_PENDING_OFFSET.size :])
            found.append(PendingOffset(group, topic_id, partition, offset, commit_time_ms, details))
        return found


class TransactionWrites(TransactionReads):
    """Writes of the transaction rows (a mixin of StoreWriter), each inside an applied entry's transaction."""

    def put_transaction_state(self, transactional_id: str, state: bytes) -> None:
        """Stores a transactional id's state."""
        self._transaction.put(transactional_id.encode(), state, db=self._txn_tables[b"transactions"])

    def open_transaction_at(self, topic_id: int, partition: int, opened: OpenTransaction) -> None:
        """Records the producer's transaction as open in the partition from `opened.first_offset`."""
        key = _TXN_PARTITION_KEY.pack(topic_id, partition, opened.producer_id)
        value = _TXN_OPEN.pack(opened.first_offset, opened.opened_ms, opened.producer_epoch)
        self._transaction.put(key, value, db=self._txn_tables[b"txn_open"])

    def close_transaction(self, topic_id: int, partition: int, producer_id: int) -> None:
        """Forgets the producer's open transaction in the partition (its marker is written)."""
        key = _TXN_PARTITION_KEY.pack(topic_id, partition, producer_id)
        self._transaction.delete(key, db=self._txn_tables[b"txn_open"])

    def add_aborted_transaction(self, topic_id: int, partition: int, aborted: AbortedTransaction) -> None:
        """Records the offsets of an aborted transaction in the partition."""
        key = _ABORTED_KEY.pack(topic_id, partition, aborted.last_offset, aborted.producer_id)
        self._transaction.put(key, _ABORTED.pack(aborted.first_offset), db=self._txn_tables[b"txn_aborted"])

    def trim_aborted_transactions(
        self, topic_id: int, partition: int, log_start_offset: int, rows_max: int
    ) -> None:
        """Deletes at most `rows_max` aborted ranges whose marker is below the log start (nothing left
        to filter), oldest first."""
        prefix = _PARTITION.pack(topic_id, partition)
        cursor = self._transaction.cursor(db=self._txn_tables[b"txn_aborted"])
        deleted = 0
        if not cursor.set_range(prefix):
            return
        while deleted < rows_max and bytes(cursor.key()[: len(prefix)]) == prefix:
            if _ABORTED_KEY.unpack(bytes(cursor.key()))[2] >= log_start_offset:
                return
            deleted += 1
            if not cursor.delete():
                return

    def put_pending_offset(self, producer_id: int, pending: PendingOffset) -> None:
        """Stores an offset the producer's transaction commits for a consumer group, until its marker."""
        key = _pending_key(producer_id, pending.group, pending.topic_id, pending.partition)
        value = _PENDING_OFFSET.pack(pending.offset, pending.commit_time_ms) + encode_offset_details(
            pending.details
        )
        self._transaction.put(key, value, db=self._txn_tables[b"txn_offsets"])

    def delete_pending_offsets(self, producer_id: int, pending: list[PendingOffset]) -> None:
        """Forgets the producer's pending offsets named (committed or dropped by its marker)."""
        for row in pending:
            key = _pending_key(producer_id, row.group, row.topic_id, row.partition)
            self._transaction.delete(key, db=self._txn_tables[b"txn_offsets"])
