"""NATS JetStream's side of the side-by-side benchmark: three `nats-server` processes and `nats-py`.

Every stream is R3 with file storage (`num_replicas=3`, `storage=file`), so a publish is
acknowledged once a majority of the stream's Raft group has it, as a kq produce is. The clients:

- one in flight: `js.publish` awaited one at a time;
- pipelined: `js.publish_async` with up to `nats_max_pending` acknowledgements outstanding;
- consume: an ephemeral pull consumer (ack policy none, deliver all) fetched in large batches;
- failover: writers with `js.publish` (0.5 s timeout, retried) on a server that does not lead the
  stream, so their connection survives the kill and the gap is the stream's, not the client's
  reconnect timer.

Produce and latency clients connect to the server that leads the stream (its best case: no route
hop), as kq's client sends to the Raft leader. The asyncio loop runs in the calling thread.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import nats
import nats.errors
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import (
    StorageType,
    StreamConfig,
    StreamInfo,
)

from kq.bench import nats_consume
from kq.bench.failover import AckLog, FailoverSample, analyze
from kq.bench.nats_cluster import NatsCluster, nats_server_version
from kq.bench.produce_fetch import LatencySample, ThroughputSample
from kq.bench.side_by_side import (
    FAILOVER,
    LATENCY,
    PRODUCE_LARGE,
    PRODUCE_SMALL,
    SCENARIOS,
    CompareSettings,
)
from kq.deploy.waiting import holds_within

STREAMS = {
    LATENCY: ("CMP_LATENCY", "cmp.latency"),
    PRODUCE_SMALL: ("CMP_100B", "cmp.100b"),
    PRODUCE_LARGE: ("CMP_1KIB", "cmp.1kib"),
    FAILOVER: ("CMP_FAILOVER", "cmp.failover"),
}
LATENCY_WARMUP_SENDS = 20
PRODUCE_WARMUP_SENDS = 100
TIME_CHECK_EVERY = 1024
CONNECT_TIMEOUT_S = 2
API_TIMEOUT_S = 10.0  # JetStream API calls (stream info, consumer create).
SETUP_TIMEOUT_S = 30.0  # Stream creation is retried until the meta leader answers.
WRITER_PUBLISH_TIMEOUT_S = 0.5  # Failover writers: the resolution of the measured gap.
WRITER_ERROR_PAUSE_S = 0.01  # After a failed publish ("no responders" comes back at once).
REPLICAS_CURRENT_TIMEOUT_S = 60.0
POLL_S = 0.05
RECOVERY_POLL_S = 0.01  # The failover's clock: how finely recovery is seen.
Result = TypeVar("Result")


class NatsSystem:
    """A started three-server JetStream cluster with the benchmark streams; a context manager."""

    name = "nats"

    def __init__(self, settings: CompareSettings, base_dir: Path) -> None:
        self.settings = settings
        self.cluster = NatsCluster(base_dir / "nats")
        self._loop = asyncio.new_event_loop()

    def __enter__(self) -> NatsSystem:
        try:
            self.cluster.start()
            self._run(self._create_streams(), SETUP_TIMEOUT_S + API_TIMEOUT_S)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        try:
            self._loop.close()
        finally:
            self.cluster.stop()

    def _run(self, work: Awaitable[Result], timeout_s: float) -> Result:
        """Runs one coroutine on this system's loop, bounded by `timeout_s`."""
        return self._loop.run_until_complete(asyncio.wait_for(work, timeout_s))

    def scenarios(self) -> tuple[str, ...]:
        """The shared scenarios."""
        return SCENARIOS

    def server_pids(self) -> dict[str, int]:
        """The PID of each running server."""
        return self.cluster.pids()

    def describe(self) -> dict[str, Any]:
        """How NATS was driven."""
        settings = self.settings
        return {
            "server": f"{nats_server_version(self.cluster.binary)} (3 processes, JetStream R3 file streams)",
            "produce_client": f"nats-py {metadata.version('nats-py')} js.publish_async, "
            f"publish_async_max_pending={settings.nats_max_pending}, on the stream leader's server",
            "latency_client": "nats-py js.publish awaited one at a time, on the stream leader's server",
            "consume_client": f"{settings.nats_consume!r} reader of bench.nats_consume: "
            + {
                "pull": f"pull consumer (ack none), requests of {settings.nats_fetch_batch} messages, "
                "2 outstanding, callback subscription",
                "fetch": f"pull consumer (ack none), PullSubscription.fetch({settings.nats_fetch_batch})",
                "ordered": "ordered push consumer, callback subscription",
            }[settings.nats_consume],
            "failover": "kill -9 of the stream leader (stream info); writers: js.publish, one in flight "
            f"each, {WRITER_PUBLISH_TIMEOUT_S} s timeout, on another server",
        }

    # Set-up and helpers -------------------------------------------------------------------------

    async def _connect(self, names: list[str] | None = None, **options: Any) -> NatsClient:
        running = [n for n in self.cluster.nodes if self.cluster.running(n)]
        urls = [self.cluster.nodes[n].url for n in (names if names is not None else running)]
        return await nats.connect(urls, connect_timeout=CONNECT_TIMEOUT_S, **options)

    async def _create_streams(self) -> None:
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        nc = await self._connect()
        try:
            js = nc.jetstream(timeout=API_TIMEOUT_S)
            for stream, subject in STREAMS.values():
                config = StreamConfig(
                    name=stream, subjects=[subject], storage=StorageType.FILE, num_replicas=3
                )
                while True:
                    try:
                        await js.add_stream(config)
                        break
                    except nats.errors.Error:  # No meta leader yet: JetStream is still forming.
                        if time.monotonic() >= deadline:
                            raise
                        await asyncio.sleep(POLL_S)
        finally:
            await nc.close()

    async def _stream_leader(self, scenario: str) -> str:
        nc = await self._connect()
        try:
            info = await nc.jetstream(timeout=API_TIMEOUT_S).stream_info(STREAMS[scenario][0])
        finally:
            await nc.close()
        assert info.cluster is not None and info.cluster.leader is not None, "an R3 stream has a leader"
        return str(info.cluster.leader)

    async def _on_leader(self, scenario: str, **options: Any) -> tuple[NatsClient, JetStreamContext]:
        nc = await self._connect([await self._stream_leader(scenario)])
        return nc, nc.jetstream(**options)

    # Workloads ----------------------------------------------------------------------------------

    def latency(self, sends: int) -> LatencySample:
        """`js.publish` awaited one at a time."""
        cap_s = self.settings.scenario_time_cap_s
        return self._run(self._latency(sends, cap_s), cap_s + API_TIMEOUT_S)

    async def _latency(self, sends: int, cap_s: float) -> LatencySample:
        subject, value = STREAMS[LATENCY][1], b"v" * 100
        nc, js = await self._on_leader(LATENCY)
        latencies_ms: list[float] = []
        errors = 0
        try:
            for _ in range(LATENCY_WARMUP_SENDS):
                await js.publish(subject, value)
            started = time.monotonic()
            for _ in range(sends):
                if time.monotonic() >= started + cap_s:
                    break
                sent_ns = time.perf_counter_ns()
                try:
                    await js.publish(subject, value)
                except nats.errors.Error:
                    errors += 1
                    continue
                latencies_ms.append((time.perf_counter_ns() - sent_ns) / 1e6)
            elapsed_s = time.monotonic() - started
        finally:
            await nc.close()
        return LatencySample(tuple(latencies_ms), errors, elapsed_s)

    def produce(self, scenario: str, value: bytes, records: int) -> ThroughputSample:
        """`js.publish_async` with many acknowledgements outstanding."""
        cap_s = self.settings.scenario_time_cap_s
        return self._run(self._produce(scenario, value, records, cap_s), 2 * cap_s + API_TIMEOUT_S)

    async def _produce(self, scenario: str, value: bytes, records: int, cap_s: float) -> ThroughputSample:
        subject = STREAMS[scenario][1]
        nc, js = await self._on_leader(scenario, publish_async_max_pending=self.settings.nats_max_pending)
        acked = errors = sent = 0

        def done(future: asyncio.Future[Any]) -> None:
            nonlocal acked, errors
            if future.cancelled() or future.exception() is not None:
                errors += 1
            else:
                acked += 1

        try:
            for _ in range(PRODUCE_WARMUP_SENDS):
                await js.publish(subject, value)
            started = time.monotonic()
            for number in range(records):
                if number % TIME_CHECK_EVERY == 0 and time.monotonic() >= started + cap_s:
                    break
                future = await js.publish_async(subject, value)
                future.add_done_callback(done)
                sent += 1
            await asyncio.wait_for(js.publish_async_completed(), cap_s)
            elapsed_s = time.monotonic() - started
        finally:
            await nc.close()
        return ThroughputSample(acked, acked * len(value), sent, errors, elapsed_s)

    def ensure_records(self, scenario: str, value: bytes, records: int) -> None:
        """Publishes (untimed) until the stream holds at least `records` messages."""
        held = self._run(self._messages(scenario), API_TIMEOUT_S * 2)
        if held < records:
            self.produce(scenario, value, records - held)

    async def _messages(self, scenario: str) -> int:
        nc = await self._connect()
        try:
            info = await nc.jetstream(timeout=API_TIMEOUT_S).stream_info(STREAMS[scenario][0])
        finally:
            await nc.close()
        return int(info.state.messages)

    def consume(self, records: int) -> ThroughputSample:
        """A pull consumer (ack none) from the start of the 100-byte stream, large batches."""
        cap_s = self.settings.scenario_time_cap_s
        return self._run(self._consume(records, cap_s), cap_s + nats_consume.FETCH_TIMEOUT_S + API_TIMEOUT_S)

    async def _consume(self, records: int, cap_s: float) -> ThroughputSample:
        stream, subject = STREAMS[PRODUCE_SMALL]
        settings = self.settings
        nc = await self._connect()
        try:
            received, payload_bytes, requests, elapsed_s = await nats_consume.read(
                settings.nats_consume, nc, stream, subject, records, settings.nats_fetch_batch, cap_s
            )
        finally:
            await nc.close()
        return ThroughputSample(received, payload_bytes, requests, 0, elapsed_s)

    def failover(self) -> FailoverSample:
        """Writers run; the stream leader is killed; the killed server rejoins and catches up."""
        settings = self.settings
        leader = self._run(self._stream_leader(FAILOVER), API_TIMEOUT_S)
        timeout_s = settings.failover_window_s + settings.scenario_time_cap_s + API_TIMEOUT_S
        sample = self._run(self._failover(leader), timeout_s)
        self.cluster.start_node(leader)
        self.cluster.wait_healthy([leader])
        self._run(self._replicas_current(FAILOVER), REPLICAS_CURRENT_TIMEOUT_S)
        return sample

    async def _failover(self, leader: str) -> FailoverSample:
        counts, settings = self.settings.counts, self.settings
        other = next(name for name in sorted(self.cluster.nodes) if name != leader)
        nc = await self._connect([other])
        log, stop = AckLog(), asyncio.Event()
        writers = [
            asyncio.ensure_future(_writer(nc.jetstream(), STREAMS[FAILOVER][1], log, stop))
            for _ in range(counts.failover_writers)
        ]
        loop = asyncio.get_running_loop()

        def recovered_after(moment: float, timeout_s: float) -> Awaitable[bool]:
            """The harness's wait in a thread, so that the writers keep going meanwhile."""
            condition = functools.partial(log.recovered_after, moment)
            waiting = functools.partial(holds_within, condition, timeout_s, poll_s=RECOVERY_POLL_S)
            return loop.run_in_executor(None, waiting)

        try:
            await recovered_after(0.0, settings.scenario_time_cap_s)
            await asyncio.sleep(counts.failover_load_before_s)  # Load, not synchronization.
            killed_at = time.monotonic()
            # In a thread, so that the writers keep going; returns once the process is reaped.
            await loop.run_in_executor(None, self.cluster.kill_node, leader)
            dead_at = time.monotonic()
            await recovered_after(dead_at, settings.failover_window_s)
            await asyncio.sleep(counts.failover_load_after_s)
        finally:
            stop.set()
            await asyncio.gather(*writers, return_exceptions=True)
            await nc.close()
        return analyze(leader, log.acks(), killed_at, dead_at, time.monotonic(), log.errors)

    async def _replicas_current(self, scenario: str) -> None:
        """Waits until the stream has a leader and every replica is current (caught up)."""
        while True:
            nc = await self._connect()
            try:
                info = await nc.jetstream(timeout=API_TIMEOUT_S).stream_info(STREAMS[scenario][0])
            except nats.errors.Error:
                info = None
            finally:
                await nc.close()
            if info is not None and _caught_up(info):
                return
            await asyncio.sleep(POLL_S * 4)


def _caught_up(info: StreamInfo) -> bool:
    """A leader and two followers, both current: a restarted server has caught up with the stream."""
    cluster = info.cluster
    if cluster is None or not cluster.leader or len(cluster.replicas or []) != 2:
        return False
    return all(peer.current and not peer.offline for peer in cluster.replicas or [])


async def _writer(js: JetStreamContext, subject: str, log: AckLog, stop: asyncio.Event) -> None:
    """Publishes one message at a time until `stop`, logging each acknowledgement and failure."""
    value = b"v" * 100
    while not stop.is_set():
        sent_at = time.monotonic()
        try:
            await js.publish(subject, value, timeout=WRITER_PUBLISH_TIMEOUT_S)
        except nats.errors.Error:
            log.error()
            await asyncio.sleep(WRITER_ERROR_PAUSE_S)
        else:
            log.ack(sent_at)

