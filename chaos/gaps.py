"""Documented gaps: the records retention and key compaction may remove, which are not losses.

Offsets never change in kq. Retention moves a partition's log start (every record below it is gone,
on every node alike); key compaction removes records from stored batches, leaving offsets without a
record, while the log start and end stay where they were. So a record the clients saw (acknowledged
to a producer, read by a consumer, delivered to a group member) that the final log does not hold is a
documented gap only when it is

- **trimmed**: its offset is below the partition's final log start (the checker also requires every
  node to hold the same bounds), in a scenario that configured retention; a log start that moved in
  any other scenario is itself an anomaly (`unexpected-trim`);
- **compacted** (a compacted topic only): a record with the same key sits at a higher offset of the
  same partition, acknowledged to a producer or seen by a reader or in a node's final log (the
  compactor drops a record only once a newer one of its key was committed); or the record has no key
  (the compactor drops those, as Kafka refuses them); or it is a tombstone (null value) that was older
  than `delete.retention.ms` when the final log was read.

Anything else that is missing stays an anomaly (`lost`, `dirty-read`, `consumer-gap`,
`group-undelivered`, ...). Pure: the checker builds the rules from the history and the final logs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

TRIMMED = "trimmed"
COMPACTED = "compacted"
GAP_KINDS = (TRIMMED, COMPACTED)
DELETE_RETENTION_MS_DEFAULT = 86_400_000  # Kafka's default delete.retention.ms, and kq's.


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """What may remove records from the checked topic: which documented gaps are allowed.

    The default (no retention, no compaction) allows none: every record must stay.
    """

    trims: bool = False  # Retention is configured: the log start may move up.
    compacted: bool = False  # cleanup.policy holds compact: superseded records may go.
    delete_retention_ms: int = DELETE_RETENTION_MS_DEFAULT  # How long compaction keeps a tombstone.
    read_wall_ms: int = 0  # Wall clock (ms) when the final logs were read: tombstones expire against it.


@dataclass(frozen=True, slots=True)
class Sighting:
    """A record known at an offset (acknowledged, read, or held by a node), with its key."""

    partition: int
    offset: int
    key: bytes | None


class GapRules:
    """Says whether a record the final log lacks is a documented gap, and of which kind."""

    def __init__(
        self,
        lifecycle: Lifecycle,
        log_starts: Mapping[int, int],
        sightings: Iterable[Sighting],
        tombstones: Mapping[bytes, int],
    ) -> None:
        """`log_starts`: partition -> final log start; `sightings`: every record known anywhere, whose
        keys say which records a newer one superseded; `tombstones`: identity -> CreateTime (ms)."""
        self.lifecycle = lifecycle
        self._log_starts = dict(log_starts)
        self._tombstones = tombstones
        self._newest: dict[tuple[int, bytes], int] = {}  # (partition, key) -> highest offset known.
        if lifecycle.compacted:
            for sighting in sightings:
                if sighting.key is not None:
                    where = (sighting.partition, sighting.key)
                    self._newest[where] = max(self._newest.get(where, -1), sighting.offset)

    def kind(self, partition: int, offset: int, identity: bytes | None, key: bytes | None) -> str | None:
        """TRIMMED or COMPACTED when one of the module docstring's rules explains why the record at
        `offset` of `partition` (named `identity`, keyed `key`) is gone; None when nothing does."""
        if self.lifecycle.trims and offset < self._log_starts.get(partition, 0):
            return TRIMMED
        if not self.lifecycle.compacted:
            return None
        if key is None or self._newest.get((partition, key), -1) > offset:
            return COMPACTED
        created_ms = self._tombstones.get(identity) if identity is not None else None
        if created_ms is None:
            return None
        age_ms = self.lifecycle.read_wall_ms - created_ms
        return COMPACTED if age_ms > self.lifecycle.delete_retention_ms else None
