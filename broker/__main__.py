"""`python -m kq.broker` runs a node, like the `kq-node` script."""

from kq.broker.main import main

main()
