"""Hostile field values for the fuzz test: names, integers, patterns, enums, and what the run learned.

Values are drawn from a seeded `random.Random`, so a seed reproduces the same sequence of requests
(up to which node leads). Pools mix legal values (to reach deep code paths) with the edges of every
limit in kq.proto.limits and with values no limit names (control characters, huge integers).
"""

from __future__ import annotations

import random
import string
import threading
from dataclasses import dataclass, field
from typing import TypeVar

from kq.proto.limits import TOPIC_NAME_LENGTH_MAX

Item = TypeVar("Item")
HUGE_TEXT_CHARACTERS = 1_000_000

U32_EDGES = (0, 1, 2, 3, 7, 1_023, 1_024, 1_025, 10_000, 10_001, 2**31 - 1, 2**31, 2**32 - 1)
U64_EDGES = (0, 1, 2, 1_000, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1)
I64_EDGES = (0, 1, -1, -(2**63), 2**63 - 1, 1_700_000_000_000, 2**53, -(2**53))
I32_ENUM_EDGES = (-1, -(2**31), 3, 4, 99, 2**31 - 1)
WAIT_MS = (0, 0, 0, 1, 10, 100, 1_000, 30_000, 30_001, 2**31, 2**32 - 1)
TIMEOUT_MS = (0, 0, 1, 999, 1_000, 1_000, 10_000, 300_000, 300_001, 600_000, 600_001, 2**32 - 1)

# Legal topic names longer and longer: with a backtracking matcher, '(a+)+$' on these takes 2**n steps.
BACKTRACKING_TOPICS = ("a" * 30 + "-", "a" * 60 + "-", "a" * 248 + "-")

ODD_NAMES = (
    "",
    " ",
    ".",
    "..",
    "...",
    "-",
    "_",
    "a",
    "a" * TOPIC_NAME_LENGTH_MAX,
    "a" * (TOPIC_NAME_LENGTH_MAX + 1),
    "é" * 124,  # 248 bytes in UTF-8.
    "é" * 125,  # 250 bytes, 125 characters.
    "😀" * 62,
    "😀" * 63,
    "\x00",
    "a\x00b",
    "\n",
    "a\r\nb",
    "\t",
    "\x1b[31mred\x1b[0m",
    "\u202eevil",
    "a\u0301",
    "\ufeffbom",
    "\uffff",
    "\U0010ffff",
    "名前",
    "../../etc/passwd",
    "a/b",
    "a\\b",
    "a b",
    "$(reboot)",
    "%s%s%n",
    "{0}",
    "'; DROP TABLE topics; --",
    "CON",
    "__proto__",
    "fz-a\x00",
    "FZ-A",
)

PATTERNS = (
    "",
    ".*",
    "fz-.*",
    "a+-",
    "(",
    ")",
    "[",
    "\\",
    "*",
    "a**",
    "a{99999999999}",
    "a{1000}{1000}",
    "(a{1000}){1000}",
    "a{0,65535}",
    "(a+)+$",
    "(a|a)*b",
    "(a|aa)+$",
    "(a*)*$",
    "(.*a){25}",
    "(a+)+-?b",
    "^(([a-z])+.)+[A-Z]([a-z])+$",
    "(?P<n>a)(?P=n)",
    "\\1",
    "(?=a)a",
    "(?<=a)b",
    "(?#comment)x",
    "(?i)" + "a" * 1_000,
    "\\p{L}+",
    "[^\\x00-\\x{10FFFF}]",
    "\x00",
    "x" * 1_024,
    "x" * 1_025,
    "é" * 600,
    "(" * 33 + "a" + ")" * 33,
    "(" * 500 + "a" + ")" * 500,
    "(?:" * 200 + "a" + ")" * 200,
    "(" * 1_000,
    "[" * 1_000,
    "((((((((((a*)*)*)*)*)*)*)*)*)*)*$",
    "(x+x+)+y",
    "(\\w+\\s?)+$",
)

ASSIGNORS = (
    "",
    "range",
    "roundrobin",
    "sticky",
    "RANGE",
    "range\x00",
    "Range ",
    "__class__",
    "eval",
    "x" * 10_000,
)


@dataclass
class Known:
    """Names and ids the run has seen succeed, so later requests reach past the not-found checks."""

    topics: list[str] = field(default_factory=lambda: ["fz-a", "fz-b", *BACKTRACKING_TOPICS])
    groups: list[str] = field(default_factory=lambda: ["fz-group"])
    members: list[tuple[str, str, int]] = field(default_factory=list)  # group, member id, generation
    producer_ids: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def remember(self, items: list[Item], item: Item, bound: int = 64) -> None:
        """Adds `item` to one of the lists, keeping it bounded."""
        with self.lock:
            if item not in items:
                items.append(item)
                del items[:-bound]


