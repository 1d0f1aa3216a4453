"""The checker: compares what clients saw (a `History`) with what every node holds after healing.

Pure: no I/O, no clock. Per partition it verifies that
  - every node holds byte-identical records at identical offsets, and the same log start and end;
  - offsets run contiguously from the log start to the log end, with no holes (a compacted topic's
    offsets only rise within those bounds: compaction leaves offsets without a record);
  - the log start moved only where retention is configured;
  - every acknowledged record is present exactly once, at the partition and offset it was acknowledged
    with, unless it is a documented gap (`chaos.gaps`: trimmed below the final log start, or removed
    by compaction), and each producer's acknowledged records appear in its send order;
  - no record whose send failed or timed out (unknown outcome) appears more than once;
  - no record appears that no producer sent;
  - no consumer saw a node's high-water mark (log end offset) go backwards, or beyond the final log end;
  - every record a consumer read is the record the final log holds at that offset (or a documented
    gap there now), and the offsets a consumer skipped hold no record in the final log.
Per consumer group and partition it verifies that
  - the committed offset never goes backwards: the commits the cluster acknowledged, in the order they
    were acknowledged, never decrease; a member (re)joining never reads a committed offset below one
    acknowledged before it asked; and every node finally holds the highest acknowledged one (or more:
    a commit whose answer was lost may have been applied), the same on every node;
  - every acknowledged record (and every record of the final log) below the group's final committed
    offset was delivered to some member at least once, as the final log holds it (documented gaps
    excepted: a member may find them gone before it reads them).
Unexpected client errors (anything but an unknown-outcome timeout) are anomalies too. Documented gaps
are counted by kind (`CheckResult.gaps`), apart from the anomalies.

Records are named by their identity (`chaos.history.record_id`): the value, unique per send, or a
tombstone's identity header.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kq.chaos.gaps import GAP_KINDS, GapRules, Lifecycle, Sighting
from kq.chaos.history import PROBE_PREFIX, Ack, GroupCommit, History, record_id
from kq.client import ConsumerRecord

ANOMALIES_PER_KIND_MAX = 25  # Details kept per kind; the counts are always complete.
NO_COMMITTED_OFFSET = -1  # How a missing committed offset shows in a group anomaly's offsets.


@dataclass(frozen=True, slots=True)
class PartitionLog:
    """One partition as one node holds it."""

    log_start_offset: int
    log_end_offset: int
    records: tuple[ConsumerRecord, ...]


NodeLogs = Mapping[str, Mapping[int, PartitionLog]]  # node -> partition -> log
GroupOffsets = Mapping[str, Mapping[str, Mapping[int, int]]]  # group -> node -> partition -> committed


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One violation, with where it is."""

    kind: str
    detail: str
    partition: int | None = None
    offsets: tuple[int, ...] = ()
    nodes: tuple[str, ...] = ()


@dataclass(slots=True)
class CheckResult:
    """The anomalies found (details capped per kind, counts complete) and what was checked."""

    anomalies: list[Anomaly] = field(default_factory=list)
    anomaly_counts: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    gaps: dict[str, int] = field(default_factory=dict)  # Documented gap kind -> acknowledged records in it.

    def add(self, anomaly: Anomaly) -> None:
        """Counts the anomaly; keeps its details while its kind has fewer than the cap."""
        seen = self.anomaly_counts.get(anomaly.kind, 0)
        self.anomaly_counts[anomaly.kind] = seen + 1
        if seen < ANOMALIES_PER_KIND_MAX:
            self.anomalies.append(anomaly)

    @property
    def ok(self) -> bool:
        """Whether nothing was found."""
        return not self.anomaly_counts


