#!/usr/bin/env bash
# Faults of every kind drawn at random from the seed, one after another on one cluster.
# Extra arguments go to `python -m kq.chaos` (e.g. --rounds 5 --nodes 5 --seed 7); see chaos/README.md.
exec "$(dirname "${BASH_SOURCE[0]}")/run.sh" --scenario mixed "$@"
