"""`kq consume --group` and `kq groups` against a real 3-node cluster: lag against produced counts,
committed offsets, sharing partitions with another member, and refusals while members are active."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import Result

from kq.client import GroupConsumer, KqClient, ProducerRecord
from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for

RunKq = Callable[..., Result]
MEMBER_TIMEOUT_S = 15.0  # Generous: a join needs a Raft round and, with two members, a rebalance.
BASE_TIMESTAMP_MS = 1_700_000_000_000  # 2023-11-14T22:13:20Z

pytestmark = pytest.mark.system


def _produce(client: KqClient, topic: str, counts: dict[int, int]) -> None:
    """Sends counts[p] records to each partition p, valued `p<partition>-<i>`."""
    records = [ProducerRecord(b"p%d-%d" % (p, i), partition=p) for p, n in counts.items() for i in range(n)]
    client.send_batch(topic, records)


def _ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def _json_lines(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in _ok(result).stdout.splitlines()]


def _describe(run_kq: RunKq, group: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(_ok(run_kq("groups", "describe", group, "--format", "json")).stdout)
    return document


def _positions(document: dict[str, Any]) -> list[tuple[int, int | None, int, int]]:
    """(partition, committed offset, log end, lag) per partition of a described group."""
    return [
        (p["partition"], p["committed_offset"], p["log_end_offset"], p["lag"]) for p in document["partitions"]
    ]


def test_describe_shows_lag_of_produced_records_then_none_after_a_group_consume(
    run_kq: RunKq, client: KqClient, topic_name: str
) -> None:
    """Lag after a reset to earliest equals the records produced per partition; one group consume reads
    each record once and commits the log ends (lag 0); a second run prints nothing."""
    counts = {0: 4, 1: 0, 2: 7}
    client.create_topic(topic_name, len(counts))
    _produce(client, topic_name, counts)
    group = f"{topic_name}-g"
    reset = _ok(run_kq("groups", "reset-offsets", group, "--topic", topic_name, "--to-earliest", "--yes"))
    lines = reset.stdout.splitlines()
    assert lines[0] == f"group {group}: 3 partitions reset to earliest"
    assert [line.split() for line in lines[3:]] == [[topic_name, str(p), "0"] for p in counts]

    before = _describe(run_kq, group)
    assert _positions(before) == [(p, 0, n, n) for p, n in counts.items()]
    assert (before["phase"], before["members"], before["total_lag"]) == ("empty", [], 11)
    table = _ok(run_kq("groups", "describe", group)).stdout.splitlines()
    assert re.fullmatch(
        rf"group {group}: empty, generation 0, assignor range, 0 members; served by node \d+", table[0]
    )
    assert table[1].split() == [
        "topic",
        "partition",
        "member",
        "committed",
        "log",
        "start",
        "log",
        "end",
        "lag",
    ]
    assert [line.split() for line in table[3:6]] == [
        [topic_name, str(p), "-", "0", "0", str(n), str(n)] for p, n in counts.items()
    ]
    assert table[6:] == ["total lag: 11 records"]

    records = _json_lines(run_kq("consume", topic_name, "--group", group, "--format", "json"))
    expected = [(p, offset, f"p{p}-{offset}") for p, n in counts.items() for offset in range(n)]
    assert sorted((r["partition"], r["offset"], r["value"]) for r in records) == expected
    after = _describe(run_kq, group)
    assert _positions(after) == [(p, n, n, 0) for p, n in counts.items()]
    assert (after["phase"], after["members"], after["total_lag"]) == ("empty", [], 0)

    again = _ok(run_kq("consume", topic_name, "--group", group))
    assert again.stdout == ""


@pytest.mark.parametrize("commit", ["auto", "manual"])
def test_max_commits_exactly_what_was_printed_and_the_next_run_continues(
    run_kq: RunKq, client: KqClient, topic_name: str, commit: str
) -> None:
    """--from-beginning --max 4 prints and commits 4 records (lag 6); a run without --max continues at
    the committed offset, whatever the commit mode."""
    client.create_topic(topic_name, 1)
    _produce(client, topic_name, {0: 10})
    group = f"{topic_name}-g"
    arguments = ["consume", topic_name, "--group", group, "--commit", commit]
    first = _ok(run_kq(*arguments, "--from-beginning", "--max", "4"))
    assert first.stdout.splitlines() == [f"p0-{i}" for i in range(4)]
    assert re.fullmatch(
        rf"kq: group {group}, generation 1: member kq-consume-\w+ reads {topic_name} 0\n", first.stderr
    )
    assert _positions(_describe(run_kq, group)) == [(0, 4, 10, 6)]

    rest = _ok(run_kq(*arguments))
    assert rest.stdout.splitlines() == [f"p0-{i}" for i in range(4, 10)]
    assert _positions(_describe(run_kq, group)) == [(0, 10, 10, 0)]


def test_pattern_subscribes_to_every_matching_topic(run_kq: RunKq, client: KqClient, topic_name: str) -> None:
    """--pattern REGEX reads every topic whose name matches, and no other."""
    for suffix in ("a", "b", "c"):
        client.create_topic(f"{topic_name}-{suffix}", 1)
        client.send(f"{topic_name}-{suffix}", suffix.encode())
    pattern = re.escape(topic_name) + "-[ab]"
    result = run_kq("consume", "--pattern", pattern, "--group", f"{topic_name}-g", "--from-beginning")
    assert sorted(_ok(result).stdout.splitlines()) == ["a", "b"]


class BackgroundMember:
    """A GroupConsumer polling in a thread of this process: an active member the CLI must share with."""

    def __init__(self, cluster: LocalCluster, group: str, topic: str) -> None:
        self.client = KqClient(cluster.bootstrap)
        self.consumer = GroupConsumer(
            self.client, group, [topic], client_id="test-member", enable_auto_commit=False
        )
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="test-member", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        try:
            while not self._stop.is_set():
                self.consumer.poll(timeout_ms=100)
        except BaseException as error:  # Reported by the test, not lost in the thread.
            self.failure = error

    def wait_for_partitions(self, count: int) -> None:
        """Waits until the member owns `count` partitions."""

        def owns_them() -> bool:
            assert self.failure is None, self.failure
            return len(self.consumer.assignment()) == count

        wait_for(
            owns_them,
            f"the member to own {count} partitions",
            MEMBER_TIMEOUT_S,
            last_state=lambda: f"it owns {self.consumer.assignment()}",
        )

    def stop(self) -> None:
        """Stops polling, leaves the group (committing nothing) and closes the client."""
        self._stop.set()
        self._thread.join(MEMBER_TIMEOUT_S)
        self.consumer.close()
        self.client.close()
        assert self.failure is None, self.failure


@pytest.fixture
def background_member(cluster: LocalCluster, topic_name: str) -> Iterator[Callable[[str], BackgroundMember]]:
    """Starts background members of a group on `topic_name`; each is stopped after the test."""
    members: list[BackgroundMember] = []

    def start(group: str) -> BackgroundMember:
        members.append(BackgroundMember(cluster, group, topic_name))
        return members[-1]

    yield start
    for member in members:
        member.stop()


def test_cli_member_shares_partitions_and_changes_are_refused_while_members_are_active(
    run_kq: RunKq,
    client: KqClient,
    topic_name: str,
    background_member: Callable[[str], BackgroundMember],
) -> None:
    """With a member active elsewhere, reset-offsets and delete fail with one line and change nothing;
    a CLI consumer in the group reads only the half of the partitions it is given; once the member
    has left, reset and delete succeed."""
    client.create_topic(topic_name, 4)
    _produce(client, topic_name, dict.fromkeys(range(4), 2))
    group = f"{topic_name}-g"
    member = background_member(group)
    member.wait_for_partitions(4)
    rows = [line.split() for line in _ok(run_kq("groups", "describe", group)).stdout.splitlines()[3:7]]
    assert all(row[2].startswith("test-member-") and row[3:] == ["-", "0", "2", "2"] for row in rows), rows

    refusal = f"kq: error: group {group} has active members; stop its consumers first\n"
    reset = run_kq("groups", "reset-offsets", group, "-t", topic_name, "--to-latest", "--yes")
    assert (reset.exit_code, reset.stdout, reset.stderr) == (1, "", refusal)
    deleted = run_kq("groups", "delete", group, "--yes")
    assert (deleted.exit_code, deleted.stdout, deleted.stderr) == (1, "", refusal)
    assert client.committed_offsets(group) == {}

    shared = _ok(run_kq("consume", topic_name, "--group", group, "--reset", "earliest", "--format", "json"))
    assigned = re.search(rf"reads {re.escape(topic_name)} ([\d,]+)\n", shared.stderr)
    assert assigned is not None, shared.stderr
    mine = sorted(int(p) for p in assigned.group(1).split(","))
    assert len(mine) == 2
    records = [json.loads(line) for line in shared.stdout.splitlines()]
    assert sorted((r["partition"], r["offset"]) for r in records) == [(p, o) for p in mine for o in range(2)]
    assert client.committed_offsets(group) == {(topic_name, p): 2 for p in mine}
    member.wait_for_partitions(4)  # The CLI consumer left: its partitions came back.

    member.stop()
    _ok(run_kq("groups", "reset-offsets", group, "-t", topic_name, "--to-latest", "--yes"))
    assert _ok(run_kq("groups", "delete", group, "--yes")).stdout == f"deleted group {group}\n"


def test_reset_to_offset_timestamp_datetime_and_latest(
    run_kq: RunKq, client: KqClient, topic_name: str
) -> None:
    """Each --to-* target lands where it says: an offset, the first record at or after a time given in
    milliseconds or ISO 8601 (any zone), the log end; --format json lists the new offsets."""
    client.create_topic(topic_name, 1)
    records = [ProducerRecord(b"v%d" % i, timestamp_ms=BASE_TIMESTAMP_MS + i * 1000) for i in range(5)]
    client.send_batch(topic_name, records)
    group = f"{topic_name}-g"
    targets = {
        ("--to-offset", "2"): 2,
        ("--to-timestamp", str(BASE_TIMESTAMP_MS + 2500)): 3,
        ("--to-datetime", "2023-11-14T22:13:21Z"): 1,
        ("--to-datetime", "2023-11-14T23:13:24.001+01:00"): 5,  # After the last record: the log end.
        ("--to-datetime", "2023-11-14T22:13:24.000000+00:00"): 4,
        ("--to-latest",): 5,
        ("--to-earliest",): 0,
    }
    for target, offset in targets.items():
        result = run_kq(
            "groups", "reset-offsets", group, "--topic", topic_name, *target, "-y", "--format", "json"
        )
        expected = {"group": group, "offsets": [{"topic": topic_name, "partition": 0, "offset": offset}]}
        assert json.loads(_ok(result).stdout) == expected, target
        assert client.committed_offsets(group) == {(topic_name, 0): offset}


def test_list_shows_groups_and_delete_asks_then_removes(
    run_kq: RunKq, client: KqClient, topic_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`groups list` shows a group (table and JSON); delete on a terminal keeps it on `n`; --yes deletes
    it, after which list omits it and describe fails with one line."""
    client.create_topic(topic_name, 2)
    group = f"{topic_name}-g"
    _ok(run_kq("groups", "reset-offsets", group, "-t", topic_name, "--to-earliest", "--yes"))
    listed = _ok(run_kq("groups", "list")).stdout.splitlines()
    assert listed[0].split() == ["group", "phase", "generation", "members"]
    assert [group, "empty", "0", "0"] in [line.split() for line in listed[2:]]
    documents = json.loads(_ok(run_kq("groups", "list", "--format", "json")).stdout)
    assert {"name": group, "phase": "empty", "generation": 0, "members": 0} in documents

    monkeypatch.setattr("kq.cli.groups.stdin_is_interactive", lambda: True)
    kept = run_kq("groups", "delete", group, stdin="n\n")
    assert kept.exit_code == 1
    assert f"Delete group {group} (2 partitions with offsets)?" in kept.stdout
    assert group in [g.name for g in client.list_groups()]

    assert _ok(run_kq("groups", "delete", group, "--yes")).stdout == f"deleted group {group}\n"
    gone = json.loads(_ok(run_kq("groups", "list", "--format", "json")).stdout)
    assert group not in [document["name"] for document in gone]
    described = run_kq("groups", "describe", group)
    assert (described.exit_code, described.stderr) == (1, f"kq: error: unknown group {group}\n")
