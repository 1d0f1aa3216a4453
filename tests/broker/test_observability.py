"""Pure parts of operating a node: readiness decisions, the JSON log line, bounded topic labels."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kq.broker.consensus import ConsensusStatus
from kq.broker.group_service import partition_lags
from kq.broker.http_endpoints import readiness
from kq.broker.logs import configure_logging
from kq.broker.metrics import OTHER_TOPICS, LeadershipWatch, TopicLabels
from kq.proto import kq_pb2
from kq.raft import commands
from kq.raft.state_machine import GroupScope, apply
from kq.storage import PartitionState, Store
from tests.raft.helpers import create


@pytest.fixture(autouse=True)
def restored_logging() -> Iterator[None]:
    """configure_logging sets process-wide state: put pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level, hook = list(root.handlers), root.level, threading.excepthook
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    threading.excepthook = hook
    logging.captureWarnings(False)


def status(**changes: object) -> ConsensusStatus:
    fields: dict[str, object] = {
        "role": "follower",
        "leader_id": "1",
        "leader_address": "127.0.0.1:1",
        "term": 3,
        "commit_index": 100,
        "applied_index": 100,
        "connected": {"1": True, "3": False},
        "ready": True,
        "log_entries": 10,
    }
    fields.update(changes)
    return ConsensusStatus(**fields)  # type: ignore[arg-type]


def test_ready_only_with_a_reachable_leader_a_majority_and_a_small_apply_lag() -> None:
    """Each missing condition makes the node not ready, with its own reason."""
    assert readiness(status()).ready
    assert readiness(status(role="leader", leader_id="2", connected={"1": True, "3": False})).ready
    cases = {
        "not started": status(ready=False),
        "no leader": status(leader_id=""),
        "no majority": status(connected={"1": False, "3": False}),
        "leader gone": status(leader_id="3", connected={"1": True, "3": False}),
        "behind": status(applied_index=10, commit_index=2_000),
        "removed": status(role="removed"),
    }
    reasons = {name: readiness(case) for name, case in cases.items()}
    assert not any(state.ready for state in reasons.values())
    assert len({state.reason for state in reasons.values()}) == len(cases)
    assert "1990 entries behind" in reasons["behind"].reason
    assert "removed from the cluster" in reasons["removed"].reason


def test_json_logs_are_one_object_a_line_with_fields_and_tracebacks() -> None:
    """A multi-line message and a traceback stay on one line; extra= fields are kept."""
    stream = io.StringIO()
    configure_logging("7", "info", "json", stream)
    log = logging.getLogger("kq.test")
    log.info("two\nlines %d", 5, extra={"topic": "t"})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    log.debug("not at info")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["message"] == "two\nlines 5" and first["topic"] == "t" and first["node"] == "7"
    assert first["level"] == "INFO" and first["logger"] == "kq.test" and first["ts"].endswith("+00:00")
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exc"]


def test_text_logs_on_a_terminal() -> None:
    """auto picks text when the stream is a terminal."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    configure_logging("2", "info", "auto", stream)
    logging.getLogger("kq.test").info("hello")
    assert stream.getvalue().rstrip().endswith("INFO node=2 kq.test: hello")


def test_topic_labels_are_bounded_and_leaders_counted() -> None:
    """Past the limit, new topics share one label; a leadership change is counted once."""
    labels = TopicLabels(2)
    assert [labels(t) for t in ("a", "b", "c", "a", "d")] == ["a", "b", OTHER_TOPICS, "a", OTHER_TOPICS]
    watch = LeadershipWatch()
    for leader in ("", "1", "1", "2", "", "2", "1"):
        watch.observe(leader)
    assert watch.changes == 2


def test_a_lag_read_from_a_replica_behind_the_groups_commits_is_zero(tmp_path: Path) -> None:
    """With worker processes a consumer group's commits (group 0) can be ahead of this node's replica
    of the partition's group: its lag is 0, never negative (it once failed the metrics collector at a
    node's start: PartitionLag's lag is unsigned)."""
    store = Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)
    apply(store, 1, create("t", 1))
    commit = commands.commit_offsets("g", "", 0, [kq_pb2.OffsetEntry(topic="t", partition=0, offset=7)], 1)
    apply(store, 2, commands.encode(commit), GroupScope(holds_every_partition=False))
    with store.read() as reader:
        raw = reader.group("g")
        assert raw is not None
        state = kq_pb2.GroupState.FromString(raw)
        behind = partition_lags(reader, state, lambda _reader, _topic: [(1, PartitionState(0, 3, 0))])
    assert [(lag.committed_offset, lag.log_end_offset, lag.lag) for lag in behind] == [(7, 3, 0)]
