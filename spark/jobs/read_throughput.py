"""Batch read throughput: how fast format("kq") reads a topic into Spark (records/s, median of runs).

    .venv/bin/python -m kq.spark.jobs.read_throughput --records 1000000

Tops the topic (`--topic`, default `read-bench`, 4 partitions) up to `--records` records of
`--value-bytes` bytes, then reads all of it `--runs` times with kq.readFrom=follower into Spark's
`noop` sink (every row and column is produced; nothing is written) and prints each run and the median.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from pyspark.sql import SparkSession

from kq.client import KqClient
from kq.spark.jobs.demo_data import ensure_topic, job_parser, produce_demo
from kq.spark.session import local_session

DEFAULT_VALUE_BYTES = 100


def topic_records(client: KqClient, topic: str) -> int:
    """Records the topic holds now."""
    return sum(o.log_end_offset - o.log_start_offset for o in client.list_offsets(topic).values())


def timed_read(session: SparkSession, nodes: str, topic: str, read_from: str) -> float:
    """Seconds to read the whole topic through the kq source into the noop sink."""
    frame = (
        session.read.format("kq")
        .option("kq.nodes", nodes)
        .option("subscribe", topic)
        .option("kq.readFrom", read_from)
        .load()
    )
    started = time.monotonic()
    frame.write.format("noop").mode("overwrite").save()
    return time.monotonic() - started


def main(argv: Sequence[str] | None = None) -> None:
    """Command line entry point."""
    parser = job_parser("kq.spark.jobs.read_throughput", __doc__ or "")
    parser.add_argument("--topic", default="read-bench", help="topic to read (default: %(default)s)")
    parser.add_argument(
        "--records", type=int, default=1_000_000, help="records to read (default: %(default)s)"
    )
    parser.add_argument(
        "--value-bytes", type=int, default=DEFAULT_VALUE_BYTES, help="value size of new records"
    )
    parser.add_argument("--runs", type=int, default=3, help="timed reads (default: %(default)s)")
    parser.add_argument("--read-from", default="follower", help="kq.readFrom (default: %(default)s)")
    args = parser.parse_args(argv)
    with KqClient(args.nodes.split(",")) as client:
        ensure_topic(client, args.topic)
        missing = args.records - topic_records(client, args.topic)
        if missing > 0:
            started = time.monotonic()
            produce_demo(client, args.topic, missing, value_bytes=args.value_bytes)
            print(f"produced {missing:,} records in {time.monotonic() - started:.1f} s")
        held = topic_records(client, args.topic)
    session = local_session("kq-read-throughput")
    try:
        timed_read(session, args.nodes, args.topic, args.read_from)  # Warm-up: JVM, Python workers.
        rates = []
        for run in range(1, args.runs + 1):
            seconds = timed_read(session, args.nodes, args.topic, args.read_from)
            rates.append(held / seconds)
            print(f"run {run}: {held:,} records in {seconds:.2f} s = {held / seconds:,.0f} records/s")
        print(
            f"median of {args.runs}: {statistics.median(rates):,.0f} records/s "
            f"(min {min(rates):,.0f}, max {max(rates):,.0f}); readFrom={args.read_from}, 2 local cores"
        )
    finally:
        session.stop()


if __name__ == "__main__":
    main()
