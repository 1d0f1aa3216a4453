"""The retention and compaction scenarios: the gaps their topic configs allow, and the workload that
feeds compaction (keyed records, tombstones named by a header, recorded before they are sent)."""

from __future__ import annotations

from collections.abc import Sequence

from kq.chaos.gaps import DELETE_RETENTION_MS_DEFAULT, Lifecycle
from kq.chaos.history import TOMBSTONE_ID_HEADER, History, record_id
from kq.chaos.scenarios import FULL_SET, SCENARIOS, Scenario
from kq.chaos.workload import Producer, ProducerKind, ProducerSpec
from kq.client import KqClient, ProducerRecord, RecordMetadata


def test_scenarios_allow_only_the_gaps_their_topic_configs_call_for() -> None:
    """Retention scenarios allow trims, the compaction scenario compaction, every other one neither."""
    assert SCENARIOS["retention-leader-kill"].lifecycle() == Lifecycle(trims=True)
    assert SCENARIOS["retention-smoke"].lifecycle() == Lifecycle(trims=True)
    assert SCENARIOS["compaction-leader-kill"].lifecycle() == Lifecycle(
        compacted=True, delete_retention_ms=DELETE_RETENTION_MS_DEFAULT
    )
    for name in ("smoke", "leader-kill", "mixed"):
        assert SCENARIOS[name].lifecycle() == Lifecycle()
    assert {"retention-leader-kill", "compaction-leader-kill"} <= set(FULL_SET)
    assert "retention-smoke" not in FULL_SET, "the default suite's run, like smoke"


def test_retention_off_and_compact_with_delete_are_read_from_the_configs() -> None:
    """retention.* at -1 trims nothing; compact,delete with a bound allows both kinds of gap."""
    off = Scenario("x", "", (), topic_configs=(("retention.ms", "-1"), ("retention.bytes", "-1")))
    assert off.lifecycle() == Lifecycle()
    both = Scenario(
        "y",
        "",
        (),
        topic_configs=(
            ("cleanup.policy", "compact, delete"),
            ("retention.bytes", "100"),
            ("delete.retention.ms", "5"),
        ),
    )
    assert both.lifecycle() == Lifecycle(trims=True, compacted=True, delete_retention_ms=5)
    compact_only = Scenario("z", "", (), topic_configs=(("cleanup.policy", "compact"), ("retention.ms", "9")))
    assert not compact_only.lifecycle().trims, "a compact-only topic is not trimmed by retention"


class _AcceptingClient(KqClient):
    """A client that acknowledges every batch at offsets 0, 1, ... without a cluster."""

    def __init__(self) -> None:  # No connections: send_batch is all the producer calls.
        self.sent: list[ProducerRecord] = []

    def send_batch(self, topic: str, records: Sequence[ProducerRecord]) -> list[RecordMetadata]:
        """Acknowledges `records` at the next offsets of partition 0."""
        first = len(self.sent)
        self.sent += records
        return [RecordMetadata(topic, 0, first + i, index=1) for i in range(len(records))]


def test_compaction_workload_sends_keyed_records_and_named_tombstones() -> None:
    """Every record has one of the shape's keys; tombstones carry their identity header and CreateTime,
    and the history holds each record's key and each tombstone's time under its identity."""
    spec = ProducerSpec("p0", ProducerKind.PINNED_KEYED, (), 1.0, keys=3, tombstone_share=0.5)
    history = History()
    producer = Producer(spec, "t", 2, history, seed=7)
    client = _AcceptingClient()
    for _ in range(20):
        producer._send_one(client)
    tombstones = [record for record in client.sent if record.value is None]
    assert tombstones and len(tombstones) < len(client.sent)
    assert {record.key for record in client.sent} <= {b"key-0", b"key-1", b"key-2"}
    assert all(record.partition in (0, 1) for record in client.sent)
    for record in client.sent:
        identity = record_id(record.value, record.headers)
        assert identity is not None and history.attempted[identity][0] == "p0"
        assert history.keys[identity] == record.key
    for record in tombstones:
        assert record.headers[0][0] == TOMBSTONE_ID_HEADER and record.timestamp_ms is not None
        assert history.tombstones[record.headers[0][1]] == record.timestamp_ms
    assert len(history.acks) == len(client.sent)
