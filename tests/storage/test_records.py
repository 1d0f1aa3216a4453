"""RecordBatch v2: round trips, every malformed batch refused with its reason, fuzzed and bomb-laden
batches refused in bounded time and memory, and stored batches checked on every read."""

from __future__ import annotations

import struct
import time
import tracemalloc
from collections.abc import Callable

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kq.proto.compression import CODECS, GZIP, LZ4, NONE, SNAPPY, ZSTD, compress, decompress
from kq.proto.limits import (
    APPEND_BYTES_MAX,
    ENTRY_WORK_MAX,
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
from kq.proto.records import (
    BATCH_HEADER_BYTES,
    CONTROL_FLAG,
    LOG_APPEND_TIME_FLAG,
    TRANSACTIONAL_FLAG,
    BatchBuilder,
    MalformedBatchError,
    NewRecord,
    WorkBudgetError,
    WorkMeter,
    check_batch,
    encode_batch,
    encode_record,
    next_sequence,
    parse_batch,
    read_header,
    record_size_max,
    split_batches,
    with_base_offset,
)
from kq.storage import CorruptRecordError
from kq.storage.records import decode_batch, record_count_of, stamp_base_offset

LIMITS = (1_000, 100, 1 << 20, 64, APPEND_BYTES_MAX)  # records, headers, record bytes, name bytes, expanded.
NOW_MS = 1_700_000_000_000

headers = st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=50)), max_size=5).map(tuple)
new_records = st.lists(
    st.builds(
        NewRecord,
        st.none() | st.binary(max_size=100),
        st.none() | st.binary(max_size=500),
        headers,
        st.none() | st.integers(min_value=0, max_value=2**62),
    ),
    min_size=1,
    max_size=20,
)
codecs = st.sampled_from(sorted(CODECS.values()))


def check(data: bytes | memoryview) -> int:
    """check_batch with the test limits; the record count."""
    return check_batch(data, *LIMITS).record_count


def parse(data: bytes | memoryview) -> int:
    """parse_batch with the test limits; the record count."""
    return len(parse_batch(data, records_max=1_000, headers_max=100, header_name_bytes_max=64))


def forge(
    records: bytes,
    count: int,
    *,
    attributes: int = 0,
    last_offset_delta: int | None = None,
    base_timestamp_ms: int = NOW_MS,
    max_timestamp_ms: int = NOW_MS,
    producer: tuple[int, int, int] = (-1, -1, -1),
    magic: int = 2,
) -> bytes:
    """A batch around `records` (already encoded and compressed as `attributes` says), any field forged,
    with a correct CRC32C so that the check reaches the forged part."""
    last = count - 1 if last_offset_delta is None else last_offset_delta
    tail = struct.pack(">hiqqqhii", attributes, last, base_timestamp_ms, max_timestamp_ms, *producer, count)
    crc = crc32c.crc32c(records, crc32c.crc32c(tail))
    head = struct.pack(">qiibI", 0, 49 + len(records), -1, magic, crc)
    return head + tail + records


def raw_record(body: bytes) -> bytes:
    """A record whose body is given byte for byte (the length prefix is computed)."""
    return varint(len(body)) + body


