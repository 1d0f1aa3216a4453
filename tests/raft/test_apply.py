"""The pure apply: deterministic across replicas, idempotent on replay, result codes not exceptions."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kq.proto import kq_pb2
from kq.proto.compression import ZSTD
from kq.proto.limits import ENTRY_WORK_MAX
from kq.proto.records import NewRecord, WorkMeter, encode_batch, parse_batch
from kq.raft import commands
from kq.raft.results import (
    AppendResult,
    ApplyResult,
    ErrorCode,
    GroupResult,
    ProducerResult,
    SkippedResult,
    TopicResult,
    TrimResult,
)
from kq.raft.state_machine import GroupScope, apply
from kq.raft.validation import PASSED_BATCHES, PassedBatches, append_problem
from kq.storage import ProducerAppend, Store
from tests.raft.helpers import CLOCK_MS, append, create


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)


def run(store: Store, entries: list[bytes], first_index: int = 1) -> list[ApplyResult]:
    return [apply(store, first_index + i, entry) for i, entry in enumerate(entries)]


def test_replicas_converge_and_reject_alike(tmp_path: Path) -> None:
    """Two stores fed the same log end byte-identical with identical results, rejections included."""
    log = [
        create("t", 2),
        append("t", 0, b"a", b"b"),
        append("t", 1, b"c"),
        append("t", 9, b"x"),
        append("missing", 0, b"y"),
        create("t", 3),
        commands.encode(commands.register_producer(5)),
        commands.encode(commands.delete_topic("nope")),
    ]
    left = Store.open(tmp_path / "left", map_size_bytes=64 * 1024**2)
    right = Store.open(tmp_path / "right", map_size_bytes=64 * 1024**2)
    results = run(left, log)
    assert run(right, log) == results
    assert left.dump() == right.dump()
    assert isinstance(results[3], AppendResult) and isinstance(results[4], AppendResult)
    assert results[3].index == 4
    assert results[3].appends[0].error == ErrorCode.UNKNOWN_PARTITION
    assert results[4].appends[0].error == ErrorCode.UNKNOWN_TOPIC
    with left.read() as reader:
        assert results[5] == TopicResult(ErrorCode.TOPIC_EXISTS, reader.topic("t"))
    assert results[6] == ProducerResult(1)
    assert results[7] == TopicResult(ErrorCode.UNKNOWN_TOPIC)


def test_offsets_are_contiguous_per_partition(store: Store) -> None:
    """Each partition numbers its records from 0 without gaps, independently of the others."""
    results = run(
        store, [create("t", 2), append("t", 0, b"a", b"b"), append("t", 1, b"c"), append("t", 0, b"d")]
    )
    assert [r.appends[0].base_offset for r in results[1:]] == [0, 0, 2]  # type: ignore[union-attr]
    with store.read() as reader:
        topic = reader.topic("t")
        assert topic is not None
        batches = reader.batches(topic.topic_id, 0, 0, 1 << 20)
    values = [r.value for b in batches for r in parse_batch(b.data)]
    assert values == [b"a", b"b", b"d"]
    assert [b.base_offset for b in batches] == [0, 2]


def test_entry_applied_twice_is_skipped(store: Store) -> None:
    """Replaying an index at or below the applied index changes nothing (journal replay on restart)."""
    run(store, [create("t", 1), append("t", 0, b"a")])
    before = store.dump()
    assert apply(store, 2, append("t", 0, b"a")) == SkippedResult(2)
    assert apply(store, 1, create("u", 1)) == SkippedResult(1)
    assert store.dump() == before
    assert store.applied_index() == 2


def test_duplicate_producer_sequence_returns_original_offset(store: Store) -> None:
    """A retried (producer, sequence) is not written again and answers with the first offset."""
    run(store, [create("t", 1), commands.encode(commands.register_producer(1)), append("t", 0, b"zero")])
    first = apply(store, 4, append("t", 0, b"a", b"b", producer_id=1, sequence=0))
    retry = apply(store, 5, append("t", 0, b"a", b"b", producer_id=1, sequence=0))
    assert isinstance(first, AppendResult) and isinstance(retry, AppendResult)
    assert first.appends[0].base_offset == 1 and not first.appends[0].duplicate
    assert retry.appends[0].base_offset == 1 and retry.appends[0].duplicate
    with store.read() as reader:
        state = reader.partition(1, 0)
    assert state is not None and state.log_end_offset == 3


def test_sequence_gaps_and_unknown_producers_are_result_codes(store: Store) -> None:
    """Out-of-order, too-old and unregistered producers are rejected with codes; nothing is written."""
    run(store, [create("t", 1), commands.encode(commands.register_producer(1))])
    index = 3
    for sequence in range(7):  # More appends than the remembered window of five.
        apply(store, index, append("t", 0, b"v", producer_id=1, sequence=sequence))
        index += 1
    before = store.dump()
    cases = {
        ErrorCode.OUT_OF_ORDER_SEQUENCE: append("t", 0, b"v", producer_id=1, sequence=9),
        ErrorCode.DUPLICATE_SEQUENCE: append("t", 0, b"v", producer_id=1, sequence=0),
        ErrorCode.UNKNOWN_PRODUCER: append("t", 0, b"v", producer_id=42, sequence=0),
    }
    for expected, entry in cases.items():
        result = apply(store, index, entry)
        index += 1
        assert isinstance(result, AppendResult) and result.appends[0].error == expected
    assert [row for row in store.dump() if row[1] != b"applied_index"] == [
        row for row in before if row[1] != b"applied_index"
    ]


def test_a_new_epoch_restarts_sequences_and_fences_the_old_one(store: Store) -> None:
    """Kafka's epochs: a higher epoch starts at sequence 0 with a new window; the lower one is fenced."""
    run(store, [create("t", 1), commands.encode(commands.register_producer(1))])
    entries = [
        (append("t", 0, b"a", producer_id=1, sequence=0), ErrorCode.OK, False),
        (append("t", 0, b"b", producer_id=1, sequence=1), ErrorCode.OK, False),
        (append("t", 0, b"c", producer_id=1, sequence=3, epoch=1), ErrorCode.OUT_OF_ORDER_SEQUENCE, False),
        (append("t", 0, b"c", producer_id=1, sequence=0, epoch=1), ErrorCode.OK, False),
        (append("t", 0, b"d", producer_id=1, sequence=2, epoch=0), ErrorCode.INVALID_PRODUCER_EPOCH, False),
        (append("t", 0, b"b", producer_id=1, sequence=1, epoch=0), ErrorCode.INVALID_PRODUCER_EPOCH, False),
        (append("t", 0, b"c", producer_id=1, sequence=0, epoch=1), ErrorCode.OK, True),
        (append("t", 0, b"e", producer_id=1, sequence=1, epoch=1), ErrorCode.OK, False),
    ]
    for index, (entry, expected, duplicate) in enumerate(entries, start=3):
        result = apply(store, index, entry)
        assert isinstance(result, AppendResult)
        assert (result.appends[0].error, result.appends[0].duplicate) == (expected, duplicate), index
    with store.read() as reader:
        window = reader.producer_window(1, 1, 0)
        topic = reader.topic("t")
        assert topic is not None
        values = [r.value for b in reader.batches(topic.topic_id, 0, 0, 1 << 20) for r in parse_batch(b.data)]
    assert window is not None and window.epoch == 1 and [a.first_sequence for a in window.appends] == [0, 1]
    assert values == [b"a", b"b", b"c", b"e"]


