#!/usr/bin/env bash
# kill -9 of a follower, restarted after the leader compacted past it: it catches up from a snapshot.
# Extra arguments go to `python -m kq.chaos` (e.g. --rounds 5 --nodes 5 --seed 7); see chaos/README.md.
exec "$(dirname "${BASH_SOURCE[0]}")/run.sh" --scenario follower-snapshot "$@"
