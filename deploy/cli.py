"""`python -m kq.deploy`: a local cluster that outlives the command (what `deploy/run-cluster.sh` runs).

Node N serves gRPC on 127.0.0.1:<base gRPC port + N> and Raft on 127.0.0.1:<base Raft port + N>
(9101.. and 7101.. by default, the `kq` command's default bootstrap). The run directory holds each
node's data (`nodeN/`), log (`nodeN.log`) and PID (`nodeN.pid`), the generated cluster secret
(`secret`, mode 600) unless KQ_SECRET gives one, and the current members' ids (`members`, one a line,
written by the first `start` and by `add` and `remove`; 1..--nodes until then). Every command acts
on those members, through `LocalCluster`: a node is signalled only by its recorded PID, and only while
that process still runs on this run directory's data.

Node ids are never reused while a data directory `nodeN/` stays (a removed node's store would rejoin
with its old state): `add` takes the id after the highest member or data directory, up to NODES_MAX,
the most the fixed port scheme leaves room for.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import click

from kq.client import KqClient, KqClientError, MembershipRefusedError, NodeStatus
from kq.deploy.cluster import LocalCluster, NodeDiedError, agreed_leader
from kq.deploy.waiting import WaitTimeoutError

NODES_MAX = 9  # Node ids run 1..9: with the default bases, Kafka's 9091+N stays below gRPC's 9101.
MEMBERS_FILE = "members"
CERTS_DIR = "certs"  # `start --secure`: the CA, node and admin certificates (deploy/certs.py).
# `start --secure`: authentication and ACLs on (broker/auth.py); the admin certificate's principal is
# the super-user that grants the rest.
SECURE_NODE_ARGS = ("--auth", "--super-user", "User:admin")
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
    racks: tuple[str, ...] = ()  # Node N's is the Nth (KQ_RACKS), or none; a node added later has none.
    base_http_port: int = 9640  # Node N: /metrics, /healthz, /readyz on this+N.

    def member_ids(self) -> list[str]:
        """The current members: the run directory's `members` file, or 1..nodes before the first start."""
        remembered = read_members(self.run_dir)
        return remembered if remembered is not None else [str(n) for n in range(1, self.nodes + 1)]

    def ports(self, node_id: str) -> tuple[int, int, int, int]:
        """Node `node_id`'s gRPC, Raft, Kafka and HTTP ports: each base plus the id."""
        number = int(node_id)
        bases = (self.base_grpc_port, self.base_raft_port, self.base_kafka_port, self.base_http_port)
        return bases[0] + number, bases[1] + number, bases[2] + number, bases[3] + number

    def cluster(self, node_ids: Sequence[str] | None = None, secure: bool = False) -> LocalCluster:
        """The cluster of this run directory (`node_ids`, default the current members), with every node
        that still runs adopted by its PID; over TLS when `secure` or when the run directory holds
        certificates (a `start --secure` made them: `certs/`).

        Its secret is set (`_secret`) only by the commands that start nodes.
        """
        tls_dir = self.run_dir / CERTS_DIR
        secure = secure or (tls_dir / "ca.pem").exists()
        ids = list(node_ids) if node_ids is not None else self.member_ids()
        ports = [self.ports(node_id) for node_id in ids]
        racks = [self.racks[int(n) - 1] if int(n) <= len(self.racks) else "" for n in ids]
        cluster = LocalCluster(
            self.run_dir,
            len(ids),
            "",
            SECURE_NODE_ARGS if secure else (),
            grpc_ports=[grpc for grpc, _, _, _ in ports],
            raft_ports=[raft for _, raft, _, _ in ports],
            kafka_ports=[kafka for _, _, kafka, _ in ports],
            http_ports=[http for _, _, _, http in ports],
            racks=racks if self.racks else None,
            record_pids=True,
            detach=True,
            node_ids=ids,
            tls_dir=tls_dir if secure else None,
        )
        cluster.adopt_running()
        return cluster


def read_members(run_dir: Path) -> list[str] | None:
    """The member ids `run_dir/members` lists, in id order; None when there is no such file yet."""
    path = run_dir / MEMBERS_FILE
    if not path.exists():
        return None
    words = path.read_text().split()
    if not words or not all(word.isdigit() and 1 <= int(word) <= NODES_MAX for word in words):
        raise DeployError(f"{path} should list node ids from 1 to {NODES_MAX}, one a line; it holds {words}")
    return sorted({str(int(word)) for word in words}, key=int)


