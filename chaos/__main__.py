"""`python -m kq.chaos`: see `chaos.cli`."""

from kq.chaos.cli import main

main()
