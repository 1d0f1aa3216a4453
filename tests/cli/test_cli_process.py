"""The installed `kq` script as a real process: the entry point works; Ctrl-C ends --follow cleanly."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest

from chaos.cluster import LocalCluster
from client import KqClient

KQ_SCRIPT = Path(sys.executable).parent / "kq"  # Installed by `pip install -e .` next to the interpreter.
PROCESS_TIMEOUT_S = 30.0
LINE_TIMEOUT_S = 15.0

pytestmark = pytest.mark.system


def _read_line(stream: IO[bytes], timeout_s: float) -> bytes:
    """One line from a child's pipe, byte by byte (no buffering hides it), or TimeoutError."""
    line = b""
    deadline = time.monotonic() + timeout_s
    while not line.endswith(b"\n"):
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise TimeoutError(f"no full line within {timeout_s} s; got {line!r}")
        ready, _, _ = select.select([stream], [], [], remaining_s)
        if ready:
            byte = os.read(stream.fileno(), 1)
            if not byte:
                raise EOFError(f"stream closed; got {line!r}")
            line += byte
    return line


def test_console_script_lists_topics(cluster: LocalCluster, client: KqClient) -> None:
    """`kq --bootstrap ... topics list` run as the installed script exits 0 and lists a topic."""
    client.create_topic("cli-entry-point", 1)
    result = subprocess.run(
        [str(KQ_SCRIPT), "--bootstrap", ",".join(cluster.bootstrap), "topics", "list"],
        capture_output=True,
        timeout=PROCESS_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert b"cli-entry-point" in result.stdout


def test_console_script_error_is_one_line_without_traceback(cluster: LocalCluster) -> None:
    """A server error from the real script is one stderr line and exit code 1."""
    result = subprocess.run(
        [str(KQ_SCRIPT), "--bootstrap", ",".join(cluster.bootstrap), "topics", "describe", "no-such-topic"],
        capture_output=True,
        timeout=PROCESS_TIMEOUT_S,
        check=False,
    )
    assert (result.returncode, result.stderr) == (1, b"kq: error: unknown topic no-such-topic\n")


def test_follow_prints_new_records_and_ctrl_c_exits_zero(cluster: LocalCluster, client: KqClient) -> None:
    """`consume --follow` prints a record produced after it started; SIGINT ends it: exit 0, no traceback."""
    client.create_topic("cli-follow", 1)
    client.send("cli-follow", b"first")
    command = [
        str(KQ_SCRIPT),
        "--bootstrap",
        ",".join(cluster.bootstrap),
        "consume",
        "cli-follow",
        "--follow",
        "--from-beginning",
    ]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        try:
            assert process.stdout is not None and process.stderr is not None
            assert _read_line(process.stdout, LINE_TIMEOUT_S) == b"first\n"
            client.send("cli-follow", b"second")
            assert _read_line(process.stdout, LINE_TIMEOUT_S) == b"second\n"
            process.send_signal(signal.SIGINT)
            assert process.wait(PROCESS_TIMEOUT_S) == 0
            assert b"Traceback" not in process.stderr.read()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(PROCESS_TIMEOUT_S)
