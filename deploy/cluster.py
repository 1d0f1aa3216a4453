"""`LocalCluster`: real `kq-node` processes on one machine, for tests, chaos, bench and run-cluster.sh.

Each node gets its own LMDB data directory (`<base_dir>/node<id>`), its own log file
(`<base_dir>/node<id>.log`, appended to across restarts) and, when asked, a PID file
(`<base_dir>/node<id>.pid`) so that a later process can stop it. Ports come from the kernel (bind to
port 0) just before the nodes start, unless fixed ports are given (`python -m kq.deploy` uses
9101-9103 and 7101-7103 by default). The constructor starts nothing; `start()` does, and `stop()` (or
leaving the `with` block) ends every process it started or adopted, by PID.

"The leader" has one definition, `agreed_leader`: the node that says it leads, named as leader by a
majority of the cluster's nodes in its own term. A paused or cut-off old leader still says "leader",
but no majority follows it in that term, so it is never taken for the leader.

`hosts` and `launcher` let the chaos runner put each node in its own network namespace
(`kq.chaos.netns`); `node_command` lets a test run nodes from another installation, and
`set_node_command` one node alone from its next start on (a rolling upgrade, node by node).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from kq.client import KqClient, KqClientError, NodeStatus, TlsConfig
from kq.client.tls import is_loopback
from kq.deploy import certs
from kq.deploy.processes import STOP_TIMEOUT_S, ProcessTable
from kq.deploy.waiting import wait_for
from kq.proto.placement import group_address, group_data_dir

LOOPBACK_HOST = "127.0.0.1"
DEFAULT_SECRET = "kq-local-secret"
READY_TIMEOUT_S = 30.0
APPLIED_TIMEOUT_S = 30.0
CERT_DAYS = 365  # Certificates the harness makes (a run directory's certs/ may live long).
STATUS_TIMEOUT_S = 1.0  # One node's ClusterStatus: on loopback it answers in milliseconds or is down.
READY_POLL_S = 0.2

Launcher = Callable[[str], Sequence[str]]  # node id -> command prefix, e.g. ["ip", "netns", "exec", ns].


class NodeDiedError(RuntimeError):
    """A node process this cluster expected to run has exited by itself (a crash, not a stop)."""


def free_ports(count: int, width: int = 1) -> list[int]:
    """`count` distinct TCP ports free on 127.0.0.1 right now, below the kernel's ephemeral range; with
    `width` > 1, each the first of `width` consecutive free ports (a node's worker processes bind its
    ports plus their group number: broker/workers.py).

    A port the kernel hands out for port 0 is an ephemeral one: once released it may be given to the
    next outgoing connection (a gRPC client's, say) before the node binds it, and the node then
    fails with "Address already in use" (seen in CI). Ports below the ephemeral range are never
    handed out that way; those given out by this process are not given out again."""
    low, high = FREE_PORT_MIN, _ephemeral_low() - 1
    chosen: list[int] = []
    for _ in range(FREE_PORT_ATTEMPTS_MAX):
        if len(chosen) == count:
            return chosen
        port = random.randint(low, high - width + 1)
        block = range(port, port + width)  # Ports chosen here are in _handed_out already.
        if any(p in _handed_out or address_in_use(f"{LOOPBACK_HOST}:{p}", reuse=False) for p in block):
            continue
        chosen.append(port)
        _handed_out.update(block)
    raise RuntimeError(f"found only {len(chosen)} of {count} free ports in {low}-{high}")


FREE_PORT_MIN = 15_000  # Below it: well-known services' ports.
FREE_PORT_ATTEMPTS_MAX = 10_000
_handed_out: set[int] = set()  # Ports this process gave out (bounded by the range's size).


def _ephemeral_low() -> int:
    """The lowest port the kernel picks for outgoing connections (Linux's default: 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def address_in_use(address: str, reuse: bool = True) -> str | None:
    """Why `host:port` cannot be bound now (e.g. 'Address already in use'), or None when it can.

    `reuse`: with SO_REUSEADDR, as the nodes bind, so a port in TIME_WAIT after a restart counts as
    free; without it (choosing a new port) such a port counts as taken."""
    host, _, port = address.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        if reuse:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, int(port)))
        except OSError as error:
            return error.strerror or str(error)
    return None


def default_node_command() -> tuple[str, ...]:
    """`kq-node` of this interpreter's installation, or `python -m kq.broker` where it has none."""
    script = Path(sys.executable).parent / "kq-node"
    return (str(script),) if script.is_file() else (sys.executable, "-m", "kq.broker")


