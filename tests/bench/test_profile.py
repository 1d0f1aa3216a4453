"""`kq.bench.profile`'s reading of py-spy's collapsed stacks: busy samples per thread, idle waits left
out, top frames by self and total samples, and the printed report."""

from __future__ import annotations

from kq.bench.profile import report, thread_profile

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
