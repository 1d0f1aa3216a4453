"""The append entry's own codec (raft/commands.py `encode_append`, `decode_append`) against protobuf's.

The batcher encodes append entries without protobuf and apply decodes them without it (one copy of
each batch instead of three to five). The one rule holds only if both give protobuf's answer: the
encoder the same bytes as `encode(append(...))`, the decoder for every byte string either None (then
protobuf decodes it, as before) or exactly what protobuf decodes, never an entry protobuf would read
otherwise or refuse. Hypothesis generates entries with hostile values and mutates their bytes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kq.proto import kq_pb2
from kq.proto.limits import APPEND_DECODE_BATCH_BYTES_MIN
from kq.raft import commands
from kq.raft.commands import APPEND_ENTRIES, AppendEntry, RecordsAppend
from kq.raft.results import AppendResult
from kq.raft.state_machine import apply
from kq.storage import Store
from tests.raft.helpers import CLOCK_MS, batch, create

topics = st.one_of(
    st.sampled_from(["", "t", "orders", "é" * 3, "\U0001f600", "a" * 249, "a" * 300]),
    st.text(max_size=20),
)
partitions = st.one_of(st.sampled_from([0, 1, 127, 128, 2**31 - 1, 2**32 - 1]), st.integers(0, 2**32 - 1))
records = st.one_of(st.sampled_from([b"", b"\x00", b"\x80" * 130]), st.binary(max_size=300))
appends = st.builds(RecordsAppend, topics, partitions, records)
timestamps = st.one_of(
    st.sampled_from([0, 1, -1, 127, 128, 2**63 - 1, -(2**63), 1_764_000_000_000]),
    st.integers(-(2**63), 2**63 - 1),
)
epochs = st.one_of(st.sampled_from([0, 1, 127, 128, 2**31 - 1, 2**32 - 1]), st.integers(0, 2**32 - 1))


def _partition(item: RecordsAppend) -> kq_pb2.PartitionAppend:
    """The protobuf message of one plain append (its batch as bytes: a decoded one may be a view)."""
    return commands.partition_append(item.topic, item.partition, bytes(item.records))


def _protobuf(timestamp_ms: int, items: list[RecordsAppend], epoch: int) -> bytes:
    return commands.encode(commands.append(timestamp_ms, [_partition(item) for item in items], epoch))


def _as_entry(data: bytes) -> AppendEntry | None:
    """What protobuf's `decode` reads from `data`, as plain values (None: refused, or not an append)."""
    try:
        command = commands.decode(data)
    except (commands.UnknownCommandError, commands.NewerCommandError):
        return None
    if command.WhichOneof("kind") != "append":
        return None
    append = command.append
    return AppendEntry(
        append.timestamp_ms,
        append.leader_epoch,
        tuple(RecordsAppend(a.topic, a.partition, a.records) for a in append.appends),
    )


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(timestamps, st.lists(appends, max_size=4), epochs)
def test_encoded_as_protobuf_and_decoded_back(
    timestamp_ms: int, items: list[RecordsAppend], epoch: int
) -> None:
    data = commands.encode_append(timestamp_ms, items, epoch)
    assert data == _protobuf(timestamp_ms, items, epoch)
    assert commands.decode_append(data) == AppendEntry(timestamp_ms, epoch, tuple(items))
    assert commands.decode_append(memoryview(data)) == AppendEntry(timestamp_ms, epoch, tuple(items))
    assert sum(commands.append_size(item) for item in items) == len(
        kq_pb2.AppendCommand(appends=[_partition(item) for item in items]).SerializeToString()
    )


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """An append entry's bytes with a few bytes flipped, cut, inserted or dropped."""
    data = bytearray(
        commands.encode_append(draw(timestamps), draw(st.lists(appends, max_size=3)), draw(epochs))
    )
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["flip", "insert", "drop", "cut", "set"]))
        if kind == "flip" and at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=3))
        elif kind == "drop" and at < len(data):
            del data[at]
        elif kind == "cut":
            del data[at:]
        elif kind == "set" and at < len(data):
            data[at] = draw(st.sampled_from([0x00, 0x08, 0x0A, 0x10, 0x12, 0x22, 0x2A, 0x80, 0xC0, 0xFF]))
    return bytes(data)


@settings(max_examples=800, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(mutated(), st.binary(max_size=40)))
def test_decoder_answers_as_protobuf_or_not_at_all(data: bytes) -> None:
    """On any bytes the fast decoder gives protobuf's entry, or None (and protobuf decides); the same
    read from a view of them (a follower's entry is a view of its command)."""
    fast = commands.decode_append(data)
    assert commands.decode_append(memoryview(data)) == fast
    if fast is not None:
        assert fast == _as_entry(data)


