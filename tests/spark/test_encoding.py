"""The sink's array encoding (spark/encoding.py) against the row encoder's parts: Kafka's murmur2 in
Python (`client.partitioner`) and `BatchBuilder`, byte for byte."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from kq.client.partitioner import murmur2, partition_for_key
from kq.proto.limits import (
    RECORD_BYTES_MAX,
    RECORDS_PER_APPEND_MAX,
    SPARK_WRITE_BATCH_BYTES,
    SPARK_WRITE_COALESCE_BYTES,
)
from kq.proto.records import BatchBuilder, NewRecord, parse_batch
from kq.spark.encoding import binary_column, encode_rows, murmur2_of
from kq.spark.sink import _coalesced

NOW_MS = 1_700_000_000_000
STICKY = 1

blobs = st.one_of(
    st.none(),
    st.binary(max_size=24),
    st.binary(min_size=60, max_size=200),  # Two-byte lengths.
    st.integers(8_200, 8_300).map(lambda size: bytes([size % 251]) * size),  # Three-byte lengths.
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=40))
def test_murmur2_as_arrays_is_kafkas(keys: list[bytes]) -> None:
    """Every length (every remainder of 4), the same unsigned value as the Python murmur2's."""
    column = pa.array(keys, pa.binary())
    lengths = pa.compute.binary_length(column).to_numpy().astype("int64")
    hashes = murmur2_of(column, lengths, lengths >= 0)
    assert [int(h) for h in hashes] == [murmur2(key) & 0xFFFFFFFF for key in keys]


def expected_batches(
    keys: list[bytes | None], values: list[bytes | None], partitions: int
) -> dict[int, bytes]:
    """What the row encoder sends: each partition's rows, in order, in one BatchBuilder."""
    builders: dict[int, BatchBuilder] = {}
    for key, value in zip(keys, values, strict=True):
        partition = STICKY if key is None else partition_for_key(key, partitions)
        builders.setdefault(partition, BatchBuilder()).append(NewRecord(key, value), NOW_MS)
    return {partition: builder.build() for partition, builder in builders.items()}


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(blobs, blobs), min_size=1, max_size=60),
    st.integers(1, 7),
    st.integers(0, 3),
    st.booleans(),
)
def test_rows_encode_to_the_row_encoders_bytes(
    rows: list[tuple[bytes | None, bytes | None]], partitions: int, skip: int, as_strings: bool
) -> None:
    """Same partitions and the same batch bytes as BatchBuilder, for keyed and unkeyed rows, null and
    long keys and values, string columns and sliced arrays; the sticky partition is asked once."""
    padding = [(b"pad", b"pad")] * skip
    keys = [key for key, _ in padding + rows]
    values = [value for _, value in padding + rows]
    if as_strings:  # Spark's string columns: their UTF-8 bytes.
        keys = [None if key is None else key.hex().encode() for key in keys]
        values = [None if value is None else value.hex().encode() for value in values]
    kind = pa.string() if as_strings else pa.binary()

    def column(items: list[bytes | None]) -> pa.Array:
        return pa.array(
            [None if item is None else (item.decode() if as_strings else item) for item in items], kind
        )

    batch = pa.RecordBatch.from_arrays([column(keys), column(values)], ["key", "value"]).slice(skip)
    asked: list[int] = []

    def sticky() -> int:
        asked.append(STICKY)
        return STICKY

    chunks = encode_rows(
        binary_column(batch, "key"), binary_column(batch, "value"), partitions, sticky, NOW_MS
    )
    keys, values = keys[skip:], values[skip:]
    sizes = [len(key or b"") + len(value or b"") for key, value in zip(keys, values, strict=True)]
    if max(sizes) > RECORD_BYTES_MAX:
        assert chunks is None
        return
    assert chunks is not None
    assert len(asked) == (1 if None in keys else 0)
    assert sorted(row for chunk in chunks for row in chunk.rows.tolist()) == list(range(len(keys)))
    by_partition: dict[int, list[int]] = {}
    for chunk in chunks:
        assert chunk.batch.record_count == len(chunk.rows) <= RECORDS_PER_APPEND_MAX
        assert chunk.size <= SPARK_WRITE_BATCH_BYTES or len(chunk.rows) == 1
        by_partition.setdefault(chunk.partition, []).extend(chunk.rows.tolist())
        if len(chunks) == len({c.partition for c in chunks}):  # One chunk a partition: whole batches.
            assert chunk.batch.build() == expected_batches(keys, values, partitions)[chunk.partition]
        decoded = parse_batch(chunk.batch.build())
        assert [(r.key, r.value) for r in decoded] == [(keys[row], values[row]) for row in chunk.rows]
    for partition, order in by_partition.items():
        assert order == sorted(order), f"partition {partition}'s rows out of order"


def test_a_record_over_the_limit_is_left_to_the_row_encoder() -> None:
    """The row encoder names the row; the arrays only say they cannot."""
    values = pa.array([b"v", b"x" * (RECORD_BYTES_MAX + 1)], pa.binary())
    assert encode_rows(None, values, 3, lambda: 0, NOW_MS) is None


def test_a_partition_over_the_request_size_is_cut_in_row_order() -> None:
    """More than SPARK_WRITE_BATCH_BYTES for one partition: several requests, rows in order."""
    value = b"x" * 1000
    count = 2 * SPARK_WRITE_BATCH_BYTES // len(value)
    chunks = encode_rows(None, pa.array([value] * count, pa.binary()), 3, lambda: 2, NOW_MS)
    assert chunks is not None and len(chunks) >= 2
    assert [row for chunk in chunks for row in chunk.rows.tolist()] == list(range(count))
    assert all(chunk.partition == 2 and chunk.size <= SPARK_WRITE_BATCH_BYTES for chunk in chunks)


def test_spark_batches_are_joined_in_order_up_to_the_coalesce_size() -> None:
    """The sink joins Spark's Arrow batches of 10,000 rows before encoding: every row once, in order;
    each joined batch reaches SPARK_WRITE_COALESCE_BYTES but for the last; a large one goes alone."""
    value = b"v" * 1000
    rows = int(SPARK_WRITE_COALESCE_BYTES / len(value) / 3.5)  # Four make a joined batch.
    small = [pa.record_batch({"value": pa.array([value] * rows, pa.binary())}) for _ in range(8)]
    large = pa.record_batch({"value": pa.array([value] * (6 * rows), pa.binary())})
    given_batches = [*small[:4], large, *small[4:]]
    joined = list(_coalesced(iter(given_batches)))
    assert pa.Table.from_batches(joined).equals(pa.Table.from_batches(given_batches))
    assert [batch.num_rows for batch in joined] == [4 * rows, 6 * rows, 4 * rows]
    assert joined[1] is large
    assert all(batch.nbytes >= SPARK_WRITE_COALESCE_BYTES for batch in joined[:-1])
    assert list(_coalesced(iter([]))) == []
