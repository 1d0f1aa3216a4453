"""Worker processes: a node started with `--processes P` runs P processes, the replicas of P Raft groups.

One PySyncObj instance is one thread of Python, so one group uses about one core (DESIGN.md,
"Scale-out: many Raft groups"). A node with `--processes P` is a supervisor that starts P worker
processes; worker `g` is this node's replica of Raft group `g` and a complete node of that group: its
own LMDB store and journal, Raft port, gRPC endpoint, Kafka listener (its own Kafka broker id) and
HTTP port. Group 0 is the metadata group (topics, configs, users, ACLs, members) and holds partitions
too; the data of every topic is spread over all the groups (raft/placement.py).

Addresses follow the node's by a fixed offset: worker `g` binds each of the node's ports plus `g`,
and its peers are the other nodes' workers `g` (their ports plus `g`), so `--peers` stays one entry
a node. Its data directory is the node's for group 0 (a single-group node's directory is group 0's,
unchanged) and `<data-dir>/groups/<g>` for the others. Kafka broker ids: `node id + g * 1,000`
(`broker_id`), so group 0's workers keep the node's id and clients of a single-group cluster see
the same brokers.

The supervisor owns its workers: it starts them, forwards SIGTERM and SIGINT, and stops every one
(SIGTERM, then SIGKILL after WORKER_STOP_S) when any of them ends, exiting with that worker's code: a
node is up with all its groups or not at all, as a single process was. A worker asks the kernel to
kill it when its supervisor dies (`die_with_parent`), so `kill -9` of the node's PID (the chaos
suite, the harness) takes the workers with it and no replica outlives its node.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from kq.broker.config import ConfigError, NodeConfig
from kq.broker.consensus import Peer
from kq.proto.limits import (
    BROKER_ID_GROUP_STRIDE,
    PROCESSES_AUTO_MAX,
    PROCESSES_MAX,
    WORKER_POLL_S,
    WORKER_STOP_S,
)
from kq.proto.placement import GROUPS_DIR, PORT_MAX, group_address, group_data_dir
from kq.raft.data_dir import MARKER_NAME
from kq.raft.faults import FAIL_STOP_TOKEN, FAIL_STOP_TOKEN_FD
from kq.raft.journal import OS_DISK

logger = logging.getLogger(__name__)

LEADERS_DIR = "leaders"  # <data-dir>/groups/leaders: the workers' leader board (broker/groups_view.py).
PROCESSES_FILE = "processes"  # <data-dir>/groups/processes: the most workers it was started with.
AUTO_PROCESSES = "auto"  # `--processes auto`, the default: `resolve_processes`.
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" or "max <period>".
WORKER_FLAG = "--worker-group"  # Set by the supervisor only: this process is the replica of one group.
_PR_SET_PDEATHSIG = 1  # prctl(2)


def shifted(address: str, offset: int) -> str:
    """`host:port` with the port moved by `offset` (kq.proto.placement.group_address); ConfigError
    past 65,535."""
    try:
        return group_address(address, offset)
    except ValueError as error:
        message = f"{address} plus {offset} worker ports passes {PORT_MAX}: choose a lower port"
        raise ConfigError(message) from error


def shifted_peer(peer: Peer, offset: int) -> Peer:
    """`peer` with every address moved by `offset`: its process of the group `offset` away."""
    return Peer(
        peer.node_id,
        shifted(peer.raft_address, offset),
        shifted(peer.grpc_address, offset),
        shifted(peer.kafka_address, offset),
        peer.rack,
    )


def leader_board(node_dir: Path) -> Path:
    """The directory of a node's leader board (broker/groups_view.py), under its own data directory."""
    return node_dir / GROUPS_DIR / LEADERS_DIR


def broker_id(node_id: int, group: int) -> int:
    """The Kafka broker id of node `node_id`'s worker of group `group`."""
    return node_id + group * BROKER_ID_GROUP_STRIDE


