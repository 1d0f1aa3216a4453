#!/usr/bin/env bash
# Runs a local kq cluster on 127.0.0.1 (three nodes), for trying kq out and for failover demos.
#
#   deploy/run-cluster.sh [start]     install kq into .venv if needed, start every node not running,
#                                     wait for a leader (a second start leaves running nodes alone)
#   deploy/run-cluster.sh status      each node's process (PID) and its view of the cluster; the leader
#   deploy/run-cluster.sh logs [N]    the last lines of each node's log (-n LINES; --follow keeps going)
#   deploy/run-cluster.sh stop        SIGTERM every node by its recorded PID, SIGKILL after 10 s
#   deploy/run-cluster.sh restart N   stop node N and start it again
#   deploy/run-cluster.sh kill N      kill -9 of node N (then watch the others elect a leader)
#   deploy/run-cluster.sh clean       stop, then delete what these commands wrote in the run directory
#
# This script only installs kq; every command is `python -m kq.deploy` (deploy/cli.py on kq's one
# cluster harness, deploy/cluster.py), which signals only the PIDs it recorded, and only while each
# still runs kq-node on this run directory's data.
#
# Ports (fixed, so the kq CLI's default --bootstrap finds them): node N serves gRPC on
# 127.0.0.1:$((9100 + N)) and Raft on 127.0.0.1:$((7100 + N)).
#
# Environment:
#   KQ_RUN_DIR          data, logs (nodeN.log), PIDs (nodeN.pid), secret   (default: <project>/run)
#   KQ_VENV             virtualenv holding kq; created when missing        (default: <project>/.venv)
#   KQ_PYTHON           interpreter (3.11 or newer) that creates the venv  (default: python3)
#   KQ_SECRET           the cluster's Raft password (default: generated once into $KQ_RUN_DIR/secret)
#   KQ_BASE_GRPC_PORT   node N's gRPC port is this + N                     (default: 9100)
#   KQ_BASE_RAFT_PORT   node N's Raft port is this + N                     (default: 7100)
#   KQ_READY_TIMEOUT_S  how long start, restart and kill wait for a leader (default: 60)
#   KQ_RACKS            each node's rack, comma-separated, e.g. a,b,c: consumers with a client.rack
#                       fetch from that rack's node (KIP-392)          (default: none)
#   KQ_DURABILITY       replicated or fsync: when a write is acknowledged (default: replicated;
#                       README.md, "Durability"); passed to every node as --durability
# Other KQ_* variables reach kq-node as its options (e.g. KQ_LOG_LEVEL=debug); see `kq-node --help`.

set -euo pipefail

PROJECT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly PROJECT_DIR
readonly VENV=${KQ_VENV:-$PROJECT_DIR/.venv}
KQ_RUN_DIR=${KQ_RUN_DIR:-$PROJECT_DIR/run}
export KQ_RUN_DIR

say() { printf 'kq: %s\n' "$*"; }
die() { printf 'kq: error: %s\n' "$*" >&2; exit 1; }

# Creates the virtualenv and installs kq into it (editable) when it has no kq yet (or one from before
# the `kq` namespace, whose kq-node would not find kq.deploy).
ensure_venv() {
    [[ -x $VENV/bin/kq-node ]] && "$VENV/bin/python" -c 'import kq.deploy' 2>/dev/null && return 0
    local python=${KQ_PYTHON:-python3} install_log="$KQ_RUN_DIR/install.log"
    command -v "$python" >/dev/null || die "$python not found; install Python 3.11 or newer (or set KQ_PYTHON)"
    "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || die "$python is $("$python" -V 2>&1); kq needs Python 3.11 or newer (set KQ_PYTHON)"
    say "first run: installing kq into $VENV (a minute or two; log: $install_log)"
    mkdir -p "$KQ_RUN_DIR"
    if ! { "$python" -m venv "$VENV" && "$VENV/bin/python" -m pip install -e "$PROJECT_DIR"; } \
        >"$install_log" 2>&1; then
        tail -n 25 "$install_log" >&2
        die "installing kq failed; full log: $install_log"
    fi
    [[ -x $VENV/bin/kq-node ]] || die "the install did not produce $VENV/bin/kq-node; see $install_log"
    say "installed kq into $VENV"
}

main() {
    local command=${1:-start}
    case $command in
        -h | --help | help)
            sed -n '2,/^$/s/^# \{0,1\}//p' "$0"
            return 0
            ;;
        start) ensure_venv ;;
        *) [[ -x $VENV/bin/kq-node ]] || die "no kq in $VENV; run '$0 start' first (or set KQ_VENV)" ;;
    esac
    (($#)) && shift
    exec "$VENV/bin/python" -m kq.deploy --program "$0" "$command" "$@"
}

main "$@"
