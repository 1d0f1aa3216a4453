"""The group coordinator: heartbeats keep members, silence and late rejoins expire them, only on the leader,
at a paced retry, with maps as large as the groups; `start()` and `stop()` own its one thread.

The timers run on fake clocks and `tick()` is called directly; proposals apply at once to a real store
(FakeConsensus), or are held (HeldConsensus) to see what the coordinator proposes and when.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kq.broker.groups import THREAD_NAME, GroupCoordinator
from kq.proto import kq_pb2
from kq.proto.limits import COORDINATOR_TICK_S, EXPIRY_RETRY_S
from kq.raft import commands
from kq.raft.results import ApplyResult
from kq.storage import Store
from tests.broker.fake_consensus import FakeConsensus

SESSION_S = 10.0
REBALANCE_S = 30.0


class Clock:
    """Monotonic seconds and wall milliseconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now_s = 1_000.0
        self.wall_ms = 1_700_000_000_000

    def advance(self, seconds: float) -> None:
        self.now_s += seconds
        self.wall_ms += int(seconds * 1000)

    def s(self) -> float:
        return self.now_s

    def ms(self) -> int:
        return self.wall_ms


class HeldConsensus(FakeConsensus):
    """Leads, but commits nothing the coordinator proposes: the test sees each proposal."""

    def __init__(self, store: Store) -> None:
        super().__init__(store, lambda index: None)
        self.held: list[kq_pb2.Command] = []

    def propose(self, data: bytes, callback: Callable[[ApplyResult | None, int], None]) -> None:
        self.held.append(commands.decode(data))


@dataclass
class Setup:
    store: Store
    consensus: FakeConsensus
    clock: Clock
    coordinator: GroupCoordinator

    def join(self, group: str, member_id: str) -> None:
        """Commits a join of `member_id` (as the broker does), stamped with the fake wall clock."""
        member = kq_pb2.GroupMember(
            member_id=member_id,
            client_id="c",
            topics=["t"],
            session_timeout_ms=int(SESSION_S * 1000),
            rebalance_timeout_ms=int(REBALANCE_S * 1000),
        )
        FakeConsensus.propose(
            self.consensus,
            commands.encode(commands.join_group(group, member, "range", self.clock.ms())),
            lambda result, reason: None,
        )

    def members(self, group: str) -> list[str]:
        with self.store.read() as reader:
            raw_groups = reader.groups()
        for _, raw in raw_groups:
            state = kq_pb2.GroupState()
            state.ParseFromString(raw)
            if state.name == group:
                return [member.member_id for member in state.members]
        return []

    def at(self, seconds: float) -> None:
        """Moves both clocks by `seconds` and runs one tick."""
        self.clock.advance(seconds)
        self.coordinator.tick()


def _setup(tmp_path: Path, consensus_type: type[FakeConsensus]) -> Iterator[Setup]:
    store = Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)
    consensus = (
        HeldConsensus(store) if consensus_type is HeldConsensus else FakeConsensus(store, lambda i: None)
    )
    FakeConsensus.propose(consensus, commands.encode(commands.create_topic("t", 2, 1)), lambda r, s: None)
    clock = Clock()
    coordinator = GroupCoordinator(store, consensus, clock.ms, clock.s)
    try:
        yield Setup(store, consensus, clock, coordinator)
    finally:
        coordinator.stop()
        store.close()


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    yield from _setup(tmp_path, FakeConsensus)


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Setup]:
    yield from _setup(tmp_path, HeldConsensus)


def test_a_silent_member_is_expired_after_its_session_timeout(setup: Setup) -> None:
    """Silence of exactly the session timeout is tolerated; beyond it the member is removed through Raft."""
    setup.join("g", "a")
    setup.at(0)  # The coordinator sees "a" for the first time: its session starts now.
    setup.at(SESSION_S)
    assert setup.members("g") == ["a"]
    setup.at(0.5)
    assert setup.members("g") == []


def test_heartbeats_keep_a_member_for_as_long_as_they_come(setup: Setup) -> None:
    """A member heard from every half session is never expired; once it falls silent, it is."""
    setup.join("g", "a")
    setup.at(0)
    for _ in range(10):
        setup.at(SESSION_S / 2)
        setup.coordinator.heard_from("g", "a")
    assert setup.members("g") == ["a"]
    setup.at(SESSION_S + 1)
    assert setup.members("g") == []


def test_a_node_that_does_not_lead_proposes_nothing_and_remembers_nothing(setup: Setup) -> None:
    """On a follower, silence expires no one and heartbeats are not kept."""
    setup.join("g", "a")
    setup.at(0)
    assert setup.coordinator.tracked() == 1
    setup.consensus.leader = False
    proposals = setup.consensus.proposals
    setup.at(10 * SESSION_S)
    setup.coordinator.heard_from("g", "a")
    setup.at(10 * SESSION_S)
    assert setup.consensus.proposals == proposals and setup.members("g") == ["a"]
    assert setup.coordinator.tracked() == 0


def test_a_new_leader_gives_every_member_a_full_session(setup: Setup) -> None:
    """A member silent for long before this node took over is expired only a session after the takeover."""
    setup.consensus.leader = False
    setup.join("g", "a")
    setup.at(10 * SESSION_S)
    setup.consensus.leader = True
    setup.at(0)  # Takes over.
    setup.at(SESSION_S - 1)
    assert setup.members("g") == ["a"]
    setup.at(2)
    assert setup.members("g") == []


