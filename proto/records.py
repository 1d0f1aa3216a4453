"""Kafka's RecordBatch v2, the one record-batch format of kq: what a producer sends (over gRPC or the
Kafka protocol), what a Raft entry carries, what LMDB stores and what a fetch returns.

Layout (https://kafka.apache.org/documentation/#recordbatch; integers big-endian, positions in bytes
from the start of the batch):

     0  baseOffset            int64   offset of the first record: producers send 0, the leader stamps it
     8  batchLength           int32   bytes after this field: the batch is 12 + batchLength bytes
    12  partitionLeaderEpoch  int32   producers send -1; kq stores what was sent
    16  magic                 int8    2 (at the same place in Kafka's older message formats, which kq refuses)
    17  crc                   uint32  CRC32C (Castagnoli) of bytes 21 to the end: not of the three fields
                                      above, so stamping the base offset keeps it valid
    21  attributes            int16   bits 0-2 compression (proto/compression.py: 0 none, 1 gzip,
                                      2 snappy, 3 lz4, 4 zstd), bit 3 timestamp type (0 CreateTime,
                                      1 LogAppendTime), bit 4 transactional, bit 5 control; kq refuses
                                      transactional and control batches and any higher bit
    23  lastOffsetDelta       int32   record count - 1
    27  baseTimestamp         int64   the first record's timestamp (-1: none)
    35  maxTimestamp          int64   the largest record timestamp; for LogAppendTime, every record's
    43  producerId            int64   -1: not idempotent
    51  producerEpoch         int16   -1 when not idempotent
    53  baseSequence          int32   the first record's sequence (-1 when not idempotent); record i has
                                      baseSequence + i, wrapping from 2**31 - 1 to 0 (next_sequence)
    57  recordsCount          int32
    61  records               the records; when compressed, everything from here on is one compressed
                              stream of them

Each record ("varint" is a zigzag-encoded LEB128 int32 of at most 5 bytes, "varlong" an int64 of at
most 10):

    length          varint   bytes of the record after this field
    attributes      int8     unused (Kafka ignores it, and so does kq)
    timestampDelta  varlong  the record's timestamp - baseTimestamp
    offsetDelta     varint   the record's offset - baseOffset: record i says i
    keyLength       varint   -1: a null key
    key             keyLength bytes
    valueLength     varint   -1: a null value
    value           valueLength bytes
    headersCount    varint
    headers         per header: keyLength varint, key (UTF-8), valueLength varint (-1: null), value

`check_batch` is the one validation of a batch: the gRPC edge, the Kafka listener and `apply` (through
raft/validation.py `append_problem`) all run it, so it is pure, deterministic, and bounded in time
and memory for any input: a compressed batch is expanded at most to a bound, and every record is
walked once. `parse_batch` decodes what `check_batch` accepts, with the same checks.

The codec is written here by hand (struct and a zigzag varint walk): kio's record readers, chosen by
the project for Kafka's protocol schemas, truncate timestamps to whole seconds and know no
compression, and kq needs millisecond timestamps and all of Kafka's codecs on both sides.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

import crc32c as crc32c_module

from kq.proto.compression import CODEC_NAMES, NONE, CompressionError, compress, decompress
from kq.proto.limits import (
    APPEND_BYTES_MAX,
    ARRAY_WALK_RECORDS_MIN,
    HEADER_NAME_BYTES_MAX,
    HEADERS_PER_BATCH_MAX,
    HEADERS_PER_RECORD_MAX,
    RECORD_BYTES_MAX,
    RECORDS_PER_APPEND_MAX,
    WORK_BYTES_PER_UNIT,
    WORK_PER_APPEND,
    WORK_PER_HEADER,
    WORK_PER_RECORD,
)

_HEADER = struct.Struct(">qiibIhiqqqhii")  # Every field from baseOffset to recordsCount.
# `BatchHeader` from the unpacked fields, as its `_make` does without the length check: the format has
# exactly its fields.
_new_header = tuple.__new__
_BEFORE_CRC = struct.Struct(">qiibI")  # baseOffset, batchLength, partitionLeaderEpoch, magic, crc.
_FROM_CRC = struct.Struct(">hiqqqhii")  # attributes .. recordsCount: the start of what the CRC covers.
_BASE_OFFSET = struct.Struct(">q")
BATCH_HEADER_BYTES = 61
LENGTH_PREFIX_BYTES = 12  # baseOffset and batchLength: what batchLength does not count.
CRC_START = 21  # The CRC covers the batch from its attributes on.
MAGIC = 2

COMPRESSION_MASK = 0x07
LOG_APPEND_TIME_FLAG = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
_KNOWN_ATTRIBUTES = COMPRESSION_MASK | LOG_APPEND_TIME_FLAG | TRANSACTIONAL_FLAG | CONTROL_FLAG

NO_TIMESTAMP = -1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
SEQUENCE_MODULUS = 2**31  # Sequences are the non-negative int32s, wrapping (Kafka's incrementSequence).
INT64_MAX = 2**63 - 1
VARINT_BYTES_MAX = 5
VARLONG_BYTES_MAX = 10
# attributes, then five one-byte varints (timestampDelta, offsetDelta, keyLength, valueLength, headersCount).
RECORD_BYTES_MIN = 6
_MINUS_ONE = b"\x01"  # -1 as a zigzag varint: a null key, value or header value.
_UNMETERED = 2**62  # The budget of a check without a meter: the limits alone bound it.
_TABLED_VARINTS = 8192  # Non-negative values below this (one or two bytes) are encoded from a table.


class MalformedBatchError(ValueError):
    """A batch that does not follow the layout or a limit; the one-line message says where."""


class WorkBudgetError(MalformedBatchError):
    """Checking a batch would take more than what is left of its meter's work budget."""


