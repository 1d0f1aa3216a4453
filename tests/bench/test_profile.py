"""`kq.bench.profile`'s reading of py-spy's collapsed stacks: busy samples per thread, idle waits left
out, top frames by self and total samples, and the printed report; and its timeline of the steps
of one record's commit (`--timeline`)."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kq.bench.profile import (
    COMMIT_INDEX_METRIC,
    PRODUCE_REQUESTS_METRIC,
    KafkaShape,
    metric_sum,
    report,
    thread_profile,
    timeline,
)

REPO = Path(__file__).resolve().parents[2]
TIMELINE_RUN_TIMEOUT_S = 180.0  # Three nodes start, 200 sends, they stop: seconds; bounds a hang.

RAW = "\n".join(
    [
        "thread (0x1): kq-raft-tick;_tick (kq/raft/node.py:268);doTick (pysyncobj/syncobj.py:609);"
        "poll (kq/raft/transport.py:10) 5",
        "thread (0x1): kq-raft-tick;_tick (kq/raft/node.py:268);apply (kq/raft/state_machine.py:97) 3",
        "thread (0x1): kq-raft-tick;_tick (kq/raft/node.py:268);PollPoller.poll (pysyncobj/poller.py:88) 40",
        "thread (0x2): kq-grpc-loop;run_forever (asyncio/base_events.py:607);"
        "Handle._run (asyncio/events.py:80) 7",
        "thread (0x2): kq-grpc-loop;run_forever (asyncio/base_events.py:607);"
        "EpollSelector.select (selectors.py:468) 90",
        "not a sample line",
    ]
)


def test_threads_are_ranked_by_busy_samples_without_their_idle_waits() -> None:
    profile = thread_profile(RAW)
    assert list(profile) == ["kq-raft-tick", "kq-grpc-loop"]  # 8 busy samples, then 7: the waits are out.
    tick = profile["kq-raft-tick"]
    assert tick["busy"] == [("samples", 8)]
    assert tick["self"] == [("poll (transport.py:10)", 5), ("apply (state_machine.py:97)", 3)]
    # _tick is on every busy stack (the thread's loop): left out; doTick (and poll, inside it) on 5 of 8.
    assert tick["total"][:2] == [("doTick (syncobj.py:609)", 5), ("poll (transport.py:10)", 5)]
    assert all(not frame.startswith("_tick") for frame, _ in tick["total"])


def test_the_report_gives_rates_cpu_and_shares_of_busy_samples() -> None:
    lines = report("one-in-flight", 1_000, 2.0, {"leader 1": 2_000.0, "follower 2": 500.0}, {"leader": RAW})
    text = "\n".join(lines)
    assert lines[0] == "one-in-flight: 1,000 messages in 2.00 s = 500 msgs/s"
    assert "leader 1 2,000.0, follower 2 500.0" in lines[1]
    assert "leader kq-raft-tick: 8 busy samples" in text
    assert " 62.5%  poll (transport.py:10)" in text  # 5 of the thread's 8 busy samples.


def test_the_timeline_gives_each_steps_median_offset_from_the_leaders_produce() -> None:
    """Two requests, one at a time: each reading is placed against the Produce it falls in; the first
    follower to reach a step is its #1; readings outside the window, or before any Produce, count not;
    a step seen in fewer than half the requests is left out."""
    leader = [
        ("produce", "+", 1_000),  # Before the window: not counted.
        ("produce", "+", 10_000),
        ("message out: append_entries", "-", 12_000),
        ("apply", "+", 20_000),
        ("produce", "-", 30_000),
        ("produce", "+", 100_000),
        ("message out: append_entries", "-", 104_000),
        ("apply", "+", 114_000),
        ("produce", "-", 124_000),
    ]
    followers = {
        2: [("message in: append_entries", "+", 15_000), ("message in: append_entries", "+", 108_000)],
        3: [("message in: append_entries", "+", 16_000), ("apply", "+", 200_000)],  # After the window.
    }
    lines = timeline({1: leader, **followers}, 1, (5_000, 150_000))
    assert lines[0].startswith("timeline of 2 requests")
    rows = [line.split(None, 1) for line in lines[1:]]
    medians = {name: float(value) for value, name in rows}
    assert medians["leader message out: append_entries ends #1 (2)"] == 3.0
    assert medians["follower message in: append_entries starts #1 (2)"] == 6.5  # 5 and 8 µs.
    assert medians["follower message in: append_entries starts #2 (1)"] == 6.0  # Once in two requests.
    assert medians["leader apply starts #1 (2)"] == 12.0
    assert medians["leader produce ends #1 (2)"] == 22.0
    assert [value for value, _ in rows] == sorted([value for value, _ in rows], key=float)


@pytest.mark.system
def test_a_timeline_run_reads_every_step_of_the_commit_path() -> None:
    """`kq.bench.profile --timeline` on three real `kq.broker.timeline` nodes: every step of STEPS is
    read on the leader, a follower's AppendEntries and answer too, and the Produce ends last (a
    renamed or moved function in broker/timeline.py's STEPS fails here)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kq.bench.profile",
            "--scenario",
            "one-in-flight",
            "--messages",
            "200",
            "--timeline",
        ],
        cwd=REPO,
        check=True,
        timeout=TIMELINE_RUN_TIMEOUT_S,
        capture_output=True,
        text=True,
    )
    lines = result.stdout.splitlines()
    assert lines[1].startswith("timeline of 200 requests")
    steps = [line.split(None, 1)[1].rsplit(" #", 1)[0] for line in lines[2:]]
    for expected in (
        "leader batcher submit starts",
        "leader propose ends",
        "leader message out: append_entries starts",
        "follower message in: append_entries starts",
        "follower message out: next_node_idx ends",
        "leader socket event starts",
        "leader message in: next_node_idx starts",
        "leader apply starts",
        "leader apply ends",
    ):
        assert expected in steps, (expected, steps)
    assert steps[-1] == "leader produce ends"


def test_the_produce_requests_and_entries_are_read_from_the_leaders_metrics() -> None:
    """The Kafka Produce requests a node answered: the count of its Produce latency (the report's
    records a request), other requests' and other metrics' lines left out; the entries its Raft
    groups committed, summed over the groups; the Kafka producer batches as kq.bench.scale's unless
    told otherwise."""
    text = "\n".join(
        [
            "# HELP kq_kafka_request_latency_seconds Kafka requests",
            'kq_kafka_request_latency_seconds_count{request="produce"} 314.0',
            'kq_kafka_request_latency_seconds_count{request="metadata"} 3.0',
            'kq_kafka_request_latency_seconds_sum{request="produce"} 2.5',
            'kq_raft_commit_index{raft_group="0"} 40.0',
            'kq_raft_commit_index{raft_group="1"} 2.0',
            "kq_raft_commit_index_other 7.0",
        ]
    ).encode()

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *_: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
            assert metric_sum(url, PRODUCE_REQUESTS_METRIC) == 314.0
            assert metric_sum(url, COMMIT_INDEX_METRIC) == 42.0
        finally:
            server.shutdown()
    assert KafkaShape().batch_bytes is None and KafkaShape().keys == 0  # kq.bench.scale's batching, no key.