def test_a_member_named_before_its_join_commits_gets_a_full_session_once_it_is_in_its_group(
    setup: Setup,
) -> None:
    """The grace for unknown members: a name no group holds is not remembered; its session starts
    when the coordinator first sees it in its group, however long the join took to commit."""
    setup.coordinator.heard_from("g", "a")  # JoinGroup calls this before proposing the join.
    assert setup.coordinator.tracked() == 0
    setup.at(3 * SESSION_S)  # A slow commit.
    setup.join("g", "a")
    setup.at(COORDINATOR_TICK_S)
    setup.at(SESSION_S - 1)
    assert setup.members("g") == ["a"]
    setup.at(2)
    assert setup.members("g") == []


def test_invented_member_ids_grow_no_map(setup: Setup) -> None:
    """10,000 heartbeats naming made-up members leave nothing behind; the maps follow the groups."""
    setup.join("g", "a")
    setup.join("h", "b")
    setup.at(0)
    for number in range(10_000):
        setup.coordinator.heard_from("g", f"invented-{number}")
        setup.coordinator.heard_from(f"group-{number}", "a")
    setup.at(COORDINATOR_TICK_S)
    assert setup.coordinator.tracked() == 2
    assert len(setup.coordinator._last_seen) == 2 and len(setup.coordinator._members) == 2
    setup.at(SESSION_S + 1)  # Both expire and leave their groups.
    setup.at(COORDINATOR_TICK_S)
    assert setup.coordinator.tracked() == 0
    assert not setup.coordinator._proposed and not setup.coordinator._members


def test_an_expiry_that_does_not_commit_is_proposed_again_only_after_the_retry_pause(held: Setup) -> None:
    """Retry pacing: one proposal per EXPIRY_RETRY_S for a member whose expiry has not applied."""
    held.join("g", "a")
    held.at(0)
    held.at(SESSION_S + 1)
    assert [(c.leave_group.member_ids, c.leave_group.expired) for c in held.consensus.held] == [  # type: ignore[attr-defined]
        (["a"], True)
    ]
    held.at(EXPIRY_RETRY_S / 2)
    held.at(EXPIRY_RETRY_S / 2 - 0.01)
    assert len(held.consensus.held) == 1  # type: ignore[attr-defined]
    held.at(0.02)
    assert len(held.consensus.held) == 2  # type: ignore[attr-defined]
    assert len(held.coordinator._proposed) == 1


def test_a_member_that_does_not_rejoin_a_rebalance_in_time_is_expired_though_it_heartbeats(
    setup: Setup,
) -> None:
    """A newcomer starts a rebalance; the old member keeps heartbeating but never rejoins: it is removed
    after its rebalance timeout, and the newcomer's generation completes."""
    setup.join("g", "a")
    setup.at(0)
    setup.join("g", "b")  # "a" must rejoin now.
    for _ in range(int(REBALANCE_S // (SESSION_S / 2))):
        setup.at(SESSION_S / 2)
        setup.coordinator.heard_from("g", "a")
        setup.coordinator.heard_from("g", "b")
    assert setup.members("g") == ["a", "b"]
    setup.at(SESSION_S / 2)
    assert setup.members("g") == ["b"]


def test_start_runs_ticks_on_its_own_named_thread_and_stop_ends_it(setup: Setup) -> None:
    """The constructor starts no thread; start() starts kq-groups, which ticks (and survives a failing
    tick); stop() joins it."""
    ticked = threading.Event()
    calls: list[str] = []

    def is_leader() -> bool:
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            raise RuntimeError("a failing tick is logged; the thread carries on")
        ticked.set()
        return False

    coordinator = GroupCoordinator(setup.store, setup.consensus, setup.clock.ms, setup.clock.s)
    setup.consensus.is_leader = is_leader  # type: ignore[method-assign]
    assert not [t for t in threading.enumerate() if t.name == THREAD_NAME]
    coordinator.start()
    assert ticked.wait(timeout=10)
    assert set(calls) == {THREAD_NAME}
    coordinator.stop()
    assert not [t for t in threading.enumerate() if t.name == THREAD_NAME]
    coordinator.stop()  # Idempotent.
    GroupCoordinator(setup.store, setup.consensus, setup.clock.ms).stop()  # Never started: nothing to stop.


def _consumer_beat(setup: Setup, member_id: str, epoch: int, owned: list[int] | None) -> None:
    """Commits a consumer-group (KIP-848) heartbeat, stamped with the fake wall clock."""
    member = kq_pb2.GroupMember(
        member_id=member_id,
        client_id="c",
        topics=["t"] if epoch == 0 else [],
        session_timeout_ms=int(SESSION_S * 1000),
        rebalance_timeout_ms=int(REBALANCE_S * 1000) if epoch == 0 else 0,
    )
    listed = None if owned is None else [kq_pb2.TopicPartition(topic="t", partition=p) for p in owned]
    command = commands.consumer_heartbeat("cg", member, epoch, setup.clock.ms(), epoch == 0, listed)
    FakeConsensus.propose(setup.consensus, commands.encode(command), lambda result, reason: None)


def test_a_consumer_member_that_does_not_revoke_within_its_rebalance_timeout_is_expired(setup: Setup) -> None:
    """KIP-848: a member asked to revoke partitions that keeps heartbeating without revoking them is
    removed once its rebalance timeout passes; the one that revoked stays."""
    _consumer_beat(setup, "a", 0, [])
    _consumer_beat(setup, "a", 1, None)
    _consumer_beat(setup, "b", 0, [])  # b's target takes one of a's two partitions.
    _consumer_beat(setup, "a", 1, [0, 1])  # a is told to revoke one; it never does.
    setup.at(0)
    for _ in range(int(REBALANCE_S // (SESSION_S / 2))):
        setup.at(SESSION_S / 2)
        setup.coordinator.heard_from("cg", "a")
        setup.coordinator.heard_from("cg", "b")
    assert sorted(setup.members("cg")) == ["a", "b"]
    setup.at(SESSION_S / 2)
    assert setup.members("cg") == ["b"]
