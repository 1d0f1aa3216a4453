"""What a fault step works with: the cluster, the network lab, the history, and bounded waits.

Every wait has a deadline, and every deadline is also capped by the scenario's own deadline, so a
run always ends. A wait that expires raises `LivenessError`: the cluster did not recover in time,
which the runner reports as an anomaly before it heals everything and checks safety anyway.
"""

from __future__ import annotations

import functools
import logging
import random
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from kq.chaos.history import PROBE_PREFIX, Ack, History, resumed_ack
from kq.chaos.netns import NetworkLab
from kq.chaos.workload import Producer, ProducerKind, ProducerSpec
from kq.client import KqClient, KqClientError
from kq.deploy.cluster import LocalCluster, NodeDiedError
from kq.deploy.waiting import WaitTimeoutError, wait_for

T = TypeVar("T")

logger = logging.getLogger(__name__)

HEALTHY_TIMEOUT_S = 60.0  # A restarted node, or a healed cluster, is ready and following a leader.
RESUME_TIMEOUT_S = 45.0  # Writes resume after a fault (the client alone retries for 30 s).
STEADY_ACKS = 20  # Records acknowledged after the cluster looks healthy, before the next fault.
STEADY_TIMEOUT_S = 30.0
LEADER_POLL_S = 0.2
PROBE_RATE_PER_S = 20.0
PROBE_SLACK_S = 15.0  # A probe's client waits this much longer than the fault lasts.
# After healing, the group members catch up with the log end: at most the backlog of a long fault
# (a few thousand records, read at thousands per second) and a rebalance or two.
GROUP_CATCH_UP_TIMEOUT_S = 60.0
GROUP_POLL_S = 0.25
GROUP_DESCRIBE_RETRY_TIMEOUT_S = 5.0


class LivenessError(RuntimeError):
    """Something the scenario waits for (a leader, an acknowledged write) did not happen in time."""

    kind = "liveness"


class NodeExitedError(LivenessError):
    """A node process exited by itself (not killed by the scenario): a crash."""

    kind = "node-exited"


@dataclass(slots=True)
class FaultEvent:
    """One injected fault: when, on which nodes, when healed, and when writes resumed after it."""

    kind: str
    targets: tuple[str, ...]
    leader_fault: bool  # The fault hit the leader: time to the next ack is a failover time.
    started_s: float
    index_at_fault: int
    in_place_s: float = 0.0  # When injecting finished (a partition takes several `ip` commands).
    # With a Raft group per worker process: the partitions of each group the fault's targets led, each
    # with the highest index acknowledged before the fault; writes resumed once every one resumed.
    led_groups: tuple[tuple[frozenset[int], int], ...] = ()
    healed_s: float | None = None
    resumed_s: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def time_to_ack_s(self) -> float | None:
        """Seconds from the fault to the next acknowledged write (None if writes never resumed)."""
        return None if self.resumed_s is None else self.resumed_s - self.started_s


def _resumed(
    acks: Sequence[Ack], event: FaultEvent, in_place_s: float, index: int, partitions: frozenset[int] | None
) -> Ack | None:
    """`resumed_ack` for `event` (one Raft group's partitions, or every ack when None)."""
    return resumed_ack(acks, event.started_s, in_place_s, index, event.leader_fault, partitions)


