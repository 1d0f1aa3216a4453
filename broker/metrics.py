"""Prometheus metrics of one node, served on its HTTP port (broker/http_endpoints.py) at `/metrics`.

Names follow Redpanda's public metrics where one fits, with `kq_` for `redpanda_` and plain label names
(`topic`, `partition`, `group`, `request`); the Raft and partition series carry `raft_group`, the Raft
group of the process that serves them (a node with worker processes has an HTTP port a group:
broker/workers.py; `0` without). Two kinds:

- **Counted as requests are served** (cheap increments on the serving paths; this node's own
  traffic): request latency histograms per API for Kafka and gRPC, records and bytes produced and
  fetched per topic. A topic's label is its name for the first METRICS_TOPICS_MAX topics this
  process counted; later ones are counted under `topic="_other"`, so the series stay bounded.
- **Read at scrape time** from committed state and from Raft (`NodeCollector`, one LMDB read
  transaction a scrape): partition start and end offsets and sizes, consumer-group committed
  offsets and lag (computed as `kq groups describe` computes it: broker/group_service.py
  `partition_lags`), Raft role, term, commit and applied index and apply lag, leadership changes,
  snapshots, the batcher's queue, the store's size and the disk's free bytes; process RSS and CPU come
  from prometheus-client's process collector. Per-partition series stop after
  METRICS_PARTITION_SERIES_MAX and per-group ones after METRICS_GROUPS_MAX;
  `kq_metrics_series_dropped` counts what a scrape left out.

The module-level metrics live in `REGISTRY`, not prometheus-client's global one: a process is one node.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from kq.broker.consensus import REMOVED_ROLE, Consensus
from kq.broker.group_service import partition_lags
from kq.broker.groups_view import GroupsView
from kq.proto import kq_pb2
from kq.proto.limits import (
    METRIC_CHILDREN_KEPT,
    METRICS_GROUPS_MAX,
    METRICS_PARTITION_SERIES_MAX,
    METRICS_TOPICS_MAX,
)
from kq.storage import Store, StoredBatch, TopicMeta

REGISTRY = CollectorRegistry(auto_describe=True)
OTHER_TOPICS = "_other"
# Latency buckets from 0.5 ms (a cached metadata read) to 10 s (a produce across an election).
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

KAFKA_REQUEST_LATENCY = Histogram(
    "kq_kafka_request_latency_seconds",
    "Time to answer one Kafka request, by API (produce, fetch, metadata, ...).",
    ["request"],
    buckets=LATENCY_BUCKETS_S,
    registry=REGISTRY,
)
GRPC_REQUEST_LATENCY = Histogram(
    "kq_grpc_request_latency_seconds",
    "Time to answer one unary gRPC call, by method (Produce, Fetch, ...).",
    ["request"],
    buckets=LATENCY_BUCKETS_S,
    registry=REGISTRY,
)
REQUEST_BYTES = Counter(
    "kq_kafka_request_bytes",
    "Record-batch bytes produced through this node (request=produce) and served by it (request=consume).",
    ["request", "topic"],
    registry=REGISTRY,
)
RECORDS_PRODUCED = Counter(
    "kq_kafka_records_produced", "Records produced through this node.", ["topic"], registry=REGISTRY
)
# Kafka requests a follower passed on to the leader over gRPC (broker/kafka/forward.py), by the gRPC
# method it called: only writes that Kafka clients send to any broker (CreateTopic, RegisterProducer,
# ...). Produce is never forwarded (clients send it to the leader Metadata names), so a produce
# series here would be a routing bug.
FORWARDED_REQUESTS = Counter(
    "kq_kafka_forwarded_requests",
    "Kafka requests this node passed on to the leader, by the gRPC method called there.",
    ["request"],
    registry=REGISTRY,
)
# Idempotent producer windows (one producer on one partition) the producer id expiry sweeps this
# node proposed as its group's leader deleted (broker/producer_expiry.py): every replica deletes
# the same ones, counted once, where proposed.
PRODUCER_WINDOWS_EXPIRED = Counter(
    "kq_producer_windows_expired",
    "Idle producer windows (producer.id.expiration.ms) deleted by the sweeps this node proposed.",
    registry=REGISTRY,
)
RECORDS_FETCHED = Counter(
    "kq_kafka_records_fetched", "Records served by this node's fetches.", ["topic"], registry=REGISTRY
)
# Corrupt batches put back from another replica (broker/repair.py).
CORRUPT_BATCHES_REPAIRED = Counter(
    "kq_corrupt_batches_repaired",
    "Corrupt stored batches this node put back from another replica's copy.",
    registry=REGISTRY,
)
# Stored bytes the scrubber checked (broker/repair.py).
SCRUBBED_BYTES = Counter(
    "kq_scrubbed_bytes", "Stored batch bytes the scrubber checked (their CRC32C).", registry=REGISTRY
)
# Stored batches a read found failing their checksum (broker/corruption.py), each counted once.
CORRUPT_BATCHES_FOUND = Counter(
    "kq_corrupt_batches_found",
    "Stored batches this node found corrupt (each counted once).",
    registry=REGISTRY,
)


class TopicLabels:
    """The label value of a topic: its name for the first `topics_max` names seen, then OTHER_TOPICS."""

    def __init__(self, topics_max: int) -> None:
        self._topics_max = topics_max
        self._named: set[str] = set()
        self._lock = threading.Lock()  # Serving threads and the serving loop count concurrently.

    def __call__(self, topic: str) -> str:
        if topic in self._named:
            return topic
        with self._lock:
            if len(self._named) < self._topics_max:
                self._named.add(topic)
                return topic
        return OTHER_TOPICS


topic_label = TopicLabels(METRICS_TOPICS_MAX)


@functools.lru_cache(maxsize=METRIC_CHILDREN_KEPT)
def child(metric: Any, *labels: str) -> Any:
    """`metric.labels(*labels)`, found once: prometheus_client's `labels()` takes a lock and builds
    its key at every call (~2 µs, three for each produce request). Every label value here comes from
    a bounded set (`topic_label`, request and method names), and kq removes no child."""
    return metric.labels(*labels)


def count_produced(topic: str, records: int, batch_bytes: int) -> None:
    """One committed produce request's batch (gRPC or Kafka)."""
    label = topic_label(topic)
    child(RECORDS_PRODUCED, label).inc(records)
    child(REQUEST_BYTES, "produce", label).inc(batch_bytes)