def check(
    history: History,
    logs: NodeLogs,
    group_offsets: GroupOffsets | None = None,
    lifecycle: Lifecycle | None = None,
) -> CheckResult:
    """Every check of the module docstring; `logs` must name at least one node.

    `group_offsets` are the groups' committed offsets read from every node after the run;
    `lifecycle` says which documented gaps the topic may have (default: none).
    """
    result = CheckResult(gaps=dict.fromkeys(GAP_KINDS, 0))
    nodes = sorted(logs)
    assert nodes, "the checker needs at least one node's logs"
    reference = logs[nodes[0]]
    gaps = _gap_rules(history, logs, lifecycle or Lifecycle())
    partitions = sorted({p for node in nodes for p in logs[node]})
    for partition in partitions:
        _check_replicas(result, partition, {node: logs[node].get(partition) for node in nodes})
        for node in nodes:
            log = logs[node].get(partition)
            if log is not None:
                _check_contiguous(result, partition, node, log, gaps.lifecycle.compacted)
                _check_log_start(result, partition, node, log, gaps.lifecycle.trims)
    for number, group in enumerate(_identical_groups(logs, nodes)):
        contents = {p: logs[group[0]][p] for p in logs[group[0]]}
        _check_content(result, history, contents, tuple(group), gaps, count_gaps=number == 0)
    _check_consumers(result, history, reference, gaps)
    for error in history.client_errors:
        at_s = error.at_s - history.origin_s
        result.add(
            Anomaly("client-error", f"{error.client} at t={at_s:.3f} s: {error.kind}: {error.message}")
        )
    group_counts = _check_groups(result, history, reference, group_offsets or {}, gaps)
    gap_counts = {f"gaps_{kind}": count for kind, count in result.gaps.items()}
    result.counts = {**_counts(history, reference, nodes), **group_counts, **gap_counts}
    return result


def _gap_rules(history: History, logs: NodeLogs, lifecycle: Lifecycle) -> GapRules:
    """The documented-gap rules of this run: final log starts (the highest any node holds; nodes that
    disagree are reported as a divergence anyway) and every record known anywhere with its key."""
    starts: dict[int, int] = {}
    for partitions in logs.values():
        for partition, log in partitions.items():
            starts[partition] = max(starts.get(partition, 0), log.log_start_offset)
    held = (record for partitions in logs.values() for log in partitions.values() for record in log.records)
    sightings = [
        *(Sighting(ack.partition, ack.offset, history.keys.get(ack.value)) for ack in history.acks),
        *(Sighting(record.partition, record.offset, record.key) for record in held),
        *(Sighting(read.partition, read.offset, read.key) for read in history.consumed),
        *(Sighting(d.partition, d.offset, d.key) for d in history.group_deliveries),
    ]
    return GapRules(lifecycle, starts, sightings, history.tombstones)


def _check_log_start(result: CheckResult, partition: int, node: str, log: PartitionLog, trims: bool) -> None:
    """Only retention (or a DeleteRecords, which no scenario sends) moves a log start up from 0."""
    if not trims and log.log_start_offset > 0:
        result.add(
            Anomaly(
                "unexpected-trim",
                f"log start {log.log_start_offset} on node {node}, but no retention is configured",
                partition,
                (log.log_start_offset,),
                (node,),
            )
        )


def _check_replicas(result: CheckResult, partition: int, logs: Mapping[str, PartitionLog | None]) -> None:
    """Every node's log equals the first node's: same bounds, same records at the same offsets."""
    nodes = list(logs)
    reference = logs[nodes[0]]
    for node in nodes[1:]:
        log = logs[node]
        if reference is None or log is None:
            if reference is not log:
                missing = nodes[0] if reference is None else node
                result.add(Anomaly("divergence", f"node {missing} has no partition {partition}", partition))
            continue
        if (log.log_start_offset, log.log_end_offset) != (
            reference.log_start_offset,
            reference.log_end_offset,
        ):
            result.add(
                Anomaly(
                    "divergence",
                    f"log bounds [{log.log_start_offset}, {log.log_end_offset}) on node {node} but "
                    f"[{reference.log_start_offset}, {reference.log_end_offset}) on node {nodes[0]}",
                    partition,
                    (log.log_end_offset, reference.log_end_offset),
                    (node, nodes[0]),
                )
            )
        offset = _first_difference(reference.records, log.records)
        if offset is not None:
            result.add(
                Anomaly(
                    "divergence",
                    f"nodes {nodes[0]} and {node} hold different records from offset {offset}",
                    partition,
                    (offset,),
                    (nodes[0], node),
                )
            )


