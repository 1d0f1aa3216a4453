"""Runs a benchmark: starts three real nodes, runs every scenario `runs` times, measures the nodes.

One cluster serves the whole invocation, so the memory report at the end reflects everything
written: node memory should be bounded by the Raft log compaction settings, not by data volume.
Runs are the outer loop (run 1 of every scenario, then run 2, ...) so slow drift in the machine
spreads over all scenarios instead of biasing one. The nodes are always stopped, by PID, in `finally`.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kq.bench import procfs
from kq.bench.produce_fetch import (
    LatencySample,
    ThroughputSample,
    fetch_throughput,
    produce_latency,
    produce_throughput,
)
from kq.bench.settings import (
    FETCH_BYTES_PER_REQUEST,
    LATENCY_TOPIC,
    THROUGHPUT_TOPIC,
    BenchSettings,
    Scenario,
    ScenarioKind,
)
from kq.client import KqClient, KqClientError
from kq.deploy.cluster import LocalCluster, work_dir

logger = logging.getLogger(__name__)

Sample = ThroughputSample | LatencySample


def run_benchmark(settings: BenchSettings) -> dict[str, Any]:
    """Runs every scenario of `settings` and returns the raw measurements (see `report.summarize`)."""
    with (
        work_dir(settings.base_dir, "kq-bench-") as base_dir,
        LocalCluster(base_dir, node_args=settings.all_node_args()) as cluster,
    ):
        return _run_on(cluster, settings)


def _run_on(cluster: LocalCluster, settings: BenchSettings) -> dict[str, Any]:
    pids = cluster.pids()
    with KqClient(cluster.bootstrap) as admin, procfs.PeakAnonSampler(pids) as peaks:
        admin.create_topic(THROUGHPUT_TOPIC, settings.partitions)
        admin.create_topic(LATENCY_TOPIC, 1)
        runs: list[dict[str, Any]] = []
        timeline: list[dict[str, Any]] = []
        for run in range(1, settings.runs + 1):
            for scenario in settings.scenarios:
                logger.info("run %d/%d: %s", run, settings.runs, scenario.name)
                runs.append(_measured_run(cluster, pids, scenario, run, settings))
                timeline.append(_memory_point(cluster, pids, admin, f"{scenario.name} (run {run})"))
        return {
            "pids": pids,
            "runs": runs,
            "memory_timeline": timeline,
            "final": _final_state(cluster, pids, admin, settings, peaks.peak_anon_kib),
        }


def _measured_run(
    cluster: LocalCluster, pids: dict[str, int], scenario: Scenario, run: int, settings: BenchSettings
) -> dict[str, Any]:
    """One run of one scenario with the nodes' and the client's CPU seconds around it."""
    leader = cluster.leader_id()
    server_before, client_before = procfs.cpu_seconds_each(pids), procfs.own_cpu_seconds()
    host_before = procfs.host_cpu()
    sample, served_by = _run_scenario(cluster, scenario, settings, leader)
    host_after = procfs.host_cpu()
    server_after, client_after = procfs.cpu_seconds_each(pids), procfs.own_cpu_seconds()
    return {
        "scenario": scenario.name,
        "run": run,
        "leader": leader,
        "served_by": served_by,
        "sample": asdict(sample),
        "server_cpu_s": {node: server_after[node] - server_before[node] for node in pids},
        "client_cpu_s": client_after - client_before,
        # Near 1.0 means the machine, not the cluster's concurrency, limited this run.
        "host_cpu_busy": host_after.busy_fraction_since(host_before),
    }


def _run_scenario(
    cluster: LocalCluster, scenario: Scenario, settings: BenchSettings, leader: str | None
) -> tuple[Sample, str | None]:
    value = b"v" * settings.value_bytes
    cap_s = settings.scenario_time_cap_s
    if scenario.kind is ScenarioKind.PRODUCE:
        sample: Sample = produce_throughput(
            cluster.bootstrap,
            THROUGHPUT_TOPIC,
            settings.partitions,
            scenario.threads,
            scenario.records_per_request,
            scenario.records_max,
            value,
            scenario.warmup_requests,
            cap_s,
        )
        return sample, leader
    if scenario.kind is ScenarioKind.FETCH:
        follower = next(node for node in sorted(cluster.nodes) if node != leader)
        sample = fetch_throughput(
            cluster.bootstrap,
            cluster.nodes[follower].grpc_address,
            THROUGHPUT_TOPIC,
            scenario.records_per_request,
            FETCH_BYTES_PER_REQUEST,
            scenario.records_max,
            cap_s,
        )
        return sample, follower
    sample = produce_latency(
        cluster.bootstrap, LATENCY_TOPIC, scenario.records_max, value, scenario.warmup_requests, cap_s
    )
    return sample, leader


def _records_written(admin: KqClient) -> tuple[int, int]:
    """Records and stored bytes in all benchmark topics, as the node the client asks sees them."""
    records = stored_bytes = 0
    for topic in (THROUGHPUT_TOPIC, LATENCY_TOPIC):
        for offsets in admin.list_offsets(topic).values():
            records += offsets.log_end_offset - offsets.log_start_offset
            stored_bytes += offsets.size_bytes
    return records, stored_bytes


def _raft_log_entries(cluster: LocalCluster, admin: KqClient) -> dict[str, int | None]:
    entries: dict[str, int | None] = {}
    for node_id, spec in cluster.nodes.items():
        try:
            entries[node_id] = admin.node_status(spec.grpc_address).raft_log_entries
        except KqClientError:
            entries[node_id] = None
    return entries


def _memory_point(cluster: LocalCluster, pids: dict[str, int], admin: KqClient, label: str) -> dict[str, Any]:
    """Each node's RSS and Raft log length next to the data written so far."""
    records, stored_bytes = _records_written(admin)
    samples = {node: procfs.memory(pid) for node, pid in pids.items()}
    return {
        "after": label,
        "records_written": records,
        "stored_bytes": stored_bytes,
        "rss_kib": {node: sample.rss_kib for node, sample in samples.items()},
        "anon_kib": {node: sample.anon_kib for node, sample in samples.items()},
        "raft_log_entries": _raft_log_entries(cluster, admin),
    }


