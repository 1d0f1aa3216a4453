"""The Raft transport's codec (raft/wire.py), pure: every message type round-trips, entries are rebuilt
byte for byte by the receiver, nothing without an exact wire form is sent, and any bytes at all decode
to a message or to WireError, never to something unpickled."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import struct
from typing import Any

import pysyncobj.pickle
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st
from pysyncobj.node import TCPNode

from kq.proto import raft_pb2
from kq.proto.limits import (
    ENTRY_BYTES_MAX,
    RAFT_CHUNK_BYTES_MAX,
    RAFT_SPLIT_ARGUMENT_BYTES_MIN,
    RAFT_WHOLE_MEASURE_BYTES_MAX,
)
from kq.raft import pysyncobj_adapter, wire
from kq.raft.pysyncobj_adapter import (
    ENTRY_CALLS,
    NO_OP_COMMAND,
    EntryCalls,
    entry_command,
    membership_command,
)
from kq.raft.snapshot import header_bytes, read_header
from kq.raft.wire import (
    EntryNotRepresentableError,
    WireError,
    command_from_wire,
    command_to_wire,
    decode_message,
    encode_message,
    encode_message_parts,
    parse_frame,
)

ADDRESSES = ("127.0.0.1:7101", "127.0.0.1:7102", "node-3.example:7103")


def round_trip(message: dict[str, Any]) -> dict[str, Any]:
    return decode_message(encode_message(message), TCPNode)


class Marker:
    """A pickle that would run code: unpickling it calls os.system."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch /tmp/kq-wire-test-marker",))


ENTRIES = [
    (entry_command(0, b"kq command bytes"), 7, 2),
    (entry_command(0, b""), 8, 2),
    (entry_command(0, os.urandom(70_000)), 9, 3),  # Pickled outside protocol 5's frame.
    (NO_OP_COMMAND, 10, 3),
    (membership_command(False, ADDRESSES[2]), 11, 3),
    (membership_command(True, ADDRESSES[1]), 12, 4),
]


@pytest.mark.parametrize(
    "message",
    [
        {"type": "request_vote", "term": 5, "last_log_index": 1_000_000, "last_log_term": 4},
        {"type": "response_vote", "term": 5},
        {
            "type": "append_entries",
            "term": 5,
            "commit_index": 9,
            "entries": [],
            "prevLogIdx": 9,
            "prevLogTerm": 5,
        },
        {
            "type": "append_entries",
            "term": 5,
            "commit_index": 6,
            "entries": ENTRIES,
            "prevLogIdx": 6,
            "prevLogTerm": 2,
        },
        {"type": "append_entries", "term": 5, "commit_index": 9, "serialized": None},
        {"type": "append_entries", "term": 5, "commit_index": 9, "serialized": (b"x" * 1000, False, False)},
        {"type": "append_entries", "term": 5, "commit_index": 9, "serialized": (b"", False, True)},
        {"type": "next_node_idx", "next_node_idx": 42, "reset": True, "success": False},
        {"type": "next_node_idx", "next_node_idx": 43, "reset": False, "success": True},
        {"type": "apply_command", "command": entry_command(0, b"forwarded")},
        {"type": "apply_command", "command": entry_command(0, b"forwarded"), "request_id": 17},
        {"type": "apply_command_response", "request_id": 17, "error": 4},
        {"type": "apply_command_response", "request_id": 18, "log_idx": 99, "log_term": 5},
        {"type": "timeout_now", "term": 6},
        {"type": "kq_keepalive"},
        {"type": "kq_not_a_voter", "term": 7, "commit_index": 1234},
    ],
)
def test_every_message_type_round_trips(message: dict[str, Any]) -> None:
    """Each PySyncObj message kq uses decodes to the very dictionary that was encoded."""
    assert round_trip(message) == message


def test_entries_are_rebuilt_byte_for_byte_as_pysyncobj_and_kq_write_them() -> None:
    """The receiver's command bytes equal the sender's, and PySyncObj's own writers agree with them."""
    decoded = round_trip(
        {
            "type": "append_entries",
            "term": 1,
            "commit_index": 0,
            "entries": ENTRIES,
            "prevLogIdx": 6,
            "prevLogTerm": 2,
        }
    )
    for (sent, index, term), (received, received_index, received_term) in zip(
        ENTRIES, decoded["entries"], strict=True
    ):
        assert bytes(received) == bytes(sent) and (received_index, received_term) == (index, term)
    # PySyncObj's addNodeToCluster(address) writes _bchr(MEMBERSHIP) + pickle.dumps(['add', node.id, node]).
    node = TCPNode(ADDRESSES[2])
    assert membership_command(False, ADDRESSES[2]) == b"\x02" + pysyncobj.pickle.dumps(["add", node.id, node])
    assert NO_OP_COMMAND == b"\x01"


