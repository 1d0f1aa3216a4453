"""Runs one scenario end to end: cluster, workload, fault rounds, healing, convergence, checker.

Phases, each bounded: start a fresh cluster (in a network lab when the scenario partitions) and the
workload; run the fault rounds; heal everything and see writes resume; stop the producers; wait
until every node applied everything; let the consumer groups catch up with the log end, stop their
members and wait again until every node applied their commits; set the scenario's final topic
configs (a time-based retention turned off, so the log start stops moving) and wait until every
node applied them; read every partition (in one state of every node: `chaos.reader`) and the
groups' committed offsets from every node; check, allowing the documented gaps the topic's configs
call for (`chaos.gaps`); stop the nodes and compare their LMDB stores byte for byte (`chaos.stores`).
Every step reads the members as they are at its time (`cluster.nodes`): a scenario may add and remove
nodes. Whatever happens, every process is stopped by its PID and the lab is removed.

A secure run (`RunSettings.secure`) makes certificates into the scenario's `certs/` (kq.deploy.certs,
through `LocalCluster(tls_dir=...)`), starts the nodes with mutual TLS on gRPC and TLS on Kafka and
with `--auth` (the `admin` certificate is the super-user), and
gives every client (workload, probes, admin calls, reader) the `admin` certificate and the CA. Before
the nodes stop, each one still running must refuse plain text on both ports and serve TLS on Kafka
(`kq.deploy.tls_probe`; restarted nodes included), else a `plain-text` anomaly: a run that says it
was secure and was not fails.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException

from kq.chaos.checker import Anomaly, CheckResult, check
from kq.chaos.context import HEALTHY_TIMEOUT_S, STEADY_ACKS, FaultEvent, LivenessError, ScenarioContext
from kq.chaos.exactly_once import INPUT_TOPIC, OUTPUT_TOPIC, ExactlyOnce
from kq.chaos.exactly_once_check import check_exactly_once
from kq.chaos.gaps import Lifecycle
from kq.chaos.group_members import group_member_specs
from kq.chaos.history import History
from kq.chaos.netns import NetnsError, NetworkLab, unavailable_reason
from kq.chaos.reader import read_everything, read_group_offsets
from kq.chaos.scenarios import Scenario, Step
from kq.chaos.stores import compare_stores
from kq.chaos.workload import Workload, producer_specs
from kq.client import KqClient, KqClientError
from kq.deploy.cluster import LocalCluster
from kq.deploy.tls_probe import plain_text_problems

logger = logging.getLogger(__name__)

TOPIC = "chaos"
CERTS_DIR = "certs"  # In the scenario's directory: the CA, node and `admin` certificates of a secure run.
# A secure run also turns on authentication and ACLs; the `admin` certificate every client presents is
# the super-user (as `deploy/run-cluster.sh start --secure` does).
SECURE_NODE_ARGS = ("--auth", "--super-user", "User:admin")
SCENARIO_BASE_BUDGET_S = 180.0  # Start, warm-up, healing, convergence and reading, at most.
ROUND_BUDGET_S = 120.0  # One fault round, at most; a run normally needs a small fraction of it.
GROUP_HISTORY_FILE = "group-history.json"
EXACTLY_ONCE_HISTORY_FILE = "eos-history.json"
EXACTLY_ONCE_SUMMARY = (
    "eos_input_records",
    "eos_inputs_written_once",
    "eos_transactions_committed",
    "eos_offset_polls",
)
# Moderate compaction, so snapshots are taken (and sent to restarted nodes) during every scenario.
DEFAULT_NODE_ARGS = ("--compaction-min-entries", "1000")


@dataclass(frozen=True, slots=True)
class RunSettings:
    """What every scenario of one run shares."""

    work_dir: Path
    nodes: int = 3
    seed: int = 1
    partitions: int = 6
    producers: int = 4
    rate_per_producer: float = 50.0  # Requests per second, each of 1 to 5 records.
    rounds: int | None = None  # Replaces every step's default round count.
    node_args: tuple[str, ...] = ()
    keep_data: bool = False
    group_members: int = 3  # Members of the consumer group (0: no group); at least 2 for rebalances.
    secure: bool = False  # Mutual TLS on gRPC, TLS on Kafka; every client presents `admin`'s certificate.
    processes: int = 1  # Worker processes per node (`--processes`): a Raft group each.


@dataclass(slots=True)
class ScenarioReport:
    """One scenario's outcome: verdict, counts, faults with their timings, anomalies."""

    name: str
    nodes: int
    seed: int
    verdict: str = "PASS"  # PASS, FAIL or SKIPPED.
    reason: str = ""
    duration_s: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    faults: list[FaultEvent] = field(default_factory=list)
    anomalies: list[Anomaly] = field(default_factory=list)
    anomaly_counts: dict[str, int] = field(default_factory=dict)
    gaps: dict[str, int] = field(default_factory=dict)  # Documented gap kind -> acknowledged records.
    notes: list[str] = field(default_factory=list)
    data_dir: str | None = None
    origin_s: float = 0.0  # Monotonic time the workload started; fault times in the JSON count from it.


