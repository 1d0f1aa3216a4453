"""The measured workloads: concurrent produce throughput, follower fetch throughput, produce latency.

Each function runs one bounded run (a record count and a time cap) against a running cluster and
returns what it measured; it knows nothing about processes or reports. Producer threads each own a
`KqClient`, because one client keeps a single request in flight per partition (that is how its
idempotent sequences stay in order), and threads of one client would queue behind each other.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kq.client import KqClient, KqClientError, ProducerRecord, TlsConfig

JOIN_GRACE_S = 30.0  # Beyond the time cap, how long a thread may take to finish its last request.
ERRORS_MAX = 100  # A run that hits this many failed requests stops: the cluster is not healthy.


@dataclass(frozen=True, slots=True)
class ThroughputSample:
    """One throughput run: records acknowledged (or read) in `elapsed_s`."""

    records: int
    payload_bytes: int  # Value bytes of those records.
    requests: int
    errors: int
    elapsed_s: float

    @property
    def records_per_s(self) -> float:
        """Records per second over the whole run."""
        return self.records / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class LatencySample:
    """One latency run: each send's round trip, in milliseconds, in send order."""

    latencies_ms: tuple[float, ...]
    errors: int
    elapsed_s: float


class _WorkCounter:
    """Hands out request numbers to producer threads until the count or the deadline runs out."""

    def __init__(self, requests_max: int, errors_max: int) -> None:
        self._lock = threading.Lock()
        self._numbers = itertools.count()
        self._requests_max = requests_max
        self._errors_max = errors_max
        self.deadline = float("inf")
        self.last_done = 0.0  # Monotonic time the last request finished: the end of the run.
        self.records = 0
        self.requests = 0
        self.errors = 0

    def take(self) -> int | None:
        """The next request number, or None when the run is over."""
        with self._lock:
            number = next(self._numbers)
            over = number >= self._requests_max or self.errors >= self._errors_max
        return None if over or time.monotonic() >= self.deadline else number

    def done(self, records: int, failed: bool) -> None:
        """Records one finished request."""
        with self._lock:
            self.requests += 1
            self.last_done = time.monotonic()
            if failed:
                self.errors += 1
            else:
                self.records += records


def _producer_thread(
    bootstrap: Sequence[str],
    topic: str,
    partitions: int,
    thread_number: int,
    batch: Sequence[ProducerRecord],
    warmup_requests: int,
    start: threading.Barrier,
    counter: _WorkCounter,
    tls: TlsConfig | None,
) -> None:
    """Warms up (connects, registers its producer id), waits for the start, then sends until told to stop."""
    records = [list(_with_partition(batch, partition)) for partition in range(partitions)]
    with KqClient(bootstrap, tls=tls) as client:
        try:
            for warmup in range(warmup_requests):
                client.send_batch(topic, records[(thread_number + warmup) % partitions])
        except BaseException:
            start.abort()  # The run cannot start fairly: release everyone with BrokenBarrierError.
            raise
        start.wait()
        while (number := counter.take()) is not None:
            # Spread threads over partitions: thread t's n-th request goes to partition t + n.
            partition = (thread_number + number) % partitions
            try:
                client.send_batch(topic, records[partition])
            except KqClientError:
                counter.done(len(batch), failed=True)
            else:
                counter.done(len(batch), failed=False)


def _with_partition(batch: Sequence[ProducerRecord], partition: int) -> list[ProducerRecord]:
    return [ProducerRecord(record.value, record.key, partition=partition) for record in batch]


