"""Batch example: record counts and bytes per key per minute of a kq topic, read from followers, to Parquet.

    .venv/bin/python -m kq.spark.jobs.key_minute_stats --demo-records 100000

reads the whole topic (`--topic`, default `events`) from the cluster of deploy/run-cluster.sh with
kq.readFrom=follower, aggregates per key and one-minute window (records, key+value bytes), writes the
result to Parquet (`--output`) and prints a summary: which nodes served the rows, how fast, top keys.
`--demo-records N` first creates the topic if needed and produces N demo records.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention.

from kq.client import KqClient
from kq.spark.jobs.demo_data import ensure_topic, job_parser, produce_demo
from kq.spark.metadata import discover
from kq.spark.session import local_session

DEFAULT_OUTPUT = "/tmp/kq-spark/key-minute-stats"
TOP_KEYS = 5


@dataclass(frozen=True, slots=True)
class Summary:
    """What one run read and wrote."""

    records: int
    output_rows: int
    seconds: float
    served_by: dict[str, int]  # Node id -> rows it served.
    leader_id: str
    top_keys: list[tuple[str, int, int]]  # (key, records, bytes), most bytes first.


def read_topic(session: SparkSession, nodes: str, topic: str, read_from: str) -> DataFrame:
    """The topic as Spark's Kafka source would show it, plus the node that served each row."""
    return (
        session.read.format("kq")
        .option("kq.nodes", nodes)
        .option("subscribe", topic)
        .option("kq.readFrom", read_from)
        .option("kq.debug.servedBy", "true")
        .load()
    )


def key_minute_stats(records: DataFrame) -> DataFrame:
    """Per key (as text) and minute: records, key+value bytes, and per serving node (summed out later)."""
    return records.groupBy(
        F.coalesce(F.col("key").cast("string"), F.lit("<null>")).alias("key"),
        F.window("timestamp", "1 minute").start.alias("minute"),
        "servedBy",
    ).agg(
        F.count("*").alias("records"),
        F.sum(F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0))).alias("bytes"),
    )


def run(session: SparkSession, nodes: str, topic: str, output: str, read_from: str = "follower") -> Summary:
    """Reads, aggregates, writes Parquet; one read of the topic (the small aggregate is cached)."""
    with KqClient(nodes.split(",")) as client:
        leader_id = discover(client).leader_id
    started = time.monotonic()
    by_node = key_minute_stats(read_topic(session, nodes, topic, read_from)).cache()
    result = by_node.groupBy("key", "minute").agg(
        F.sum("records").alias("records"), F.sum("bytes").alias("bytes")
    )
    result.orderBy("minute", "key").write.mode("overwrite").parquet(output)
    seconds = time.monotonic() - started
    served = by_node.groupBy("servedBy").agg(F.sum("records").alias("records")).collect()
    top = result.groupBy("key").agg(F.sum("records").alias("records"), F.sum("bytes").alias("bytes"))
    top_rows = top.orderBy(F.desc("bytes"), "key").limit(TOP_KEYS).collect()
    summary = Summary(
        records=sum(int(row["records"]) for row in served),
        output_rows=session.read.parquet(output).count(),
        seconds=seconds,
        served_by={str(row["servedBy"]): int(row["records"]) for row in served},
        leader_id=leader_id,
        top_keys=[(row["key"], int(row["records"]), int(row["bytes"])) for row in top_rows],
    )
    by_node.unpersist()
    return summary


def print_summary(summary: Summary, topic: str, output: str) -> None:
    """The run, in a few lines."""
    rate = summary.records / summary.seconds if summary.seconds else 0.0
    served = ", ".join(f"node {node}: {count:,}" for node, count in sorted(summary.served_by.items()))
    print(
        f"read {summary.records:,} records of {topic}, aggregated and wrote them in {summary.seconds:.1f} s "
        f"({rate:,.0f} records/s end to end)"
    )
    print(f"served by {served} (leader: node {summary.leader_id or '?'})")
    print(f"wrote {summary.output_rows:,} rows (key, minute, records, bytes) to {output}")
    print(f"top {len(summary.top_keys)} keys by bytes:")
    for key, records, size in summary.top_keys:
        print(f"  {key:<12} {records:>9,} records {size:>12,} bytes")


def main(argv: Sequence[str] | None = None) -> None:
    """Command line entry point."""
    parser = job_parser("kq.spark.jobs.key_minute_stats", __doc__ or "")
    parser.add_argument("--topic", default="events", help="topic to read (default: %(default)s)")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="Parquet directory (default: %(default)s)")
    parser.add_argument("--read-from", default="follower", help="kq.readFrom (default: %(default)s)")
    parser.add_argument("--demo-records", type=int, default=0, help="first produce this many demo records")
    args = parser.parse_args(argv)
    if args.demo_records:
        with KqClient(args.nodes.split(",")) as client:
            ensure_topic(client, args.topic)
            produce_demo(client, args.topic, args.demo_records)
        print(f"produced {args.demo_records:,} demo records to {args.topic}")
    session = local_session("kq-key-minute-stats")
    try:
        print_summary(
            run(session, args.nodes, args.topic, args.output, args.read_from), args.topic, args.output
        )
    finally:
        session.stop()


if __name__ == "__main__":
    main()