def run_scenario(scenario: Scenario, settings: RunSettings) -> ScenarioReport:
    """Runs `scenario` on a fresh cluster and checks it; never leaves a process or namespace behind."""
    report = ScenarioReport(scenario.name, settings.nodes, settings.seed)
    if scenario.needs_netns and (reason := unavailable_reason()) is not None:
        report.verdict, report.reason = "SKIPPED", f"skipped: {reason}"
        return report
    if scenario.exactly_once and settings.secure:
        report.verdict, report.reason = "SKIPPED", "skipped: the exactly-once workers speak plain-text Kafka"
        return report
    started_s = time.monotonic()
    base_dir = settings.work_dir / scenario.name
    node_ids = [str(i + 1) for i in range(settings.nodes)]
    lab = None
    if scenario.wants_netns:
        reason = unavailable_reason()
        lab = NetworkLab(node_ids) if reason is None else None
        if reason is not None:
            report.notes.append(f"no partitions: {reason}")
    elif scenario.needs_netns:
        lab = NetworkLab(node_ids)
    result = CheckResult()
    try:
        result = _run_in_lab(scenario, settings, base_dir, lab, report)
    except (NetnsError, RuntimeError, TimeoutError, KqClientError, KafkaException, OSError) as error:
        logger.exception("scenario %s could not run", scenario.name)
        result.add(Anomaly("error", f"{type(error).__name__}: {error}"))
    finally:
        if lab is not None:
            lab.destroy()
    report.duration_s = time.monotonic() - started_s
    report.anomalies, report.anomaly_counts = result.anomalies, result.anomaly_counts
    report.counts, report.gaps = result.counts, result.gaps
    if not result.ok:
        report.verdict = "FAIL"
        report.reason = ", ".join(f"{count} {kind}" for kind, count in sorted(result.anomaly_counts.items()))
    _keep_or_remove(base_dir, report, settings.keep_data)
    return report


def _run_in_lab(
    scenario: Scenario, settings: RunSettings, base_dir: Path, lab: NetworkLab | None, report: ScenarioReport
) -> CheckResult:
    if lab is not None:
        lab.create()
    cluster = LocalCluster(
        base_dir,
        settings.nodes,
        node_args=(
            *DEFAULT_NODE_ARGS,
            *(SECURE_NODE_ARGS if settings.secure else ()),
            *scenario.node_args,
            *settings.node_args,
        ),
        hosts=lab.hosts() if lab is not None else None,
        launcher=lab.launcher if lab is not None else None,
        tls_dir=base_dir / CERTS_DIR if settings.secure else None,
        processes=settings.processes,
    )
    try:
        cluster.start()
        result = _run_on_cluster(scenario, settings, cluster, lab, report)
        if settings.secure:
            _check_tls(cluster, result, report)
    finally:
        cluster.stop()
    _compare_stores(cluster, result, report)
    return result


