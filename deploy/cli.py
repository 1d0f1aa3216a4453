"""`python -m kq.deploy`: a local cluster that outlives the command (what `deploy/run-cluster.sh` runs).

Node N serves gRPC on 127.0.0.1:<base gRPC port + N> and Raft on 127.0.0.1:<base Raft port + N>
(9101.. and 7101.. by default, the `kq` command's default bootstrap). The run directory holds each
node's data (`nodeN/`), log (`nodeN.log`) and PID (`nodeN.pid`), and the generated cluster secret
(`secret`, mode 600) unless KQ_SECRET gives one. Every command works from the PID files through
`LocalCluster`: a node is signalled only by its recorded PID, and only while that process still runs
on this run directory's data.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import click

from kq.client import NodeStatus
from kq.deploy.cluster import LocalCluster, NodeDiedError, agreed_leader
from kq.deploy.waiting import WaitTimeoutError

NODES_MAX = 9
SECRET_BYTES = 32
LOG_LINES_DEFAULT = 20
FOLLOW_POLL_S = 0.5  # How often `logs --follow` looks for new lines (pacing output, not synchronization).
FAILED_START_LOG_LINES = 10


@dataclass(frozen=True, slots=True)
class RunSettings:
    """Where the cluster lives and how it is addressed, from the group's options."""

    run_dir: Path
    nodes: int
    base_grpc_port: int
    base_raft_port: int
    ready_timeout_s: float
    base_kafka_port: int
    program: str  # How the user called us, for the hints we print ("deploy/run-cluster.sh").
    racks: tuple[str, ...] = ()  # One per node (KQ_RACKS), or none.
    base_http_port: int = 9640  # Node N: /metrics, /healthz, /readyz on this+N.

    def cluster(self) -> LocalCluster:
        """The cluster of this run directory, with every node that still runs adopted by its PID.

        Its secret is set (`_secret`) only by the commands that start nodes.
        """
        size = self.nodes
        cluster = LocalCluster(
            self.run_dir,
            size,
            "",
            grpc_ports=[self.base_grpc_port + n for n in range(1, size + 1)],
            raft_ports=[self.base_raft_port + n for n in range(1, size + 1)],
            kafka_ports=[self.base_kafka_port + n for n in range(1, size + 1)],
            http_ports=[self.base_http_port + n for n in range(1, size + 1)],
            racks=self.racks or None,
            record_pids=True,
            detach=True,
        )
        cluster.adopt_running()
        return cluster


def say(message: str) -> None:
    """One line of progress on stdout."""
    click.echo(f"kq: {message}")


class DeployError(click.ClickException):
    """A failure shown as one line, `kq: error: <reason>`, with exit code 1."""

    def show(self, file: IO[Any] | None = None) -> None:
        """Prints the one line to stderr."""
        click.echo(f"kq: error: {self.message}", err=True)


def _secret(run_dir: Path, create: bool) -> str:
    """KQ_SECRET, else the run directory's secret file (created on first start)."""
    given = os.environ.get("KQ_SECRET", "")
    if given:
        return given
    path = run_dir / "secret"
    if not path.exists() or not path.read_text().strip():
        if not create:
            raise DeployError(f"no {path} and no KQ_SECRET: set KQ_SECRET to the secret the cluster has")
        path.touch(mode=0o600)
        path.write_text(secrets.token_hex(SECRET_BYTES))
    path.chmod(0o600)
    return path.read_text().strip()


def _node_id(settings: RunSettings, node: str) -> str:
    if not node.isdigit() or not 1 <= int(node) <= settings.nodes:
        raise DeployError(f"expected a node id from 1 to {settings.nodes}, got '{node}'")
    return str(int(node))


def _one_node(settings: RunSettings, node: str) -> tuple[str, LocalCluster]:
    """The node id a command names (checked) and the cluster, its running nodes adopted."""
    return _node_id(settings, node), settings.cluster()


