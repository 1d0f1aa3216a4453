"""`kq-node`: one cluster member. Configuration from flags, `KQ_*` environment variables or a TOML file.

Precedence: flag > environment > config file > default. `BrokerNode` wires storage, Raft, the
batcher, the group coordinator and gRPC; `run_node` starts it, waits for SIGTERM or SIGINT on the
main thread, and stops it. DESIGN.md ("Concurrency model") names every thread and the stop order.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import resource
import signal
import sys
import threading
import tomllib
from pathlib import Path
from typing import Any

import click

from kq.broker.admission import ReaderAdmission, ReaderLimits
from kq.broker.auth import Security
from kq.broker.compactor import Compactor
from kq.broker.config import (
    KAFKA_SASL_MECHANISMS,
    ConfigError,
    KafkaConfig,
    NodeConfig,
    ServerTls,
    parse_address,
    parse_byte_size,
    parse_node_id,
    parse_peers,
    parse_rack,
    parse_sasl_mechanisms,
)
from kq.broker.consensus import PySyncObjConsensus
from kq.broker.corruption import CORRUPTION
from kq.broker.front import FrontEnd, FrontEndError, Listener, Registration
from kq.broker.group_membership import ClusterChanges, group_call
from kq.broker.groups import GroupCoordinator
from kq.broker.groups_view import GroupsView, LeaderBoard, LocalStores
from kq.broker.http_endpoints import HttpEndpoints, readiness
from kq.broker.kafka.apis import KafkaApis
from kq.broker.kafka.listener import KafkaListener
from kq.broker.kafka.settings import check_kafka_members, kafka_settings
from kq.broker.leader_balance import LeaderBalancer, WorkerLeadership
from kq.broker.logs import LOG_FORMATS, LogFormat, configure_logging
from kq.broker.membership import Membership, MembershipChanges, probe_node
from kq.broker.metrics import LeadershipWatch, NodeCollector, SnapshotCounts, register_node
from kq.broker.producer_expiry import ProducerExpiry
from kq.broker.proposals import Batcher, wall_clock_ms
from kq.broker.repair import BatchRepairer
from kq.broker.retention import Retention
from kq.broker.service import BrokerService
from kq.broker.storage_guard import StorageGuard
from kq.broker.topic_sync import TopicSync
from kq.broker.txn_coordinator import TransactionCoordinator
from kq.broker.waiters import AppliedNotifier
from kq.broker.workers import (
    AUTO_PROCESSES,
    Supervisor,
    check_processes,
    die_with_parent,
    leader_board,
    node_data_dir,
    record_processes,
    resolve_processes,
    worker_config,
)
from kq.client.tls import TlsConfig, TlsConfigError, is_loopback
from kq.proto import (
    arrays,  # noqa: F401 - numpy loaded at start, not by the first large batch in apply.
    kq_pb2_grpc,
)
from kq.proto.limits import (
    COMPACTION_CHECK_S_DEFAULT,
    CONSUMER_HEARTBEAT_INTERVAL_MS,
    CONSUMER_HEARTBEAT_INTERVAL_MS_MIN,
    CONSUMER_SESSION_TIMEOUT_MS,
    GIL_SWITCH_INTERVAL_S,
    GRPC_WORKERS_DEFAULT,
    GRPC_WORKERS_MAX,
    GRPC_WORKERS_MIN,
    HEALTH_POLL_S,
    KAFKA_DEFAULT_PARTITIONS,
    KAFKA_FRAME_BYTES_DEFAULT,
    KAFKA_FRAME_BYTES_MIN,
    PARTITIONS_MAX,
    PROCESSES_AUTO_MAX,
    PROCESSES_MAX,
    PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS_DEFAULT,
    PRODUCER_ID_EXPIRATION_MS_DEFAULT,
    READERS_MAX,
    READERS_PER_CONNECTION_MAX,
    RETENTION_CHECK_S_DEFAULT,
    SCRUB_BYTES_PER_S_DEFAULT,
    SCRUB_BYTES_PER_S_MAX,
    SESSION_TIMEOUT_MS_MAX,
    SESSION_TIMEOUT_MS_MIN,
    TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT,
)
from kq.raft.auth import EVERYONE, principal_problem
from kq.raft.data_dir import open_data_dir
from kq.raft.node import DURABILITY_MODES, Durability, RaftBindError, RaftConfig, RaftNode
from kq.raft.results import ApplyResult
from kq.raft.topic_config import defaults_problem, parse_assignments
from kq.raft.transport import RaftTls
from kq.storage import FormatError
from kq.storage.store import MAP_SIZE_BYTES_DEFAULT

logger = logging.getLogger("kq.node")


class BrokerNode:
    """One node's parts, built without starting a thread; `start()` and `stop()` run them in order.

    Start: the serving loop with the Raft node ticking on it, the batcher, the group coordinator,
    then the gRPC server and Kafka listener on the loop (so no request arrives before what serves it
    runs). Stop, the reverse: the front end (NOT_SERVING, new calls refused, running ones cancelled
    after SHUTDOWN_GRACE_S, its pools joined: every handler has returned), the batcher (after
    proposing what was queued), the coordinator, the Raft node (no more ticks, then its sockets,
    journal and any store copy closed on the loop), the loop (ended and joined), and last the store,
    which no thread touches any more.
    """

    def __init__(self, config: NodeConfig) -> None:
        assert config.raft is not None
        # --max-disk-bytes is the LMDB map: the store can never grow past it (README, "Disk bounds").
        map_bytes = config.max_disk_bytes or MAP_SIZE_BYTES_DEFAULT
        try:  # A format of a newer kq, or not kq's: one line, nothing written (DESIGN.md, "On-disk formats").
            self.store = open_data_dir(config.data_dir, map_bytes, sync=config.raft.synced)
        except FormatError as error:
            raise SystemExit(str(error)) from error
        self._raft_on_loop = not config.raft.synced  # See start().
        self.notifier = AppliedNotifier(self.store.applied_index())
        try:
            self.raft = RaftNode(config.raft, self.store, self._on_applied)
        except RaftBindError as error:
            self.store.close()
            raise SystemExit(str(error)) from error
        self.membership = Membership(
            config.self_peer, config.peers, self.store, self.raft.voters, config.group
        )
        self.security = Security(self.store, config.auth, config.super_users, config.secret, wall_clock_ms)
        self.raft.on_voters_changed(self.membership.refresh)
        self.consensus = PySyncObjConsensus(self.raft, self.membership)
        # With worker processes (broker/workers.py): this process is group `config.group` of
        # `config.processes`; it learns the other groups' leaders from the node's leader board.
        node_dir = node_data_dir(config)
        self.board = LeaderBoard(leader_board(node_dir), config.processes) if config.processes > 1 else None
        stores = LocalStores(node_dir, map_bytes) if config.processes > 1 else None
        self.groups = GroupsView(
            config.group,
            config.processes,
            lambda: self.membership.view,
            self.consensus.status,
            self.board,
            stores,
        )
        # A group other than 0 keeps a copy of group 0's topics (broker/topic_sync.py).
        self.topic_sync = (
            TopicSync(self.store, self.consensus, node_dir / "store", map_bytes) if config.group else None
        )
        # With worker processes, leaders are spread over the nodes (broker/leader_balance.py).
        self.balancer = (
            LeaderBalancer(
                config.node_id, WorkerLeadership(self.groups, self.raft, lambda: self.membership.view)
            )
            if config.processes > 1
            else None
        )
        self.batcher = Batcher(self.consensus, wall_clock_ms, self.consensus.term)
        self.coordinator = GroupCoordinator(self.store, self.consensus, wall_clock_ms)
        self.transactions = TransactionCoordinator(
            self.store, self.consensus, self.groups, config.peer_credentials, config.node_metadata
        )
        self._make_housekeepers(config)
        self.readers = ReaderAdmission(ReaderLimits(config.max_readers, config.max_readers_per_connection))
        services: list[Registration] = []
        listeners: list[Listener] = []
        credentials = config.tls.server_credentials() if config.tls is not None else None
        self.front = FrontEnd(
            config.grpc_address,
            config.grpc_workers,
            self.notifier,
            services,
            listeners,
            credentials,
            self.security,
        )
        # Asks a node's process for its status, as a node (its TLS and proof): membership changes.
        probe = functools.partial(
            probe_node, credentials=config.peer_credentials, metadata=config.node_metadata
        )
        service = BrokerService(
            config.self_peer,
            self.membership,
            self.store,
            self.consensus,
            self.batcher,
            self.notifier,
            self.coordinator,
            self.readers,
            self.front.workers,
            self.front.reads,
            config.topic_defaults,
            StorageGuard(self.store.usage, config.node_id),
            ClusterChanges(
                MembershipChanges(
                    self.raft,
                    self.consensus,
                    self.membership,
                    kafka=config.kafka is not None,
                    probe=probe,
                    groups=config.processes,
                ),
                self.groups,
                group_call(config.peer_credentials, config.node_metadata) if config.processes > 1 else None,
                probe,
            ),
            self.security,
            self.groups,
        )
        service.transaction_finisher = self.transactions.finisher
        services.append(lambda server: kq_pb2_grpc.add_BrokerServicer_to_server(service, server))
        if config.kafka is not None:
            apis = KafkaApis(service, kafka_settings(config, config.kafka, lambda: self.membership.view))
            apis.balancer = (
                self.balancer
            )  # ElectLeaders' preferred elections (broker/kafka/cluster_admin.py).
            listeners.append(
                KafkaListener(
                    config.kafka.address,
                    apis.answer,
                    config.kafka.frame_bytes_max,
                    apis.close,
                    (
                        config.tls.ssl_context(sasl=bool(config.kafka.sasl_mechanisms))
                        if config.kafka.tls and config.tls is not None
                        else None
                    ),
                    apis.connected,
                )
            )
        self.grpc_port = 0  # Bound by start().
        self.leadership = LeadershipWatch()  # The main thread's health poll feeds it; scrapes read it.
        self.http: HttpEndpoints | None = None
        if config.http_address:
            host, _, port = config.http_address.rpartition(":")
            self.http = HttpEndpoints((host, int(port)), self.consensus.status)
            register_node(
                NodeCollector(
                    config.node_id,
                    self.store,
                    self.consensus,
                    self.leadership,
                    lambda: SnapshotCounts(*self.raft.snapshots_written()),
                    self.batcher.queue_depth,
                    self.groups,
                )
            )
        self.http_port = 0  # Bound by start() when there is an HTTP address.

    def _on_applied(self, index: int, result: ApplyResult | None) -> None:
        """Each applied entry (tick thread): wakes its waiters; a member command refreshes the view. A
        security entry rebuilds this node's security view first, so a waiter woken by its index (a
        Kafka ACL change forwarded to the leader: broker/kafka/acls.py) reads the new view."""
        self.security.on_applied(result)
        self.notifier.notify(index, result)
        self.membership.on_applied(result)

    def _make_housekeepers(self, config: NodeConfig) -> None:
        """The leader's periodic proposers (retention, compaction, producer expiry) and this node's
        repairer of corrupt batches; each starts in `start()`."""
        self.retention = Retention(
            self.store, self.consensus, wall_clock_ms, config.topic_defaults, config.retention_check_s
        )
        self.compactor = Compactor(
            self.store, self.consensus, wall_clock_ms, config.topic_defaults, config.compaction_check_s
        )
        # Corrupt batches a read meets are put back from another replica (broker/repair.py).
        self.repairer = BatchRepairer(
            self.store,
            CORRUPTION,
            self._repair_sources,
            self.raft.call_on_tick,
            config.peer_credentials,
            config.node_metadata,
            config.scrub_bytes_per_s,
        )
        self.producer_expiry = ProducerExpiry(
            self.store,
            self.consensus,
            wall_clock_ms,
            config.producer_id_expiration_ms,
            config.producer_id_expiration_check_s,
            config.transactional_id_expiration_ms if config.group == 0 else None,  # The coordinators' group.
        )

    def _repair_sources(self) -> list[str]:
        """The gRPC addresses of this group's other replicas, its leader first (broker/repair.py)."""
        view = self.membership.view
        others = [peer.grpc_address for peer in view.peers if peer.grpc_address]
        leader = self.consensus.leader_grpc_address()
        if leader in others:
            others.remove(leader)
            others.insert(0, leader)
        return others

    def start(self) -> None:
        """Starts every thread of the node (the threads table of DESIGN.md); SystemExit if the gRPC
        address cannot be bound (after stopping what had started)."""
        # Raft ticks on the serving loop (raft/loop_poller.py): the loop runs before anything proposes.
        # With --durability=fsync on its own thread: a journal sync (milliseconds on a disk) and the
        # store's synced commits would hold every call the loop serves (DESIGN.md).
        loop = self.front.start_loop()
        if self._raft_on_loop:
            self.raft.start_on_loop(loop)
        else:
            self.raft.start()
        self.batcher.start()
        self.coordinator.start()
        self.transactions.driver.start()
        self.retention.start()
        self.compactor.start()
        CORRUPTION.on_found = self.repairer.submit
        self.repairer.start()
        self.producer_expiry.start()
        if self.topic_sync is not None:
            self.topic_sync.start()
        if self.balancer is not None:
            self.balancer.start()
        try:
            self.grpc_port = self.front.start()
        except FrontEndError as error:
            self._stop_behind_front()
            raise SystemExit(str(error)) from error
        if self.http is not None:
            try:
                self.http_port = self.http.start()
            except OSError as error:
                self.stop()
                raise SystemExit(f"cannot serve HTTP (--http-address): {error}") from error

    def update_health(self) -> None:
        """SERVING when /readyz would answer ready (broker/http_endpoints.py `readiness`); NOT_SERVING
        otherwise. Also counts leadership changes for the metrics."""
        status = self.consensus.status()
        self.leadership.observe(status.leader_id)
        self.front.set_serving(readiness(status).ready)
        if self.board is not None:  # The other workers of this node learn this group's leader here.
            self.board.publish(self.groups.group, status.leader_id, status.term)

    def stop(self) -> None:
        """Stops every thread, in the order of the class docstring, then closes the store."""
        if self.http is not None:
            self.http.stop()
        self.front.stop()
        self._stop_behind_front()

    def _stop_behind_front(self) -> None:
        self.batcher.stop()
        self.retention.stop()
        self.compactor.stop()
        self.producer_expiry.stop()
        if self.topic_sync is not None:
            self.topic_sync.stop()
        if self.balancer is not None:
            self.balancer.stop()
        self.coordinator.stop()
        self.transactions.stop()
        self.repairer.stop()
        self.raft.close()
        self.front.close_loop()
        self.groups.close()
        self.store.close()