def write_members(run_dir: Path, node_ids: Sequence[str]) -> None:
    """Replaces `run_dir/members` atomically (a synced temporary file renamed over it), so a crash
    leaves the old list or the new one, never a torn file that would start the wrong nodes."""
    path = run_dir / MEMBERS_FILE
    temporary = run_dir / f".{MEMBERS_FILE}.tmp"
    with temporary.open("w") as members:
        members.write("".join(f"{node_id}\n" for node_id in sorted(node_ids, key=int)))
        members.flush()
        os.fsync(members.fileno())
    os.replace(temporary, path)


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
    """The member id `node` names (checked against the current members)."""
    members = settings.member_ids()
    if not node.isdigit() or str(int(node)) not in members:
        raise DeployError(f"node '{node}' is not a member; the members are {' '.join(members)}")
    return str(int(node))


def _one_node(settings: RunSettings, node: str) -> tuple[str, LocalCluster]:
    """The node id a command names (checked) and the cluster, its running nodes adopted."""
    return _node_id(settings, node), settings.cluster()


def _overlapping_ports(settings: RunSettings, node_ids: Sequence[str]) -> bool:
    """Whether two of the gRPC, Raft, Kafka and HTTP ports of `node_ids` are the same port."""
    ports = [port for node_id in node_ids for port in settings.ports(node_id)]
    return len(ports) != len(set(ports))


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


def _node_lines(cluster: LocalCluster, node_ids: Sequence[str]) -> None:
    """Each node's addresses, PID and log, two lines a node."""
    for node_id in node_ids:
        spec = cluster.nodes[node_id]
        click.echo(
            f"  node {node_id}  gRPC {spec.grpc_address}  Kafka {spec.kafka_address}  "
            f"Raft {spec.raft_address}  PID {cluster.pid(node_id) or '-'}  log {cluster.log_path(node_id)}\n"
            f"          metrics {spec.metrics_url}  health http://{spec.http_address}/readyz"
        )


def _bootstrap_option(cluster: LocalCluster, settings: RunSettings) -> str:
    """The kq CLI's options for the commands we print: ` --bootstrap <members>` unless the CLI's default
    finds them, and the TLS options of a secure cluster."""
    options = ""
    if settings.base_grpc_port != 9100 or list(cluster.nodes) != ["1", "2", "3"]:
        options = f" --bootstrap {','.join(cluster.bootstrap)}"
    if cluster.tls_dir is not None:
        certs = cluster.tls_dir
        options += f" --tls-ca {certs / 'ca.pem'} --tls-cert {certs / 'admin.pem'}"
        options += f" --tls-key {certs / 'admin-key.pem'}"
    return options


def _kafka_tls_settings(cluster: LocalCluster, separator: str) -> str:
    """A secure cluster's Kafka client settings (librdkafka's names), each after `separator`."""
    if cluster.tls_dir is None:
        return ""
    certs = cluster.tls_dir
    settings = {
        "security.protocol": "ssl",
        "ssl.ca.location": certs / "ca.pem",
        "ssl.certificate.location": certs / "admin.pem",
        "ssl.key.location": certs / "admin-key.pem",
    }
    return "".join(f"{separator}{name}={value}" for name, value in settings.items())


