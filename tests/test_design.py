"""DESIGN.md's thread tables match the code: each name is one the code gives a thread, every thread the
code creates is named and listed, and every thread of a node running in this process is in the table.
"""

from __future__ import annotations

import ast
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kq.broker.config import NodeConfig
from kq.broker.main import BrokerNode
from kq.deploy.cluster import free_ports
from kq.deploy.waiting import wait_for
from kq.proto import kq_pb2, kq_pb2_grpc
from kq.proto.limits import GRPC_WORKERS_MIN
from kq.raft.node import Durability, RaftConfig
from tests.raft.helpers import batch

WAIT_S = 20.0  # An in-process node electing itself and stopping, on a busy 2-core machine.

REPOSITORY = Path(__file__).resolve().parents[1]
# The code of a node process and of the client library (the harnesses name their own threads).
SOURCE_FOLDERS = ("proto", "storage", "raft", "broker", "client", "cli", "spark", "console")
POOL_SUFFIX = "_<n>"  # ThreadPoolExecutor names its threads <prefix>_0, <prefix>_1, ...


def thread_names() -> list[str]:
    """The first column of every table in DESIGN.md's "Concurrency model" section."""
    text = (REPOSITORY / "DESIGN.md").read_text()
    start = text.index("\n## Concurrency model")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    return re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE)


def name_pattern(name: str) -> re.Pattern[str]:
    """A table name as a pattern: `<...>` stands for any non-empty text."""
    return re.compile(".+".join(re.escape(part) for part in re.split(r"<[^>]+>", name)))


def in_table(name: str, names: list[str]) -> bool:
    return any(name_pattern(listed).fullmatch(name) for listed in names)


def source_files() -> Iterator[Path]:
    for folder in SOURCE_FOLDERS:
        yield from sorted((REPOSITORY / folder).rglob("*.py"))


def test_the_tables_list_the_node_and_client_threads() -> None:
    """The section exists and names the threads this test expects at least."""
    names = thread_names()
    assert len(names) == len(set(names))
    for expected in (
        "MainThread",
        "kq-raft-tick",
        "kq-batcher",
        "kq-groups",
        "kq-grpc_<n>",
        "kq-producer-sender",
    ):
        assert expected in names


def test_every_name_in_the_tables_is_a_thread_name_in_the_code() -> None:
    """Each name appears in the code as the string literal that names the thread (or prefixes it)."""
    code = "\n".join(path.read_text() for path in source_files())
    assert threading.main_thread().name == "MainThread"  # The one name Python gives.
    missing = []
    for name in thread_names():
        if name == "MainThread":
            continue
        if name.endswith(POOL_SUFFIX):
            literal = f'"{name.removesuffix(POOL_SUFFIX)}"'  # A pool's thread_name_prefix.
        elif "<" in name:
            literal = '"' + name.split("<")[0]  # The start of an f-string.
        else:
            literal = f'"{name}"'
        if literal not in code:
            missing.append(name)
    assert missing == []


def _thread_names_created(path: Path) -> Iterator[tuple[int, str | None]]:
    """(line, a sample name) for each Thread or ThreadPoolExecutor the module creates; None if unnamed."""
    tree = ast.parse(path.read_text())
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name) and isinstance(node.value.value, str)
    }
    for node in ast.walk(tree):  # BackgroundThread subclasses (broker/background.py) name theirs here.
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                if isinstance(statement, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "thread_name" for t in statement.targets
                ):
                    named = statement.value
                    if isinstance(named, ast.Constant) and isinstance(named.value, str):
                        yield statement.lineno, named.value
                    else:
                        resolved = constants.get(named.id) if isinstance(named, ast.Name) else None
                        yield statement.lineno, resolved
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        keyword = {"Thread": "name", "ThreadPoolExecutor": "thread_name_prefix"}.get(called)
        if keyword is None:
            continue
        value = next((k.value for k in node.keywords if k.arg == keyword), None)
        if isinstance(value, ast.Attribute) and value.attr == "thread_name":
            continue  # BackgroundThread's own start(): each subclass's name is checked above.
        name: str | None = None
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            name = value.value
        elif isinstance(value, ast.Name):
            name = constants.get(value.id)
        elif isinstance(value, ast.JoinedStr) and value.values and isinstance(value.values[0], ast.Constant):
            name = f"{value.values[0].value!s}x"  # f"kq-heartbeat-{group}" -> "kq-heartbeat-x"
        if name is not None and called == "ThreadPoolExecutor":
            name = f"{name}_0"
        yield node.lineno, name


