#!/usr/bin/env bash
# Issue 18's work on a lent GPU machine, in phases that each fit one device call (< 10 min).
# With fifteen minutes of device time in all (issue 31), use scripts/gpu-one-call.sh instead:
# the essentials of these phases in ONE call, each step under its own limit.
# Prepare here first: scripts/gpu-wheels.sh (into .whl/, git-ignored), then each call:
#   run(command="scripts/gpu-session.sh check", carry=[".whl"])    # doctor, kernel tests, compile report
#   run(command="scripts/gpu-session.sh bench", carry=[".whl"])    # targets, tile sweep, linear-RNN ops
#   run(command="scripts/gpu-session.sh tests", carry=[".whl"])    # the whole suite on the GPU
#   run(command="scripts/gpu-session.sh long",  carry=[".whl"])    # reproductions, detached
#   run(command="scripts/gpu-session.sh collect", carry=[".whl"])  # their store and report
# A phase writes its outputs under $OUT (or ./gpu-out when OUT is unset). A warm machine keeps
# /tmp between calls: `check` starts building mamba-ssm's kernel (detached, ~3 min) and
# `bench` waits for it; on a fresh machine `bench` builds it first.
set -uo pipefail
cd "$(dirname "$0")/.."
phase="${1:-check}"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
SITE=/tmp/site
MAMBA_SITE=/tmp/site-mamba
export SSM_WORKBENCH_STORE="${SSM_WORKBENCH_STORE:-/tmp/wb-store}"
WB="python3 -m workbench"

setup() {
  if [ ! -e "$SITE/.installed" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" .whl/*.whl || { echo "gpu-session: installing .whl failed" >&2; exit 2; }
    touch "$SITE/.installed"
  fi
  export PYTHONPATH="$PWD:$SITE:$MAMBA_SITE${PYTHONPATH:+:$PYTHONPATH}"
}

build_mamba() {  # mamba-ssm's CUDA kernels for sm_90 only (all architectures take ~8x longer)
  [ -e "$MAMBA_SITE/.built" ] && return 0
  local src
  src=$(ls .whl/mamba_ssm-*.tar.gz 2>/dev/null | head -1)
  [ -n "$src" ] || { echo "no mamba-ssm tarball in .whl" ; return 1; }
  rm -rf /tmp/mamba-src && mkdir -p /tmp/mamba-src && tar xzf "$src" -C /tmp/mamba-src
  local dir
  dir=$(ls -d /tmp/mamba-src/mamba_ssm-*)
  python3 - "$dir/setup.py" <<'PY'
import re, sys
p = sys.argv[1]
s = open(p).read()
pair = r'cc_flag\.append\("-gencode"\)\n(\s*)cc_flag\.append\("arch=compute_(\d+),code=sm_\d+"\)'
s = re.sub(pair, lambda m: m.group(0) if m.group(2) == "90" else "pass\n" + m.group(1) + "pass", s)
open(p, "w").write(s)
PY
  (cd "$dir" && MAMBA_FORCE_BUILD=TRUE MAMBA_KEEP_CUDA_BUILD=TRUE MAX_JOBS=16 \
     python3 -m pip install -q --no-build-isolation --no-deps --no-cache-dir --target "$MAMBA_SITE" .) \
    && touch "$MAMBA_SITE/.built"
}

versions() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', torch.version.cuda, '| triton', triton.__version__)"
}

