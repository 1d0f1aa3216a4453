"""A follower's disk fills under load: it must stop with one clear line, the majority must keep
acknowledging writes, and once given room it must catch up with nothing acknowledged lost.

A node cannot refuse a committed entry because its own disk is full (its peers apply it: the replicas
would diverge), so it stops (fail-stop: exit 70 and one CRITICAL line, raft/faults.py) and catches up
when restarted with room. One round of this fault:

1. a follower is stopped and restarted with little room, one of two ways:
   - `tmpfs` (root only): its data directory moves onto a tmpfs holding its data plus
     TMPFS_ROOM_BYTES, so a write fails with ENOSPC from the filesystem (the journal's append or
     LMDB's commit, whichever comes first); healed by growing the tmpfs (`mount -o remount,size=`);
   - `map` (anywhere): it alone gets `--max-disk-bytes FOLLOWER_BOUND`, so its LMDB map fills
     (MapFullError); healed by restarting it without the bound;
2. a filler writes FILL_RECORD_BYTES records to the topic FILL_TOPIC through the leader (whose disk
   has room) until the follower exits; it must exit with EXIT_ENVIRONMENT_FAULT and log exactly one
   `stopping:` line saying what is full, and no traceback;
3. the workload's writes must still be acknowledged (by the leader and the other follower);
4. healed and restarted, the follower must catch up; the filler's topic is deleted (which frees the
   space on every node) and, for `tmpfs`, the follower moves back to its own directory.

The checker then finds every acknowledged record of the workload's topic once on every node.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from kq.chaos.context import STEADY_ACKS, LivenessError, ScenarioContext
from kq.client import KqClient, KqClientError, ProducerRecord, TlsConfig, TopicExistsError
from kq.deploy.cluster import LocalCluster

logger = logging.getLogger(__name__)

FILL_TOPIC = "chaos-fill"  # Not the workload's topic: the checker reads only that one.
FILL_RECORD_BYTES = 256 * 1024  # Random bytes, so no codec shrinks them.
FILL_RECORDS_PER_REQUEST = 4  # One MiB a request: below the client's request limit.
FILL_BYTES_MAX = 1024**3  # The filler gives up after this much (the follower stops long before).
FILL_RETRY_TIMEOUT_S = 5.0  # One filler request's retries (an election meanwhile).
FOLLOWER_BOUND = "64MiB"  # The smallest --max-disk-bytes a node takes.
TMPFS_ROOM_BYTES = 48 * 1024 * 1024  # Above the follower's data when it moves onto the tmpfs.
TMPFS_HEALED_BYTES = 4 * 1024**3  # After healing: more than any run writes (tmpfs holds only what is used).
FAIL_STOP_TIMEOUT_S = 120.0  # The filler fills 64 MiB in seconds; this bounds a node that never stops.
POLL_S = 0.1
MOUNT_TIMEOUT_S = 10.0
# What a node that stopped for its environment exits with and logs (raft/faults.py, which chaos,
# importing only the client and the harness, restates).
EXIT_ENVIRONMENT_FAULT = 70
FAIL_STOP_MARK = "stopping: "
FULL_WORDS = ("store is full", "is full (")  # The map, or the disk of the store or of the journal.


class FailStopError(LivenessError):
    """The follower whose disk filled did not stop as it must (one line, exit 70), or never stopped."""

    kind = "fail-stop"


class TmpfsError(RuntimeError):
    """`mount` or `umount` failed."""


def fail_stop_problem(log_text: str, exit_code: int | None) -> str | None:
    """What is wrong with how a node stopped for a full disk (`log_text`: its log from its last start),
    or None when it stopped as it must: exit EXIT_ENVIRONMENT_FAULT, one `stopping:` line that says
    what is full (one for the node, also when several of its worker processes met the full disk: the
    one that took the node's fail-stop token says it, raft/faults.py), and no traceback."""
    lines = [line for line in log_text.splitlines() if FAIL_STOP_MARK in line]
    if exit_code != EXIT_ENVIRONMENT_FAULT:
        return f"exited with {exit_code}, not {EXIT_ENVIRONMENT_FAULT}"
    if len(lines) != 1:
        return f"{len(lines)} '{FAIL_STOP_MARK.strip()}' lines, not one: {lines[:3]}"
    if not any(words in lines[0] for words in FULL_WORDS):
        return f"its line does not say what is full: {lines[0]}"
    if "Traceback" in log_text:
        return "its log holds a traceback"
    return None


# tmpfs ------------------------------------------------------------------------------------------


def tmpfs_unavailable_reason() -> str | None:
    """Why a tmpfs cannot be mounted here (not root, no `mount`), or None when it can."""
    if os.geteuid() != 0:
        return "needs root (mount a tmpfs)"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "needs mount and umount"
    probe = Path(tempfile.mkdtemp(prefix="kq-tmpfs-probe-"))
    try:
        mount_tmpfs(probe, 1024 * 1024)
        unmount(probe)
    except TmpfsError as error:
        return f"cannot mount a tmpfs here: {error}"
    finally:
        probe.rmdir()
    return None


def mount_tmpfs(path: Path, size_bytes: int) -> None:
    """Mounts a tmpfs of `size_bytes` on the directory `path`."""
    _run("mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "kq-chaos-disk", str(path))


def resize_tmpfs(path: Path, size_bytes: int) -> None:
    """Gives the tmpfs on `path` a new size (the files stay): how this fault frees space."""
    _run("mount", "-o", f"remount,size={size_bytes}", str(path))


def unmount(path: Path) -> None:
    """Unmounts `path` (lazily: a file a killed process left open does not keep it busy)."""
    _run("umount", "-l", str(path))


def _run(*command: str) -> None:
    try:
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=MOUNT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as error:
        raise TmpfsError(f"{' '.join(command)}: {error}") from error
    if done.returncode != 0:
        raise TmpfsError(f"{' '.join(command)}: {done.stderr.strip() or done.returncode}")


def _tree_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


@contextmanager
def data_dir_on_tmpfs(
    cluster: LocalCluster, node: str, room_bytes: int, stop: Callable[[], None]
) -> Iterator[Path]:
    """`node`'s data directory on a tmpfs of its data's size plus `room_bytes`, for the block.

    The node must not run on entry. On exit `stop()` ends it (if it runs), its data is copied back to
    its own directory and the tmpfs goes: the node keeps everything it wrote there."""
    data_dir = cluster.nodes[node].data_dir
    on_disk = data_dir.with_name(data_dir.name + ".on-disk")
    data_dir.rename(on_disk)
    data_dir.mkdir()
    mounted = False
    try:
        mount_tmpfs(data_dir, _tree_bytes(on_disk) + room_bytes)
        mounted = True
        shutil.copytree(on_disk, data_dir, dirs_exist_ok=True)
        yield data_dir
    finally:
        stop()
        if mounted:
            shutil.rmtree(on_disk)
            shutil.copytree(data_dir, on_disk)  # What the node wrote on the tmpfs, kept.
            unmount(data_dir)
        data_dir.rmdir()
        on_disk.rename(data_dir)


# The filler -------------------------------------------------------------------------------------


class Filler(threading.Thread):
    """Writes large random records to FILL_TOPIC until stopped (or FILL_BYTES_MAX)."""

    def __init__(self, bootstrap: list[str], tls: TlsConfig | None) -> None:
        """Writes through `bootstrap`, reaching the nodes with `tls` (None: plain text)."""
        super().__init__(name="chaos-filler", daemon=True)
        self._nodes = bootstrap
        self._tls = tls
        self._stopping = threading.Event()
        self.written_bytes = 0
        self.failures = 0  # Requests that failed (retried by the next one).

    def run(self) -> None:
        with KqClient(self._nodes, retry_timeout_s=FILL_RETRY_TIMEOUT_S, tls=self._tls) as client:
            while not self._stopping.is_set() and self.written_bytes < FILL_BYTES_MAX:
                records = [
                    ProducerRecord(os.urandom(FILL_RECORD_BYTES)) for _ in range(FILL_RECORDS_PER_REQUEST)
                ]
                try:
                    client.send_batch(FILL_TOPIC, records)
                except KqClientError:
                    self.failures += 1
                    continue
                self.written_bytes += FILL_RECORD_BYTES * FILL_RECORDS_PER_REQUEST

    def stop(self) -> None:
        """Stops after the request in flight; joined within its retries."""
        self._stopping.set()
        self.join(timeout=2 * FILL_RETRY_TIMEOUT_S)


# The fault step ---------------------------------------------------------------------------------


def follower_disk_full(context: ScenarioContext) -> None:
    """Fills a follower's disk (a tmpfs where it can be mounted, else its LMDB map) under load."""
    reason = tmpfs_unavailable_reason()
    note = f"a follower's disk filled through a small LMDB map instead of a tmpfs: {reason}"
    if reason is not None and note not in context.notes:
        context.notes.append(note)
    _fill_follower(context, "map" if reason is not None else "tmpfs")


def follower_map_full(context: ScenarioContext) -> None:
    """Fills a follower's LMDB map (`--max-disk-bytes` on it alone) under load."""
    _fill_follower(context, "map")


def _fill_follower(context: ScenarioContext, way: str) -> None:
    cluster = context.cluster
    leader = context.steady_leader()
    follower = context.rng.choice(context.followers(leader))
    with KqClient(cluster.bootstrap, tls=cluster.tls) as admin, suppress(TopicExistsError):
        admin.create_topic(FILL_TOPIC, 1)
    cluster.stop_node(follower)
    context.down.add(follower)

    def stop_follower() -> None:
        if cluster.running(follower):
            context.kill(follower)

    if way == "tmpfs":
        with data_dir_on_tmpfs(cluster, follower, TMPFS_ROOM_BYTES, stop_follower) as data_dir:
            _fill_and_heal(context, follower, way, lambda: resize_tmpfs(data_dir, TMPFS_HEALED_BYTES))
        context.start(follower)  # Back on its own directory, with everything it wrote on the tmpfs.
    else:
        cluster.set_node_args(follower, ["--max-disk-bytes", FOLLOWER_BOUND])
        try:
            _fill_and_heal(context, follower, way, lambda: cluster.set_node_args(follower, []))
        finally:
            cluster.set_node_args(follower, [])
    context.wait_healthy()
    context.wait_caught_up(follower)


def _fill_and_heal(context: ScenarioContext, follower: str, way: str, make_room: Callable[[], None]) -> None:
    """Starts the confined follower, fills it until it stops, checks how it stopped and that writes go
    on without it, gives it room, restarts it and waits until it caught up; then frees the space."""
    cluster = context.cluster
    log_path = cluster.log_path(follower)
    context.start(follower)
    context.wait_healthy()
    context.wait_caught_up(follower)
    log_offset = log_path.stat().st_size
    event = context.fault(f"follower-{way}-full", [follower], leader_fault=False)
    filler = Filler(cluster.bootstrap, cluster.tls)
    filler.start()
    try:
        context.until(
            lambda: not cluster.running(follower),
            f"follower {follower} to stop on a full {way}",
            FAIL_STOP_TIMEOUT_S,
            POLL_S,
        )
    except LivenessError as error:
        raise FailStopError(f"{error} (the filler wrote {filler.written_bytes} bytes)") from error
    finally:
        filler.stop()
    context.in_place(event)
    exit_code = cluster.exit_code(follower)
    context.kill(follower)  # It ended by itself: the harness forgets it, the scenario counts it down.
    with open(log_path, "rb") as log:
        log.seek(log_offset)
        problem = fail_stop_problem(log.read().decode(errors="replace"), exit_code)
    if problem is not None:
        raise FailStopError(f"follower {follower} did not fail-stop cleanly: {problem}")
    context.wait_acks(STEADY_ACKS)  # The majority acknowledges without it.
    context.wait_resumed(event)
    event.notes.append(f"stopped after the filler wrote {filler.written_bytes >> 20} MiB; writes went on")

    def restart_with_room() -> None:
        make_room()
        context.start(follower)

    context.heal(event, restart_with_room)
    context.wait_healthy()
    context.wait_caught_up(follower)
    with KqClient(cluster.bootstrap, tls=cluster.tls) as admin:
        admin.delete_topic(FILL_TOPIC)  # Frees the space on every node.
    context.wait_caught_up(follower)
    if way == "tmpfs":
        cluster.stop_node(follower)  # To move back off the tmpfs (the caller restarts it).
        context.down.add(follower)