class WorkMeter:
    """The work `check_batch` does, counted in proto/limits.py's WORK_* units and held within `limit`.

    Apply gives every append entry one meter of ENTRY_WORK_MAX and checks the entry's batches against
    it in order, so one entry's apply is bounded whatever its batches hold; the edge checks each batch
    against a fresh meter and hands its `spent` to the batcher, which packs entries within the same
    budget, so an entry the edge built never runs out. The count is a pure function of the bytes
    checked, hence the same on every replica. A batch is charged before each step (its records and
    bytes before the CRC, its expanded bytes before they are expanded, its headers before they are
    walked), so the budget stops the work instead of noticing it afterwards; a batch that fails its
    check keeps what it was charged.
    """

    __slots__ = ("limit", "spent")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.spent = 0

    @property
    def remaining(self) -> int:
        """Units left to spend."""
        return self.limit - self.spent

    def charge(self, units: int, what: str) -> None:
        """Spends `units` on `what`; raises WorkBudgetError (spending nothing) when they do not fit."""
        if units > self.remaining:
            raise WorkBudgetError(
                f"{what} needs {units} work units; {self.remaining} of the entry's {self.limit} are left"
            )
        self.spent += units


class BatchHeader(NamedTuple):
    """The 61-byte header of a RecordBatch v2, field by field (names as in the layout, units last).

    A NamedTuple, built straight from the unpacked fields (`_new_header`): every produce request reads
    it several times on every node, and a frozen dataclass's constructor cost 2.2 µs against 0.45."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp_ms: int
    max_timestamp_ms: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def compression(self) -> int:
        """The codec of the records (proto/compression.py), from attribute bits 0-2."""
        return self.attributes & COMPRESSION_MASK

    @property
    def log_append_time(self) -> bool:
        """Whether every record's timestamp is maxTimestamp (LogAppendTime) rather than its own."""
        return bool(self.attributes & LOG_APPEND_TIME_FLAG)

    @property
    def is_transactional(self) -> bool:
        """Whether the batch belongs to a transaction (its records count once its marker commits it)."""
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        """Whether the batch is a transaction marker (written by apply alone: a producer's is refused)."""
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def total_bytes(self) -> int:
        """The whole batch's size: baseOffset and batchLength, then batchLength bytes."""
        return LENGTH_PREFIX_BYTES + self.batch_length


@dataclass(frozen=True, slots=True)
class WireRecord:
    """One record of a batch, decoded."""

    offset_delta: int  # The record's offset minus the batch's base offset.
    timestamp_ms: int  # Absolute; for a LogAppendTime batch, the batch's maxTimestamp. -1: none.
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]  # A null header value reads as b"".
    size_bytes: int  # Key + value + header names and values: what RECORD_BYTES_MAX counts.


R = TypeVar("R")
# Builds a reader's own record from WireRecord's fields, in their order (`parse_batch_as`).
RecordBuilder = Callable[[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes], ...], int], R]
_Decoding = tuple[list[Any], Callable[..., Any]]  # The records built so far, and their builder.


