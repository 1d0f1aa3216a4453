"""The shared validation and apply agree: whatever passes the edge's check applies without raising, alike
on every replica; whatever fails it is refused alike; a raising entry or an environment fault is handled."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pysyncobj.node import TCPNode

import kq.raft.groups
import kq.raft.patterns
import kq.raft.state_machine
import kq.raft.validation
from kq.proto import kq_pb2
from kq.proto.compression import GZIP, LZ4, NONE, SNAPPY, ZSTD
from kq.proto.limits import LEGAL_NAMES_KEPT, PATTERN_PROGRAM_SIZE_MAX, TOPIC_NAME_LENGTH_MAX
from kq.proto.records import (
    TRANSACTIONAL_FLAG,
    NewRecord,
    assemble_batch,
    encode_batch,
    encode_record,
    with_base_offset,
)
from kq.raft import commands
from kq.raft.patterns import compile_pattern, pattern_problem
from kq.raft.results import ErrorCode, GroupResult, RejectedResult, SkippedResult
from kq.raft.state_machine import EnvironmentFaultError, apply
from kq.raft.topic_config import CONFIGS
from kq.raft.transactions import TRANSACTION_COMMAND_KINDS, transaction_problem
from kq.raft.validation import append_problem, cluster_member_problem, command_problem, topic_name_problem
from kq.storage import Store

MAP_BYTES = 64 * 1024**2

names = st.one_of(
    st.sampled_from(["t", "u", "g", "t.x", "", "..", "bad/name", "a" * (TOPIC_NAME_LENGTH_MAX + 1)]),
    st.text(max_size=20),
)
patterns = st.one_of(
    st.sampled_from(["t.*", "(a+)+$", "(a|a)*b", "(" * 40 + "t" + ")" * 40, r"(t)\1", "[", ".*", "u|t"]),
    st.text(max_size=30),
)
uint32 = st.integers(0, 2**32 - 1)
topic_ids = (0, 0, 0, 1, 2, 3, 2**63 - 1, 2**63, 2**64 - 1)  # 0 most: topics the metadata group numbers.
# (producer id, epoch, base sequence): none, a registered producer (from history()) in and out of
# sequence, an unregistered one, and idempotent fields check_batch refuses.
producers = st.sampled_from(
    [(-1, -1, -1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (99, 0, 0), (1, -1, 0), (-2, 0, 0)]
)


@st.composite
def batches(draw: st.DrawFn) -> bytes:
    """A RecordBatch v2: valid (any codec, idempotent or not), truncated, count-lying, empty, garbage,
    a byte flipped, its base offset stamped, or a bomb."""
    values = draw(st.lists(st.binary(max_size=20), min_size=1, max_size=4))
    codec = draw(st.sampled_from([NONE, NONE, GZIP, SNAPPY, LZ4, ZSTD]))
    records = [NewRecord(None, value) for value in values]
    data = encode_batch(records, codec, *draw(producers), base_timestamp_ms=1)
    mutation = draw(st.sampled_from(["none", "none", "truncate", "lie", "empty", "garbage", "flip", "stamp"]))
    if mutation == "truncate":
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif mutation == "lie":  # The header claims another count; the CRC is right.
        encoded = encode_batch(records, NONE, base_timestamp_ms=1)[61:]
        data = assemble_batch(encoded, draw(st.integers(-1, 20_000)), 1, 1, codec)
    elif mutation == "empty":  # A compressed stream of nothing claiming a record: the historical bomb.
        data = assemble_batch(b"", 1, 1, 1, codec)
    elif mutation == "garbage":
        data = draw(st.binary(max_size=80))
    elif mutation == "flip":
        position = draw(st.integers(0, len(data) - 1))
        data = data[:position] + bytes([data[position] ^ 0xFF]) + data[position + 1 :]
    elif mutation == "stamp":
        data = with_base_offset(data, draw(st.integers(0, 2**63 - 1)))
    if draw(st.integers(0, 30)) == 0:  # Rarely, a bomb: 8 MiB of zeros, compressed, behind a valid header.
        data = assemble_batch(b"\x00" * (8 << 20), 1, 1, 1, codec or ZSTD)
    return data


@st.composite
def members(draw: st.DrawFn) -> kq_pb2.GroupMember:
    member = kq_pb2.GroupMember(
        member_id=draw(st.sampled_from(["m1", "m2", "", "x" * 300])),
        client_id=draw(st.text(max_size=10)),
        session_timeout_ms=draw(st.sampled_from([0, 999, 10_000, 2**32 - 1])),
        rebalance_timeout_ms=draw(st.sampled_from([0, 30_000, 2**32 - 1])),
    )
    if draw(st.booleans()):
        member.topic_pattern = draw(patterns)
    else:
        member.topics.extend(draw(st.lists(names, max_size=3)))
    return member


config_names = st.one_of(st.sampled_from(sorted(CONFIGS)), st.text(max_size=30))
config_values = st.one_of(
    st.sampled_from(
        ["-1", "0", "1", "9223372036854775807", "9223372036854775808", "-2", "delete", "compact"]
    ),
    st.sampled_from(["compact,delete", "delete,delete", "", "LogAppendTime", "CreateTime", "1e3", "٣"]),
    st.text(max_size=40),
    st.text(min_size=250, max_size=300),
)


node_ids = st.one_of(st.sampled_from(["1", "4", "", "a b", "x" * 65, "é", "1\n"]), st.text(max_size=8))
hosts = st.one_of(
    st.sampled_from(["127.0.0.1", "localhost", "", "h" * 254, "::1", "[::1]", "a:b", "ho st", "١٢٧"]),
    st.text(max_size=12),
)
ports = st.one_of(
    st.sampled_from(["1", "65535", "0", "65536", "", "-1", "७", "99999999999999999999", "08"]),
    st.integers(0, 70000).map(str),
)
addresses = st.one_of(st.builds(lambda host, port: f"{host}:{port}", hosts, ports), st.text(max_size=16))
cluster_ids = st.one_of(st.sampled_from(["", "Pbh6JQM4TVsqg7NU0NBnVQ", "a" * 65, "a b"]), st.text(max_size=8))


@st.composite
def cluster_members(draw: st.DrawFn) -> kq_pb2.Member:
    """Members whose fields are sometimes legal, often hostile (every one ends in the Raft log)."""
    return kq_pb2.Member(
        node_id=draw(node_ids),
        raft_address=draw(addresses),
        grpc_address=draw(addresses),
        kafka_address=draw(st.one_of(st.just(""), addresses)),
        rack=draw(st.one_of(st.just(""), names)),
    )


@st.composite
def config_maps(draw: st.DrawFn) -> dict[str, str]:
    return draw(st.dictionaries(config_names, config_values, max_size=9))


user_names = st.one_of(
    st.sampled_from(["alice", "bob", "", "ANONYMOUS", "a b", "x" * 65]), st.text(max_size=8)
)
token_ids = st.sampled_from(["0123456789abcdef", "fedcba9876543210", "", "XYZ", "0123456789ABCDEF"])


@st.composite
def scram_credentials(draw: st.DrawFn) -> kq_pb2.ScramCredential:
    size = draw(st.sampled_from([0, 16, 31, 32, 64, 65]))
    return kq_pb2.ScramCredential(
        mechanism=draw(st.sampled_from(["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", ""])),
        salt=draw(st.binary(max_size=70)),
        stored_key=b"k" * size,
        server_key=b"s" * draw(st.sampled_from([size, 32, 64])),
        iterations=draw(st.sampled_from([0, 4096, 10_000, 100_001, 2**32 - 1])),
    )


@st.composite
def hostile_acls(draw: st.DrawFn) -> kq_pb2.Acl:
    return kq_pb2.Acl(
        principal=draw(st.sampled_from(["User:alice", "User:*", "alice", "User:", "Group:x", "User:a b"])),
        resource_type=draw(st.integers(0, 4)),  # type: ignore[arg-type]
        resource_name=draw(st.sampled_from(["t", "*", "", "kq-cluster", "t.", "a/b", "x" * 250])),
        pattern_type=draw(st.integers(0, 3)),  # type: ignore[arg-type]
        operation=draw(st.integers(0, 8)),  # type: ignore[arg-type]
        permission=draw(st.integers(0, 3)),  # type: ignore[arg-type]
    )


@st.composite
def security_commands(draw: st.DrawFn) -> kq_pb2.Command:
    """Users, tokens and ACLs (raft/auth.py), hostile and plausible."""
    kinds = ["put_user", "delete_user", "put_token", "delete_token", "add", "remove", "alter_scram"]
    kind = draw(st.sampled_from(kinds))
    if kind == "alter_scram":
        upsertions = [
            kq_pb2.ScramUpsertion(user=draw(user_names), credential=draw(scram_credentials()))
            for _ in range(draw(st.integers(0, 3)))
        ]
        deletions = [
            kq_pb2.ScramDeletion(
                user=draw(user_names),
                mechanism=draw(st.sampled_from(["SCRAM-SHA-256", "SCRAM-SHA-512", "X"])),
            )
            for _ in range(draw(st.integers(0, 3)))
        ]
        return commands.alter_scram(upsertions, deletions)
    if kind == "put_user":
        return commands.put_user(draw(user_names), draw(st.lists(scram_credentials(), max_size=3)))
    if kind == "delete_user":
        return commands.delete_user(draw(user_names))
    if kind == "put_token":
        created = draw(st.integers(-1, 10))
        return commands.put_token(
            kq_pb2.Token(
                token_id=draw(token_ids),
                user=draw(user_names),
                secret_sha256=draw(st.sampled_from([b"h" * 32, b"", b"h" * 33])),
                created_ms=created,
                expires_ms=draw(st.sampled_from([0, created, created + 1, -5])),
                description=draw(st.text(max_size=210)),
            )
        )
    if kind == "delete_token":
        return commands.delete_token(draw(token_ids))
    acls = draw(st.lists(hostile_acls(), max_size=3))
    return commands.add_acls(acls) if kind == "add" else commands.remove_acls(acls)


TRANSACTIONAL_IDS = st.sampled_from(["tx", "ty", "", "x" * 256, "\u00e9\u0000"])


@st.composite
def offset_entries(draw: st.DrawFn) -> kq_pb2.OffsetEntry:
    """A committed offset with hostile Kafka details: metadata up to past its limit, any epoch."""
    entry = kq_pb2.OffsetEntry(
        topic=draw(names),
        partition=draw(uint32),
        offset=draw(st.integers(0, 2**64 - 1)),
        metadata=draw(st.sampled_from(["", "m", "\u00e9" * 2_048, "x" * 4_097])),
    )
    if draw(st.booleans()):
        entry.leader_epoch = draw(st.sampled_from([-(2**31), -2, -1, 0, 7, 2**31 - 1]))
    return entry


@st.composite
def transaction_commands(draw: st.DrawFn) -> kq_pb2.Command:
    """Every transaction step with hostile fields: ids empty or too long, epochs past int16, timeouts
    out of bounds, too many partitions or groups, illegal names."""
    transactional_id = draw(TRANSACTIONAL_IDS)
    producer_id = draw(st.sampled_from([0, 1, 2, 2**63 - 1, 2**64 - 1]))
    epoch = draw(st.sampled_from([0, 1, 2, 32_767, 32_768, 2**32 - 1]))
    partitions = [
        kq_pb2.TxnPartition(topic=draw(names), partition=draw(st.integers(0, 3)))
        for _ in range(draw(st.sampled_from([0, 1, 2, 1_001])))
    ]
    groups = draw(st.lists(st.sampled_from(["g", "h", "", "bad name"]), max_size=3)) + (
        ["g"] * 17 if draw(st.booleans()) and draw(st.booleans()) else []
    )
    commit = draw(st.booleans())
    kind = draw(st.sampled_from(["init", "add", "end", "complete", "marker", "offsets"]))
    message: commands.TransactionMessage
    if kind == "init":
        timeout_ms = draw(st.sampled_from([0, 999, 1_000, 60_000, 900_000, 900_001]))
        message = kq_pb2.InitTransactionCommand(
            transactional_id=transactional_id, timeout_ms=timeout_ms, now_ms=9
        )
    elif kind == "add":
        message = kq_pb2.AddToTransactionCommand(
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=epoch,
            partitions=partitions,
            groups=groups,
            now_ms=9,
        )
    elif kind == "end":
        message = kq_pb2.EndTransactionCommand(
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=epoch,
            commit=commit,
            now_ms=9,
            timed_out=draw(st.booleans()),
        )
    elif kind == "complete":
        message = kq_pb2.CompleteTransactionCommand(
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=epoch,
            commit=commit,
            now_ms=9,
        )
    elif kind == "marker":
        message = kq_pb2.TransactionMarkerCommand(
            producer_id=producer_id,
            producer_epoch=epoch,
            commit=commit,
            partitions=partitions,
            groups=groups,
            timestamp_ms=9,
            coordinator_epoch=draw(uint32),
            opened_at=draw(st.none() | st.integers(-(2**63), 2**63 - 1)),
        )
    else:
        offsets = [draw(offset_entries()) for _ in range(draw(st.integers(0, 3)))]
        message = kq_pb2.TxnCommitOffsetsCommand(
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=epoch,
            group=draw(st.sampled_from(["g", "", "bad name"])),
            offsets=offsets,
            commit_ms=9,
            member_id=draw(st.sampled_from(["", "m", "x" * 300])),
            generation=draw(st.integers(-(2**31), 2**31 - 1)),
            group_instance_id=draw(st.sampled_from(["", "i", "bad id", "y" * 300])),
        )
    return commands.transaction(message)


def problem_of(command: kq_pb2.Command) -> str | None:
    """The shared validation apply and the edge run (transaction commands have their own)."""
    if command.WhichOneof("kind") in TRANSACTION_COMMAND_KINDS:
        return transaction_problem(command)
    return command_problem(command)


@st.composite
def hostile_commands(draw: st.DrawFn) -> kq_pb2.Command:
    kinds = [
        "create",
        "delete",
        "append",
        "trim",
        "compact",
        "purge",
        "join",
        "leave",
        "commit",
        "reset",
        "configure",
        "register_member",
        "unregister_member",
        "security",
        "transaction",
        "barrier",
        "offset_delete",
        "grow",
        "expire_producers",
        "expire_transactional_ids",
    ]
    kind = draw(st.sampled_from(kinds))
    if kind == "security":
        return draw(security_commands())
    if kind == "transaction":
        return draw(transaction_commands())
    if kind == "barrier":
        return commands.barrier(draw(st.integers(-(2**63), 2**63 - 1)))
    if kind == "register_member":
        return commands.register_member(draw(cluster_members()), draw(cluster_ids))
    if kind == "unregister_member":
        return commands.unregister_member(draw(node_ids))
    if kind == "create":
        return commands.create_topic(
            draw(names),
            draw(uint32),
            1,
            draw(config_maps()),
            topic_id=draw(st.sampled_from(topic_ids)),
            groups=draw(st.sampled_from((0, 1, 3, 1024, 1025, 2**32 - 1))),
        )
    if kind == "configure":
        removed = draw(st.lists(config_names, max_size=4))
        return commands.alter_topic_config(draw(names), draw(config_maps()), removed)
    if kind == "delete":
        return commands.delete_topic(draw(names), topic_id=draw(st.sampled_from(topic_ids)))
    if kind == "append":
        appends = []
        for _ in range(draw(st.integers(0, 3))):
            appends.append(commands.partition_append(draw(names), draw(st.integers(0, 3)), draw(batches())))
        epoch = draw(st.sampled_from([0, 0, 1, 2, 7, 2**31 - 1, 2**31, 2**32 - 1]))  # Hostile ones too.
        return commands.append(1, appends, epoch)
    if kind == "trim":
        topic_id = draw(st.sampled_from([0, 1, 2, 2**64 - 1]))
        return commands.trim(draw(names), draw(uint32), draw(st.integers(0, 2**64 - 1)), topic_id)
    if kind == "expire_producers":  # Hostile clocks and expirations too: apply refuses below 1 ms.
        clocks = st.sampled_from([-(2**63), -1, 0, 1, 1_000, 2**62, 2**63 - 1])
        return commands.expire_producers(draw(clocks), draw(clocks))
    if kind == "expire_transactional_ids":
        clocks = st.sampled_from([-(2**63), -1, 0, 1, 1_000, 2**62, 2**63 - 1])
        return commands.expire_transactional_ids(draw(clocks), draw(clocks))
    if kind == "purge":
        return commands.purge_topic(draw(st.sampled_from([0, 1, 2, 3, 2**64 - 1])))
    if kind == "compact":
        topic_id = draw(st.sampled_from([0, 1, 2, 2**64 - 1]))
        edits = draw(
            st.lists(
                st.tuples(
                    st.sampled_from([0, 1, 2, 3, 2**64 - 1]),
                    st.one_of(
                        st.lists(st.integers(0, 3), max_size=4, unique=True).map(sorted),
                        st.lists(st.integers(0, 2**32 - 1), max_size=4),
                    ),
                ),
                max_size=4,
            )
        )
        return commands.compact(draw(names), topic_id, draw(st.integers(0, 3)), edits)
    if kind == "join":
        return commands.join_group(draw(names), draw(members()), draw(st.sampled_from(["", "range", "x"])), 5)
    if kind == "leave":
        return commands.leave_group(draw(names), draw(st.lists(st.sampled_from(["m1", "m2", ""]))), 6)
    if kind == "grow":
        topic_id = draw(st.sampled_from([0, 1, 2, 2**64 - 1]))
        return commands.grow_partitions(draw(names), draw(uint32), topic_id)
    if kind == "offset_delete":
        partitions = [
            kq_pb2.TopicPartition(topic=draw(names), partition=draw(uint32))
            for _ in range(draw(st.integers(0, 3)))
        ]
        return commands.offset_delete(draw(names), partitions, draw(uint32), draw(st.integers(0, 4)))
    offsets = [draw(offset_entries()) for _ in range(draw(st.integers(0, 3)))]
    if kind == "commit":
        return commands.commit_offsets(
            draw(names), draw(st.sampled_from(["", "m1"])), draw(uint32), offsets, 7
        )
    return commands.reset_offsets(draw(names), offsets)


def history() -> list[kq_pb2.Command]:
    """A plausible past: topics with records, a group with two members and a commit; then topic t
    stamps LogAppendTime and refuses batches over 90 bytes."""
    member = kq_pb2.GroupMember(
        member_id="m1", topics=["t"], session_timeout_ms=10_000, rebalance_timeout_ms=30_000
    )
    other = kq_pb2.GroupMember(
        member_id="m2", topic_pattern="t.*", session_timeout_ms=10_000, rebalance_timeout_ms=30_000
    )
    one = encode_batch([NewRecord(b"k", b"v")], base_timestamp_ms=1)
    idempotent = encode_batch([NewRecord(b"k", b"v")], NONE, 1, 0, 0, base_timestamp_ms=1)
    record = encode_record(NewRecord(b"k", b"v"), 0, 0)
    transactional = assemble_batch(record, 1, 1, 1, NONE, 2, 0, 0, attributes=TRANSACTIONAL_FLAG)
    return [
        commands.create_topic("t", 2, 1),
        commands.create_topic("t.x", 1, 1),
        commands.register_producer(1),
        commands.append(
            1, [commands.partition_append("t", 0, one), commands.partition_append("t", 1, idempotent)]
        ),
        commands.join_group("g", member, "range", 2),
        commands.join_group("g", other, "", 3),
        commands.commit_offsets("g", "", 0, [kq_pb2.OffsetEntry(topic="t", partition=0, offset=1)], 4),
        commands.alter_topic_config(
            "t", {"message.timestamp.type": "LogAppendTime", "max.message.bytes": "90"}, []
        ),
        # A transactional id with an open transaction on t-0 and offsets of g pending (producer id 2).
        commands.transaction(
            kq_pb2.InitTransactionCommand(transactional_id="tx", timeout_ms=60_000, now_ms=5)
        ),
        commands.transaction(
            kq_pb2.AddToTransactionCommand(
                transactional_id="tx",
                producer_id=2,
                producer_epoch=0,
                partitions=[kq_pb2.TxnPartition(topic="t", partition=0)],
                groups=["g"],
                now_ms=6,
            )
        ),
        commands.append(1, [commands.partition_append("t", 0, transactional)]),
        commands.transaction(
            kq_pb2.TxnCommitOffsetsCommand(
                transactional_id="tx",
                producer_id=2,
                producer_epoch=0,
                group="g",
                offsets=[kq_pb2.OffsetEntry(topic="t", partition=0, offset=1)],
                commit_ms=7,
            )
        ),
    ]


@contextmanager
def stores(count: int) -> Iterator[list[Store]]:
    with tempfile.TemporaryDirectory() as directory:
        opened = [Store.open(Path(directory) / str(i), map_size_bytes=MAP_BYTES) for i in range(count)]
        try:
            yield opened
        finally:
            for store in opened:
                store.close()


def accepted(command: kq_pb2.Command) -> bool:
    """What the edge lets through: the command and, for appends, every produce request in it."""
    if problem_of(command) is not None:
        return False
    return all(append_problem(a) is None for a in command.append.appends)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(hostile_commands(), min_size=1, max_size=8))
def test_what_the_edge_accepts_applies_without_raising_and_identically(
    fuzzed: list[kq_pb2.Command],
) -> None:
    """Replicas with a history and a fresh one: accepted commands never hit the raise path; bytes agree."""
    with stores(3) as (left, right, fresh):
        for store in (left, right):
            for index, command in enumerate(history(), start=1):
                assert not isinstance(apply(store, index, commands.encode(command)), RejectedResult)
        start = len(history()) + 1
        for offset, command in enumerate(fuzzed):
            data = commands.encode(command)
            results = [apply(store, start + offset, data) for store in (left, right)]
            fresh_result = apply(fresh, offset + 1, data)
            assert results[0] == results[1]
            for result in (*results, fresh_result):
                if accepted(command):
                    assert not isinstance(result, RejectedResult), result
                elif problem_of(command) is not None:
                    assert result == RejectedResult(result.index, problem_of(command) or "")  # type: ignore[union-attr]
        assert left.dump() == right.dump()
        with left.read() as reader:
            assert reader.rejected_entries() == sum(problem_of(c) is not None for c in fuzzed)


@settings(max_examples=300)
@given(cluster_members())
def test_an_accepted_member_is_an_address_pysyncobj_can_hold(member: kq_pb2.Member) -> None:
    """What `cluster_member_problem` accepts becomes a PySyncObj node on every replica (its MEMBERSHIP
    entry): its Raft address must split into a host and an integer port there, as it does here."""
    if cluster_member_problem(member) is not None:
        return
    node = TCPNode(member.raft_address)
    assert node.port == int(member.raft_address.rpartition(":")[2]) and 0 < node.port < 65536
    assert node.host and node.host.isascii()


def test_an_entry_that_raises_is_refused_alike_and_replay_skips_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A planted bug: both replicas abort the transaction, record the index and count; replay is skipped."""

    def explode(writer: object, command: object) -> object:
        raise AssertionError("planted")

    left, right = (Store.open(tmp_path / n, map_size_bytes=MAP_BYTES) for n in ("left", "right"))
    create = commands.encode(commands.create_topic("t", 1, 1))
    trim = commands.encode(commands.trim("t", 0, 0))
    for store in (left, right):
        apply(store, 1, create)
    monkeypatch.setattr(kq.raft.state_machine, "_apply_trim", explode)
    before = left.dump()
    results = [apply(store, 2, trim) for store in (left, right)]
    assert results[0] == results[1] == RejectedResult(2, "AssertionError: planted")
    assert left.dump() == right.dump()
    changed = set(left.dump()) ^ set(before)
    assert {row[0] for row in changed} == {b"meta"}  # Only the applied index and the rejection count.
    assert left.applied_index() == 2
    assert apply(left, 2, trim) == SkippedResult(2)  # Replay after a restart: nothing happens again.
    with left.read() as reader:
        assert reader.rejected_entries() == 1


