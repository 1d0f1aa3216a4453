"""`kq-node`: one cluster member. Configuration from flags, `KQ_*` environment variables or a TOML file.

Precedence: flag > environment > config file > default. Wires storage, Raft, the batcher and gRPC.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import tomllib
from concurrent import futures
from pathlib import Path
from typing import Any

import click
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kq.broker.config import ConfigError, NodeConfig, parse_address, parse_peers
from kq.broker.consensus import PySyncObjConsensus
from kq.broker.edge import EdgeInterceptor
from kq.broker.groups import GroupCoordinator
from kq.broker.proposals import Batcher, wall_clock_ms
from kq.broker.service import BrokerService
from kq.broker.service_base import AppliedNotifier
from kq.proto import kq_pb2_grpc
from kq.proto.limits import GRPC_MESSAGE_BYTES_MAX
from kq.raft.node import RaftConfig, RaftNode
from kq.storage import Store

logger = logging.getLogger("kq.node")

GRPC_CONCURRENT_RPCS_MAX = 256  # Beyond this the server answers RESOURCE_EXHAUSTED.
HEALTH_POLL_S = 0.2
SHUTDOWN_GRACE_S = 2.0


def run_node(config: NodeConfig, log_level: str) -> None:
    """Runs the node until SIGTERM or SIGINT."""
    logging.basicConfig(
        level=log_level.upper(),
        format=f"%(asctime)s %(levelname)s node={config.node_id} %(name)s: %(message)s",
    )
    assert config.raft is not None
    store = Store.open(config.data_dir / "store")
    notifier = AppliedNotifier(store.applied_index())
    node = RaftNode(config.raft, store, notifier.notify)
    consensus = PySyncObjConsensus(node, config.self_peer, config.peers)
    batcher = Batcher(consensus, wall_clock_ms)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.grpc_workers, thread_name_prefix="kq-grpc"),
        maximum_concurrent_rpcs=GRPC_CONCURRENT_RPCS_MAX,
        interceptors=[EdgeInterceptor()],
        options=[
            ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES_MAX),
            ("grpc.max_send_message_length", GRPC_MESSAGE_BYTES_MAX),
            ("grpc.so_reuseport", 0),
        ],
    )
    coordinator = GroupCoordinator(store, consensus, wall_clock_ms)
    service = BrokerService(config.self_peer, config.peers, store, consensus, batcher, notifier, coordinator)
    kq_pb2_grpc.add_BrokerServicer_to_server(service, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if server.add_insecure_port(config.grpc_address) == 0:
        raise SystemExit(f"cannot bind gRPC address {config.grpc_address}")
    server.start()
    logger.info("serving gRPC on %s, Raft on %s", config.grpc_address, config.raft_address)

    stopping = threading.Event()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signal_number, lambda *_: stopping.set())
    while not stopping.wait(HEALTH_POLL_S):
        status = consensus.status()
        serving = status.ready and bool(status.leader_id)
        health_servicer.set(
            "",
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING,
        )
    logger.info("stopping")
    server.stop(SHUTDOWN_GRACE_S).wait()
    batcher.stop()
    coordinator.stop()
    node.close()
    store.close()


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
    help="Cluster members as id=raft_host:port=grpc_host:port, comma-separated (KQ_PEERS).",
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
    default=32,
    type=click.IntRange(1, 65_536),
    help="Raft entry MiB kept in RAM before a snapshot compacts them.",
)
@click.option("--grpc-workers", default=64, type=click.IntRange(4, 1024))
@click.option("--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"]))
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
    grpc_workers: int,
    log_level: str,
) -> None:
    """Runs one kq node."""
    try:
        parse_address(grpc_address, "--grpc-address")
        parse_address(raft_address, "--raft-address")
        peer_list = parse_peers(peers, node_id)
        if election_timeout_min_ms >= election_timeout_max_ms:
            raise ConfigError("--election-timeout-min-ms must be below --election-timeout-max-ms")
        if not secret:
            raise ConfigError("--secret must not be empty")
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
    )
    config = NodeConfig(node_id, grpc_address, raft_address, peer_list, data_dir, secret, grpc_workers, raft)
    run_node(config, log_level)
    sys.exit(0)
