#!/usr/bin/env bash
# kill -9 of every node at once, then a cold start of all of them.
# Extra arguments go to `python -m kq.chaos` (e.g. --rounds 5 --nodes 5 --seed 7); see chaos/README.md.
exec "$(dirname "${BASH_SOURCE[0]}")/run.sh" --scenario cold-restart "$@"
