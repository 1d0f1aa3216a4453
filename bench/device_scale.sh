#!/usr/bin/env bash
# `python -m kq.bench.scale` (issue 37's benchmark) on the 16-core device machine, from the offline
# bundle: that machine reaches no package registry, and its python3 is CPython 3.12.
#
# Here, build the bundle from a clean clone of the commit to measure (a bundle made in a working tree
# carries its uncommitted edits), and put it where the device tool carries it from:
#   git clone -q /work/main /tmp/kq-at && (cd /tmp/kq-at && git checkout -q COMMIT &&
#     KQ_VENV=/work/main/.venv bash /work/shared/tools/offline-bundle.sh)
#   rm -rf .bundle && cp -r /tmp/kq-at/.bundle .bundle      # in /work/main; .bundle/ is git-excluded
# Then, with the device tool, from the repository root:
#   run  command: KQ_SOURCE_COMMIT=COMMIT bash bench/device_scale.sh   carry: [".bundle"]   timeout_s: 540
# Back under $OUT: scale.json (rewritten after every level, so a cut-short run keeps what it measured),
# scale.log (the whole output, tables at the end) and machine.txt. SCALE_ARGS replaces the shape below;
# SCALE_TIMEOUT_S bounds the benchmark (default 420 s; the shape below takes about 5 minutes).
set -uo pipefail
out=${OUT:-/tmp/kq-scale-out}
mkdir -p "$out"
python=${PYTHON:-python3}
{
  echo "commit: ${KQ_SOURCE_COMMIT:-unknown}"
  echo "cores: $(nproc)"; $python --version; uname -r; free -g | head -2; df -h /tmp | tail -1; uptime
  grep -m1 'model name' /proc/cpuinfo
} 2>&1 | tee "$out/machine.txt"
$python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' \
  || { echo "device_scale: needs CPython 3.12 (the bundle's wheels are cp312)" >&2; exit 2; }
[[ -d .bundle/whl && -d .bundle/src/kq ]] || { echo "device_scale: no .bundle (carry it)" >&2; exit 3; }
$python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .bundle/whl/*.whl || exit 4
export PYTHONPATH=/tmp/site:$PWD/.bundle/src PYTHONUNBUFFERED=1 KQ_SOURCE_COMMIT=${KQ_SOURCE_COMMIT:-unknown}
cd /tmp || exit 5  # `python -m kq...` (here, in workers and nodes) then finds kq in the bundle only.
$python -c 'import confluent_kafka, kq.bench.scale; print("confluent-kafka", confluent_kafka.__version__,
  "librdkafka", confluent_kafka.libversion()[0])' 2>&1 | tee -a "$out/machine.txt" || exit 6
# One run of every level, each on a fresh cluster (every level starts from empty stores, and the disk
# holds one level's data at a time): 10 levels of about 28 s each (a cluster start, 2 s warm-up, a 10 s
# window, the read-back bounded at 8 s).
args=${SCALE_ARGS:---levels 1,2,4,8,16 --sizes 100,1024 --partitions 24 --seconds 10 --warmup-seconds 2 --consume-seconds 8 --runs 1 --fresh level}
# shellcheck disable=SC2086  # The arguments are words on purpose.
timeout "${SCALE_TIMEOUT_S:-420}" $python -m kq.bench.scale $args --json "$out/scale.json" 2>&1 | tee "$out/scale.log"
