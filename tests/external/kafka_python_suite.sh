#!/usr/bin/env bash
# Runs kafka-python's own integration tests (test/integration/ of its git repository) against kq.
#
# Why: kafka-python's suite is written against a real Kafka broker and exercises its clients (producer,
# consumer, groups, admin) in ways kq's own tests do not; it can run against an external broker
# (KAFKA_URI), so it is a second opinion on how Kafka-like kq's listener is. It is not part of
# `python -m pytest`: it needs kafka-python's repository, and takes several minutes.
#
# How:
#   tests/external/kafka_python_suite.sh [--source DIR] [--out DIR] [--timeout-s N] [--kafka-version X.Y]
#                                        [-- PYTEST_ARGS...]
#
#   --source DIR        a kafka-python checkout (its test/ and kafka/ package are used: the tests run
#                       the client code of their own version). Without it, the script clones
#                       $KAFKA_PYTHON_REPOSITORY at the tag of the installed kafka-python (or, when that
#                       tag is missing, the newest 3.0.x tag) into a temp dir.
#   --out DIR           results: junit.xml (all tests), summary.txt, per-test XML and logs, the nodes' logs
#                       (default: <project>/run/kafka-python-suite)
#   --timeout-s N       each test runs in its own pytest process under `timeout` (default 180 s; the
#                       project's test extra has no pytest-timeout): a hanging test is killed and counted
#                       as "timeout", and the run goes on.
#   --kafka-version V   KAFKA_VERSION for the suite, which gates its tests (default: the Kafka release
#                       kafka-python infers from kq's ApiVersions; see `probe` in kafka_python_suite.py)
#   PYTEST_ARGS         passed to the collection run, e.g. `-- -k consumer` (default: all of
#                       test/integration except test_ssl_integration.py, which starts its own Kafka)
#
# It starts a three-node kq cluster on free loopback ports (kq.deploy's LocalCluster, through
# kafka_python_suite.py), points the suite at one node (KAFKA_URI=kafka://host:port; the clients find
# the others in Metadata), and stops every node by PID on exit. Exit status: 0 when the suite ran,
# whatever the tests' outcomes; non-zero only when it could not run (no source, no cluster, no tests).
#
# Environment: KQ_VENV (default <project>/.venv) is the virtualenv holding kq, pytest and kafka-python;
# KAFKA_PYTHON_REPOSITORY (default https://github.com/dpkp/kafka-python) is what is cloned without --source
# (a mirror, or a local repository path).

set -euo pipefail

PROJECT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
readonly PROJECT_DIR
readonly VENV=${KQ_VENV:-$PROJECT_DIR/.venv}
readonly PYTHON=$VENV/bin/python
readonly REPOSITORY_URL=${KAFKA_PYTHON_REPOSITORY:-https://github.com/dpkp/kafka-python}
readonly CLUSTER_READY_TIMEOUT_S=90
readonly CLUSTER_STOP_TIMEOUT_S=40

say() { printf 'kafka-python-suite: %s\n' "$*"; }
die() { printf 'kafka-python-suite: error: %s\n' "$*" >&2; exit 2; }

source_dir=""
out_dir=$PROJECT_DIR/run/kafka-python-suite
timeout_s=180
kafka_version=""
pytest_args=()
while (($#)); do
    case $1 in
        --source) source_dir=$(cd "${2:?--source needs a directory}" && pwd); shift 2 ;;
        --out) out_dir=${2:?--out needs a directory}; shift 2 ;;
        --timeout-s) timeout_s=${2:?--timeout-s needs seconds}; shift 2 ;;
        --kafka-version) kafka_version=${2:?--kafka-version needs X.Y}; shift 2 ;;
        --) shift; pytest_args=("$@"); break ;;
        -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
[[ $timeout_s =~ ^[1-9][0-9]*$ ]] || die "--timeout-s must be a positive whole number of seconds"
[[ -x $PYTHON ]] || die "no $PYTHON: create the venv (python3 -m venv .venv; .venv/bin/pip install -e '.[test]')"
"$PYTHON" -c 'import kq.deploy, kafka, pytest' 2>/dev/null \
    || die "$VENV lacks kq, kafka-python or pytest: .venv/bin/pip install -e '.[test]'"

work_dir=$(mktemp -d "${TMPDIR:-/tmp}/kq-kafka-python-suite.XXXXXX")
cluster_pid=""

