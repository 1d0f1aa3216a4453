"""Batch write throughput: how fast `df.write.format("kq")` writes rows (rows/s, median of runs), and
the batch read of what it wrote, in the same run.

    .venv/bin/python -m kq.spark.jobs.write_throughput --rows 5000000

Each run writes `--rows` rows (`--value-bytes` bytes of value, a 10-character key) from
`spark.range` over 2 local cores into a fresh topic (`--partitions`, default 4), then reads that
topic back into Spark's `noop` sink (kq.readFrom=follower). Prints each run's figures and the medians.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from pyspark.sql import SparkSession

from kq.client import KqClient
from kq.spark.jobs.demo_data import job_parser
from kq.spark.jobs.read_throughput import timed_read
from kq.spark.session import local_session

DEFAULT_VALUE_BYTES = 100
WRITE_TASKS = 2  # One per local core.
WARM_UP_ROWS = 20_000


def timed_write(session: SparkSession, nodes: str, topic: str, rows: int, value_bytes: int) -> float:
    """Seconds to write `rows` rows to `topic` through the kq sink."""
    frame = session.range(rows, numPartitions=WRITE_TASKS).selectExpr(
        "lpad(cast(id % 100000 as string), 10, '0') as key",
        f"concat(cast(id as string), repeat('x', {value_bytes} - length(cast(id as string)))) as value",
    )
    started = time.monotonic()
    frame.write.format("kq").option("kq.nodes", nodes).option("topic", topic).mode("append").save()
    return time.monotonic() - started


def main(argv: Sequence[str] | None = None) -> None:
    """Command line entry point."""
    parser = job_parser("kq.spark.jobs.write_throughput", __doc__ or "")
    parser.add_argument("--rows", type=int, default=5_000_000, help="rows per run (default: %(default)s)")
    parser.add_argument("--value-bytes", type=int, default=DEFAULT_VALUE_BYTES, help="value size")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of each run's topic")
    parser.add_argument("--runs", type=int, default=3, help="timed runs (default: %(default)s)")
    args = parser.parse_args(argv)
    session = local_session("kq-write-throughput")
    writes, reads = [], []
    try:
        with KqClient(args.nodes.split(",")) as client:
            warm_up = f"write-bench-{int(time.time())}-warm-up"  # The JVM, the Python workers.
            client.create_topic(warm_up, partitions=args.partitions)
            timed_write(session, args.nodes, warm_up, WARM_UP_ROWS, args.value_bytes)
            client.delete_topic(warm_up)
            for run in range(1, args.runs + 1):
                topic = f"write-bench-{int(time.time())}-{run}"
                client.create_topic(topic, partitions=args.partitions)
                seconds = timed_write(session, args.nodes, topic, args.rows, args.value_bytes)
                writes.append(args.rows / seconds)
                read_seconds = timed_read(session, args.nodes, topic, "follower")
                reads.append(args.rows / read_seconds)
                print(
                    f"run {run}: wrote {args.rows:,} rows in {seconds:.1f} s = {writes[-1]:,.0f} rows/s; "
                    f"read them in {read_seconds:.1f} s = {reads[-1]:,.0f} rows/s",
                    flush=True,
                )
                client.delete_topic(topic)
        print(
            f"median of {args.runs}: write {statistics.median(writes):,.0f} rows/s "
            f"(min {min(writes):,.0f}, max {max(writes):,.0f}), read {statistics.median(reads):,.0f} rows/s; "
            f"{args.value_bytes} B values, {WRITE_TASKS} local cores"
        )
    finally:
        session.stop()


if __name__ == "__main__":
    main()