def test_a_store_copy_header_is_rebuilt_by_the_receiver() -> None:
    """The first chunk of a copy travels as fields; the receiver writes a header that reads back the same."""
    cluster = {TCPNode(address) for address in ADDRESSES}
    header = header_bytes((ENTRIES[1], ENTRIES[0], cluster), 1234)
    message = {"type": "append_entries", "term": 5, "commit_index": 9, "serialized": (header, True, False)}
    decoded = round_trip(message)
    data, is_first, is_last = decoded["serialized"]
    assert (is_first, is_last) == (True, False)
    applied_index, (next_entry, start_entry, nodes) = read_header(io.BytesIO(data))
    assert applied_index == 1234 and (next_entry, start_entry) == (ENTRIES[1], ENTRIES[0])
    assert {node.address for node in nodes} == set(ADDRESSES)


def test_a_pickle_in_kq_s_command_bytes_stays_inert_bytes() -> None:
    """An argument holding a malicious pickle is rebuilt as the argument of kq's call: PySyncObj's apply
    unpickles the call and gets the bytes back, never the object they describe."""
    payload = pickle.dumps(Marker())
    entry = raft_pb2.Entry(index=3, term=1, regular=raft_pb2.RegularCommand(method_id=0, argument=payload))
    command = command_from_wire(entry)
    assert pysyncobj.pickle.loads(command[1:]) == (0, (payload,))  # As PySyncObj's apply reads it.


@pytest.mark.parametrize(
    "command",
    [
        b"\x00" + pickle.dumps(Marker()),  # A REGULAR entry that is not kq's call: refused, not unpickled.
        b"\x00" + pysyncobj.pickle.dumps((0, (b"protocol 2",))),  # Not the canonical protocol-5 call.
        b"\x00" + pickle.dumps((0, (b"a", b"b")), protocol=5),  # Two arguments.
        b"\x00" + pickle.dumps((1, (b"a",)), protocol=5),  # A method kq does not have.
        b"\x00" + pickle.dumps((0, (b"a",)), protocol=4),  # Another protocol: other bytes.
        b"\x03" + pysyncobj.pickle.dumps(1),  # PySyncObj's VERSION entry: no wire form.
        b"\x02" + pysyncobj.pickle.dumps(["add", "x:1", Marker()]),  # A membership change kq never writes.
        b"\x01\x00",  # A no-op with a tail.
        b"",
    ],
)
def test_commands_without_an_exact_wire_form_are_refused_by_the_sender(command: bytes) -> None:
    """The sender fails loudly rather than send something the receiver would rebuild differently."""
    message = {
        "type": "append_entries",
        "term": 1,
        "commit_index": 0,
        "entries": [(command, 2, 1)],
        "prevLogIdx": 1,
        "prevLogTerm": 1,
    }
    with pytest.raises(EntryNotRepresentableError):
        encode_message(message)
    assert not os.path.exists("/tmp/kq-wire-test-marker")


@pytest.mark.parametrize(
    "message",
    [
        {
            "type": "append_entries",
            "term": 1,
            "commit_index": 0,
            "transmission": "start",
            "data": b"x",
            "prevLogIdx": 1,
            "prevLogTerm": 1,
        },
        {"type": "unknown"},
        {
            "type": "append_entries",
            "term": 1,
            "commit_index": 0,
            "serialized": (b"not a header", True, False),
        },
    ],
)
def test_messages_without_a_wire_form_are_refused_by_the_sender(message: dict[str, Any]) -> None:
    """PySyncObj's piecewise entries, unknown types and a copy not starting with a header raise."""
    with pytest.raises(EntryNotRepresentableError):
        encode_message(message)


def frame(**fields: Any) -> bytes:
    return raft_pb2.RaftFrame(**fields).SerializeToString()