setup
case "$phase" in
  check)
    setsid "$0" build-mamba >/tmp/mamba-build.log 2>&1 < /dev/null &
    { versions; echo; $WB doctor; } 2>&1 | tee "$OUT/doctor.txt"
    python3 -m models.kernels.triton_aot --arch 90 --state 16,64 --dtype fp32,bf16 2>&1 | tee "$OUT/triton-compile.md"
    # real compilation on the GPU (no interpreter): the kernels against the sequential reference
    timeout 420 python3 -m pytest -q -x -p no:cacheprovider tests/models/test_triton_kernels.py \
      tests/models/test_selective_scan.py tests/models/test_triton_aot.py 2>&1 | tail -40 | tee "$OUT/kernel-tests.txt"
    # fla's kernels (auto on CUDA) against the float64 references: every linear-RNN op, FoX
    timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/models/test_gpu_fla.py 2>&1 | tail -30 \
      | tee "$OUT/fla-tests.txt"
    ;;
  bench)
    # the build `check` started: wait for it (up to 5 min), or build it now
    for _ in $(seq 60); do
      { [ -e "$MAMBA_SITE/.built" ] || ! pgrep -f "gpu-session.sh build-mamba" >/dev/null; } && break
      sleep 5
    done
    [ -e "$MAMBA_SITE/.built" ] || "$0" build-mamba >/tmp/mamba-build.log 2>&1 \
      || { echo "mamba-ssm did not build:"; tail -5 /tmp/mamba-build.log; }
    WB="$WB" PY=python3 BENCH_DIR=/tmp/gpu-bench scripts/gpu-bench.sh 2>&1 | tee "$OUT/gpu-bench.md"
    # the scan's tile, pinned (no narrowing), at the issue's shape: which one is fastest here
    { for tile in 16x16 16x8 16x4 16x2 32x4 8x4; do
        echo "### SSM_WORKBENCH_TRITON_SCAN_TILE=$tile"
        SSM_WORKBENCH_TRITON_SCAN_TILE=$tile $WB bench --device cuda --batch 8 --d-model 64 \
          --scan-backends triton --seq-lens 1024,4096 --repeats 20 --warmup 5
      done; } 2>&1 | tee "$OUT/scan-tiles.md"
    $WB bench --device cuda --ops all --op-backends torch,fla --seq-lens 4096,16384 \
      --repeats 10 --warmup 3 2>&1 | tee "$OUT/linear-rnn-ops.md"
    ;;
  build-mamba)
    build_mamba
    ;;
  tests)
    # the whole suite; pytest-xdist is in the image
    timeout 560 python3 -m pytest -q -n 8 -p no:cacheprovider tests 2>&1 | tail -60 | tee "$OUT/test-suite.txt"
    ;;
  long)
    mkdir -p /tmp/long
    for p in induction-heads-paper mad-in-context-recall-as-run selective-copying-paper-gpu mamba-table1-grid-gpu; do
      extra=""; [ "$p" = induction-heads-paper ] && extra="--runs-per-gpu 3"
      echo "$WB run profiles/$p.toml $extra"
    done > /tmp/long/queue.sh
    # one after another, detached: they outlive this call (not the machine)
    setsid bash -c "cd $PWD; export PYTHONPATH=$PYTHONPATH SSM_WORKBENCH_STORE=$SSM_WORKBENCH_STORE; \
      while read -r cmd; do echo \"== \$cmd\"; \$cmd; done < /tmp/long/queue.sh" >/tmp/long/log.txt 2>&1 < /dev/null &
    sleep 20; cat /tmp/long/queue.sh; tail -5 /tmp/long/log.txt
    ;;
  collect)
    tail -50 /tmp/long/log.txt > "$OUT/long-log.txt" 2>/dev/null
    $WB runs 2>&1 | tail -40 | tee "$OUT/runs.txt"
    $WB report profiles/induction-heads-paper.toml profiles/mad-in-context-recall-as-run.toml \
      profiles/selective-copying-paper-gpu.toml profiles/mamba-table1-grid-gpu.toml \
      > "$OUT/report-gpu.md" 2>&1; tail -5 "$OUT/report-gpu.md"
    # the database and logs; the checkpoints apart (unfinished runs resume from them later,
    # `ssm-workbench resume`), each file under the device tool's 16 MiB a file
    tar czf "$OUT/store.tgz" -C "$SSM_WORKBENCH_STORE" --exclude=./checkpoints --exclude=./disk-reserve . 2>/dev/null
    if [ -d "$SSM_WORKBENCH_STORE/checkpoints" ]; then
      tar czf /tmp/checkpoints.tgz -C "$SSM_WORKBENCH_STORE" checkpoints
      if [ "$(stat -c %s /tmp/checkpoints.tgz)" -le $((16 * 1024 * 1024)) ]; then
        cp /tmp/checkpoints.tgz "$OUT/"
      else
        echo "checkpoints.tgz is over 16 MiB: split it (split -b 15M) and fetch the parts"
      fi
    fi
    ;;
  *) echo "usage: $0 check|bench|tests|long|collect|build-mamba" >&2; exit 2 ;;
esac