def _check_tls(cluster: LocalCluster, result: CheckResult, report: ScenarioReport) -> None:
    """Every running node refuses plain-text clients on gRPC and Kafka and serves Kafka over TLS; each
    endpoint that does not is a `plain-text` anomaly. `tls_endpoints_checked` counts the endpoints."""
    problems = plain_text_problems(cluster)
    for problem in problems:
        result.add(Anomaly("plain-text", problem))
    running = [spec for node, spec in cluster.nodes.items() if cluster.running(node)]
    checked = sum(1 + bool(spec.kafka_address) for spec in running)
    result.counts["tls_endpoints_checked"] = checked
    report.notes.append(
        f"secure: mutual TLS on gRPC, TLS on Kafka; {checked} endpoints of {len(running)} nodes probed "
        f"at the end, {len(problems)} answering plain text or refusing TLS"
    )


def _compare_stores(cluster: LocalCluster, result: CheckResult, report: ScenarioReport) -> None:
    """Once the nodes stopped: the final members' stores of each Raft group (one per worker process:
    group 0's in the data directory, the others' under groups/<g>) must hold the same bytes
    (`chaos.stores`)."""
    compared = 0
    for group in range(cluster.processes):
        stores = {node: cluster.store_path(node, group) for node in cluster.nodes}
        comparison = compare_stores(stores)
        for anomaly in comparison.anomalies:
            result.add(anomaly)
        compared += comparison.compared
        prefix = f"group {group}: " if cluster.processes > 1 else ""
        report.notes += [prefix + note for note in comparison.notes]
    result.counts["stores_compared"] = compared


def _run_on_cluster(
    scenario: Scenario,
    settings: RunSettings,
    cluster: LocalCluster,
    lab: NetworkLab | None,
    report: ScenarioReport,
) -> CheckResult:
    with KqClient(cluster.bootstrap, tls=cluster.tls) as admin:
        admin.create_topic(TOPIC, settings.partitions, dict(scenario.topic_configs))
        if scenario.exactly_once:
            admin.create_topic(INPUT_TOPIC, settings.partitions)
            admin.create_topic(OUTPUT_TOPIC, settings.partitions)
        created_index = admin.index_seen
    # Every node knows the topic before the load starts: a consumer pinned to a follower, or a member
    # joining through one, would otherwise be told the topic does not exist (not retriable).
    cluster.wait_applied(created_index, list(cluster.nodes), timeout_s=HEALTHY_TIMEOUT_S)
    history = History()
    rng = random.Random(f"{settings.seed}/{scenario.name}")
    workload = Workload(
        TOPIC,
        settings.partitions,
        history,
        producer_specs(
            settings.producers, cluster.bootstrap, settings.rate_per_producer, scenario.workload, cluster.tls
        ),
        cluster.bootstrap,
        rng.randrange(1 << 30),
        group_member_specs(settings.group_members),
        cluster.tls,
    )
    rounds = scenario.rounds(settings.rounds)
    budget_s = SCENARIO_BASE_BUDGET_S + ROUND_BUDGET_S * sum(count for _, count in rounds)
    context = ScenarioContext(
        cluster, lab, history, TOPIC, settings.partitions, rng, time.monotonic() + budget_s, workload.follow
    )
    failures: list[Anomaly] = []
    exactly_once = (
        ExactlyOnce(cluster.kafka_bootstrap, settings.partitions, cluster.base_dir)
        if scenario.exactly_once
        else None
    )
    history.origin_s = time.monotonic()
    workload.start()
    try:
        if exactly_once is not None:
            exactly_once.start(history.origin_s)
        _run_rounds(context, rounds, failures)
        _finish(context, workload, scenario, failures, exactly_once)
    finally:
        workload.stop_producers()
        if exactly_once is not None:
            exactly_once.stop()
        _stop_probes(context)
        workload.stop_consumers()
        workload.stop_group_members()
        report.faults, report.origin_s = context.faults, history.origin_s
        report.notes += context.notes
    result = _read_and_check(cluster, history, failures, workload.groups(), scenario.lifecycle(), report)
    if exactly_once is not None:
        _check_exactly_once(exactly_once, result, report, cluster.base_dir)
    if not result.ok:  # Kept with the node logs: the commits and join reads behind a group anomaly.
        (cluster.base_dir / GROUP_HISTORY_FILE).write_text(json.dumps(history.group_excerpt(), indent=1))
    return result