@pytest.mark.parametrize(
    "data",
    [
        b"",  # No message.
        frame(hello=raft_pb2.Hello(version=1, address="a:1", nonce=b"n")),  # Handshake frames after it.
        frame(
            append_entries=raft_pb2.AppendEntries(entries=[raft_pb2.Entry(index=1, term=1)])
        ),  # No command.
        frame(
            append_entries=raft_pb2.AppendEntries(
                entries=[raft_pb2.Entry(regular=raft_pb2.RegularCommand(method_id=1))]
            )
        ),
        frame(
            append_entries=raft_pb2.AppendEntries(
                entries=[
                    raft_pb2.Entry(regular=raft_pb2.RegularCommand(argument=b"x" * (ENTRY_BYTES_MAX + 1)))
                ]
            )
        ),
        frame(
            append_entries=raft_pb2.AppendEntries(
                entries=[raft_pb2.Entry(membership=raft_pb2.MembershipChange(address="bad address"))]
            )
        ),
        frame(
            append_entries=raft_pb2.AppendEntries(
                chunk=raft_pb2.SnapshotChunk(data=b"x" * (RAFT_CHUNK_BYTES_MAX + 1))
            )
        ),
        frame(append_entries=raft_pb2.AppendEntries(prev_log_index=3, pending=raft_pb2.SnapshotPending())),
        frame(
            append_entries=raft_pb2.AppendEntries(
                chunk=raft_pb2.SnapshotChunk(header=raft_pb2.SnapshotHeader(cluster=["x"]))
            )
        ),
        frame(apply_command_response=raft_pb2.ApplyCommandResponse(request_id=1, error=99)),
        frame(response_vote=raft_pb2.ResponseVote(term=1)) + b"\xf8\x07\x01",  # Unknown field 127.
        frame(response_vote=raft_pb2.ResponseVote(term=1)) * 2,  # A repeated field (non-canonical).
        b"\x80\x05" + pickle.dumps(Marker()),  # A pickle.
    ],
)
def test_frames_out_of_bounds_are_refused_by_the_receiver(data: bytes) -> None:
    """Unknown types or fields, values beyond kq.proto.limits, and handshake frames: WireError."""
    with pytest.raises(WireError):
        decode_message(data, TCPNode)


def valid_frames() -> list[bytes]:
    messages: list[dict[str, Any]] = [
        {
            "type": "append_entries",
            "term": 5,
            "commit_index": 6,
            "entries": ENTRIES[:2] + ENTRIES[3:],
            "prevLogIdx": 6,
            "prevLogTerm": 2,
        },
        {"type": "request_vote", "term": 5, "last_log_index": 1, "last_log_term": 4},
        {"type": "apply_command_response", "request_id": 18, "log_idx": 99, "log_term": 5},
        {"type": "kq_not_a_voter", "term": 5, "commit_index": 1234},  # A two-byte tag (field 40).
    ]
    return [encode_message(message) for message in messages]


@settings(max_examples=500)
@given(st.binary(max_size=512))
def test_random_bytes_decode_or_raise_wire_error_only(data: bytes) -> None:
    """Fuzz: any bytes at all are a message or WireError (nothing else escapes the decoder)."""
    with contextlib.suppress(WireError):
        decode_message(data, TCPNode)


@settings(max_examples=500)
@given(st.sampled_from(valid_frames()), st.data())
def test_mutated_frames_decode_or_raise_wire_error_only(original: bytes, data: st.DataObject) -> None:
    """Fuzz: valid frames with bytes flipped, cut or inserted are a message or WireError."""
    mutated = bytearray(original)
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, max(len(mutated) - 1, 0)))
        action = data.draw(st.sampled_from(("flip", "cut", "insert")))
        if action == "flip" and mutated:
            mutated[position] ^= data.draw(st.integers(1, 255))
        elif action == "cut":
            del mutated[position:]
        else:
            mutated[position:position] = data.draw(st.binary(min_size=1, max_size=8))
    try:
        message = decode_message(bytes(mutated), TCPNode)
    except WireError:
        return
    for entry in message.get("entries", ()):  # Whatever decodes holds only commands kq itself writes.
        assert entry[0][:1] in (b"\x00", b"\x01", b"\x02")
        command_to_wire(entry[0], raft_pb2.Entry())