def agreed_leader(statuses: Mapping[str, NodeStatus | None], cluster_size: int) -> str | None:
    """The leader: a node whose status says it leads and that a majority of the cluster's
    `cluster_size` nodes (itself included) name as their leader in its term; else None.

    `statuses` is each node's own ClusterStatus (None for a node that did not answer). This is the
    only definition of "the leader" in tests, chaos, bench and run-cluster.sh.
    """
    answered = [status for status in statuses.values() if status is not None]
    for candidate in answered:
        if candidate.role != "leader":
            continue
        followers = sum(
            1
            for status in answered
            if status.leader_id == candidate.node_id and status.term == candidate.term
        )
        if followers > cluster_size // 2:
            return candidate.node_id
    return None


def describe_statuses(statuses: Mapping[str, NodeStatus | None]) -> str:
    """One line: each node's role, leader and term as it reported them (for timeout messages)."""
    parts = []
    for node_id, status in statuses.items():
        if status is None:
            parts.append(f"node {node_id} down")
        else:
            ready = "ready" if status.ready else "not ready"
            parts.append(
                f"node {node_id} {status.role}, leader {status.leader_id or '-'}, term {status.term}, {ready}"
            )
    return "; ".join(parts) or "no status yet"


@contextmanager
def work_dir(chosen: Path | None, prefix: str) -> Iterator[Path]:
    """`chosen` (created if missing, kept afterwards), or a fresh temporary directory removed afterwards."""
    if chosen is not None:
        chosen.mkdir(parents=True, exist_ok=True)
        yield chosen
        return
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """Addresses and directory of one node."""

    node_id: str
    grpc_address: str
    raft_address: str
    data_dir: Path
    kafka_address: str = ""  # "": the node runs no Kafka listener.
    rack: str = ""  # "": none (the node's --rack, Kafka's broker.rack).
    http_address: str = ""  # "": no HTTP port (/metrics, /healthz, /readyz).

    @property
    def metrics_url(self) -> str:
        """The node's Prometheus endpoint ("" without an HTTP port)."""
        return f"http://{self.http_address}/metrics" if self.http_address else ""


