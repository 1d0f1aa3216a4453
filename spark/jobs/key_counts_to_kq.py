"""Example pipeline both ways: read a topic, aggregate per key, write the result to another topic.

    .venv/bin/python -m kq.spark.jobs.key_counts_to_kq --demo-records 10000

Reads `--topic` (default `events`) from followers, counts the records and value bytes of each key,
and writes one record per key to `--output-topic` (default `events-key-counts`, created if missing):
key = the key, value = JSON {"records": n, "value_bytes": b}, header `source` = the input topic. Then
reads the output topic back and prints it. `--demo-records N` first produces N demo records.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention.

from kq.client import KqClient
from kq.spark.jobs.demo_data import ensure_topic, job_parser, produce_demo
from kq.spark.session import local_session


def run(session: SparkSession, nodes: str, topic: str, output_topic: str) -> dict[str, dict[str, int]]:
    """Aggregates `topic` into `output_topic`; returns what the output topic holds, by key."""
    counts = (
        session.read.format("kq")
        .option("kq.nodes", nodes)
        .option("subscribe", topic)
        .load()
        .groupBy("key")
        .agg(F.count("*").alias("records"), F.sum(F.length("value")).alias("value_bytes"))
    )
    (
        counts.select(
            "key",
            F.to_json(F.struct("records", "value_bytes")).alias("value"),
            F.array(F.struct(F.lit("source").alias("key"), F.lit(topic).cast("binary").alias("value"))).alias(
                "headers"
            ),
        )
        .write.format("kq")
        .option("kq.nodes", nodes)
        .option("topic", output_topic)
        .mode("append")
        .save()
    )
    written = session.read.format("kq").option("kq.nodes", nodes).option("subscribe", output_topic).load()
    return {
        (row["key"] or b"").decode(): json.loads(row["value"])
        for row in written.select("key", "value").collect()
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Command line entry point."""
    parser = job_parser("kq.spark.jobs.key_counts_to_kq", __doc__ or "")
    parser.add_argument("--topic", default="events", help="topic to read (default: %(default)s)")
    parser.add_argument("--output-topic", default=None, help="topic to write (default: <topic>-key-counts)")
    parser.add_argument("--demo-records", type=int, default=0, help="first produce this many demo records")
    args = parser.parse_args(argv)
    output_topic = args.output_topic or f"{args.topic}-key-counts"
    with KqClient(args.nodes.split(",")) as client:
        if args.demo_records:
            ensure_topic(client, args.topic)
            produce_demo(client, args.topic, args.demo_records)
            print(f"produced {args.demo_records:,} demo records to {args.topic}")
        ensure_topic(client, output_topic)
    session = local_session("kq-key-counts-to-kq")
    try:
        result = run(session, args.nodes, args.topic, output_topic)
    finally:
        session.stop()
    print(f"{output_topic} holds {len(result)} key counts; the largest five:")
    for key, counts in sorted(result.items(), key=lambda item: -item[1]["records"])[:5]:
        print(f"  {key}: {counts['records']:,} records, {counts['value_bytes']:,} value bytes")


if __name__ == "__main__":
    main()
