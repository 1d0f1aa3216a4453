"""Three ways nats-py reads a JetStream stream from its start; the harness uses the fastest by default.

- `pull` (default): a pull consumer (ack none) asked for `batch` messages per request, two requests
  outstanding, messages counted in a subscription callback. This is what the Go client's
  `Consume()` does; it goes through JetStream's documented next-message API
  (`$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`) because nats-py has no helper for it.
- `fetch`: the same pull consumer through nats-py's `PullSubscription.fetch(batch)`, which awaits
  every message separately (a task and a timer each) and is several times slower here.
- `ordered`: nats-py's ordered push consumer (`js.subscribe(ordered_consumer=True)`) with a callback.

Each function reads until `records` messages or `cap_s`, and returns (messages, payload bytes,
requests, elapsed seconds) with the clock started just before the first request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

CONSUME_MODES = ("pull", "fetch", "ordered")
PENDING_MESSAGES_MAX = 1_000_000  # The client's buffer for a subscription that falls behind.
PENDING_BYTES_MAX = 512 * 1024 * 1024
FETCH_TIMEOUT_S = 5.0
PULL_REQUESTS_AHEAD = 2  # Outstanding pull requests, so the server never waits for the next one.
STATUS_HEADER = "Status"  # Pull status messages (no messages, request expired) carry it; not data.
NANOSECONDS_PER_S = 1_000_000_000

Reading = tuple[int, int, int, float]  # Messages, payload bytes, requests, elapsed seconds.


def _config(name: str | None, subject: str) -> ConsumerConfig:
    return ConsumerConfig(
        name=name,
        ack_policy=AckPolicy.NONE,
        deliver_policy=DeliverPolicy.ALL,
        filter_subject=subject,
    )


async def read(
    mode: str, nc: NatsClient, stream: str, subject: str, records: int, batch: int, cap_s: float
) -> Reading:
    """Reads `records` messages of `stream` from its start with the chosen mode."""
    assert mode in CONSUME_MODES, f"unknown consume mode {mode}"
    if mode == "fetch":
        return await _fetch(nc, stream, subject, records, batch, cap_s)
    if mode == "ordered":
        return await _ordered(nc, stream, subject, records, cap_s)
    return await _pull(nc, stream, subject, records, batch, cap_s)


async def _pull(nc: NatsClient, stream: str, subject: str, records: int, batch: int, cap_s: float) -> Reading:
    js = nc.jetstream()
    consumer = nc._nuid.next().decode()
    await js.add_consumer(stream, _config(consumer, subject))
    next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
    pull_request = json.dumps({"batch": batch, "expires": int(cap_s * NANOSECONDS_PER_S)}).encode()
    inbox = nc.new_inbox()
    done = asyncio.Event()
    received = payload_bytes = requests = 0

    async def on_message(message: Msg) -> None:
        nonlocal received, payload_bytes, requests
        if done.is_set() or (message.headers and STATUS_HEADER in message.headers):
            return  # Past the count (the last requests overshoot it), or a status message.
        received += 1
        payload_bytes += len(message.data)
        if received >= records:
            done.set()
        elif received % batch == 0:  # One request is used up: keep two outstanding.
            requests += 1
            await nc.publish(next_subject, pull_request, reply=inbox)

    subscription = await nc.subscribe(
        inbox, cb=on_message, pending_msgs_limit=PENDING_MESSAGES_MAX, pending_bytes_limit=PENDING_BYTES_MAX
    )
    started = time.monotonic()
    for _ in range(PULL_REQUESTS_AHEAD):
        requests += 1
        await nc.publish(next_subject, pull_request, reply=inbox)
    await _until(done, cap_s)
    elapsed_s = time.monotonic() - started
    await subscription.unsubscribe()
    await js.delete_consumer(stream, consumer)
    return received, payload_bytes, requests, elapsed_s


async def _fetch(
    nc: NatsClient, stream: str, subject: str, records: int, batch: int, cap_s: float
) -> Reading:
    js = nc.jetstream()
    subscription = await js.pull_subscribe(
        subject,
        stream=stream,
        config=_config(None, subject),
        pending_msgs_limit=PENDING_MESSAGES_MAX,
        pending_bytes_limit=PENDING_BYTES_MAX,
    )
    received = payload_bytes = requests = 0
    started = time.monotonic()
    while received < records and time.monotonic() < started + cap_s:
        try:
            messages = await subscription.fetch(min(batch, records - received), timeout=FETCH_TIMEOUT_S)
        except nats.errors.TimeoutError:
            break  # Nothing more within the run.
        requests += 1
        received += len(messages)
        payload_bytes += sum(len(message.data) for message in messages)
    elapsed_s = time.monotonic() - started
    await subscription.unsubscribe()
    return received, payload_bytes, requests, elapsed_s


async def _ordered(nc: NatsClient, stream: str, subject: str, records: int, cap_s: float) -> Reading:
    js = nc.jetstream()
    done = asyncio.Event()
    received = payload_bytes = 0

    async def on_message(message: Msg) -> None:
        nonlocal received, payload_bytes
        if done.is_set():
            return  # The consumer pushes past the count until the subscription ends.
        received += 1
        payload_bytes += len(message.data)
        if received >= records:
            done.set()

    started = time.monotonic()
    options: dict[str, Any] = {
        "pending_msgs_limit": PENDING_MESSAGES_MAX,
        "pending_bytes_limit": PENDING_BYTES_MAX,
    }
    subscription = await js.subscribe(subject, stream=stream, cb=on_message, ordered_consumer=True, **options)
    await _until(done, cap_s)
    elapsed_s = time.monotonic() - started
    await subscription.unsubscribe()
    return received, payload_bytes, 1, elapsed_s


async def _until(done: asyncio.Event, timeout_s: float) -> None:
    """Waits for `done`, at most `timeout_s` (a short stream ends the run at the cap)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), timeout_s)
