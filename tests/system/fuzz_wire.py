"""Protobuf wire-format bytes for the fuzz test: a tiny encoder and raw mutations of serialized requests.

The fuzz test sends every request as bytes through identity serializers, so these helpers can write
what the Python protobuf library refuses to: invalid UTF-8 in string fields, wrong wire types,
varints of more than ten bytes, lengths past the end, groups nested thousands deep.
"""

from __future__ import annotations

import random
from collections.abc import Callable

# Wire types of the protobuf encoding.
VARINT, FIXED64, LENGTH_DELIMITED, START_GROUP, END_GROUP, FIXED32 = 0, 1, 2, 3, 4, 5
UNKNOWN_FIELD = 15  # No kq request has a field 15: the parser must skip it.


def varint(value: int) -> bytes:
    """`value` (taken modulo 2**64, so negative numbers get ten bytes) as a base-128 varint."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    """A field key."""
    return varint((field << 3) | wire_type)


def length_delimited(field: int, payload: bytes) -> bytes:
    """A string, bytes or message field."""
    return tag(field, LENGTH_DELIMITED) + varint(len(payload)) + payload


def varint_field(field: int, value: int) -> bytes:
    """An integer, bool or enum field."""
    return tag(field, VARINT) + varint(value)


# Byte strings that are not valid UTF-8 (protobuf rejects them in proto3 `string` fields).
INVALID_UTF8 = (
    b"\xff",
    b"\xc3",
    b"\xed\xa0\x80",  # A lone surrogate in UTF-8 form.
    b"\xc0\x80",  # Overlong NUL.
    b"\xf4\x90\x80\x80",  # Beyond U+10FFFF.
    b"topic\xfe",
)


def nested_unknown_groups(depth: int) -> bytes:
    """An unknown field that opens `depth` groups inside each other, then closes them."""
    return tag(UNKNOWN_FIELD, START_GROUP) * depth + tag(UNKNOWN_FIELD, END_GROUP) * depth


def nested_length_delimited(field: int, depth: int, leaf: bytes = b"") -> bytes:
    """`field` holding `field` holding ... `depth` levels deep (a message field when `field` is one)."""
    payload = leaf
    for _ in range(depth):
        payload = length_delimited(field, payload)
    return payload


def _truncate(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    cut = rng.randrange(len(data)) if data else 0
    return data[:cut], f"cut to {cut} of {len(data)} bytes"


def _flip_bits(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    if not data:
        return b"\x80", "one continuation byte"
    out = bytearray(data)
    flips = rng.randint(1, 4)
    for _ in range(flips):
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out), f"{flips} bit flip(s)"


def _wrong_wire_type(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    field = rng.randint(1, 8)
    wire_type = rng.choice([VARINT, FIXED64, LENGTH_DELIMITED, START_GROUP, END_GROUP, FIXED32, 6, 7])
    body = {
        VARINT: varint(rng.getrandbits(64)),
        FIXED64: rng.randbytes(8),
        LENGTH_DELIMITED: varint(3) + b"abc",
        START_GROUP: b"",
        END_GROUP: b"",
        FIXED32: rng.randbytes(4),
    }.get(wire_type, b"")
    return data + tag(field, wire_type) + body, f"field {field} with wire type {wire_type}"


def _huge_varint(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    field = rng.randint(1, 8)
    kind = rng.randrange(3)
    if kind == 0:
        return data + tag(field, VARINT) + b"\xff" * 11 + b"\x01", f"field {field}: 12-byte varint"
    if kind == 1:
        return data + tag(field, VARINT) + b"\xff" * 9 + b"\x7f", f"field {field}: varint over 2**64"
    return data + tag(field, LENGTH_DELIMITED) + varint((1 << 63) + 5) + b"x", f"field {field}: length 2**63"


def _length_past_end(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    field = rng.randint(1, 8)
    claimed = rng.choice([1, 100, (1 << 31) - 1, (1 << 32) - 1, 1 << 32])
    mutated = data + tag(field, LENGTH_DELIMITED) + varint(claimed) + b"ab"
    return mutated, f"field {field} claims {claimed} bytes"


def _deep_groups(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    depth = rng.choice([64, 101, 200, 5_000, 100_000])
    return data + nested_unknown_groups(depth), f"unknown groups nested {depth} deep"


def _unclosed_group(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    depth = rng.choice([1, 3, 1_000])
    return data + tag(UNKNOWN_FIELD, START_GROUP) * depth, f"{depth} unclosed group(s)"


def _stray_end_group(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    return tag(rng.randint(1, 16), END_GROUP) + data, "end-group tag with no start"


def _field_zero(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    return data + tag(0, rng.choice([VARINT, LENGTH_DELIMITED])) + b"\x00", "field number 0"


def _invalid_utf8_string(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    field = rng.choice([1, 1, 2, 3, 4, 5, 8])
    text = rng.choice(INVALID_UTF8)
    return data + length_delimited(field, text), f"field {field} = invalid UTF-8 {text!r}"


def _duplicate(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    return data + data, "message repeated twice (fields merged)"


def _garbage_tail(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    tail = rng.randbytes(rng.randint(1, 16))
    return data + tail, f"{len(tail)} random trailing bytes"


Mutation = Callable[[random.Random, bytes], tuple[bytes, str]]
MUTATIONS: tuple[Mutation, ...] = (
    _truncate,
    _flip_bits,
    _wrong_wire_type,
    _huge_varint,
    _length_past_end,
    _deep_groups,
    _unclosed_group,
    _stray_end_group,
    _field_zero,
    _invalid_utf8_string,
    _duplicate,
    _garbage_tail,
)


def mutate(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    """A wire-level mutation of a serialized message, and what it did."""
    mutation = rng.choice(MUTATIONS)
    mutated, description = mutation(rng, data)
    return mutated, description


def random_bytes(rng: random.Random) -> tuple[bytes, str]:
    """Bytes with no structure at all."""
    size = rng.choice([0, 1, 2, 3, 5, 8, 16, 64, 256, 4_096])
    return rng.randbytes(size), f"{size} random bytes"
