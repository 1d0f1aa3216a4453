"""The Raft transport's codec: PySyncObj's peer messages to `kq.raft.v1.RaftFrame` bytes and back. Pure.

PySyncObj hands its transport dictionaries (`{"type": "append_entries", "term": 3, ...}`) and expects
the same dictionaries back on the other node. Its own transport pickled them; this codec gives each
message type kq uses an explicit protobuf form (proto/raft.proto) and never unpickles a network byte.

Log entries are the subtle part: an entry's command is bytes PySyncObj later unpickles at apply
(REGULAR: the call; MEMBERSHIP: the change). A peer that could put bytes in an entry could still
smuggle a pickle in, so entries travel as fields (`Entry`: the method id and kq's `Command` bytes; the
voter's address; or nothing for a no-op) and the receiver rebuilds the exact bytes from those plain
values with its own pickler (`command_from_wire`). The sender, in turn, accepts only commands it can
rebuild byte for byte from the fields it sends (`command_to_wire`: a canonical kq call, a no-op, a
membership change): anything else raises `EntryNotRepresentableError`, a bug that must not pass silently,
since a follower would hold other bytes than the leader's journal.

`decode_message` checks every field against `kq.proto.limits` and raises only `WireError`: unknown
message types, unknown fields (protobuf would keep them silently), a non-canonical encoding, values
out of bounds. The transport then drops that connection (raft/transport.py).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError

from kq.proto import raft_pb2
from kq.proto.limits import (
    ENTRY_BYTES_MAX,
    MEMBERS_MAX,
    RAFT_CHUNK_BYTES_MAX,
    RAFT_ENTRIES_PER_MESSAGE_MAX,
    RAFT_FAIL_REASON_MAX,
    RAFT_METHODS,
    RAFT_SPLIT_ARGUMENT_BYTES_MIN,
    RAFT_WHOLE_MEASURE_BYTES_MAX,
)
from kq.raft import local_pickle
from kq.raft.commands import WireReader, varint
from kq.raft.local_pickle import LocalPickleError
from kq.raft.pysyncobj_adapter import (
    ENTRY_CALLS,
    MEMBERSHIP_TYPE,
    NO_OP_COMMAND,
    REGULAR_TYPE,
    entry_command,
    membership_command,
)
from kq.raft.snapshot import header_bytes, read_header
from kq.raft.validation import address_problem
from kq.storage import SnapshotError

KEEPALIVE_TYPE = "kq_keepalive"  # raft/node.py's keepalive message (a type PySyncObj ignores).
NOT_A_VOTER_TYPE = "kq_not_a_voter"  # raft/node.py: a leader tells a removed node (PySyncObj never sees it).
Message = dict[str, Any]
Entry = tuple[bytes, int, int]  # PySyncObj's log entry: (command, index, term).


class WireError(ValueError):
    """Bytes from a peer that are not a valid kq Raft frame: the connection is dropped."""


class EntryNotRepresentableError(ValueError):
    """A local entry or message the wire format has no exact form for (a bug: the sender refuses it)."""


# Entries, sender side -----------------------------------------------------------------------------


def command_to_wire(command: bytes, into: raft_pb2.Entry) -> None:
    """Sets `into`'s command fields from an entry's command bytes; EntryNotRepresentableError unless the
    receiver's `command_from_wire` will rebuild exactly `command` from them."""
    if not command:
        raise EntryNotRepresentableError("an empty command")
    kind = command[0]
    if kind == REGULAR_TYPE:
        method_id, argument = _regular_to_wire(command)
        into.regular.method_id = method_id
        into.regular.argument = bytes(argument)  # Protobuf takes bytes: a view is copied, bytes is itself.
        return
    if command == NO_OP_COMMAND:
        into.no_op.SetInParent()
    elif kind == MEMBERSHIP_TYPE:
        remove, address = _membership_change(command)
        into.membership.remove = remove
        into.membership.address = address
    else:
        raise EntryNotRepresentableError(f"entry type {kind} has no wire form (kq never proposes it)")
    if command_from_wire(into) != command:
        raise EntryNotRepresentableError(
            f"entry of type {kind} is not in the canonical form the receiver rebuilds"
        )