def _hints(cluster: LocalCluster, settings: RunSettings, leader: str) -> None:
    say(f"cluster is up; leader: node {leader} ({cluster.nodes[leader].grpc_address})")
    _node_lines(cluster, list(cluster.nodes))
    bootstrap = _bootstrap_option(cluster, settings)
    if cluster.tls_dir is not None:
        click.echo(
            f"\ngRPC is mutual TLS (certificates in {cluster.tls_dir}) with authentication and ACLs on: "
            "the commands below pass the admin certificate (User:admin, a super-user).\n"
            f"Grant a user:  kq{bootstrap} users add alice  &&  "
            f"kq{bootstrap} acls add --principal User:alice --operation write --topic demo"
        )
    elif bootstrap:
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
        f"  bootstrap.servers={cluster.kafka_bootstrap}{_kafka_tls_settings(cluster, ' ')}\n"
        f"  kcat -b {cluster.kafka_bootstrap}{_kafka_tls_settings(cluster, ' -X ')} -L\n\n"
        f"Failover demo:  {program} kill {leader}   (then: {program} status, {program} restart {leader})\n"
        f"Membership:     {program} add   (one more node)   {program} remove N\n"
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
    help="Data, logs, PIDs, secret and members (KQ_RUN_DIR).",
)
@click.option(
    "--nodes",
    envvar="KQ_NODES",
    default=3,
    type=click.IntRange(1, NODES_MAX),
    help="Node count of a new cluster; once started, the run directory's members file says which nodes "
    "run ('add' and 'remove' change it).",
)
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
    help="How long start, restart, kill, add and remove wait for a leader.",
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

    The run directory remembers the current members (its `members` file): `add` and `remove` change
    them, and every other command acts on them.

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
@click.option(
    "--secure",
    is_flag=True,
    help="gRPC and Kafka over mutual TLS (certificates made once into the run directory's certs/, kq "
    "certs init), with authentication and ACLs on (--auth; the admin certificate is the super-user).",
)
@click.pass_obj
def start(settings: RunSettings, secure: bool) -> None:
    """Start every member that is not running (running ones are left alone) and wait for a leader."""
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    remembered = read_members(settings.run_dir)
    if remembered is None:
        write_members(settings.run_dir, settings.member_ids())  # The first start fixes the members.
    elif remembered != [str(n) for n in range(1, settings.nodes + 1)]:
        say(f"the members are node(s) {' '.join(remembered)} (from {settings.run_dir / MEMBERS_FILE})")
    cluster = settings.cluster(secure=secure)
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
    """SIGTERM every member by its recorded PID, SIGKILL after 10 s; returns once none runs."""
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
    """The last lines of each member's log (or of NODE's: a removed node's log stays too)."""
    cluster = settings.cluster()
    node_ids = list(cluster.nodes)
    if node is not None:
        removed = node.isdigit() and cluster.log_path(str(int(node))).exists()
        node_ids = [str(int(node)) if removed else _node_id(settings, node)]
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
    leader = _leader_of_running(cluster, settings, "nodes run: no majority, no leader until one restarts")
    if leader is None:
        return
    say(
        f"nodes {' '.join(alive)} follow leader node {leader} ({cluster.nodes[leader].grpc_address}); "
        f"'{settings.program} restart {node_id}' brings node {node_id} back"
    )


def _next_node_id(settings: RunSettings, members: Sequence[str]) -> str:
    """The id after the highest member and the highest data directory left in the run directory (a
    removed node's store must not come back under a new node), if the port scheme has room for it."""
    numbers = {int(node_id) for node_id in members}
    numbers |= {n for n in range(1, NODES_MAX + 1) if (settings.run_dir / f"node{n}").exists()}
    number = max(numbers) + 1
    if number > NODES_MAX:
        raise DeployError(
            f"no node id left: ids run from 1 to {NODES_MAX}, and a removed node's id is taken while its "
            f"data directory ({settings.run_dir}/node<N>) stays; delete that, or '{settings.program} clean'"
        )
    return str(number)


def _join(cluster: LocalCluster, settings: RunSettings, node_id: str) -> None:
    """Starts `node_id` with --join and adds it to the voters. On failure it is stopped; its data
    directory goes too when it certainly never became a member (so its id is free again)."""
    spec = cluster.nodes[node_id]
    say(f"starting node {node_id} with --join and adding it to the voters")
    try:
        cluster.join_node(node_id, settings.ready_timeout_s)
    except (WaitTimeoutError, NodeDiedError, KqClientError) as error:
        lines = _tail(cluster.log_path(node_id), FAILED_START_LOG_LINES)
        click.echo(f"\n--- last lines of {cluster.log_path(node_id)} ---\n" + "\n".join(lines), err=True)
        cluster.stop_node(node_id)
        if not isinstance(error, KqClientError) or isinstance(error, MembershipRefusedError):
            shutil.rmtree(spec.data_dir, ignore_errors=True)
            raise DeployError(f"node {node_id} was not added: {error}") from error
        raise DeployError(
            f"adding node {node_id} failed: {error}; it is stopped, and may or may not be a voter: see "
            f"'kq cluster status' (its data stays in {spec.data_dir})"
        ) from error


