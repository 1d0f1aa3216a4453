"""Streaming example: append a kq topic's new records to Parquet, with trigger(availableNow=True).

    .venv/bin/python -m kq.spark.jobs.stream_to_parquet --demo-records 10000

Each run reads what was produced since the previous run (Spark's checkpoint, under `--output`, holds
Kafka-shaped offsets such as {"events":{"0":2512,"1":2488}}), writes it to Parquet and stops; a
first run starts at the earliest offsets. It prints the micro-batches and the offsets reached.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention.

from kq.client import KqClient
from kq.spark.jobs.demo_data import ensure_topic, job_parser, produce_demo
from kq.spark.session import local_session

DEFAULT_OUTPUT = "/tmp/kq-spark/stream-to-parquet"
MAX_OFFSETS_PER_TRIGGER = 100_000  # Records per micro-batch, at most.
RUN_TIMEOUT_S = 3_600


def run(session: SparkSession, nodes: str, topic: str, output: str) -> list[dict[str, Any]]:
    """One availableNow run; returns Spark's progress report of each micro-batch."""
    query = (
        session.readStream.format("kq")
        .option("kq.nodes", nodes)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(MAX_OFFSETS_PER_TRIGGER))
        .load()
        .select(
            F.col("key").cast("string").alias("key"),
            F.length("value").alias("value_bytes"),
            "partition",
            "offset",
            "timestamp",
        )
        .writeStream.format("parquet")
        .option("path", str(Path(output) / "data"))
        .option("checkpointLocation", str(Path(output) / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    if not query.awaitTermination(RUN_TIMEOUT_S):
        query.stop()
        raise TimeoutError(f"the availableNow run did not finish within {RUN_TIMEOUT_S} s")
    error = query.exception()
    if error is not None:
        raise RuntimeError(f"the streaming query failed: {error}")
    return [dict(progress) for progress in query.recentProgress if progress["numInputRows"]]


def main(argv: Sequence[str] | None = None) -> None:
    """Command line entry point."""
    parser = job_parser("kq.spark.jobs.stream_to_parquet", __doc__ or "")
    parser.add_argument("--topic", default="events", help="topic to read (default: %(default)s)")
    parser.add_argument(
        "--output", default=DEFAULT_OUTPUT, help="Parquet and checkpoint directory (default: %(default)s)"
    )
    parser.add_argument("--demo-records", type=int, default=0, help="first produce this many demo records")
    args = parser.parse_args(argv)
    if args.demo_records:
        with KqClient(args.nodes.split(",")) as client:
            ensure_topic(client, args.topic)
            produce_demo(client, args.topic, args.demo_records)
        print(f"produced {args.demo_records:,} demo records to {args.topic}")
    session = local_session("kq-stream-to-parquet")
    try:
        batches = run(session, args.nodes, args.topic, args.output)
        for progress in batches:
            source = progress["sources"][0]
            start = source["startOffset"] or "the earliest offsets"
            print(
                f"micro-batch {progress['batchId']}: {progress['numInputRows']:,} records, "
                f"{start} -> {source['endOffset']}"
            )
        total = sum(int(progress["numInputRows"]) for progress in batches)
        stored = session.read.parquet(str(Path(args.output) / "data")).count()
        print(
            f"this run read {total:,} new records in {len(batches)} micro-batch(es); "
            f"{stored:,} records in {args.output}/data"
        )
        if batches:
            print(f"checkpointed offsets: {json.dumps(json.loads(batches[-1]['sources'][0]['endOffset']))}")
    finally:
        session.stop()


if __name__ == "__main__":
    main()
