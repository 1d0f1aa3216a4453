#!/usr/bin/env bash
# Runs a local three-node kq cluster on 127.0.0.1, for trying kq out and for demos of failover.
#
#   deploy/run-cluster.sh [start]     install kq into .venv if needed, start nodes 1-3, wait for a leader
#   deploy/run-cluster.sh status      which node processes are alive, and each node's view of the cluster
#   deploy/run-cluster.sh stop        SIGTERM every node, SIGKILL after 10 s; no node process is left
#   deploy/run-cluster.sh restart N   stop node N and start it again
#   deploy/run-cluster.sh kill N      kill -9 node N (then watch the others elect a leader)
#   deploy/run-cluster.sh clean       stop, then delete what this script wrote in the run directory
#
# Ports (fixed, so the kq CLI's default --bootstrap finds them): node N serves gRPC on
# 127.0.0.1:$((9100 + N)) and Raft on 127.0.0.1:$((7100 + N)):
#   node 1: gRPC 9101, Raft 7101    node 2: gRPC 9102, Raft 7102    node 3: gRPC 9103, Raft 7103
#
# Environment:
#   KQ_RUN_DIR          data, logs (nodeN.log), PIDs (nodeN.pid), secret   (default: <project>/run)
#   KQ_VENV             virtualenv holding kq-node; created when missing   (default: <project>/.venv)
#   KQ_PYTHON           interpreter (3.11 or newer) that creates the venv  (default: python3)
#   KQ_SECRET           the cluster's Raft password (default: generated once into $KQ_RUN_DIR/secret)
#   KQ_BASE_GRPC_PORT   node N's gRPC port is this + N                     (default: 9100)
#   KQ_BASE_RAFT_PORT   node N's Raft port is this + N                     (default: 7100)
#   KQ_READY_TIMEOUT_S  how long start/restart wait for a leader           (default: 60)
# Other KQ_* variables reach kq-node as its options (e.g. KQ_LOG_LEVEL=debug); see `kq-node --help`.
#
# The script only ever signals the PIDs it recorded, after checking that each still runs kq-node on
# this run directory's data (a PID left over from before a reboot may belong to another program now).

set -euo pipefail

readonly NODE_IDS=(1 2 3)
readonly HOST=127.0.0.1
readonly STOP_TIMEOUT_S=10

