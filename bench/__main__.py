"""`python -m kq.bench`: see `bench.cli`."""

from kq.bench.cli import main

main()