def test_every_thread_the_code_creates_is_named_and_in_the_tables() -> None:
    """No Thread or pool without a name, and none missing from DESIGN.md."""
    names = thread_names()
    found = [
        (f"{path.relative_to(REPOSITORY)}:{line}", name)
        for path in source_files()
        for line, name in _thread_names_created(path)
    ]
    assert len(found) >= 5
    assert [(where, name) for where, name in found if name is None or not in_table(name, names)] == []


@pytest.mark.parametrize("durability", ["replicated", "fsync"])
def test_every_thread_of_a_running_node_is_in_the_table(tmp_path: Path, durability: Durability) -> None:
    """A one-node cluster in this process: its constructor starts nothing; serving RPCs, every thread it
    runs has a name from the table; after stop() none is left. Raft ticks on the serving loop, but on
    its own kq-raft-tick thread with --durability=fsync (its syncs would hold the loop)."""
    before = set(threading.enumerate())
    (raft_port,) = free_ports(1)
    raft_address = f"127.0.0.1:{raft_port}"
    raft = RaftConfig(raft_address, (), tmp_path / "node", "secret", durability=durability)
    workers = GRPC_WORKERS_MIN
    config = NodeConfig("1", "127.0.0.1:0", raft_address, (), tmp_path / "node", "secret", workers, raft)
    node = BrokerNode(config)
    assert set(threading.enumerate()) == before
    node.start()
    try:
        wait_for(
            lambda: node.consensus.is_leader() and node.consensus.status().ready, "a ready leader", WAIT_S
        )
        with grpc.insecure_channel(f"127.0.0.1:{node.grpc_port}") as channel:
            stub = kq_pb2_grpc.BrokerStub(channel)
            stub.CreateTopic(kq_pb2.CreateTopicRequest(name="t", partitions=1), timeout=10)
            stub.Produce(kq_pb2.ProduceRequest(topic="t", partition=0, records=batch(b"v")), timeout=10)
            stub.Fetch(kq_pb2.FetchRequest(topic="t", partition=0, offset=0, max_records=10), timeout=10)
            joined = stub.JoinGroup(
                kq_pb2.JoinGroupRequest(group="g", topics=["t"], client_id="c"), timeout=10
            )
            stub.Heartbeat(
                kq_pb2.HeartbeatRequest(group="g", member_id=joined.member_id, generation=joined.generation),
                timeout=10,
            )
            running = [thread.name for thread in threading.enumerate() if thread not in before]
    finally:
        node.stop()
    names = thread_names()
    assert [name for name in running if not in_table(name, names)] == []
    for expected in ("kq-batcher", "kq-groups", "kq-grpc-loop"):
        assert expected in running
    assert ("kq-raft-tick" in running) == (durability == "fsync")  # Else Raft ticks on kq-grpc-loop.
    assert any(name.startswith("kq-grpc_") for name in running)
    wait_for(
        lambda: not [t for t in threading.enumerate() if t not in before and t.is_alive()],
        "the node's threads to end",
        WAIT_S,
    )


@pytest.fixture(autouse=True)
def _no_threads_left_behind() -> Iterator[None]:
    """No test here leaves a kq thread behind. Threads that were running before it are not its own:
    grpc.aio's poller (named kq-grpc-poll by the first front end) lives as long as the process, so
    after any in-process node of an earlier test module it is still there (the check failed when
    this module ran after tests/broker)."""
    before = set(threading.enumerate())
    yield
    assert not [t.name for t in threading.enumerate() if t.name.startswith("kq-") and t not in before]
