"""How many worker processes a node runs (`kq-node --processes`, broker/workers.py): `auto` keeps what a
data directory holds and takes the usable cores, bounded, for a new one; fewer than a directory holds
is refused by name; and where a membership change of scope `group` may be made (group_membership.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kq.broker import workers
from kq.broker.config import ConfigError
from kq.broker.consensus import ConsensusStatus, Peer
from kq.broker.errors import InvalidArgumentError
from kq.broker.group_membership import ClusterChanges, moved_member
from kq.broker.groups_view import GroupsView, LeaderBoard, LocalStores
from kq.broker.membership import Membership, MembershipChanges, MembershipView
from kq.proto import kq_pb2
from kq.proto.limits import PROCESSES_AUTO_MAX
from kq.storage import Store
from tests.broker.fake_consensus import FakeConsensus


def test_auto_takes_the_usable_cores_bounded_for_a_new_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workers, "usable_cores", lambda: 3)
    assert workers.resolve_processes("auto", tmp_path / "new") == 3
    monkeypatch.setattr(workers, "usable_cores", lambda: 96)
    assert workers.resolve_processes("auto", tmp_path / "new") == PROCESSES_AUTO_MAX
    assert workers.resolve_processes("5", tmp_path / "new") == 5
    with pytest.raises(ConfigError, match="a number or auto"):
        workers.resolve_processes("many", tmp_path)


def test_auto_keeps_what_a_data_directory_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A single-group node's directory (data, no record) stays one group: its peers are; a directory
    that ran four workers runs four, whatever the cores; fewer than recorded is refused by name."""
    monkeypatch.setattr(workers, "usable_cores", lambda: 6)
    single = tmp_path / "single"
    (single / "store").mkdir(parents=True)
    assert workers.resolve_processes("auto", single) == 1
    spread = tmp_path / "spread"
    workers.record_processes(spread, 4)
    assert workers.resolve_processes("auto", spread) == 4
    workers.record_processes(spread, 4)  # The same again: nothing to change.
    with pytest.raises(ConfigError, match="--processes 4 or more"):
        workers.record_processes(spread, 2)
    (spread / "groups" / "processes").write_text("four\n")
    with pytest.raises(ConfigError, match="cannot read"):
        workers.resolve_processes("auto", spread)


def test_usable_cores_honours_a_cgroup_quota(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_max = tmp_path / "cpu.max"
    monkeypatch.setattr(workers, "CGROUP_CPU_MAX", cpu_max)
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(16)))
    assert workers.usable_cores() == 16  # No quota file.
    cpu_max.write_text("max 100000\n")
    assert workers.usable_cores() == 16
    cpu_max.write_text("150000 100000\n")  # 1.5 CPUs: two processes may each use some.
    assert workers.usable_cores() == 2
    cpu_max.write_text("400000 100000\n")
    assert workers.usable_cores() == 4


def test_the_worker_command_names_its_resolved_count() -> None:
    command = workers.worker_command(["--node-id", "1", "--processes", "auto"], 4, 2)
    assert command[-4:] == ["--processes", "4", workers.WORKER_FLAG, "2"]


class _NoChange:
    """MembershipChanges' Raft side, never reached: these calls are refused before."""

    def change_membership(self, *_: object) -> None:
        raise AssertionError("no change expected")

    def hand_over_leadership(self, *_: object) -> None:
        raise AssertionError("no change expected")


def _unused_status() -> ConsensusStatus:
    raise AssertionError("the scope check asks no Raft status")


def _changes(tmp_path: Path, group: int, count: int) -> ClusterChanges:
    view = MembershipView("1", (), {}, frozenset(), "c")
    board, stores = LeaderBoard(tmp_path / "leaders", count), LocalStores(tmp_path, 1 << 20)
    groups = GroupsView(group, count, lambda: view, _unused_status, board, stores)
    store = Store.open(tmp_path / "store", map_size_bytes=1 << 20)
    membership = Membership(Peer("1", "h:1", "h:2"), (), store)
    own = MembershipChanges(_NoChange(), FakeConsensus(store, lambda _index: None), membership, kafka=False)
    return ClusterChanges(own, groups, call=lambda *_: None)


def test_a_change_is_made_where_its_scope_says(tmp_path: Path) -> None:
    """The cluster's change on group 0's process; group g's part on group g's process only."""
    _changes(tmp_path / "a", 0, 3).check_scope(0)
    _changes(tmp_path / "b", 2, 3).check_scope(2)
    with pytest.raises(InvalidArgumentError, match="on Raft group 0's processes"):
        _changes(tmp_path / "c", 1, 3).check_scope(0)
    with pytest.raises(InvalidArgumentError, match="serves Raft group 1, not group 2"):
        _changes(tmp_path / "d", 1, 3).check_scope(2)
    with pytest.raises(InvalidArgumentError, match="serves Raft group 0, not group 5"):
        _changes(tmp_path / "e", 0, 3).check_scope(5)


def test_a_member_moves_to_its_process_of_a_group() -> None:
    member = kq_pb2.Member(
        node_id="4", raft_address="h:7000", grpc_address="h:9000", kafka_address="", rack="r"
    )
    moved = moved_member(member, 3)
    assert (moved.raft_address, moved.grpc_address, moved.kafka_address, moved.rack) == (
        "h:7003",
        "h:9003",
        "",
        "r",
    )


def test_a_registered_node_that_is_not_yet_a_voter_here_has_addresses(tmp_path: Path) -> None:
    """Group 0's process names the process of group g of a node registered but not (yet) a voter of
    group 0 (an addition that reached group g first), and nothing for a node that is neither."""
    one = Peer("1", "h:7000", "h:9000", "h:9100")
    four = Peer("4", "h:7400", "h:9400", "h:9500")
    view = MembershipView(
        "1", (one,), {one.raft_address: one, four.raft_address: four}, frozenset({"4"}), "c"
    )
    board, stores = LeaderBoard(tmp_path / "leaders", 3), LocalStores(tmp_path, 1 << 20)
    groups = GroupsView(0, 3, lambda: view, _unused_status, board, stores)
    process = groups.process("4", 2)
    assert process is not None
    assert (process.raft_address, process.grpc_address, process.kafka_address) == (
        "h:7402",
        "h:9402",
        "h:9502",
    )
    assert groups.process("7", 2) is None
    own = groups.process("1", 1)
    assert own is not None and own.grpc_address == "h:9001"