def test_sequences_wrap_from_the_int32_maximum_to_zero(store: Store) -> None:
    """A window ending at 2**31 - 1 expects 0 next; a batch may cross the wrap; retries still match."""
    run(store, [create("t", 1), commands.encode(commands.register_producer(1))])
    with store.write() as writer:  # A producer that has sent 2**31 - 2 records there already.
        writer.remember_producer_append(1, 1, 0, 0, ProducerAppend(2**31 - 4, 2, 0), None, appended_ms=0)
    cases = [
        (append("t", 0, b"x", b"y", producer_id=1, sequence=2**31 - 2), ErrorCode.OK, False),  # ... 2**31 - 1
        (append("t", 0, b"z", producer_id=1, sequence=5), ErrorCode.OUT_OF_ORDER_SEQUENCE, False),
        (append("t", 0, b"z", b"w", producer_id=1, sequence=0), ErrorCode.OK, False),  # 0 .. 1
        (append("t", 0, b"x", b"y", producer_id=1, sequence=2**31 - 2), ErrorCode.OK, True),
        (append("t", 0, b"old", producer_id=1, sequence=2**31 - 100), ErrorCode.DUPLICATE_SEQUENCE, False),
        (append("t", 0, b"v", producer_id=1, sequence=2), ErrorCode.OK, False),
    ]
    for index, (entry, expected, duplicate) in enumerate(cases, start=3):
        result = apply(store, index, entry)
        assert isinstance(result, AppendResult)
        assert (result.appends[0].error, result.appends[0].duplicate) == (expected, duplicate), index


