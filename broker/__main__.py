"""`python -m broker` runs a node, like the `kq-node` script."""

from broker.main import main

main()
