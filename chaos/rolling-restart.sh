#!/usr/bin/env bash
# SIGTERM and restart of every node in turn, followers first, the leader last.
# Extra arguments go to `python -m kq.chaos` (e.g. --rounds 5 --nodes 5 --seed 7); see chaos/README.md.
exec "$(dirname "${BASH_SOURCE[0]}")/run.sh" --scenario rolling-restart "$@"
