"""`python -m kq.bench.store_copy`: a wiped follower catches up by a store copy while one record is in
flight; the leader's acknowledgements during the copy against before it (issue 39, point 2).

A fresh three-node `LocalCluster` stores `--mib` MiB (default 300) in 64 KiB records. One client
sends one 100-byte record at a time to another topic and records each acknowledgement's latency: for
`--before-s` seconds with the three nodes up (the baseline), then a follower is stopped, its data
directory wiped and it is started again at once, so the leader's log start is far past it and it can
only catch up by a copy of the leader's store; from then until it has applied what the leader had
(the copy and its restore).
The verdict (exit code 0 on PASS, 1 on FAIL): the p99 during the copy at most `--p99-max-ratio` (2)
times the p99 before it, exactly one copy sent to that follower (the leader's `sending a copy of the
store` log lines), and the follower caught up within `--catch-up-timeout-s`.

`--kill-leader` then kills the leader with -9 twice and starts it again once another node leads: once
with no copy under way, once KILL_INTO_COPY_S after the leader logged a copy to a follower wiped again.
It reports the time from each kill to a new leader (the failover; FAIL when the one during a copy
takes more than twice, and more than a second longer than, the one without) and to the next
acknowledgement of a record sent after the kill. During a copy that second time is bounded by the
copy and the killed node's restart, not by the election: the wiped follower and the new leader are
the only nodes left, and no majority holds the log until the follower has restored a copy (from the
new leader) or the killed node is back.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kq.client import KqClient, ProducerRecord
from kq.deploy.cluster import LocalCluster

VALUE_BYTES = 64 * 1024
RECORDS_PER_REQUEST = 16  # 1 MiB requests fill the store quickly.
PROBE_VALUE = b"p" * 100
KILL_INTO_COPY_S = 1.0  # How long after the leader logs a copy under way `--kill-leader` kills it.


def _percentile(values: Sequence[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


class Probe(threading.Thread):
    """Sends one record at a time and keeps (sent, latency) of each acknowledgement."""

    def __init__(self, client: KqClient, topic: str) -> None:
        super().__init__(name="store-copy-probe", daemon=True)
        self._client = client
        self._topic = topic
        self._stopping = threading.Event()
        self.acks: list[tuple[float, float]] = []
        self.errors = 0

    def stop(self) -> None:
        self._stopping.set()
        self.join()

    def run(self) -> None:
        while not self._stopping.is_set():
            sent = time.monotonic()
            try:
                self._client.send(self._topic, PROBE_VALUE, partition=0)
            except Exception:  # Counted: the verdict reads latencies of acknowledged records only.
                self.errors += 1
                continue
            self.acks.append((sent, time.monotonic() - sent))

    def latencies(self, start: float, end: float) -> list[float]:
        return [latency for sent, latency in self.acks if start <= sent < end]

    def first_ack_after(self, moment: float, timeout_s: float) -> float | None:
        """When the first record sent after `moment` was acknowledged, or None if none was within
        `timeout_s` (a record sent before may have been answered by a node that died since)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = [sent + latency for sent, latency in self.acks[-64:] if sent >= moment]
            if done:
                return min(done)
            time.sleep(0.01)
        return None


def _failover(
    cluster: LocalCluster, probe: Probe, copying_to: str | None, timeout_s: float
) -> tuple[float | None, float | None]:
    """Kills the leader with -9 (once the leader logs a copy to `copying_to` under way, when given),
    starts it again once another node leads, and returns the seconds from the kill to that new leader
    (None: none within `timeout_s`) and to the next acknowledgement of a record sent after the kill;
    then waits until every node has applied what the new leader had."""
    leader = cluster.wait_ready()
    if copying_to is not None:
        log_start = cluster.log_path(leader).stat().st_size
        cluster.stop_node(copying_to)
        shutil.rmtree(cluster.nodes[copying_to].data_dir)
        cluster.start_node(copying_to)
        address = cluster.nodes[copying_to].raft_address
        wanted = "sending a copy of the store at applied index"

        def copying() -> bool:
            with cluster.log_path(leader).open("rb") as log:
                log.seek(log_start)
                lines = log.read().decode(errors="replace").splitlines()
            return any(wanted in line and address in line for line in lines)

        deadline = time.monotonic() + timeout_s
        while not copying() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(KILL_INTO_COPY_S)
    killed = time.monotonic()
    cluster.kill_node(leader)
    sent_after = time.monotonic()
    elected: float | None = None
    while elected is None and time.monotonic() - killed < timeout_s:
        if cluster.leader_id() not in (None, leader):
            elected = time.monotonic() - killed
        else:
            time.sleep(0.01)
    cluster.start_node(leader)
    acknowledged = probe.first_ack_after(sent_after, timeout_s)
    cluster.wait_ready()
    target = max(s.applied_index for s in cluster.statuses().values() if s is not None)
    cluster.wait_applied(target, sorted(cluster.nodes), timeout_s=timeout_s)
    return elected, None if acknowledged is None else acknowledged - killed


@dataclass
class Measured:
    """What one run measured (`run` reports it)."""

    filled_s: float
    catch_up_s: float
    copies: int
    probe_errors: int
    before: list[float]  # Acknowledgement latencies, seconds.
    during: list[float]
    failovers: dict[str, float | None]


