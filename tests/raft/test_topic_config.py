"""Topic configs: the names and values the edge and apply accept, and what a topic has in effect."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kq.proto import kq_pb2
from kq.proto.limits import APPEND_BYTES_MAX, TOPIC_CONFIGS_PARSED_KEPT, TRIM_BATCHES_PER_ENTRY_MAX
from kq.proto.records import LOG_APPEND_TIME_FLAG, check_batch, parse_batch, read_header
from kq.raft import commands
from kq.raft.results import AppendResult, ErrorCode, TopicResult, TrimResult
from kq.raft.state_machine import apply
from kq.raft.topic_config import (
    ConfigParser,
    applied_config,
    applied_config_of,
    configs_problem,
    decode_overrides,
    defaults_problem,
    effective,
    encode_overrides,
    entry_problem,
    values,
)
from kq.storage import Store, TopicMeta
from tests.raft.helpers import CLOCK_MS, append, batch, create


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("retention.ms", "-1"),
        ("retention.ms", "604800000"),
        ("retention.bytes", "9223372036854775807"),
        ("cleanup.policy", "compact,delete"),
        ("cleanup.policy", "delete, compact"),
        ("delete.retention.ms", "0"),
        ("min.compaction.lag.ms", "5"),
        ("max.message.bytes", str(APPEND_BYTES_MAX)),
        ("message.timestamp.type", "LogAppendTime"),
    ],
)
def test_legal_values_pass(name: str, value: str) -> None:
    assert entry_problem(name, value) is None


@pytest.mark.parametrize(
    ("name", "value", "reason"),
    [
        ("retention.ms", "-2", "outside"),
        ("retention.ms", "9223372036854775808", "outside"),
        ("retention.ms", "1e3", "not an integer"),
        ("retention.ms", "٣", "not an integer"),  # A digit, but not an ASCII one.
        ("retention.ms", "", "not an integer"),
        ("retention.bytes", "-", "not an integer"),
        ("cleanup.policy", "", "is not delete"),
        ("cleanup.policy", "delete,delete", "is not delete"),
        ("cleanup.policy", "remove", "is not delete"),
        ("delete.retention.ms", "-1", "outside"),
        ("max.message.bytes", "0", "outside"),
        ("max.message.bytes", str(APPEND_BYTES_MAX + 1), "outside"),
        ("message.timestamp.type", "logappendtime", "not one of"),
        ("segment.bytes", "1", "unknown topic config"),
        ("retention.ms", "1" * 300, "characters"),
    ],
)
def test_illegal_values_are_refused_with_a_reason(name: str, value: str, reason: str) -> None:
    problem = entry_problem(name, value)
    assert problem is not None and reason in problem


def test_a_change_names_each_config_once() -> None:
    one = kq_pb2.ConfigEntry(name="retention.ms", value="1")
    assert configs_problem([one, one]) == "retention.ms is given twice"
    assert configs_problem([one], ["retention.ms"]) == "retention.ms is both set and removed"
    assert configs_problem([], ["nope"]) is not None
    assert configs_problem([one], ["retention.bytes"]) is None


def test_node_defaults_reach_leader_run_configs_only() -> None:
    """A node default changes retention, never what apply reads (the same on every node)."""
    assert defaults_problem({"retention.ms": "1000"}) is None
    assert defaults_problem({"max.message.bytes": "100"}) is not None
    defaults = {"retention.ms": "1000"}
    assert effective({}, defaults).retention_ms == 1000
    assert effective({"retention.ms": "5"}, defaults).retention_ms == 5
    assert applied_config({}).retention_ms == -1
    assert values({}, {})["cleanup.policy"] == "delete"
    assert effective({"cleanup.policy": "compact"}).deletes is False


def test_parsed_configs_are_kept_by_their_stored_bytes() -> None:
    """What apply reads of a topic's stored overrides is `applied_config` of them, parsed once for the
    same bytes; the edge's parser gives the same and, beside it, the configs in effect with the node's
    defaults; it keeps a bounded number."""
    stored = encode_overrides({"max.message.bytes": "1000", "retention.ms": "5"})
    assert applied_config_of(stored) == applied_config(decode_overrides(stored))
    assert applied_config_of(stored) is applied_config_of(bytes(stored))
    assert applied_config_of(None) == applied_config({})
    parser = ConfigParser({"retention.ms": "1000"})
    applied, in_effect = parser.parsed(stored)
    assert applied == applied_config_of(stored)
    assert (applied.max_message_bytes, in_effect.max_message_bytes) == (1000, 1000)
    assert parser.parsed(None)[1].retention_ms == 1000  # The node's default, never apply's.
    assert parser.parsed(None)[0].retention_ms == -1
    for value in range(TOPIC_CONFIGS_PARSED_KEPT + 5):
        parser.parsed(encode_overrides({"retention.ms": str(value)}))
        assert len(parser._parsed) <= TOPIC_CONFIGS_PARSED_KEPT


@given(st.text(max_size=40), st.text(max_size=300))
def test_any_text_is_refused_or_parsed_never_raises(name: str, value: str) -> None:
    """Fuzz: whatever the edge is sent, the check answers; what it accepts `effective` parses."""
    if entry_problem(name, value) is None:
        effective({name: value})


# Apply -----------------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)


def configured(store: Store, overrides: dict[str, str]) -> None:
    """Topic t (one partition) created with `overrides`."""
    result = apply(store, 1, commands.encode(commands.create_topic("t", 1, CLOCK_MS, overrides)))
    assert isinstance(result, TopicResult) and result.error == ErrorCode.OK


def test_create_and_alter_store_overrides(store: Store) -> None:
    configured(store, {"retention.ms": "100"})
    alter = commands.alter_topic_config("t", {"retention.bytes": "10"}, ["retention.ms"])
    assert apply(store, 2, commands.encode(alter)) == TopicResult(ErrorCode.OK, store_topic(store))
    with store.read() as reader:
        topic = reader.topic("t")
        assert topic is not None
        assert decode_overrides(reader.topic_configs(topic.topic_id)) == {"retention.bytes": "10"}
    missing = commands.alter_topic_config("gone", {"retention.bytes": "10"}, [])
    assert apply(store, 3, commands.encode(missing)) == TopicResult(ErrorCode.UNKNOWN_TOPIC)


def store_topic(store: Store) -> TopicMeta | None:
    with store.read() as reader:
        return reader.topic("t")


def test_a_batch_over_max_message_bytes_is_refused_in_apply(store: Store) -> None:
    configured(store, {"max.message.bytes": "100"})
    result = apply(store, 2, append("t", 0, b"x" * 200))
    assert isinstance(result, AppendResult) and result.appends[0].error == ErrorCode.MESSAGE_TOO_LARGE
    result = apply(store, 3, append("t", 0, b"x"))
    assert isinstance(result, AppendResult) and result.appends[0].error == ErrorCode.OK


def test_log_append_time_stamps_the_leaders_clock(store: Store) -> None:
    """The stored batch is a LogAppendTime batch at the entry's timestamp, its CRC valid: every record
    reads as that time."""
    configured(store, {"message.timestamp.type": "LogAppendTime"})
    entry = commands.encode(commands.append(777_000, [commands.partition_append("t", 0, batch(b"a", b"b"))]))
    apply(store, 2, entry)
    with store.read() as reader:
        topic = reader.topic("t")
        assert topic is not None
        (stored,) = reader.batches(topic.topic_id, 0, 0, 1 << 20)
    header = read_header(stored.data)
    assert header.attributes & LOG_APPEND_TIME_FLAG and header.max_timestamp_ms == 777_000
    check_batch(stored.data, 10, 10, 1 << 20, 64, 1 << 20)
    assert [record.timestamp_ms for record in parse_batch(stored.data)] == [777_000, 777_000]


def test_a_trim_deletes_a_bounded_number_of_batches_and_the_next_one_continues(store: Store) -> None:
    """The log start moves at once; physical deletion stops at TRIM_BATCHES_PER_ENTRY_MAX batches and
    a trim at the same offset deletes the rest."""
    configured(store, {})
    count = TRIM_BATCHES_PER_ENTRY_MAX + 5
    parts = [commands.partition_append("t", 0, batch(b"v")) for _ in range(1_000)]
    index = 2
    for _ in range(count // 1_000 + 1):
        apply(store, index, commands.encode(commands.append(CLOCK_MS, parts)))
        index += 1
    with store.read() as reader:
        topic = reader.topic("t")
        assert topic is not None
        end = reader.partition(topic.topic_id, 0).log_end_offset  # type: ignore[union-attr]
    trim = commands.encode(commands.trim("t", 0, end, topic.topic_id))
    assert apply(store, index, trim) == TrimResult(ErrorCode.OK, end)
    with store.read() as reader:
        left = list(reader.oldest_batches(topic.topic_id, 0, count))
    assert len(left) == end - TRIM_BATCHES_PER_ENTRY_MAX
    assert apply(store, index + 1, trim) == TrimResult(ErrorCode.OK, end)
    with store.read() as reader:
        assert list(reader.oldest_batches(topic.topic_id, 0, count)) == []
        assert reader.partition(topic.topic_id, 0).size_bytes == 0  # type: ignore[union-attr]


def test_a_trim_for_a_recreated_topic_is_ignored(store: Store) -> None:
    """Retention names the topic id it measured: a topic deleted and created again is left alone."""
    configured(store, {})
    apply(store, 2, append("t", 0, b"a", b"b"))
    apply(store, 3, commands.encode(commands.delete_topic("t")))
    apply(store, 4, create("t", 1))
    apply(store, 5, append("t", 0, b"c"))
    stale = apply(store, 6, commands.encode(commands.trim("t", 0, 1, topic_id=1)))
    assert stale == TrimResult(ErrorCode.UNKNOWN_TOPIC)
    with store.read() as reader:
        topic = reader.topic("t")
        assert topic is not None and topic.topic_id == 2
        assert reader.partition(2, 0).log_start_offset == 0  # type: ignore[union-attr]
