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
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kq.client import KqClient, ProducerRecord
from kq.deploy.cluster import LocalCluster

VALUE_BYTES = 64 * 1024
RECORDS_PER_REQUEST = 16  # 1 MiB requests fill the store quickly.
PROBE_VALUE = b"p" * 100


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


def run(arguments: argparse.Namespace) -> dict[str, Any]:
    """One measurement; the report as a dict."""
    base = arguments.keep_dir or Path(tempfile.mkdtemp(prefix="kq-store-copy-"))
    try:
        with LocalCluster(base / "cluster") as cluster:
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
            probe.stop()
            with cluster.log_path(leader).open("rb") as log:
                log.seek(log_start)
                leader_log = log.read().decode(errors="replace")
            copies = leader_log.count("sending a copy of the store")
            before = probe.latencies(before_start, restarted)
            during = probe.latencies(restarted, caught_up)
            client.close()
    finally:
        if arguments.keep_dir is None:
            shutil.rmtree(base, ignore_errors=True)
    p99_before, p99_during = _percentile(before, 0.99), _percentile(during, 0.99)
    report: dict[str, Any] = {
        "mib": arguments.mib,
        "fill_s": round(filled_s, 1),
        "catch_up_s": round(caught_up - restarted, 2),
        "copies_sent": copies,
        "probe_errors": probe.errors,
        "before": {
            "acks": len(before),
            "p50_ms": _ms(_percentile(before, 0.5)),
            "p99_ms": _ms(p99_before),
            "max_ms": _ms(max(before, default=None)),
        },
        "during": {
            "acks": len(during),
            "p50_ms": _ms(_percentile(during, 0.5)),
            "p99_ms": _ms(p99_during),
            "max_ms": _ms(max(during, default=None)),
        },
    }
    failures = []
    if p99_before is None or p99_during is None:
        failures.append("too few acknowledgements to compare")
    elif p99_during > arguments.p99_max_ratio * p99_before:
        failures.append(f"p99 during the copy {p99_during * 1000:.1f} ms > {arguments.p99_max_ratio}x before")
    if copies != 1:
        failures.append(f"{copies} copies sent to the follower, not 1")
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