def test_an_undecodable_entry_is_refused_and_a_newer_one_stops_the_node(tmp_path: Path) -> None:
    """Garbage bytes are refused alike (the log moves on); a newer version's entry raises (fail-stop)."""
    store = Store.open(tmp_path / "s", map_size_bytes=MAP_BYTES)
    result = apply(store, 1, b"\xff\xff\xff")
    assert isinstance(result, RejectedResult) and store.applied_index() == 1
    newer = commands.create_topic("t", 1, 1)
    newer.version = 2
    with pytest.raises(commands.NewerCommandError):
        apply(store, 2, commands.encode(newer))
    assert store.applied_index() == 1


def test_a_full_disk_stops_apply_without_recording_anything(tmp_path: Path) -> None:
    """An environment fault (LMDB map full) raises EnvironmentFaultError; the index does not move."""
    store = Store.open(tmp_path / "small", map_size_bytes=1024 * 1024)
    apply(store, 1, commands.encode(commands.create_topic("t", 1, 1)))
    big = encode_batch([NewRecord(None, b"x" * 1_000_000)] * 2)
    data = commands.encode(commands.append(1, [commands.partition_append("t", 0, big)]))
    with pytest.raises(EnvironmentFaultError, match="MapFullError"):
        apply(store, 2, data)
    assert store.applied_index() == 1
    with store.read() as reader:
        assert reader.rejected_entries() == 0
    assert issubclass(lmdb.MapFullError, kq.raft.state_machine.ENVIRONMENT_ERRORS)