def _regular_to_wire(command: bytes) -> tuple[int, bytes | memoryview]:
    """(method id, argument) of a REGULAR entry's command; EntryNotRepresentableError unless the
    receiver rebuilds exactly `command` from them. The argument may be a view of `command` (an entry
    this node received: `EntryCalls.built`)."""
    known = ENTRY_CALLS.recall(command)  # Built by entry_command from this call: canonical.
    if known is None:
        method_id, called = _regular_call(command)
        if entry_command(method_id, called) != command:  # What the receiver rebuilds.
            raise EntryNotRepresentableError("a regular entry not in the form the receiver rebuilds")
        known = method_id, called
    if len(known[1]) > ENTRY_BYTES_MAX:  # The receiver refuses it (command_from_wire).
        raise EntryNotRepresentableError(f"an entry argument of {len(known[1])} bytes")
    return known


def _regular_call(command: bytes) -> tuple[int, bytes]:
    """(method id, argument) of a REGULAR entry holding one call with one bytes argument."""
    try:
        call = local_pickle.loads(command[1:])
    except LocalPickleError as error:
        raise EntryNotRepresentableError(f"a regular entry that is not kq's call: {error}") from error
    match call:
        case (int() as method_id, (bytes() as argument,)) if 0 <= method_id < RAFT_METHODS:
            return method_id, argument
    raise EntryNotRepresentableError("a regular entry that is not a call of kq's one replicated method")


def _membership_change(command: bytes) -> tuple[bool, str]:
    """(remove, address) of a MEMBERSHIP entry."""
    try:
        change = local_pickle.loads(command[1:])
    except LocalPickleError as error:
        raise EntryNotRepresentableError(f"a membership entry that is not PySyncObj's: {error}") from error
    match change:
        case [("add" | "rem") as kind, str() as address, _]:
            return kind == "rem", address
    raise EntryNotRepresentableError("a membership entry that is not ['add' | 'rem', address, node]")


def entry_to_wire(entry: Entry, into: raft_pb2.Entry) -> None:
    """Sets `into` from a PySyncObj log entry (command, index, term)."""
    command, index, term = entry
    into.index = index
    into.term = term
    command_to_wire(command, into)


# Entries, receiver side ---------------------------------------------------------------------------


def command_from_wire(entry: raft_pb2.Entry, argument: bytes | memoryview | None = None) -> bytes:
    """The command bytes this node's log holds for `entry`, rebuilt from plain values by this node's
    own pickler; WireError for a command out of bounds (checked before anything is built).
    `argument`: a regular entry's argument when `parse_frame` took it out of the entry."""
    which = entry.WhichOneof("command")
    if which == "regular":
        regular = entry.regular
        if regular.method_id >= RAFT_METHODS:
            raise WireError(f"method id {regular.method_id} is not kq's replicated method")
        if argument is None:
            argument = regular.argument  # Each read of the field copies it.
        if len(argument) > ENTRY_BYTES_MAX:
            raise WireError(f"an entry argument of {len(argument)} bytes exceeds {ENTRY_BYTES_MAX}")
        return ENTRY_CALLS.built(regular.method_id, argument)
    if which == "no_op":
        return NO_OP_COMMAND
    if which == "membership":
        problem = address_problem(entry.membership.address, "a voter's address")
        if problem is not None:
            raise WireError(problem)
        return membership_command(entry.membership.remove, entry.membership.address)
    raise WireError("an entry without a command")


def entry_from_wire(entry: raft_pb2.Entry, argument: bytes | memoryview | None = None) -> Entry:
    """PySyncObj's (command, index, term) for `entry` (`argument`: as `command_from_wire` takes it)."""
    return command_from_wire(entry, argument), entry.index, entry.term


