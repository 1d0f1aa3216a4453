"""The installed `kq` script as a real process: the entry point works; Ctrl-C ends --follow cleanly,
and a group member commits what it printed and leaves."""

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

from kq.client import KqClient, ProducerRecord
from kq.deploy.cluster import LocalCluster

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


# Ctrl-C as a terminal delivers it, even when the test run itself was started with SIGINT ignored
# (a background job of a non-interactive shell, nohup): Python turns SIGINT into KeyboardInterrupt
# only when it is not ignored at start-up, and an exec keeps "ignored". This prefix resets it and
# execs the command in place, so the PID the test signals is kq's own.
WITH_DEFAULT_SIGINT = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])",
]


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
    with subprocess.Popen(
        [*WITH_DEFAULT_SIGINT, *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as process:
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


def test_group_follow_ctrl_c_commits_what_it_printed_and_leaves(
    cluster: LocalCluster, client: KqClient
) -> None:
    """`consume --group --follow` prints records produced before and after it joined; SIGINT ends it
    with exit 0, its final commit covers every printed record, and it has left the group."""
    client.create_topic("cli-group-follow", 2)
    client.send_batch("cli-group-follow", [ProducerRecord(b"before-%d" % p, partition=p) for p in range(2)])
    command = [
        str(KQ_SCRIPT),
        "--bootstrap",
        ",".join(cluster.bootstrap),
        "consume",
        "cli-group-follow",
        "--group",
        "cli-group-follow-g",
        "--follow",
        "--reset",
        "earliest",
    ]
    with subprocess.Popen(
        [*WITH_DEFAULT_SIGINT, *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as process:
        try:
            assert process.stdout is not None and process.stderr is not None
            assert b"reads cli-group-follow 0,1" in _read_line(process.stderr, LINE_TIMEOUT_S)
            printed = {_read_line(process.stdout, LINE_TIMEOUT_S) for _ in range(2)}
            assert printed == {b"before-0\n", b"before-1\n"}
            client.send("cli-group-follow", b"after", partition=1)
            assert _read_line(process.stdout, LINE_TIMEOUT_S) == b"after\n"
            process.send_signal(signal.SIGINT)
            assert process.wait(PROCESS_TIMEOUT_S) == 0
            assert b"Traceback" not in process.stderr.read()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(PROCESS_TIMEOUT_S)
    description = client.describe_group("cli-group-follow-g")
    assert (description.phase, description.members) == ("empty", ())
    assert client.committed_offsets("cli-group-follow-g") == {
        ("cli-group-follow", 0): 1,
        ("cli-group-follow", 1): 2,
    }
