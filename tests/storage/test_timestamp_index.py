"""The store's `timestamps` index: the batch with the largest maxTimestamp in one seek, kept exact
through appends, trims and topic deletion, and the same rows whether kept by apply or built at open."""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kq.proto.records import NewRecord, encode_batch
from kq.storage import Store

MAP_SIZE_BYTES = 64 * 1024**2
ROWS_MAX = 1_000
LOG_APPEND_TIME = 0x08


def with_header(batch: bytes, max_timestamp_ms: int, log_append_time: bool = False) -> bytes:
    """`batch` with its header's maxTimestamp (and LogAppendTime flag) rewritten, CRC32C recomputed:
    what a client whose header disagrees with its records, or a LogAppendTime batch, looks like."""
    data = bytearray(batch)
    struct.pack_into(">q", data, 35, max_timestamp_ms)
    if log_append_time:
        struct.pack_into(">h", data, 21, struct.unpack_from(">h", data, 21)[0] | LOG_APPEND_TIME)
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    return bytes(data)


def batch_at(*timestamps_ms: int, header_ms: int | None = None) -> bytes:
    """A batch of one record per timestamp; `header_ms` overrides the header's maxTimestamp."""
    batch = encode_batch([NewRecord(None, b"v", (), ts) for ts in timestamps_ms])
    return batch if header_ms is None else with_header(batch, header_ms)


def test_empty_and_untimestamped_partitions_have_no_maximum(tmp_path: Path) -> None:
    """No batch, or only batches whose header says -1 (no timestamp): no maximum."""
    store = Store.open(tmp_path / "store", map_size_bytes=MAP_SIZE_BYTES)
    with store.write() as writer:
        topic = writer.create_topic("t", 2, 0)
        writer.append(topic.topic_id, 1, batch_at(5, header_ms=-1))
    with store.read() as reader:
        assert reader.max_timestamp(topic.topic_id, 0, 0, ROWS_MAX) is None
        assert reader.max_timestamp(topic.topic_id, 1, 0, ROWS_MAX) is None
        assert reader.max_timestamp(topic.topic_id + 1, 0, 0, ROWS_MAX) is None


def test_the_first_batch_with_the_largest_header_wins(tmp_path: Path) -> None:
    """Ties go to the earliest batch; a later larger one takes over; partitions are apart."""
    store = Store.open(tmp_path / "store", map_size_bytes=MAP_SIZE_BYTES)
    with store.write() as writer:
        topic = writer.create_topic("t", 2, 0)
        writer.append(topic.topic_id, 0, batch_at(10, 30))  # offsets 0-1, max 30
        writer.append(topic.topic_id, 0, batch_at(30))  # offset 2, max 30 (a tie: not the first)
        writer.append(topic.topic_id, 1, batch_at(99))
    with store.read() as reader:
        assert reader.max_timestamp(topic.topic_id, 0, 0, ROWS_MAX) == (30, 0)
    with store.write() as writer:
        writer.append(topic.topic_id, 0, batch_at(20, header_ms=40))  # offset 3: the header counts
    with store.read() as reader:
        assert reader.max_timestamp(topic.topic_id, 0, 0, ROWS_MAX) == (40, 3)
        assert reader.max_timestamp(topic.topic_id, 1, 0, ROWS_MAX) == (99, 0)


def test_trim_and_topic_deletion_drop_their_batches_rows(tmp_path: Path) -> None:
    """A trimmed-away maximum gives way to the largest that remains, also while a bounded trim left its
    batch below the log start; a deleted topic leaves no row."""
    store = Store.open(tmp_path / "store", map_size_bytes=MAP_SIZE_BYTES)
    with store.write() as writer:
        topic = writer.create_topic("t", 1, 0)
        for timestamp_ms in (50, 10, 40, 20):
            writer.append(topic.topic_id, 0, batch_at(timestamp_ms))
        writer.trim(topic.topic_id, 0, 1, 10)
    with store.read() as reader:
        assert reader.max_timestamp(topic.topic_id, 0, 1, ROWS_MAX) == (40, 2)
    with store.write() as writer:
        writer.trim(topic.topic_id, 0, 3, 1)  # Deletes one batch: the one at offset 2 stays below the start.
    with store.read() as reader:
        assert reader.max_timestamp(topic.topic_id, 0, 3, ROWS_MAX) == (20, 3)
        assert reader.max_timestamp(topic.topic_id, 0, 3, 1) is None  # Its row is skipped, and counted.
    with store.write() as writer:
        writer.delete_topic(topic, 1_000)
        again = writer.create_topic("t", 1, 0)
    assert not any(database == b"timestamps" for database, _, _ in store.dump())
    with store.read() as reader:
        assert reader.max_timestamp(again.topic_id, 0, 0, ROWS_MAX) is None


# One operation: (partition, timestamps of an append or None for a trim, header override, trim point,
# batches a trim deletes at most).
Operation = tuple[int, list[int] | None, int | None, float, int]
operations = st.lists(
    st.tuples(
        st.integers(0, 1),
        st.one_of(st.none(), st.lists(st.integers(0, 60), min_size=1, max_size=3)),
        st.one_of(st.none(), st.integers(-1, 70)),
        st.floats(0, 1),
        st.integers(1, 3),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_index_matches_a_scan_of_the_batches(script: list[Operation]) -> None:
    """Random appends (headers honest or not) and bounded trims: the seek answers what a scan of the
    headers of the batches from the log start would, and a store whose index is built at open holds
    the same rows."""
    with tempfile.TemporaryDirectory() as directory:
        store = Store.open(Path(directory) / "store", map_size_bytes=MAP_SIZE_BYTES)
        with store.write() as writer:
            topic_id = writer.create_topic("t", 2, 0).topic_id
        for partition, timestamps_ms, header_ms, fraction, batches_max in script:
            with store.write() as writer:
                if timestamps_ms is not None:
                    writer.append(topic_id, partition, batch_at(*timestamps_ms, header_ms=header_ms))
                    continue
                state = writer.partition(topic_id, partition)
                assert state is not None
                span = state.log_end_offset - state.log_start_offset
                writer.trim(topic_id, partition, state.log_start_offset + int(span * fraction), batches_max)
        with store.read() as reader:
            for partition in (0, 1):
                state = reader.partition(topic_id, partition)
                assert state is not None
                batches = reader.batches(topic_id, partition, state.log_start_offset, 1 << 30)
                headers = [(b.max_timestamp_ms, b.base_offset) for b in batches if b.max_timestamp_ms >= 0]
                best = max((ts for ts, _ in headers), default=None)
                expected = None if best is None else min(h for h in headers if h[0] == best)
                assert reader.max_timestamp(topic_id, partition, state.log_start_offset, ROWS_MAX) == expected
        kept = store.dump()
        with store._environment.begin(write=True) as transaction:
            transaction.drop(store._databases[b"timestamps"], delete=False)
        store.close()
        rebuilt = Store.open(Path(directory) / "store", map_size_bytes=MAP_SIZE_BYTES)
        assert rebuilt.dump() == kept
        rebuilt.close()
