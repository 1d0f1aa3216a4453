"""The node process's entry point: the `kq-node` script and `python -m kq.broker` (worker processes
are started this way too) run `run()`.

It keeps `hypothesis` out of the node before anything imports kio: kio registers a hypothesis strategy
for each of its primitive types whenever hypothesis can be imported, which took ~0.3 s of every node
start where it is installed (the test and dev extras: the suite starts hundreds of nodes). A node never
generates examples; kio works the same without it (it imports it only if it can). Only this process's
own entry does this, never a module that tests import.
"""

from __future__ import annotations

import sys


def run() -> None:
    """Runs a node (`kq.broker.main.main`) in this process."""
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]  # None: import raises ImportError.
    from kq.broker.main import main

    main()
