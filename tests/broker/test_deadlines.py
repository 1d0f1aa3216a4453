"""Every wait on a call's path is capped by the call's deadline (broker/deadlines.py): the pure
helpers, a Kafka request's timeout, and an in-process node whose worker threads a short-deadline call
no longer holds for the whole catch-up wait."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from datetime import timedelta
from types import SimpleNamespace

import grpc
import pytest

from kq.broker import service_base
from kq.broker.deadlines import call_deadline, call_expired, capped, in_call_context
from kq.broker.errors import UnavailableError
from kq.broker.kafka.apis import request_timeout_s
from kq.broker.proposals import wait_async, wait_result
from kq.deploy.waiting import wait_for
from kq.proto import kq_pb2
from kq.proto.errors import ErrorCode
from tests.broker.conftest import EDGE_WORKERS, Edge, status_of

FAR_AHEAD = 10**12  # A Raft index this node will never apply.
SHORT_DEADLINE_S = 0.2
# Waits far longer than the test's: a call holding its thread for the named limit shows as a timeout.
PATCHED_CATCH_UP_WAIT_S = 600.0
FREED_WAIT_S = 60.0


def test_a_wait_is_the_named_limit_or_the_calls_time_left_whichever_is_shorter() -> None:
    """No deadline: the limit; a distant one: the limit; a passed one: nothing left to wait."""
    assert capped(2.0) == 2.0 and not call_expired()
    with call_deadline(None):
        assert capped(2.0) == 2.0
    with call_deadline(3600.0):
        assert capped(2.0) == 2.0
        assert 0.0 < capped(7200.0) <= 3600.0
    with call_deadline(0.0):
        assert capped(2.0) == 0.0 and call_expired()
    with call_deadline(-5.0):
        assert capped(2.0) == 0.0
    assert capped(2.0) == 2.0  # Reset after the block.


def test_a_pool_thread_works_within_the_deadline_of_the_call_that_handed_it_work() -> None:
    """`in_call_context` carries the deadline to another thread (run_in_executor would not)."""
    seen: list[float] = []
    with call_deadline(0.0):
        bound = in_call_context(lambda: seen.append(capped(2.0)))
    thread = threading.Thread(target=bound)
    thread.start()
    thread.join()
    assert seen == [0.0]


def test_a_commit_wait_ends_with_the_call_on_a_thread_and_on_the_loop() -> None:
    """A proposal that never commits: with the call's deadline passed, `wait_result` (a worker thread)
    and `wait_async` (the loop) answer NOT_COMMITTED at once, not after their 600 s limit."""
    leader = SimpleNamespace(is_leader=lambda: True)
    with call_deadline(0.0):
        with pytest.raises(UnavailableError) as on_thread:
            wait_result(Future(), PATCHED_CATCH_UP_WAIT_S, leader)
        with pytest.raises(UnavailableError) as on_loop:
            asyncio.run(wait_async(Future(), PATCHED_CATCH_UP_WAIT_S, leader))
    assert on_thread.value.code == on_loop.value.code == ErrorCode.NOT_COMMITTED


def test_a_kafka_requests_timeout_is_its_deadline() -> None:
    """Produce's or CreateTopics' `timeout` (Kafka's timeout_ms) caps its waits; none, or 0 (Kafka:
    do not wait), leaves the named limits."""
    assert request_timeout_s(SimpleNamespace(timeout=timedelta(milliseconds=1500))) == 1.5
    assert request_timeout_s(SimpleNamespace(timeout=timedelta(0))) is None
    assert request_timeout_s(SimpleNamespace(max_wait=timedelta(seconds=1))) is None


def test_a_call_past_its_deadline_frees_its_worker_thread(
    edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As many short-deadline reads as the node has worker threads, each waiting for an index the
    node will never apply: each ends at its deadline on the client, the node's calls in progress fall
    back to none, and a read that follows is served. Before, each held its thread for the whole
    catch-up wait (here made 600 s), so the follow-up found no free thread."""
    monkeypatch.setattr(service_base, "CATCH_UP_WAIT_S", PATCHED_CATCH_UP_WAIT_S)
    calls = [
        edge.stub.ListTopics.future(kq_pb2.ListTopicsRequest(min_index=FAR_AHEAD), timeout=SHORT_DEADLINE_S)
        for _ in range(EDGE_WORKERS)
    ]
    for call in calls:
        with pytest.raises(grpc.RpcError) as caught:
            call.result()
        assert status_of(caught.value) in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
    wait_for(lambda: edge.front.edge.unary_calls == 0, "the node's calls in progress to end", FREED_WAIT_S)
    answer = edge.stub.ListTopics(kq_pb2.ListTopicsRequest(), timeout=FREED_WAIT_S)
    assert [topic.name for topic in answer.topics] == ["t"]


def test_a_call_without_a_deadline_still_waits_the_named_limit(edge: Edge) -> None:
    """No client deadline: the catch-up wait is CATCH_UP_WAIT_S, then NOT_CAUGHT_UP (UNAVAILABLE)."""
    with pytest.raises(grpc.RpcError) as caught:
        edge.stub.ListTopics(kq_pb2.ListTopicsRequest(min_index=FAR_AHEAD))
    assert status_of(caught.value) == grpc.StatusCode.UNAVAILABLE
    assert "has not applied index" in str(caught.value.details())