def test_pattern_matching_cost_is_bounded_by_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rebalance matches each distinct pattern once per topic; every accepted pattern's RE2 program
    is within PATTERN_PROGRAM_SIZE_MAX, so one match costs at most that times the name length."""
    calls: list[tuple[str, int]] = []
    original = kq.raft.patterns.matching

    def counting(pattern: str, names: list[str]) -> frozenset[str]:
        calls.append((pattern, len(names)))
        return original(pattern, names)

    monkeypatch.setattr(kq.raft.groups, "matching", counting)
    store = Store.open(tmp_path / "s", map_size_bytes=MAP_BYTES)
    index = 0

    def run(command: kq_pb2.Command) -> object:
        nonlocal index
        index += 1
        return apply(store, index, commands.encode(command))

    topics = 50
    for number in range(topics):
        run(commands.create_topic(f"{'a' * 200}{number}", 1, 1))
    for member_id in ("m1", "m2", "m3"):
        member = kq_pb2.GroupMember(
            member_id=member_id,
            topic_pattern="(a+)+$",
            session_timeout_ms=10_000,
            rebalance_timeout_ms=30_000,
        )
        result = run(commands.join_group("g", member, "", 1))
        assert isinstance(result, GroupResult) and result.error == ErrorCode.OK
    # Per join: one pass for the work bound and one for the rebalance, never one per member.
    assert len(calls) <= 2 * 3 and all(count == topics for _, count in calls)
    for pattern in ("(a+)+$", "(a|a)*b", ".{1,249}", "(" * 30 + "a" + ")" * 30):
        assert pattern_problem(pattern) is None
        assert compile_pattern(pattern).programsize <= PATTERN_PROGRAM_SIZE_MAX
    assert pattern_problem(".{1000}.{1000}") is not None


@given(st.text(max_size=300))
def test_a_name_is_judged_alike_first_and_when_remembered(name: str) -> None:
    """Fuzz: `topic_name_problem` remembers legal names only; a name's verdict (for topics and groups)
    is the same the first time, from memory, and after memory was cleared."""
    kq.raft.validation._LEGAL_NAMES.clear()
    first = topic_name_problem(name)
    again = topic_name_problem(name, "group")
    assert (first is None) == (again is None)
    assert (name in kq.raft.validation._LEGAL_NAMES) == (first is None)
    assert first is None or ("topic" in first and again is not None and "group" in again)


def test_remembered_names_are_bounded() -> None:
    """At most LEGAL_NAMES_KEPT names are kept; a name too long is never kept."""
    kq.raft.validation._LEGAL_NAMES.clear()
    for number in range(LEGAL_NAMES_KEPT + 10):
        assert topic_name_problem(f"t{number}") is None
        assert len(kq.raft.validation._LEGAL_NAMES) <= LEGAL_NAMES_KEPT
    assert topic_name_problem("a" * (TOPIC_NAME_LENGTH_MAX + 1)) is not None
    assert "a" * (TOPIC_NAME_LENGTH_MAX + 1) not in kq.raft.validation._LEGAL_NAMES