def test_an_entry_in_the_old_batch_layout_is_refused_alike(tmp_path: Path) -> None:
    """An append written by kq before RecordBatch v2 (its own layout, fields 3, 4, 6 and 7 set) decodes,
    and every replica refuses it with the same result: nothing is written, nothing raises."""
    old_record = (
        struct.pack(">IBqI", 1 + 8 + 4 + 4 + 1 + 2, 0x02, 0, 0) + struct.pack(">I", 1) + b"v" + b"\x00\x00"
    )
    old_append = b"".join(
        (
            field(1, b"t"),
            varint_field(2, 0),
            varint_field(3, 1),  # producer_id
            varint_field(4, 0),  # sequence
            field(5, old_record),
            varint_field(6, 1),  # record_count
            varint_field(7, 0),  # compression
        )
    )
    entry = commands.encode(commands.append(1, [kq_pb2.PartitionAppend.FromString(old_append)]))
    results, dumps = [], []
    for name in ("left", "right"):
        replica = Store.open(tmp_path / name, map_size_bytes=16 * 1024**2)
        run(replica, [create("t", 1)])
        before = replica.dump()
        results.append(apply(replica, 2, entry))
        dumps.append([row for row in replica.dump() if row[1] != b"applied_index"])
        assert dumps[-1] == [row for row in before if row[1] != b"applied_index"]
    assert results[0] == results[1] and dumps[0] == dumps[1]
    result = results[0]
    assert isinstance(result, AppendResult) and result.appends[0].error == ErrorCode.INVALID_COMMAND
    assert "bad record batch" in result.appends[0].reason


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (payloads here are under 128 bytes)."""
    return bytes([number << 3 | 2, len(payload)]) + payload


def varint_field(number: int, value: int) -> bytes:
    """A varint protobuf field of a small value."""
    return bytes([number << 3, value])


def test_delete_topic_removes_records_and_the_name_can_be_reused(store: Store) -> None:
    """A deleted topic's records go; a new topic of the same name starts empty with a new id."""
    results = run(
        store,
        [create("t", 1), append("t", 0, b"a"), commands.encode(commands.delete_topic("t")), create("t", 1)],
    )
    recreated = results[3]
    assert isinstance(recreated, TopicResult) and recreated.topic is not None
    assert recreated.topic.topic_id == 2
    assert not [row for row in store.dump() if row[0] == b"records"]


def test_newer_command_version_stops_apply(store: Store) -> None:
    """An entry of a newer version raises (the adapter stops the node) instead of being skipped."""
    command = commands.create_topic("t", 1, 0)
    command.version = 99
    with pytest.raises(commands.NewerCommandError):
        apply(store, 1, commands.encode(command))
    assert store.applied_index() == 0