@dataclass(frozen=True, slots=True)
class NewRecord:
    """A record to encode; a None timestamp gets the encoder's clock (CreateTime, as Kafka clients do)."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None


# Reading ------------------------------------------------------------------------------------------


def read_header(data: bytes | memoryview) -> BatchHeader:
    """The header of `data`, which must be exactly one batch; raises MalformedBatchError.

    Only the header is checked (length, magic, batchLength against len(data)): `check_batch` checks
    the rest.
    """
    header = _unpack_header(data, 0, len(data))
    if header.total_bytes != len(data):
        raise MalformedBatchError(f"batchLength says {header.total_bytes} bytes; the batch has {len(data)}")
    return header


def crc_matches(data: bytes | memoryview) -> bool:
    """Whether one batch's CRC32C matches its bytes (False for a header that does not parse): how the
    Kafka edge tells a corrupt batch (Kafka's CORRUPT_MESSAGE) from an invalid one, once refused."""
    try:
        header = read_header(data)
    except MalformedBatchError:
        return False
    return bool(crc32c_module.crc32c(memoryview(data)[CRC_START:]) == header.crc)


def _unpack_header(data: bytes | memoryview, position: int, end: int) -> BatchHeader:
    """The header at `position`, checked for its length, magic and the smallest batchLength."""
    if end - position < BATCH_HEADER_BYTES:
        raise MalformedBatchError(f"{end - position} bytes: less than a {BATCH_HEADER_BYTES}-byte header")
    header = _new_header(BatchHeader, _HEADER.unpack_from(data, position))
    if header.magic != MAGIC:
        raise MalformedBatchError(f"magic byte {header.magic}: kq reads only RecordBatch v2 (magic 2)")
    if header.total_bytes < BATCH_HEADER_BYTES:
        raise MalformedBatchError(f"batchLength {header.batch_length} is shorter than the header")
    return header


def split_batches(data: bytes | memoryview) -> list[memoryview]:
    """The batches of a Kafka `records` field (batches back to back), each exactly one batch.

    Each batch's magic and batchLength are checked, and the last one must end exactly at the end of
    `data` (Kafka's producers never send a partial batch); `check_batch` checks each one's content.
    """
    view = memoryview(data)
    batches: list[memoryview] = []
    position = 0
    while position < len(view):
        try:
            header = _unpack_header(view, position, len(view))
        except MalformedBatchError as error:
            raise MalformedBatchError(f"batch {len(batches)}: {error}") from None
        end = position + header.total_bytes
        if end > len(view):
            remain = len(view) - position
            raise MalformedBatchError(
                f"batch {len(batches)}: batchLength says {header.total_bytes} bytes; {remain} remain"
            )
        batches.append(view[position:end])
        position = end
    return batches


def check_batch(
    data: bytes | memoryview,
    records_max: int,
    headers_max: int,
    record_bytes_max: int,
    header_name_bytes_max: int,
    expanded_bytes_max: int,
    meter: WorkMeter | None = None,
) -> BatchHeader:
    """Checks that `data` is exactly one whole, valid batch kq may store; returns its header.

    Checked: magic 2; the CRC32C; no control batch (markers are written by apply), a transactional one
    only with a producer id, and no unknown attribute bit; a
    known codec, expanded within `expanded_bytes_max` (a bomb is refused before it is expanded in
    full); 1 to `records_max` records, as many as the header says, lastOffsetDelta = count - 1;
    timestamps and producer fields in range; then every record walked once: lengths consistent,
    varints at most 5 (int32) or 10 (int64) bytes, record i's offsetDelta = i, header names UTF-8
    within `header_name_bytes_max`, at most `headers_max` of them a record (and HEADERS_PER_BATCH_MAX
    in the batch), key + value + headers within `record_bytes_max`, no byte left over. maxTimestamp
    need not be the largest record timestamp (clients differ). Raises MalformedBatchError with a
    one-line reason naming the record.

    With a `meter`, the work is charged to it as it is done (WorkMeter), and WorkBudgetError stops
    the check when the budget is spent; without one the check is bounded by the limits alone.
    """
    meter = WorkMeter(_UNMETERED) if meter is None else meter
    limits = (headers_max, record_bytes_max, header_name_bytes_max)
    return _read(data, meter, False, records_max, limits, expanded_bytes_max)[0]


def parse_batch(
    data: bytes | memoryview,
    *,
    records_max: int = RECORDS_PER_APPEND_MAX,
    headers_max: int = HEADERS_PER_RECORD_MAX,
    record_bytes_max: int = RECORD_BYTES_MAX,
    header_name_bytes_max: int = HEADER_NAME_BYTES_MAX,
    expanded_bytes_max: int = APPEND_BYTES_MAX,
    meter: WorkMeter | None = None,
) -> list[WireRecord]:
    """Every record of one batch, decoded after the same checks as `check_batch` (the CRC included),
    except that the batch may be compacted (`compacted_batch`): fewer records than its offsets span.

    The defaults are the limits every stored batch passed, so a stored or served batch parses with
    them. A `meter` is charged as `check_batch` charges (what the compactor packs its entries by).
    Raises MalformedBatchError naming the record.
    """
    limits = (headers_max, record_bytes_max, header_name_bytes_max)
    return _parsed(data, WireRecord, records_max, limits, expanded_bytes_max, meter)


def parse_batch_as(data: bytes | memoryview, build: RecordBuilder[R]) -> list[R]:
    """`parse_batch` of a stored or served batch (the default limits), each record built by
    `build(offset_delta, timestamp_ms, key, value, headers, size_bytes)` (WireRecord's fields) as it
    is walked: a reader that wants its own record type (the client's ConsumerRecord) builds one
    object a record instead of two."""
    limits = (HEADERS_PER_RECORD_MAX, RECORD_BYTES_MAX, HEADER_NAME_BYTES_MAX)
    return _parsed(data, build, RECORDS_PER_APPEND_MAX, limits, APPEND_BYTES_MAX, None)


def checked_records(data: bytes | memoryview) -> tuple[BatchHeader, bytes | memoryview, int, int]:
    """A stored or served batch's header, checked as `parse_batch_as` checks it (the CRC included), and
    where its records are: (header, buffer, start, end), in `data` or what they expanded to.

    For a reader that walks the records itself (the Spark source's Arrow columns, spark/columns.py):
    it must check each record as `_walk_record` does, or leave the batch to `parse_batch_as`."""
    return _checked_region(data, WorkMeter(_UNMETERED), True, RECORDS_PER_APPEND_MAX, APPEND_BYTES_MAX)


def _parsed(
    data: bytes | memoryview,
    build: RecordBuilder[R],
    records_max: int,
    limits: tuple[int, int, int],
    expanded_bytes_max: int,
    meter: WorkMeter | None,
) -> list[R]:
    decoded: list[R] = []
    meter = WorkMeter(_UNMETERED) if meter is None else meter
    _read(data, meter, True, records_max, limits, expanded_bytes_max, decoded=(decoded, build))
    return decoded


def _read(
    data: bytes | memoryview,
    meter: WorkMeter,
    sparse: bool,
    records_max: int,
    limits: tuple[int, int, int],
    expanded_bytes_max: int,
    *,
    decoded: _Decoding | None = None,
    spans: list[tuple[int, int, int]] | None = None,
) -> tuple[BatchHeader, bytes | memoryview]:
    """Checks a batch whole, charging `meter` before each step (WorkMeter); returns its header and the
    buffer its records are in (`data`, or what they expanded to). `_walk` fills `decoded` (a list and
    the builder of its records) and `spans`.
    """
    header, records, start, end = _checked_region(data, meter, sparse, records_max, expanded_bytes_max)
    _walk(records, start, end, header, limits, meter, decoded=decoded, spans=spans)
    return header, records


def _checked_region(
    data: bytes | memoryview, meter: WorkMeter, sparse: bool, records_max: int, expanded_bytes_max: int
) -> tuple[BatchHeader, bytes | memoryview, int, int]:
    """A batch's checks before its records are walked, charging `meter` before each step: its header,
    and (buffer, start, end) of its records, in `data` or what they expanded to."""
    meter.charge(WORK_PER_APPEND, "an append")
    header = read_header(data)
    meter.charge(header.record_count * WORK_PER_RECORD + len(data) // WORK_BYTES_PER_UNIT, "the batch")
    _check_header(header, data, records_max, sparse)
    records, start, end = _records_region(data, header, expanded_bytes_max, meter)
    return header, records, start, end


def _check_header(
    header: BatchHeader, data: bytes | memoryview, records_max: int, sparse: bool = False
) -> None:
    """Everything about a batch its header alone decides (the CRC covers the rest).

    `sparse` admits a compacted batch: 1 to lastOffsetDelta + 1 records (a producer's batch holds
    exactly lastOffsetDelta + 1).
    """
    computed = crc32c_module.crc32c(memoryview(data)[CRC_START:])
    if computed != header.crc:
        raise MalformedBatchError(
            f"CRC32C mismatch: the header says {header.crc:#010x}, the bytes {computed:#010x}"
        )
    unknown = header.attributes & ~_KNOWN_ATTRIBUTES & 0xFFFF
    if unknown:
        raise MalformedBatchError(f"unknown attribute bits {unknown:#06x}")
    if header.is_control and not sparse:  # A producer's batch: markers are the coordinator's alone.
        raise MalformedBatchError("a control batch: only the transaction coordinator writes markers")
    if header.is_transactional and header.producer_id == NO_PRODUCER_ID:
        raise MalformedBatchError("a transactional batch without a producer id")
    if header.compression not in CODEC_NAMES:
        raise MalformedBatchError(f"unknown compression codec {header.compression}")
    if not 0 < header.record_count <= records_max:
        raise MalformedBatchError(f"{header.record_count} records; a batch holds 1 to {records_max}")
    if sparse and header.record_count - 1 <= header.last_offset_delta < records_max:
        pass  # A compacted batch: its records' offsetDeltas rise within [0, lastOffsetDelta] (_walk).
    elif header.last_offset_delta != header.record_count - 1:
        raise MalformedBatchError(
            f"lastOffsetDelta {header.last_offset_delta} with {header.record_count} records"
            f" (must be {header.record_count - 1})"
        )
    if header.base_timestamp_ms < NO_TIMESTAMP or header.max_timestamp_ms < NO_TIMESTAMP:
        raise MalformedBatchError("a negative baseTimestamp or maxTimestamp other than -1")
    if header.producer_id < NO_PRODUCER_ID:
        raise MalformedBatchError(f"producer id {header.producer_id} (-1 means none)")
    if header.producer_id != NO_PRODUCER_ID and (
        header.producer_epoch < 0 or (header.base_sequence < 0 and not header.is_control)
    ):
        raise MalformedBatchError(
            f"idempotent batch (producer id {header.producer_id}) with epoch {header.producer_epoch}"
            f" and base sequence {header.base_sequence}: both must be >= 0"
        )


def _records_region(
    data: bytes | memoryview, header: BatchHeader, expanded_bytes_max: int, meter: WorkMeter
) -> tuple[bytes | memoryview, int, int]:
    """(buffer, start, end) of the records: in `data` itself, or expanded within the bound.

    A compressed batch's expanded bytes are charged to `meter`: it is expanded at most to what the
    meter has left, so a bomb costs no more than the budget, then charged what it expanded to.
    """
    codec = header.compression
    if codec == NONE:
        if len(data) - BATCH_HEADER_BYTES > expanded_bytes_max:
            size_bytes = len(data) - BATCH_HEADER_BYTES
            raise MalformedBatchError(f"records of {size_bytes} bytes exceed {expanded_bytes_max}")
        return data, BATCH_HEADER_BYTES, len(data)
    affordable_bytes = (meter.remaining + 1) * WORK_BYTES_PER_UNIT - 1  # Those whose charge fits.
    bound_bytes = min(expanded_bytes_max, affordable_bytes)
    try:
        expanded = decompress(memoryview(data)[BATCH_HEADER_BYTES:], codec, bound_bytes)
    except CompressionError as error:
        if bound_bytes < expanded_bytes_max:
            raise WorkBudgetError(
                f"{CODEC_NAMES[codec]} records expand beyond the {bound_bytes} bytes the entry's work"
                f" budget has left (or are corrupt: {error})"
            ) from None
        raise MalformedBatchError(f"{CODEC_NAMES[codec]} records: {error}") from None
    meter.charge(len(expanded) // WORK_BYTES_PER_UNIT, "the expanded records")
    return expanded, 0, len(expanded)


def _walk(
    buffer: bytes | memoryview,
    position: int,
    end: int,
    header: BatchHeader,
    limits: tuple[int, int, int],
    meter: WorkMeter,
    *,
    decoded: _Decoding | None = None,
    spans: list[tuple[int, int, int]] | None = None,
) -> None:
    """Walks every record once (building each into `decoded`, and its (offsetDelta, start, stop) in
    `buffer` into `spans`, when given); raises MalformedBatchError.

    Records' offsetDeltas rise within [0, lastOffsetDelta]: with as many records as the offsets
    (`_check_header` for a producer's batch), record i's is i; a compacted batch has gaps.

    The batch's headers together are at most HEADERS_PER_BATCH_MAX: a header can be two bytes, so
    without it the 3 MiB a batch may expand to could hold 1.5 million of them, seconds of walking.
    They are also at most what `meter` has left, and are charged to it once walked (records and
    bytes were charged before).

    A check only (nothing decoded, no spans) of at least ARRAY_WALK_RECORDS_MIN records is first
    tried as arrays (proto/arrays.py): when every record passes there, it passes here too, with no
    header to charge; otherwise the walk below decides.
    """
    append_time_ms = header.max_timestamp_ms if header.log_append_time else None
    if decoded is None and spans is None and header.record_count >= ARRAY_WALK_RECORDS_MIN:
        from kq.proto import arrays  # numpy: loaded by the node at start, so never first in apply.

        region = memoryview(buffer)[position:end]  # Walked as it is: no copy (arrays.py `_varints`).
        shapes = [arrays.BatchShape.of(header)]
        if arrays.walk_records(region, shapes, [end - position], limits[1]) is not None:
            return
    affordable = meter.remaining // WORK_PER_HEADER
    headers_left = headers_allowed = min(HEADERS_PER_BATCH_MAX, affordable)
    dense = header.record_count == header.last_offset_delta + 1
    last_offset_delta, base_timestamp_ms = header.last_offset_delta, header.base_timestamp_ms
    offset_delta = -1
    try:
        for index in range(header.record_count):
            try:
                start = position
                position, header_count, offset_delta = _walk_record(
                    buffer,
                    position,
                    end,
                    index if dense else offset_delta + 1,
                    index if dense else last_offset_delta,
                    base_timestamp_ms,
                    append_time_ms,
                    headers_left,
                    limits,
                    decoded,
                )
                if spans is not None:
                    spans.append((offset_delta, start, position))
            except _HeadersOverError:
                if affordable < HEADERS_PER_BATCH_MAX:
                    raise WorkBudgetError(
                        f"record {index}: more headers than the {affordable} the entry's work budget has left"
                    ) from None
                raise MalformedBatchError(
                    f"record {index}: more than {HEADERS_PER_BATCH_MAX} headers in the batch"
                ) from None
            except MalformedBatchError as error:
                raise MalformedBatchError(f"record {index}: {error}") from None
            headers_left -= header_count
    finally:  # The headers of the records walked whole; a failing record's (HEADERS_PER_RECORD_MAX) go free.
        meter.charge((headers_allowed - headers_left) * WORK_PER_HEADER, "the headers")
    if position != end:
        raise MalformedBatchError(f"{end - position} bytes after the last of {header.record_count} records")


def _walk_record(  # noqa: PLR0915 - inline on purpose: see the docstring.
    buffer: bytes | memoryview,
    position: int,
    end: int,
    lowest: int,
    highest: int,
    base_timestamp_ms: int,
    append_time_ms: int | None,
    headers_left: int,
    limits: tuple[int, int, int],
    decoded: _Decoding | None,
) -> tuple[int, int, int]:
    """Checks (and decodes) the record at `position`: (the position after it, its header count, its
    offsetDelta).

    `lowest` and `highest` bound the record's offsetDelta (both its index in a producer's batch);
    then the batch's baseTimestamp, its LogAppendTime (None: CreateTime) and how many headers the
    batch may still hold.

    This runs for every record of every batch, at the edge and in apply on every node, and for every
    record a client reads, so varints of one and two bytes (nearly all of them: lengths below 8 KiB)
    are read inline and `_varint` reads the others, and the value's length is checked here rather
    than by `_blob`. A call per field cost a third of the walk.
    """
    headers_max, record_bytes_max, header_name_bytes_max = limits
    if position < end and (byte := buffer[position]) < 0x80:
        length, position = (byte >> 1) ^ -(byte & 1), position + 1
    elif position + 1 < end and (high := buffer[position + 1]) < 0x80:
        raw = (byte & 0x7F) | (high << 7)
        length, position = (raw >> 1) ^ -(raw & 1), position + 2
    else:
        length, position = _varint(buffer, position, end, VARINT_BYTES_MAX)
    stop = position + length
    if length < RECORD_BYTES_MIN or stop > end:
        raise MalformedBatchError(f"length {length} is shorter than a record or runs past the records")
    position += 1  # The record's attributes: unused. The length leaves at least five bytes after them.
    if (byte := buffer[position]) < 0x80:
        timestamp_delta, position = (byte >> 1) ^ -(byte & 1), position + 1
    elif position + 1 < stop and (high := buffer[position + 1]) < 0x80:
        raw = (byte & 0x7F) | (high << 7)
        timestamp_delta, position = (raw >> 1) ^ -(raw & 1), position + 2
    else:
        timestamp_delta, position = _varint(buffer, position, stop, VARLONG_BYTES_MAX)
    if position < stop and (byte := buffer[position]) < 0x80:
        offset_delta, position = (byte >> 1) ^ -(byte & 1), position + 1
    elif position + 1 < stop and (high := buffer[position + 1]) < 0x80:  # Records 64 to 8191 of a batch.
        raw = (byte & 0x7F) | (high << 7)
        offset_delta, position = (raw >> 1) ^ -(raw & 1), position + 2
    else:
        offset_delta, position = _varint(buffer, position, stop, VARINT_BYTES_MAX)
    if not lowest <= offset_delta <= highest:
        must = f"must be {lowest}" if lowest == highest else f"must be in [{lowest}, {highest}]"
        raise MalformedBatchError(f"offsetDelta {offset_delta} ({must})")
    timestamp_ms = base_timestamp_ms + timestamp_delta if append_time_ms is None else append_time_ms
    if not NO_TIMESTAMP <= timestamp_ms <= INT64_MAX:
        raise MalformedBatchError(f"timestamp {timestamp_ms} is negative (other than -1) or past int64")
    key_start, key_length, position = _blob(buffer, position, stop, "key")
    # The value: as `_blob`, inline, two-byte lengths (64 to 8191 bytes) too.
    if position < stop and (byte := buffer[position]) < 0x80:
        value_length, position = (byte >> 1) ^ -(byte & 1), position + 1
    elif position + 1 < stop and (high := buffer[position + 1]) < 0x80:
        raw = (byte & 0x7F) | (high << 7)
        value_length, position = (raw >> 1) ^ -(raw & 1), position + 2
    else:
        value_length, position = _varint(buffer, position, stop, VARINT_BYTES_MAX)
    if value_length < -1 or position + value_length > stop:
        raise MalformedBatchError(f"value length {value_length} is below -1 or runs past the record")
    value_start = position
    if value_length > 0:
        position += value_length
    if position < stop and (byte := buffer[position]) < 0x80:
        header_count, position = (byte >> 1) ^ -(byte & 1), position + 1
    else:
        header_count, position = _varint(buffer, position, stop, VARINT_BYTES_MAX)
    if not 0 <= header_count <= headers_max:
        raise MalformedBatchError(f"{header_count} headers; a record has 0 to {headers_max}")
    if header_count > headers_left:
        raise _HeadersOverError
    size_bytes = (key_length if key_length > 0 else 0) + (value_length if value_length > 0 else 0)
    headers: list[tuple[str, bytes]] | None = None
    if header_count:
        headers = [] if decoded is not None else None
        position, headers_bytes = _walk_headers(
            buffer, position, stop, header_count, header_name_bytes_max, headers
        )
        size_bytes += headers_bytes
    if position != stop:
        raise MalformedBatchError(f"its fields take {position - stop + length} bytes; its length is {length}")
    if size_bytes > record_bytes_max:
        raise MalformedBatchError(
            f"{size_bytes} bytes of key, value and headers; the limit is {record_bytes_max}"
        )
    if decoded is not None:
        key = None if key_length < 0 else bytes(buffer[key_start : key_start + key_length])
        value = None if value_length < 0 else bytes(buffer[value_start : value_start + value_length])
        records, build = decoded
        fields = tuple(headers) if headers else ()
        records.append(build(offset_delta, timestamp_ms, key, value, fields, size_bytes))
    return stop, header_count, offset_delta


class _HeadersOverError(MalformedBatchError):
    """A record's headers are more than the batch may still hold (`_walk` says which bound)."""


def _walk_headers(
    buffer: bytes | memoryview,
    position: int,
    stop: int,
    count: int,
    name_bytes_max: int,
    headers: list[tuple[str, bytes]] | None,
) -> tuple[int, int]:
    """Checks (and decodes into `headers`) a record's headers: (position after them, their bytes)."""
    size_bytes = 0
    for _ in range(count):
        name_length, position = _varint(buffer, position, stop, VARINT_BYTES_MAX)
        if not 0 <= name_length <= name_bytes_max or position + name_length > stop:
            raise MalformedBatchError(
                f"header name of {name_length} bytes (0 to {name_bytes_max}, within the record)"
            )
        try:
            name = str(buffer[position : position + name_length], "utf-8")
        except UnicodeDecodeError:
            raise MalformedBatchError("a header name is not UTF-8") from None
        value_start, value_length, position = _blob(buffer, position + name_length, stop, "header value")
        value_length = value_length if value_length > 0 else 0
        size_bytes += name_length + value_length
        if headers is not None:
            headers.append((name, bytes(buffer[value_start : value_start + value_length])))
    return position, size_bytes


def _blob(buffer: bytes | memoryview, position: int, stop: int, what: str) -> tuple[int, int, int]:
    """A length-prefixed key, value or header value: (its start, its length (-1: null), position after)."""
    if position < stop and (byte := buffer[position]) < 0x80:
        length, position = (byte >> 1) ^ -(byte & 1), position + 1
    else:
        length, position = _varint(buffer, position, stop, VARINT_BYTES_MAX)
    if length < -1 or position + length > stop:
        raise MalformedBatchError(f"{what} length {length} is below -1 or runs past the record")
    return position, length, position + length if length > 0 else position


def _varint(buffer: bytes | memoryview, position: int, stop: int, bytes_max: int) -> tuple[int, int]:
    """The zigzag varint of at most `bytes_max` bytes at `position` (before `stop`): (value, next position).

    Refuses a varint that runs past `stop`, is longer than `bytes_max` or is outside int32 (5 bytes) or
    int64 (10 bytes); one and two bytes, the common cases, are read first.
    """
    if position < stop:
        byte = buffer[position]
        if byte < 0x80:
            return (byte >> 1) ^ -(byte & 1), position + 1
        if position + 1 < stop and buffer[position + 1] < 0x80:  # Two bytes: lengths of 64 to 8191.
            raw = (byte & 0x7F) | (buffer[position + 1] << 7)
            return (raw >> 1) ^ -(raw & 1), position + 2
    raw, shift, start = 0, 0, position
    while position < stop and position - start < bytes_max:
        byte = buffer[position]
        position += 1
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            if raw >> (32 if bytes_max == VARINT_BYTES_MAX else 64):
                raise MalformedBatchError(f"a varint beyond int{32 if bytes_max == VARINT_BYTES_MAX else 64}")
            return (raw >> 1) ^ -(raw & 1), position
        shift += 7
    if position - start >= bytes_max:
        raise MalformedBatchError(f"a varint longer than {bytes_max} bytes")
    raise MalformedBatchError("cut short inside a varint")


read_varint = _varint  # For a reader that walks records itself (`checked_records`).


# Writing ------------------------------------------------------------------------------------------


def wall_clock_ms() -> int:
    """The wall clock in milliseconds: the CreateTime of records whose producer gave no timestamp."""
    return time.time_ns() // 1_000_000


def encode_batch(
    records: Sequence[NewRecord],
    compression: int = NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    base_timestamp_ms: int | None = None,
) -> bytes:
    """One batch of `records` (base offset 0, partitionLeaderEpoch -1, CreateTime, CRC computed).

    `base_timestamp_ms` is the batch's clock: the timestamp of records that have none, and the
    header's baseTimestamp. None reads the wall clock once for the records without a timestamp and
    takes the first record's timestamp as baseTimestamp (as Kafka's clients do).
    """
    if not records:
        raise ValueError("a batch holds at least one record")
    now_ms = wall_clock_ms() if base_timestamp_ms is None else base_timestamp_ms
    builder = BatchBuilder(base_timestamp_ms)
    for record in records:
        builder.append(record, now_ms)
    return builder.build(compression, producer_id, producer_epoch, base_sequence)


class BatchSource(Protocol):
    """What a batch is sent from (`KqClient.produce_batch`): records encoded, the header still to write,
    with the producer fields of the request (a `BatchBuilder`, or the Spark sink's `EncodedBatch`)."""

    @property
    def record_count(self) -> int:
        """Records in the batch."""
        ...

    def build(
        self,
        compression: int = ...,
        producer_id: int = ...,
        producer_epoch: int = ...,
        base_sequence: int = ...,
    ) -> bytes:
        """The whole batch: header, CRC, records compressed with `compression`."""
        ...


class BatchBuilder:
    """A batch whose records are encoded one at a time, each once, as they are added.

    What the client's Producer fills while a batch lingers: a record's bytes depend on its position
    (offsetDelta) and on the batch's baseTimestamp (the first record's), both known when it is added,
    so `build` only joins them, compresses and writes the header. Not thread-safe.
    """

    __slots__ = ("_base_timestamp_ms", "_encoded", "_max_timestamp_ms")

    def __init__(self, base_timestamp_ms: int | None = None) -> None:
        self._encoded: list[bytes] = []
        self._base_timestamp_ms = base_timestamp_ms  # None: the first record's timestamp.
        self._max_timestamp_ms = NO_TIMESTAMP

    @property
    def record_count(self) -> int:
        """Records added so far."""
        return len(self._encoded)

    def append(self, record: NewRecord, now_ms: int | None = None) -> int:
        """Encodes `record` at the next offsetDelta; returns its encoded size in bytes.

        A record without a timestamp gets `now_ms` (None: the wall clock).
        """
        return self.add(record.key, record.value, record.headers, record.timestamp_ms, now_ms)

    def add(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]],
        timestamp_ms: int | None,
        now_ms: int | None = None,
    ) -> int:
        """`append` of a record given by its fields: what the client's Producer calls for each record
        it is sent, without building a `NewRecord` first (the same bytes)."""
        if timestamp_ms is None:
            timestamp_ms = wall_clock_ms() if now_ms is None else now_ms
        if self._base_timestamp_ms is None:
            self._base_timestamp_ms = timestamp_ms
        self._max_timestamp_ms = max(self._max_timestamp_ms, timestamp_ms)
        delta_ms = timestamp_ms - self._base_timestamp_ms
        encoded = encode_fields(key, value, headers, len(self._encoded), delta_ms)
        self._encoded.append(encoded)
        return len(encoded)

    def build(
        self,
        compression: int = NONE,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        base_sequence: int = NO_SEQUENCE,
    ) -> bytes:
        """The batch of the records added so far (at least one), compressed with `compression`."""
        if not self._encoded or self._base_timestamp_ms is None:
            raise ValueError("a batch holds at least one record")
        return assemble_batch(
            b"".join(self._encoded),
            len(self._encoded),
            self._base_timestamp_ms,
            self._max_timestamp_ms,
            compression,
            producer_id,
            producer_epoch,
            base_sequence,
        )

    def clear(self) -> None:
        """Drops the encoded records (a sent batch no longer holds their memory)."""
        self._encoded.clear()


def assemble_batch(
    records: bytes | memoryview,
    record_count: int,
    base_timestamp_ms: int,
    max_timestamp_ms: int,
    compression: int = NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    attributes: int = 0,
) -> bytes:
    """A batch around already encoded `records` (back to back): compressed, header written, CRC computed.

    `attributes` adds flag bits to the codec's (tests use it to build batches kq must refuse).
    """
    payload = records if compression == NONE else compress(bytes(records), compression)
    tail = _FROM_CRC.pack(
        compression | attributes,
        record_count - 1,
        base_timestamp_ms,
        max_timestamp_ms,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
    )
    crc = crc32c_module.crc32c(payload, crc32c_module.crc32c(tail))
    batch_length = BATCH_HEADER_BYTES - LENGTH_PREFIX_BYTES + len(payload)
    head = _BEFORE_CRC.pack(0, batch_length, NO_PARTITION_LEADER_EPOCH, MAGIC, crc)
    return b"".join((head, tail, payload))


CONTROL_ABORT, CONTROL_COMMIT = 0, 1  # A control record's type (its key's second int16), as Kafka's.
_CONTROL_KEY = struct.Struct(">hh")  # version 0, type
_CONTROL_VALUE = struct.Struct(">hi")  # version 0, coordinator epoch


def control_batch(
    producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, timestamp_ms: int
) -> bytes:
    """A transaction marker as Kafka writes it: one control record (key: version 0 and the type, COMMIT
    or ABORT; value: version 0 and the coordinator's epoch) in a transactional control batch of the
    producer, sequence -1. Pure: apply builds it from the command's fields on every replica alike."""
    key = _CONTROL_KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = _CONTROL_VALUE.pack(0, coordinator_epoch)
    record = encode_record(NewRecord(key=key, value=value, timestamp_ms=timestamp_ms), 0, 0)
    return assemble_batch(
        record,
        1,
        timestamp_ms,
        timestamp_ms,
        NONE,
        producer_id,
        producer_epoch,
        NO_SEQUENCE,
        attributes=TRANSACTIONAL_FLAG | CONTROL_FLAG,
    )


def control_type(key: bytes | None) -> int | None:
    """A control record's type (CONTROL_COMMIT, CONTROL_ABORT, or another Kafka defines), from its key;
    None when the key is not a control key."""
    if key is None or len(key) < _CONTROL_KEY.size:
        return None
    return int(_CONTROL_KEY.unpack_from(key)[1])


def encode_record(record: NewRecord, offset_delta: int, timestamp_delta_ms: int) -> bytes:
    """One record, its length prefix included; batches hold these back to back."""
    return encode_fields(record.key, record.value, record.headers, offset_delta, timestamp_delta_ms)


def encode_fields(
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes]],
    offset_delta: int,
    timestamp_delta_ms: int,
) -> bytes:
    """`encode_record` of a record given by its fields.

    Every record a client sends is encoded here, so the varints of the usual sizes come from a
    table (a loop per varint made encoding three times slower than the struct-based layout before).
    """
    parts = [b"\x00", _varint_bytes(timestamp_delta_ms), _varint_bytes(offset_delta)]
    if key is None:
        parts.append(_MINUS_ONE)
    else:
        parts += (_varint_bytes(len(key)), key)
    if value is None:
        parts.append(_MINUS_ONE)
    else:
        parts += (_varint_bytes(len(value)), value)
    parts.append(_varint_bytes(len(headers)))
    for name, header_value in headers:
        name_bytes = name.encode()
        parts += (_varint_bytes(len(name_bytes)), name_bytes, _varint_bytes(len(header_value)), header_value)
    body = b"".join(parts)
    return _varint_bytes(len(body)) + body