# Snapshot headers ---------------------------------------------------------------------------------


def _header_to_wire(chunk: bytes, into: raft_pb2.SnapshotHeader) -> None:
    """Sets `into` from the first chunk of a store copy (this node's own `header_bytes`)."""
    try:
        applied_index, (next_entry, start_entry, cluster) = read_header(io.BytesIO(chunk))
    except (SnapshotError, ValueError) as error:
        raise EntryNotRepresentableError(
            f"a store copy's first chunk is not a snapshot header: {error}"
        ) from error
    into.applied_index = applied_index
    entry_to_wire(next_entry, into.next_entry)
    entry_to_wire(start_entry, into.start_entry)
    into.cluster.extend(sorted(str(node.address) for node in cluster))


def _header_from_wire(header: raft_pb2.SnapshotHeader, node_of: Callable[[str], Any]) -> bytes:
    """The header chunk this node writes for `header` (raft/snapshot.py `header_bytes`)."""
    if len(header.cluster) > MEMBERS_MAX:
        raise WireError(f"a snapshot of {len(header.cluster)} voters exceeds {MEMBERS_MAX}")
    for address in header.cluster:
        problem = address_problem(address, "a voter's address")
        if problem is not None:
            raise WireError(problem)
    nodes = {node_of(address) for address in header.cluster}
    raft_data = (entry_from_wire(header.next_entry), entry_from_wire(header.start_entry), nodes)
    return header_bytes(raft_data, header.applied_index)


# Messages -----------------------------------------------------------------------------------------


def encode_message(message: Message) -> bytes:
    """The RaftFrame bytes of one PySyncObj message; EntryNotRepresentableError if it has no wire form."""
    frame = raft_pb2.RaftFrame()
    kind = message.get("type")
    if kind == "append_entries":
        _append_to_wire(message, frame.append_entries)
    elif kind == "request_vote":
        vote = frame.request_vote
        vote.term, vote.last_log_index = message["term"], message["last_log_index"]
        vote.last_log_term = message["last_log_term"]
    elif kind == "response_vote":
        frame.response_vote.term = message["term"]
    elif kind == "next_node_idx":
        answer = frame.next_node_index
        answer.next_node_index, answer.reset = message["next_node_idx"], message["reset"]
        answer.success = message["success"]
    elif kind == "apply_command":
        command_to_wire(message["command"], frame.apply_command.command)
        if "request_id" in message:
            frame.apply_command.request_id = message["request_id"]
    elif kind == "apply_command_response":
        _response_to_wire(message, frame.apply_command_response)
    elif kind == "timeout_now":
        frame.timeout_now.term = message["term"]
    elif kind == KEEPALIVE_TYPE:
        frame.keepalive.SetInParent()
    elif kind == NOT_A_VOTER_TYPE:
        frame.not_a_voter.term, frame.not_a_voter.commit_index = message["term"], message["commit_index"]
    else:
        raise EntryNotRepresentableError(f"message type {kind!r} has no wire form")
    return frame.SerializeToString()


_FRAME_APPEND_TAG = b"\x2a"  # RaftFrame.append_entries (5), length-delimited.
_ENTRIES_TAG = b"\x2a"  # AppendEntries.entries (5), length-delimited, repeated.
_REGULAR_TAG = b"\x1a"  # Entry.regular (3), length-delimited.
_ARGUMENT_TAG = b"\x12"  # RegularCommand.argument (2), length-delimited.
_METHOD_TAG = b"\x08"  # RegularCommand.method_id (1), varint.
_INDEX_TAG = b"\x08"  # Entry.index (1), varint.
_TERM_TAG = b"\x10"  # Entry.term (2), varint.


