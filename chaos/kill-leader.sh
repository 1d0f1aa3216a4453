#!/usr/bin/env bash
# kill -9 of the leader under load, restarted each time (20 rounds), then the checker.
# Extra arguments go to `python -m kq.chaos` (e.g. --rounds 5 --nodes 5 --seed 7); see chaos/README.md.
exec "$(dirname "${BASH_SOURCE[0]}")/run.sh" --scenario leader-kill "$@"