def _server_tls(
    cert: str | None, key: str | None, ca: str | None, require_client_cert: bool
) -> ServerTls | None:
    """The gRPC TLS the flags ask for (none of them: plain text); ConfigError for half a setup."""
    if cert is None and key is None and ca is None:
        if require_client_cert:
            raise ConfigError("--tls-require-client-cert needs --tls-cert, --tls-key and --tls-ca")
        return None
    if cert is None or key is None or ca is None:
        raise ConfigError("TLS needs all of --tls-cert, --tls-key and --tls-ca")
    try:
        files = TlsConfig.from_files(ca, cert, key)
    except TlsConfigError as error:
        raise ConfigError(str(error)) from error
    assert files.cert is not None and files.key is not None
    return ServerTls(files.cert, files.key, files.ca, require_client_cert, (Path(cert), Path(key), Path(ca)))


def _refuse_exposed_plain_text(
    grpc_address: str, kafka_address: str, grpc_tls: bool, raft_address: str
) -> None:
    """Plain text only on loopback, unless --insecure: ConfigError for an exposed plain-text port. The
    Raft port speaks TLS whenever the node has a certificate (raft/transport.py); without one its
    traffic is authenticated by --secret but not encrypted."""
    if not grpc_tls and not is_loopback(raft_address):
        raise ConfigError(
            f"--raft-address {raft_address} is not a loopback address: without TLS, Raft traffic is "
            "authenticated by --secret but not encrypted; give the node --tls-cert, --tls-key and "
            "--tls-ca, or pass --insecure to accept plain text"
        )
    if not grpc_tls and not is_loopback(grpc_address):
        raise ConfigError(
            f"--grpc-address {grpc_address} is not a loopback address: serve gRPC over TLS (--tls-cert, "
            "--tls-key, --tls-ca) or pass --insecure to accept plain text"
        )
    if kafka_address and not is_loopback(kafka_address):
        raise ConfigError(
            f"--kafka-address {kafka_address} is not a loopback address: serve Kafka over TLS (--kafka-tls) "
            "or pass --insecure to accept plain text"
        )