def encode_message_parts(message: Message) -> list[bytes | memoryview]:
    """`encode_message(message)` in pieces whose join is those very bytes, an AppendEntries' regular
    arguments (the entries' batches) pieces of their own: the transport hands the pieces to the
    socket, so an entry's bytes are never copied into a protobuf message, its serialization or a
    send buffer (three copies, and one more per follower, before). The pieces around the arguments
    are protobuf's own serialization of the rest; the layout is protobuf's for these fields (each
    message's fields in field-number order, `entries` the last set field of AppendEntries, `regular`
    of Entry, `argument` of RegularCommand): tests/raft/test_wire.py proves the join equal."""
    entries = message.get("entries")
    if message.get("type") != "append_entries" or not entries or "serialized" in message:
        return [encode_message(message)]
    fields = raft_pb2.AppendEntries()  # Everything but the entries.
    _append_to_wire({**message, "entries": ()}, fields)
    body: list[bytes | memoryview] = [fields.SerializeToString()]
    for entry in entries:
        command, index, term = entry
        if not command or command[0] != REGULAR_TYPE:
            small = raft_pb2.Entry()
            entry_to_wire(entry, small)
            serialized = small.SerializeToString()
            body += (_ENTRIES_TAG, varint(len(serialized)), serialized)
            continue
        method_id, argument = _regular_to_wire(command)
        # Entry.index (1) and term (2), RegularCommand.method_id (1): varints, left out when zero.
        regular = _METHOD_TAG + varint(method_id) if method_id else b""
        if argument:
            regular += _ARGUMENT_TAG + varint(len(argument))
        regular_size = len(regular) + len(argument)
        position = _INDEX_TAG + varint(index) if index else b""
        if term:
            position += _TERM_TAG + varint(term)
        head = position + _REGULAR_TAG + varint(regular_size) + regular
        body += (_ENTRIES_TAG + varint(len(head) + len(argument)) + head, argument)
    return [_FRAME_APPEND_TAG, varint(sum(len(part) for part in body)), *body]


def _append_to_wire(message: Message, append: raft_pb2.AppendEntries) -> None:
    append.term = message["term"]
    append.commit_index = message["commit_index"]
    if "transmission" in message:  # PySyncObj's piecewise entry: kq's entries are all below its batch.
        raise EntryNotRepresentableError("an entry sent in pieces (larger than PySyncObj's append batch)")
    if "serialized" in message:
        serialized = message["serialized"]
        if serialized is None:
            append.pending.SetInParent()
            return
        data, is_first, is_last = serialized
        if is_first:
            _header_to_wire(data, append.chunk.header)
        else:
            append.chunk.data = data
        append.chunk.is_last = is_last
        return
    append.prev_log_index = message["prevLogIdx"]
    append.prev_log_term = message["prevLogTerm"]
    for entry in message.get("entries", ()):
        entry_to_wire(entry, append.entries.add())


def _response_to_wire(message: Message, response: raft_pb2.ApplyCommandResponse) -> None:
    response.request_id = message["request_id"]
    if "error" in message:
        response.error = message["error"]
    else:
        response.log_index, response.log_term = message["log_idx"], message["log_term"]


def parse_frame(data: bytes) -> raft_pb2.RaftFrame:
    """The frame in `data`, strictly: WireError for bytes protobuf cannot parse, unknown fields, or an
    encoding other than the canonical one this codec writes."""
    return _parsed(data)[0]


def _parsed(data: bytes | memoryview) -> tuple[raft_pb2.RaftFrame, list[bytes | memoryview]]:
    """`parse_frame`'s frame, and the arguments of its AppendEntries' regular entries, taken out: by
    `_split_parsed` for an AppendEntries of large entries in the canonical form (each argument a view
    of `data`, which the caller consumes before `data` changes), else by `_whole_parsed`."""
    if len(data) >= RAFT_SPLIT_ARGUMENT_BYTES_MIN:
        split = _split_parsed(data)
        if split is not None:
            return split
    return _whole_parsed(data)


