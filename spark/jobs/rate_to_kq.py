"""Streaming sink example: Spark's rate source written to a kq topic with `writeStream.format("kq")`.

    .venv/bin/python -m kq.spark.jobs.rate_to_kq --topic ticks --rows-per-second 1000 --seconds 60

Each row's value is the rate source's sequence number (0, 1, 2, ... as text) and its key the number
modulo 16. The checkpoint (`--checkpoint`) holds the source's offsets and the batches committed: a
run started again after its driver died resumes there; the micro-batch that was in flight is written
again (the sink is at least once: its rows may appear twice, never be missing). The test of that is
tests/spark/test_stream_sink.py; it kills this job's driver.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from kq.client import KqClient
from kq.spark.jobs.demo_data import ensure_topic, job_parser
from kq.spark.session import local_session

DEFAULT_CHECKPOINT = "/tmp/kq-spark/rate-to-kq"
KEYS = 16
TRIGGER = "500 milliseconds"


def start(
    session: SparkSession, nodes: str, topic: str, checkpoint: str, rows_per_second: int
) -> StreamingQuery:
    """Starts the query (one rate partition, so a micro-batch's rows are written in order)."""
    return (
        session.readStream.format("rate")
        .option("rowsPerSecond", str(rows_per_second))
        .option("numPartitions", "1")
        .load()
        .selectExpr(f"cast(value % {KEYS} as string) as key", "cast(value as string) as value")
        .writeStream.format("kq")
        .option("kq.nodes", nodes)
        .option("topic", topic)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=TRIGGER)
        .start()
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Command line entry point: runs the query for `--seconds` (0: until killed), then stops it."""
    parser = job_parser("kq.spark.jobs.rate_to_kq", __doc__ or "")
    parser.add_argument(
        "--topic", default="ticks", help="topic to write; created if missing (default: %(default)s)"
    )
    parser.add_argument(
        "--checkpoint", default=DEFAULT_CHECKPOINT, help="checkpoint directory (default: %(default)s)"
    )
    parser.add_argument(
        "--rows-per-second", type=int, default=1_000, help="rate of the source (default: %(default)s)"
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to run; 0: until killed")
    args = parser.parse_args(argv)
    with KqClient(args.nodes.split(",")) as client:
        ensure_topic(client, args.topic)
    session = local_session("kq-rate-to-kq")
    query = start(session, args.nodes, args.topic, args.checkpoint, args.rows_per_second)
    print(f"writing {args.rows_per_second} rows/s to {args.topic}; checkpoint {args.checkpoint}", flush=True)
    deadline = time.monotonic() + args.seconds if args.seconds else None
    while deadline is None or time.monotonic() < deadline:
        time.sleep(1.0)
        if not query.isActive:
            raise SystemExit(f"the streaming query stopped: {query.exception()}")
        progress = query.lastProgress
        if progress:
            print(f"batch {progress['batchId']}: {progress['numInputRows']} rows", flush=True)
    query.stop()
    session.stop()


if __name__ == "__main__":
    main()