def raise_open_files_limit() -> int:
    """Raises this process's open-file soft limit to its hard limit; the limit now in force.

    Every client connection is a file: at a shell's usual 1,024 a node stops accepting connections
    (health probes included) after about a thousand clients (bench/README.md, "Many idle
    connections"), while the hard limit (20,000 here; 65,536 under the systemd unit) allows far more.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if resource.RLIM_INFINITY in (hard, soft) or soft >= hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as error:  # A container may refuse: keep the soft limit, say so.
        logger.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, error)
        return soft
    return hard


def run_node(config: NodeConfig, log_level: str, log_format: LogFormat = "auto") -> None:
    """Runs the node until SIGTERM or SIGINT; the main thread handles signals and the health status."""
    # The Raft tick thread gives up the GIL at every socket call, and then waited up to Python's 5 ms
    # for a busy thread to be asked to hand it back (GIL_SWITCH_INTERVAL_S).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    label = config.node_id if config.processes == 1 else f"{config.node_id}/{config.group}"
    configure_logging(label, log_level, log_format)
    stopping = threading.Event()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signal_number, lambda *_: stopping.set())
    open_files = raise_open_files_limit()
    node = BrokerNode(config)
    node.start()
    limits = node.readers.limits
    logger.info(
        "serving gRPC on %s (%d workers; at most %d waiting readers, %d per client connection; "
        "%d open files), Raft on %s",
        config.grpc_address,
        config.grpc_workers,
        limits.readers_max,
        limits.peer_readers_max,
        open_files,
        config.raft_address,
    )
    if config.kafka is not None:
        kafka_id = node.groups.broker_id(config.node_id, config.group)  # Integer ids with Kafka.
        logger.info("serving Kafka on %s (broker id %s)", config.kafka.address, kafka_id)
    if node.http is not None:
        logger.info("serving /metrics, /healthz and /readyz on %s", config.http_address)
    try:
        while not stopping.wait(HEALTH_POLL_S):
            node.update_health()
    finally:
        logger.info("stopping")
        node.stop()


def _load_config_file(context: click.Context, parameter: click.Parameter, value: str | None) -> str | None:
    """Loads a TOML file into click's default map, under flags and environment variables."""
    if value:
        try:
            with open(value, "rb") as source:
                table: dict[str, Any] = tomllib.load(source)
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise click.BadParameter(str(error)) from error
        context.default_map = {key.replace("-", "_"): item for key, item in table.items()}
    return value