def _split_parsed(data: bytes | memoryview) -> tuple[raft_pb2.RaftFrame, list[bytes | memoryview]] | None:
    """`_whole_parsed(data)` for an AppendEntries frame in exactly the canonical form whose regular
    entries each carry RAFT_SPLIT_ARGUMENT_BYTES_MIN or more, with each argument a view of `data` (no
    copy): protobuf parses only the frame without them (`_split_arguments`), where parsing the whole
    copied a view into bytes, each argument into its arena, and again when it was read (7 % of a
    follower's CPU under a 1 KiB Kafka producer, perf). None for any other frame, or any doubt (an
    entry protobuf reads as regular that the split did not take apart): `_whole_parsed` decides.
    tests/raft/test_wire.py checks that the two agree on frames and their mutations."""
    split = _split_arguments(data)
    if split is None:
        return None
    stripped, arguments, taken = split
    frame = raft_pb2.RaftFrame()
    try:
        frame.ParseFromString(stripped)
    except (DecodeError, RecursionError, ValueError):
        return None
    frame.DiscardUnknownFields()
    if frame.ByteSize() != len(stripped) or frame.WhichOneof("message") != "append_entries":
        return None
    entries = frame.append_entries.entries
    if len(entries) != len(taken):
        return None
    for entry, was_regular in zip(entries, taken, strict=True):
        if (entry.WhichOneof("command") == "regular") != was_regular:
            return None
    return frame, arguments


_VARINT_FIELD_TAGS = (b"\x08", b"\x10", b"\x18", b"\x20")  # Fields 1-4, varints.


def _split_arguments(data: bytes | memoryview) -> tuple[bytes, list[bytes | memoryview], list[bool]] | None:
    """An AppendEntries frame in the layout `encode_message_parts` writes, taken apart: the frame
    without its regular entries' arguments (length prefixes adjusted), the arguments (views of
    `data`; b"" for an entry that is not regular), and which entries were regular. Only the canonical
    layout (fields in order, no zero value written, shortest varints, exact lengths) and only
    arguments of RAFT_SPLIT_ARGUMENT_BYTES_MIN or more, so that a frame of many small entries (a
    catch-up) costs this walk one entry before protobuf parses it whole; None for anything else."""
    reader = WireReader(data)
    if not reader.tag(_FRAME_APPEND_TAG) or reader.length() != reader.left() or reader.failed:
        return None
    start = reader.offset
    for tag in _VARINT_FIELD_TAGS:  # term, commit_index, prev_log_index, prev_log_term.
        if reader.tag(tag) and reader.varint() == 0:
            return None
    view = memoryview(data)
    body = [bytes(view[start : reader.offset])]
    arguments: list[bytes | memoryview] = []
    taken: list[bool] = []
    while reader.left() and not reader.failed:
        if not reader.tag(_ENTRIES_TAG):
            return None
        size = reader.length()
        start, end = reader.offset, reader.offset + size
        for tag in _VARINT_FIELD_TAGS[:2]:  # index, term.
            if reader.offset < end and reader.tag(tag) and reader.varint() == 0:
                return None
        position_end = reader.offset
        if not (reader.offset < end and reader.tag(_REGULAR_TAG)):
            reader.offset = end  # Another kind of entry: protobuf reads it as it is.
            body += (_ENTRIES_TAG, varint(size), bytes(view[start:end]))
            arguments.append(b"")
            taken.append(False)
            continue
        if reader.length() != end - reader.offset:
            return None
        method_start = reader.offset
        if reader.offset < end and reader.tag(_METHOD_TAG) and reader.varint() == 0:
            return None
        method_end = reader.offset
        if not (reader.offset < end and reader.tag(_ARGUMENT_TAG)):
            return None  # A regular entry without an argument: not one of the large ones split here.
        if reader.length() != end - reader.offset or end - reader.offset < RAFT_SPLIT_ARGUMENT_BYTES_MIN:
            return None
        argument = view[reader.offset : end]
        reader.offset = end
        method = bytes(view[method_start:method_end])
        entry = bytes(view[start:position_end]) + _REGULAR_TAG + varint(len(method)) + method
        body += (_ENTRIES_TAG, varint(len(entry)), entry)
        arguments.append(argument)
        taken.append(True)
    if reader.failed or not any(taken):
        return None
    rest = b"".join(body)
    return _FRAME_APPEND_TAG + varint(len(rest)) + rest, arguments, taken


