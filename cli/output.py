"""Pure formatting for the CLI: record lines (plain and JSON), tables, JSON documents, summaries.

Nothing here does I/O except `print_table` and `print_json`; everything else returns bytes, text or a
`rich` table, so it is unit-tested without a cluster.

A consumed record in JSON is one object per line:

    {"topic": "t", "partition": 0, "offset": 7, "timestamp_ms": 1700000000000,
     "timestamp_type": "CreateTime", "key": "k", "key_base64": false,
     "value": "hello", "value_base64": false, "headers": [{"name": "h", "value": "v", "value_base64": false}]}

Bytes that are valid UTF-8 are written as text; other bytes as base64, with the `*_base64` flag
true. A missing key or value is `null`.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from kq.client import ConsumerRecord, KqClientError, NodeStatus, TopicInfo, group_leaders
from kq.client.types import PeerState, TopicConfigValue, TopicDescription

TABLE_WIDTH_NOT_TTY = 200  # Characters; rich would squeeze tables into 80 when output is a pipe.
NULL_PLAIN = b"null"  # How the plain format shows a missing key or value (as Kafka's console consumer).
TIMESTAMP_TYPE_NAMES = {0: "CreateTime", 1: "LogAppendTime"}

Formatter = Callable[[ConsumerRecord], bytes]  # A record as one output line, without the newline.


def counted(count: int, noun: str) -> str:
    """`1 partition`, `3 partitions`: a count with its noun in the right number."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


# Records ----------------------------------------------------------------------------------------


def format_plain(record: ConsumerRecord, *, print_key: bool = False, key_separator: bytes = b"\t") -> bytes:
    """A record as one output line (without the newline): its value, or key SEP value."""
    value = NULL_PLAIN if record.value is None else record.value
    if not print_key:
        return value
    key = NULL_PLAIN if record.key is None else record.key
    return key + key_separator + value


def bytes_to_json(data: bytes | None) -> tuple[str | None, bool]:
    """(text, is_base64): UTF-8 text when `data` decodes, else base64; (None, False) for no data."""
    if data is None:
        return None, False
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), True


def record_to_dict(record: ConsumerRecord) -> dict[str, Any]:
    """A record as a JSON-ready dict (the layout in this module's docstring)."""
    key, key_base64 = bytes_to_json(record.key)
    value, value_base64 = bytes_to_json(record.value)
    headers = []
    for name, header_value in record.headers:
        text, text_base64 = bytes_to_json(header_value)
        headers.append({"name": name, "value": text, "value_base64": text_base64})
    return {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "timestamp_type": TIMESTAMP_TYPE_NAMES.get(record.timestamp_type, str(record.timestamp_type)),
        "key": key,
        "key_base64": key_base64,
        "value": value,
        "value_base64": value_base64,
        "headers": headers,
    }


def format_json(record: ConsumerRecord) -> bytes:
    """A record as one JSON line (without the newline), UTF-8."""
    return json.dumps(record_to_dict(record), ensure_ascii=False, separators=(", ", ": ")).encode("utf-8")


# Produce summary --------------------------------------------------------------------------------


def produce_summary(topic: str, count: int, ranges: dict[int, tuple[int, int]]) -> str:
    """One line: how many records went where, e.g. `sent 3 records to t: partition 0 offsets 0-1, ...`.

    `ranges` maps a partition to the lowest and highest offset written there.
    """
    if count == 0:
        return f"sent 0 records to {topic}"
    parts = [
        f"partition {p} offset {low}" if low == high else f"partition {p} offsets {low}-{high}"
        for p, (low, high) in sorted(ranges.items())
    ]
    return f"sent {counted(count, 'record')} to {topic}: {', '.join(parts)}"


# Topics -----------------------------------------------------------------------------------------


