#!/usr/bin/env bash
# SIGSTOP of the leader beyond the election timeout, then SIGCONT, while a probe writes to it.
# Extra arguments go to `python -m kq.chaos` (e.g. --rounds 5 --nodes 5 --seed 7); see chaos/README.md.
exec "$(dirname "${BASH_SOURCE[0]}")/run.sh" --scenario leader-pause "$@"