class LocalCluster:
    """Starts, watches, kills and restarts the nodes of one cluster; `stop()` ends every one, by PID.

    `hosts` (one per node, default 127.0.0.1 for all) are the addresses the nodes bind; `launcher`
    gives a command prefix per node id, which must exec the node in place (as `ip netns exec` does) so
    that the PID held here is the node's own. `grpc_ports`/`raft_ports` fix the ports (default: free
    ones from the kernel). `record_pids` writes `node<id>.pid` files, and `detach` starts the nodes in
    their own session, so they outlive this process (`python -m kq.deploy start`). `racks` (one per
    node, "" for none) gives each node its --rack and lists it in every node's --peers. `durability`
    ("replicated" or "fsync", default: the node's own default) is each node's `--durability`.
    `node_extra_args` (by node id) are flags for one node only, after `node_args` (so they override
    them); `set_node_args` changes them for the node's next start. `node_ids` (one per node, default
    1..size) names the nodes, for a cluster whose members changed (`python -m kq.deploy` after `remove`);
    the per-node sequences above follow its order. `processes`: each node's worker processes
    (`--processes`; its ports are the first of as many free ones). `tls_dir`: certificates (made
    there unless there) and TLS on gRPC and Kafka, with client certificates required unless
    `require_client_certs` is False. The harness's own clients present the `admin` certificate and
    the cluster secret's proof (broker/auth.py), so they are super-users of nodes started with `--auth`.
    """

    def __init__(
        self,
        base_dir: Path,
        size: int = 3,
        secret: str = DEFAULT_SECRET,
        node_args: Sequence[str] = (),
        *,
        hosts: Sequence[str] | None = None,
        launcher: Launcher | None = None,
        node_command: Sequence[str] | None = None,
        grpc_ports: Sequence[int] | None = None,
        raft_ports: Sequence[int] | None = None,
        kafka_ports: Sequence[int] | None = None,
        kafka: bool = True,
        http_ports: Sequence[int] | None = None,
        racks: Sequence[str] | None = None,
        record_pids: bool = False,
        detach: bool = False,
        durability: str | None = None,
        node_extra_args: Mapping[str, Sequence[str]] | None = None,
        node_ids: Sequence[str] | None = None,
        tls_dir: Path | None = None,
        require_client_certs: bool = True,
        processes: int = 1,
    ) -> None:
        host_list = list(hosts) if hosts is not None else [LOOPBACK_HOST] * size
        assert len(host_list) == size, "one host per node"
        if grpc_ports is None or raft_ports is None:
            ports = free_ports(2 * size, processes)
            grpc_ports, raft_ports = ports[:size], ports[size:]
        assert len(grpc_ports) == len(raft_ports) == size, "one gRPC and one Raft port per node"
        if kafka and kafka_ports is None:
            kafka_ports = free_ports(size, processes)
        assert not kafka or (kafka_ports is not None and len(kafka_ports) == size), "one Kafka port per node"
        http_ports = list(http_ports) if http_ports is not None else free_ports(size, processes)
        assert len(http_ports) == size, "one HTTP port per node"
        rack_list = list(racks) if racks is not None else [""] * size
        assert len(rack_list) == size, "one rack per node"
        ids = list(node_ids) if node_ids is not None else [str(i + 1) for i in range(size)]
        assert len(ids) == len(set(ids)) == size, "one distinct id per node"
        self.base_dir = base_dir
        self.secret = secret
        self.processes = processes  # Worker processes per node (--processes), each a Raft group's replica.
        self.node_args = (
            tuple(node_args)
            + (("--durability", durability) if durability else ())
            + (("--processes", str(processes)) if processes > 1 else ())
        )
        self._extra_args = {node_id: tuple(args) for node_id, args in (node_extra_args or {}).items()}
        self.launcher = launcher
        self.node_command = tuple(node_command) if node_command is not None else default_node_command()
        self._node_commands: dict[str, tuple[str, ...]] = {}  # Set by set_node_command: one node's own.
        self.detach = detach
        self.nodes = {
            ids[i]: NodeSpec(
                ids[i],
                f"{host_list[i]}:{grpc_ports[i]}",
                f"{host_list[i]}:{raft_ports[i]}",
                base_dir / f"node{ids[i]}",
                f"{host_list[i]}:{kafka_ports[i]}" if kafka and kafka_ports is not None else "",
                rack_list[i],
                f"{host_list[i]}:{http_ports[i]}",
            )
            for i in range(size)
        }
        self._processes = ProcessTable(base_dir if record_pids else None, pid_prefix="node")
        self.tls_dir = tls_dir
        self.tls = self._make_tls(tls_dir) if tls_dir is not None else None
        self._require_client_certs = require_client_certs
        # Nodes on other addresses than loopback (a network lab's) serve plain text only if told so.
        exposed = any(not is_loopback(f"{host}:0") for host in host_list)
        self._insecure = exposed and tls_dir is None

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def _make_tls(self, tls_dir: Path) -> TlsConfig:
        """Certificates for every node and the `admin` client in `tls_dir` (made unless there); the
        harness's own clients present `admin`'s."""
        hosts = {node_id: [spec.grpc_address.rpartition(":")[0]] for node_id, spec in self.nodes.items()}
        if not (tls_dir / "ca.pem").exists():
            certs.init(tls_dir, hosts, ["admin"], days=CERT_DAYS)
        for node_id, node_hosts in hosts.items():  # Nodes added since the certificates were made.
            if not (tls_dir / f"node-{node_id}.pem").exists():
                certs.issue_node(tls_dir, node_id, node_hosts, days=CERT_DAYS)
        return TlsConfig.from_files(tls_dir / "ca.pem", tls_dir / "admin.pem", tls_dir / "admin-key.pem")

    def _tls_args(self, node_id: str) -> tuple[str, ...]:
        """A node's TLS flags: its certificate, the CA, mutual TLS required, on gRPC and Kafka alike."""
        if self.tls_dir is None:
            return ()
        directory = self.tls_dir
        return (
            "--tls-cert",
            str(directory / f"node-{node_id}.pem"),
            "--tls-key",
            str(directory / f"node-{node_id}-key.pem"),
            "--tls-ca",
            str(directory / "ca.pem"),
            *(("--tls-require-client-cert",) if self._require_client_certs else ()),
            *(("--kafka-tls",) if self.nodes[node_id].kafka_address else ()),
        )

    # Addresses and files ----------------------------------------------------------------------------

    @property
    def bootstrap(self) -> list[str]:
        """Every node's gRPC address."""
        return [spec.grpc_address for spec in self.nodes.values()]

    @property
    def kafka_bootstrap(self) -> str:
        """Every node's Kafka listener, as Kafka clients' `bootstrap.servers` ("" without listeners)."""
        return ",".join(spec.kafka_address for spec in self.nodes.values() if spec.kafka_address)

    def peers_argument(self) -> str:
        """The --peers value naming every node (with its Kafka listener and rack, when it has them)."""
        return ",".join(
            "=".join(filter(None, (s.node_id, s.raft_address, s.grpc_address, s.kafka_address)))
            + (f"@{s.rack}" if s.rack else "")
            for s in self.nodes.values()
        )

    def store_path(self, node_id: str, group: int = 0) -> Path:
        """The directory of a node's LMDB store of Raft `group` (with worker processes, each group's
        under the node's data directory: kq.proto.placement.group_data_dir)."""
        return group_data_dir(self.nodes[node_id].data_dir, group) / "store"

    def log_path(self, node_id: str) -> Path:
        """The node's log file (appended to across restarts)."""
        return self.base_dir / f"node{node_id}.log"

    def addresses_in_use(self, node_ids: Sequence[str]) -> list[str]:
        """The gRPC and Raft addresses of `node_ids` that cannot be bound now, each with the reason."""
        taken = []
        for node_id in node_ids:
            spec = self.nodes[node_id]
            addresses = (spec.grpc_address, spec.raft_address, spec.kafka_address, spec.http_address)
            for address in filter(None, addresses):
                reason = address_in_use(address)
                if reason is not None:
                    taken.append(f"{address} ({reason})")
        return taken

    # Processes --------------------------------------------------------------------------------------

    def node_command_line(self, node_id: str) -> list[str]:
        """The command that runs one node (the secret travels in the environment, not in argv)."""
        spec = self.nodes[node_id]
        prefix = list(self.launcher(node_id)) if self.launcher is not None else []
        return [
            *prefix,
            *self._node_commands.get(node_id, self.node_command),
            "--node-id",
            node_id,
            "--grpc-address",
            spec.grpc_address,
            "--raft-address",
            spec.raft_address,
            "--peers",
            self.peers_argument(),
            "--data-dir",
            str(spec.data_dir),
            *(("--kafka-address", spec.kafka_address) if spec.kafka_address else ()),
            *(("--rack", spec.rack) if spec.rack else ()),
            *(("--http-address", spec.http_address) if spec.http_address else ()),
            *self._tls_args(node_id),
            *(("--insecure",) if self._insecure else ()),
            # Text logs unless node_args or KQ_LOG_FORMAT say otherwise: the harness's log scanners
            # (soak, fuzz, chaos) and `run-cluster.sh logs` read text lines.
            *(() if os.environ.get("KQ_LOG_FORMAT") else ("--log-format", "text")),
            *self.node_args,
            *self._extra_args.get(node_id, ()),
        ]

    def set_node_args(self, node_id: str, args: Sequence[str]) -> None:
        """Flags for `node_id` alone from its next start on (after the cluster's, so they win)."""
        assert node_id in self.nodes, f"no node {node_id}"
        self._extra_args[node_id] = tuple(args)

    def set_node_command(self, node_id: str, command: Sequence[str]) -> None:
        """The command that runs `node_id` alone from its next start on, instead of `node_command` (a
        node restarted on another installation's `kq-node`); the node's arguments stay the same."""
        assert node_id in self.nodes, f"no node {node_id}"
        self._node_commands[node_id] = tuple(command)

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        """Starts every node not running, waits until all are ready under one leader; returns the leader."""
        for node_id in self.nodes:
            if not self.running(node_id):
                self.start_node(node_id)
        return self.wait_ready(timeout_s)

    def start_node(self, node_id: str) -> int:
        """Starts one node process; returns its PID (it may not be ready yet: see `wait_ready`)."""
        spec = self.nodes[node_id]
        spec.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path(node_id).open("a") as log:
            log.write(self._start_marker(node_id))
        return self._processes.start(
            node_id,
            self.node_command_line(node_id),
            self.log_path(node_id),
            # KQ_PROCESSES: the harness's nodes run as many workers as it was asked for, whatever the
            # machine's cores (kq-node's default is `auto`); an environment variable, not a flag, so
            # that a release from before --processes (the upgrade test's) starts too.
            environment={**os.environ, "KQ_SECRET": self.secret, "KQ_PROCESSES": str(self.processes)},
            detach=self.detach,
        )

    def _start_marker(self, node_id: str) -> str:
        """The line the log gets before each start: in the node's log format (JSON when its arguments
        or KQ_LOG_FORMAT ask for it, so that every line of a JSON log parses)."""
        arguments = [*self.node_args, *self._extra_args.get(node_id, ())]
        formats = [arguments[i + 1] for i, word in enumerate(arguments[:-1]) if word == "--log-format"]
        chosen = formats[-1] if formats else os.environ.get("KQ_LOG_FORMAT", "text")
        if chosen in ("json", "auto"):  # "auto" is JSON here: the log is a file.
            entry = {
                "ts": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "level": "INFO",
                "node": node_id,
                "logger": "kq.deploy.cluster",
                "message": f"starting node {node_id}",
            }
            return json.dumps(entry) + "\n"
        return f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')}: starting node {node_id} ===\n"

    def adopt_running(self) -> dict[str, int]:
        """Takes over the nodes a PID file names that still run on this cluster's data (by PID)."""
        adopted = {}
        for node_id, spec in self.nodes.items():
            pid = self._processes.adopt(node_id, ["--data-dir", str(spec.data_dir)])
            if pid is not None:
                adopted[node_id] = pid
        return adopted

    def running(self, node_id: str) -> bool:
        """Whether the node's process is alive."""
        return self._processes.running(node_id)

    def pid(self, node_id: str) -> int | None:
        """The PID of a running node."""
        return self._processes.pid(node_id)

    def pids(self) -> dict[str, int]:
        """The PID of every running node, by node id."""
        return self._processes.pids()

    def exit_code(self, node_id: str) -> int | None:
        """How a node that ended by itself exited (70: an environment fault; negative: the signal)."""
        return self._processes.exit_code(node_id)

    def signal_node(self, node_id: str, signal_number: int) -> None:
        """Sends a signal to one node by its PID (SIGSTOP and SIGCONT pause and resume it)."""
        self._processes.signal(node_id, signal_number)

    def kill_node(self, node_id: str) -> None:
        """`kill -9` of one node; returns once the process is gone."""
        self._processes.kill(node_id)

    def stop_node(self, node_id: str, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM, then SIGKILL when the node does not exit within `timeout_s`."""
        self._processes.stop([node_id], timeout_s)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stops every node this cluster started or adopted: SIGTERM to all at once, SIGKILL later."""
        self._processes.stop(self._processes.names(), timeout_s)

    # Membership -------------------------------------------------------------------------------------

    def new_node_spec(self) -> NodeSpec:
        """A spec for one more node (the next free id, free ports on the first node's host, a Kafka
        listener if the cluster has them), listed in `nodes` so `peers_argument` names it; not started."""
        first = next(iter(self.nodes.values()))
        host = first.grpc_address.rpartition(":")[0]
        node_id = str(max(int(n) for n in self.nodes if n.isdigit()) + 1)
        grpc_port, raft_port, kafka_port, http_port = free_ports(4, self.processes)
        spec = NodeSpec(
            node_id,
            f"{host}:{grpc_port}",
            f"{host}:{raft_port}",
            self.base_dir / f"node{node_id}",
            f"{host}:{kafka_port}" if first.kafka_address else "",
            "",
            f"{host}:{http_port}",
        )
        self.nodes[node_id] = spec
        if self.tls_dir is not None:
            certs.issue_node(self.tls_dir, node_id, [host], days=CERT_DAYS)
        return spec

    def add_node(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        """Starts one more node with --join and adds it to the voters (`kq cluster add-node`); waits
        until it is ready under the leader. Returns its id."""
        spec = self.new_node_spec()
        self.join_node(spec.node_id, timeout_s)
        self.wait_ready(timeout_s)
        return spec.node_id

    def join_node(self, node_id: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Starts node `node_id` (in `nodes`, not yet a voter) with --join (`start_joining`) and adds it
        to the voters through the running members. Raises NodeDiedError or WaitTimeoutError before
        the add was asked, a KqClientError from the add itself."""
        spec = self.nodes[node_id]
        members = [s.grpc_address for n, s in self.nodes.items() if n != node_id and self.running(n)]
        self.start_joining(node_id, timeout_s)
        with KqClient(members, retry_timeout_s=timeout_s, tls=self.tls, secret=self.secret) as client:
            client.add_node(node_id, spec.raft_address, spec.grpc_address, spec.kafka_address, spec.rack)

    def start_joining(self, node_id: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Starts node `node_id` with --join and waits until it answers a status call (AddNode asks it
        that first); NodeDiedError if it exits, WaitTimeoutError if it does not answer in time."""
        address = self.nodes[node_id].grpc_address
        # Its new store waits for the leader, starting no election; after any flags of its own.
        self.set_node_args(node_id, (*self._extra_args.get(node_id, ()), "--join"))
        self.start_node(node_id)
        with KqClient(
            [address],
            retry_timeout_s=STATUS_TIMEOUT_S,
            rpc_timeout_s=STATUS_TIMEOUT_S,
            tls=self.tls,
            secret=self.secret,
        ) as client:
            wait_for(
                lambda: self._answers(client, node_id),
                f"node {node_id} to answer at {address}",
                timeout_s,
                poll_s=READY_POLL_S,
            )

    def remove_node(self, node_id: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Removes a node from the voters (`kq cluster remove-node`; it may be down), stops it by its PID
        and drops it from `nodes` (its data directory stays)."""
        others = [spec.grpc_address for n, spec in self.nodes.items() if n != node_id and self.running(n)]
        with KqClient(
            others or self.bootstrap, retry_timeout_s=timeout_s, tls=self.tls, secret=self.secret
        ) as client:
            client.remove_node(node_id)
        if self.running(node_id):
            self.stop_node(node_id)
        del self.nodes[node_id]

    def _answers(self, client: KqClient, node_id: str) -> bool:
        """Whether the started node answers a status call; NodeDiedError once it exited."""
        if not self.running(node_id):
            raise NodeDiedError(f"node {node_id} exited; see {self.log_path(node_id)}")
        try:
            client.node_status(self.nodes[node_id].grpc_address)
        except KqClientError:
            return False
        return True

    # What the nodes say -----------------------------------------------------------------------------

    def statuses(self, group: int = 0) -> dict[str, NodeStatus | None]:
        """Each node's own ClusterStatus (with worker processes: its process of Raft `group`'s), None
        for a node that is not running or does not answer."""
        result: dict[str, NodeStatus | None] = {}
        timeout_s = STATUS_TIMEOUT_S
        with KqClient(
            self.bootstrap,
            retry_timeout_s=timeout_s,
            rpc_timeout_s=timeout_s,
            tls=self.tls,
            secret=self.secret,
        ) as client:
            for node_id, spec in self.nodes.items():
                try:
                    address = group_address(spec.grpc_address, group)
                    result[node_id] = client.node_status(address) if self.running(node_id) else None
                except KqClientError:
                    result[node_id] = None
        return result

    def leader_id(self) -> str | None:
        """The leader now (see `agreed_leader`), or None."""
        return agreed_leader(self.statuses(), len(self.nodes))

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S, node_ids: Sequence[str] | None = None) -> str:
        """Waits until there is a leader and the given nodes (default: every running one) are ready and
        follow it; returns the leader. Raises `NodeDiedError` at once if a node exited by itself."""
        seen: dict[str, NodeStatus | None] = {}

        def ready_leader() -> str | None:
            exited = self._processes.exited()
            if exited:
                raise NodeDiedError(f"node(s) {', '.join(exited)} exited; logs in {self.base_dir}")
            seen.update(self.statuses())
            leader = agreed_leader(seen, len(self.nodes))
            wanted = node_ids if node_ids is not None else [n for n in self.nodes if self.running(n)]
            if leader is None or not all(
                (status := seen[node]) is not None and status.ready and status.leader_id == leader
                for node in wanted
            ):
                return None
            return leader

        return wait_for(
            ready_leader,
            f"a leader with node(s) {', '.join(node_ids or self.nodes)} ready (logs in {self.base_dir})",
            timeout_s,
            poll_s=READY_POLL_S,
            last_state=lambda: describe_statuses(seen),
        )

    def wait_applied(
        self, index: int, node_ids: Sequence[str], timeout_s: float = APPLIED_TIMEOUT_S, group: int = 0
    ) -> None:
        """Waits until every given node has applied at least Raft index `index` (of Raft `group`:
        with worker processes, each node's process of it)."""
        seen: dict[str, NodeStatus | None] = {}

        def applied() -> bool:
            seen.update(self.statuses(group))
            return all(
                (status := seen[node]) is not None and status.applied_index >= index for node in node_ids
            )

        wait_for(
            applied,
            f"node(s) {', '.join(node_ids)} to apply index {index}" + (f" of group {group}" if group else ""),
            timeout_s,
            poll_s=READY_POLL_S / 2,
            last_state=lambda: ", ".join(
                f"node {n} applied {s.applied_index if s is not None else 'nothing (down)'}"
                for n, s in seen.items()
            ),
        )