class Hostile:
    """Draws hostile values from one seeded generator."""

    def __init__(self, rng: random.Random, known: Known, huge_probability: float) -> None:
        self.rng = rng
        self.known = known
        self.huge_probability = huge_probability

    def chance(self, probability: float) -> bool:
        """True with `probability`."""
        return self.rng.random() < probability

    def huge(self) -> bool:
        """Whether to send one of the rare multi-megabyte values (they cost time on every node)."""
        return self.chance(self.huge_probability)

    def text(self) -> str:
        """A random string: legal name characters, printable ASCII or any code point but surrogates."""
        length = self.rng.choice([0, 1, 2, 5, 20, 100, 248, 249, 250, 300, 2_000])
        alphabet = self.rng.randrange(3)
        if alphabet == 0:
            return "".join(self.rng.choices(string.ascii_letters + string.digits + "._-", k=length))
        if alphabet == 1:
            return "".join(self.rng.choices(string.printable, k=length))
        return "".join(chr(self._code_point()) for _ in range(length))

    def _code_point(self) -> int:
        while True:
            point = self.rng.choice([self.rng.randrange(0x80), self.rng.randrange(0x110000)])
            if not 0xD800 <= point <= 0xDFFF:
                return point

    def name(self, existing: list[str], huge_ok: bool = True) -> str:
        """A topic or group name: an existing one, an odd one, a random one, or (rarely) a huge one."""
        if huge_ok and self.huge():
            return "a" * HUGE_TEXT_CHARACTERS
        roll = self.rng.random()
        with self.known.lock:
            pool = list(existing)
        if roll < 0.45 and pool:
            return self.rng.choice(pool)
        if roll < 0.75:
            return self.rng.choice(ODD_NAMES)
        return self.text()

    def topic(self, huge_ok: bool = True) -> str:
        """A topic name, often one that exists (never a huge one in lists: a thousand would be gigabytes)."""
        return self.name(self.known.topics, huge_ok)

    def group(self) -> str:
        """A group name, often one that exists."""
        return self.name(self.known.groups)

    def member(self) -> tuple[str, str, int]:
        """(group, member id, generation): often a live member, else hostile values."""
        with self.known.lock:
            members = list(self.known.members)
        if members and self.chance(0.6):
            group, member_id, generation = self.rng.choice(members)
            if self.chance(0.3):
                generation = self.u32()
            return group, member_id, generation
        member_id = self.rng.choice(["", "member-1", self.text(), "x" * 256, "\x00"])
        return self.group(), member_id, self.u32()

    def producer(self) -> tuple[int, int, int]:
        """(producer id, epoch, base sequence) of a batch header: none (-1s), a registered id, or hostile
        values within the header's int64, int16 and int32 fields."""
        with self.known.lock:
            registered = list(self.known.producer_ids)
        roll = self.rng.random()
        if roll < 0.5:
            return -1, -1, -1
        if roll < 0.8 and registered:
            producer_id = self.rng.choice(registered)
        else:
            producer_id = self.rng.choice([0, -2, 2**63 - 1, self.rng.getrandbits(63)])
        epoch = self.rng.choice([0, 0, 1, -1, 2**15 - 1, -(2**15)])
        sequence = self.rng.randrange(4) if self.chance(0.6) else self.rng.choice([-1, 2**31 - 2, 2**31 - 1])
        return producer_id, epoch, sequence

    def partition(self) -> int:
        """Mostly a partition that exists (fz-b has three), else an edge."""
        return self.rng.choice([0, 0, 1, 2]) if self.chance(0.7) else self.u32()

    def u32(self) -> int:
        return self.rng.choice(U32_EDGES) if self.chance(0.8) else self.rng.getrandbits(32)

    def u64(self) -> int:
        return self.rng.choice(U64_EDGES) if self.chance(0.8) else self.rng.getrandbits(64)

    def i64(self) -> int:
        return self.rng.choice(I64_EDGES) if self.chance(0.8) else self.rng.getrandbits(64) - 2**63

    def offset(self) -> int:
        """Small offsets (inside the fuzz topics' logs) or 64-bit edges."""
        return self.rng.randrange(50) if self.chance(0.6) else self.u64()

    def enum(self, known_values: int) -> int:
        """A known enum value or an unknown one (proto3 enums are open)."""
        return self.rng.randrange(known_values) if self.chance(0.7) else self.rng.choice(I32_ENUM_EDGES)

    def wait_ms(self) -> int:
        return self.rng.choice(WAIT_MS)

    def timeout_ms(self) -> int:
        return self.rng.choice(TIMEOUT_MS)

    def pattern(self) -> str:
        """A topic pattern: legal, malformed, deeply nested or catastrophic for a backtracking engine."""
        return self.rng.choice(PATTERNS) if self.chance(0.85) else self.text()

    def assignor(self) -> str:
        return self.rng.choice(ASSIGNORS)

    def count(self) -> int:
        """How many items a repeated field gets: none, one, a few, or past a limit."""
        return self.rng.choice([0, 1, 1, 2, 3, 10, 1_001, 10_001])
