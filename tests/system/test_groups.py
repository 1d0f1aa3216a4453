"""Consumer groups on three real nodes: sharing partitions, rebalancing, failover, commits and lag."""

from __future__ import annotations

import threading
import time

import pytest

from kq.client import GroupConsumer, KqClient, PreconditionFailedError, ProducerRecord, RebalanceError
from kq.client.types import ConsumerRecord
from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for

pytestmark = pytest.mark.system

SESSION_MS = 3_000
HEARTBEAT_MS = 500
WAIT_TIMEOUT_S = 60.0  # Rebalances and failovers take seconds; this bounds a stuck group.


class Member:
    """A GroupConsumer polled by its own thread, recording what it reads."""

    def __init__(self, cluster: LocalCluster, group: str, topic: str, name: str, **options: object) -> None:
        self.client = KqClient(cluster.bootstrap)
        self.consumer = GroupConsumer(
            self.client,
            group,
            [topic],
            client_id=name,
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=HEARTBEAT_MS,
            **options,  # type: ignore[arg-type]
        )
        self.records: list[ConsumerRecord] = []
        self.errors: list[BaseException] = []
        self._running = threading.Event()
        self._running.set()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while self._running.is_set():
            try:
                self.records += self.consumer.poll(timeout_ms=200)
            except Exception as error:  # Reported by the test, not swallowed.
                self.errors.append(error)
                return

    def owned(self) -> int:
        return len(self.consumer.assignment())

    def stop(self, leave: bool = True) -> None:
        """Stops polling; `leave=False` dies silently (no commit, no leave, heartbeats stop)."""
        self._running.clear()
        self._thread.join(timeout=30)
        if leave:
            self.consumer.close()
        else:
            self.consumer._closed.set()  # Stops the heartbeat thread, as a crashed process would.
        self.client.close()


def produce_in_background(cluster: LocalCluster, topic: str, stop: threading.Event) -> list[bytes]:
    """Starts a thread sending numbered records until `stop`; returns the list of acknowledged values."""
    acknowledged: list[bytes] = []

    def run() -> None:
        with KqClient(cluster.bootstrap) as client:
            number = 0
            while not stop.is_set() and number < 50_000:
                batch = [
                    ProducerRecord(f"{number + i}".encode(), key=f"k{number + i}".encode()) for i in range(20)
                ]
                client.send_batch(topic, batch)
                acknowledged.extend(record.value or b"" for record in batch)
                number += 20
                time.sleep(0.01)

    threading.Thread(target=run, daemon=True).start()
    return acknowledged


def test_members_share_partitions_and_take_over_from_a_dead_one(shared_cluster: LocalCluster) -> None:
    """2 members → 3/3; a third → 2/2/2; it dies silently → 3/3 again within the session timeout;
    every record produced meanwhile is consumed at least once."""
    cluster = shared_cluster
    with KqClient(cluster.bootstrap) as admin:
        admin.create_topic("shared", partitions=6)
    stop_producing = threading.Event()
    produced = produce_in_background(cluster, "shared", stop_producing)
    first, second = (Member(cluster, "workers", "shared", name) for name in ("a", "b"))
    members = [first, second]
    try:
        wait_for(lambda: [m.owned() for m in members] == [3, 3], "3/3", WAIT_TIMEOUT_S)
        third = Member(cluster, "workers", "shared", "c")
        members.append(third)
        wait_for(lambda: sorted(m.owned() for m in members) == [2, 2, 2], "2/2/2", WAIT_TIMEOUT_S)
        third.stop(leave=False)
        died = time.monotonic()
        survivors = members[:2]
        wait_for(lambda: [m.owned() for m in survivors] == [3, 3], "takeover after the death", WAIT_TIMEOUT_S)
        assert time.monotonic() - died < SESSION_MS / 1000 + 10
        stop_producing.set()
        time.sleep(0.2)
        expected = set(produced)

        def consumed() -> set[bytes | None]:
            return {r.value for m in members for r in m.records}

        wait_for(lambda: expected <= consumed(), "every produced record consumed", WAIT_TIMEOUT_S)
        assert not any(m.errors for m in members), [m.errors for m in members]
    finally:
        stop_producing.set()
        for member in members[:2]:
            member.stop()