def _whole_parsed(data: bytes | memoryview) -> tuple[raft_pb2.RaftFrame, list[bytes | memoryview]]:
    """The frame parsed whole, and its arguments taken out (`_parsed`).

    The canonical check compares the length of the frame encoded again with the bytes received.
    Encoding copies every byte, an entry's megabytes too, so in a frame of more than
    RAFT_WHOLE_MEASURE_BYTES_MAX the arguments are taken out first (each read of them copies once, as
    reading them later would), the rest is measured, and their fields' lengths are added back at each
    level they nest in (`_with_arguments_size`); a smaller frame (one record in flight) is measured
    whole, then its arguments read (the same sizes, a third of the calls)."""
    frame = raft_pb2.RaftFrame()
    try:
        frame.ParseFromString(data)  # type: ignore[arg-type]  # upb reads any buffer: a large frame's view.
    except (DecodeError, RecursionError, ValueError) as error:
        raise WireError(f"not a Raft frame: {error}") from error
    frame.DiscardUnknownFields()
    arguments: list[bytes | memoryview] = []  # Bytes here (read out of protobuf); views by `_split_parsed`.
    if frame.WhichOneof("message") != "append_entries" or not frame.append_entries.entries:
        size = frame.ByteSize()
    elif len(data) <= RAFT_WHOLE_MEASURE_BYTES_MAX:
        size = frame.ByteSize()
        _take_arguments(frame.append_entries, arguments)
    else:
        size = _with_arguments_size(frame, arguments)
    if size != len(data):  # Unknown fields (now discarded), repeated or padded fields.
        raise WireError("a Raft frame with unknown or repeated fields")
    return frame, arguments


def _take_arguments(append: raft_pb2.AppendEntries, arguments: list[bytes | memoryview]) -> None:
    """Moves each entry's regular argument into `arguments` (b"" for an entry without one)."""
    for entry in append.entries:
        if entry.WhichOneof("command") != "regular":
            arguments.append(b"")
            continue
        arguments.append(entry.regular.argument)  # Read once: each read of the field copies it.
        entry.regular.ClearField("argument")


def _with_arguments_size(frame: raft_pb2.RaftFrame, arguments: list[bytes | memoryview]) -> int:
    """The canonical size of `frame`, whose AppendEntries has entries, after moving each entry's
    regular argument into `arguments` (b"" for an entry without one): each nested message's size
    without the arguments, plus what they add to it and to the length prefixes around it."""
    append = frame.append_entries
    _take_arguments(append, arguments)
    added = 0  # To the AppendEntries' size, from its entries' grown sizes and length prefixes.
    for entry, argument in zip(append.entries, arguments, strict=True):
        if not argument:
            continue
        regular_after = entry.regular.ByteSize()
        regular_full = regular_after + _field_size(len(argument))
        entry_after = entry.ByteSize()
        entry_full = entry_after - _field_size(regular_after) + _field_size(regular_full)
        added += _field_size(entry_full) - _field_size(entry_after)
    append_after = append.ByteSize()
    append_full = append_after + added
    return frame.ByteSize() - _field_size(append_after) + _field_size(append_full)


def _field_size(length: int) -> int:
    """The bytes of a length-delimited field of `length` bytes: its one-byte tag (field numbers below
    16), its length varint, its content."""
    return 1 + (max(length, 1).bit_length() + 6) // 7 + length