@main.command()
@click.pass_obj
def add(settings: RunSettings) -> None:
    """Start one more node (the next id; its ports follow the same scheme) with --join, add it to the
    voters, and wait until it is ready under the leader."""
    members = settings.member_ids()
    if not settings.cluster(members).pids():
        raise DeployError(f"no member is running; '{settings.program} start' first")
    node_id = _next_node_id(settings, members)
    if _overlapping_ports(settings, [*members, node_id]):
        raise DeployError(
            f"node {node_id}'s ports would overlap another node's: set the KQ_BASE_*_PORT variables apart"
        )
    cluster = settings.cluster([*members, node_id])
    cluster.secret = _secret(settings.run_dir, create=False)
    taken = cluster.addresses_in_use([node_id])
    if taken:
        raise DeployError(f"node {node_id}'s port(s) in use: {', '.join(taken)}; stop whatever holds them")
    _join(cluster, settings, node_id)
    write_members(settings.run_dir, list(cluster.nodes))
    try:
        leader = cluster.wait_ready(settings.ready_timeout_s, [node_id])
    except (WaitTimeoutError, NodeDiedError) as error:
        raise DeployError(
            f"node {node_id} is a voter now but not ready: {error}; see '{settings.program} status' and "
            f"'{settings.program} logs {node_id}'"
        ) from error
    say(f"node {node_id} is a member and ready; leader: node {leader} ({cluster.nodes[leader].grpc_address})")
    _node_lines(cluster, [node_id])
    click.echo(
        f"\nThe members are now node(s) {' '.join(cluster.nodes)}; every command acts on them.\n"
        f"  kq{_bootstrap_option(cluster, settings)} cluster status\n"
        f"Kafka clients: bootstrap.servers={cluster.kafka_bootstrap}\n"
        f"Remove it again: {settings.program} remove {node_id}"
    )


def _leader_of_running(cluster: LocalCluster, settings: RunSettings, too_few: str) -> str | None:
    """The leader the running nodes follow once ready, or None (saying "only N of M `too_few`") when
    too few run for a majority."""
    alive = list(cluster.pids())
    if 2 * len(alive) <= len(cluster.nodes):
        say(f"only {len(alive)} of {len(cluster.nodes)} {too_few}")
        return None
    try:
        return cluster.wait_ready(settings.ready_timeout_s, alive)
    except (WaitTimeoutError, NodeDiedError) as error:
        raise DeployError(f"{error}; see '{settings.program} status'") from error


@main.command()
@click.argument("node")
@click.pass_obj
def remove(settings: RunSettings, node: str) -> None:
    """Remove NODE from the voters (it may be down) and stop it by its recorded PID; its data directory
    stays ('clean' deletes it), and its id is not given to a new node while it does."""
    node_id, cluster = _one_node(settings, node)
    others = [spec.grpc_address for n, spec in cluster.nodes.items() if n != node_id and cluster.running(n)]
    if not others:
        raise DeployError(f"no other member is running to remove node {node_id} through")
    try:
        with KqClient(others, retry_timeout_s=settings.ready_timeout_s) as client:
            client.remove_node(node_id)  # Removing the leader first hands its leadership over.
    except KqClientError as error:
        raise DeployError(f"node {node_id} was not removed: {error}") from error
    remaining = [n for n in cluster.nodes if n != node_id]
    write_members(settings.run_dir, remaining)  # Before the stop: a voter no longer, whatever happens next.
    pid = cluster.pid(node_id)
    data_dir = cluster.nodes[node_id].data_dir
    if pid is not None:
        cluster.stop_node(node_id)
    del cluster.nodes[node_id]
    stopped = f"stopped its process (PID {pid})" if pid is not None else "it was not running"
    say(f"removed node {node_id} from the voters and {stopped}; its data stays in {data_dir}")
    leader = _leader_of_running(cluster, settings, "members run: no leader until more start")
    if leader is None:
        return
    say(f"the members are node(s) {' '.join(remaining)}; leader: node {leader}")


@main.command()
@click.pass_context
def clean(context: click.Context) -> None:
    """Stop every member, then delete what these commands wrote in the run directory (nothing else):
    the data and logs of every node id they give (removed nodes' too), the secret and the members."""
    context.invoke(stop)
    settings: RunSettings = context.obj
    for number in range(1, NODES_MAX + 1):
        shutil.rmtree(settings.run_dir / f"node{number}", ignore_errors=True)
        (settings.run_dir / f"node{number}.log").unlink(missing_ok=True)
    for name in ("secret", "install.log", MEMBERS_FILE, f".{MEMBERS_FILE}.tmp"):
        (settings.run_dir / name).unlink(missing_ok=True)
    try:
        settings.run_dir.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        say(f"kept {settings.run_dir}: it holds files these commands did not create")
    say("removed the cluster's data, logs and secret")
