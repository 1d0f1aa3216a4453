"""Demo records for the example jobs: keyed events with create timestamps spread over recent minutes."""

from __future__ import annotations

import argparse
import contextlib
import random
import time

from kq.client import KqClient, ProducerRecord, TopicExistsError

DEMO_PARTITIONS = 4
DEMO_KEYS = 50
DEMO_SPREAD_S = 600  # Timestamps spread over the last ten minutes: several one-minute windows per key.
SEND_CHUNK_RECORDS = 10_000  # Records handed to send_batch at a time (the client splits requests itself).
VALUE_BYTES_MAX = 200


DEFAULT_NODES = "127.0.0.1:9101,127.0.0.1:9102,127.0.0.1:9103"  # deploy/run-cluster.sh's nodes.


def job_parser(module: str, doc: str) -> argparse.ArgumentParser:
    """The command line of the job `module` (its docstring's first line as description), with --nodes."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n", maxsplit=1)[0])
    parser.add_argument(
        "--nodes", default=DEFAULT_NODES, help="kq nodes, host:port,... (default: %(default)s)"
    )
    return parser


def ensure_topic(client: KqClient, topic: str, partitions: int = DEMO_PARTITIONS) -> None:
    """Creates the topic unless it exists."""
    with contextlib.suppress(TopicExistsError):
        client.create_topic(topic, partitions=partitions)


def produce_demo(
    client: KqClient, topic: str, count: int, seed: int = 7, value_bytes: int | None = None
) -> None:
    """`count` records: keys user-0..user-49, values of random (or fixed) size, recent create times."""
    rng = random.Random(seed)
    now_ms = int(time.time() * 1000)
    for start in range(0, count, SEND_CHUNK_RECORDS):
        chunk = [
            ProducerRecord(
                value=b"x" * (value_bytes if value_bytes is not None else rng.randrange(10, VALUE_BYTES_MAX)),
                key=f"user-{rng.randrange(DEMO_KEYS)}".encode(),
                timestamp_ms=now_ms - rng.randrange(DEMO_SPREAD_S * 1000),
            )
            for _ in range(min(SEND_CHUNK_RECORDS, count - start))
        ]
        client.send_batch(topic, chunk)
