"""Runs a benchmark module's `--quick` smoke run in a subprocess and returns its JSON report."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run_quick(
    module: str, tmp_path: Path, timeout_s: float, extra_args: Sequence[str] = ()
) -> tuple[dict[str, Any], str]:
    """`python -m <module> --quick --json … --base-dir … [extra_args]` from the checkout: its report and
    its printed output; fails the test with its stderr's end if it exits non-zero."""
    output = tmp_path / "report.json"
    nodes = tmp_path / "nodes"
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            module,
            "--quick",
            "--json",
            str(output),
            "--base-dir",
            str(nodes),
            *extra_args,
        ],
        cwd=REPO,
        check=False,  # The output says more than the exit code alone.
        timeout=timeout_s,
        capture_output=True,
        text=True,
    )
    assert finished.returncode == 0, finished.stderr[-4000:]
    report: dict[str, Any] = json.loads(output.read_text())
    return report, finished.stdout


def report_meta(command: str, **extra: Any) -> dict[str, Any]:
    """The machine and run facts a comparison report's header holds, fixed for the report tests."""
    return {
        "date": "today",
        "cpus": 2,
        "cpu_model": "cpu",
        "memory_gib": 24.0,
        "platform": "linux",
        "python": "3.11",
        "git_commit": "0123456789abcdef",
        "git_dirty": False,
        "command": command,
        **extra,
    }