# Stops the cluster helper (which stops its nodes by PID), then kills by PID any node still running on
# this run's data (the PID files the helper's LocalCluster wrote), and removes the temp dir.
cleanup() {
    local status=$? pid_file pid
    trap - EXIT INT TERM
    if [[ -n $cluster_pid ]] && kill -0 "$cluster_pid" 2>/dev/null; then
        kill -TERM "$cluster_pid" 2>/dev/null || true
        for ((waited = 0; waited < CLUSTER_STOP_TIMEOUT_S * 10; waited++)); do
            kill -0 "$cluster_pid" 2>/dev/null || break
            sleep 0.1
        done
    fi
    for pid_file in "$work_dir"/cluster/node*.pid; do
        [[ -f $pid_file ]] || continue
        pid=$(<"$pid_file")
        if [[ $pid =~ ^[0-9]+$ ]] && grep -qF -- "$work_dir/cluster" "/proc/$pid/cmdline" 2>/dev/null; then
            say "node PID $pid still running after stop: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    if [[ -d $work_dir/cluster ]]; then
        mkdir -p "$out_dir/nodes"
        cp "$work_dir"/cluster/node*.log "$out_dir/nodes/" 2>/dev/null || true
    fi
    rm -rf "$work_dir"
    exit "$status"
}
trap cleanup EXIT
trap 'say "unexpected failure at line $LINENO (exit status $?)" >&2' ERR
trap 'exit 130' INT
trap 'exit 143' TERM

# The tag of the installed kafka-python, else the newest 3.0.x tag; cloned shallow into the temp dir.
clone_source() {
    local installed tags tag
    installed=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("kafka-python"))')
    command -v git >/dev/null || die "git is needed to clone $REPOSITORY_URL (or pass --source DIR)"
    tags=$(git ls-remote --tags --refs "$REPOSITORY_URL" | sed 's|.*refs/tags/||') \
        || die "cannot list the tags of $REPOSITORY_URL (offline? pass --source DIR)"
    if grep -qxF -- "$installed" <<<"$tags"; then
        tag=$installed
    else
        tag=$(grep -E '^3\.0\.[0-9]+$' <<<"$tags" | sort -V | tail -n 1)
        [[ -n $tag ]] || die "$REPOSITORY_URL has neither tag $installed nor any 3.0.x tag"
        say "no tag $installed (the installed kafka-python); using the newest 3.0.x tag, $tag"
    fi
    say "cloning $REPOSITORY_URL at $tag"
    git -c advice.detachedHead=false clone --quiet --depth 1 --branch "$tag" "$REPOSITORY_URL" "$work_dir/kafka-python" \
        || die "git clone of $REPOSITORY_URL at $tag failed"
    source_dir=$work_dir/kafka-python
}

if [[ -z $source_dir ]]; then
    clone_source
fi
[[ -f $source_dir/test/integration/conftest.py && -f $source_dir/test/testutil.py ]] \
    || die "$source_dir has no test/integration/conftest.py or test/testutil.py: not a kafka-python checkout"
source_version=$(git -C "$source_dir" describe --tags 2>/dev/null \
    || sed -n "s/^__version__ = '\(.*\)'/\1/p" "$source_dir/kafka/version.py")
say "kafka-python suite from $source_dir ($source_version)"

# Only what an earlier run wrote is removed: --out may name a directory holding other things.
mkdir -p "$out_dir"
rm -rf "$out_dir/tests" "$out_dir/nodes"
rm -f "$out_dir"/{index.tsv,junit.xml,summary.txt,collect.txt,cluster.log,node-deaths.txt}
mkdir -p "$out_dir/tests"
out_dir=$(cd "$out_dir" && pwd)

say "starting a 3-node kq cluster on free loopback ports"
ready_file=$work_dir/cluster.ready
(cd "$PROJECT_DIR" && exec "$PYTHON" -m tests.external.kafka_python_suite cluster \
    --dir "$work_dir/cluster" --ready-file "$ready_file") >"$out_dir/cluster.log" 2>&1 &
cluster_pid=$!
for ((waited = 0; waited < CLUSTER_READY_TIMEOUT_S * 10; waited++)); do
    [[ -f $ready_file ]] && break
    kill -0 "$cluster_pid" 2>/dev/null || { tail -n 30 "$out_dir/cluster.log" >&2; die "the cluster did not start"; }
    sleep 0.1
done
[[ -f $ready_file ]] || die "the cluster was not ready within ${CLUSTER_READY_TIMEOUT_S}s"
bootstrap=$(sed -n 's/^bootstrap=//p' "$ready_file")
node_pids=$(sed -n 's/^pids=//p' "$ready_file")
say "kq nodes (id:PID) $node_pids; Kafka bootstrap $bootstrap"