def record_size_max(record: NewRecord) -> int:
    """An upper bound of `record`'s encoded size at any position and timestamp (deltas at their widest).

    What the client's Producer charges a record against its batch and buffer limits before the
    record's position in a batch is known (like Kafka's estimateSizeInBytesUpperBound).
    """
    return fields_size_max(record.key, record.value, record.headers)


def fields_size_max(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]]) -> int:
    """`record_size_max` of a record given by its fields."""
    body = 1 + VARLONG_BYTES_MAX + VARINT_BYTES_MAX
    for blob in (key, value):
        body += 1 if blob is None else _varint_size(len(blob)) + len(blob)
    body += _varint_size(len(headers))
    for name, header_value in headers:
        name_bytes = len(name.encode())
        body += _varint_size(name_bytes) + name_bytes + _varint_size(len(header_value)) + len(header_value)
    return _varint_size(body) + body


def _varint_bytes(value: int) -> bytes:
    """`value` (an int64) as a zigzag LEB128 varint."""
    if 0 <= value < _TABLED_VARINTS:
        return _VARINTS[value]
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def _varint_size(value: int) -> int:
    """Bytes of the zigzag varint of a non-negative `value`."""
    if value < 64:
        return 1
    if value < 8192:
        return 2
    return ((value << 1).bit_length() + 6) // 7


