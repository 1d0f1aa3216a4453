"""Fuzzing every Broker RPC on a real cluster: no bad input kills a node, stalls commits or answers INTERNAL.

Seeded and bounded: the seed is printed and named in the failure message, and `KQ_FUZZ_SEED=<seed>`
replays the same sequence of requests (which node leads may differ). The whole test, cluster start
and end checks included, takes at most KQ_FUZZ_BUDGET_S seconds (default 32). The cases, in
tests/system/fuzz_*.py: hostile field values for every RPC, valid and mutated record batches
(truncated, count-lying, empty, zstd/lz4 of nothing, bit flips, garbage, bombs, oversized), and raw
wire bytes (random, truncated, wrong wire types, huge varints, nesting thousands deep), sent to the
leader and to followers. Checks: after every request each node process is alive; a canary record
commits every few seconds; no answer is INTERNAL or UNKNOWN; at the end every node serves every
canary record identically, and no node log holds a CRITICAL line or a traceback.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from kq.client import KqClient, ProducerRecord
from kq.deploy.cluster import LocalCluster
from kq.proto import kq_pb2
from tests.system.fuzz_harness import (
    CANARY_DEADLINE_S,
    CANARY_TOPIC,
    STOP_TIMEOUT_S,
    UNARY_TIMEOUT_S,
    FuzzRun,
)
from tests.system.fuzz_report import Findings, log_problems
from tests.system.fuzz_requests import RPCS, Case, CaseGenerator
from tests.system.fuzz_values import BACKTRACKING_TOPICS, Hostile, Known

pytestmark = pytest.mark.system

BUDGET_S = float(os.environ.get("KQ_FUZZ_BUDGET_S", "32"))
READ_BACK_S = 5.0  # Nodes are read in parallel; a follower may still be applying the last entries.
# After the fuzzing: in-flight calls end, a last canary, the read-back from every node, the nodes stop.
END_CHECKS_S = UNARY_TIMEOUT_S + CANARY_DEADLINE_S + READ_BACK_S + STOP_TIMEOUT_S
HUGE_PROBABILITY = 0.01  # Multi-megabyte requests: rare, each costs every node time and memory.


def _seed() -> int:
    text = os.environ.get("KQ_FUZZ_SEED")
    return int(text) if text else random.SystemRandom().randrange(2**32)


def _setup(cluster: LocalCluster) -> None:
    """Topics the cases aim at (fz-b has three partitions), with records, and the canary's topic."""
    with KqClient(cluster.bootstrap) as client:
        client.create_topic("fz-a", partitions=1)
        client.create_topic("fz-b", partitions=3)
        for name in BACKTRACKING_TOPICS:
            client.create_topic(name, partitions=1)
        client.create_topic(CANARY_TOPIC, partitions=1)
        for topic, partitions in (("fz-a", 1), ("fz-b", 3)):
            for partition in range(partitions):
                client.send_batch(
                    topic, [ProducerRecord(f"r{i}".encode(), b"k", partition=partition) for i in range(20)]
                )


def test_fuzzed_requests_never_break_the_cluster(tmp_path: Path) -> None:
    """Hostile, mutated and raw requests to every RPC on every node: the cluster stays up and correct."""
    began = time.monotonic()
    seed = _seed()
    print(f"kq fuzz seed {seed} (replay: KQ_FUZZ_SEED={seed})")
    rng = random.Random(seed)
    findings = Findings()
    cluster = LocalCluster(tmp_path / "cluster")
    known = Known()
    run: FuzzRun | None = None
    fuzz_s = 0.0
    try:
        cluster.start()
        _setup(cluster)
        run = FuzzRun(cluster, findings, seed, known)
        generator = CaseGenerator(Hostile(rng, known, HUGE_PROBABILITY), sorted(cluster.nodes))
        run.run(generator.next_case, until=began + BUDGET_S - END_CHECKS_S)
        fuzz_s = time.monotonic() - run.started
        if not findings.stalls:  # A stalled cluster serves nothing either: the stall is the report.
            if not findings.deaths:
                run.canary()  # The cluster still commits after the last case.
            run.read_back(time.monotonic() + READ_BACK_S)
    finally:
        if run is not None:
            run.close()
        cluster.stop(STOP_TIMEOUT_S)  # All nodes at once: SIGTERM, SIGKILL after STOP_TIMEOUT_S.
    bad_requests = run.bad_requests if run is not None else 0
    for node_id in sorted(cluster.nodes):
        findings.logs += log_problems(node_id, cluster.log_path(node_id), bad_requests)
    summary = _summary(findings, run, fuzz_s, time.monotonic() - began)
    print(summary)
    print(findings.status_table())
    problems = findings.problems()
    if problems:
        pytest.fail(
            f"kq fuzz found {len(problems)} problem(s); seed {seed} "
            f"(replay: KQ_FUZZ_SEED={seed} pytest tests/system/test_fuzz.py)\n{summary}\n"
            + "\n".join(f"  {line}" for line in problems),
            pytrace=False,
        )


def _summary(findings: Findings, run: FuzzRun | None, fuzz_s: float, total_s: float) -> str:
    if run is None:
        return "the cluster did not start"
    per_rpc = {rpc: sum(n for (name, _), n in findings.counts.items() if name == rpc) for rpc in RPCS}
    least = min(per_rpc, key=per_rpc.__getitem__)
    return (
        f"{run.sent} requests in {fuzz_s:.1f} s of fuzzing ({total_s:.1f} s in all), every RPC at least "
        f"{per_rpc[least]} times ({least}); {run.bad_requests} rejected; "
        f"{len(run.canaries)} canary records committed"
    )


def test_the_generator_never_removes_a_member_of_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile name, a mutation or raw bytes can spell a member's id ("1"); such a RemoveNode case is
    drawn again, since a removed node rightly stops serving and the canary read-back expects every node
    (a seed in a suite run removed node 1 that way)."""
    generator = CaseGenerator(Hostile(random.Random(1), Known(), HUGE_PROBABILITY), ["1", "2", "3"])
    drawn = iter(
        [
            Case("RemoveNode", kq_pb2.RemoveNodeRequest(node_id="1").SerializeToString(), "member", "1"),
            Case("RemoveNode", b"\xff\xff", "raw", "1"),  # Not a RemoveNodeRequest: the node refuses it.
        ]
    )
    monkeypatch.setattr(generator, "_any_case", lambda: next(drawn))
    assert generator.next_case().label == "raw"
    stranger = Case("RemoveNode", kq_pb2.RemoveNodeRequest(node_id="9").SerializeToString(), "9", "1")
    assert not generator._removes_a_member(stranger)