def decode_message(data: bytes | memoryview, node_of: Callable[[str], Any]) -> Message:
    """The PySyncObj message in one frame after the handshake; WireError for anything else.

    `node_of(address)` builds PySyncObj's node object for a voter named in a snapshot header."""
    frame, arguments = _parsed(data)
    kind = frame.WhichOneof("message")
    if kind == "append_entries":
        return _append_from_wire(frame.append_entries, arguments, node_of)
    if kind == "request_vote":
        vote = frame.request_vote
        return {
            "type": "request_vote",
            "term": vote.term,
            "last_log_index": vote.last_log_index,
            "last_log_term": vote.last_log_term,
        }
    if kind == "response_vote":
        return {"type": "response_vote", "term": frame.response_vote.term}
    if kind == "next_node_index":
        answer = frame.next_node_index
        return {
            "type": "next_node_idx",
            "next_node_idx": answer.next_node_index,
            "reset": answer.reset,
            "success": answer.success,
        }
    if kind == "apply_command":
        command: Message = {
            "type": "apply_command",
            "command": command_from_wire(frame.apply_command.command),
        }
        if frame.apply_command.HasField("request_id"):
            command["request_id"] = frame.apply_command.request_id
        return command
    if kind == "apply_command_response":
        return _response_from_wire(frame.apply_command_response)
    if kind == "timeout_now":
        return {"type": "timeout_now", "term": frame.timeout_now.term}
    if kind == "keepalive":
        return {"type": KEEPALIVE_TYPE}
    if kind == "not_a_voter":
        notice = frame.not_a_voter
        return {"type": NOT_A_VOTER_TYPE, "term": notice.term, "commit_index": notice.commit_index}
    raise WireError(f"message {kind!r} is not a Raft message" if kind else "a frame without a message")


def _append_from_wire(
    append: raft_pb2.AppendEntries, arguments: list[bytes | memoryview], node_of: Callable[[str], Any]
) -> Message:
    """PySyncObj's AppendEntries message; `arguments`: its regular entries' (`_parsed`)."""
    message: Message = {"type": "append_entries", "term": append.term, "commit_index": append.commit_index}
    snapshot = append.WhichOneof("snapshot")
    if snapshot is not None:
        if append.entries or append.prev_log_index or append.prev_log_term:
            raise WireError("a store-copy message with log entries")
        if snapshot == "pending":
            message["serialized"] = None
            return message
        chunk = append.chunk
        content = chunk.WhichOneof("content")
        if content == "header":
            message["serialized"] = (_header_from_wire(chunk.header, node_of), True, chunk.is_last)
        elif content == "data" or (content is None and chunk.is_last):
            if len(chunk.data) > RAFT_CHUNK_BYTES_MAX:
                raise WireError(
                    f"a store-copy chunk of {len(chunk.data)} bytes exceeds {RAFT_CHUNK_BYTES_MAX}"
                )
            message["serialized"] = (chunk.data, False, chunk.is_last)
        else:
            raise WireError("a store-copy chunk without content")
        return message
    if len(append.entries) > RAFT_ENTRIES_PER_MESSAGE_MAX:
        raise WireError(f"{len(append.entries)} entries exceed {RAFT_ENTRIES_PER_MESSAGE_MAX}")
    message["entries"] = [
        entry_from_wire(entry, argument) for entry, argument in zip(append.entries, arguments, strict=True)
    ]
    message["prevLogIdx"] = append.prev_log_index
    message["prevLogTerm"] = append.prev_log_term
    return message


def _response_from_wire(response: raft_pb2.ApplyCommandResponse) -> Message:
    message: Message = {"type": "apply_command_response", "request_id": response.request_id}
    if response.HasField("error"):
        if response.error > RAFT_FAIL_REASON_MAX:
            raise WireError(f"failure reason {response.error} is not PySyncObj's")
        message["error"] = response.error
    else:
        message["log_idx"], message["log_term"] = response.log_index, response.log_term
    return message