operations = st.lists(
    st.one_of(
        st.builds(lambda p: create("t", p), st.integers(1, 3)),
        st.builds(lambda p, n: append("t", p, *[b"x"] * n), st.integers(0, 3), st.integers(1, 3)),
        st.builds(
            lambda p, s: append("t", p, b"i", producer_id=1, sequence=s), st.integers(0, 2), st.integers(0, 4)
        ),
        st.just(commands.encode(commands.register_producer(0))),
        st.just(commands.encode(commands.delete_topic("t"))),
        st.builds(  # Producer expiry around the appends' clock (CLOCK_MS): some windows go, some stay.
            lambda now, expiration: commands.encode(commands.expire_producers(now, expiration)),
            st.sampled_from([0, CLOCK_MS, CLOCK_MS + 1, 5 * CLOCK_MS]),
            st.sampled_from([1, CLOCK_MS, 10 * CLOCK_MS]),
        ),
    ),
    max_size=25,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations)
def test_replay_of_any_log_is_deterministic(
    tmp_path_factory: pytest.TempPathFactory, log: list[bytes]
) -> None:
    """For any log, two replicas give identical results and byte-identical stores."""
    base = tmp_path_factory.mktemp("replay")
    left = Store.open(base / "left", map_size_bytes=16 * 1024**2)
    right = Store.open(base / "right", map_size_bytes=16 * 1024**2)
    try:
        assert run(left, log) == run(right, log)
        assert left.dump() == right.dump()
    finally:
        left.close()
        right.close()


def test_trim_moves_log_start_and_keeps_offsets(store: Store) -> None:
    """Trimming deletes records below the offset; later appends keep counting from the log end."""
    run(store, [create("t", 1), append("t", 0, b"a", b"b", b"c"), commands.encode(commands.trim("t", 0, 2))])
    beyond = apply(store, 4, commands.encode(commands.trim("t", 0, 9)))
    apply(store, 5, append("t", 0, b"d"))
    with store.read() as reader:
        state = reader.partition(1, 0)
        bases = [b.base_offset for b in reader.batches(1, 0, 2, 1 << 20)]
    assert state is not None and (state.log_start_offset, state.log_end_offset) == (2, 4)
    assert bases == [0, 3]  # The first batch straddles the new log start, so it stays.
    assert beyond == TrimResult(ErrorCode.OFFSET_OUT_OF_RANGE, 2)


def dense_batch(records: int = 10_000, headers: int = 10) -> bytes:
    """A few KB of zstd that checks for ~0.1 s: 10,000 records with ten empty headers each."""
    header_list = tuple(("h", b"") for _ in range(headers))
    return encode_batch([NewRecord(None, b"x", header_list)] * records, ZSTD, base_timestamp_ms=CLOCK_MS)


def applied_alike(
    tmp_path: Path, entry: bytes, before_first: Callable[[], None] = lambda: None
) -> ApplyResult:
    """`entry`'s result on two replicas of topic t (`before_first` runs before the first applies it):
    the same on both, with byte-identical stores."""
    results, dumps = [], []
    for name in ("first", "second"):
        if name == "first":
            before_first()
        replica = Store.open(tmp_path / name, map_size_bytes=64 * 1024**2)
        run(replica, [create("t", 1)])
        results.append(apply(replica, 2, entry))
        dumps.append(replica.dump())
    assert results[0] == results[1] and dumps[0] == dumps[1]
    return results[0]


def test_an_entry_past_its_work_budget_is_refused_append_by_append(tmp_path: Path) -> None:
    """An entry the batcher would never build (five dense batches, each within every limit, over the
    entry's work budget together) applies its first append and refuses the rest for the budget, the
    same way on two replicas, before walking their records; a small append after them still fits,
    as a refused append costs only the work done on it."""
    data = dense_batch()
    meter = WorkMeter(ENTRY_WORK_MAX)
    assert append_problem(commands.partition_append("t", 0, data), meter) is None
    assert meter.spent * 2 > ENTRY_WORK_MAX  # One fits an entry, two do not.
    parts = [commands.partition_append("t", 0, data) for _ in range(5)]
    parts.append(commands.partition_append("t", 0, encode_batch([NewRecord(None, b"v")], ZSTD)))
    result = applied_alike(tmp_path, commands.encode(commands.append(CLOCK_MS, parts)))
    assert isinstance(result, AppendResult)
    assert [a.error for a in result.appends] == [ErrorCode.OK, *[ErrorCode.INVALID_COMMAND] * 4, ErrorCode.OK]
    assert all("the batch needs" in a.reason and "work budget" in a.reason for a in result.appends[1:5])