def _first_difference(left: Sequence[ConsumerRecord], right: Sequence[ConsumerRecord]) -> int | None:
    """The offset of the first record that differs (or that only one side has), or None."""
    for mine, theirs in zip(left, right, strict=False):  # Lengths compared below.
        if mine != theirs:
            return min(mine.offset, theirs.offset)
    if len(left) != len(right):
        longer = left if len(left) > len(right) else right
        return longer[min(len(left), len(right))].offset
    return None


def _check_contiguous(
    result: CheckResult, partition: int, node: str, log: PartitionLog, compacted: bool
) -> None:
    """Offsets are log_start, log_start+1, ... log_end-1, with nothing missing; in a compacted topic
    they may skip (compaction leaves gaps) but still rise, within the log's bounds."""
    if compacted:
        _check_rising(result, partition, node, log)
        return
    expected = log.log_start_offset
    for record in log.records:
        if record.offset != expected:
            result.add(
                Anomaly(
                    "hole",
                    f"offset {expected} expected but {record.offset} found on node {node}",
                    partition,
                    (expected, record.offset),
                    (node,),
                )
            )
            expected = record.offset
        expected += 1
    if expected != log.log_end_offset:
        result.add(
            Anomaly(
                "hole",
                f"records end at {expected} but the log end is {log.log_end_offset} on node {node}",
                partition,
                (expected, log.log_end_offset),
                (node,),
            )
        )


def _check_rising(result: CheckResult, partition: int, node: str, log: PartitionLog) -> None:
    """A compacted log's offsets rise strictly from the log start and stay below the log end."""
    floor = log.log_start_offset
    for record in log.records:
        if not floor <= record.offset < log.log_end_offset:
            result.add(
                Anomaly(
                    "hole",
                    f"offset {record.offset} found after {floor - 1} on node {node}, whose log spans "
                    f"[{log.log_start_offset}, {log.log_end_offset})",
                    partition,
                    (floor, record.offset),
                    (node,),
                )
            )
        floor = max(floor, record.offset + 1)


def _identical_groups(logs: NodeLogs, nodes: Sequence[str]) -> list[list[str]]:
    """Nodes grouped by identical logs, so a healthy cluster's content is checked (and reported) once."""
    groups: list[list[str]] = []
    for node in nodes:
        for group in groups:
            if logs[group[0]] == logs[node]:
                group.append(node)
                break
        else:
            groups.append([node])
    return groups


def _check_content(
    result: CheckResult,
    history: History,
    logs: Mapping[int, PartitionLog],
    nodes: tuple[str, ...],
    gaps: GapRules,
    count_gaps: bool,
) -> None:
    """Lost, duplicated, misplaced, reordered and phantom records in one node's (or group's) logs;
    counts the documented gaps when `count_gaps` (for the first group of identical nodes only)."""
    where: dict[bytes | None, list[tuple[int, int]]] = defaultdict(list)
    for partition, log in logs.items():
        for record in log.records:
            where[record_id(record.value, record.headers)].append((partition, record.offset))
    label = ",".join(nodes)
    for value, places in where.items():
        if value is None or value not in history.attempted:
            partition, offset = places[0]
            result.add(
                Anomaly(
                    "phantom", f"record {value!r} was never sent (on {label})", partition, (offset,), nodes
                )
            )
        elif len(places) > 1:
            producer, sequence = history.attempted[value]
            result.add(
                Anomaly(
                    "duplicate",
                    f"{producer} record #{sequence} appears {len(places)} times at {places} (on {label})",
                    places[0][0],
                    tuple(offset for _, offset in places),
                    nodes,
                )
            )
    for ack in history.acks:
        places = where.get(ack.value, [])
        key = history.keys.get(ack.value)
        gap = None if places else gaps.kind(ack.partition, ack.offset, ack.value, key)
        if gap is not None:
            if count_gaps:
                result.gaps[gap] += 1
            continue
        _check_acknowledged(result, ack, places, label, nodes)
    _check_order(result, history.acks, where, label, nodes)


