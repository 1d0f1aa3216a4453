"""One producer or consumer process of `python -m kq.bench.scale` (librdkafka through confluent-kafka).

    python -m kq.bench.scale_worker SPEC_JSON

`kq.bench.scale` starts P of these per level and talks to each over its stdin and stdout, one JSON
object a line (stderr is the worker's log):

1. the worker builds its client and proves the path once (a producer: one record produced and its
   delivery report received; a consumer: the topic's metadata read), then says `{"ready": true}`;
2. it waits (at most `go_timeout_s`) for `{"start": T0, "end": T1}`, both `time.monotonic()` values
   (CLOCK_MONOTONIC is one clock for every process of the machine);
3. a producer produces from then on, counts its delivery reports without error from T0 to T1 (the
   measured window; before T0 is warm-up), stops producing at T1 and flushes; a consumer (whose T0
   is now) reads its partitions from the beginning up to the end offsets it was given, or until T1,
   and says when its last record arrived;
4. it says `{"result": {...}}` and exits; on any failure it says `{"error": "..."}` and exits 1.

This module imports nothing of kq's: a worker starts in a fraction of a second and its CPU is the
client's alone.
"""

from __future__ import annotations

import json
import select
import sys
import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition

TIME_CHECK_EVERY = 1024  # Records produced between two looks at the clock (~2 ms at 500,000/s).
POLL_EVERY = 1000  # Records produced between two `poll(0)` calls that serve delivery reports.
QUEUE_FULL_POLL_S = 0.01  # librdkafka's queue is full: serve reports (returns at the first one), retry.
CONSUME_BATCH = 10_000  # Messages per `Consumer.consume` call.
CONSUME_POLL_S = 0.5  # One `consume` call's wait when nothing has arrived.


def _say(message: dict[str, Any]) -> None:
    """One protocol line to the parent."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _wait_go(timeout_s: float) -> tuple[float, float]:
    """The window the parent sends: (start, end) in monotonic seconds. Raises TimeoutError after
    `timeout_s`, EOFError if the parent closed the pipe (it ended or gave up)."""
    readable, _, _ = select.select([sys.stdin], [], [], timeout_s)
    if not readable:
        raise TimeoutError(f"no start from the parent within {timeout_s} s")
    line = sys.stdin.readline()
    if not line:
        raise EOFError("the parent closed the pipe")
    go = json.loads(line)
    return float(go["start"]), float(go["end"])


class _Tally:
    """Delivery reports so far (served by `poll`/`flush` on the producing thread, so no lock)."""

    def __init__(self) -> None:
        self.delivered = self.failed = 0
        self.first_error = ""

    def report(self, error: KafkaError | None, message: Message) -> None:
        """librdkafka's delivery report of one record."""
        if error is None:
            self.delivered += 1
            return
        self.failed += 1
        if not self.first_error:
            self.first_error = str(error)


class _Window:
    """The tally's counts when the clock passed the window's start and end (each taken once)."""

    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end
        self.started_at = self.ended_at = 0.0
        self.delivered_before = self.failed_before = 0
        self.delivered_in = self.failed_in = 0

    def passed_end(self, now: float, producer: Producer, tally: _Tally) -> bool:
        """Takes the counts at the start and at the end as `now` passes them; True once past the end.

        Reports already received are served (`poll(0)`) before either count, alike at both ends."""
        if not self.started_at and now >= self.start:
            producer.poll(0)
            self.started_at = time.monotonic()
            self.delivered_before, self.failed_before = tally.delivered, tally.failed
        if self.started_at and now >= self.end:
            producer.poll(0)
            self.ended_at = time.monotonic()
            self.delivered_in = tally.delivered - self.delivered_before
            self.failed_in = tally.failed - self.failed_before
            return True
        return False


def produce(spec: dict[str, Any]) -> dict[str, Any]:
    """Produces `value_bytes`-byte records without key (librdkafka's sticky partitioner spreads them
    over every partition) until the window's end; see the module docstring."""
    topic, value = spec["topic"], bytes(spec["value_bytes"])
    tally = _Tally()
    producer = Producer({**spec["config"], "on_delivery": tally.report})
    producer.produce(topic, value)  # Connections, metadata and the idempotent producer id.
    if producer.flush(spec["ready_timeout_s"]) or tally.delivered != 1:
        raise RuntimeError(f"the warm-up record was not delivered: {tally.first_error or 'timed out'}")
    _say({"ready": True})
    window = _Window(*_wait_go(spec["go_timeout_s"]))
    produced = 1
    while True:
        try:
            producer.produce(topic, value)
        except BufferError:  # queue.buffering.max.messages/kbytes reached: wait for acknowledgements.
            producer.poll(QUEUE_FULL_POLL_S)
            if window.passed_end(time.monotonic(), producer, tally):
                break
            continue
        produced += 1
        if produced % POLL_EVERY == 0:
            producer.poll(0)
        if produced % TIME_CHECK_EVERY == 0 and window.passed_end(time.monotonic(), producer, tally):
            break
    undelivered = producer.flush(spec["drain_timeout_s"])
    return {
        "produced": produced,
        "delivered": tally.delivered,
        "failed": tally.failed,
        "undelivered": undelivered,
        "first_error": tally.first_error,
        "window_delivered": window.delivered_in,
        "window_failed": window.failed_in,
        "window_s": window.ended_at - window.started_at,
    }


def consume(spec: dict[str, Any]) -> dict[str, Any]:
    """Reads the assigned partitions from the beginning up to their end offsets (`ends`: partition →
    offset one past the last record), or until the window's end; see the module docstring."""
    topic = spec["topic"]
    ends = {int(partition): int(end) for partition, end in spec["ends"].items()}
    consumer = Consumer(spec["config"])
    try:
        consumer.list_topics(topic, timeout=spec["ready_timeout_s"])  # Connects; fails if unreachable.
        _say({"ready": True})
        _, deadline = _wait_go(spec["go_timeout_s"])  # Reading starts at once; the parent times it.
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING) for partition in ends])
        left = {partition for partition, end in ends.items() if end > 0}
        records = payload_bytes = errors = 0
        last_at = 0.0
        first_error = ""
        while left and time.monotonic() < deadline:
            batch = consumer.consume(CONSUME_BATCH, CONSUME_POLL_S)
            for message in batch:
                error = message.error()
                if error is not None:
                    errors += 1
                    first_error = first_error or str(error)
                    continue
                records += 1
                payload_bytes += len(message)
                offset, partition = message.offset(), message.partition()
                if offset is not None and partition is not None and offset + 1 >= ends[partition]:
                    left.discard(partition)
            if batch:
                last_at = time.monotonic()  # Not after an empty wait: the last record's arrival.
    finally:
        consumer.close()
    return {
        "records": records,
        "bytes": payload_bytes,
        "errors": errors,
        "first_error": first_error,
        "complete": not left,
        "last_at": last_at,
    }


def main() -> None:
    """Runs the role the spec (the one argument, JSON) names and reports the result on stdout."""
    spec = json.loads(sys.argv[1])
    try:
        result = produce(spec) if spec["role"] == "produce" else consume(spec)
    except Exception as error:  # Reported to the parent, which fails the level with it and the log.
        _say({"error": f"{type(error).__name__}: {error}"})
        sys.exit(1)
    _say({"result": result})


if __name__ == "__main__":
    main()