def count_fetched(topic: str, batches: Iterable[StoredBatch]) -> None:
    """Batches one fetch served (gRPC or Kafka)."""
    records = 0
    size = 0
    for batch in batches:
        records += batch.record_count
        size += len(batch.data)
    if records:
        label = topic_label(topic)
        child(RECORDS_FETCHED, label).inc(records)
        child(REQUEST_BYTES, "consume", label).inc(size)


@dataclass
class LeadershipWatch:
    """Counts the changes of the leader this node knows of: fed by the node's health poll (main
    thread), read by scrapes."""

    leader_id: str = ""
    changes: int = 0

    def observe(self, leader_id: str) -> None:
        if leader_id and leader_id != self.leader_id:
            if self.leader_id:
                self.changes += 1
            self.leader_id = leader_id


@dataclass(frozen=True, slots=True)
class SnapshotCounts:
    """What raft/snapshot.py reports of the snapshots this process wrote."""

    written: int
    seconds_total: float


class NodeCollector(Collector):
    """The series read at scrape time (the module docstring lists them)."""

    def __init__(
        self,
        node_id: str,
        store: Store,
        consensus: Consensus,
        leadership: LeadershipWatch,
        snapshots: Callable[[], SnapshotCounts],
        queue_depth: Callable[[], int],
        groups: GroupsView | None = None,
    ) -> None:
        # With worker processes: this process reports its own group's partitions, and lags from the
        # node's replica of each partition's group (broker/groups_view.py).
        self._groups = groups
        # `raft_group` label of the Raft and partition series: this process's group (0 without workers).
        self._raft_group = str(groups.group) if groups is not None else "0"
        self._node_id = node_id
        self._store = store
        self._consensus = consensus
        self._leadership = leadership
        self._snapshots = snapshots
        self._queue_depth = queue_depth

    def collect(self) -> Iterator[Any]:
        """Every scrape-time family; one read transaction for the store's part."""
        dropped = [0]
        yield from self._raft()
        yield from self._store_families(dropped)
        usage = self._store.usage()
        yield _gauge(
            "kq_storage_lmdb_used_bytes", "Bytes of the pages the store's databases use.", usage.used_bytes
        )
        yield _gauge("kq_storage_lmdb_file_bytes", "Size of the store's data.mdb file.", usage.file_bytes)
        yield _gauge("kq_storage_lmdb_map_bytes", "The store's bound (--max-disk-bytes).", usage.map_bytes)
        yield _gauge(
            "kq_storage_disk_free_bytes",
            "Free bytes of the data directory's filesystem.",
            usage.filesystem_free_bytes,
        )
        yield _gauge("kq_metrics_series_dropped", "Series this scrape left out (limits).", dropped[0])

    def _raft(self) -> Iterator[Any]:
        status = self._consensus.status()
        role = GaugeMetricFamily(
            "kq_raft_role", "1 for this node's Raft role.", labels=["role", "raft_group"]
        )
        for name in ("follower", "candidate", "leader", REMOVED_ROLE):
            role.add_metric([name, self._raft_group], 1.0 if status.role == name else 0.0)
        yield role
        yield self._group_gauge("kq_raft_term", "This node's Raft term.", status.term)
        yield self._group_gauge(
            "kq_raft_commit_index", "The Raft commit index this node knows.", status.commit_index
        )
        yield self._group_gauge(
            "kq_raft_applied_index", "The Raft index this node's store applied.", status.applied_index
        )
        yield self._group_gauge(
            "kq_raft_apply_lag",
            "Committed entries this node has not applied yet.",
            max(0, status.commit_index - status.applied_index),
        )
        yield self._group_gauge(
            "kq_raft_log_entries", "Entries in this node's Raft log (until compaction).", status.log_entries
        )
        yield self._group_gauge(
            "kq_raft_leader_known", "1 when this node knows a leader.", 1 if status.leader_id else 0
        )
        yield self._group_counter(
            "kq_raft_leadership_changes", "Changes of the leader this node saw.", self._leadership.changes
        )
        snapshots = self._snapshots()
        yield self._group_counter(
            "kq_raft_snapshots", "Snapshots (log compactions) this node wrote.", snapshots.written
        )
        yield self._group_counter(
            "kq_raft_snapshot_duration_seconds",
            "Time spent writing those snapshots.",
            snapshots.seconds_total,
        )
        yield self._group_gauge(
            "kq_raft_proposal_queue_depth", "Requests waiting in the batcher's queue.", self._queue_depth()
        )

    def _store_families(self, dropped: list[int]) -> Iterator[Any]:
        labels = ["topic", "partition", "raft_group"]
        start = GaugeMetricFamily("kq_kafka_start_offset", "A partition's log start offset.", labels=labels)
        end = GaugeMetricFamily(
            "kq_kafka_max_offset", "A partition's log end offset (high watermark).", labels=labels
        )
        size = GaugeMetricFamily("kq_kafka_partition_size_bytes", "Bytes a partition stores.", labels=labels)
        group_labels = ["group", "topic", "partition"]
        committed = GaugeMetricFamily(
            "kq_kafka_consumer_group_committed_offset", "A group's committed offset.", labels=group_labels
        )
        lag_max = GaugeMetricFamily(
            "kq_kafka_consumer_group_lag_max", "A group's largest partition lag.", labels=["group"]
        )
        lag_sum = GaugeMetricFamily(
            "kq_kafka_consumer_group_lag_sum", "A group's total lag.", labels=["group"]
        )
        members = GaugeMetricFamily(
            "kq_kafka_consumer_group_consumers", "A group's members.", labels=["group"]
        )
        series = 0
        with self._store.read() as reader:
            topics = reader.topics()
            for topic in topics:
                for partition in range(topic.partitions):
                    state = reader.partition(topic.topic_id, partition)
                    if state is None or not self._owns(topic, partition):
                        continue
                    if series >= METRICS_PARTITION_SERIES_MAX:
                        dropped[0] += 3
                        continue
                    series += 1
                    key = [topic.name, str(partition), self._raft_group]
                    start.add_metric(key, state.log_start_offset)
                    end.add_metric(key, state.log_end_offset)
                    size.add_metric(key, state.size_bytes)
            for index, (name, raw) in enumerate(reader.groups()):
                if index >= METRICS_GROUPS_MAX:
                    dropped[0] += 3
                    continue
                group = kq_pb2.GroupState()
                group.ParseFromString(raw)
                lags = partition_lags(reader, group, self._groups.partition_states if self._groups else None)
                for lag in lags:
                    if lag.has_committed:
                        committed.add_metric([name, lag.topic, str(lag.partition)], lag.committed_offset)
                lag_max.add_metric([name], max((lag.lag for lag in lags), default=0))
                lag_sum.add_metric([name], sum(lag.lag for lag in lags))
                members.add_metric([name], len(group.members))
        yield from (start, end, size, committed, lag_max, lag_sum, members)

    def _group_gauge(self, name: str, documentation: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, documentation, labels=["raft_group"])
        family.add_metric([self._raft_group], value)
        return family

    def _group_counter(self, name: str, documentation: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, documentation, labels=["raft_group"])
        family.add_metric([self._raft_group], value)
        return family

    def _owns(self, topic: TopicMeta, partition: int) -> bool:
        """Whether this process's group holds the partition (its copy of the others' is empty)."""
        return self._groups is None or self._groups.group_of(topic, partition) == self._groups.group


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


def register_node(collector: NodeCollector) -> None:
    """Adds the node's scrape-time collector and the process collector (RSS, CPU, open files)."""
    REGISTRY.register(collector)
    ProcessCollector(namespace="kq", registry=REGISTRY)


def observe_latency(histogram: Histogram, request: str, started_s: float) -> None:
    """One answered request, timed from `started_s` (time.monotonic())."""
    child(histogram, request).observe(time.monotonic() - started_s)