def test_the_length_prefix_is_four_bytes_big_endian() -> None:
    """The framing DESIGN.md documents: a u32 length, then the RaftFrame (checked by the transport)."""
    from kq.raft import transport

    assert transport._LENGTH.size == 4 and transport._LENGTH.pack(1) == struct.pack(">I", 1)


@settings(max_examples=120, deadline=None)
@given(
    method_id=st.one_of(st.integers(0, 300), st.integers(0, 70_000)),
    size=st.one_of(
        st.sampled_from([0, 1, 255, 256, 257, 65_534, 65_535, 65_536, 65_537, 1 << 20]),
        st.integers(0, 70_000),
    ),
    fill=st.binary(min_size=1, max_size=64),
)
def test_entry_command_is_the_pickle_it_always_was(method_id: int, size: int, fill: bytes) -> None:
    """Logs written by earlier versions hold `bytes([REGULAR]) + pickle.dumps(call, protocol=5)`:
    the command joined from the pickler's pieces (or pickled, past them) must be those very bytes (a
    follower compares them), and a follower's command built around a view of its frame too, with
    the argument a view of the command."""
    argument = (fill * (size // len(fill) + 1))[:size]
    expected = bytes([entry_command(0, b"")[0]]) + pickle.dumps((method_id, (argument,)), protocol=5)
    assert entry_command(method_id, argument) == expected
    assert type(entry_command(method_id, argument)) is bytes
    framed = memoryview(b"frame" + argument + b"rest")[5 : 5 + size]
    command, held = pysyncobj_adapter._command_holding(method_id, framed)
    assert command == expected and type(command) is bytes
    assert bytes(held) == argument
    if method_id < 256:  # Joined: the argument is where the command holds it (no copy of its own).
        assert isinstance(held, memoryview) and held.obj is command


def test_this_pickler_writes_calls_as_the_join_expects() -> None:
    """The joined layout is in use on this Python (the check at import passed): were it not, every
    entry would be pickled, correct but slower, and the test above would not tell."""
    assert pysyncobj_adapter._JOIN_CALLS


def whole_encoding_is_canonical(data: bytes) -> bool:
    """The canonical check as the whole frame encoded again measures it (what `_parsed` computes
    without encoding the arguments)."""
    parsed = raft_pb2.RaftFrame()
    try:
        parsed.ParseFromString(data)
    except (DecodeError, RecursionError, ValueError):
        return False
    parsed.DiscardUnknownFields()
    return parsed.ByteSize() == len(data)


ARGUMENT_SIZES = [
    0,
    1,
    120,
    121,
    122,
    123,
    124,
    125,
    126,
    127,
    128,
    16_375,
    16_378,
    16_380,
    16_383,
    16_384,
    70_000,
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(ARGUMENT_SIZES), min_size=1, max_size=4), st.data())
def test_the_canonical_check_agrees_with_encoding_the_whole_frame(
    sizes: list[int], data: st.DataObject
) -> None:
    """Entries whose arguments put each nested length prefix on either side of a varint byte, whole or
    mutated (bytes flipped, cut or inserted; a field repeated): a frame passes `parse_frame` exactly
    when encoding it whole again gives its length, and the arguments decoded are the ones sent."""
    entries = [(entry_command(0, b"a" * size), 7 + n, 2) for n, size in enumerate(sizes)]
    entries.append((NO_OP_COMMAND, 7 + len(sizes), 2))
    message = {"type": "append_entries", "term": 5, "commit_index": 6, "entries": entries}
    original = encode_message({**message, "prevLogIdx": 6, "prevLogTerm": 2})
    mutated = bytearray(original)
    for _ in range(data.draw(st.integers(0, 3))):
        if not mutated:
            break
        position = data.draw(st.integers(0, len(mutated) - 1))
        action = data.draw(st.sampled_from(("flip", "cut", "insert", "repeat")))
        if action == "flip":
            mutated[position] ^= data.draw(st.integers(1, 255))
        elif action == "cut":
            del mutated[position:]
        elif action == "insert":
            mutated[position:position] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            mutated += mutated[position : position + data.draw(st.integers(1, 12))]
    expected = whole_encoding_is_canonical(bytes(mutated))
    try:
        parse_frame(bytes(mutated))
    except WireError:
        assert not expected
        return
    assert expected
    if bytes(mutated) == original:
        assert decode_message(original, TCPNode)["entries"] == entries


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([size for size in ARGUMENT_SIZES if size < 4096]), min_size=1, max_size=4))
def test_a_small_frame_measured_whole_parses_as_one_measured_without_its_arguments(sizes: list[int]) -> None:
    """A frame of at most RAFT_WHOLE_MEASURE_BYTES_MAX is measured by encoding it whole: the same frame
    (arguments taken out) and arguments as when they are taken out before it is measured."""
    entries = [(entry_command(0, bytes([n]) * size), 7 + n, 2) for n, size in enumerate(sizes)]
    entries.append((NO_OP_COMMAND, 7 + len(sizes), 2))
    message = {"type": "append_entries", "term": 5, "commit_index": 6, "entries": entries}
    data = encode_message({**message, "prevLogIdx": 6, "prevLogTerm": 2})
    assert len(data) <= RAFT_WHOLE_MEASURE_BYTES_MAX
    whole = wire._whole_parsed(data)
    measured_apart = raft_pb2.RaftFrame.FromString(data)
    arguments: list[bytes | memoryview] = []
    assert wire._with_arguments_size(measured_apart, arguments) == len(data)
    assert whole == (measured_apart, arguments)