def run(arguments: argparse.Namespace) -> dict[str, Any]:
    """One measurement; the report as a dict."""
    base = arguments.keep_dir or Path(tempfile.mkdtemp(prefix="kq-store-copy-"))
    try:
        with LocalCluster(base / "cluster") as cluster:
            measured = _measure(cluster, arguments)
    finally:
        if arguments.keep_dir is None:
            shutil.rmtree(base, ignore_errors=True)
    return _report(arguments, measured)


def _measure(cluster: LocalCluster, arguments: argparse.Namespace) -> Measured:
    leader = cluster.wait_ready()
    follower = next(node for node in sorted(cluster.nodes) if node != leader)
    client = KqClient(cluster.bootstrap)
    client.create_topic("fill", 1)
    client.create_topic("probe", 1)
    value = b"v" * VALUE_BYTES
    requests = arguments.mib * 1024 * 1024 // (VALUE_BYTES * RECORDS_PER_REQUEST)
    filled_s = time.monotonic()
    for _ in range(requests):
        client.send_batch("fill", [ProducerRecord(value, partition=0)] * RECORDS_PER_REQUEST)
    filled_s = time.monotonic() - filled_s
    probe = Probe(client, "probe")
    probe.start()
    before_start = time.monotonic()
    time.sleep(arguments.before_s)
    log_start = cluster.log_path(leader).stat().st_size
    restarted = time.monotonic()
    cluster.stop_node(follower)
    shutil.rmtree(cluster.nodes[follower].data_dir)
    cluster.start_node(follower)
    target = max(s.applied_index for s in cluster.statuses().values() if s is not None)
    cluster.wait_applied(target, [follower], timeout_s=arguments.catch_up_timeout_s)
    caught_up = time.monotonic()
    with cluster.log_path(leader).open("rb") as log:
        log.seek(log_start)
        copies = log.read().decode(errors="replace").count("sending a copy of the store")
    failovers: dict[str, float | None] = {}
    if arguments.kill_leader:
        timeout_s = arguments.catch_up_timeout_s
        leader_s, write_s = _failover(cluster, probe, None, timeout_s)
        failovers["without_copy_leader_s"], failovers["without_copy_write_s"] = leader_s, write_s
        other = next(node for node in sorted(cluster.nodes) if node != cluster.wait_ready())
        leader_s, write_s = _failover(cluster, probe, other, timeout_s)
        failovers["during_copy_leader_s"], failovers["during_copy_write_s"] = leader_s, write_s
    probe.stop()
    client.close()
    return Measured(
        filled_s=filled_s,
        catch_up_s=caught_up - restarted,
        copies=copies,
        probe_errors=probe.errors,
        before=probe.latencies(before_start, restarted),
        during=probe.latencies(restarted, caught_up),
        failovers=failovers,
    )


def _summary(latencies: list[float]) -> dict[str, Any]:
    return {
        "acks": len(latencies),
        "p50_ms": _ms(_percentile(latencies, 0.5)),
        "p99_ms": _ms(_percentile(latencies, 0.99)),
        "max_ms": _ms(max(latencies, default=None)),
    }


def _report(arguments: argparse.Namespace, measured: Measured) -> dict[str, Any]:
    p99_before, p99_during = _percentile(measured.before, 0.99), _percentile(measured.during, 0.99)
    report: dict[str, Any] = {
        "mib": arguments.mib,
        "fill_s": round(measured.filled_s, 1),
        "catch_up_s": round(measured.catch_up_s, 2),
        "copies_sent": measured.copies,
        "probe_errors": measured.probe_errors,
        "before": _summary(measured.before),
        "during": _summary(measured.during),
    }
    failures = []
    if p99_before is None or p99_during is None:
        failures.append("too few acknowledgements to compare")
    elif p99_during > arguments.p99_max_ratio * p99_before:
        failures.append(f"p99 during the copy {p99_during * 1000:.1f} ms > {arguments.p99_max_ratio}x before")
    if arguments.kill_leader:
        failovers = measured.failovers
        report["failover"] = {name: None if v is None else round(v, 3) for name, v in failovers.items()}
        without, during_copy = failovers["without_copy_leader_s"], failovers["during_copy_leader_s"]
        if without is None or during_copy is None:
            failures.append("no new leader after a leader kill")
        elif during_copy > max(2 * without, without + 1.0):
            failures.append(
                f"a new leader {during_copy:.2f} s after a kill during a copy, {without:.2f} s without"
            )
    if measured.copies != 1:
        failures.append(f"{measured.copies} copies sent to the follower, not 1")
    report["verdict"] = {"pass": not failures, "failures": failures}
    return report


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the measurement, prints the report (and writes `--json`); 0 on PASS."""
    parser = argparse.ArgumentParser(
        prog="python -m kq.bench.store_copy", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--mib", type=int, default=300, help="MiB stored before the follower is wiped")
    parser.add_argument("--before-s", type=float, default=20.0, help="the baseline's length")
    parser.add_argument("--catch-up-timeout-s", type=float, default=300.0)
    parser.add_argument("--p99-max-ratio", type=float, default=2.0)
    parser.add_argument(
        "--kill-leader",
        action="store_true",
        help="then kill -9 the leader twice, with no copy under way and in the middle of one, and compare "
        "the time to the next acknowledgement",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--keep-dir", type=Path, default=None, help="run the cluster here and keep it")
    arguments = parser.parse_args(argv)
    report = run(arguments)
    print(json.dumps(report, indent=2))
    if arguments.json is not None:
        arguments.json.write_text(json.dumps(report, indent=2))
    print("VERDICT: PASS" if report["verdict"]["pass"] else "VERDICT: FAIL")
    return 0 if report["verdict"]["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
