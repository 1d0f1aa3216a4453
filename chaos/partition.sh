#!/usr/bin/env bash
# Network partitions (needs root): the leader cut off from the majority, then a minority of followers.
# Extra arguments go to `python -m kq.chaos` (e.g. --rounds 5 --nodes 5 --seed 7); see chaos/README.md.
exec "$(dirname "${BASH_SOURCE[0]}")/run.sh" --scenario partition-leader --scenario partition-minority "$@"