def _final_state(
    cluster: LocalCluster,
    pids: dict[str, int],
    admin: KqClient,
    settings: BenchSettings,
    peak_anon_kib: dict[str, int],
) -> dict[str, Any]:
    """Memory, Raft log length and disk use of each node once every run is over."""
    records, stored_bytes = _records_written(admin)
    statuses = cluster.statuses()
    entries = _raft_log_entries(cluster, admin)
    nodes: dict[str, Any] = {}
    for node_id, pid in pids.items():
        status = statuses.get(node_id)
        sample = procfs.memory(pid)
        nodes[node_id] = {
            "pid": pid,
            "role": status.role if status is not None else "unknown",
            "rss_kib": sample.rss_kib,
            "peak_rss_kib": sample.peak_rss_kib,
            "anon_kib": sample.anon_kib,
            "file_kib": sample.file_kib,
            "peak_anon_kib": max(peak_anon_kib[node_id], sample.anon_kib),
            "raft_log_entries": entries[node_id],
            "applied_index": status.applied_index if status is not None else None,
            "data_dir_bytes": _disk_bytes(cluster.nodes[node_id].data_dir),
        }
    return {
        "measured_at": time.time(),
        "records_written": records,
        "payload_bytes_written": records * settings.value_bytes,
        "stored_bytes": stored_bytes,
        "compaction_min_entries": settings.compaction_min_entries,
        "nodes": nodes,
    }


def _disk_bytes(directory: Path) -> int:
    """Bytes allocated on disk under `directory` (sparse LMDB files count only what they use)."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                continue  # Replaced by a snapshot while we walked.
    return total
