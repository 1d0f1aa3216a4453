"""kq's RecordBatch v2 codec against Kafka's own Python client, both ways: what kafka-python's record
builder writes passes `check_batch` and parses to the same records, and kafka-python's reader reads
what `encode_batch` writes, for every codec both sides have (kafka-python's snappy needs python-snappy,
which is not installed)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from kq.proto.compression import GZIP, LZ4, NONE, ZSTD
from kq.proto.limits import APPEND_BYTES_MAX, HEADER_NAME_BYTES_MAX, HEADERS_PER_RECORD_MAX, RECORD_BYTES_MAX
from kq.proto.records import NewRecord, check_batch, encode_batch, parse_batch, with_base_offset

CODECS = [NONE, GZIP, LZ4, ZSTD]
NOW_MS = 1_700_000_000_000

records = st.lists(
    st.builds(
        NewRecord,
        st.none() | st.binary(max_size=50),
        st.none() | st.binary(max_size=300),
        st.lists(st.tuples(st.text(max_size=10), st.binary(max_size=20)), max_size=3).map(tuple),
        st.integers(NOW_MS - 10_000, NOW_MS + 10_000),
    ),
    min_size=1,
    max_size=30,
)


def kafka_python_batch(
    batch: list[NewRecord], codec: int, producer: tuple[int, int, int] = (-1, -1, -1)
) -> bytes:
    """The batch kafka-python's producer would send for `batch` (its DefaultRecordBatchBuilder)."""
    producer_id, epoch, sequence = producer
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        batch_size=1 << 30,
    )
    for offset, record in enumerate(batch):
        builder.append(offset, record.timestamp_ms, record.key, record.value, list(record.headers))
    return bytes(builder.build())


def fields(batch: list[NewRecord]) -> list[tuple[object, ...]]:
    return [(r.key, r.value, r.headers, r.timestamp_ms) for r in batch]


@pytest.mark.parametrize("codec", CODECS)
@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(batch=records)
def test_kq_accepts_and_reads_what_kafka_python_writes(codec: int, batch: list[NewRecord]) -> None:
    """A kafka-python batch passes the shared check and parses to the records it was built from."""
    data = kafka_python_batch(batch, codec, (42, 3, 2**31 - 1))
    header = check_batch(
        data,
        len(batch),
        HEADERS_PER_RECORD_MAX,
        RECORD_BYTES_MAX,
        HEADER_NAME_BYTES_MAX,
        APPEND_BYTES_MAX,
    )
    # kafka-python sends a batch uncompressed when compressing would not make it smaller.
    assert header.compression in (codec, NONE) and header.record_count == len(batch)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 2**31 - 1)
    decoded = parse_batch(data)
    assert [(r.key, r.value, r.headers, r.timestamp_ms) for r in decoded] == fields(batch)


@pytest.mark.parametrize("codec", CODECS)
def test_a_compressible_kafka_python_batch_keeps_its_codec(codec: int) -> None:
    """A batch kafka-python did compress is expanded by kq within the bound and read back whole."""
    batch = [NewRecord(b"k%d" % i, b"value " * 50, (("trace", b"abc"),), NOW_MS + i) for i in range(500)]
    data = kafka_python_batch(batch, codec)
    header = check_batch(data, 500, HEADERS_PER_RECORD_MAX, RECORD_BYTES_MAX, HEADER_NAME_BYTES_MAX, 200_000)
    assert header.compression == codec and (codec == NONE or len(data) < 50_000)
    assert [(r.key, r.value, r.headers, r.timestamp_ms) for r in parse_batch(data)] == fields(batch)


@pytest.mark.parametrize("codec", CODECS)
@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(batch=records)
def test_kafka_python_reads_what_kq_writes(codec: int, batch: list[NewRecord]) -> None:
    """kafka-python's reader validates the CRC of an `encode_batch` batch (base offset stamped) and reads
    the same records at the same offsets."""
    data = with_base_offset(encode_batch(batch, codec, 7, 0, 5), 1_000)
    read = DefaultRecordBatch(bytearray(data))
    assert read.validate_crc()
    assert (read.compression_type, read.producer_id, read.producer_epoch, read.base_sequence) == (
        codec,
        7,
        0,
        5,
    )
    assert [(r.offset, r.key, r.value, tuple(r.headers), r.timestamp) for r in read] == [
        (1_000 + i, r.key, r.value, r.headers, r.timestamp_ms) for i, r in enumerate(batch)
    ]
