"""`python -m kq.broker` runs a node, like the `kq-node` script (both through broker/entry.py)."""

from kq.broker.entry import run

run()
