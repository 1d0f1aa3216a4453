"""Which code a run ran: the git commit of this checkout, for the reports of bench and chaos runs.

Result files name the commit (and whether tracked files differed from it), so that two results are
compared knowing what they measured. Outside a git checkout (an installed wheel) both are unknown.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

GIT_TIMEOUT_S = 5.0
UNKNOWN = "unknown"


def _git(*args: str) -> str:
    """`git ARGS` in this package's folder: its output, or "unknown" when git cannot answer."""
    try:
        done = subprocess.run(
            ["git", *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=True,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN
    return done.stdout.strip()


def source_commit() -> str:
    """The commit checked out, or "unknown"."""
    return _git("rev-parse", "HEAD")


def source_dirty() -> bool:
    """Whether tracked files differ from that commit (an unknown state counts as dirty)."""
    return bool(_git("status", "--porcelain", "--untracked-files=no"))