PROJECT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly PROJECT_DIR
RUN_DIR=${KQ_RUN_DIR:-$PROJECT_DIR/run}
[[ $RUN_DIR == /* ]] || RUN_DIR=$PWD/$RUN_DIR  # Absolute: it is matched against each node's command line.
readonly RUN_DIR
readonly VENV=${KQ_VENV:-$PROJECT_DIR/.venv}
readonly BASE_GRPC_PORT=${KQ_BASE_GRPC_PORT:-9100}
readonly BASE_RAFT_PORT=${KQ_BASE_RAFT_PORT:-7100}
readonly READY_TIMEOUT_S=${KQ_READY_TIMEOUT_S:-60}

say() { printf 'kq: %s\n' "$*"; }
die() { printf 'kq: error: %s\n' "$*" >&2; exit 1; }

grpc_address() { printf '%s:%d' "$HOST" $((BASE_GRPC_PORT + $1)); }
raft_address() { printf '%s:%d' "$HOST" $((BASE_RAFT_PORT + $1)); }
pid_file() { printf '%s/node%s.pid' "$RUN_DIR" "$1"; }
data_dir() { printf '%s/node%s' "$RUN_DIR" "$1"; }
log_file() { printf '%s/node%s.log' "$RUN_DIR" "$1"; }

# id=raft=grpc for every node: kq-node's --peers.
peers_argument() {
    local id peers=()
    for id in "${NODE_IDS[@]}"; do peers+=("$id=$(raft_address "$id")=$(grpc_address "$id")"); done
    (IFS=,; printf '%s' "${peers[*]}")
}

# id=grpc for every node: the Python helper's view of the cluster.
grpc_map() {
    local id pairs=()
    for id in "${NODE_IDS[@]}"; do pairs+=("$id=$(grpc_address "$id")"); done
    (IFS=,; printf '%s' "${pairs[*]}")
}

bootstrap_list() {
    local id addresses=()
    for id in "${NODE_IDS[@]}"; do addresses+=("$(grpc_address "$id")"); done
    (IFS=,; printf '%s' "${addresses[*]}")
}

check_node_id() {
    [[ ${1:-} =~ ^[123]$ ]] || die "expected a node id 1, 2 or 3, got '${1:-}'"
}

check_settings() {
    local name value
    for name in BASE_GRPC_PORT BASE_RAFT_PORT READY_TIMEOUT_S; do
        value=${!name}
        [[ $value =~ ^[0-9]+$ ]] || die "KQ_$name must be a number, got '$value'"
    done
    ((BASE_GRPC_PORT >= 1 && BASE_GRPC_PORT + 3 <= 65535)) || die "KQ_BASE_GRPC_PORT out of range"
    ((BASE_RAFT_PORT >= 1 && BASE_RAFT_PORT + 3 <= 65535)) || die "KQ_BASE_RAFT_PORT out of range"
    ((BASE_GRPC_PORT + 3 < BASE_RAFT_PORT || BASE_RAFT_PORT + 3 < BASE_GRPC_PORT)) \
        || die "KQ_BASE_GRPC_PORT and KQ_BASE_RAFT_PORT ranges overlap"
}

# --- processes, by recorded PID only ---------------------------------------------------------------

# Prints node N's recorded PID when that process is alive and is kq-node on this run's data directory.
live_pid() {
    local file pid args
    file=$(pid_file "$1")
    [[ -f $file ]] || return 1
    pid=$(<"$file")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    # A zombie is dead for our purposes; a reused PID is not ours to signal.
    args=$(ps -o stat= -o args= -p "$pid" 2>/dev/null) || return 1
    [[ $args != Z* && $args == *kq-node*"--data-dir $(data_dir "$1")"* ]] || return 1
    printf '%s' "$pid"
}

# Waits until none of the given PIDs is alive, up to $1 seconds; returns 1 if some still are.
wait_gone() {
    local timeout_s=$1 pid alive
    shift
    local deadline=$((SECONDS + timeout_s))
    while :; do
        alive=0
        for pid in "$@"; do
            if kill -0 "$pid" 2>/dev/null && [[ $(ps -o stat= -p "$pid" 2>/dev/null) != Z* ]]; then
                alive=1
            fi
        done
        ((alive)) || return 0
        ((SECONDS < deadline)) || return 1
        sleep 0.1
    done
}

# Stops the given nodes: SIGTERM, then SIGKILL for any still alive after STOP_TIMEOUT_S.
stop_nodes() {
    local id pid pids=() ids=()
    for id in "$@"; do
        if pid=$(live_pid "$id"); then
            kill -CONT "$pid" 2>/dev/null || true  # A paused node (chaos demo) cannot handle SIGTERM.
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
            ids+=("$id")
        fi
    done
    if ((${#pids[@]})) && ! wait_gone "$STOP_TIMEOUT_S" "${pids[@]}"; then
        say "nodes still running after ${STOP_TIMEOUT_S} s; sending SIGKILL"
        for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
        wait_gone 5 "${pids[@]}" || die "could not stop PIDs ${pids[*]}"
    fi
    for id in "$@"; do rm -f "$(pid_file "$id")"; done
    if ((${#ids[@]})); then say "stopped node(s) ${ids[*]}"; fi
}

# --- installation ----------------------------------------------------------------------------------

ensure_venv() {
    [[ -x $VENV/bin/kq-node ]] && return 0
    local python=${KQ_PYTHON:-python3} install_log="$RUN_DIR/install.log"
    command -v "$python" >/dev/null || die "$python not found; install Python 3.11 or newer (or set KQ_PYTHON)"
    "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || die "$python is $("$python" -V 2>&1); kq needs Python 3.11 or newer (set KQ_PYTHON)"
    say "first run: installing kq into $VENV (a minute or two; log: $install_log)"
    mkdir -p "$RUN_DIR"
    if ! { "$python" -m venv "$VENV" && "$VENV/bin/python" -m pip install -e "$PROJECT_DIR"; } \
        >"$install_log" 2>&1; then
        tail -n 25 "$install_log" >&2
        die "installing kq failed; full log: $install_log"
    fi
    [[ -x $VENV/bin/kq-node ]] || die "the install did not produce $VENV/bin/kq-node; see $install_log"
    say "installed kq into $VENV"
}

# --- the cluster -----------------------------------------------------------------------------------

cluster_secret() {
    if [[ -n ${KQ_SECRET:-} ]]; then
        printf '%s' "$KQ_SECRET"
        return
    fi
    local file="$RUN_DIR/secret"
    if [[ ! -s $file ]]; then
        [[ ${1:-} == create ]] || die "no $file and no KQ_SECRET: set KQ_SECRET to the secret the cluster started with"
        (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$file")
    fi
    chmod 600 "$file"
    cat "$file"
}

# Fails when a port node N needs is taken (kq-node would otherwise retry binding Raft forever).
check_ports_free() {
    local id ports=()
    for id in "$@"; do ports+=($((BASE_GRPC_PORT + id)) $((BASE_RAFT_PORT + id))); done
    "$VENV/bin/python" -I - "$HOST" "${ports[@]}" <<'PY'
import socket
import sys

host, ports = sys.argv[1], [int(p) for p in sys.argv[2:]]
taken = []
for port in ports:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # The nodes set SO_REUSEADDR too, so a port in TIME_WAIT after a restart counts as free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            taken.append(f"{host}:{port} ({error.strerror})")
if taken:
    print("kq: error: port(s) in use: " + ", ".join(taken), file=sys.stderr)
    print("kq: stop whatever holds them, or set KQ_BASE_GRPC_PORT / KQ_BASE_RAFT_PORT", file=sys.stderr)
    sys.exit(1)
PY
}

start_node() {
    local id=$1 secret=$2 log
    log=$(log_file "$id")
    mkdir -p "$(data_dir "$id")"
    printf '\n=== %s: starting node %s ===\n' "$(date '+%Y-%m-%d %H:%M:%S')" "$id" >>"$log"
    # The secret goes in the environment (kq-node reads KQ_SECRET), not argv: other users can read argv.
    KQ_SECRET=$secret nohup "$VENV/bin/kq-node" \
        --node-id "$id" \
        --grpc-address "$(grpc_address "$id")" \
        --raft-address "$(raft_address "$id")" \
        --peers "$(peers_argument)" \
        --data-dir "$(data_dir "$id")" \
        >>"$log" 2>&1 </dev/null &
    printf '%s\n' "$!" >"$(pid_file "$id")"
}

# The Python helper: `wait TIMEOUT_S REQUIRED_IDS PIDS` or `status`, over the nodes in $2 (id=grpc,...).
cluster_helper() {
    "$VENV/bin/python" -I - "$@" <<'PY'
import os
import sys
import time

from kq.client import KqClient, KqClientError, NodeStatus

POLL_S = 0.25


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return True  # No /proc here: kill(0) succeeding is the best we know.
    except ProcessLookupError:
        return False


def statuses(client: KqClient, ids: list[str]) -> dict[str, NodeStatus | KqClientError]:
    return dict(zip(ids, client.cluster_status(), strict=True))


def wait(client: KqClient, ids: list[str], timeout_s: float, required: list[str], pids: dict[str, int]) -> int:
    """Exits 0 once a leader leads every required node and they are all ready; prints the leader."""
    deadline = time.monotonic() + timeout_s
    seen: dict[str, NodeStatus | KqClientError] = {}
    while time.monotonic() < deadline:
        dead = [node for node in required if not alive(pids[node])]
        if dead:
            print(f"kq: error: node(s) {', '.join(dead)} exited during startup", file=sys.stderr)
            return 3
        seen = statuses(client, ids)
        leaders = [s for s in seen.values() if isinstance(s, NodeStatus) and s.role == "leader"]
        for leader in leaders:
            if all(
                isinstance(s := seen[node], NodeStatus) and s.ready and s.leader_id == leader.node_id
                for node in required
            ):
                print(leader.node_id, leader.address)
                return 0
        time.sleep(POLL_S)
    print(f"kq: error: no leader with node(s) {', '.join(required)} ready within {timeout_s:.0f} s", file=sys.stderr)
    for node, status in seen.items():
        print(f"kq:   node {node}: {describe(status)}", file=sys.stderr)
    return 2


def describe(status: NodeStatus | KqClientError) -> str:
    if isinstance(status, KqClientError):
        return f"unreachable ({str(status).splitlines()[0][:80]})"
    leader = status.leader_id or "-"
    return f"{status.role}, leader {leader}, term {status.term}, ready {status.ready}"


def table(client: KqClient, ids: list[str]) -> int:
    print(f"{'node':<5} {'address':<22} {'role':<10} {'leader':<7} {'term':>5} {'commit':>8} {'applied':>8} ready")
    for node, status in statuses(client, ids).items():
        if isinstance(status, KqClientError):
            print(f"{node:<5} {client.bootstrap[ids.index(node)]:<22} unreachable")
            continue
        print(
            f"{node:<5} {status.address:<22} {status.role:<10} {status.leader_id or '-':<7} {status.term:>5} "
            f"{status.commit_index:>8} {status.applied_index:>8} {'yes' if status.ready else 'no'}"
        )
    return 0


def main(argv: list[str]) -> int:
    mode, nodes = argv[0], dict(pair.split("=", 1) for pair in argv[1].split(","))
    ids = list(nodes)
    with KqClient([nodes[node] for node in ids], retry_timeout_s=1.0, rpc_timeout_s=1.0) as client:
        if mode == "wait":
            pids = {node: int(pid) for node, pid in (pair.split("=") for pair in argv[4].split(","))}
            return wait(client, ids, float(argv[2]), argv[3].split(","), pids)
        return table(client, ids)


sys.exit(main(sys.argv[1:]))
PY
}

# Waits until a leader leads the given nodes and they are ready; prints "leader_id leader_address".
wait_ready() {
    local id pid pids=() required=()
    for id in "$@"; do
        # The recorded PID as is: a node started a moment ago may not have exec'd kq-node yet, so
        # live_pid's command-line check would not recognise it. The helper watches it for exits.
        pid=$(<"$(pid_file "$id")") || die "node $id has no PID file"
        pids+=("$id=$pid")
        required+=("$id")
    done
    local joined_pids joined_required
    joined_pids=$(IFS=,; printf '%s' "${pids[*]}")
    joined_required=$(IFS=,; printf '%s' "${required[*]}")
    if ! cluster_helper wait "$(grpc_map)" "$READY_TIMEOUT_S" "$joined_required" "$joined_pids"; then
        for id in "$@"; do
            printf '\n--- last lines of %s ---\n' "$(log_file "$id")" >&2
            tail -n 10 "$(log_file "$id")" >&2 || true
        done
        return 1
    fi
}

refuse_if_running() {
    local id pid
    for id in "$@"; do
        if pid=$(live_pid "$id"); then
            die "node $id is already running (PID $pid); use '$0 stop' or '$0 restart $id'"
        fi
    done
}

print_usage_hints() {
    local leader_id=$1 leader_address=$2 id
    say "cluster is up; leader: node $leader_id ($leader_address)"
    for id in "${NODE_IDS[@]}"; do
        printf '  node %s  gRPC %s  Raft %s  PID %s  log %s\n' "$id" "$(grpc_address "$id")" \
            "$(raft_address "$id")" "$(live_pid "$id" || echo -)" "$(log_file "$id")"
    done
    local bootstrap=""
    if ((BASE_GRPC_PORT != 9100)); then
        bootstrap=" --bootstrap $(bootstrap_list)"
        printf '\nThese are not the kq CLI'"'"'s default ports: commands below pass --bootstrap.\n'
    fi
    cat <<EOF

Try it (kq is in $VENV/bin; activate it, or call $VENV/bin/kq directly):
  source $VENV/bin/activate
  kq$bootstrap topics create demo --partitions 3
  kq$bootstrap produce demo hello world
  kq$bootstrap consume demo --from-beginning --max 2
  kq$bootstrap cluster status

Failover demo:  $0 kill $leader_id   (then: $0 status, $0 restart $leader_id)
Stop:           $0 stop
EOF
}

# --- subcommands -----------------------------------------------------------------------------------

command_start() {
    mkdir -p "$RUN_DIR"
    ensure_venv
    refuse_if_running "${NODE_IDS[@]}"
    check_ports_free "${NODE_IDS[@]}"
    local secret id started=$SECONDS
    secret=$(cluster_secret create)
    for id in "${NODE_IDS[@]}"; do start_node "$id" "$secret"; done
    say "started nodes ${NODE_IDS[*]}; waiting up to ${READY_TIMEOUT_S} s for a leader"
    local leader leader_id leader_address
    if ! leader=$(wait_ready "${NODE_IDS[@]}"); then
        stop_nodes "${NODE_IDS[@]}"
        die "the cluster did not become ready; logs in $RUN_DIR"
    fi
    read -r leader_id leader_address <<<"$leader"
    say "ready in $((SECONDS - started)) s"
    print_usage_hints "$leader_id" "$leader_address"
}

command_stop() {
    stop_nodes "${NODE_IDS[@]}"
    local id pid
    for id in "${NODE_IDS[@]}"; do
        if pid=$(live_pid "$id"); then die "node $id (PID $pid) is still running"; fi
    done
    say "no node is running"
}

command_status() {
    local id pid any=0
    for id in "${NODE_IDS[@]}"; do
        if pid=$(live_pid "$id"); then
            printf 'node %s  running  PID %-8s gRPC %s  Raft %s\n' "$id" "$pid" "$(grpc_address "$id")" \
                "$(raft_address "$id")"
            any=1
        else
            printf 'node %s  stopped\n' "$id"
        fi
    done
    if ((!any)); then return 0; fi
    [[ -x $VENV/bin/python ]] || die "no $VENV; cannot ask the nodes"
    printf '\n'
    cluster_helper status "$(grpc_map)"
}

command_restart() {
    local id=$1 secret
    check_node_id "$id"
    [[ -x $VENV/bin/kq-node ]] || die "no $VENV/bin/kq-node; run '$0 start' first"
    secret=$(cluster_secret)
    stop_nodes "$id"
    check_ports_free "$id"
    start_node "$id" "$secret"
    say "started node $id (PID $(<"$(pid_file "$id")")); waiting for it to rejoin"
    local leader leader_id leader_address
    leader=$(wait_ready "$id") || die "node $id did not rejoin; see $(log_file "$id") and '$0 status'"
    read -r leader_id leader_address <<<"$leader"
    say "node $id is ready; leader: node $leader_id ($leader_address)"
}

command_kill() {
    local id=$1 pid
    check_node_id "$id"
    pid=$(live_pid "$id") || die "node $id is not running"
    kill -KILL "$pid"
    wait_gone 5 "$pid" || die "PID $pid survived SIGKILL"
    rm -f "$(pid_file "$id")"
    say "killed node $id (PID $pid) with SIGKILL"
    local other alive=()
    for other in "${NODE_IDS[@]}"; do
        if live_pid "$other" >/dev/null; then alive+=("$other"); fi
    done
    if ((${#alive[@]} * 2 > ${#NODE_IDS[@]})); then
        local leader leader_id leader_address
        leader=$(wait_ready "${alive[@]}") || die "no leader among nodes ${alive[*]}; see '$0 status'"
        read -r leader_id leader_address <<<"$leader"
        say "nodes ${alive[*]} follow leader node $leader_id ($leader_address); '$0 restart $id' brings node $id back"
    else
        say "only ${#alive[@]} of ${#NODE_IDS[@]} nodes run: no majority, no leader until one restarts"
    fi
}

command_clean() {
    command_stop
    [[ -d $RUN_DIR ]] || return 0
    # Delete only what this script creates, so a KQ_RUN_DIR pointing somewhere shared loses nothing else.
    local id
    for id in "${NODE_IDS[@]}"; do
        rm -rf "$(data_dir "$id")"
        rm -f "$(log_file "$id")" "$(pid_file "$id")"
    done
    rm -f "$RUN_DIR/secret" "$RUN_DIR/install.log"
    rmdir "$RUN_DIR" 2>/dev/null || say "kept $RUN_DIR: it holds files this script did not create"
    say "removed the cluster's data, logs and secret"
}

main() {
    check_settings
    local subcommand=${1:-start}
    case $subcommand in
        start) command_start ;;
        stop) command_stop ;;
        status) command_status ;;
        restart) command_restart "${2:-}" ;;
        kill) command_kill "${2:-}" ;;
        clean) command_clean ;;
        -h | --help | help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" ;;
        *) die "unknown command '$subcommand'; use start, stop, status, restart N, kill N or clean" ;;
    esac
}

main "$@"
