"""A node that records when each produce request passes the steps of its commit path (a measuring tool).

`python -m kq.broker.timeline <kq-node flags>` runs a node like `kq-node`, with a clock reading
(`time.perf_counter_ns`, the same clock in every process of the machine) taken around the functions
in `STEPS`, and writes them to `$KQ_TIMELINE_DIR/<pid>.json` when the node stops: a list of
(step, "+" or "-" for entering or leaving, nanoseconds). `python -m kq.bench.profile --timeline`
starts three such nodes, sends one record at a time and prints, for every step of the leader and of
the followers, its median offset from the moment the leader's Produce began (bench/README.md,
"Sixth round"). Each reading costs about a microsecond; nothing of it runs in a normal node.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kq.broker import main as broker_main
from kq.broker.proposals import Batcher
from kq.broker.service import BrokerService
from kq.raft import node as raft_node
from kq.raft.pysyncobj_adapter import PySyncObjAdapter
from kq.raft.transport import PeerConnection, RaftTransport

DIRECTORY_VARIABLE = "KQ_TIMELINE_DIR"
EVENTS_MAX = 2_000_000  # Readings kept (a few hundred thousand requests); later ones are dropped.

_events: list[tuple[str, str, int]] = []


def _message_type(arguments: tuple[Any, ...]) -> str:
    message = arguments[2] if len(arguments) > 2 else None
    return str(message.get("type")) if isinstance(message, dict) else "other"


# (owner, attribute, step name, whether the step is named after the Raft message's type).
STEPS: tuple[tuple[Any, str, str, bool], ...] = (
    (BrokerService, "produce", "produce", False),
    (Batcher, "submit", "batcher submit", False),
    (PySyncObjAdapter, "propose_call", "propose", False),
    (PeerConnection, "on_event", "socket event", False),
    (RaftTransport, "on_message", "message in", True),
    (RaftTransport, "send", "message out", True),
    (raft_node, "apply", "apply", False),
)


def _record(step: str, edge: str) -> None:
    if len(_events) < EVENTS_MAX:
        _events.append((step, edge, time.perf_counter_ns()))


def _traced(function: Callable[..., Any], step: str, by_type: bool) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def traced_coroutine(*arguments: Any, **keywords: Any) -> Any:
            _record(step, "+")
            try:
                return await function(*arguments, **keywords)
            finally:
                _record(step, "-")

        return traced_coroutine

    @functools.wraps(function)
    def traced(*arguments: Any, **keywords: Any) -> Any:
        name = f"{step}: {_message_type(arguments)}" if by_type else step
        _record(name, "+")
        try:
            return function(*arguments, **keywords)
        finally:
            _record(name, "-")

    return traced


def install() -> None:
    """Wraps every function of STEPS (before the node is built, so every call goes through it)."""
    for owner, attribute, step, by_type in STEPS:
        setattr(owner, attribute, _traced(getattr(owner, attribute), step, by_type))


def dump(directory: Path) -> None:
    """Writes the readings to `directory/<pid>.json`."""
    (directory / f"{os.getpid()}.json").write_text(json.dumps(_events))


def main() -> None:
    """`kq-node` with the readings (see the module docstring)."""
    directory = Path(os.environ[DIRECTORY_VARIABLE])
    install()
    atexit.register(dump, directory)
    broker_main.main()


if __name__ == "__main__":
    main()