@dataclass(frozen=True, slots=True)
class Compacted:
    """What `compacted_batch` made of a batch."""

    data: bytes | None  # The batch rewritten; None when it kept no record (or when it dropped none).
    records_dropped: int
    records_kept: int


def compacted_batch(data: bytes | memoryview, dropped: Collection[int], meter: WorkMeter) -> Compacted:
    """A stored batch without its records whose offsetDelta is in `dropped` (key compaction): its new
    bytes, or None when it keeps no record (or drops none: nothing to write).

    The records kept are copied byte for byte, so their offsetDeltas, timestamps, keys, values and
    headers stay what they were; the header keeps every field (baseOffset, lastOffsetDelta, the
    timestamps, the producer fields) but the record count, the length and the CRC32C. The result is
    uncompressed: a pure function of the batch's records, the same bytes on every replica whatever
    codec library it runs, and never larger than the records the batch expanded to when appended.

    Apply runs this on every replica: the work is charged to `meter` as `check_batch` charges it,
    before it is done (WorkBudgetError when it does not fit). Raises MalformedBatchError for a batch
    that is not a whole, sound stored one.
    """
    spans: list[tuple[int, int, int]] = []
    limits = (HEADERS_PER_RECORD_MAX, RECORD_BYTES_MAX, HEADER_NAME_BYTES_MAX)
    header, records = _read(data, meter, True, RECORDS_PER_APPEND_MAX, limits, APPEND_BYTES_MAX, spans=spans)
    kept = [(first, stop) for offset_delta, first, stop in spans if offset_delta not in dropped]
    if len(kept) == len(spans) or not kept:
        return Compacted(None, len(spans) - len(kept), len(kept))
    payload = b"".join(bytes(records[first:stop]) for first, stop in kept)
    tail = _FROM_CRC.pack(
        header.attributes & ~COMPRESSION_MASK,
        header.last_offset_delta,
        header.base_timestamp_ms,
        header.max_timestamp_ms,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        len(kept),
    )
    crc = crc32c_module.crc32c(payload, crc32c_module.crc32c(tail))
    batch_length = BATCH_HEADER_BYTES - LENGTH_PREFIX_BYTES + len(payload)
    head = _BEFORE_CRC.pack(header.base_offset, batch_length, header.partition_leader_epoch, MAGIC, crc)
    return Compacted(b"".join((head, tail, payload)), len(spans) - len(kept), len(kept))


