#!/usr/bin/env bash
# A follower's disk fills under load (a tmpfs as root, else a small LMDB map; then its map), it must
# stop with one line while the majority writes on, then catch up once given room; then the checker.
# Extra arguments go to `python -m kq.chaos` (e.g. --rounds 2 --seed 7); see chaos/README.md.
exec "$(dirname "${BASH_SOURCE[0]}")/run.sh" --scenario disk-full "$@"