# The suite's fixtures take one broker address; the clients learn the other nodes from Metadata.
export KAFKA_URI=kafka://${bootstrap%%,*}
# Its fixtures insist that a Kafka installation directory exists even for an external broker; none is used.
export KAFKA_ROOT=$work_dir/no-kafka-installation
mkdir -p "$KAFKA_ROOT"
export PYTHONPATH=$source_dir${PYTHONPATH:+:$PYTHONPATH}
if [[ -z $kafka_version ]]; then
    kafka_version=$(cd "$PROJECT_DIR" && "$PYTHON" -m tests.external.kafka_python_suite probe \
        --bootstrap "$bootstrap") || die "could not ask kq for its API versions"
fi
export KAFKA_VERSION=$kafka_version
say "KAFKA_URI=$KAFKA_URI KAFKA_VERSION=$KAFKA_VERSION"

# kafka-python's pyproject adds --timeout (pytest-timeout) to every run: cleared with -o addopts=.
# Hypothesis's plugin (installed for kq's tests) is left out: at session end it imports modules that
# pytest's assertion rewriter then fails to compile on Python 3.11.7 ("AST constructor recursion depth
# mismatch"), turning every run's exit status into an internal error.
pytest_base=("$PYTHON" -m pytest -o addopts= -p no:cacheprovider -p no:hypothesispytest --rootdir "$source_dir")
if ((${#pytest_args[@]} == 0)); then
    pytest_args=(test/integration --ignore test/integration/test_ssl_integration.py)
fi
(cd "$source_dir" && "${pytest_base[@]}" --collect-only -q "${pytest_args[@]}") >"$out_dir/collect.txt" 2>&1 \
    || { tail -n 30 "$out_dir/collect.txt" >&2; die "pytest could not collect the suite"; }
mapfile -t node_ids < <(grep '::' "$out_dir/collect.txt")
((${#node_ids[@]})) || die "no tests collected (see $out_dir/collect.txt)"
say "${#node_ids[@]} tests, each in its own pytest process (timeout ${timeout_s}s)"

# Each node must outlive every test: a node that exits is a kq bug worth more than any test result.
check_nodes() {
    local entry node_id pid
    for entry in $node_pids; do
        node_id=${entry%%:*} pid=${entry#*:}
        if ! kill -0 "$pid" 2>/dev/null; then
            say "NODE $node_id (PID $pid) EXITED during or before $1" | tee -a "$out_dir/node-deaths.txt"
            node_pids=${node_pids/$entry/}
        fi
    done
}

: >"$out_dir/index.tsv"
for index in "${!node_ids[@]}"; do
    node_id=${node_ids[$index]}
    name=$(printf '%03d' "$index")
    exit_code=0
    (cd "$source_dir" && exec timeout -k 10 "$timeout_s" "${pytest_base[@]}" -q \
        --junitxml "$out_dir/tests/$name.xml" "$node_id") >"$out_dir/tests/$name.log" 2>&1 || exit_code=$?
    printf '%s\t%s\t%s\n' "$node_id" "$exit_code" "tests/$name.xml" >>"$out_dir/index.tsv"
    outcome=$(grep -E '^(=+ )?[0-9]+ [a-z]+.* in [0-9.]+s' "$out_dir/tests/$name.log" | tail -n 1 | sed 's/^=* *//; s/ *=*$//' || true)
    outcome=${outcome:-"pytest exited with $exit_code; see $out_dir/tests/$name.log"}
    if ((exit_code == 124 || exit_code == 137)); then outcome="TIMEOUT after ${timeout_s}s"; fi
    printf '  [%s/%s] %s: %s\n' "$((index + 1))" "${#node_ids[@]}" "$node_id" "$outcome"
    check_nodes "$node_id"
done

tracebacks=$(cat "$work_dir"/cluster/node*.log 2>/dev/null | grep -c '^Traceback' || true)
say "node logs: $tracebacks traceback(s)"
(cd "$PROJECT_DIR" && "$PYTHON" -m tests.external.kafka_python_suite summary --results "$out_dir" \
    --junit "$out_dir/junit.xml" --summary "$out_dir/summary.txt")
[[ -f $out_dir/node-deaths.txt ]] && cat "$out_dir/node-deaths.txt"
say "results: $out_dir/junit.xml, $out_dir/summary.txt (per-test logs in $out_dir/tests/)"