def test_group_survives_leader_failover_and_continues_from_its_commits(cluster: LocalCluster) -> None:
    """kill -9 of the leader: membership, generation and committed offsets survive; reading goes on."""
    with KqClient(cluster.bootstrap) as admin:
        admin.create_topic("durable", partitions=3)
        admin.send_batch("durable", [ProducerRecord(f"{i}".encode(), partition=i % 3) for i in range(300)])
    member = Member(cluster, "survivors", "durable", "only", auto_commit_interval_ms=200)
    try:
        wait_for(lambda: len(member.records) >= 300, "first 300 records", WAIT_TIMEOUT_S)
        with KqClient(cluster.bootstrap) as admin:
            committed = admin.committed_offsets
            wait_for(lambda: sum(committed("survivors").values()) == 300, "commits", WAIT_TIMEOUT_S)
            before = admin.describe_group("survivors")
        cluster.kill_node(cluster.wait_ready())
        with KqClient(cluster.bootstrap) as admin:
            admin.send_batch(
                "durable", [ProducerRecord(f"{i}".encode(), partition=i % 3) for i in range(300, 600)]
            )
            wait_for(lambda: len(member.records) >= 600, "records after the failover", WAIT_TIMEOUT_S)
            wait_for(
                lambda: sum(admin.committed_offsets("survivors").values()) == 600, "commits after failover"
            , WAIT_TIMEOUT_S)
            after = admin.describe_group("survivors")
        assert (after.generation, [m.member_id for m in after.members]) == (
            before.generation,
            [m.member_id for m in before.members],
        )
        values = [int(r.value or b"") for r in member.records]
        assert sorted(set(values)) == list(range(600)), "a record was skipped"
        assert not member.errors, member.errors
    finally:
        member.stop()


def test_stale_commits_and_resets_of_active_groups_are_refused(shared_cluster: LocalCluster) -> None:
    """A commit from an old generation is rejected; a reset while members are active is refused clearly."""
    cluster = shared_cluster
    with KqClient(cluster.bootstrap) as admin:
        admin.create_topic("guarded", partitions=2)
    first = Member(cluster, "guards", "guarded", "a")
    try:
        wait_for(lambda: first.owned() == 2, "first member owns both partitions", WAIT_TIMEOUT_S)
        old_generation, member_id = first.consumer.generation, first.consumer.member_id
        second = Member(cluster, "guards", "guarded", "b")
        wait_for(lambda: first.owned() == 1 and second.owned() == 1, "1/1", WAIT_TIMEOUT_S)
        with KqClient(cluster.bootstrap) as admin:
            with pytest.raises(RebalanceError, match="stale generation"):
                admin.commit_offsets(
                    "guards", {("guarded", 0): 0}, member_id=member_id, generation=old_generation
                )
            with pytest.raises(PreconditionFailedError, match="active members"):
                admin.reset_offsets("guards", ["guarded"], "earliest")
        second.stop()
    finally:
        first.stop()


def test_describe_reports_lag_before_and_after_consuming(shared_cluster: LocalCluster) -> None:
    """Lag equals the records produced after a reset to earliest, and zero once they are consumed."""
    cluster = shared_cluster
    with KqClient(cluster.bootstrap) as admin:
        admin.create_topic("lagging", partitions=3)
        admin.send_batch("lagging", [ProducerRecord(f"{i}".encode()) for i in range(500)])
        admin.reset_offsets("readers", ["lagging"], "earliest")
        before = admin.describe_group("readers")
    assert before.total_lag == 500
    assert sum(p.log_end_offset for p in before.partitions) == 500
    member = Member(cluster, "readers", "lagging", "r")
    wait_for(lambda: len(member.records) >= 500, "all 500 consumed", WAIT_TIMEOUT_S)
    member.stop()
    with KqClient(cluster.bootstrap) as admin:
        after = admin.describe_group("readers")
    assert after.total_lag == 0
    assert all(p.committed_offset == p.log_end_offset for p in after.partitions)


def test_reset_to_a_timestamp_and_to_an_offset(shared_cluster: LocalCluster) -> None:
    """Reset to a timestamp picks the first record at or after it; to an offset, that offset."""
    cluster = shared_cluster
    with KqClient(cluster.bootstrap) as admin:
        admin.create_topic("timed", partitions=1)
        records = [ProducerRecord(f"{i}".encode(), timestamp_ms=1_000_000 + i * 10) for i in range(100)]
        admin.send_batch("timed", records)
        assert admin.reset_offsets("clock", ["timed"], "timestamp", timestamp_ms=1_000_495) == {
            ("timed", 0): 50
        }
        assert admin.reset_offsets("clock", ["timed"], "offset", offset=7) == {("timed", 0): 7}
        assert admin.reset_offsets("clock", ["timed"], "latest") == {("timed", 0): 100}
        assert admin.committed_offsets("clock") == {("timed", 0): 100}