def time_text(timestamp_ms: int) -> str:
    """A timestamp in milliseconds as UTC ISO 8601 to the second."""
    return datetime.fromtimestamp(timestamp_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def topics_table(topic_infos: Sequence[TopicInfo]) -> Table:
    """One row per topic: name, partitions, id, creation time."""
    table = plain_table("topic", "partitions", "id", "created (UTC)")
    for info in topic_infos:
        table.add_row(info.name, str(info.partitions), str(info.topic_id), time_text(info.created_ms))
    return table


def topic_to_dict(info: TopicInfo) -> dict[str, Any]:
    """A topic as a JSON-ready dict."""
    return {
        "name": info.name,
        "partitions": info.partitions,
        "topic_id": info.topic_id,
        "created_ms": info.created_ms,
    }


def description_heading(description: TopicDescription) -> str:
    """The line above a topic's partition table: what it is and which node's view it shows."""
    topic = description.topic
    return (
        f"topic {topic.name} (id {topic.topic_id}, {counted(topic.partitions, 'partition')}), "
        f"served by node {description.served_by} at applied index {description.applied_index}"
    )


def partitions_table(description: TopicDescription) -> Table:
    """One row per partition: log start, log end, records held, size."""
    table = plain_table("partition", "log start", "log end", "records", "size (bytes)")
    for p in description.partitions:
        records = p.log_end_offset - p.log_start_offset
        table.add_row(
            str(p.partition), str(p.log_start_offset), str(p.log_end_offset), str(records), str(p.size_bytes)
        )
    return table


def configs_table(configs: Sequence[TopicConfigValue]) -> Table:
    """One row per topic config in effect: name, value, and whether it is the default."""
    table = plain_table("config", "value", "source")
    for config in configs:
        table.add_row(config.name, config.value, "default" if config.is_default else "topic")
    return table


def config_to_dict(config: TopicConfigValue) -> dict[str, Any]:
    """A topic config as a JSON-ready dict."""
    return {"name": config.name, "value": config.value, "is_default": config.is_default}


def description_to_dict(description: TopicDescription) -> dict[str, Any]:
    """A topic description as a JSON-ready dict."""
    return {
        **topic_to_dict(description.topic),
        "served_by": description.served_by,
        "applied_index": description.applied_index,
        "configs": [config_to_dict(config) for config in description.configs],
        "partition_offsets": [
            {
                "partition": p.partition,
                "log_start_offset": p.log_start_offset,
                "log_end_offset": p.log_end_offset,
                "size_bytes": p.size_bytes,
            }
            for p in description.partitions
        ],
    }


# Cluster ----------------------------------------------------------------------------------------


def status_table(addresses: Sequence[str], statuses: Sequence[NodeStatus | KqClientError]) -> Table:
    """One row per bootstrap node; a node that did not answer shows as `down` with the error."""
    table = plain_table(
        "node",
        "address",
        "role",
        "term",
        "commit index",
        "applied index",
        "leader",
        "connected peers",
        "ready",
    )
    any_down = any(isinstance(s, KqClientError) for s in statuses)
    if any_down:
        table.add_column("error")
    for address, status in zip(addresses, statuses, strict=True):
        if isinstance(status, KqClientError):
            table.add_row("?", address, "down", "", "", "", "", "", "", str(status))
            continue
        connected = [peer.node_id for peer in status.peers if peer.connected]
        row = [
            status.node_id,
            address,
            status.role,
            str(status.term),
            str(status.commit_index),
            str(status.applied_index),
            status.leader_id or "-",
            ",".join(connected) or "-",
            "yes" if status.ready else "no",
        ]
        table.add_row(*row, *([""] if any_down else []))
    return table


def group_leaders_table(statuses: Sequence[NodeStatus | KqClientError]) -> Table | None:
    """Each Raft group's leader, as the first node that answered sees it; None in a cluster of one
    group (nodes without worker processes), whose leader the node table already shows."""
    leaders = group_leaders(statuses)
    if not leaders:
        return None
    table = plain_table("group", "leader", "leader address", "term")
    for leader in leaders:
        address = leader.leader_address or "-"
        table.add_row(str(leader.group), leader.leader_id or "-", address, str(leader.term))
    return table


def status_to_dict(address: str, status: NodeStatus | KqClientError) -> dict[str, Any]:
    """A node's status (or the error reaching it) as a JSON-ready dict."""
    if isinstance(status, KqClientError):
        return {"address": address, "role": "down", "error": str(status)}
    return {
        "address": address,
        "node_id": status.node_id,
        "role": status.role,
        "term": status.term,
        "commit_index": status.commit_index,
        "applied_index": status.applied_index,
        "leader_id": status.leader_id,
        "leader_address": status.leader_address,
        "ready": status.ready,
        "raft_log_entries": status.raft_log_entries,
        "raft_address": status.raft_address,
        "cluster_id": status.cluster_id,
        "peers": [
            {"node_id": p.node_id, "address": p.grpc_address, "connected": p.connected} for p in status.peers
        ],
        "groups": [
            {"group": g.group, "leader_id": g.leader_id, "leader_address": g.leader_address, "term": g.term}
            for g in status.group_leaders
        ],
        "error": None,
    }


def members_table(members: Sequence[PeerState]) -> Table:
    """The cluster's voters after a membership change, as the leader sees them."""
    table = plain_table("node", "gRPC address", "Raft address", "Kafka address", "rack", "connected")
    for member in members:
        table.add_row(
            member.node_id,
            member.grpc_address,
            member.raft_address,
            member.kafka_address or "-",
            member.rack or "-",
            "yes" if member.connected else "no",
        )
    return table


# Printing ---------------------------------------------------------------------------------------


def plain_table(*headers: str) -> Table:
    """An empty table with these column headers, in kq's plain style (no borders, no wrapping)."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for header in headers:
        table.add_column(header, no_wrap=True)
    return table


def print_table(table: Table) -> None:
    """Prints a table to stdout; wide enough when stdout is a pipe that rows never wrap."""
    stdout = sys.stdout
    console = Console(file=stdout, width=None if stdout.isatty() else TABLE_WIDTH_NOT_TTY, highlight=False)
    console.print(table)


def write_records(records: Sequence[ConsumerRecord], formatter: Formatter) -> None:
    """Writes records to stdout, one line each, with one write and a flush: prompt output, cheaply."""
    stdout = sys.stdout.buffer
    stdout.write(b"".join(formatter(record) + b"\n" for record in records))
    stdout.flush()


def print_text(text: str) -> None:
    """Prints one line to stdout as is: no rich markup, so brackets in names print literally."""
    sys.stdout.write(text + "\n")


def print_json(document: Any) -> None:
    """Prints a JSON document to stdout, indented."""
    sys.stdout.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