def _run_rounds(context: ScenarioContext, rounds: list[tuple[Step, int]], failures: list[Anomaly]) -> None:
    """Runs every round; the first liveness failure ends the rounds (it is reported, then healed)."""
    for step, count in rounds:
        for number in range(count):
            logger.info("round %d/%d of %s", number + 1, count, step.__name__)
            try:
                step(context)
            except LivenessError as error:
                failures.append(Anomaly(error.kind, f"{step.__name__} round {number + 1}: {error}"))
                return


def _finish(
    context: ScenarioContext,
    workload: Workload,
    scenario: Scenario,
    failures: list[Anomaly],
    exactly_once: ExactlyOnce | None = None,
) -> None:
    """Heals every fault, checks writes resume, stops the load and waits for convergence (twice: after
    the producers stop, and after the groups caught up and their members left). The scenario's final
    topic configs are set once the producers stopped; the exactly-once workers finish the input then."""
    try:
        context.heal_everything()
        context.wait_healthy()
        context.wait_acks(STEADY_ACKS)
    except LivenessError as error:
        failures.append(Anomaly(error.kind, f"after healing: {error}"))
    hanging = workload.stop_producers() + _stop_probes(context)
    if hanging:
        context.notes.append(f"producers still sending when stopped (counted as unknown): {hanging}")
    if not _converge(context, failures, "nodes did not converge"):
        return
    _set_final_configs(context, scenario, failures)
    if exactly_once is not None:
        failures.extend(Anomaly("liveness", f"exactly-once: {problem}") for problem in exactly_once.finish())
    workload.settle_group_members()
    for group in workload.groups():
        started_s = time.monotonic()
        try:
            context.wait_group_caught_up(group)
        except LivenessError as error:
            failures.append(Anomaly(error.kind, str(error)))
        else:
            logger.info("group %s caught up in %.1f s", group, time.monotonic() - started_s)
    hanging = workload.stop_group_members()
    if hanging:
        context.notes.append(f"group members still running when stopped: {hanging}")
    _converge(context, failures, "nodes did not converge after the groups stopped")


def _set_final_configs(context: ScenarioContext, scenario: Scenario, failures: list[Anomaly]) -> None:
    """Sets the scenario's final topic configs (once the load is over) and waits until every node
    applied them: a time-based retention would otherwise trim the whole log while the group catches
    up and the logs are read."""
    if not scenario.final_configs:
        return
    try:
        with KqClient(context.cluster.bootstrap, tls=context.cluster.tls) as admin:
            admin.alter_topic_config(context.topic, dict(scenario.final_configs))
            index = admin.index_seen
        context.wait_applied(index, list(context.cluster.nodes))
    except (KqClientError, LivenessError) as error:
        failures.append(Anomaly("liveness", f"final topic configs not applied everywhere: {error}"))


