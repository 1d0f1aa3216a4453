"""Resent append_entries: drop the entries a follower already holds; truncate its log only on a conflict.

Why PySyncObj 0.3.17 logged CRITICAL "truncating already-applied log entries" up to hundreds of times
per node under load: its leader advances a follower's next index as it sends, and a reply that
arrives late (for an earlier message) moves that index back; the leader then sends entries the
follower already has, and the follower deletes everything after prevLogIdx before appending them
again. The entries are the same ones (same index and term, so, by Raft's log matching property,
the same commands): the state machine never diverged, but the follower rewrote its journal and, for
a moment, held a log shorter than what it had applied. Raft's rule is to truncate only where an
entry conflicts (same index, different term); this module applies that rule before PySyncObj's
handler sees the message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Entry = tuple[Any, int, int]  # PySyncObj's log entry: (command, index, term).


def already_held(
    message: dict[str, Any],
    entries_from: Callable[[int, int], Sequence[Entry]],
    last_entry: Entry,
) -> dict[str, Any] | None:
    """The message without the prefix of entries this log already holds, or None to leave it as it is.

    `entries_from(index, count)` reads this log; `last_entry` is its last entry. When every sent
    entry is held and this log goes further with entries of the sender's own term, those are the
    leader's entries too (a leader only appends to its own term), so the message becomes a
    heartbeat at this log's end; an older-term tail is left for PySyncObj to truncate.
    """
    sent: list[Entry] = list(message["entries"])
    previous = int(message["prevLogIdx"])
    at_previous = entries_from(previous, 1)
    if at_previous and at_previous[0][2] != message["prevLogTerm"]:
        return None  # prevLogIdx itself conflicts: PySyncObj answers with a reset.
    held = entries_from(previous + 1, len(sent))
    matching = 0
    for ours, theirs in zip(held, sent, strict=False):
        if ours[1] != theirs[1] or ours[2] != theirs[2]:
            break
        matching += 1
    if matching == 0:
        return None
    if matching < len(sent):
        last_held = sent[matching - 1]
        return {
            **message,
            "entries": sent[matching:],
            "prevLogIdx": last_held[1],
            "prevLogTerm": last_held[2],
        }
    if last_entry[1] > sent[-1][1] and last_entry[2] == message["term"]:
        return {**message, "entries": [], "prevLogIdx": last_entry[1], "prevLogTerm": last_entry[2]}
    return {**message, "entries": [], "prevLogIdx": sent[-1][1], "prevLogTerm": sent[-1][2]}
