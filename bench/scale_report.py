"""The tables of `python -m kq.bench.scale`: one row per (value size, producer processes), medians over
runs, built from the level records the runs produced (pure: no processes, no clock).

A level record (see `kq.bench.scale.measure_level`) holds, for one run of one level, the producers'
delivered records in the window, the node CPU by node id with the phase's leader named, the clients'
CPU, the host's busy share, and the consumers' figures when they ran. Node CPU is shown by position,
the leader at the phase's start first and then the other nodes by id, so that runs on fresh clusters
(whose leader differs) are comparable; each position's figure is the median over runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

NODE_CORES_HEADER = "node cores (leader* first)"


def node_order(node_cores: dict[str, float], leader: str) -> list[str]:
    """The leader's id, then the other nodes' ids in numeric order (ids are Kafka's integers)."""
    others = sorted((node for node in node_cores if node != leader), key=lambda node: (len(node), node))
    return [leader, *others] if leader in node_cores else others


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _positions(records: Sequence[dict[str, Any]], phase: str) -> list[float]:
    """Median over runs of each position's node cores in `phase` (leader first)."""
    columns: list[list[float]] = []
    for record in records:
        cores = record[phase]["node_cores"]
        for position, node in enumerate(node_order(cores, record[phase].get("leader", record["leader"]))):
            if position == len(columns):
                columns.append([])
            columns[position].append(cores[node])
    return [_median(column) for column in columns]


def problems(record: dict[str, Any]) -> list[str]:
    """What went wrong in one level run: failed or missing deliveries, records the topic lacks or holds
    beyond those delivered, consumers that did not read everything. Empty when every delivered record
    was counted, stored once and read back."""
    produce, found = record["produce"], []
    if produce["failed"]:
        found.append(
            f"{produce['failed']:,} delivery reports with an error (first: {produce['first_error']})"
        )
    if produce["undelivered"]:
        found.append(f"{produce['undelivered']:,} records without a delivery report after the drain")
    if produce["delivered"] != produce["stored"]:
        found.append(f"{produce['delivered']:,} records delivered, but the topic holds {produce['stored']:,}")
    for phase in ("produce", "consume"):
        moved = record.get(phase, {})
        if moved.get("leader_after", moved.get("leader")) != moved.get("leader"):
            found.append(
                f"the leader moved from node {moved['leader']} to node {moved['leader_after']} while "
                f"{'producing' if phase == 'produce' else 'consuming'} (its CPU is split between them)"
            )
    consume = record.get("consume")
    if consume is not None:
        if consume["errors"]:
            found.append(f"{consume['errors']:,} consumer errors (first: {consume['first_error']})")
        if not consume["complete"]:
            found.append(f"consumers read {consume['records']:,} of {produce['stored']:,} records in time")
        elif consume["records"] != produce["stored"]:
            found.append(
                f"consumers read {consume['records']:,} records; the topic holds {produce['stored']:,}"
            )
    return found


def summarize(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (size, level), in the order the records first name them: medians over runs."""
    keys = list(dict.fromkeys((record["size"], record["level"]) for record in records))
    rows = []
    for size, level in keys:
        runs = [record for record in records if (record["size"], record["level"]) == (size, level)]
        rates = [record["produce"]["msgs_per_s"] for record in runs]
        consumed = [record["consume"] for record in runs if record.get("consume") is not None]
        rows.append(
            {
                "size": size,
                "level": level,
                "runs": len(runs),
                "msgs_per_s": _median(rates),
                "msgs_per_s_min": min(rates),
                "msgs_per_s_max": max(rates),
                "mb_per_s": _median([record["produce"]["mb_per_s"] for record in runs]),
                "node_cores": _positions(runs, "produce"),
                "client_cores": _median([record["produce"]["client_cores"] for record in runs]),
                "host_busy": _median([record["produce"]["host_busy"] for record in runs]),
                "consumers": consumed[0]["consumers"] if consumed else 0,
                "consumer_msgs_per_s": _median([c["msgs_per_s"] for c in consumed]) if consumed else None,
                "consumer_mb_per_s": _median([c["mb_per_s"] for c in consumed]) if consumed else None,
                "consume_node_cores": _positions(runs, "consume") if consumed else [],
                "problems": [
                    f"run {record['run']}: {problem}" for record in runs for problem in problems(record)
                ],
            }
        )
    return rows


def _cores(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return " ".join(f"{value:.2f}{'*' if position == 0 else ''}" for position, value in enumerate(values))


def table(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table of one size's rows, then one line per problem; what the JSON's `tables` hold."""
    lines = [
        f"| producers | msgs/s | MB/s | consumers | consumer msgs/s | consumer MB/s | {NODE_CORES_HEADER}, "
        f"producing | {NODE_CORES_HEADER}, consuming | client cores | host busy |",
        "|---:|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    for row in rows:
        rate = f"{row['msgs_per_s']:,.0f}"
        if row["runs"] > 1:
            rate += f" ({row['msgs_per_s_min']:,.0f}..{row['msgs_per_s_max']:,.0f})"
        consumer_rate, consumer_mb = "-", "-"
        if row["consumer_msgs_per_s"] is not None:
            consumer_rate = f"{row['consumer_msgs_per_s']:,.0f}"
            consumer_mb = f"{row['consumer_mb_per_s']:,.1f}"
        lines.append(
            f"| {row['level']} | {rate} | {row['mb_per_s']:,.1f} | {row['consumers'] or '-'} "
            f"| {consumer_rate} | {consumer_mb} "
            f"| {_cores(row['node_cores'])} | {_cores(row['consume_node_cores'])} "
            f"| {row['client_cores']:.2f} | {row['host_busy']:.0%} |"
        )
    lines.extend(f"level {row['level']}, {problem}" for row in rows for problem in row["problems"])
    return "\n".join(lines)


def tables(summary: Sequence[dict[str, Any]]) -> dict[str, str]:
    """One table per value size, keyed by the size in bytes (as a string: a JSON key)."""
    sizes = list(dict.fromkeys(row["size"] for row in summary))
    return {str(size): table([row for row in summary if row["size"] == size]) for size in sizes}