def test_other_commands_and_encodings_are_left_to_protobuf() -> None:
    """Another kind, a newer version, a zero value written out, a padded varint, a field out of order."""
    assert commands.decode_append(commands.encode(commands.register_producer(5))) is None
    newer = kq_pb2.Command(version=2)
    newer.append.timestamp_ms = 1
    assert commands.decode_append(newer.SerializeToString()) is None
    one = commands.encode_append(0, [RecordsAppend("t", 1, b"x")], 0)
    assert commands.decode_append(one) == AppendEntry(0, 0, (RecordsAppend("t", 1, b"x"),))
    zero_written = one[:4] + b"\x08\x00" + one[4:]  # timestamp_ms = 0, written out.
    zero_written = zero_written[:3] + bytes([zero_written[3] + 2]) + zero_written[4:]
    assert _as_entry(zero_written) == AppendEntry(0, 0, (RecordsAppend("t", 1, b"x"),))
    assert commands.decode_append(zero_written) is None
    padded = commands.encode_append(0, [RecordsAppend("t", 1, b"x")], 0).replace(b"\x10\x01", b"\x10\x81\x00")
    padded = padded[:3] + bytes([padded[3] + 1]) + padded[4:5] + bytes([padded[5] + 1]) + padded[6:]
    assert _as_entry(padded) == AppendEntry(0, 0, (RecordsAppend("t", 1, b"x"),))
    assert commands.decode_append(padded) is None
    swapped = (
        kq_pb2.PartitionAppend(partition=1).SerializeToString()
        + kq_pb2.PartitionAppend(topic="t").SerializeToString()
    )
    out_of_order = commands.encode_append(0, [], 0)[:2] + b"\x22" + bytes([len(swapped) + 2]) + b"\x12"
    out_of_order += bytes([len(swapped)]) + swapped
    assert _as_entry(out_of_order) == AppendEntry(0, 0, (RecordsAppend("t", 1, b""),))
    assert commands.decode_append(out_of_order) is None


def test_leader_recalls_what_it_encoded_by_identity() -> None:
    """APPEND_ENTRIES gives back the values of the very bytes object it encoded, not of equal bytes."""
    items = [RecordsAppend("t", 0, b"batch")]
    data = APPEND_ENTRIES.encoded(7, items, 3)
    entry = APPEND_ENTRIES.recall(data)
    assert entry == AppendEntry(7, 3, tuple(items)) and entry.appends[0].records is items[0].records
    assert APPEND_ENTRIES.recall(bytes(bytearray(data))) is None


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(timestamps, st.lists(appends, max_size=4), epochs, st.sampled_from([0, 1, 100, 300]))
def test_a_minimum_batch_leaves_smaller_ones_to_protobuf(
    timestamp_ms: int, items: list[RecordsAppend], epoch: int, batch_bytes_min: int
) -> None:
    """With `batch_bytes_min`, the decoder answers as without it when every batch is that long, and
    None (protobuf decodes) when one is shorter."""
    data = commands.encode_append(timestamp_ms, items, epoch)
    decoded = commands.decode_append(data, batch_bytes_min)
    if all(len(item.records) >= batch_bytes_min for item in items):
        assert decoded == commands.decode_append(data) == AppendEntry(timestamp_ms, epoch, tuple(items))
    else:
        assert decoded is None


def test_a_large_entry_applies_alike_decoded_with_or_without_protobuf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry of large batches (a follower's common case) applied through `decode_append` leaves the
    very store the protobuf path leaves, and answers the same."""
    values = [os.urandom(150_000), os.urandom(200_000)]
    parts = [commands.partition_append("t", 0, batch(value)) for value in values]
    entry = commands.encode(commands.append(CLOCK_MS, parts, 3))
    assert all(len(part.records) >= APPEND_DECODE_BATCH_BYTES_MIN for part in parts)
    calls: list[int] = []
    real = commands.decode_append

    def counting(data: bytes, batch_bytes_min: int = 0) -> AppendEntry | None:
        decoded = real(data, batch_bytes_min)
        calls.append(decoded is not None)
        return decoded

    results, dumps = [], []
    for name, fast in (("fast", True), ("protobuf", False)):
        monkeypatch.setattr(commands, "decode_append", counting if fast else lambda *_: None)
        store = Store.open(tmp_path / name, map_size_bytes=64 * 1024**2)
        apply(store, 1, create("t", 1))
        results.append(apply(store, 2, entry))
        dumps.append(store.dump())
        store.close()
    assert calls == [True]  # The fast replica decoded it without protobuf.
    assert results[0] == results[1] and dumps[0] == dumps[1]
    assert isinstance(results[0], AppendResult) and [a.base_offset for a in results[0].appends] == [0, 1]