def _converge(context: ScenarioContext, failures: list[Anomaly], what: str) -> bool:
    """Waits until every node applied what the leader committed (of every Raft group, each to its own
    index, with worker processes); whether they did."""
    try:
        leader = context.wait_healthy()
        if context.cluster.processes == 1:
            status = context.cluster.statuses().get(leader)
            target = max(status.commit_index if status else 0, context.history.index_max)
            context.wait_applied(target, list(context.cluster.nodes))
        else:
            partitions = context.group_partitions()
            for group in range(context.cluster.processes):
                statuses = context.cluster.statuses(group).values()
                committed = [status.commit_index for status in statuses if status is not None]
                acked = context.history.index_before(float("inf"), partitions.get(group, frozenset()))
                context.wait_applied(max([acked, *committed]), list(context.cluster.nodes), group=group)
    except LivenessError as error:
        failures.append(Anomaly(error.kind, f"{what}: {error}"))
    else:
        return True
    return False


def _stop_probes(context: ScenarioContext) -> list[str]:
    for probe in context.probes:
        probe.stop()
    for probe in context.probes:
        probe.join(timeout=probe.spec.retry_timeout_s + probe.spec.rpc_timeout_s)
    return [probe.name for probe in context.probes if probe.is_alive()]


def _read_and_check(
    cluster: LocalCluster,
    history: History,
    failures: list[Anomaly],
    groups: list[str],
    lifecycle: Lifecycle,
    report: ScenarioReport,
) -> CheckResult:
    """Reads every node's logs and the groups' committed offsets and checks them; failures join in."""
    addresses = {node: spec.grpc_address for node, spec in cluster.nodes.items() if cluster.running(node)}
    try:
        read = read_everything(TOPIC, addresses, tls=cluster.tls)
        # After the read: any tombstone compaction dropped before it was older than delete.retention.ms
        # by now, so the checker's expiry rule never excuses less than compaction did.
        read_wall_ms = int(time.time() * 1000)
        group_offsets = {group: read_group_offsets(group, TOPIC, addresses, cluster.tls) for group in groups}
    except KqClientError as error:
        result = CheckResult()
        result.add(Anomaly("unreadable", f"could not read every node after healing: {error}"))
    else:
        if not read.stable:
            report.notes.append(
                f"the nodes kept applying entries while read ({read.attempts} attempts): logs read in "
                "different states may show as a divergence"
            )
        lifecycle = dataclasses.replace(lifecycle, read_wall_ms=read_wall_ms)
        result = check(history, read.logs, group_offsets, lifecycle)
    for failure in failures:
        result.add(failure)
    return result


def _check_exactly_once(
    exactly_once: ExactlyOnce, result: CheckResult, report: ScenarioReport, exactly_once_dir: Path
) -> None:
    """Reads the exactly-once workers' input and output back and checks them into `result`."""
    try:
        final = exactly_once.read_final()
    except KafkaException as error:
        result.add(Anomaly("unreadable", f"exactly-once topics not read after healing: {error}"))
        return
    check_exactly_once(exactly_once.history, final, INPUT_TOPIC, result)
    if not result.ok:  # Kept with the node logs: every acknowledged commit and every offset poll.
        (exactly_once_dir / EXACTLY_ONCE_HISTORY_FILE).write_text(
            json.dumps(exactly_once.history.excerpt(), indent=1)
        )
    counts = result.counts
    others = ", ".join(
        f"{name.removeprefix('eos_')} {count}"
        for name, count in sorted(counts.items())
        if name.startswith("eos_") and name not in EXACTLY_ONCE_SUMMARY
    )
    report.notes.append(
        f"exactly-once: {counts['eos_input_records']} input records, "
        f"{counts['eos_inputs_written_once']} of them in the read_committed output exactly once; "
        f"{counts['eos_transactions_committed']} transactions committed, "
        f"{counts['eos_offset_polls']} offset polls; {others}"
    )


def _keep_or_remove(base_dir: Path, report: ScenarioReport, keep: bool) -> None:
    """Keeps node data and logs of a failed scenario (or when asked); removes them otherwise."""
    if keep or report.verdict == "FAIL":
        report.data_dir = str(base_dir)
    elif base_dir.exists():
        shutil.rmtree(base_dir, ignore_errors=True)
