"""One KqClient shared by many threads against a real node: every record stored exactly once, where the
client said, in each thread's send order per partition."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kq.client import KqClient, Producer, ProducerRecord, RecordMetadata
from kq.deploy.cluster import LocalCluster

pytestmark = pytest.mark.system

TOPIC = "hammered"
PARTITIONS = 4
THREADS = 8
RECORDS_PER_THREAD = 300
PRODUCER_RECORDS = 2_000


@pytest.fixture
def node(tmp_path: Path) -> Iterator[LocalCluster]:
    """A started one-node cluster (the fewest processes that exercise the real client paths)."""
    with LocalCluster(tmp_path / "cluster", size=1) as local:
        yield local


def _send_from_thread(
    client: KqClient, thread: int, sent: dict[bytes, RecordMetadata], failures: list[BaseException]
) -> None:
    """Alternates single sends, explicit-partition batches and keyed batches; records what came back."""
    try:
        _send_all(client, thread, sent)
    except BaseException as error:
        failures.append(error)


def _send_all(client: KqClient, thread: int, sent: dict[bytes, RecordMetadata]) -> None:
    position = 0
    while position < RECORDS_PER_THREAD:
        size = 1 + position % 5
        values = [b"t%d-%d" % (thread, i) for i in range(position, min(position + size, RECORDS_PER_THREAD))]
        if len(values) == 1:
            metadata = [client.send(TOPIC, values[0], partition=position % PARTITIONS)]
        elif position % 2:
            records = [ProducerRecord(v, partition=(position + k) % PARTITIONS) for k, v in enumerate(values)]
            metadata = client.send_batch(TOPIC, records)
        else:
            metadata = client.send_batch(TOPIC, [ProducerRecord(v, key=v) for v in values])
        sent.update(zip(values, metadata, strict=True))
        position += len(values)


def _read_while_writing(client: KqClient, stop: threading.Event, failures: list[BaseException]) -> None:
    """Metadata and record reads on the same client while the writers run."""
    try:
        while not stop.is_set():
            assert TOPIC in {topic.name for topic in client.list_topics()}
            client.describe_topic(TOPIC)
            client.fetch(TOPIC, 0, 0, max_records=50)
    except BaseException as error:
        failures.append(error)


def _stored(client: KqClient) -> dict[int, list[tuple[int, bytes]]]:
    """Every partition's (offset, value) pairs, read from the start to the log end."""
    stored: dict[int, list[tuple[int, bytes]]] = {}
    for partition, offsets in client.list_offsets(TOPIC).items():
        records: list[tuple[int, bytes]] = []
        position = offsets.log_start_offset
        while position < offsets.log_end_offset:
            fetched = client.fetch(TOPIC, partition, position, max_records=1_000).records
            records += [(record.offset, record.value or b"") for record in fetched]
            position = fetched[-1].offset + 1
        stored[partition] = records
    return stored


def test_one_client_shared_by_many_threads_stores_each_record_once_in_order(node: LocalCluster) -> None:
    """Writers (send, send_batch, a Producer) and readers share one client: exactly once, in order."""
    with KqClient(node.bootstrap) as client:
        client.create_topic(TOPIC, PARTITIONS)
        sent: list[dict[bytes, RecordMetadata]] = [{} for _ in range(THREADS)]
        stop, failures = threading.Event(), list[BaseException]()
        writers = [
            threading.Thread(target=_send_from_thread, args=(client, n, sent[n], failures))
            for n in range(THREADS)
        ]
        reader = threading.Thread(target=_read_while_writing, args=(client, stop, failures))
        with Producer(client, linger_ms=1, max_in_flight=PARTITIONS) as producer:
            reader.start()
            for writer in writers:
                writer.start()
            futures = {
                b"p-%d" % i: producer.send(TOPIC, b"p-%d" % i, partition=i % PARTITIONS)
                for i in range(PRODUCER_RECORDS)
            }
            for writer in writers:
                writer.join()
        stop.set()
        reader.join()
        assert not failures, failures
        acknowledged = {value: meta for by_thread in sent for value, meta in by_thread.items()}
        acknowledged.update({value: future.result() for value, future in futures.items()})
        stored = _stored(client)

    held = [(partition, offset, value) for partition, records in stored.items() for offset, value in records]
    assert (
        len(held) == len({value for _, _, value in held}) == THREADS * RECORDS_PER_THREAD + PRODUCER_RECORDS
    )
    assert {value: (meta.partition, meta.offset) for value, meta in acknowledged.items()} == {
        value: (partition, offset) for partition, offset, value in held
    }
    for partition, records in stored.items():
        for sender in [b"p-", *(b"t%d-" % n for n in range(THREADS))]:
            numbers = [int(value[len(sender) :]) for _, value in records if value.startswith(sender)]
            assert numbers == sorted(numbers), f"{sender!r} out of send order in partition {partition}"
