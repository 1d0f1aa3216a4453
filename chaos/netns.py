"""Network namespaces for partition faults: one namespace per node, joined by a bridge the lab creates.

Layout of one lab (N is a free /24 in 198.18.0.0/15, the range RFC 2544 reserves for benchmarking,
chosen so it collides with no route of the host):

    root namespace: bridge kqb<N> with 198.18.<N>.1/24 — the runner, its producers and consumers
      └─ veth kqv<N>n<id> ──► namespace kq-chaos-<pid>-b<N>-n<id>: eth0 198.18.<N>.<10+id>/24, lo

Nothing leaves the lab: the nodes know only each other's 198.18.<N>.x addresses, and the bridge has
no uplink. A partition drops packets silently (like a pulled cable, not a refused connection): each
namespace gets an `ip rule ... from <peer> blackhole` per peer on the other side, so every packet
from a cut-off peer is dropped on input. The local-table rule is moved behind those rules (pref
LOCAL_RULE_PREF) so they apply to local delivery too. The runner in the root namespace can reach
every node throughout, as Jepsen's clients can: only node-to-node traffic is cut.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

from kq.deploy.processes import pid_alive

logger = logging.getLogger(__name__)

IP_TIMEOUT_S = 10.0
SUBNET_PREFIX = "198.18"  # Third octet: 0-255, the lab index (198.18.0.0/15 holds 512 such /24s).
LAB_INDEXES = range(10, 250)
NODE_HOST_BASE = 10  # Node n gets 198.18.<N>.<10+n>.
PARTITION_RULE_PREF = 10
LOCAL_RULE_PREF = 100
NAMESPACE_PREFIX = "kq-chaos-"
LOCK_PATH = Path("/tmp/kq-chaos-netns.lock")  # Serialises lab creation across concurrent runs.
_NAMESPACE_PATTERN = re.compile(rf"^{NAMESPACE_PREFIX}(\d+)-b(\d+)-n\w+$")


class NetnsError(RuntimeError):
    """An `ip` command failed while building, cutting or removing a lab."""


def _ip(*args: str, check: bool = True) -> str:
    """Runs `ip` with arguments; raises NetnsError on failure when `check`."""
    done = subprocess.run(["ip", *args], check=False, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def unavailable_reason() -> str | None:
    """Why partitions cannot run here (not root, no `ip`, netns refused), or None when they can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "needs iproute2 (`ip`)"
    probe = f"{NAMESPACE_PREFIX}{os.getpid()}-b0-nprobe"
    try:
        _ip("netns", "add", probe)
        _ip("netns", "del", probe)
    except (NetnsError, OSError, subprocess.SubprocessError) as error:
        return f"`ip netns` does not work here: {error}"
    return None


def remove_stale_labs() -> list[str]:
    """Removes namespaces and bridges left by chaos runs whose process is gone; returns their names."""
    removed: list[str] = []
    for name in _ip("netns", "list").split():
        match = _NAMESPACE_PATTERN.match(name)
        if match is None or pid_alive(int(match.group(1))):
            continue
        _ip("netns", "del", name, check=False)
        _ip("link", "del", f"kqb{match.group(2)}", check=False)
        removed.append(name)
    if removed:
        logger.info("removed stale chaos namespaces %s", removed)
    return removed


def _used_lab_indexes() -> set[int]:
    routes = _ip("-4", "route", "show", "table", "all")
    pattern = re.compile(rf"\b{re.escape(SUBNET_PREFIX)}\.(\d+)\.")
    return {int(match.group(1)) for match in pattern.finditer(routes)}