def test_a_batch_the_edge_passed_applies_as_one_it_did_not(tmp_path: Path) -> None:
    """The leader's apply takes an edge-checked batch's verdict and work from PASSED_BATCHES; a
    follower checks in full. Both end identical, over the work budget too: the second dense batch
    is remembered, but its work no longer fits the entry's meter, so it is checked and refused."""
    first, second = dense_batch(), dense_batch(headers=9)
    small = encode_batch([NewRecord(None, b"v")], ZSTD)
    parts = [commands.partition_append("t", 0, data) for data in (small, first, second)]

    def edge_checks() -> None:
        for part in parts:
            assert append_problem(part, WorkMeter(ENTRY_WORK_MAX), edge=True) is None

    result = applied_alike(tmp_path, commands.encode(commands.append(CLOCK_MS, parts)), edge_checks)
    assert isinstance(result, AppendResult)
    assert [a.error for a in result.appends] == [ErrorCode.OK, ErrorCode.OK, ErrorCode.INVALID_COMMAND]
    assert "work budget" in result.appends[2].reason


def test_passed_batches_answer_only_equal_bytes_once_and_stay_bounded() -> None:
    """A recall needs the very bytes remembered (not just their length and CRC field), answers once,
    and the oldest batches go beyond the count or byte bound."""
    memo = PassedBatches(kept_max=3, bytes_max=100)
    batch = bytes(range(30))
    twin = batch[:21] + bytes(9)  # Same length and CRC field, other records.
    memo.remember(batch, 7)
    assert memo.recall(twin) is None
    assert memo.recall(batch) == 7 and memo.recall(batch) is None
    batches = [bytes([n]) * 30 for n in range(4)]
    for work, data in enumerate(batches):
        memo.remember(data, work)
    assert memo.recall(batches[0]) is None  # Four of 30 bytes: over 100 bytes, and over three kept.
    assert [memo.recall(data) for data in batches[1:]] == [1, 2, 3]
    memo.remember(bytes(101), 1)  # Larger than the whole bound: not kept.
    assert memo.recall(bytes(101)) is None


def test_the_edge_check_charges_what_apply_would() -> None:
    """A remembered batch's work is what the full check spends, so the batcher's packing holds."""
    data = dense_batch(records=500)
    part = commands.partition_append("t", 0, data)
    edge = WorkMeter(ENTRY_WORK_MAX)
    assert append_problem(part, edge, edge=True) is None
    recalled = WorkMeter(ENTRY_WORK_MAX)
    assert append_problem(part, recalled) is None
    assert PASSED_BATCHES.recall(data) is None  # Apply took the edge's verdict, once.
    full = WorkMeter(ENTRY_WORK_MAX)
    assert append_problem(part, full) is None  # Not remembered any more: walked.
    assert edge.spent == recalled.spent == full.spent > 0


