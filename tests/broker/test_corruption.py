"""A stored batch that fails its checksum: never served, answered as corruption, reported once."""

from __future__ import annotations

import logging
import struct

import grpc
import pytest

from kq.broker.corruption import CorruptionLog
from kq.broker.kafka.codes import KAFKA_STORAGE_ERROR, NONE
from kq.broker.kafka.fetch import _read_partition
from kq.broker.metrics import CORRUPT_BATCHES_FOUND
from kq.broker.repair import BatchRepairer
from kq.proto import kq_pb2
from kq.proto.errors import ERROR_CODE_METADATA_KEY, ErrorCode, metadata_value
from kq.proto.limits import SCRUB_BATCH_BYTES_MIN
from kq.storage import CorruptRecordError, Store
from tests.broker.conftest import Edge
from tests.raft.helpers import batch

_RECORD_KEY = struct.Struct(">QIQ")  # storage/store.py's `records` key: topic id, partition, offset.
CRC_AT = 17  # The batch header's CRC32C (storage/records.py).


def _flip_a_byte(store: Store, topic: str, partition: int, base_offset: int) -> None:
    """Flips one byte of the CRC of the batch stored at `base_offset`, as a bad disk sector would."""
    with store.read() as reader:
        meta = reader.topic(topic)
    assert meta is not None
    key = _RECORD_KEY.pack(meta.topic_id, partition, base_offset)
    records = store._databases[b"records"]
    with store._environment.begin(write=True) as transaction:
        raw = bytearray(transaction.get(key, db=records))
        raw[CRC_AT] ^= 0xFF
        transaction.put(key, bytes(raw), db=records)


def test_a_corrupt_batch_answers_data_loss_and_is_logged_and_counted_once(
    edge: Edge, caplog: pytest.LogCaptureFixture
) -> None:
    """gRPC Fetch over a batch whose checksum fails answers DATA_LOSS with CORRUPT_DATA (retriable:
    the client reads it from another node), never its bytes; reading it again logs no second line
    and counts nothing more. The other partition still serves."""
    _flip_a_byte(edge.store, "t", 0, 0)
    before = CORRUPT_BATCHES_FOUND._value.get()
    with caplog.at_level(logging.ERROR, logger="kq.broker.corruption"):
        for _ in range(3):
            with pytest.raises(grpc.RpcError) as caught:
                edge.stub.Fetch(kq_pb2.FetchRequest(topic="t", partition=0, offset=0))
            assert caught.value.code() == grpc.StatusCode.DATA_LOSS
            code = metadata_value(caught.value.trailing_metadata(), ERROR_CODE_METADATA_KEY)
            assert int(code or 0) == ErrorCode.CORRUPT_DATA
    lines = [r for r in caplog.records if r.name == "kq.broker.corruption"]
    assert len(lines) == 1 and "t/0 at offset 0" in lines[0].getMessage()
    assert CORRUPT_BATCHES_FOUND._value.get() == before + 1
    edge.stub.Produce(kq_pb2.ProduceRequest(topic="t", partition=1, records=batch(b"w")))
    assert edge.stub.Fetch(kq_pb2.FetchRequest(topic="t", partition=1, offset=0)).records


def test_a_kafka_fetch_of_a_corrupt_batch_answers_kafka_storage_error(edge: Edge) -> None:
    """The Kafka port answers the partition KAFKA_STORAGE_ERROR (56: a Kafka client refreshes its
    metadata and retries), with no records; a whole batch before the damage is still served."""
    _flip_a_byte(edge.store, "t", 0, 0)
    with edge.store.read() as reader:
        read = _read_partition(reader, "t", 0, 0, 1 << 20, True)
        assert (read.error_code, read.records) == (KAFKA_STORAGE_ERROR, b"")
        assert _read_partition(reader, "t", 1, 0, 1 << 20, True).error_code == NONE


def test_the_log_forgets_the_oldest_batches_past_its_bound() -> None:
    """At most `remembered_max` batches are remembered: a batch forgotten is reported again."""
    log = CorruptionLog(remembered_max=2)
    errors = [CorruptRecordError("bad CRC", (1, 0, offset)) for offset in range(3)]
    assert [log.found(error, "t", 0) for error in errors] == [True, True, True]
    assert not log.found(errors[2], "t", 0)
    assert log.found(errors[0], "t", 0)  # Forgotten when the third came.


def test_the_scrubber_finds_a_corrupt_batch_before_a_reader_and_goes_round_in_bounded_rounds(
    edge: Edge,
) -> None:
    """`BatchRepairer.scrub` checks stored batches partition after partition, in rounds of about its
    budget (one batch past it at most), and hands a corrupt one to the repair queue as a read would;
    a round that reaches the last partition goes on from the first."""
    edge.stub.Produce(kq_pb2.ProduceRequest(topic="t", partition=1, records=batch(b"a")))
    edge.stub.Produce(kq_pb2.ProduceRequest(topic="t", partition=1, records=batch(b"b")))
    _flip_a_byte(edge.store, "t", 1, 1)
    log = CorruptionLog()
    found: list[tuple[tuple[int, int, int], str]] = []
    log.on_found = lambda where, topic: found.append((where, topic))
    scrubber = BatchRepairer(edge.store, log, lambda: [], lambda call: call(), scrub_bytes_per_s=0)
    with edge.store.read() as reader:
        meta = reader.topic("t")
    assert meta is not None
    one_batch = scrubber.scrub(1)  # Partition 0's batch (3 records) alone.
    assert one_batch > 0 and found == []
    scrubber.scrub(1)  # Partition 1, offset 0: whole.
    assert found == []
    scrubber.scrub(1)  # Partition 1, offset 1: the damaged one.
    assert found == [((meta.topic_id, 1, 1), "t")]
    assert scrubber.scrub(1 << 20) > 0  # Round the end and on from the first partition again.
    assert len(found) == 1  # Reported once.


def test_the_scrubber_counts_a_small_batch_as_scrub_batch_bytes_min_against_its_budget(edge: Edge) -> None:
    """Small batches cost the scrubber their Python more than their bytes: each counts as at least
    SCRUB_BATCH_BYTES_MIN against a round's budget, so a budget of three such counts checks three
    batches (the round still reports the bytes it actually checked)."""
    for value in (b"a", b"b", b"c", b"d", b"e"):
        edge.stub.Produce(kq_pb2.ProduceRequest(topic="t", partition=0, records=batch(value)))

    def scrubber() -> BatchRepairer:
        return BatchRepairer(
            edge.store, CorruptionLog(), lambda: [], lambda call: call(), scrub_bytes_per_s=0
        )

    one_by_one = scrubber()
    batches = [one_by_one.scrub(1) for _ in range(4)]  # Partition 0's first batch, then three of ours.
    assert all(0 < size < SCRUB_BATCH_BYTES_MIN for size in batches)
    in_one_round = scrubber()
    assert in_one_round.scrub(SCRUB_BATCH_BYTES_MIN) == batches[0]
    assert in_one_round.scrub(3 * SCRUB_BATCH_BYTES_MIN) == sum(batches[1:])