def test_an_entry_built_here_is_sent_and_rebuilt_as_its_unpickled_copy_would_be() -> None:
    """The sender takes a command it built (EntryCalls) without unpickling it: the frame is the one an
    equal command not built here gets (the full canonical check), and the receiver's rebuild is
    remembered in turn, equal to the original."""
    argument = os.urandom(70_000)
    built = ENTRY_CALLS.built(0, argument)
    stranger = bytes(bytearray(built))  # Equal, but not the object EntryCalls remembers.
    assert ENTRY_CALLS.recall(built) == (0, argument) and ENTRY_CALLS.recall(stranger) is None
    frames = [
        encode_message(
            {
                "type": "append_entries",
                "term": 3,
                "commit_index": 1,
                "prevLogIdx": 1,
                "prevLogTerm": 2,
                "entries": [(command, 2, 3)],
            }
        )
        for command in (built, stranger)
    ]
    assert frames[0] == frames[1]
    received = decode_message(frames[0], TCPNode)["entries"][0][0]
    assert received == built and ENTRY_CALLS.recall(received) == (0, argument)


def test_entry_calls_keep_the_newest_within_their_bounds() -> None:
    """At most `kept` entries and `bytes_max` bytes of arguments (the newest one always), oldest out first."""
    calls = EntryCalls(kept=3, bytes_max=10_000)
    commands = [calls.built(0, bytes([n]) * 3_000) for n in range(5)]
    assert [calls.recall(command) is not None for command in commands] == [False, False, True, True, True]
    big = calls.built(0, b"x" * 20_000)
    assert calls.recall(big) == (0, b"x" * 20_000)
    assert all(calls.recall(command) is None for command in commands)


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.binary(max_size=300).map(lambda argument: ENTRY_CALLS.built(0, argument)),
                st.binary(max_size=300).map(lambda argument: entry_command(0, argument)),  # Not remembered.
                st.sampled_from([NO_OP_COMMAND, membership_command(False, ADDRESSES[2])]),
            ),
            st.integers(0, 2**64 - 1),
            st.integers(0, 2**64 - 1),
        ),
        min_size=1,
        max_size=5,
    ),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
)
def test_an_append_entries_in_pieces_joins_to_its_one_encoding(
    entries: list[tuple[bytes, int, int]], term: int, previous: int
) -> None:
    """The transport sends an AppendEntries as pieces (each batch its own): joined, they are exactly
    `encode_message`'s frame, which the receiver checks canonically; other messages are one piece."""
    message = {
        "type": "append_entries",
        "term": term,
        "commit_index": previous,
        "entries": entries,
        "prevLogIdx": previous,
        "prevLogTerm": term,
    }
    parts = encode_message_parts(message)
    assert b"".join(parts) == encode_message(message)
    assert decode_message(b"".join(parts), TCPNode)["entries"] == entries
    big = [command for command, _, _ in entries if len(command) > 200]
    assert not big or any(len(part) > 200 for part in parts)  # The arguments travel as pieces.
    assert encode_message_parts({"type": "timeout_now", "term": term}) == [
        encode_message({"type": "timeout_now", "term": term})
    ]


LARGE = RAFT_SPLIT_ARGUMENT_BYTES_MIN  # The smallest argument the receiver splits out of a frame.