def _check_acknowledged(
    result: CheckResult, ack: Ack, places: Sequence[tuple[int, int]], label: str, nodes: tuple[str, ...]
) -> None:
    """An acknowledged record is where it was acknowledged (a second copy is reported as a duplicate);
    missing, and no documented gap, it is lost."""
    name = f"{ack.producer} record #{ack.sequence}"
    if not places:
        result.add(
            Anomaly(
                "lost",
                f"{name}, acknowledged at {ack.partition}/{ack.offset}, is missing (on {label})",
                ack.partition,
                (ack.offset,),
                nodes,
            )
        )
    elif (ack.partition, ack.offset) not in places:
        result.add(
            Anomaly(
                "misplaced",
                f"{name}, acknowledged at {ack.partition}/{ack.offset}, is at {places} (on {label})",
                ack.partition,
                (ack.offset, *(offset for _, offset in places)),
                nodes,
            )
        )


def _check_order(
    result: CheckResult,
    acks: Iterable[Ack],
    where: Mapping[bytes | None, Sequence[tuple[int, int]]],
    label: str,
    nodes: tuple[str, ...],
) -> None:
    """Per producer and partition, acknowledged records sit at increasing offsets in send order."""
    stored: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)  # -> [(sequence, offset)]
    for ack in acks:
        for partition, offset in where.get(ack.value, [])[:1]:
            stored[(ack.producer, partition)].append((ack.sequence, offset))
    for (producer, partition), pairs in stored.items():
        pairs.sort()
        for (sequence, offset), (next_sequence, next_offset) in itertools.pairwise(pairs):
            if next_offset <= offset:
                result.add(
                    Anomaly(
                        "reordered",
                        f"{producer} sent #{sequence} before #{next_sequence}, but they are at offsets "
                        f"{offset} and {next_offset} (on {label})",
                        partition,
                        (offset, next_offset),
                        nodes,
                    )
                )


def _check_consumers(
    result: CheckResult, history: History, reference: Mapping[int, PartitionLog], gaps: GapRules
) -> None:
    """High-water marks only rise and stay within the final log; consumed records match it, gap-free."""
    last: dict[tuple[str, int], int] = {}
    for seen in history.hwm:
        previous = last.get((seen.consumer, seen.partition))
        if previous is not None and seen.log_end_offset < previous:
            result.add(
                Anomaly(
                    "hwm-regression",
                    f"{seen.consumer} saw the log end of node {seen.node} go from {previous} to "
                    f"{seen.log_end_offset} at t={seen.observed_s - history.origin_s:.3f} s",
                    seen.partition,
                    (previous, seen.log_end_offset),
                    (seen.node,),
                )
            )
        last[(seen.consumer, seen.partition)] = seen.log_end_offset
        final = reference.get(seen.partition)
        if final is not None and seen.log_end_offset > final.log_end_offset:
            result.add(
                Anomaly(
                    "hwm-beyond-log",
                    f"{seen.consumer} saw log end {seen.log_end_offset} on node {seen.node}; the final "
                    f"log ends at {final.log_end_offset}",
                    seen.partition,
                    (seen.log_end_offset, final.log_end_offset),
                    (seen.node,),
                )
            )
    _check_consumed(result, history, reference, gaps)


def _check_consumed(
    result: CheckResult, history: History, reference: Mapping[int, PartitionLog], gaps: GapRules
) -> None:
    """Each consumer read every offset the final log holds, in order, each as the final log holds it.

    A consumer may skip offsets the final log holds no record at (trimmed below the log start it was
    moved to, or compacted away); a record it read that the final log no longer holds must be a
    documented gap now (trimmed or compacted since).
    """
    position: dict[tuple[str, int], int] = {}
    held_offsets = {p: [record.offset for record in log.records] for p, log in reference.items()}
    for record in history.consumed:
        where = (record.consumer, record.partition)
        expected = position.get(where, 0)
        skipped = _held_between(held_offsets.get(record.partition, []), expected, record.offset)
        if record.offset < expected or skipped:
            result.add(
                Anomaly(
                    "consumer-gap",
                    f"{record.consumer} read offset {record.offset} after {expected - 1}"
                    + (f", skipping {len(skipped)} record(s) the final log holds" if skipped else ""),
                    record.partition,
                    (expected, record.offset, *skipped[:1]),
                    (record.node,),
                )
            )
        position[where] = record.offset + 1
        held = _final_record(reference, record.partition, record.offset)
        if held is None and gaps.kind(record.partition, record.offset, record.value, record.key) is not None:
            continue
        if held is None or _identity(held) != record.value:
            result.add(
                Anomaly(
                    "dirty-read",
                    f"{record.consumer} read {record.value!r} at offset {record.offset} from node "
                    f"{record.node} at {_at(history, record.read_s)}; the final log holds "
                    f"{_identity(held)!r}",
                    record.partition,
                    (record.offset,),
                    (record.node,),
                )
            )