def _start_and_wait(cluster: LocalCluster, settings: RunSettings, node_ids: list[str]) -> str:
    """Starts `node_ids` and waits for them to be ready under a leader; on failure stops them, shows logs."""
    taken = cluster.addresses_in_use(node_ids)
    if taken:
        raise DeployError(
            f"port(s) in use: {', '.join(taken)}; stop whatever holds them, or set KQ_BASE_GRPC_PORT / "
            "KQ_BASE_RAFT_PORT"
        )
    for node_id in node_ids:
        cluster.start_node(node_id)
    say(f"started node(s) {' '.join(node_ids)}; waiting up to {settings.ready_timeout_s:.0f} s for a leader")
    try:
        return cluster.wait_ready(settings.ready_timeout_s, node_ids)
    except (WaitTimeoutError, NodeDiedError) as error:
        for node_id in node_ids:
            lines = _tail(cluster.log_path(node_id), FAILED_START_LOG_LINES)
            click.echo(f"\n--- last lines of {cluster.log_path(node_id)} ---\n" + "\n".join(lines), err=True)
        for node_id in node_ids:
            cluster.stop_node(node_id)
        raise DeployError(f"{error}") from error


def _hints(cluster: LocalCluster, settings: RunSettings, leader: str) -> None:
    say(f"cluster is up; leader: node {leader} ({cluster.nodes[leader].grpc_address})")
    for node_id, spec in cluster.nodes.items():
        click.echo(
            f"  node {node_id}  gRPC {spec.grpc_address}  Kafka {spec.kafka_address}  "
            f"Raft {spec.raft_address}  PID {cluster.pid(node_id) or '-'}  log {cluster.log_path(node_id)}\n"
            f"          metrics {spec.metrics_url}  health http://{spec.http_address}/readyz"
        )
    bootstrap = ""
    if settings.base_grpc_port != 9100 or settings.nodes != 3:
        bootstrap = f" --bootstrap {','.join(cluster.bootstrap)}"
        click.echo("\nThese are not the kq CLI's default nodes: the commands below pass --bootstrap.")
    bin_dir = Path(sys.executable).parent
    program = settings.program
    click.echo(
        f"\nTry it (kq is in {bin_dir}; activate it, or call {bin_dir}/kq directly):\n"
        f"  source {bin_dir}/activate\n"
        f"  kq{bootstrap} topics create demo --partitions 3\n"
        f"  kq{bootstrap} produce demo hello world\n"
        f"  kq{bootstrap} consume demo --from-beginning --max 2\n"
        f"  kq{bootstrap} cluster status\n\n"
        f"Kafka clients (kcat, confluent-kafka, kafka-python, ...):\n"
        f"  bootstrap.servers={cluster.kafka_bootstrap}\n"
        f"  kcat -b {cluster.kafka_bootstrap} -L\n\n"
        f"Failover demo:  {program} kill {leader}   (then: {program} status, {program} restart {leader})\n"
        f"Logs:           {program} logs [N] [--follow]\n"
        f"Stop:           {program} stop"
    )


def _tail(path: Path, lines: int) -> list[str]:
    if not path.exists():
        return []
    return path.read_text(errors="replace").splitlines()[-lines:]