@click.command(context_settings={"auto_envvar_prefix": "KQ", "show_default": True})
@click.option(
    "--config",
    type=click.Path(exists=True, dir_okay=False),
    callback=_load_config_file,
    is_eager=True,
    expose_value=False,
    help="TOML file with any of these options (KQ_CONFIG).",
)
@click.option("--node-id", required=True, help="This node's id, as in --peers (KQ_NODE_ID).")
@click.option("--grpc-address", required=True, help="host:port the gRPC service binds (KQ_GRPC_ADDRESS).")
@click.option("--raft-address", required=True, help="host:port Raft binds; peers dial it (KQ_RAFT_ADDRESS).")
@click.option(
    "--peers",
    required=True,
    help=(
        "Cluster members as id=raft_host:port=grpc_host:port[=kafka_host:port][@rack], comma-separated "
        "(KQ_PEERS)."
    ),
)
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for LMDB and the Raft journal (KQ_DATA_DIR).",
)
@click.option("--secret", required=True, help="Shared Raft password of the cluster (KQ_SECRET).")
@click.option("--election-timeout-min-ms", default=500, type=click.IntRange(50, 60_000))
@click.option("--election-timeout-max-ms", default=1000, type=click.IntRange(100, 120_000))
@click.option("--heartbeat-ms", default=50, type=click.IntRange(10, 10_000))
@click.option(
    "--leader-fallback-ms",
    default=2000,
    type=click.IntRange(100, 120_000),
    help="A leader that hears from no majority for this long steps down.",
)
@click.option(
    "--compaction-min-entries",
    default=5000,
    type=click.IntRange(10, 10_000_000),
    help="Raft log entries kept in RAM before a snapshot compacts them.",
)
@click.option("--compaction-min-time-s", default=300, type=click.IntRange(1, 86_400))
@click.option(
    "--compaction-log-mib",
    default=128,
    type=click.IntRange(1, 65_536),
    help="Raft entry MiB kept in RAM before a snapshot compacts them.",
)
@click.option(
    "--processes",
    default=AUTO_PROCESSES,
    show_default=True,
    help=(
        "Worker processes, each the node's replica of one Raft group with its own ports (the node's "
        "ports plus the group number) and store: the cluster's partitions are spread over the groups "
        "and their leaders over the nodes, so a node uses that many cores. Every node of a cluster "
        f"runs the same number (1..{PROCESSES_MAX}; DESIGN.md, Scale-out). {AUTO_PROCESSES}: as many "
        "as a data directory holds; for a new one, the cores this process may use, at most "
        f"{PROCESSES_AUTO_MAX} (give the number on machines of different sizes) (KQ_PROCESSES)."
    ),
)
@click.option("--worker-group", type=int, default=None, hidden=True, help="Set by the node for its workers.")
@click.option(
    "--durability",
    default="replicated",
    type=click.Choice(DURABILITY_MODES),
    help=(
        "When a write is acknowledged: replicated, once a majority holds it (in memory: survives any "
        "process crash); fsync, once a majority has it on disk (also survives a power loss of every "
        "node; slower). DESIGN.md, Durability (KQ_DURABILITY)."
    ),
)
@click.option(
    "--grpc-workers",
    default=GRPC_WORKERS_DEFAULT,
    type=click.IntRange(GRPC_WORKERS_MIN, GRPC_WORKERS_MAX),
    help=(
        "Threads for calls that block (topic and group writes waiting for their commit, metadata reads, "
        "the check of a large produce batch); produce requests, streams and long-polls wait on none."
    ),
)
@click.option(
    "--max-readers",
    default=READERS_MAX,
    type=click.IntRange(1, READERS_MAX),
    help="Streams and long-polls this node serves at once; one more is refused (TOO_MANY_READERS).",
)
@click.option(
    "--max-readers-per-connection",
    default=READERS_PER_CONNECTION_MAX,
    type=click.IntRange(1, READERS_MAX),
    help="Of those, what one client connection may hold.",
)
@click.option(
    "--kafka-address",
    default="",
    help="host:port of the Kafka protocol listener; empty: none (KQ_KAFKA_ADDRESS); needs integer node ids.",
)
@click.option(
    "--kafka-frame-bytes-max",
    default=KAFKA_FRAME_BYTES_DEFAULT,
    type=click.IntRange(KAFKA_FRAME_BYTES_MIN, 1 << 30),
    help="Largest Kafka request; a bigger frame closes its connection (Kafka's socket.request.max.bytes).",
)
@click.option(
    "--group-consumer-heartbeat-interval-ms",
    default=CONSUMER_HEARTBEAT_INTERVAL_MS,
    type=click.IntRange(CONSUMER_HEARTBEAT_INTERVAL_MS_MIN, SESSION_TIMEOUT_MS_MAX),
    help=(
        "How often consumer-group members (Kafka's group.protocol=consumer) heartbeat: the interval each"
        " heartbeat's answer names (Kafka's group.consumer.heartbeat.interval.ms)."
    ),
)
@click.option(
    "--group-consumer-session-timeout-ms",
    default=CONSUMER_SESSION_TIMEOUT_MS,
    type=click.IntRange(SESSION_TIMEOUT_MS_MIN, SESSION_TIMEOUT_MS_MAX),
    help=(
        "A consumer-group member silent this long is removed from its group; above the heartbeat"
        " interval (Kafka's group.consumer.session.timeout.ms)."
    ),
)
@click.option(
    "--default-partitions",
    default=KAFKA_DEFAULT_PARTITIONS,
    type=click.IntRange(1, PARTITIONS_MAX),
    help="Partitions of topics a Kafka client creates without a count (auto-created ones included).",
)
@click.option(
    "--auto-create-topics/--no-auto-create-topics",
    default=True,
    help="Create a topic when a Kafka client's Metadata request names an unknown one.",
)
@click.option(
    "--topic-default",
    "topic_default",
    multiple=True,
    metavar="NAME=VALUE",
    help=(
        "A cluster default of a topic config kq's leader runs (retention.ms, retention.bytes,"
        " cleanup.policy, delete.retention.ms, min.compaction.lag.ms, min.cleanable.dirty.ratio), by"
        " Kafka's name; repeatable."
        " Give every node the same ones."
    ),
)
@click.option(
    "--retention-check-ms",
    default=int(RETENTION_CHECK_S_DEFAULT * 1000),
    type=click.IntRange(100, 86_400_000),
    help="How often the leader trims expired records (Kafka's log.retention.check.interval.ms).",
)
@click.option(
    "--scrub-bytes-per-s",
    default=SCRUB_BYTES_PER_S_DEFAULT,
    type=click.IntRange(0, SCRUB_BYTES_PER_S_MAX),
    help=(
        "Stored bytes per second a background scrubber reads to check their checksums (0: off); a"
        " corrupt batch it finds is repaired from another replica."
    ),
)
@click.option(
    "--producer-id-expiration-ms",
    default=PRODUCER_ID_EXPIRATION_MS_DEFAULT,
    type=click.IntRange(1, 2**63 - 1),
    help=(
        "Forget an idempotent producer's state on a partition once it has not written there for this"
        " long and holds no open transaction there (Kafka's producer.id.expiration.ms)."
    ),
)
@click.option(
    "--producer-id-expiration-check-interval-ms",
    default=PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS_DEFAULT,
    type=click.IntRange(100, 86_400_000),
    help="How often the leader expires idle producers (Kafka's producer.id.expiration.check.interval.ms).",
)
@click.option(
    "--transactional-id-expiration-ms",
    default=TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT,
    type=click.IntRange(1, 2**63 - 1),
    help=(
        "Forget a transactional id with no transaction in progress once its state has not changed for"
        " this long (Kafka's transactional.id.expiration.ms)."
    ),
)
@click.option(
    "--compaction-check-ms",
    default=int(COMPACTION_CHECK_S_DEFAULT * 1000),
    type=click.IntRange(100, 86_400_000),
    help="How often the leader compacts topics with cleanup.policy=compact (Kafka's log.cleaner.backoff.ms).",
)
@click.option(
    "--rack",
    default="",
    help="This node's rack or zone (Kafka's broker.rack; KQ_RACK): consumers with that client.rack "
    "are sent here to fetch (KIP-392).",
)
@click.option(
    "--max-disk-bytes",
    default=None,
    metavar="SIZE",
    help=(
        "Bound of this node's store (LMDB's map: it never grows past it), e.g. 64GiB; the leader refuses "
        "writes that would grow it (STORAGE_FULL, Kafka's KAFKA_STORAGE_ERROR) within 5% of it "
        "(16 MiB to 1 GiB), or of a full disk. Default: no bound but the disk's (KQ_MAX_DISK_BYTES)."
    ),
)
@click.option(
    "--http-address",
    default="",
    help="host:port of this node's HTTP port: /metrics (Prometheus), /healthz, /readyz; empty: none "
    "(KQ_HTTP_ADDRESS).",
)
@click.option("--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"]))
@click.option(
    "--log-format",
    default="auto",
    type=click.Choice(LOG_FORMATS),
    help="json: one JSON object a line; text: for people; auto: text on a terminal, else json.",
)
@click.option(
    "--join",
    is_flag=True,
    default=False,
    help=(
        "This node is being added to a running cluster (`kq cluster add-node`): while its data directory "
        "is new it starts no election, and waits for the leader (KQ_JOIN). --peers names the current "
        "members."
    ),
)
@click.option(
    "--tls-cert", type=click.Path(dir_okay=False), help="PEM certificate of the gRPC port (KQ_TLS_CERT)."
)
@click.option("--tls-key", type=click.Path(dir_okay=False), help="PEM key of --tls-cert (KQ_TLS_KEY).")
@click.option(
    "--tls-ca",
    type=click.Path(dir_okay=False),
    help="PEM CA of the cluster: verifies client certificates and the nodes this node calls (KQ_TLS_CA).",
)
@click.option(
    "--tls-require-client-cert",
    is_flag=True,
    default=False,
    help="Mutual TLS: every gRPC client presents a certificate signed by --tls-ca.",
)
@click.option(
    "--kafka-tls",
    is_flag=True,
    default=False,
    help="The Kafka listener speaks TLS (clients: security.protocol=SSL) with --tls-cert and --tls-key; "
    "client certificates from --tls-ca required under --tls-require-client-cert.",
)
@click.option(
    "--kafka-sasl",
    is_flag=True,
    default=False,
    help="Kafka clients must authenticate with SASL (security.protocol=SASL_SSL with --kafka-tls, else "
    "SASL_PLAINTEXT, on loopback only unless --insecure) as a kq user (PutUser) (KQ_KAFKA_SASL).",
)
@click.option(
    "--kafka-sasl-mechanisms",
    default=",".join(KAFKA_SASL_MECHANISMS),
    show_default=True,
    help="The SASL mechanisms --kafka-sasl offers, comma-separated (KQ_KAFKA_SASL_MECHANISMS).",
)
@click.option(
    "--auth",
    is_flag=True,
    default=False,
    help="Require authentication (a client certificate of --tls-ca, a token, or SASL on the Kafka "
    "listener) and enforce ACLs on every call (KQ_AUTH).",
)
@click.option(
    "--super-user",
    "super_users",
    multiple=True,
    help="A principal every ACL check allows, e.g. User:admin (repeatable; KQ_SUPER_USER, space-separated).",
)
@click.option(
    "--insecure",
    is_flag=True,
    default=False,
    help="Serve plain text on a non-loopback address (gRPC and Raft without TLS, or Kafka without "
    "--kafka-tls) (KQ_INSECURE).",
)
def main(
    node_id: str,
    grpc_address: str,
    raft_address: str,
    peers: str,
    data_dir: Path,
    secret: str,
    election_timeout_min_ms: int,
    election_timeout_max_ms: int,
    heartbeat_ms: int,
    leader_fallback_ms: int,
    compaction_min_entries: int,
    compaction_min_time_s: int,
    compaction_log_mib: int,
    durability: Durability,
    grpc_workers: int,
    max_readers: int,
    max_readers_per_connection: int,
    kafka_address: str,
    kafka_frame_bytes_max: int,
    group_consumer_heartbeat_interval_ms: int,
    group_consumer_session_timeout_ms: int,
    default_partitions: int,
    auto_create_topics: bool,
    topic_default: tuple[str, ...],
    retention_check_ms: int,
    scrub_bytes_per_s: int,
    producer_id_expiration_ms: int,
    producer_id_expiration_check_interval_ms: int,
    transactional_id_expiration_ms: int,
    compaction_check_ms: int,
    rack: str,
    max_disk_bytes: str | None,
    log_level: str,
    http_address: str,
    log_format: LogFormat,
    join: bool,
    tls_cert: str | None,
    tls_key: str | None,
    tls_ca: str | None,
    tls_require_client_cert: bool,
    kafka_tls: bool,
    kafka_sasl: bool,
    kafka_sasl_mechanisms: str,
    auth: bool,
    super_users: tuple[str, ...],
    insecure: bool,
    processes: str,
    worker_group: int | None,
) -> None:
    """Runs one kq node."""
    try:
        parse_address(grpc_address, "--grpc-address")
        parse_address(raft_address, "--raft-address")
        if http_address:
            parse_address(http_address, "--http-address")
        parse_rack(rack, "--rack")
        parse_node_id(node_id)
        peer_list = parse_peers(peers, node_id, rack)
        if election_timeout_min_ms >= election_timeout_max_ms:
            raise ConfigError("--election-timeout-min-ms must be below --election-timeout-max-ms")
        if election_timeout_min_ms <= 3 * heartbeat_ms:  # PySyncObj's rule: three heartbeats per timeout.
            raise ConfigError("--election-timeout-min-ms must be above three times --heartbeat-ms")
        if leader_fallback_ms <= heartbeat_ms:
            raise ConfigError("--leader-fallback-ms must be above --heartbeat-ms")
        if not secret:
            raise ConfigError("--secret must not be empty")
        try:
            topic_defaults = parse_assignments(topic_default)
        except ValueError as error:
            raise ConfigError(f"--topic-default: {error}") from error
        disk_bound = parse_byte_size(max_disk_bytes, "--max-disk-bytes") if max_disk_bytes else None
        problem = defaults_problem(topic_defaults)
        if problem is not None:
            raise ConfigError(f"--topic-default: {problem}")
        tls = _server_tls(tls_cert, tls_key, tls_ca, tls_require_client_cert)
        for principal in super_users:
            if principal_problem(principal) is not None or principal == EVERYONE:
                raise ConfigError(f"--super-user: a principal is User:<name>, got {principal!r}")
        if kafka_tls and tls is None:
            raise ConfigError("--kafka-tls needs --tls-cert, --tls-key and --tls-ca")
        mechanisms = parse_sasl_mechanisms(kafka_sasl_mechanisms) if kafka_sasl else ()
        if not insecure:
            _refuse_exposed_plain_text(
                grpc_address, kafka_address if not kafka_tls else "", tls is not None, raft_address
            )
        if group_consumer_heartbeat_interval_ms >= group_consumer_session_timeout_ms:
            raise ConfigError(
                "--group-consumer-heartbeat-interval-ms must be below --group-consumer-session-timeout-ms"
            )
        kafka = None
        if kafka_address:
            kafka = KafkaConfig(
                parse_address(kafka_address, "--kafka-address"),
                kafka_frame_bytes_max,
                default_partitions,
                auto_create_topics,
                kafka_tls,
                mechanisms,
                group_consumer_heartbeat_interval_ms,
                group_consumer_session_timeout_ms,
            )
    except ConfigError as error:
        raise click.UsageError(str(error)) from error
    raft = RaftConfig(
        raft_address=raft_address,
        peer_raft_addresses=tuple(peer.raft_address for peer in peer_list),
        data_dir=data_dir,
        password=secret,
        election_timeout_min_s=election_timeout_min_ms / 1000,
        election_timeout_max_s=election_timeout_max_ms / 1000,
        heartbeat_period_s=heartbeat_ms / 1000,
        leader_fallback_timeout_s=leader_fallback_ms / 1000,
        compaction_min_entries=compaction_min_entries,
        compaction_min_time_s=compaction_min_time_s,
        compaction_log_bytes_max=compaction_log_mib * 1024 * 1024,
        durability=durability,
        join=join,
        node_id=node_id,
        # Mutual TLS between nodes with the node's certificate whenever it has one (raft/transport.py).
        tls=RaftTls(*tls.files) if tls is not None and tls.files is not None else None,
    )
    config = NodeConfig(
        node_id,
        grpc_address,
        raft_address,
        peer_list,
        data_dir,
        secret,
        grpc_workers,
        raft,
        max_readers,
        min(max_readers_per_connection, max_readers),
        kafka,
        topic_defaults,
        retention_check_ms / 1000,
        rack,
        compaction_check_s=compaction_check_ms / 1000,
        scrub_bytes_per_s=scrub_bytes_per_s,
        producer_id_expiration_ms=producer_id_expiration_ms,
        producer_id_expiration_check_s=producer_id_expiration_check_interval_ms / 1000,
        transactional_id_expiration_ms=transactional_id_expiration_ms,
        max_disk_bytes=disk_bound,
        http_address=http_address,
        tls=tls,
        auth=auth,
        super_users=super_users,
    )
    _run_checked(config, processes, worker_group, log_level, log_format)


def _run_checked(
    config: NodeConfig, processes: str, worker_group: int | None, log_level: str, log_format: LogFormat
) -> None:
    """Runs the node, or with --processes its supervisor, or one of its workers (broker/workers.py)."""
    try:
        if config.kafka is not None:
            check_kafka_members(config)
        config = dataclasses.replace(config, processes=resolve_processes(processes, config.data_dir))
        check_processes(config, config.processes)
        if worker_group is None:  # The node's own process: its supervisor, or its only one.
            record_processes(config.data_dir, config.processes)
    except ConfigError as error:
        raise click.UsageError(str(error)) from error
    if config.processes > 1 and worker_group is None:
        configure_logging(config.node_id, log_level, log_format)
        sys.exit(Supervisor(sys.argv[1:], config.processes, leader_board(config.data_dir)).run())
    if worker_group is not None:
        if not 0 <= worker_group < config.processes:
            raise click.UsageError(f"--worker-group must be 0..{config.processes - 1}")
        die_with_parent(int(os.environ.get("KQ_SUPERVISOR_PID", "0")))
        config = worker_config(config, worker_group)
    run_node(config, log_level, log_format)
    sys.exit(0)
