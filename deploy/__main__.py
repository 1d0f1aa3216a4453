"""`python -m kq.deploy`: start, stop, status, logs, restart, kill, add, remove, clean: a local cluster
(kq.deploy.cli)."""

from kq.deploy.cli import main

main(prog_name="python -m kq.deploy")