def _append_frame(entries: list[tuple[bytes, int, int]], term: int, commit: int, previous: int) -> bytes:
    message = {"type": "append_entries", "term": term, "commit_index": commit, "entries": entries}
    return encode_message({**message, "prevLogIdx": previous, "prevLogTerm": term})


def _append_frames() -> st.SearchStrategy[bytes]:
    """AppendEntries frames as the leader sends them: regular entries large enough to be split and
    smaller ones, no-ops and membership changes among them, hostile positions and terms."""
    commands = st.one_of(
        st.integers(LARGE, LARGE + 300).map(lambda size: entry_command(0, os.urandom(size))),
        st.binary(max_size=300).map(lambda argument: entry_command(0, argument)),
        st.sampled_from([NO_OP_COMMAND, membership_command(False, ADDRESSES[2]), entry_command(0, b"")]),
    )
    numbers = st.one_of(st.sampled_from([0, 1, 127, 128, 2**63, 2**64 - 1]), st.integers(0, 2**64 - 1))
    entries = st.lists(st.tuples(commands, numbers, numbers), min_size=1, max_size=3)
    return st.builds(_append_frame, entries, numbers, numbers, numbers)


@st.composite
def _mutated_append_frames(draw: st.DrawFn) -> bytes:
    """A frame with a few bytes flipped, set to a tag-like value, inserted or dropped (near the
    fields protobuf reads more often than inside an argument: the first 64 and last 64 bytes too)."""
    data = bytearray(draw(_append_frames()))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.one_of(st.integers(0, min(63, len(data) - 1)), st.integers(0, len(data) - 1)))
        kind = draw(st.sampled_from(["flip", "set", "insert", "drop"]))
        if kind == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            data[at] = draw(st.sampled_from([0x00, 0x08, 0x10, 0x12, 0x1A, 0x22, 0x2A, 0x80, 0xFF]))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=3))
        else:
            del data[at]
    return bytes(data)


@settings(max_examples=300, deadline=None)
@given(_mutated_append_frames(), st.booleans())
def test_a_split_parse_answers_as_the_whole_parse_or_leaves_it_the_frame(data: bytes, view: bool) -> None:
    """The receiver's split parse (arguments left in the frame, protobuf parses the rest) gives exactly
    the whole parse's frame and arguments, or leaves the frame to the whole parse, which decides."""
    source: bytes | memoryview = memoryview(bytearray(data)) if view else data
    split = wire._split_parsed(source)
    try:
        whole = wire._whole_parsed(data)
    except WireError:
        assert split is None
        return
    if split is not None:
        assert [bytes(argument) for argument in split[1]] == whole[1]
        assert split[0] == whole[0]


def test_large_entries_are_split_out_and_kept_only_inside_their_commands() -> None:
    """A frame of large entries takes the split path; the entries decode to their commands, which
    hold the only copy: the received buffer overwritten afterwards changes nothing, and what apply is
    given back for each command (EntryCalls) is a view of that command."""
    entries = [
        (entry_command(0, os.urandom(LARGE + 7)), 5, 2),
        (NO_OP_COMMAND, 6, 2),
        (entry_command(0, os.urandom(2 * LARGE)), 7, 2),
    ]
    data = _append_frame(entries, 2, 4, 4)
    assert wire._split_parsed(data) is not None
    received = bytearray(data)
    decoded = decode_message(memoryview(received), TCPNode)["entries"]
    received[:] = bytes(len(received))  # The connection's buffer, reused for the next frame.
    assert decoded == entries
    for command, _, _ in (decoded[0], decoded[2]):
        known = ENTRY_CALLS.recall(command)
        assert known is not None and isinstance(known[1], memoryview) and known[1].obj is command
        assert entry_command(0, bytes(known[1])) == command


def test_a_frame_with_a_small_regular_entry_is_parsed_whole() -> None:
    """One regular entry below the split's size sends the frame to protobuf whole (a catch-up of many
    small entries costs the split a walk of one entry), and it decodes the same."""
    entries = [(entry_command(0, os.urandom(LARGE)), 5, 2), (entry_command(0, b"small"), 6, 2)]
    data = _append_frame(entries, 2, 4, 4)
    assert wire._split_parsed(data) is None
    assert decode_message(memoryview(bytearray(data)), TCPNode)["entries"] == entries
