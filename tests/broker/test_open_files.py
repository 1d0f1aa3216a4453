"""A node raises its open-file soft limit to the hard limit: every client connection is a file."""

from __future__ import annotations

import resource
import subprocess
import sys

LOWERED_SOFT_LIMIT = 256
PROBE = (
    "import resource\n"
    "from kq.broker.main import raise_open_files_limit\n"
    "print(raise_open_files_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))\n"
)


def test_the_soft_limit_is_raised_to_the_hard_limit() -> None:
    """Started with a low soft limit (as a shell's 1,024 would be), the process ends up at the hard one."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (LOWERED_SOFT_LIMIT, hard))

    finished = subprocess.run(
        [sys.executable, "-c", PROBE],
        preexec_fn=lower,  # Only a setrlimit, in the child before exec.
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    reported, soft_after, hard_after = (int(part) for part in finished.stdout.split())
    assert hard_after == hard
    if hard == resource.RLIM_INFINITY:
        assert reported == soft_after == LOWERED_SOFT_LIMIT  # Left alone: there is no number to raise it to.
    else:
        assert reported == soft_after == hard > LOWERED_SOFT_LIMIT
