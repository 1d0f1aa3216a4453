#!/usr/bin/env bash
# Runs `python -m kq.chaos` with kq's virtualenv; every argument is passed on (see `chaos/run.sh --help`).
#
#   chaos/run.sh                      the full scenario set on three nodes (6-8 minutes here)
#   chaos/run.sh --nodes 5            the same on five nodes
#   chaos/run.sh -s leader-kill -s partition-leader --rounds 5 --seed 7
#   chaos/run.sh --list               what each scenario does
#
# Partition scenarios need root (network namespaces); without it they report "skipped: needs root".
# Environment: KQ_VENV, the virtualenv holding kq (default: <project>/.venv; `bash .ci/run` or
# `deploy/run-cluster.sh` create it).

set -euo pipefail

PROJECT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly PROJECT_DIR
readonly VENV=${KQ_VENV:-$PROJECT_DIR/.venv}

if [[ ! -x $VENV/bin/python ]]; then
    echo "chaos: no virtualenv at $VENV; create it with 'bash .ci/run' or 'deploy/run-cluster.sh'" >&2
    exit 2
fi
cd "$PROJECT_DIR"
exec "$VENV/bin/python" -m kq.chaos "$@"
