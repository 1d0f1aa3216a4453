"""The membership fault step: a node joins and an old one leaves under load, each while the leader dies.

One round (`membership_change`) leaves the cluster with as many voters as it started with:
1. A new node starts with `--join` (the next free id, fresh ports: `LocalCluster.new_node_spec`);
   once it answers, AddNode is sent on a thread of its own and the leader is killed (`kill -9`) a
   seeded moment later, so the kill lands before the request arrives, between the new node's
   registration and its Raft MEMBERSHIP entry, or just after the change committed. The client
   retries on the new leader (adding a member again is no error); writes must resume, the killed
   node is restarted, and the new node must catch up with the leader.
2. An old node (any but the one just added; the leader as often as any other) is removed the same
   way, with RemoveNode in flight while the leader is killed; a removed leader hands over its
   leadership first, and the kill may then hit it or its successor. The removed node is stopped
   and leaves `cluster.nodes`; the killed leader, unless it is the removed node, is restarted.
After each change the workload follows the members (`ScenarioContext.members_changed`): new
bootstrap lists, a consumer on the new node, none on the removed one. The runner's final read and
store comparison see only the final members.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from kq.chaos.context import FaultEvent, LivenessError, ScenarioContext
from kq.client import KqClient, KqClientError, TlsConfig

logger = logging.getLogger(__name__)

# Undisturbed, AddNode (a status probe and two commits) returns in about 0.1 s here and RemoveNode (two
# commits) in about 0.05 s, longer when a removed leader hands over first: kills drawn up to this far
# into the call land before it reaches the leader, between its commits, or just after it returned
# (each fault's notes say which).
KILL_DELAY_MAX_S = 0.12
JOIN_ANSWER_TIMEOUT_S = 30.0  # The new node's process starts and answers a status call.
# The change's client retries across the failover: longer than an election and the client's wait on a
# pending change, well inside the round's budget.
CHANGE_RETRY_TIMEOUT_S = 45.0
CHANGE_JOIN_SLACK_S = 40.0  # One more membership RPC in flight when the retry deadline passes.


class MembershipChangeError(LivenessError):
    """A membership change the cluster should have carried out did not complete."""

    kind = "membership"


class _Change(threading.Thread):
    """One membership call on its own thread, so that the leader can be killed while it is in flight."""

    def __init__(
        self,
        what: str,
        bootstrap: Sequence[str],
        call: Callable[[KqClient], object],
        tls: TlsConfig | None,
    ) -> None:
        """`call` runs with a client of `bootstrap` that reaches the nodes with `tls` (None: plain text)."""
        super().__init__(name=f"chaos-{what}", daemon=True)
        self.what = what
        self._tls = tls
        self._addresses = tuple(bootstrap)  # Not `_bootstrap`: a Thread method.
        self._call = call
        self.error: KqClientError | None = None
        self.started_s = 0.0
        self.finished_s: float | None = None

    def run(self) -> None:
        """Calls once; the client retries retriable failures (a dead leader, a pending change)."""
        self.started_s = time.monotonic()
        try:
            with KqClient(self._addresses, retry_timeout_s=CHANGE_RETRY_TIMEOUT_S, tls=self._tls) as client:
                self._call(client)
        except KqClientError as error:
            self.error = error
        finally:
            self.finished_s = time.monotonic()

    def landed(self, killed_s: float) -> str:
        """Where in the call the kill at `killed_s` fell (for the fault's notes)."""
        if self.finished_s is not None and self.finished_s <= killed_s:
            return f"after {self.what} returned ({self.finished_s - self.started_s:.2f} s)"
        return f"{killed_s - self.started_s:.2f} s into {self.what}, still in flight"

    def outcome(self) -> None:
        """Waits for the call to end; raises MembershipChangeError if it failed or did not end."""
        self.join(timeout=CHANGE_RETRY_TIMEOUT_S + CHANGE_JOIN_SLACK_S)
        if self.is_alive():
            raise MembershipChangeError(f"{self.what} still running after {CHANGE_RETRY_TIMEOUT_S:.0f} s")
        if self.error is not None:
            raise MembershipChangeError(f"{self.what} failed: {type(self.error).__name__}: {self.error}")


def membership_change(context: ScenarioContext) -> None:
    """Adds a node while the leader is killed, lets it catch up, then removes an old node while the
    leader is killed: the cluster ends the round with as many voters as it began it with."""
    added = _add_during_leader_kill(context)
    _remove_during_leader_kill(context, added)


def _add_during_leader_kill(context: ScenarioContext) -> str:
    """Starts a node with --join, adds it while the leader dies, restarts the leader; returns its id."""
    cluster = context.cluster
    leader = context.steady_leader()
    members = [spec.grpc_address for node, spec in cluster.nodes.items() if cluster.running(node)]
    spec = cluster.new_node_spec()
    context.bounded(lambda timeout_s: cluster.start_joining(spec.node_id, timeout_s), JOIN_ANSWER_TIMEOUT_S)
    context.down.discard(spec.node_id)
    change = _Change(
        f"AddNode {spec.node_id}",
        members,
        lambda client: client.add_node(
            spec.node_id, spec.raft_address, spec.grpc_address, spec.kafka_address, spec.rack
        ),
        cluster.tls,
    )
    event = context.fault("add-node", [spec.node_id, leader], leader_fault=True)
    _kill_while_in_flight(context, change, leader, event)
    context.heal(event, lambda: context.start(leader))
    context.wait_healthy()
    context.wait_caught_up(spec.node_id)
    context.members_changed()
    logger.info("node %s joined; members now %s", spec.node_id, ",".join(cluster.nodes))
    return spec.node_id


def _remove_during_leader_kill(context: ScenarioContext, added: str) -> None:
    """Removes an old node while the leader dies; stops it; restarts the killed leader if it stays."""
    cluster = context.cluster
    leader = context.steady_leader()
    victim = context.rng.choice([node for node in cluster.nodes if node != added])
    others = [spec.grpc_address for node, spec in cluster.nodes.items() if node != victim]
    change = _Change(f"RemoveNode {victim}", others, lambda client: client.remove_node(victim), cluster.tls)
    targets = [victim] if victim == leader else [victim, leader]
    event = context.fault("remove-node", targets, leader_fault=True)
    _kill_while_in_flight(context, change, leader, event)
    if cluster.running(victim):
        cluster.stop_node(victim)
    context.down.discard(victim)  # Removed: healing must not start it again.
    del cluster.nodes[victim]  # As LocalCluster.remove_node does once the cluster removed it.
    if victim != leader:
        context.heal(event, lambda: context.start(leader))
    else:
        event.healed_s = time.monotonic()  # Nothing to restart: the killed leader was the one removed.
    context.wait_healthy()
    context.members_changed()
    logger.info("node %s removed; members now %s", victim, ",".join(cluster.nodes))


def _kill_while_in_flight(context: ScenarioContext, change: _Change, leader: str, event: FaultEvent) -> None:
    """Starts the change, kills the leader a seeded moment later, waits for writes to resume and for
    the change to complete (raising MembershipChangeError if it does not)."""
    delay_s = context.rng.uniform(0.0, KILL_DELAY_MAX_S)
    change.start()
    time.sleep(delay_s)  # Where in the change the kill lands (the fault's timing, not a sync).
    killed_s = time.monotonic()
    context.kill(leader)
    context.in_place(event)
    event.notes.append(f"leader {leader} killed {change.landed(killed_s)}")
    context.wait_resumed(event)
    change.outcome()
    logger.info("%s done %.2f s after it started", change.what, (change.finished_s or 0) - change.started_s)
