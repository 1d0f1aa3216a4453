"""Kafka leader epochs (KIP-101, KIP-320) from Raft terms: the rule, and the end offset of an epoch (pure).

A partition's leader epoch is the Raft term of its group. The leader's batcher reads its term as it
builds an append entry and carries it in the command (AppendCommand.leader_epoch); apply stamps it
into each batch's partitionLeaderEpoch (outside the batch's CRC, like the base offset) and records
in the partition's `leader_epochs` rows the offset where each new epoch starts (storage/store.py
`append`). apply reads no term from Raft: the epoch is the proposer's, and a stale one (a term read
just before a re-election) is raised to the partition's newest, so epochs never go down in a log.

Epochs are the same on every replica of a group, and a new leader's term is larger than every term
before it, so a consumer that fetched records of epoch E from a leader that was then replaced learns
from OffsetForLeaderEpoch(E) where epoch E ends in the new leader's log: if that is below its
position, the log was truncated under it (Kafka's truncation detection). In kq a committed record is
never truncated, so the answer is never below what a consumer read; the check still runs, and
librdkafka's leader-epoch bookkeeping (the epoch in Metadata, Fetch and ListOffsets) works as with
Kafka.

Batches appended by an entry without an epoch (0: proposed before kq had leader epochs) keep what the
producer sent (-1, Kafka's "no epoch") and add no row.
"""

from __future__ import annotations

from collections.abc import Sequence

UNDEFINED_EPOCH = -1  # Kafka's "no epoch", and its UNDEFINED_EPOCH_OFFSET.
UNDEFINED_EPOCH_OFFSET = -1


def end_offset_for(
    epochs: Sequence[tuple[int, int]], current_epoch: int, requested_epoch: int, log_end_offset: int
) -> tuple[int, int]:
    """(epoch, end offset) that OffsetForLeaderEpoch answers for `requested_epoch`, as Kafka's
    LeaderEpochFileCache.endOffsetFor: the current epoch ends at the log end; an older one at the start
    of the next larger epoch that appended (the log end if none did), answered with the largest epoch
    at or below the requested one that appended (the requested itself when none did); an unknown
    (negative) or future epoch is UNDEFINED_EPOCH / UNDEFINED_EPOCH_OFFSET.

    `epochs`: the partition's (epoch, start offset) rows, ascending; `current_epoch`: its group's term
    now, at least the largest of them (a leader that has not appended yet has no row of its term)."""
    if requested_epoch < 0 or requested_epoch > current_epoch:
        return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
    if requested_epoch == current_epoch:
        return requested_epoch, log_end_offset
    floor_epoch = requested_epoch
    found_floor = False
    for epoch, start_offset in epochs:
        if epoch > requested_epoch:
            return (floor_epoch if found_floor else requested_epoch), start_offset
        floor_epoch, found_floor = epoch, True
    return floor_epoch, log_end_offset


def epoch_at(epochs: Sequence[tuple[int, int]], offset: int) -> int:
    """The epoch of the batch holding `offset` (the largest whose start is at or below it), or
    UNDEFINED_EPOCH when no epoch row covers it (data from before leader epochs)."""
    found = UNDEFINED_EPOCH
    for epoch, start_offset in epochs:
        if start_offset > offset:
            break
        found = epoch
    return found