def test_a_topic_copy_takes_the_metadata_groups_id_and_ids_are_never_reused(store: Store) -> None:
    """A create carrying a topic id (another group's copy) makes the topic with that id and moves the
    next id past it; an id given before is refused, and a delete naming another id deletes nothing."""
    encode = commands.encode
    results = run(
        store,
        [
            encode(commands.create_topic("copied", 2, CLOCK_MS, topic_id=7)),
            encode(commands.create_topic("local", 1, CLOCK_MS)),
            encode(commands.create_topic("again", 1, CLOCK_MS, topic_id=7)),
            encode(commands.delete_topic("copied", topic_id=8)),
            encode(commands.delete_topic("copied", topic_id=7)),
            encode(commands.create_topic("copied", 2, CLOCK_MS, topic_id=7)),
        ],
    )
    assert [r.error for r in results if isinstance(r, TopicResult)] == [
        ErrorCode.OK,
        ErrorCode.OK,
        ErrorCode.TOPIC_EXISTS,
        ErrorCode.UNKNOWN_TOPIC,
        ErrorCode.OK,
        ErrorCode.TOPIC_EXISTS,
    ]
    first, local = results[0], results[1]
    assert isinstance(first, TopicResult) and first.topic is not None and first.topic.topic_id == 7
    assert isinstance(local, TopicResult) and local.topic is not None and local.topic.topic_id == 8
    with store.read() as reader:
        assert reader.topic("copied") is None and reader.topic("again") is None


def test_a_carried_topic_id_past_its_limit_is_refused_alike() -> None:
    """The edge and apply share the check: an id whose successor would not fit a u64 is refused."""
    from kq.proto.limits import TOPIC_ID_MAX
    from kq.raft.validation import command_problem

    assert command_problem(commands.create_topic("t", 1, CLOCK_MS, topic_id=TOPIC_ID_MAX)) is None
    assert command_problem(commands.create_topic("t", 1, CLOCK_MS, topic_id=TOPIC_ID_MAX + 1))
    assert command_problem(commands.delete_topic("t", topic_id=TOPIC_ID_MAX + 1))


def test_a_group_that_does_not_allocate_producer_ids_takes_a_new_one_at_sequence_zero(tmp_path: Path) -> None:
    """Group 0 refuses an id it never handed out (UNKNOWN_PRODUCER); another group of a cluster of
    several takes it as Kafka's partition leaders do, and still checks its sequences."""
    log = [create("t", 1), append("t", 0, b"a", producer_id=42, sequence=0)]
    zero = Store.open(tmp_path / "zero", map_size_bytes=64 * 1024**2)
    other = Store.open(tmp_path / "other", map_size_bytes=64 * 1024**2)
    refused = run(zero, log)[1]
    assert isinstance(refused, AppendResult) and refused.appends[0].error == ErrorCode.UNKNOWN_PRODUCER
    scope = GroupScope(allocates_producer_ids=False, holds_every_partition=False)
    taken = [apply(other, i + 1, entry, scope) for i, entry in enumerate(log)][1]
    assert isinstance(taken, AppendResult) and taken.appends[0].error == ErrorCode.OK
    gap = apply(other, 3, append("t", 0, b"b", producer_id=42, sequence=5), scope)
    assert isinstance(gap, AppendResult) and gap.appends[0].error == ErrorCode.OUT_OF_ORDER_SEQUENCE


def test_a_group_of_several_takes_commits_past_its_copys_log_end(tmp_path: Path) -> None:
    """A cluster of one group refuses an offset past the partition's log end; a coordinator group of a
    cluster of several, whose copy of another group's partition is empty, takes it (the edge checked
    it against that group's replica)."""
    commit = commands.encode(
        commands.commit_offsets("g", "", 0, [kq_pb2.OffsetEntry(topic="t", partition=0, offset=5)], CLOCK_MS)
    )
    sole = Store.open(tmp_path / "sole", map_size_bytes=64 * 1024**2)
    several = Store.open(tmp_path / "several", map_size_bytes=64 * 1024**2)
    refused = run(sole, [create("t", 1), commit])[1]
    assert isinstance(refused, GroupResult) and refused.error == ErrorCode.OFFSET_OUT_OF_RANGE
    scope = GroupScope(allocates_producer_ids=True, holds_every_partition=False)
    taken = [apply(several, i + 1, entry, scope) for i, entry in enumerate([create("t", 1), commit])][1]
    assert isinstance(taken, GroupResult) and taken.error == ErrorCode.OK
    with several.read() as reader:
        assert [offset for _, _, offset, _ in reader.committed_offsets("g")] == [5]