PORT_BASE = click.IntRange(1, 65535 - NODES_MAX)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option(
    "--run-dir",
    envvar="KQ_RUN_DIR",
    default="run",
    type=click.Path(file_okay=False, path_type=Path),
    help="Data, logs, PIDs and secret (KQ_RUN_DIR).",
)
@click.option("--nodes", envvar="KQ_NODES", default=3, type=click.IntRange(1, NODES_MAX), help="Node count.")
@click.option(
    "--base-grpc-port", envvar="KQ_BASE_GRPC_PORT", default=9100, type=PORT_BASE, help="Node N: gRPC this+N"
)
@click.option(
    "--base-raft-port", envvar="KQ_BASE_RAFT_PORT", default=7100, type=PORT_BASE, help="Node N: Raft this+N"
)
@click.option(
    "--ready-timeout-s",
    envvar="KQ_READY_TIMEOUT_S",
    default=60.0,
    type=click.FloatRange(1, 3600),
    help="How long start, restart and kill wait for a leader.",
)
@click.option(
    "--base-kafka-port",
    envvar="KQ_BASE_KAFKA_PORT",
    default=9091,
    type=PORT_BASE,
    help="Node N: Kafka listener this+N (9092, 9093, 9094 by default)",
)
@click.option(
    "--base-http-port",
    envvar="KQ_BASE_HTTP_PORT",
    default=9640,
    type=PORT_BASE,
    help="Node N: HTTP port this+N for /metrics, /healthz and /readyz (9641, 9642, 9643 by default)",
)
@click.option(
    "--racks",
    envvar="KQ_RACKS",
    default="",
    help="Comma-separated rack of each node, e.g. a,b,c (Kafka's broker.rack; consumers with a "
    "client.rack fetch from that rack's node). Empty: none.",
)
@click.option("--program", default="python -m kq.deploy", hidden=True, help="Our name in printed hints.")
@click.pass_context
def main(
    context: click.Context,
    run_dir: Path,
    nodes: int,
    base_grpc_port: int,
    base_raft_port: int,
    ready_timeout_s: float,
    base_kafka_port: int,
    base_http_port: int,
    racks: str,
    program: str,
) -> None:
    """A local kq cluster on 127.0.0.1 that keeps running after this command.

    Options also come from KQ_RUN_DIR, KQ_NODES, KQ_BASE_GRPC_PORT, KQ_BASE_RAFT_PORT, KQ_BASE_KAFKA_PORT,
    KQ_BASE_HTTP_PORT, KQ_READY_TIMEOUT_S and KQ_RACKS; KQ_SECRET is the cluster's Raft secret (default:
    generated into the run directory). Other KQ_* variables reach kq-node as its options (e.g.
    KQ_LOG_LEVEL=debug).
    """
    grpc_ports = range(base_grpc_port + 1, base_grpc_port + nodes + 1)
    raft_ports = range(base_raft_port + 1, base_raft_port + nodes + 1)
    kafka_ports = range(base_kafka_port + 1, base_kafka_port + nodes + 1)
    ranges = [
        set(grpc_ports),
        set(raft_ports),
        set(kafka_ports),
        set(range(base_http_port + 1, base_http_port + nodes + 1)),
    ]
    if sum(len(ports) for ports in ranges) != len(set().union(*ranges)):
        raise click.BadParameter(
            "the gRPC, Raft, Kafka and HTTP port ranges overlap", param_hint="--base-raft-port"
        )
    rack_list = tuple(rack.strip() for rack in racks.split(",")) if racks else ()
    if rack_list and len(rack_list) != nodes:
        raise click.BadParameter(
            f"{len(rack_list)} racks for {nodes} nodes: give one per node", param_hint="--racks"
        )
    context.obj = RunSettings(
        run_dir.absolute(),
        nodes,
        base_grpc_port,
        base_raft_port,
        ready_timeout_s,
        base_kafka_port,
        program,
        rack_list,
        base_http_port,
    )


@main.command()
@click.pass_obj
def start(settings: RunSettings) -> None:
    """Start every node that is not running (running ones are left alone) and wait for a leader."""
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    cluster = settings.cluster()
    missing = [node_id for node_id in cluster.nodes if not cluster.running(node_id)]
    if not missing:
        pids = " ".join(str(pid) for pid in cluster.pids().values())
        say(f"already running: node(s) {' '.join(cluster.nodes)} (PIDs {pids})")
        leader = cluster.wait_ready(settings.ready_timeout_s)
    else:
        cluster.secret = _secret(settings.run_dir, create=True)
        started_s = time.monotonic()
        leader = _start_and_wait(cluster, settings, missing)
        say(f"ready in {time.monotonic() - started_s:.0f} s")
    _hints(cluster, settings, leader)


@main.command()
@click.pass_obj
def stop(settings: RunSettings) -> None:
    """SIGTERM every node by its recorded PID, SIGKILL after 10 s; returns once none runs."""
    cluster = settings.cluster()
    running = list(cluster.pids())
    cluster.stop()
    if running:
        say(f"stopped node(s) {' '.join(running)}")
    still = cluster.pids() | settings.cluster().pids()
    if still:
        raise DeployError(f"still running: {still}")
    say("no node is running")


@main.command()
@click.pass_obj
def status(settings: RunSettings) -> None:
    """Each node's process and its own view of the cluster, and the leader they agree on."""
    cluster = settings.cluster()
    statuses = cluster.statuses()
    click.echo(
        f"{'node':<5} {'process':<17} {'gRPC':<16} {'role':<10} {'leader':<7} {'term':>5} "
        f"{'commit':>8} {'applied':>8}  ready"
    )
    for node_id, spec in cluster.nodes.items():
        pid = cluster.pid(node_id)
        process = f"running ({pid})" if pid is not None else "stopped"
        columns = _status_columns(statuses[node_id], pid)
        click.echo(f"{node_id:<5} {process:<17} {spec.grpc_address:<16} {columns}")
    leader = agreed_leader(statuses, len(cluster.nodes))
    if leader is not None:
        click.echo(f"\nleader: node {leader} ({cluster.nodes[leader].grpc_address})")
    elif cluster.pids():
        click.echo("\nleader: none (no node is followed by a majority yet)")