def with_base_offset(data: bytes | memoryview, base_offset: int) -> bytes:
    """`data` with its baseOffset set (the first 8 bytes only: the CRC does not cover them)."""
    return _BASE_OFFSET.pack(base_offset) + bytes(data[_BASE_OFFSET.size :])


_ATTRIBUTES = struct.Struct(">h")
_ATTRIBUTES_AT = CRC_START  # attributes are the first field the CRC covers
_MAX_TIMESTAMP = struct.Struct(">q")
_MAX_TIMESTAMP_AT = CRC_START + 2 + 4 + 8  # after attributes, lastOffsetDelta and baseTimestamp
_CRC = struct.Struct(">I")
_CRC_AT = CRC_START - 4


def with_log_append_time(data: bytes | memoryview, timestamp_ms: int) -> bytes:
    """`data` as a LogAppendTime batch stamped `timestamp_ms` (Kafka's broker does this for a topic with
    message.timestamp.type=LogAppendTime): the timestamp-type attribute set, maxTimestamp replaced,
    the CRC32C computed again. Every record then reads as `timestamp_ms`; nothing else changes."""
    stamped = bytearray(data)
    (attributes,) = _ATTRIBUTES.unpack_from(stamped, _ATTRIBUTES_AT)
    _ATTRIBUTES.pack_into(stamped, _ATTRIBUTES_AT, attributes | LOG_APPEND_TIME_FLAG)
    _MAX_TIMESTAMP.pack_into(stamped, _MAX_TIMESTAMP_AT, timestamp_ms)
    _CRC.pack_into(stamped, _CRC_AT, crc32c_module.crc32c(memoryview(stamped)[CRC_START:]))
    return bytes(stamped)


def next_sequence(sequence: int, increment: int) -> int:
    """The sequence `increment` records after `sequence`, wrapping from 2**31 - 1 to 0 like Kafka."""
    return (sequence + increment) % SEQUENCE_MODULUS


def _varint_table() -> tuple[bytes, ...]:
    """The zigzag varints of 0 .. _TABLED_VARINTS - 1 (about 300 KB, built once at import)."""
    table: list[bytes] = []
    for value in range(_TABLED_VARINTS):
        raw, out = value << 1, bytearray()
        while raw >= 0x80:
            out.append((raw & 0x7F) | 0x80)
            raw >>= 7
        out.append(raw)
        table.append(bytes(out))
    return tuple(table)


_VARINTS = _varint_table()