def check_processes(config: NodeConfig, processes: int) -> None:
    """Raises ConfigError unless `processes` workers fit: 1..PROCESSES_MAX, node ids below the broker
    id stride (Kafka ids stay distinct), and every shifted port a port."""
    if not 1 <= processes <= PROCESSES_MAX:
        raise ConfigError(f"--processes must be 1..{PROCESSES_MAX}, not {processes}")
    if processes == 1:
        return
    for peer in (config.self_peer, *config.peers):
        if config.kafka is not None and int(peer.node_id) >= BROKER_ID_GROUP_STRIDE:
            raise ConfigError(
                f"with --processes and a Kafka listener, node ids must be below {BROKER_ID_GROUP_STRIDE} "
                f"(worker broker ids are id + group x {BROKER_ID_GROUP_STRIDE}): {peer.node_id!r}"
            )
        for address in (peer.raft_address, peer.grpc_address, peer.kafka_address):
            shifted(address, processes - 1)
    shifted(config.http_address, processes - 1)


def worker_config(config: NodeConfig, group: int) -> NodeConfig:
    """The configuration of this node's worker of `group`: every address moved by `group`, the
    peers' too, and the group's own data directory."""
    assert config.raft is not None
    if group == 0:  # The node's own addresses and directory; its apply knows it is one of several.
        return dataclasses.replace(config, group=0, raft=dataclasses.replace(config.raft, group=0))
    data_dir = group_data_dir(config.data_dir, group)
    peers = tuple(shifted_peer(peer, group) for peer in config.peers)
    raft = dataclasses.replace(
        config.raft,
        raft_address=shifted(config.raft_address, group),
        peer_raft_addresses=tuple(peer.raft_address for peer in peers),
        data_dir=data_dir,
        group=group,  # Its apply's scope: raft/state_machine.py GroupScope.
    )
    kafka = None
    if config.kafka is not None:
        kafka = dataclasses.replace(config.kafka, address=shifted(config.kafka.address, group))
    return dataclasses.replace(
        config,
        grpc_address=shifted(config.grpc_address, group),
        raft_address=raft.raft_address,
        peers=peers,
        data_dir=data_dir,
        raft=raft,
        kafka=kafka,
        http_address=shifted(config.http_address, group),
        group=group,
    )


def recorded_processes(data_dir: Path) -> int | None:
    """The most workers this node's data directory was started with (None: no record, so one if it
    holds a node's data); ConfigError when the record cannot be read."""
    path = data_dir / GROUPS_DIR / PROCESSES_FILE
    try:
        return int(path.read_text().strip())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read {path}: {error}") from error


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, and its cgroup's CPU quota (cgroup v2
    `cpu.max`, rounded up) when that is lower (a container limited to 2 CPUs on a 64-core host)."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = [*CGROUP_CPU_MAX.read_text().split(), "100000"][:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):  # No cgroup v2 here, or no quota file: the affinity alone.
        pass
    return cores


def resolve_processes(requested: str, data_dir: Path) -> int:
    """`--processes` as a number: a number as given (ConfigError unless one); AUTO_PROCESSES, the
    workers the data directory holds (its record; one for a directory with a node's data and no
    record: a single-group node, kept so, as its peers are), else for a new directory the usable
    cores, at most PROCESSES_AUTO_MAX. Every node of a cluster needs the same number: machines of
    different sizes name it."""
    if requested != AUTO_PROCESSES:
        try:
            return int(requested)
        except ValueError:
            raise ConfigError(
                f"--processes must be a number or {AUTO_PROCESSES}, not {requested[:40]!r}"
            ) from None
    recorded = recorded_processes(data_dir)
    if recorded is not None:
        return recorded
    if any((data_dir / name).exists() for name in (MARKER_NAME, "store", "raft")):
        return 1
    return min(usable_cores(), PROCESSES_AUTO_MAX)


def record_processes(data_dir: Path, processes: int) -> None:
    """Checks `processes` against the most this node's data directory was started with, and records
    it (`<data-dir>/groups/processes`). ConfigError, one line, when it is fewer: the groups above it
    hold partitions (every topic keeps the group count it was created with), so they must run."""
    path = data_dir / GROUPS_DIR / PROCESSES_FILE
    recorded = recorded_processes(data_dir) or 1
    if processes < recorded:
        raise ConfigError(
            f"data directory {data_dir} holds {recorded} Raft groups: start it with --processes {recorded} "
            "or more (a node's groups cannot be fewer than its topics are spread over)"
        )
    if processes > recorded:
        path.parent.mkdir(parents=True, exist_ok=True)
        OS_DISK.replace(path, f"{processes}\n".encode(), sync=True)


