"""The network lab: namespaces reach each other through the bridge until a partition cuts them apart."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from kq.chaos.netns import NetworkLab, unavailable_reason

pytestmark = pytest.mark.system

CONNECT_TIMEOUT_S = 1.0
PORT = 7999
LISTEN_READY_TIMEOUT_S = 10.0
# Listens in a namespace; prints a line once listening, then answers each connection with "ok".
SERVER = """
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
while True:
    connection, _ = server.accept()
    connection.sendall(b"ok")
    connection.close()
"""
# Connects from a namespace; prints "ok" or the error.
CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as c:
        print(c.recv(2).decode())
except OSError as error:
    print(type(error).__name__)
"""


@pytest.fixture
def lab() -> Iterator[NetworkLab]:
    """A two-node lab, removed afterwards."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"skipped: {reason}")
    network = NetworkLab(["1", "2"])
    network.create()
    try:
        yield network
    finally:
        network.destroy()


def connect_from(lab: NetworkLab, node: str, host: str) -> str:
    """What a connection from `node`'s namespace to host:PORT gets: "ok" or an error name."""
    done = subprocess.run(
        [*lab.launcher(node), sys.executable, "-c", CLIENT, host, str(PORT), str(CONNECT_TIMEOUT_S)],
        capture_output=True,
        text=True,
        timeout=CONNECT_TIMEOUT_S + 10,
        check=True,
    )
    return done.stdout.strip()


def test_partition_drops_node_to_node_traffic_but_not_the_runners(lab: NetworkLab) -> None:
    """Cut: node 1 cannot reach node 2 (silent drop: a timeout), the runner still can; healed: all can."""
    server = subprocess.Popen(
        [*lab.launcher("2"), sys.executable, "-c", SERVER, lab.host("2"), str(PORT)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "listening"
        assert connect_from(lab, "1", lab.host("2")) == "ok"
        lab.partition([["1"], ["2"]])
        assert connect_from(lab, "1", lab.host("2")) == "TimeoutError"
        with socket.create_connection((lab.host("2"), PORT), timeout=CONNECT_TIMEOUT_S) as runner:
            assert runner.recv(2) == b"ok"
        lab.heal()
        assert connect_from(lab, "1", lab.host("2")) == "ok"
    finally:
        server.kill()
        server.wait(LISTEN_READY_TIMEOUT_S)
