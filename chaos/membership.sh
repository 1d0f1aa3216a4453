#!/usr/bin/env bash
# Membership changes under load (3 rounds): a node joins with --join and is added while the leader is
# killed (kill -9) mid-change, then an old node is removed while the leader is killed again; each
# round ends at the starting size. Then the checker, and the final members' stores compared byte for byte.
# Extra arguments go to `python -m kq.chaos` (e.g. --rounds 5 --seed 7); see chaos/README.md.
exec "$(dirname "${BASH_SOURCE[0]}")/run.sh" --scenario membership "$@"