def node_data_dir(config: NodeConfig) -> Path:
    """The node's own data directory (group 0's), from any of its workers' configurations."""
    return config.data_dir.parents[1] if config.group else config.data_dir


def die_with_parent(parent_pid: int) -> None:
    """Asks Linux to SIGKILL this process when its parent (the supervisor) dies; exits at once if the
    parent is already gone (it died before the request)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        logger.warning("cannot ask to die with the supervisor: errno %d", ctypes.get_errno())
    if os.getppid() != parent_pid:
        os._exit(1)


def worker_command(arguments: Sequence[str], processes: int, group: int) -> list[str]:
    """The command line of the worker of `group`: this node's own, with its number of workers (an
    `auto` resolved once, by the supervisor) and the worker flag."""
    return [
        sys.executable,
        "-m",
        "kq.broker",
        *arguments,
        "--processes",
        str(processes),
        WORKER_FLAG,
        str(group),
    ]


def fail_stop_token() -> int:
    """The read end of a pipe holding the node's one fail-stop token (raft/faults.py): the worker
    that reads it logs the node's one fail-stop line. Its write end is closed, so the others read the
    pipe's end at once."""
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, FAIL_STOP_TOKEN)
    finally:
        os.close(write_fd)
    return read_fd


class Supervisor:
    """Starts the workers, forwards stop signals to them, and stops them all when one ends.

    Runs on the node process's main thread (no thread of its own); the workers' output goes where the
    supervisor's does (the node's log)."""

    def __init__(self, arguments: Sequence[str], processes: int, board: Path) -> None:
        self._arguments = tuple(arguments)
        self._processes = processes
        self._board = board  # The workers' leader board (broker/groups_view.py), emptied at start.
        self._workers: dict[int, subprocess.Popen[bytes]] = {}
        self._stopping = False

    def run(self) -> int:
        """Runs the workers until a stop signal (exit code 0) or a worker's end (its exit code)."""
        for signal_number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signal_number, self._on_signal)
        for entry in self._board.glob("*"):  # No group leader of an earlier run.
            entry.unlink(missing_ok=True)
        token_fd = fail_stop_token()
        environment = {
            **os.environ,
            "KQ_SUPERVISOR_PID": str(os.getpid()),
            FAIL_STOP_TOKEN_FD: str(token_fd),
        }
        try:
            for group in range(self._processes):
                self._workers[group] = subprocess.Popen(
                    worker_command(self._arguments, self._processes, group),
                    env=environment,
                    pass_fds=(token_fd,),
                )
        finally:
            os.close(token_fd)  # The workers hold it now.
        logger.info("started %d worker processes: %s", len(self._workers), self.pids())
        code = 0
        while not self._stopping:
            ended = self._ended()
            if ended is not None:
                group, code = ended
                logger.error("the worker of group %d ended (exit code %d): stopping the node", group, code)
                code = code if code >= 0 else 128 - code  # Killed by a signal: as a shell reports it.
                break
            time.sleep(WORKER_POLL_S)
        self._stop_all()
        return code

    def pids(self) -> dict[int, int]:
        """Each worker's PID, by group."""
        return {group: worker.pid for group, worker in self._workers.items()}

    def _on_signal(self, signal_number: int, _frame: object) -> None:
        self._stopping = True

    def _ended(self) -> tuple[int, int] | None:
        for group, worker in self._workers.items():
            code = worker.poll()
            if code is not None:
                return group, code
        return None

    def _stop_all(self) -> None:
        """SIGTERM to every running worker, then SIGKILL to those still running after WORKER_STOP_S."""
        for worker in self._workers.values():
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + WORKER_STOP_S
        for worker in self._workers.values():
            try:
                worker.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
