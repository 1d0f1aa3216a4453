"""A `kq console` process for tests: started on a free port, stopped by its PID."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from kq.deploy.cluster import LocalCluster, free_ports
from kq.deploy.waiting import wait_for

BIN = Path(sys.executable).parent


def start_console(
    cluster: LocalCluster, *flags: str, bootstrap: list[str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """A `kq console` process on a free port, for `bootstrap` (default: every node); stopped by its PID
    by the caller."""
    port = free_ports(1)[0]
    command = [
        str(BIN / "kq"),
        "--bootstrap",
        ",".join(bootstrap or cluster.bootstrap),
        "console",
        "--port",
        str(port),
        *flags,
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/topics", timeout=2):
                return True
        except (urllib.error.URLError, OSError):
            return process.poll() is not None  # Ended: reported below.

    wait_for(answers, "the console to answer", 30)
    assert process.poll() is None, "kq console exited"
    return process, url


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
