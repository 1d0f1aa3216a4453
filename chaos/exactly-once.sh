#!/usr/bin/env bash
# Transactional consume-transform-produce workers (confluent-kafka, send_offsets_to_transaction) while
# group 0's leader and partition groups' leaders are killed and group 0's leader paused (12 rounds),
# then the exactly-once checker. Extra arguments go to `python -m kq.chaos` (e.g. --processes 3
# --rounds 6 --seed 2); see chaos/README.md.
exec "$(dirname "${BASH_SOURCE[0]}")/run.sh" --scenario exactly-once "$@"
