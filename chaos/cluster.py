"""A local cluster of real `kq-node` processes on 127.0.0.1 with free ports: for tests, chaos and bench.

Every process is started and stopped by its PID. Ports are taken from the kernel (bind to port 0)
just before the nodes start. By default every node listens on 127.0.0.1; `hosts` and `launcher` let the
chaos runner give each node its own address inside a network namespace (see `chaos.netns`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kq.client import KqClient, KqClientError, NodeStatus

LOOPBACK_HOST = "127.0.0.1"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
POLL_S = 0.05


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on 127.0.0.1 right now."""
    sockets = []
    try:
        for _ in range(count):
            handle = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            handle.bind(("127.0.0.1", 0))
            sockets.append(handle)
        return [handle.getsockname()[1] for handle in sockets]
    finally:
        for handle in sockets:
            handle.close()


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """Addresses and directory of one node."""

    node_id: str
    grpc_address: str
    raft_address: str
    data_dir: Path


Launcher = Callable[[str], Sequence[str]]  # node id -> command prefix, e.g. ["ip", "netns", "exec", ns].


class LocalCluster:
    """Starts, kills and restarts the nodes of one cluster; `stop()` ends every process it started.

    `hosts` (one per node, default 127.0.0.1 for all) are the addresses the nodes bind; `launcher`
    gives a command prefix per node id. A prefix must exec the node in place (as `ip netns exec`
    does), so the PID this class holds is the node's own.
    """

    def __init__(
        self,
        base_dir: Path,
        size: int = 3,
        secret: str = "kq-local-secret",
        node_args: Sequence[str] = (),
        *,
        hosts: Sequence[str] | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        ports = free_ports(2 * size)
        host_list = list(hosts) if hosts is not None else [LOOPBACK_HOST] * size
        assert len(host_list) == size, "one host per node"
        self.base_dir = base_dir
        self.secret = secret
        self.node_args = tuple(node_args)
        self.launcher = launcher
        self.nodes = {
            str(i + 1): NodeSpec(
                str(i + 1),
                f"{host_list[i]}:{ports[2 * i]}",
                f"{host_list[i]}:{ports[2 * i + 1]}",
                base_dir / f"node{i + 1}",
            )
            for i in range(size)
        }
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, IO[bytes]] = {}

    @property
    def bootstrap(self) -> list[str]:
        """Every node's gRPC address."""
        return [spec.grpc_address for spec in self.nodes.values()]

    def peers_argument(self) -> str:
        """The --peers value naming every node."""
        return ",".join(f"{s.node_id}={s.raft_address}={s.grpc_address}" for s in self.nodes.values())

    def start(self) -> None:
        """Starts every node and waits until a leader is elected and all nodes are ready."""
        for node_id in self.nodes:
            self.start_node(node_id)
        self.wait_ready()

    def start_node(self, node_id: str) -> None:
        """Starts one node process (its log goes to <base_dir>/node<id>.log)."""
        spec = self.nodes[node_id]
        assert node_id not in self.processes or self.processes[node_id].poll() is not None, "already running"
        spec.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path(node_id), "ab")  # noqa: SIM115 - closed in _reap.
        self._logs[node_id] = log
        prefix = list(self.launcher(node_id)) if self.launcher is not None else []
        command = [
            *prefix,
            sys.executable,
            "-m",
            "kq.broker",
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
            "--secret",
            self.secret,
            *self.node_args,
        ]
        self.processes[node_id] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def log_path(self, node_id: str) -> Path:
        """The node's log file (appended to across restarts)."""
        return self.base_dir / f"node{node_id}.log"

    def signal_node(self, node_id: str, signal_number: int) -> None:
        """Sends a signal to one node by its PID."""
        os.kill(self.processes[node_id].pid, signal_number)

    def kill_node(self, node_id: str) -> None:
        """`kill -9` of one node, then reaps it."""
        process = self.processes[node_id]
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait(STOP_TIMEOUT_S)
        self._reap(node_id)

    def stop_node(self, node_id: str) -> None:
        """SIGTERM, then SIGKILL when the node does not exit in time."""
        process = self.processes[node_id]
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT_S)
        self._reap(node_id)

    def _reap(self, node_id: str) -> None:
        log = self._logs.pop(node_id, None)
        if log is not None:
            log.close()

    def stop(self) -> None:
        """Stops every node this cluster started."""
        for node_id in list(self.processes):
            self.stop_node(node_id)

    def running(self, node_id: str) -> bool:
        """Whether the node's process is alive."""
        process = self.processes.get(node_id)
        return process is not None and process.poll() is None

    def statuses(self) -> dict[str, NodeStatus | None]:
        """Each node's status, None for a node that does not answer."""
        result: dict[str, NodeStatus | None] = {}
        with KqClient(self.bootstrap, retry_timeout_s=1.0, rpc_timeout_s=1.0) as client:
            for node_id, spec in self.nodes.items():
                try:
                    result[node_id] = client.node_status(spec.grpc_address) if self.running(node_id) else None
                except KqClientError:
                    result[node_id] = None
        return result

    def leader_id(self) -> str | None:
        """The node that says it leads (and that a majority of running nodes follow), or None."""
        statuses = [s for s in self.statuses().values() if s is not None]
        leaders = {s.node_id for s in statuses if s.role == "leader"}
        for leader in leaders:
            followers = sum(1 for s in statuses if s.leader_id == leader)
            if followers > len(self.nodes) // 2:
                return leader
        return None

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S, node_ids: Sequence[str] | None = None) -> str:
        """Waits until a leader is elected and the given (default: running) nodes are ready; returns it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            exited = [n for n, p in self.processes.items() if p.poll() not in (None, -9, -15)]
            if exited:
                raise RuntimeError(f"node(s) {exited} exited; logs in {self.base_dir}")
            statuses = self.statuses()
            wanted = node_ids if node_ids is not None else [n for n in self.nodes if self.running(n)]
            leader = self.leader_id()
            if leader is not None and all(
                (s := statuses[n]) is not None and s.ready and s.leader_id == leader for n in wanted
            ):
                return leader
            time.sleep(POLL_S * 4)
        raise TimeoutError(f"cluster not ready within {timeout_s} s; logs in {self.base_dir}")

    def wait_applied(self, index: int, node_ids: Sequence[str], timeout_s: float = READY_TIMEOUT_S) -> None:
        """Waits until every given node has applied at least `index`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            statuses = self.statuses()
            if all((s := statuses[n]) is not None and s.applied_index >= index for n in node_ids):
                return
            time.sleep(POLL_S * 2)
        raise TimeoutError(f"nodes {list(node_ids)} did not apply index {index} within {timeout_s} s")