def _held_between(offsets: Sequence[int], low: int, high: int) -> list[int]:
    """The offsets in [low, high) among `offsets` (the final log's, rising)."""
    if low >= high:
        return []
    return list(offsets[bisect.bisect_left(offsets, low) : bisect.bisect_left(offsets, high)])


def _identity(record: ConsumerRecord | None) -> bytes | None:
    """A stored record's identity (`record_id`), or None for no record."""
    return None if record is None else record_id(record.value, record.headers)


def _final_record(
    reference: Mapping[int, PartitionLog], partition: int, offset: int
) -> ConsumerRecord | None:
    """The record the final log holds at `offset` of `partition`, or None."""
    final = reference.get(partition)
    return _record_at(final, offset) if final is not None else None


def _record_at(log: PartitionLog, offset: int) -> ConsumerRecord | None:
    position = offset - log.log_start_offset
    if 0 <= position < len(log.records) and log.records[position].offset == offset:
        return log.records[position]
    return next((record for record in log.records if record.offset == offset), None)


def _counts(history: History, reference: Mapping[int, PartitionLog], nodes: Sequence[str]) -> dict[str, int]:
    """What the verdict rests on: records sent, acknowledged, unknown (and how many of those landed)."""
    stored = {_identity(record) for log in reference.values() for record in log.records}
    unknown_values = {unknown.value for unknown in history.unknowns}
    acked_values = {ack.value for ack in history.acks}
    unresolved = set(history.attempted) - acked_values - unknown_values  # Sends still hanging at the end.
    probe_acks = sum(1 for ack in history.acks if ack.producer.startswith(PROBE_PREFIX))
    probe_unknowns = sum(1 for unknown in history.unknowns if unknown.producer.startswith(PROBE_PREFIX))
    return {
        "nodes_read": len(nodes),
        "partitions": len(reference),
        "records_attempted": len(history.attempted),
        "records_acknowledged": len(history.acks),
        "records_unknown": len(unknown_values | unresolved),
        "records_unknown_present": len((unknown_values | unresolved) & stored),
        "records_in_log": sum(len(log.records) for log in reference.values()),
        "probe_records_acknowledged": probe_acks,
        "probe_records_unknown": probe_unknowns,
        "hwm_observations": len(history.hwm),
        "records_consumed": len(history.consumed),
        "client_errors": len(history.client_errors),
        "consumer_resets": history.consumer_resets,
        "log_start_offset_max": max((log.log_start_offset for log in reference.values()), default=0),
    }


# Consumer groups -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Highest:
    """The highest offset of a partition acknowledged up to one commit ack (`at_s`), and its commit."""

    at_s: float
    offset: int
    commit: GroupCommit


Timelines = dict[int, list[_Highest]]  # partition -> one entry per acknowledged commit, in ack order


