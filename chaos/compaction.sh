#!/usr/bin/env bash
# kill -9 of the leader (12 rounds) while the leader compacts a cleanup.policy=compact topic by key
# (16 keys, a tenth tombstones), then the checker (superseded records count as compacted gaps).
# Extra arguments go to `python -m kq.chaos` (e.g. --rounds 5 --seed 7); see chaos/README.md.
exec "$(dirname "${BASH_SOURCE[0]}")/run.sh" --scenario compaction-leader-kill "$@"