def varint(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def fields(
    record: NewRecord, now_ms: int
) -> tuple[bytes | None, bytes | None, tuple[tuple[str, bytes], ...], int]:
    return (
        record.key,
        record.value,
        record.headers,
        now_ms if record.timestamp_ms is None else record.timestamp_ms,
    )


@given(new_records, codecs, st.data())
def test_round_trip_keeps_every_field(records: list[NewRecord], codec: int, data: st.DataObject) -> None:
    """Encoded records decode to the same fields (absent and empty kept apart), at offsetDelta i."""
    producer_id = data.draw(st.sampled_from([-1, 0, 7, 2**63 - 1]))
    epoch, sequence = (-1, -1) if producer_id == -1 else (data.draw(st.integers(0, 2**15 - 1)), 2**31 - 2)
    batch = encode_batch(records, codec, producer_id, epoch, sequence, base_timestamp_ms=NOW_MS)
    header = check_batch(batch, *LIMITS)
    decoded = parse_batch(batch)
    assert [(r.key, r.value, r.headers, r.timestamp_ms) for r in decoded] == [
        fields(r, NOW_MS) for r in records
    ]
    assert [r.offset_delta for r in decoded] == list(range(len(records)))
    assert (header.record_count, header.last_offset_delta, header.compression) == (
        len(records),
        len(records) - 1,
        codec,
    )
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (producer_id, epoch, sequence)
    assert header.base_timestamp_ms == NOW_MS and header.max_timestamp_ms == max(
        r.timestamp_ms for r in decoded
    )
    assert (
        header.total_bytes == len(batch) and header.base_offset == 0 and header.partition_leader_epoch == -1
    )


def test_records_without_a_timestamp_get_the_encoders_clock() -> None:
    """CreateTime: a record without a timestamp is stamped when encoded, not left for the broker."""
    before = time.time_ns() // 1_000_000
    (decoded,) = parse_batch(encode_batch([NewRecord(None, b"v")]))
    assert before <= decoded.timestamp_ms <= time.time_ns() // 1_000_000


def test_a_log_append_time_batch_gives_every_record_its_max_timestamp() -> None:
    """LogAppendTime: each record's timestamp is the batch's maxTimestamp, whatever its delta says."""
    records = b"".join(encode_record(NewRecord(None, b"v"), i, i * 10) for i in range(3))
    batch = forge(records, 3, attributes=LOG_APPEND_TIME_FLAG, max_timestamp_ms=NOW_MS + 999)
    assert read_header(batch).log_append_time
    assert [r.timestamp_ms for r in parse_batch(batch)] == [NOW_MS + 999] * 3


def test_a_null_header_value_reads_as_empty_bytes() -> None:
    """Kafka allows a null header value (-1); kq's readers give b"" (its gRPC Header has no null)."""
    body = b"\x00" + varint(0) + varint(0) + varint(-1) + varint(1) + b"v" + varint(1) + varint(1) + b"h"
    (decoded,) = parse_batch(forge(raw_record(body + varint(-1)), 1))
    assert (decoded.key, decoded.value, decoded.headers) == (None, b"v", (("h", b""),))


def test_sequences_wrap_like_kafka() -> None:
    """next_sequence wraps from 2**31 - 1 to 0 (Kafka's DefaultRecordBatch.incrementSequence)."""
    assert next_sequence(0, 5) == 5
    assert next_sequence(2**31 - 1, 1) == 0
    assert next_sequence(2**31 - 2, 3) == 1


def test_with_base_offset_stamps_only_the_first_eight_bytes() -> None:
    """The CRC does not cover the base offset: a stamped batch still checks, and differs in bytes 0-7 only."""
    batch = encode_batch([NewRecord(b"k", b"v")], ZSTD)
    stamped = with_base_offset(batch, 12_345)
    assert stamped[8:] == batch[8:] and read_header(stamped).base_offset == 12_345
    assert check(stamped) == 1 and stamp_base_offset(batch, 12_345) == stamped


@given(st.lists(new_records, min_size=1, max_size=4))
def test_split_batches_cuts_a_records_field_into_whole_batches(groups: list[list[NewRecord]]) -> None:
    """Batches back to back come apart exactly; a cut-short or non-v2 one is refused, named."""
    batches = [encode_batch(records, NONE, base_timestamp_ms=NOW_MS) for records in groups]
    joined = b"".join(batches)
    assert [bytes(view) for view in split_batches(joined)] == batches
    assert split_batches(b"") == []
    with pytest.raises(MalformedBatchError, match=f"batch {len(batches) - 1}"):
        split_batches(joined[:-1])
    wrong_magic = bytearray(batches[0])
    wrong_magic[16] = 1
    with pytest.raises(MalformedBatchError, match="batch 0: magic byte 1"):
        split_batches(bytes(wrong_magic) + joined)


@given(new_records, st.integers(0, 2**31 - 1), st.integers(-(2**63), 2**63 - 1))
def test_record_size_max_bounds_the_encoding_anywhere(
    records: list[NewRecord], offset_delta: int, timestamp_delta_ms: int
) -> None:
    """The size the Producer charges is never below the record's encoding at any position or delta."""
    for record in records:
        assert len(encode_record(record, offset_delta, timestamp_delta_ms)) <= record_size_max(record)


def test_the_builder_makes_the_batch_encode_batch_makes() -> None:
    """BatchBuilder (the Producer's) and encode_batch give the same bytes for the same records."""
    records = [NewRecord(b"k", b"a", (("h", b"1"),), NOW_MS), NewRecord(None, None, (), NOW_MS - 5)]
    builder = BatchBuilder()
    assert [builder.append(record) for record in records] == [
        len(encode_record(record, i, record.timestamp_ms - NOW_MS))  # type: ignore[operator]
        for i, record in enumerate(records)
    ]
    assert builder.build(LZ4, 3, 0, 9) == encode_batch(records, LZ4, 3, 0, 9)
    with pytest.raises(ValueError, match="at least one"):
        BatchBuilder().build()
    with pytest.raises(ValueError, match="at least one"):
        encode_batch([])


def one_record(**changes: object) -> bytes:
    """The body of a valid one-record batch's record, with fields replaced by raw bytes where given."""
    parts = {
        "attributes": b"\x00",
        "timestamp": varint(0),
        "offset": varint(0),
        "key": varint(1) + b"k",
        "value": varint(1) + b"v",
        "headers": varint(1) + varint(1) + b"h" + varint(1) + b"x",
    }
    parts.update(changes)  # type: ignore[arg-type]
    return b"".join(parts.values())


def good_records(count: int = 2) -> bytes:
    return b"".join(encode_record(NewRecord(b"k", b"v"), i, 0) for i in range(count))


MALFORMED: dict[str, tuple[bytes, str]] = {
    "short": (b"\x00" * 60, "less than a 61-byte header"),
    "magic": (forge(good_records(), 2, magic=1), "magic byte 1"),
    "batchLength": (forge(good_records(), 2) + b"\x00", "batchLength says"),
    "unknown attribute": (forge(good_records(), 2, attributes=0x40), "unknown attribute bits 0x0040"),
    "transactional": (forge(good_records(), 2, attributes=TRANSACTIONAL_FLAG), "transactional batch"),
    "control": (forge(good_records(), 2, attributes=CONTROL_FLAG), "control batch"),
    "codec": (forge(good_records(), 2, attributes=5), "unknown compression codec 5"),
    "no records": (forge(b"", 0), "0 records"),
    "negative count": (forge(b"", -1), "-1 records"),
    "too many records": (forge(good_records(), 1_001), "1001 records"),
    "lastOffsetDelta": (forge(good_records(), 2, last_offset_delta=5), "lastOffsetDelta 5 with 2 records"),
    "baseTimestamp": (forge(good_records(), 2, base_timestamp_ms=-2), "negative baseTimestamp"),
    "maxTimestamp": (forge(good_records(), 2, max_timestamp_ms=-5), "maxTimestamp"),
    "producer id": (forge(good_records(), 2, producer=(-2, -1, -1)), "producer id -2"),
    "idempotent epoch": (forge(good_records(), 2, producer=(4, -1, 0)), "both must be >= 0"),
    "idempotent sequence": (forge(good_records(), 2, producer=(4, 0, -1)), "both must be >= 0"),
    "fewer records than said": (forge(good_records(2), 3), "record 2: cut short inside a varint"),
    "more records than said": (forge(good_records(3), 2), "bytes after the last of 2 records"),
    "record too short": (forge(raw_record(b"\x00" * 5), 1), "record 0: length 5 is shorter"),
    "record past the end": (forge(varint(50) + one_record(), 1), "record 0: length 50"),
    "offsetDelta": (
        forge(raw_record(one_record(offset=varint(3))), 1),
        "record 0: offsetDelta 3 (must be 0)",
    ),
    "record timestamp": (forge(raw_record(one_record(timestamp=varint(-NOW_MS - 2))), 1), "timestamp -2"),
    "key length": (forge(raw_record(one_record(key=varint(-2))), 1), "key length -2"),
    "value past the record": (forge(raw_record(one_record(value=varint(90) + b"v")), 1), "value length 90"),
    "header count": (forge(raw_record(one_record(headers=varint(101))), 1), "101 headers"),
    "negative header count": (forge(raw_record(one_record(headers=varint(-1))), 1), "-1 headers"),
    "header name length": (
        forge(raw_record(one_record(headers=varint(1) + varint(65) + b"h" * 65 + varint(0))), 1),
        "header name of 65 bytes",
    ),
    "header name UTF-8": (
        forge(raw_record(one_record(headers=varint(1) + varint(1) + b"\xff" + varint(0))), 1),
        "not UTF-8",
    ),
    "header value length": (
        forge(raw_record(one_record(headers=varint(1) + varint(1) + b"h" + varint(-3))), 1),
        "header value length -3",
    ),
    "trailing bytes in a record": (forge(raw_record(one_record() + b"\x00"), 1), "its fields take"),
    "varint too long": (
        forge(raw_record(one_record(offset=b"\x80" * 5 + b"\x00")), 1),
        "longer than 5 bytes",
    ),
    "varint beyond int32": (
        forge(raw_record(one_record(key=b"\xff\xff\xff\xff\x7f" + b"k")), 1),
        "beyond int32",
    ),
    "varlong too long": (
        forge(raw_record(one_record(timestamp=b"\x80" * 10 + b"\x00")), 1),
        "longer than 10",
    ),
    "record too big": (
        forge(raw_record(one_record(value=varint(1 << 20) + b"v" * (1 << 20))), 1),
        "1048579 bytes of key, value and headers",
    ),
    "corrupt gzip": (forge(b"\x1f\x8b" + b"\x00" * 20, 1, attributes=GZIP), "gzip records"),
    "corrupt snappy": (forge(b"\xff" * 9, 1, attributes=SNAPPY), "snappy records"),
    "lz4 block format": (forge(b"\x10\x00" * 9, 1, attributes=LZ4), "lz4 records: not an LZ4 frame"),
    "corrupt zstd": (forge(b"\x28\xb5\x2f\xfd" + b"\xff" * 9, 1, attributes=ZSTD), "zstd records"),
    "compressed nothing": (forge(compress(b"", ZSTD), 1, attributes=ZSTD), "record 0: cut short"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_every_malformed_batch_is_refused_with_its_reason(case: str) -> None:
    """Each way a batch can be wrong has its own one-line reason, naming the record where there is one."""
    data, reason = MALFORMED[case]
    with pytest.raises(MalformedBatchError, match=reason.replace("(", r"\(").replace(")", r"\)")) as caught:
        check(data)
    assert "\n" not in str(caught.value)
    if case in STORED_SHAPES:  # What a producer may not send, a stored batch may be (compacted, a marker).
        assert parse(data) == record_count_of(data)
        return
    with pytest.raises(MalformedBatchError):
        parse(data)


# Refused from a producer, read from the store: fewer records than lastOffsetDelta + 1 (compacted_batch).
COMPACTED_SHAPES = {"lastOffsetDelta"}
STORED_SHAPES = COMPACTED_SHAPES | {"control"}  # A control batch: a transaction marker apply wrote.


def test_a_batch_holds_at_most_headers_per_batch_max_headers() -> None:
    """Two-byte headers would let one expanded batch hold 1.5 million: the batch's total is bounded,
    so checking the densest batch stays well under a second."""
    per_record = 1_000
    records = [NewRecord(None, None, (("", b""),) * per_record, NOW_MS)] * (
        HEADERS_PER_BATCH_MAX // per_record
    )
    limits = (10_000, per_record, 1 << 20, 64, APPEND_BYTES_MAX)
    assert check_batch(encode_batch(records, ZSTD), *limits).record_count == len(records)  # At the bound.
    started = time.monotonic()
    with pytest.raises(
        MalformedBatchError, match=f"record {len(records)}: more than {HEADERS_PER_BATCH_MAX}"
    ):
        check_batch(encode_batch([*records, *records], ZSTD), *limits)
    assert time.monotonic() - started < 2.0


def test_a_flipped_bit_anywhere_the_crc_covers_is_refused() -> None:
    """The CRC32C covers the batch from its attributes on: any change there is refused before all else."""
    batch = encode_batch([NewRecord(b"k", b"v" * 50, (("h", b"x"),))], base_timestamp_ms=NOW_MS)
    for position in range(21, len(batch)):
        damaged = bytearray(batch)
        damaged[position] ^= 0x04
        with pytest.raises(MalformedBatchError, match="CRC32C mismatch"):
            check(bytes(damaged))


def test_a_batch_cut_anywhere_is_refused() -> None:
    """Any prefix of a batch is refused (its batchLength no longer matches, or it is not even a header)."""
    batch = encode_batch([NewRecord(b"k", b"v"), NewRecord(None, b"w")], GZIP, base_timestamp_ms=NOW_MS)
    for cut in range(len(batch)):
        with pytest.raises(MalformedBatchError):
            check(batch[:cut])


def bomb(codec: int) -> bytes:
    """A batch whose records are 64 MiB of zeros, compressed with `codec` (snappy: xerial blocks)."""
    zeros = b"\x00" * (64 * 1024 * 1024)
    if codec == SNAPPY:
        block = compress(b"\x00" * (1 << 20), SNAPPY)
        payload = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + (struct.pack(">i", len(block)) + block) * 64
    else:
        payload = compress(zeros, codec)
    return forge(payload, 1, attributes=codec)


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD])
def test_a_zip_bomb_is_refused_before_it_is_expanded_in_full(codec: int) -> None:
    """64 MiB of compressed zeros are refused at the bound, quickly and without expanding all of them."""
    batch = bomb(codec)
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(MalformedBatchError, match=f"beyond {APPEND_BYTES_MAX}|over {APPEND_BYTES_MAX}"):
            check(batch)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 2.0
    assert peak_bytes < 3 * APPEND_BYTES_MAX  # The bound's buffer and one copy, never 64 MiB.


def test_a_raw_snappy_bomb_is_refused_by_its_declared_length() -> None:
    """A raw snappy block declares its expanded length first: over the bound, nothing is expanded."""
    block = compress(b"\x00" * (APPEND_BYTES_MAX + 1), SNAPPY)
    with pytest.raises(MalformedBatchError, match=f"snappy stream expands beyond {APPEND_BYTES_MAX}"):
        check(forge(block, 1, attributes=SNAPPY))


def mutations(batch: bytes) -> st.SearchStrategy[bytes]:
    """`batch` with a few bytes after the header changed, the CRC recomputed (so the walk sees them)."""

    @st.composite
    def mutated(draw: st.DrawFn) -> bytes:
        damaged = bytearray(batch)
        for _ in range(draw(st.integers(1, 4))):
            position = draw(st.integers(BATCH_HEADER_BYTES, len(damaged) - 1))
            damaged[position] = draw(st.integers(0, 255))
        if draw(st.booleans()):  # Also a cut, with batchLength and the count kept consistent or not.
            del damaged[draw(st.integers(BATCH_HEADER_BYTES, len(damaged))) :]
            struct.pack_into(">i", damaged, 8, len(damaged) - 12)
        struct.pack_into(">I", damaged, 17, crc32c.crc32c(bytes(damaged[21:])))
        return bytes(damaged)

    return mutated()


def outcome(function: Callable[[], object]) -> str:
    """'ok' or the MalformedBatchError's reason; any other exception fails the test."""
    try:
        function()
    except MalformedBatchError as error:
        return f"refused: {error}"
    return "ok"


VALID = encode_batch(
    [NewRecord(b"key", b"value" * 10, (("a", b"1"), ("b", b""))), NewRecord(None, None), NewRecord(b"", b"")],
    base_timestamp_ms=NOW_MS,
)


@settings(max_examples=400)
@given(
    st.one_of(
        mutations(VALID),
        st.binary(max_size=200),
        st.binary(min_size=61, max_size=200).map(lambda raw: raw[:16] + b"\x02" + raw[17:]),
    )
)
def test_fuzzed_batches_are_refused_or_accepted_alike_by_check_and_parse(data: bytes) -> None:
    """Random and mutated bytes only ever raise MalformedBatchError; check and parse agree on each."""
    checked = outcome(lambda: check(data))
    parsed = outcome(lambda: parse(data))
    assert checked == parsed


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(new_records, st.sampled_from([GZIP, SNAPPY, LZ4, ZSTD]), st.data())
def test_mutated_compressed_streams_only_raise_malformed(
    records: list[NewRecord], codec: int, data: st.DataObject
) -> None:
    """A compressed stream with bytes changed (CRC kept valid) is refused or accepted, never anything else."""
    damaged = bytearray(encode_batch(records, codec, base_timestamp_ms=NOW_MS))
    for _ in range(data.draw(st.integers(1, 3))):
        damaged[data.draw(st.integers(BATCH_HEADER_BYTES, len(damaged) - 1))] ^= data.draw(
            st.integers(1, 255)
        )
    struct.pack_into(">I", damaged, 17, crc32c.crc32c(bytes(damaged[21:])))
    assert outcome(lambda: check(bytes(damaged))) == outcome(lambda: parse(bytes(damaged)))


# Stored batches ------------------------------------------------------------------------------------


@given(new_records, codecs, st.integers(0, 2**62))
def test_storage_and_the_codec_read_the_same_header(records: list[NewRecord], codec: int, base: int) -> None:
    """storage/records.py reads the v2 header itself (it imports nothing of kq): the same count and offset."""
    stored = stamp_base_offset(encode_batch(records, codec), base)
    batch = decode_batch(stored, base)
    header = read_header(stored)
    assert (batch.base_offset, batch.record_count, batch.max_timestamp_ms) == (
        header.base_offset,
        header.record_count,
        header.max_timestamp_ms,
    )
    assert record_count_of(stored) == len(records) and batch.data == stored
    assert batch.next_offset == base + len(records)


def test_a_flipped_bit_in_a_stored_batch_is_detected() -> None:
    """Every bit of a stored batch is verified on read, except partitionLeaderEpoch (bytes 12-15),
    which Kafka's CRC does not cover and nothing in kq reads."""
    stored = stamp_base_offset(encode_batch([NewRecord(b"k", b"v" * 20)], LZ4, base_timestamp_ms=NOW_MS), 7)
    assert decode_batch(stored, 7).data == stored
    for position in [*range(12), *range(16, len(stored))]:
        for bit in range(8):
            damaged = bytearray(stored)
            damaged[position] ^= 1 << bit
            with pytest.raises(CorruptRecordError):
                decode_batch(bytes(damaged), 7)


def test_a_stored_batch_under_the_wrong_offset_or_cut_is_corrupt() -> None:
    """The stamped base offset must be the key's; a cut or non-v2 value is corrupt, never served."""
    stored = stamp_base_offset(encode_batch([NewRecord(None, b"v")] * 2), 5)
    with pytest.raises(CorruptRecordError, match="says its base offset is 5"):
        decode_batch(stored, 6)
    with pytest.raises(CorruptRecordError, match="shorter than its header"):
        decode_batch(stored[:60], 5)
    with pytest.raises(CorruptRecordError, match="batchLength"):
        decode_batch(stored[:-1], 5)


# The work meter -----------------------------------------------------------------------------------


def dense(codec: int = ZSTD, records: int = 10_000, headers: int = 10) -> bytes:
    """The kind of batch the work budget is for: many records with many tiny headers, compressing well."""
    header_list = tuple(("h", b"") for _ in range(headers))
    return encode_batch([NewRecord(None, b"x", header_list)] * records, codec, base_timestamp_ms=NOW_MS)


def full_check(data: bytes, meter: WorkMeter | None = None) -> None:
    """check_batch with the limits apply uses."""
    check_batch(
        data,
        RECORDS_PER_APPEND_MAX,
        HEADERS_PER_RECORD_MAX,
        RECORD_BYTES_MAX,
        HEADER_NAME_BYTES_MAX,
        APPEND_BYTES_MAX,
        meter,
    )


@pytest.mark.parametrize("codec", sorted(CODECS.values()))
def test_the_meter_charges_records_headers_and_bytes(codec: int) -> None:
    """A check's work is its append, records, stored bytes, expanded bytes and headers, in WORK_* units."""
    data = dense(codec, records=1_000, headers=3)
    meter = WorkMeter(ENTRY_WORK_MAX)
    full_check(data, meter)
    expanded = 0 if codec == NONE else len(decompress(data[BATCH_HEADER_BYTES:], codec, APPEND_BYTES_MAX))
    assert meter.spent == (
        WORK_PER_APPEND
        + 1_000 * WORK_PER_RECORD
        + len(data) // WORK_BYTES_PER_UNIT
        + expanded // WORK_BYTES_PER_UNIT
        + 3_000 * WORK_PER_HEADER
    )


def test_the_costliest_batch_the_limits_allow_fits_one_entry() -> None:
    """ENTRY_WORK_MAX is at least one append at every limit at once, so the edge never refuses a batch
    for its work alone; and the densest batch a producer can send checks within it."""
    worst = (
        WORK_PER_APPEND
        + RECORDS_PER_APPEND_MAX * WORK_PER_RECORD
        + 2 * (APPEND_BYTES_MAX // WORK_BYTES_PER_UNIT)
        + HEADERS_PER_BATCH_MAX * WORK_PER_HEADER
    )
    assert worst <= ENTRY_WORK_MAX
    meter = WorkMeter(ENTRY_WORK_MAX)
    full_check(dense(GZIP, RECORDS_PER_APPEND_MAX, HEADERS_PER_BATCH_MAX // RECORDS_PER_APPEND_MAX), meter)
    assert 0 < meter.spent <= worst


@pytest.mark.parametrize("codec", sorted(CODECS.values()))
def test_a_spent_meter_stops_the_check_of_the_next_batch(codec: int) -> None:
    """Two dense batches on one entry's meter: the first passes, the second is refused for the budget
    before its records are walked, and the meter never goes past its limit."""
    meter = WorkMeter(ENTRY_WORK_MAX)
    data = dense(codec)
    full_check(data, meter)
    first = meter.spent
    assert first > ENTRY_WORK_MAX // 2
    with pytest.raises(WorkBudgetError):
        full_check(data, meter)
    assert first < meter.spent <= ENTRY_WORK_MAX


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 3_000),
    codecs,
    st.integers(1, 300),
    st.integers(0, 4),
)
def test_any_budget_is_kept_and_is_the_only_difference(
    limit: int, codec: int, records: int, headers: int
) -> None:
    """Whatever the limit, a metered check spends at most it; it passes exactly when the unmetered
    check passes and the work fits, and then spends what an ample meter spends (the count is exact)."""
    data = dense(codec, records, headers)
    ample = WorkMeter(ENTRY_WORK_MAX)
    full_check(data, ample)
    meter = WorkMeter(limit)
    try:
        full_check(data, meter)
    except WorkBudgetError:
        assert ample.spent > limit
    else:
        assert meter.spent == ample.spent <= limit
    assert meter.spent <= limit


@settings(max_examples=200)
@given(mutations(VALID), st.integers(0, 400))
def test_mutated_batches_on_a_small_budget_only_raise_malformed(data: bytes, limit: int) -> None:
    """A fuzzed batch on a meter: refused (for the budget or its bytes) or accepted, the limit kept."""
    meter = WorkMeter(limit)
    outcome(lambda: full_check(data, meter))
    assert meter.spent <= limit
