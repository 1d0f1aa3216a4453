"""What kq changes in PySyncObj's handling of messages from peers: three Raft safety fixes, all pure.

1. A forwarded proposal ("apply_command" from a follower) is refused. PySyncObj forwards a command
   proposed on a node that is no longer the leader, so a request that a paused (or deposed) leader
   had queued could commit long after the client, told to retry, had its retry and newer requests
   committed: an acknowledged group commit was rolled back that way. kq's brokers only propose on
   the leader; with forwarding refused, a request either commits before its retry or never.
2. A snapshot chunk does not advance the commit index. PySyncObj's follower raised its commit index
   to min(leader's, its own last index) on every append_entries, store-copy chunks included, which
   carry no prevLogIdx: a deposed leader receiving a copy committed and applied its own
   uncommitted entries, and served them, until the copy replaced its store.
3. A resent append loses the entries the follower already holds, so its log is cut only where an
   entry conflicts (same index, different term), as Raft says. PySyncObj cut it from prevLogIdx + 1
   on every append, and logged CRITICAL "truncating already-applied log entries" (hundreds of times
   per node under load): its leader advances a follower's next index as it sends, a late reply
   moves it back, and the leader resends entries the follower has. They were the same entries (same
   index and term), so the state never diverged, but the follower rewrote its journal and briefly
   held a log shorter than what it had applied.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Entry = tuple[Any, int, int]  # PySyncObj's log entry: (command, index, term).
NOT_LEADER = 4  # pysyncobj.FAIL_REASON.NOT_LEADER (a test checks it)


def refusal(message: dict[str, Any]) -> dict[str, Any] | None:
    """The answer to a forwarded proposal: NOT_LEADER for one that waits for an answer, else None."""
    if "request_id" not in message:
        return None
    return {"type": "apply_command_response", "request_id": message["request_id"], "error": NOT_LEADER}


def without_commit_advance(message: dict[str, Any], commit_index: int) -> dict[str, Any]:
    """A store-copy chunk that cannot raise this follower's commit index past `commit_index`."""
    return {**message, "commit_index": min(int(message["commit_index"]), commit_index)}


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