class ScenarioContext:
    """The state one scenario's fault steps share, and the waits they use."""

    def __init__(
        self,
        cluster: LocalCluster,
        lab: NetworkLab | None,
        history: History,
        topic: str,
        partitions: int,
        rng: random.Random,
        deadline_s: float,
        follow_members: Callable[[Sequence[str]], None] | None = None,
    ) -> None:
        """`follow_members` is told the members' gRPC addresses whenever a step changed the members
        (the workload's `follow`)."""
        self.cluster = cluster
        self.lab = lab
        self.history = history
        self.topic = topic
        self.partitions = partitions
        self.rng = rng
        self.deadline_s = deadline_s
        self.faults: list[FaultEvent] = []
        self.notes: list[str] = []
        self.down: set[str] = set()  # Nodes killed or stopped and not restarted yet.
        self.paused: set[str] = set()
        self.probes: list[Producer] = []
        self._follow_members = follow_members

    def _deadline(self, timeout_s: float) -> float:
        return min(time.monotonic() + timeout_s, self.deadline_s)

    def _timeout(self, timeout_s: float) -> float:
        return max(0.1, self._deadline(timeout_s) - time.monotonic())

    def bounded(self, wait: Callable[[float], T], timeout_s: float) -> T:
        """Runs one of the harness's waits with `timeout_s` capped by the scenario's deadline; its
        timeout becomes a `LivenessError`, a node that exited by itself a `NodeExitedError`."""
        try:
            return wait(self._timeout(timeout_s))
        except WaitTimeoutError as error:
            raise LivenessError(str(error)) from error
        except NodeDiedError as error:
            raise NodeExitedError(str(error)) from error

    def until(self, condition: Callable[[], T | None], what: str, timeout_s: float, poll_s: float) -> T:
        """The harness's `wait_for` on `condition`, bounded like every wait here (see `bounded`)."""
        return self.bounded(lambda bound_s: wait_for(condition, what, bound_s, poll_s=poll_s), timeout_s)

    def wait_healthy(self, timeout_s: float = HEALTHY_TIMEOUT_S) -> str:
        """Waits until every running node is ready and follows one leader; returns the leader."""
        return self.bounded(self.cluster.wait_ready, timeout_s)

    def wait_applied(
        self, index: int, nodes: Sequence[str], timeout_s: float = HEALTHY_TIMEOUT_S, group: int = 0
    ) -> None:
        """Waits until every one of `nodes` applied Raft index `index` (of Raft `group`)."""
        self.bounded(lambda bound_s: self.cluster.wait_applied(index, nodes, bound_s, group), timeout_s)

    def group_partitions(self) -> dict[int, frozenset[int]]:
        """The topic's partitions by the Raft group that holds them (one group: all in group 0)."""
        if self.cluster.processes == 1:
            return {0: frozenset(range(self.partitions))}
        with KqClient(self.cluster.bootstrap, tls=self.cluster.tls) as client:
            owners = {p: client.partition_group(self.topic, p) for p in range(self.partitions)}
        by_group: dict[int, set[int]] = {}
        for partition, owner in owners.items():
            by_group.setdefault(owner, set()).add(partition)
        return {group: frozenset(partitions) for group, partitions in by_group.items()}

    def wait_caught_up(self, node: str) -> None:
        """Waits until `node` applied everything the leader had committed when this was called."""
        leader = self.wait_healthy()
        status = self.cluster.statuses().get(leader)
        if status is None:
            raise LivenessError(f"leader {leader} stopped answering")
        self.wait_applied(status.commit_index, [node])

    def wait_acks(self, count: int, timeout_s: float = STEADY_TIMEOUT_S) -> None:
        """Waits until `count` more records are acknowledged."""
        target = self.history.acks_count() + count
        found = self.history.wait_for_ack(
            lambda acks: acks[-1] if len(acks) >= target else None, self._deadline(timeout_s)
        )
        if found is None:
            raise LivenessError(f"fewer than {count} records acknowledged within {timeout_s:.0f} s")

    def steady_leader(self) -> str:
        """Waits for a healthy cluster taking writes; returns its leader."""
        self.wait_healthy()
        self.wait_acks(STEADY_ACKS)
        return self.wait_healthy()

    def followers(self, leader: str) -> list[str]:
        """Every node but `leader`, in id order."""
        return [node for node in self.cluster.nodes if node != leader]

    def fault(self, kind: str, targets: list[str], leader_fault: bool) -> FaultEvent:
        """Records a fault as starting now (call it right before injecting)."""
        led = self._led_partitions(targets) if leader_fault and self.cluster.processes > 1 else []
        at_s, index = self.history.mark()
        event = FaultEvent(kind, tuple(targets), leader_fault, at_s, index)
        event.led_groups = tuple((group, self.history.index_before(at_s, group)) for group in led)
        self.faults.append(event)
        logger.info("fault %d: %s of node(s) %s", len(self.faults), kind, ",".join(targets))
        return event

    def in_place(self, event: FaultEvent) -> None:
        """Records that the fault is now fully injected."""
        event.in_place_s = time.monotonic()

    def wait_resumed(self, event: FaultEvent, timeout_s: float = RESUME_TIMEOUT_S) -> None:
        """Waits for the acknowledgement that shows writes resumed after `event`; records its time."""

        in_place_s = max(event.in_place_s, event.started_s)
        waits: list[tuple[frozenset[int] | None, int]] = [*event.led_groups]
        resumed_s = event.started_s
        for partitions, index_at_fault in waits or [(None, event.index_at_fault)]:  # Each cut-off group.
            ack = self.history.wait_for_ack(
                functools.partial(
                    _resumed, event=event, in_place_s=in_place_s, index=index_at_fault, partitions=partitions
                ),
                self._deadline(timeout_s),
            )
            if ack is None:
                raise LivenessError(
                    f"no write acknowledged within {timeout_s:.0f} s of {event.kind} of {event.targets}"
                )
            resumed_s = max(resumed_s, ack.acked_s)
            if partitions is not None:  # One group's own failover, for the report's notes.
                group_s = ack.acked_s - event.started_s
                event.notes.append(f"partitions {sorted(partitions)}: writes resumed after {group_s:.3f} s")
        event.resumed_s = resumed_s
        logger.info(
            "writes resumed %.3f s after %s (%d group(s) it cut off)",
            resumed_s - event.started_s,
            event.kind,
            max(1, len(waits)),
        )

    def _led_partitions(self, targets: Sequence[str]) -> list[frozenset[int]]:
        """The topic's partitions of each Raft group one of `targets` leads now (nodes with a group per
        worker process), from the first node that answers."""
        statuses = [s for s in self.cluster.statuses().values() if s is not None and s.group_leaders]
        if not statuses:
            return []
        led = {leader.group for leader in statuses[0].group_leaders if leader.leader_id in targets}
        by_group = self.group_partitions()
        return [by_group[group] for group in sorted(led) if by_group.get(group)]

    def wait_leader_other_than(self, old: str, timeout_s: float = HEALTHY_TIMEOUT_S) -> str:
        """Waits until a majority follows a leader other than `old`; returns it."""

        def new_leader() -> str | None:
            leader = self.cluster.leader_id()
            return leader if leader != old else None

        return self.until(new_leader, f"a leader other than node {old}", timeout_s, LEADER_POLL_S)

    def wait_group_caught_up(self, group: str, timeout_s: float = GROUP_CATCH_UP_TIMEOUT_S) -> None:
        """Waits until the group's committed offset of every partition of the topic is its log end.

        Call it once the producers stopped and every node applied their records: then every node's
        log ends are final, and a node that lags on the group's commits only makes the wait longer.
        """
        lagging: list[str] = []

        def caught_up() -> bool:
            lagging[:] = self._group_lag(client, group)
            return not lagging

        with KqClient(
            self.cluster.bootstrap, retry_timeout_s=GROUP_DESCRIBE_RETRY_TIMEOUT_S, tls=self.cluster.tls
        ) as client:
            self.bounded(
                lambda bound_s: wait_for(
                    caught_up,
                    f"group {group} to catch up with the log end",
                    bound_s,
                    poll_s=GROUP_POLL_S,
                    last_state=lambda: "; ".join(lagging),
                ),
                timeout_s,
            )

    def _group_lag(self, client: KqClient, group: str) -> list[str]:
        """What keeps `group` from having caught up: partitions behind their log end (or an error)."""
        try:
            description = client.describe_group(group)
        except KqClientError as error:
            return [f"{type(error).__name__}: {error}"]
        described = {lag.partition: lag for lag in description.partitions if lag.topic == self.topic}
        lagging = []
        for partition in range(self.partitions):
            lag = described.get(partition)
            if lag is None or lag.committed_offset != lag.log_end_offset:
                committed = "nothing" if lag is None else lag.committed_offset
                end = "?" if lag is None else lag.log_end_offset
                lagging.append(f"partition {partition} committed {committed} of log end {end}")
        return lagging

    def hold(self, event: FaultEvent, duration_s: float) -> None:
        """Keeps the fault in place until `duration_s` after it started (the fault's length, not a sync)."""
        remaining_s = event.started_s + duration_s - time.monotonic()
        if remaining_s > 0:
            time.sleep(min(remaining_s, max(0.0, self.deadline_s - time.monotonic())))

    def heal(self, event: FaultEvent, action: Callable[[], None]) -> None:
        """Runs the healing action and records when."""
        action()
        event.healed_s = time.monotonic()

    def kill(self, node: str) -> None:
        """`kill -9` of one node."""
        self.cluster.kill_node(node)
        self.down.add(node)

    def start(self, node: str) -> None:
        """Starts a node that is down."""
        self.cluster.start_node(node)
        self.down.discard(node)

    def pause(self, node: str) -> None:
        """SIGSTOP of one node."""
        self.cluster.signal_node(node, signal.SIGSTOP)
        self.paused.add(node)

    def resume(self, node: str) -> None:
        """SIGCONT of a paused node."""
        self.cluster.signal_node(node, signal.SIGCONT)
        self.paused.discard(node)

    def start_probe(self, node: str, fault_s: float) -> Producer:
        """A producer that writes only to `node` (following its redirects) while a fault is in place."""
        address = self.cluster.nodes[node].grpc_address
        spec = ProducerSpec(
            f"{PROBE_PREFIX}{len(self.probes)}-node{node}",
            ProducerKind.PINNED,
            (address,),
            PROBE_RATE_PER_S,
            retry_timeout_s=fault_s + PROBE_SLACK_S,
            rpc_timeout_s=fault_s + PROBE_SLACK_S,
            tls=self.cluster.tls,
        )
        probe = Producer(spec, self.topic, self.partitions, self.history, self.rng.randrange(1 << 30))
        probe.start()
        self.probes.append(probe)
        return probe

    def members_changed(self) -> None:
        """Tells the workload the cluster's members are now `cluster.nodes` (a step added or removed one)."""
        if self._follow_members is not None:
            self._follow_members(self.cluster.bootstrap)

    def heal_everything(self) -> None:
        """Ends every fault still in place: heals partitions, resumes paused nodes, starts dead ones."""
        if self.lab is not None and self.lab.partitioned:
            self.lab.heal()
        for node in sorted(self.paused):
            self.resume(node)
        for node in sorted(self.down):
            self.start(node)