def _check_groups(
    result: CheckResult,
    history: History,
    reference: Mapping[int, PartitionLog],
    group_offsets: GroupOffsets,
    gaps: GapRules,
) -> dict[str, int]:
    """Both group properties for every group seen; returns the group counts."""
    groups = sorted(
        {commit.group for commit in history.group_commits}
        | {delivery.group for delivery in history.group_deliveries}
        | {seen.group for seen in history.group_observations}
        | set(group_offsets)
    )
    beyond = 0
    for group in groups:
        timelines = _check_commit_order(result, history, group)
        _check_join_reads(result, history, group, timelines)
        limits = _check_final_offsets(result, group, group_offsets.get(group, {}), timelines)
        _check_group_delivery(result, history, group, limits, reference, gaps)
        beyond += sum(1 for ack in history.acks if ack.offset >= limits.get(ack.partition, 0))
    generations = [d.generation for d in history.group_deliveries] + [
        c.generation for c in history.group_commits
    ]
    return {
        "group_records_delivered": len(history.group_deliveries),
        "group_offsets_delivered": len({(d.group, d.partition, d.offset) for d in history.group_deliveries}),
        "group_commits": len(history.group_commits),
        "group_join_reads": len(history.group_observations),
        "group_generation_max": max(generations, default=0),
        "group_fenced": history.group_fenced,
        "group_commits_unknown": history.group_commits_unknown,
        "group_acked_beyond_commit": beyond,
    }


def _at(history: History, at_s: float) -> str:
    return f"t={at_s - history.origin_s:.3f} s"


def _or_none(offset: int | None) -> int:
    """A committed offset, or -1 for none (below every offset), for comparisons and anomaly offsets."""
    return NO_COMMITTED_OFFSET if offset is None else offset


def _check_commit_order(result: CheckResult, history: History, group: str) -> Timelines:
    """Acknowledged commits never decrease per partition, in ack order; returns the running highest.

    Ack order is apply order here: a partition's commits within one generation come from its one
    owner, one at a time, and its next owner joins only after the old one's last commit returned (it
    commits before rejoining) and reads the committed offset with its join's Raft index as min_index.
    """
    timelines: Timelines = defaultdict(list)
    for commit in history.group_commits:
        if commit.group != group:
            continue
        for partition, offset in commit.offsets:
            timeline = timelines[partition]
            top = timeline[-1] if timeline else None
            if top is not None and offset < top.offset:
                result.add(
                    Anomaly(
                        "group-commit-regression",
                        f"group {group}: {commit.member} (generation {commit.generation}) committed "
                        f"{offset}, acknowledged at {_at(history, commit.acked_s)}, after "
                        f"{top.commit.member} (generation {top.commit.generation}) committed {top.offset}, "
                        f"acknowledged at {_at(history, top.commit.acked_s)}",
                        partition,
                        (top.offset, offset),
                    )
                )
                timeline.append(_Highest(commit.acked_s, top.offset, top.commit))
            else:
                timeline.append(_Highest(commit.acked_s, offset, commit))
    return timelines


def _check_join_reads(result: CheckResult, history: History, group: str, timelines: Timelines) -> None:
    """A member (re)joining reads at least every committed offset acknowledged before it asked."""
    for seen in history.group_observations:
        if seen.group != group:
            continue
        timeline = timelines.get(seen.partition, [])
        before = bisect.bisect_left(timeline, seen.requested_s, key=lambda highest: highest.at_s)
        if before == 0:
            continue
        top = timeline[before - 1]
        if seen.committed is None or seen.committed < top.offset:
            result.add(
                Anomaly(
                    "group-commit-regression",
                    f"group {group}: {seen.member} joining generation {seen.generation} read committed "
                    f"offset {seen.committed} at {_at(history, seen.requested_s)}, but {top.commit.member} "
                    f"(generation {top.commit.generation}) had committed {top.offset}, acknowledged at "
                    f"{_at(history, top.at_s)}",
                    seen.partition,
                    (top.offset, _or_none(seen.committed)),
                )
            )