def produce_throughput(
    bootstrap: Sequence[str],
    topic: str,
    partitions: int,
    threads: int,
    records_per_request: int,
    records_max: int,
    value: bytes,
    warmup_requests: int,
    time_cap_s: float,
    tls: TlsConfig | None = None,
) -> ThroughputSample:
    """`threads` producers send `records_per_request` records per request until `records_max` are sent.

    The clock runs from the moment every thread is warmed up until the last one finishes. `tls`: how
    the clients reach the nodes (None: plain text), as for every function here.
    """
    requests_max = max(1, records_max // records_per_request)
    counter = _WorkCounter(requests_max, ERRORS_MAX)
    started = 0.0

    def start_clock() -> None:
        # Runs in exactly one thread once all have arrived, before any of them is released.
        nonlocal started
        started = time.monotonic()
        counter.deadline = started + time_cap_s

    start = threading.Barrier(threads + 1, action=start_clock)
    batch = [ProducerRecord(value)] * records_per_request
    workers = [
        threading.Thread(
            target=_producer_thread,
            args=(bootstrap, topic, partitions, number, batch, warmup_requests, start, counter, tls),
            name=f"bench-producer-{number}",
            daemon=True,
        )
        for number in range(threads)
    ]
    for worker in workers:
        worker.start()
    try:
        start.wait(timeout=time_cap_s)  # Warm-up is bounded by the time cap too.
    except threading.BrokenBarrierError:
        counter.deadline = 0.0
        for worker in workers:
            worker.join(timeout=JOIN_GRACE_S)
        raise RuntimeError("a producer thread failed or timed out while warming up") from None
    for worker in workers:
        worker.join(timeout=max(0.0, counter.deadline + JOIN_GRACE_S - time.monotonic()))
    if any(worker.is_alive() for worker in workers):
        raise TimeoutError(f"producer threads still running {JOIN_GRACE_S:.0f} s after the time cap")
    elapsed_s = max(0.0, counter.last_done - started)
    return ThroughputSample(
        counter.records, counter.records * len(value), counter.requests, counter.errors, elapsed_s
    )


def fetch_throughput(
    bootstrap: Sequence[str],
    node_address: str,
    topic: str,
    records_per_request: int,
    bytes_per_request: int,
    records_max: int,
    time_cap_s: float,
    tls: TlsConfig | None = None,
) -> ThroughputSample:
    """One reader reads every partition of `topic` from offset 0 on `node_address`, in order.

    Stops at each partition's log end (as the node saw it when the run began), after `records_max`
    records in all, or at the time cap.
    """
    records = payload_bytes = requests = 0
    with KqClient(bootstrap, tls=tls) as client:
        offsets = client.list_offsets(topic, node=node_address)
        started = time.monotonic()
        deadline = started + time_cap_s
        for partition, bounds in sorted(offsets.items()):
            offset, end = bounds.log_start_offset, bounds.log_end_offset
            while offset < end and records < records_max and time.monotonic() < deadline:
                result = client.fetch(
                    topic,
                    partition,
                    offset,
                    max_records=min(records_per_request, records_max - records),
                    max_bytes=bytes_per_request,
                    node=node_address,
                )
                requests += 1
                if not result.records:
                    break  # Not applied on this node yet: nothing more to read within the run.
                offset = result.records[-1].offset + 1
                records += len(result.records)
                payload_bytes += sum(len(record.value or b"") for record in result.records)
        elapsed_s = time.monotonic() - started
    return ThroughputSample(records, payload_bytes, requests, 0, elapsed_s)


def produce_latency(
    bootstrap: Sequence[str],
    topic: str,
    sends: int,
    value: bytes,
    warmup_sends: int,
    time_cap_s: float,
    tls: TlsConfig | None = None,
) -> LatencySample:
    """Sends one record at a time to partition 0 and times each round trip (one record in flight)."""
    latencies_ms: list[float] = []
    errors = 0
    with KqClient(bootstrap, tls=tls) as client:
        for _ in range(warmup_sends):
            client.send(topic, value, partition=0)
        started = time.monotonic()
        deadline = started + time_cap_s
        for _ in range(sends):
            if time.monotonic() >= deadline or errors >= ERRORS_MAX:
                break
            sent_ns = time.perf_counter_ns()
            try:
                client.send(topic, value, partition=0)
            except KqClientError:
                errors += 1
                continue
            latencies_ms.append((time.perf_counter_ns() - sent_ns) / 1e6)
        elapsed_s = time.monotonic() - started
    return LatencySample(tuple(latencies_ms), errors, elapsed_s)