def _status_columns(status: NodeStatus | None, pid: int | None) -> str:
    if status is None:
        return "-" if pid is None else "not answering"
    return (
        f"{status.role:<10} {status.leader_id or '-':<7} {status.term:>5} {status.commit_index:>8} "
        f"{status.applied_index:>8}  {'yes' if status.ready else 'no'}"
    )


@main.command()
@click.argument("node", required=False)
@click.option("--lines", "-n", default=LOG_LINES_DEFAULT, type=click.IntRange(0, 100_000), help="Per node.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until Ctrl-C.")
@click.pass_obj
def logs(settings: RunSettings, node: str | None, lines: int, follow: bool) -> None:
    """The last lines of each node's log (or of NODE's)."""
    cluster = settings.cluster()
    node_ids = [_node_id(settings, node)] if node is not None else list(cluster.nodes)
    paths = {node_id: cluster.log_path(node_id) for node_id in node_ids}
    for node_id, path in paths.items():
        click.echo(f"==> node {node_id}: {path} <==")
        click.echo("\n".join(_tail(path, lines)))
    if not follow:
        return
    sizes = {node_id: path.stat().st_size if path.exists() else 0 for node_id, path in paths.items()}
    try:
        while True:
            for node_id, path in paths.items():
                if path.exists() and path.stat().st_size > sizes[node_id]:
                    with path.open("rb") as log:
                        log.seek(sizes[node_id])
                        new = log.read()
                    sizes[node_id] += len(new)
                    for line in new.decode(errors="replace").splitlines():
                        click.echo(f"node {node_id}| {line}" if len(paths) > 1 else line)
            time.sleep(FOLLOW_POLL_S)
    except KeyboardInterrupt:
        return


@main.command()
@click.argument("node")
@click.pass_obj
def restart(settings: RunSettings, node: str) -> None:
    """Stop NODE (if it runs) and start it again; wait until it is ready under a leader."""
    node_id, cluster = _one_node(settings, node)
    cluster.secret = _secret(settings.run_dir, create=False)
    if cluster.running(node_id):
        cluster.stop_node(node_id)
    leader = _start_and_wait(cluster, settings, [node_id])
    leader_address = cluster.nodes[leader].grpc_address
    say(f"node {node_id} (PID {cluster.pid(node_id)}) is ready; leader: node {leader} ({leader_address})")


@main.command()
@click.argument("node")
@click.pass_obj
def kill(settings: RunSettings, node: str) -> None:
    """kill -9 of NODE by its recorded PID, then wait for the others to agree on a leader."""
    node_id, cluster = _one_node(settings, node)
    pid = cluster.pid(node_id)
    if pid is None:
        raise DeployError(f"node {node_id} is not running")
    cluster.kill_node(node_id)
    say(f"killed node {node_id} (PID {pid}) with SIGKILL")
    alive = list(cluster.pids())
    if 2 * len(alive) <= len(cluster.nodes):
        say(f"only {len(alive)} of {len(cluster.nodes)} nodes run: no majority, no leader until one restarts")
        return
    try:
        leader = cluster.wait_ready(settings.ready_timeout_s, alive)
    except (WaitTimeoutError, NodeDiedError) as error:
        raise DeployError(f"{error}; see '{settings.program} status'") from error
    say(
        f"nodes {' '.join(alive)} follow leader node {leader} ({cluster.nodes[leader].grpc_address}); "
        f"'{settings.program} restart {node_id}' brings node {node_id} back"
    )


@main.command()
@click.pass_context
def clean(context: click.Context) -> None:
    """Stop every node, then delete what these commands wrote in the run directory (nothing else)."""
    context.invoke(stop)
    settings: RunSettings = context.obj
    cluster = settings.cluster()
    for node_id, spec in cluster.nodes.items():
        shutil.rmtree(spec.data_dir, ignore_errors=True)
        cluster.log_path(node_id).unlink(missing_ok=True)
    for name in ("secret", "install.log"):
        (settings.run_dir / name).unlink(missing_ok=True)
    try:
        settings.run_dir.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        say(f"kept {settings.run_dir}: it holds files these commands did not create")
    say("removed the cluster's data, logs and secret")