def _check_final_offsets(
    result: CheckResult, group: str, finals: Mapping[str, Mapping[int, int]], timelines: Timelines
) -> dict[int, int]:
    """Every node holds the highest acknowledged commit or more, all alike; returns partition -> final.

    The final committed offset of a partition is the highest any node holds or any ack reported:
    every record below it was claimed processed, so it must have been delivered.
    """
    partitions = sorted(set(timelines) | {p for offsets in finals.values() for p in offsets})
    limits: dict[int, int] = {}
    for partition in partitions:
        timeline = timelines.get(partition)
        top = timeline[-1] if timeline else None
        held = {node: finals[node].get(partition) for node in sorted(finals)}
        if len(set(held.values())) > 1:
            result.add(
                Anomaly(
                    "group-divergence",
                    f"group {group}: nodes hold different committed offsets {held}",
                    partition,
                    tuple(_or_none(offset) for offset in held.values()),
                    tuple(held),
                )
            )
        behind = {node: offset for node, offset in held.items() if top and _or_none(offset) < top.offset}
        if top is not None and behind:
            result.add(
                Anomaly(
                    "group-commit-regression",
                    f"group {group}: finally committed {behind} after {top.commit.member} (generation "
                    f"{top.commit.generation}) committed {top.offset}",
                    partition,
                    (top.offset, *(_or_none(offset) for offset in behind.values())),
                    tuple(behind),
                )
            )
        values = [offset for offset in held.values() if offset is not None]
        limits[partition] = max([*values, *([top.offset] if top else [])], default=0)
    return limits


def _check_group_delivery(
    result: CheckResult,
    history: History,
    group: str,
    limits: Mapping[int, int],
    reference: Mapping[int, PartitionLog],
    gaps: GapRules,
) -> None:
    """Below the final committed offset every acknowledged (and stored) record reached a member,
    except acknowledged records the final log lacks as a documented gap (gone before a member read
    them; one the log lacks otherwise is reported as lost already, and here too)."""
    delivered: dict[tuple[int, int], set[bytes | None]] = defaultdict(set)
    for delivery in history.group_deliveries:
        if delivery.group == group:
            delivered[(delivery.partition, delivery.offset)].add(delivery.value)
    _check_group_reads(result, history, group, reference, gaps)
    checked: set[tuple[int, int]] = set()
    for ack in history.acks:
        if ack.offset < limits.get(ack.partition, 0):
            checked.add((ack.partition, ack.offset))
            if ack.value in delivered.get((ack.partition, ack.offset), set()):
                continue
            gone = _final_record(reference, ack.partition, ack.offset) is None
            if gone and gaps.kind(ack.partition, ack.offset, ack.value, history.keys.get(ack.value)):
                continue
            result.add(_undelivered(group, f"{ack.producer} record #{ack.sequence}", ack, limits))
    for partition, log in sorted(reference.items()):
        for record in log.records:
            if record.offset >= limits.get(partition, 0):
                break
            key = (partition, record.offset)
            if key not in checked and _identity(record) not in delivered.get(key, set()):
                result.add(_undelivered(group, f"record {_identity(record)!r}", record, limits))


def _undelivered(group: str, name: str, where: Ack | ConsumerRecord, limits: Mapping[int, int]) -> Anomaly:
    return Anomaly(
        "group-undelivered",
        f"group {group}: {name} at {where.partition}/{where.offset}, below the final committed offset "
        f"{limits[where.partition]}, was never delivered to a member",
        where.partition,
        (where.offset,),
    )


def _check_group_reads(
    result: CheckResult, history: History, group: str, reference: Mapping[int, PartitionLog], gaps: GapRules
) -> None:
    """Every record delivered to the group is the record the final log holds at its offset (or a
    documented gap there now)."""
    checked: set[tuple[int, int, bytes | None]] = set()
    for delivery in history.group_deliveries:
        key = (delivery.partition, delivery.offset, delivery.value)
        if delivery.group != group or key in checked:
            continue
        checked.add(key)
        held = _final_record(reference, delivery.partition, delivery.offset)
        if held is None and gaps.kind(delivery.partition, delivery.offset, delivery.value, delivery.key):
            continue
        if held is None or delivery.value != _identity(held):
            result.add(
                Anomaly(
                    "group-dirty-read",
                    f"group {group}: {delivery.member} (generation {delivery.generation}) was delivered "
                    f"{delivery.value!r} at offset {delivery.offset} at "
                    f"{_at(history, delivery.delivered_s)}; the final log holds {_identity(held)!r}",
                    delivery.partition,
                    (delivery.offset,),
                )
            )
