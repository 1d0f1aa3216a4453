#!/usr/bin/env bash
# Runs a local kq cluster on 127.0.0.1 (three nodes), for trying kq out and for failover demos.
#
#   deploy/run-cluster.sh [start]     install kq into .venv if needed, start every member not running,
#                                     wait for a leader (a second start leaves running nodes alone);
#                                     `start --secure`: mutual TLS (certificates in certs/), --auth, ACLs
#   deploy/run-cluster.sh status      each node's process (PID) and its view of the cluster; the leader
#   deploy/run-cluster.sh logs [N]    the last lines of each node's log (-n LINES; --follow keeps going)
#   deploy/run-cluster.sh stop        SIGTERM every node by its recorded PID, SIGKILL after 10 s
#   deploy/run-cluster.sh restart N   stop node N and start it again
#   deploy/run-cluster.sh kill N      kill -9 of node N (then watch the others elect a leader)
#   deploy/run-cluster.sh add         start one more node (the next id) with --join, add it to the voters
#                                     (kq cluster add-node), wait until it is ready
#   deploy/run-cluster.sh remove N    remove node N from the voters (it may be down), stop it by its PID;
#                                     its data stays (clean deletes it), and so its id is not reused
#   deploy/run-cluster.sh clean       stop, then delete what these commands wrote in the run directory
#
# The run directory remembers the members ($KQ_RUN_DIR/members, one id a line): the first start writes
# 1..KQ_NODES, add and remove change it, and every other command acts on those nodes (start after stop
# starts the current members). Node ids run from 1 to 9.
#
# This script only installs kq; every command is `python -m kq.deploy` (deploy/cli.py on kq's one
# cluster harness, deploy/cluster.py), which signals only the PIDs it recorded, and only while each
# still runs kq-node on this run directory's data.
#
# Ports (fixed, so the kq CLI's default --bootstrap finds them): node N serves gRPC on
# 127.0.0.1:$((9100 + N)), Raft on 127.0.0.1:$((7100 + N)), Kafka on 127.0.0.1:$((9091 + N)) and
# HTTP (/metrics, /readyz) on 127.0.0.1:$((9640 + N)); an added node follows the same scheme.
#
# Environment:
#   KQ_RUN_DIR          data, logs (nodeN.log), PIDs (nodeN.pid), secret, members
#                                                                          (default: <project>/run)
#   KQ_VENV             virtualenv holding kq; created when missing        (default: <project>/.venv)
#   KQ_PYTHON           interpreter (3.11 or newer) that creates the venv  (default: python3)
#   KQ_SECRET           the cluster's Raft password (default: generated once into $KQ_RUN_DIR/secret)
#   KQ_BASE_GRPC_PORT   node N's gRPC port is this + N                     (default: 9100)
#   KQ_BASE_RAFT_PORT   node N's Raft port is this + N                     (default: 7100)
#   KQ_BASE_KAFKA_PORT  node N's Kafka port is this + N                    (default: 9091)
#   KQ_BASE_HTTP_PORT   node N's HTTP port is this + N                     (default: 9640)
#   KQ_NODES            how many nodes the first start starts              (default: 3)
#   KQ_READY_TIMEOUT_S  how long the commands wait for a leader           (default: 60)
#   KQ_RACKS            each node's rack, comma-separated, e.g. a,b,c: consumers with a client.rack
#                       fetch from that rack's node (KIP-392); an added node has none (default: none)
#   KQ_DURABILITY       replicated or fsync: when a write is acknowledged (default: replicated;
#                       README.md, "Durability"); passed to every node as --durability
# Other KQ_* variables reach kq-node as its options (e.g. KQ_LOG_LEVEL=debug); see `kq-node --help`.
# Each node runs one process (one Raft group): its fixed ports are next to the next node's, and a
# node's worker processes bind its ports plus their group (kq-node --processes, whose default `auto`
# would take the machine's cores); KQ_PROCESSES is not passed on.

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
