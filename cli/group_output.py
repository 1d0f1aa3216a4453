"""Pure formatting for consumer groups: the list and lag tables, headings, JSON documents, dates.

Like `cli.output`, nothing here does I/O, so it is unit-tested without a cluster. A group described
in JSON is one document:

    {"name": "g", "phase": "stable", "generation": 2, "assignor": "range", "served_by": "1",
     "members": [{"member_id": "kq-consume-1f0c…", "client_id": "kq-consume",
                  "subscription": ["demo"], "partitions": [{"topic": "demo", "partition": 0}]}],
     "partitions": [{"topic": "demo", "partition": 0, "member_id": "kq-consume-1f0c…",
                     "committed_offset": 5, "below_log_start": false, "log_start_offset": 0,
                     "log_end_offset": 7, "lag": 2}],
     "total_lag": 2}

A partition without a committed offset has `"committed_offset": null` (`-` in the table) and its lag
counts from the log start, which is what a consumer resetting to `earliest` has left to read. A
committed offset below the log start (retention deleted those records) shows `(below start)` and
`"below_log_start": true`; its lag counts from the log start too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from rich.table import Table

from kq.cli.output import counted, plain_table
from kq.client.types import GroupDescription, GroupSummary

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NO_VALUE = "-"  # A table cell with nothing to show: no committed offset, no owning member.


def groups_table(summaries: Sequence[GroupSummary]) -> Table:
    """One row per group: name, phase, generation, member count."""
    table = plain_table("group", "phase", "generation", "members")
    for summary in summaries:
        table.add_row(summary.name, summary.phase, str(summary.generation), str(summary.members))
    return table


def group_summary_to_dict(summary: GroupSummary) -> dict[str, Any]:
    """A line of `groups list` as a JSON-ready dict."""
    return {
        "name": summary.name,
        "phase": summary.phase,
        "generation": summary.generation,
        "members": summary.members,
    }


def group_heading(description: GroupDescription) -> str:
    """The line above a group's lag table: its phase, generation, assignor, members and source."""
    return (
        f"group {description.name}: {description.phase}, generation {description.generation}, "
        f"assignor {description.assignor or NO_VALUE}, {counted(len(description.members), 'member')}; "
        f"served by node {description.served_by}"
    )


def lag_table(description: GroupDescription) -> Table:
    """One row per partition the group owns or has committed to, with its lag."""
    table = plain_table("topic", "partition", "member", "committed", "log start", "log end", "lag")
    for p in description.partitions:
        committed = NO_VALUE if p.committed_offset is None else str(p.committed_offset)
        if p.below_log_start:
            committed += " (below start)"
        table.add_row(
            p.topic,
            str(p.partition),
            p.member_id or NO_VALUE,
            committed,
            str(p.log_start_offset),
            str(p.log_end_offset),
            str(p.lag),
        )
    return table


def total_lag_line(description: GroupDescription) -> str:
    """The line under the lag table."""
    return f"total lag: {counted(description.total_lag, 'record')}"


def group_to_dict(description: GroupDescription) -> dict[str, Any]:
    """A group description as a JSON-ready dict (the layout in this module's docstring)."""
    return {
        "name": description.name,
        "phase": description.phase,
        "generation": description.generation,
        "assignor": description.assignor,
        "served_by": description.served_by,
        "members": [
            {
                "member_id": member.member_id,
                "client_id": member.client_id,
                "subscription": list(member.subscription),
                "partitions": _partition_dicts(member.partitions),
            }
            for member in description.members
        ],
        "partitions": [
            {
                "topic": p.topic,
                "partition": p.partition,
                "member_id": p.member_id or None,
                "committed_offset": p.committed_offset,
                "below_log_start": p.below_log_start,
                "log_start_offset": p.log_start_offset,
                "log_end_offset": p.log_end_offset,
                "lag": p.lag,
            }
            for p in description.partitions
        ],
        "total_lag": description.total_lag,
    }


def _partition_dicts(partitions: Iterable[tuple[str, int]]) -> list[dict[str, Any]]:
    return [{"topic": topic, "partition": partition} for topic, partition in partitions]


def offsets_table(offsets: Mapping[tuple[str, int], int]) -> Table:
    """One row per partition: the group's new committed offset."""
    table = plain_table("topic", "partition", "offset")
    for (topic, partition), offset in sorted(offsets.items()):
        table.add_row(topic, str(partition), str(offset))
    return table


def offsets_to_dict(group: str, offsets: Mapping[tuple[str, int], int]) -> dict[str, Any]:
    """A reset's outcome as a JSON-ready dict."""
    return {
        "group": group,
        "offsets": [
            {"topic": topic, "partition": partition, "offset": offset}
            for (topic, partition), offset in sorted(offsets.items())
        ],
    }


def assignment_text(partitions: Sequence[tuple[str, int]]) -> str:
    """`demo 0,1; logs 2`: partitions grouped by topic, or `no partitions`."""
    if not partitions:
        return "no partitions"
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return "; ".join(f"{topic} {','.join(map(str, numbers))}" for topic, numbers in by_topic.items())


def datetime_to_ms(text: str) -> int:
    """An ISO 8601 date and time as milliseconds since the epoch; without a zone it is local time.

    Local time for a bare date and time is what Kafka's `--to-datetime` does. Raises ValueError.
    """
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.astimezone()  # Interprets the naive time in the local zone.
    return (moment - EPOCH) // timedelta(milliseconds=1)  # Exact: no float seconds in between.


def ms_to_text(timestamp_ms: int) -> str:
    """Milliseconds since the epoch as UTC ISO 8601 to the millisecond."""
    moment = EPOCH + timedelta(milliseconds=timestamp_ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{timestamp_ms % 1000:03d}Z"
