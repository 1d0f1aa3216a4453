"""A resent append_entries loses the entries the follower holds, so its log is cut only where it conflicts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pysyncobj import FAIL_REASON

from kq.raft.inbound import Entry, already_held, refusal, without_commit_advance


class Log:
    """A follower's log: entries from index `first`, each (command, index, term)."""

    def __init__(self, terms: list[int], first: int = 1) -> None:
        self.entries: list[Entry] = [(f"c{first + i}", first + i, term) for i, term in enumerate(terms)]

    def entries_from(self, index: int, count: int) -> Sequence[Entry]:
        offset = index - self.entries[0][1]
        return [] if offset < 0 else self.entries[offset : offset + count]


def message(previous: int, previous_term: int, entries: list[Entry], term: int = 2) -> dict[str, Any]:
    return {
        "type": "append_entries",
        "term": term,
        "prevLogIdx": previous,
        "prevLogTerm": previous_term,
        "entries": entries,
        "commit_index": 1,
    }


def test_a_fully_held_resend_becomes_a_heartbeat_at_the_log_end() -> None:
    """Entries 3-4 resent while the follower holds 1-6 of the current term: nothing is truncated."""
    log = Log([1, 2, 2, 2, 2, 2])
    trimmed = already_held(message(2, 2, log.entries[2:4]), log.entries_from, log.entries[-1])
    assert trimmed is not None and trimmed["entries"] == [] and trimmed["prevLogIdx"] == 6


def test_a_partly_held_resend_keeps_only_the_new_entries() -> None:
    """Entries 3-5 resent to a follower with 1-4: only entry 5 remains, after entry 4."""
    log = Log([1, 2, 2, 2])
    sent = [("c3", 3, 2), ("c4", 4, 2), ("c5", 5, 2)]
    trimmed = already_held(message(2, 2, sent), log.entries_from, log.entries[-1])
    assert trimmed is not None and trimmed["entries"] == [("c5", 5, 2)] and trimmed["prevLogIdx"] == 4


def test_a_conflict_is_left_to_pysyncobj_to_truncate() -> None:
    """Entry 3 of an older term where the leader has term 2: the message is not touched."""
    log = Log([1, 1, 1, 1])
    sent = [("x3", 3, 2)]
    assert already_held(message(2, 1, sent), log.entries_from, log.entries[-1]) is None


def test_an_older_term_tail_after_held_entries_is_still_truncated() -> None:
    """All sent entries held, then entries of an older term: PySyncObj cuts after the sent ones."""
    log = Log([1, 1, 1, 1, 1])
    sent = [("c2", 2, 1), ("c3", 3, 1)]
    trimmed = already_held(message(1, 1, sent, term=3), log.entries_from, log.entries[-1])
    assert trimmed is not None and trimmed["entries"] == [] and trimmed["prevLogIdx"] == 3


def test_a_mismatched_previous_entry_is_left_alone() -> None:
    """prevLogTerm differs from the follower's: PySyncObj answers with a reset, untouched."""
    log = Log([1, 1, 1])
    assert already_held(message(2, 2, [("c3", 3, 1)]), log.entries_from, log.entries[-1]) is None


def test_a_forwarded_proposal_is_refused_as_not_leader() -> None:
    """A follower's forwarded command gets PySyncObj's NOT_LEADER; one that expects no answer is dropped."""
    answer = refusal({"type": "apply_command", "command": b"x", "request_id": 7})
    assert answer == {"type": "apply_command_response", "request_id": 7, "error": FAIL_REASON.NOT_LEADER}
    assert refusal({"type": "apply_command", "command": b"x"}) is None


def test_a_store_copy_chunk_cannot_commit_this_followers_own_entries() -> None:
    """The leader's commit index in a snapshot chunk is capped at the follower's own commit index."""
    chunk = {"type": "append_entries", "term": 3, "commit_index": 900, "serialized": (b"...", False, False)}
    assert without_commit_advance(chunk, 40)["commit_index"] == 40
    assert without_commit_advance({**chunk, "commit_index": 10}, 40)["commit_index"] == 10
