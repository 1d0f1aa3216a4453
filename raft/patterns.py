"""Topic patterns of consumer groups: RE2 (linear time, bounded memory), never Python's backtracking `re`.

A pattern subscription is matched against topic names inside apply, on every replica. With a
backtracking engine one crafted pattern (nested quantifiers) froze every node for seconds per topic
name, and one nested a few hundred parentheses deep overflowed Python's recursion limit in compile.
RE2 guarantees matching time linear in `program size x name length` and compiles within `max_mem`;
the edge additionally caps the pattern's length, nesting depth and compiled program size, so the cost
of matching one topic name is bounded by PATTERN_PROGRAM_SIZE_MAX x TOPIC_NAME_LENGTH_MAX steps.

Syntax is RE2's (https://github.com/google/re2/wiki/Syntax): like Python's `re` without
backreferences and lookaround. A pattern must match a whole topic name (as Kafka's subscribe(Pattern)).
"""

from __future__ import annotations

import functools

import re2

from kq.proto.limits import (
    PATTERN_CACHE_MAX,
    PATTERN_MEMORY_BYTES_MAX,
    PATTERN_NESTING_MAX,
    PATTERN_PROGRAM_SIZE_MAX,
    TOPIC_PATTERN_LENGTH_MAX,
)


class PatternError(ValueError):
    """A topic pattern that is malformed or outside the limits; the message says why."""


def _options() -> re2.Options:
    options = re2.Options()
    options.max_mem = PATTERN_MEMORY_BYTES_MAX
    options.log_errors = False  # RE2 would print every rejected pattern to stderr.
    return options


def _nesting_depth(pattern: str) -> int:
    """Deepest parenthesis nesting, counted without parsing (escaped and bracketed ones count too)."""
    depth = deepest = 0
    for character in pattern:
        if character == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif character == ")":
            depth = max(depth - 1, 0)
    return deepest


@functools.lru_cache(maxsize=PATTERN_CACHE_MAX)
def compile_pattern(pattern: str) -> re2._Regexp:
    """The compiled pattern; raises PatternError. Cached: apply matches the same patterns often."""
    if not pattern:
        raise PatternError("topic pattern is empty")
    if len(pattern.encode()) > TOPIC_PATTERN_LENGTH_MAX:
        raise PatternError(f"topic pattern is longer than {TOPIC_PATTERN_LENGTH_MAX} bytes")
    if _nesting_depth(pattern) > PATTERN_NESTING_MAX:
        raise PatternError(f"topic pattern nests parentheses deeper than {PATTERN_NESTING_MAX}")
    try:
        compiled = re2.compile(pattern, _options())
    except re2.error as error:
        raise PatternError(f"bad topic pattern: {_message(error)}") from error
    if compiled.programsize > PATTERN_PROGRAM_SIZE_MAX:
        raise PatternError(
            f"topic pattern compiles to {compiled.programsize} instructions; "
            f"the limit is {PATTERN_PROGRAM_SIZE_MAX}"
        )
    return compiled


def pattern_problem(pattern: str) -> str | None:
    """Why `pattern` cannot be a topic subscription, or None when it can."""
    try:
        compile_pattern(pattern)
    except PatternError as error:
        return str(error)
    return None


def matching(pattern: str, names: list[str]) -> frozenset[str]:
    """The names that `pattern` (already validated) matches in full: linear time per name."""
    compiled = compile_pattern(pattern)
    return frozenset(name for name in names if compiled.fullmatch(name) is not None)


def _message(error: re2.error) -> str:
    text = error.args[0] if error.args else error
    return text.decode(errors="replace") if isinstance(text, bytes) else str(text)
