"""The node's entry point (broker/entry.py): a node process starts without importing hypothesis, which
kio would otherwise load to register strategies for its types (~0.3 s of every node start where the
test extras are installed); the node itself still works (`--help` through `python -m kq.broker`)."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import runpy, sys
sys.argv = ["kq-node", "--help"]
try:
    runpy.run_module("kq.broker", run_name="__main__")  # broker/__main__.py, as `python -m kq.broker`.
except SystemExit as end:
    assert end.code in (0, None), end.code
loaded = sorted(name for name, module in sys.modules.items() if module is not None)
print("kio" if "kio.static.primitive" in loaded else "no kio")
print([name for name in loaded if name.split(".")[0] == "hypothesis"])
"""


def test_a_node_process_never_imports_hypothesis() -> None:
    finished = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120, check=False
    )
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert "--kafka-address" in finished.stdout  # The node's own options: it ran.
    assert finished.stdout.splitlines()[-2:] == ["kio", "[]"], finished.stdout[-500:]
