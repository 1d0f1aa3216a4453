#!/usr/bin/env bash
# kill -9 of the leader (12 rounds) while retention trims the topic 4 times a second, then the checker
# (records below the final log start count as trimmed gaps, the rest must all be there).
# Extra arguments go to `python -m kq.chaos` (e.g. --rounds 5 --seed 7); see chaos/README.md.
exec "$(dirname "${BASH_SOURCE[0]}")/run.sh" --scenario retention-leader-kill "$@"