class NetworkLab:
    """A bridge and one namespace per node; partitions and heals between the nodes' namespaces."""

    def __init__(self, node_ids: Sequence[str]) -> None:
        self.node_ids = tuple(node_ids)
        self.index = -1
        self._cuts: set[tuple[str, str]] = set()  # (namespace node, peer node) pairs dropped on input.
        self._created: list[str] = []

    @property
    def bridge(self) -> str:
        """The bridge interface in the root namespace."""
        return f"kqb{self.index}"

    def namespace(self, node_id: str) -> str:
        """The namespace of one node."""
        return f"{NAMESPACE_PREFIX}{os.getpid()}-b{self.index}-n{node_id}"

    def host(self, node_id: str) -> str:
        """The address of one node inside its namespace."""
        return f"{SUBNET_PREFIX}.{self.index}.{NODE_HOST_BASE + int(node_id)}"

    def launcher(self, node_id: str) -> list[str]:
        """The command prefix that runs a process in the node's namespace (exec'd in place: same PID)."""
        return ["ip", "netns", "exec", self.namespace(node_id)]

    def hosts(self) -> list[str]:
        """Each node's address, in node order."""
        return [self.host(node_id) for node_id in self.node_ids]

    def create(self) -> None:
        """Builds the bridge and the namespaces; removes what it built if any step fails."""
        LOCK_PATH.touch(exist_ok=True)
        with open(LOCK_PATH) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            remove_stale_labs()
            used = _used_lab_indexes()
            free = [index for index in LAB_INDEXES if index not in used]
            if not free:
                raise NetnsError(f"no free /24 left in {SUBNET_PREFIX}.0.0/16")
            self.index = free[os.getpid() % len(free)]
            try:
                self._build()
            except BaseException:
                self.destroy()
                raise
        logger.info("network lab %s up: nodes at %s", self.bridge, ", ".join(self.hosts()))

    def _build(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._created.append(f"link:{self.bridge}")
        _ip("addr", "add", f"{SUBNET_PREFIX}.{self.index}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for node_id in self.node_ids:
            namespace, veth = self.namespace(node_id), f"kqv{self.index}n{node_id}"
            _ip("netns", "add", namespace)
            self._created.append(f"netns:{namespace}")
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
            self._created.append(f"link:{veth}")
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", namespace, "addr", "add", f"{self.host(node_id)}/24", "dev", "eth0")
            _ip("-n", namespace, "link", "set", "eth0", "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            # Partition rules must come before local delivery, so move the local table's rule back.
            _ip("-n", namespace, "rule", "add", "pref", str(LOCAL_RULE_PREF), "lookup", "local")
            _ip("-n", namespace, "rule", "del", "pref", "0")

    def partition(self, groups: Iterable[Iterable[str]]) -> None:
        """Cuts every node off from the nodes of the other groups (nodes in no group keep all links)."""
        sides = [set(group) for group in groups]
        for side in sides:
            for other in sides:
                if other is side:
                    continue
                for node_id in side:
                    for peer in other:
                        self._cut(node_id, peer)
        logger.info("partitioned %s", [sorted(side) for side in sides])

    def _cut(self, node_id: str, peer: str) -> None:
        if (node_id, peer) in self._cuts:
            return
        self._rule("add", node_id, peer)
        self._cuts.add((node_id, peer))

    def _rule(self, action: str, node_id: str, peer: str) -> None:
        """Adds or deletes the rule dropping, in node_id's namespace, every packet from `peer`."""
        pref = str(PARTITION_RULE_PREF)
        _ip("-n", self.namespace(node_id), "rule", action, "pref", pref, "from", self.host(peer), "blackhole")

    def heal(self) -> None:
        """Removes every cut."""
        for node_id, peer in sorted(self._cuts):
            self._rule("del", node_id, peer)
        self._cuts.clear()
        logger.info("healed all partitions")

    @property
    def partitioned(self) -> bool:
        """Whether any cut is in place."""
        return bool(self._cuts)

    def destroy(self) -> None:
        """Removes the veths, namespaces and bridge it created (the nodes must be stopped first)."""
        for item in reversed(self._created):
            kind, name = item.split(":", 1)
            if kind == "link":
                _ip("link", "del", name, check=False)
            else:
                _ip("netns", "del", name, check=False)
        self._created.clear()
        self._cuts.clear()
