#!/usr/bin/env bash
# Issue 31's GPU work in ONE device call: every step under its own time limit, each step's
# output tee'd into $OUT as it runs (a call stopped at its limit still brings back what
# finished), steps in the order of their value, a summary row per step as it ends.
#
# Prepare here (a machine with a package registry): scripts/gpu-wheels.sh (fills .whl/,
# git-ignored: the packages the GPU image lacks, fla, mamba-ssm's source tarball and, in
# .whl/ssd/, mamba-ssm's Python part built without CUDA). Then the one call:
#   run(command="scripts/gpu-one-call.sh", carry=[".whl"], timeout_s=540)
# A second, shorter call on the still-warm machine (warm 30 s) re-runs chosen steps, e.g.
#   run(command="STEPS=setup,kernel-tests,bench-scan TOTAL_S=240 scripts/gpu-one-call.sh",
#       carry=[".whl"], timeout_s=270)
# (setup runs anyway where /tmp/site is not installed yet; bench JSON stays in /tmp/gpu-bench).
#
# Time plan (limit per step in s; H100/H200, 16 cores; each step gets min(limit, what is
# left of TOTAL_S=510 less 10 s kept for the end), a step with under 5 s left is skipped):
#    15 setup         .whl/*.whl -> /tmp/site; .whl/ssd (mamba-ssm's Triton SSD) -> /tmp/site-ssd
#    20 env           nvidia-smi, python/torch/CUDA/Triton/fla versions, `ssm-workbench doctor`
#    75 kernel-tests  tests/models/test_triton_kernels.py, test_selective_scan.py, test_triton_aot.py
#                     compiled on the GPU (TRITON_INTERPRET unset), -n 8, no -x
#    40 bench-scan    scan alone b8 d128 n16, L 1024 / 4096, triton vs torch (vs mamba-ssm's
#                     H100 0.47 / 0.85 ms from FACTS.md when mamba-ssm is not built)
#    25 bench-b64     train step b64 L784: Mamba[triton] vs Transformer (d64, 2 layers)
#    25 bench-b8      train step b8 L4096: likewise
#    30 bench-stream  2^20 tokens streamed through Mamba[triton]
#    80 decode        the CUDA-graph and sync-free decode tests; `bench --generate` (d768, 12
#                     layers: Transformer, Mamba, Mamba-2; prompt 512 at batch 1 and 32, prompt
#                     4096 at batch 1) with CUDA graphs (the Transformer from its static KV
#                     cache), then the Transformer and Mamba eagerly at prompt 512 (--cuda-graphs off)
#    60 fla-tests     tests/models/test_gpu_fla.py: fla's kernels vs the float64 references, -n 8
#    35 bench-mamba2  b8 L4096: Mamba-2 with torch / fla / mamba_ssm (mamba-ssm's Triton SSD)
#    25 bench-gdn     b8 L4096: Gated DeltaNet with torch / fla
#    20 bench-16k     peak memory b8 L16384: Mamba[triton] vs Transformer
#    90 mad           profiles/mad-selective-copying.toml, timed (--runs-per-gpu 6: all at once)
#    10 mad-report    leftover runs killed; per run the NVML samples from the store; accuracy
#    30 model-tests   Mamba, Mamba-2, Mamba-3, linear-RNN tests on the GPU machine, -n 8
#    10 (end)         the targets table once more, the summary
#   ---
#   590 s of limits in TOTAL_S=510: steps end before their limits when all goes well; when
#   not, the last (model-tests) is skipped first. The script ends within ~TOTAL_S + 5 s (a step past its limit is killed
#   5 s later; the next step's limit counts from then), so timeout_s=540 is enough.
# mamba-ssm's CUDA build (Mamba-1's selective_scan_cuda, ~165 s) does not fit: the scan target
# then uses FACTS.md's H100 numbers (scripts/gpu_targets.py); `gpu-session.sh build-mamba`
# builds it in a call of its own. Mamba-2's `mamba_ssm` backend needs only mamba-ssm's pure
# Triton SSD: its wheel is built here without CUDA and its package __init__ (which imports
# the unbuilt selective_scan_cuda unguarded, FACTS.md) is guarded in the copy in /tmp.
#
# $OUT receives at most these 6 files (the device tool brings back 8 at most):
#   summary.tsv  step, status (ok / failed / timeout / no-cuda / skipped), exit, seconds, limit, file
#   env.txt      setup and env          tests.txt   the three pytest steps (a line per test)
#   bench.md     every bench step's log and JSON, the fla table     targets.md  the targets so far
#   mad.txt      the MAD run's log, its NVML table and accuracy
#
# Rehearsal on a machine without CUDA (automatic there, or GPU_REHEARSAL=1): the benches run
# with --device cpu (their GPU rows say why they failed), the fla tests skip themselves, the
# kernel tests run under Triton's interpreter, the .whl install is only checked; e.g.
#   OUT=/tmp/gpu-rehearsal CAP_SCALE=0.3 PY=.venv/bin/python WB=.venv/bin/ssm-workbench \
#     scripts/gpu-one-call.sh
# Knobs: TOTAL_S (510), CAP_SCALE (1: multiplies every limit), STEPS (comma list, default all),
# TEST_TIMEOUT (120 s a test), MAD_RUNS_PER_GPU (6), MAD_STORE (a new /tmp/wb-mad-store.*),
# BENCH_DIR (/tmp/gpu-bench), PY, WB.
# shellcheck disable=SC2329  # the step functions run through `bash -c step_NAME`
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
T0=$SECONDS
export OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 ROOT
export PY="${PY:-python3}"
export WB="${WB:-$PY -m workbench}"
export SITE=/tmp/site SSD_SITE=/tmp/site-ssd
export BENCH_DIR="${BENCH_DIR:-/tmp/gpu-bench}"
export TEST_TIMEOUT="${TEST_TIMEOUT:-120}" MAD_RUNS_PER_GPU="${MAD_RUNS_PER_GPU:-6}"
TOTAL_S="${TOTAL_S:-510}"
CAP_SCALE="${CAP_SCALE:-1}"
ALL_STEPS="setup,env,kernel-tests,bench-scan,bench-b64,bench-b8,bench-stream,decode,fla-tests,bench-mamba2"
ALL_STEPS="$ALL_STEPS,bench-gdn,bench-16k,mad,mad-report,model-tests"
STEPS=",${STEPS:-$ALL_STEPS},"
DEADLINE=$((T0 + TOTAL_S))
END_S=10    # kept at the end: the targets table from the last JSON, the summary
mkdir -p "$BENCH_DIR"
SUMMARY="$OUT/summary.tsv"
for f in env.txt tests.txt bench.md targets.md mad.txt; do : > "$OUT/$f"; done
printf 'step\tstatus\texit\tseconds\tlimit_s\tfile\n' > "$SUMMARY"
# the workbench and the wheels first on the path (the image's older rich etc. after them)
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"

# ---------------------------------------------------------------------------------------
# the steps: each runs as `bash -c step_NAME` under `timeout` (functions exported below);
# exit 3 means "needs CUDA, none here" (rehearsal)

no_cuda() { [ "${REHEARSAL:-0}" = 1 ]; }

# a step that means something only on CUDA: in a rehearsal it ran on the CPU all the same (its
# GPU rows failing or skipping), and ends as "no-cuda" (3) unless it hit its limit
cuda_rc() {
  local rc=$1
  if no_cuda && [ "$rc" != 124 ] && [ "$rc" != 137 ]; then
    echo "no CUDA here (rehearsal): exit $rc recorded as no-cuda"; return 3
  fi
  return "$rc"
}

# the targets table from whatever JSON the bench steps have written so far
targets() { $PY scripts/gpu_targets.py "$BENCH_DIR" > "$OUT/targets.md" 2>&1; return 0; }

# one bench measurement into $BENCH_DIR/NAME.json (removed first: a stale file never stands in
# for one that failed), shown in the log, then the targets table renewed
bench_json() {
  local name=$1; shift
  rm -f "$BENCH_DIR/$name.json"
  # shellcheck disable=SC2086  # WB and BENCH are command lines
  $BENCH "$@" --format json > "$BENCH_DIR/$name.json"
  local rc=$?
  echo "--- $name.json (exit $rc)"; cat "$BENCH_DIR/$name.json"; echo
  targets
  cuda_rc "$rc"
}

pytest_args() {  # -v: a line per test as it ends (kept if the step is stopped), all failures
  local n=$1; no_cuda && n=2    # a rehearsal's machine is small
  local args=(-v -p no:cacheprovider --tb=short -rfEs -n "$n")
  $PY -c "import pytest_timeout" 2>/dev/null && args+=(-p timeout --timeout "$TEST_TIMEOUT")
  echo "${args[@]}"
}

step_setup() {
  ls -l .whl .whl/ssd
  if no_cuda; then
    echo "rehearsal: .whl/*.whl not installed (built for the GPU machine's Python 3.12); checked only:"
    local n=0
    for w in .whl/*.whl; do
      $PY -m zipfile -l "$w" >/dev/null || { echo "broken wheel: $w"; exit 2; }; n=$((n + 1))
    done
    echo "$n wheels readable"
  elif [ -e "$SITE/.installed" ]; then
    echo "$SITE already installed (a warm machine)"
  else
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" .whl/*.whl || exit 2
    touch "$SITE/.installed"
  fi
  # mamba-ssm's Python part (Triton SSD for Mamba-2's `mamba_ssm` backend), without CUDA:
  # its __init__ imports Mamba-1's unbuilt selective_scan_cuda unguarded, so that block is
  # wrapped in try/except in this copy (mamba_ssm.IMPORT_ERROR keeps what failed)
  local w
  w=$(find .whl/ssd -name 'mamba_ssm-*.whl' 2>/dev/null | head -1)
  if [ -z "$w" ]; then echo "no .whl/ssd/mamba_ssm-*.whl: the mamba_ssm rows will say so"; return 0; fi
  rm -rf "$SSD_SITE" && $PY -m zipfile -e "$w" "$SSD_SITE" || exit 2
  $PY - "$SSD_SITE/mamba_ssm/__init__.py" <<'PY'
import sys
p = sys.argv[1]
lines = open(p).read().splitlines()
eager = [ln for ln in lines if ln.startswith(("from ", "import "))]
rest = [ln for ln in lines if ln not in eager]
open(p, "w").write("\n".join(rest + ["try:  # guarded by scripts/gpu-one-call.sh",
                                     *("    " + ln for ln in eager),
                                     "except Exception as exc:", "    IMPORT_ERROR = exc", ""]))
PY
  PYTHONPATH="$SSD_SITE:$PYTHONPATH" $PY -c "
import mamba_ssm
print('mamba_ssm', mamba_ssm.__version__, 'in $SSD_SITE; package imports:', getattr(mamba_ssm, 'IMPORT_ERROR', 'ok'))
from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
print('SSD kernel importable:', mamba_chunk_scan_combined.__module__)" 2>&1 | tail -3
}

step_env() {
  date -u
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm --format=csv
  else
    echo "no nvidia-smi here"
  fi
  $PY - <<'PY'
import importlib, sys
import torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| torch CUDA", torch.version.cuda,
      "| device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
for name in ("triton", "fla", "einops", "textual", "pydantic"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as e:
        print(name, "not importable:", type(e).__name__, e)
PY
  echo
  $WB doctor
}

step_kernel_tests() {
  # shellcheck disable=SC2046
  $PY -m pytest $(pytest_args 8) tests/models/test_triton_kernels.py tests/models/test_selective_scan.py \
    tests/models/test_triton_aot.py
}

step_fla_tests() {
  # shellcheck disable=SC2046
  $PY -m pytest $(pytest_args 8) tests/models/test_gpu_fla.py
  cuda_rc $?
}

step_model_tests() {
  # shellcheck disable=SC2046
  $PY -m pytest $(pytest_args 8) tests/models/test_mamba.py tests/models/test_mamba2.py tests/models/test_mamba3.py \
    tests/models/test_linear_rnn.py tests/models/test_linear_mixers.py tests/models/test_delta_product.py \
    tests/models/test_generalized_delta.py
}

step_bench_scan() {
  local backends=triton,torch
  # mamba-ssm's own kernel only when it was built here (gpu-session.sh build-mamba)
  $PY -c "import selective_scan_cuda" 2>/dev/null && backends=cuda,$backends
  bench_json scan --batch 8 --scan-backends "$backends" --seq-lens 1024,4096
}

step_bench_b64() {
  bench_json b64 --batch 64 --models mamba,transformer --backend triton --seq-lens 784
}

step_bench_b8() {
  bench_json b8 --batch 8 --models mamba,transformer --backend triton --seq-lens 4096
}

step_bench_stream() {
  bench_json stream --stream-tokens 1048576 --backend triton
}

step_decode() {
  # shellcheck disable=SC2046
  $PY -m pytest $(pytest_args 4) tests/workbench/train/test_decode_cuda_graphs.py \
    tests/workbench/train/test_decode_sync_free.py
  local rc=$?
  local gen="$WB bench --generate --device $DEV --d-model 768 --n-layers 12 --grid axes --batch 1,32 --gen-tokens 64 --warmup 8 --timeout 60"
  for mode in auto off; do
    local models=transformer,mamba,mamba2
    [ "$mode" = off ] && models=transformer,mamba
    rm -f "$BENCH_DIR/generate-$mode.json"
    local lens=512,4096
    [ "$mode" = off ] && lens=512   # the graphs' gain: the batch axis is enough
    # shellcheck disable=SC2086
    $gen --prompt-lens "$lens" --models "$models" --cuda-graphs "$mode" --format json > "$BENCH_DIR/generate-$mode.json"
    local grc=$?
    echo "--- generate-$mode.json (exit $grc)"; cat "$BENCH_DIR/generate-$mode.json"; echo
    [ "$grc" = 0 ] || rc=$grc
  done
  cuda_rc "$rc"
}

step_bench_16k() {
  # peak memory: fewer repeats; its rows join b8.json, where scripts/gpu_targets.py reads them
  rm -f "$BENCH_DIR/b8_16k.part"
  # shellcheck disable=SC2086
  $BENCH --batch 8 --models mamba,transformer --backend triton --seq-lens 16384 --repeats 5 \
    --warmup 2 --format json > "$BENCH_DIR/b8_16k.part"
  local rc=$?
  cat "$BENCH_DIR/b8_16k.part"; echo
  $PY - "$BENCH_DIR" <<'PY'
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
new = json.loads((d / "b8_16k.part").read_text() or "{}").get("runs", [])
b8 = d / "b8.json"
try:
    old = json.loads(b8.read_text())
except (OSError, ValueError):
    old = {"runs": []}
old["runs"] = [r for r in old.get("runs", []) if r.get("seq_len") != 16384] + new
b8.write_text(json.dumps(old, indent=1))
print(f"b8.json: {len(new)} rows at L=16384 added")
PY
  targets
  cuda_rc "$rc"
}

# the linear-RNN layers per backend, as a markdown table (no target reads them)
bench_md() {
  # shellcheck disable=SC2086
  $WB bench --device "$DEV" --batch 8 --d-model 64 --n-layers 2 --repeats 10 --warmup 3 \
    --timeout 100 --seq-lens 4096 --format md "$@"
  cuda_rc $?
}

step_bench_mamba2() {
  echo "### Mamba-2: torch vs fla vs mamba_ssm (mamba-ssm's Triton SSD, from $SSD_SITE)"
  PYTHONPATH="$SSD_SITE:$PYTHONPATH" bench_md --models mamba2 --backend torch,fla,mamba_ssm
}

step_bench_gdn() {
  echo "### Gated DeltaNet: torch vs fla"
  bench_md --models gated_deltanet --backend torch,fla
}

step_mad() {
  # written first: a run stopped at the step's limit leaves this verdict for gpu_targets.py
  echo "{\"wall_s\": null, \"exit\": 124, \"error\": \"stopped at the step's limit (${STEP_LIMIT} s)\"}" \
    > "$BENCH_DIR/mad.json"
  local start=$SECONDS
  # shellcheck disable=SC2086
  $WB --store "$MAD_STORE" run profiles/mad-selective-copying.toml --quiet \
    --runs-per-gpu "$MAD_RUNS_PER_GPU"
  local rc=$? wall=$((SECONDS - start))
  local err=""; [ "$rc" = 0 ] || err=", \"error\": \"run exited $rc\""
  echo "{\"wall_s\": $wall, \"exit\": $rc, \"runs_per_gpu\": $MAD_RUNS_PER_GPU$err}" > "$BENCH_DIR/mad.json"
  echo "MAD profile: wall ${wall} s, exit $rc (runs per GPU $MAD_RUNS_PER_GPU)"
  targets
  return "$rc"
}

step_mad_report() {
  # the runs a stopped `run` left behind (its scheduler and workers are detached) are killed
  $PY scripts/gpu_store_nvml.py --store "$MAD_STORE" --kill-unfinished
  echo
  # shellcheck disable=SC2086
  $WB --store "$MAD_STORE" export --profile mad-selective-copying --metric accuracy \
    --rows model --cols seq_len --format md --include-unfinished
}

# ---------------------------------------------------------------------------------------
# the runner

# step NAME LIMIT_S FILE [KEEP_S]: NAME under min(LIMIT_S * CAP_SCALE, time left - KEEP_S)
# (5 s at least; skipped when under 5 s are left), its output appended to $OUT/FILE and
# shown, a summary row when it ends
step() {
  local name=$1 limit=$2 file=$3 keep=${4:-0}
  case "$STEPS" in *",$name,"*) ;; *) return 0 ;; esac
  limit=$(awk -v c="$limit" -v s="$CAP_SCALE" 'BEGIN { printf "%d", c * s + 0.5 }')
  local left=$((DEADLINE - SECONDS - END_S - keep))
  if [ "$left" -lt 5 ]; then
    printf '%s\tskipped\t-\t0\t%s\t%s\n' "$name" "$left" "$file" >> "$SUMMARY"
    echo "===== $name: skipped (${left} s left of TOTAL_S=$TOTAL_S)" | tee -a "$OUT/$file"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  [ "$limit" -lt 5 ] && limit=5
  printf '\n===== %s (limit %s s, %s UTC, %s s into the call) =====\n' "$name" "$limit" \
    "$(date -u +%T)" "$((SECONDS - T0))" | tee -a "$OUT/$file"
  local start=$SECONDS
  STEP_LIMIT=$limit timeout -k 5 "$limit" bash -c "step_${name//-/_}" 2>&1 | tee -a "$OUT/$file"
  local rc=${PIPESTATUS[0]} secs=$((SECONDS - start)) status
  case "$rc" in
    0) status=ok ;;
    124|137) status=timeout ;;
    3) status=no-cuda ;;
    *) status=failed ;;
  esac
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$secs" "$limit" "$file" >> "$SUMMARY"
  echo "===== $name: $status (exit $rc) in $secs s" | tee -a "$OUT/$file"
}

export -f no_cuda cuda_rc targets bench_json bench_md pytest_args step_setup step_env step_kernel_tests \
  step_fla_tests step_model_tests step_decode step_bench_scan step_bench_b64 step_bench_b8 step_bench_stream \
  step_bench_16k step_bench_mamba2 step_bench_gdn step_mad step_mad_report

# CUDA or a rehearsal (decided before setup: torch is the image's either way)
if [ "${GPU_REHEARSAL:-0}" = 1 ] || ! $PY -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  export REHEARSAL=1 DEV=cpu
  echo "REHEARSAL: no CUDA here (or GPU_REHEARSAL=1): benches run with --device cpu" | tee "$OUT/env.txt"
else
  export REHEARSAL=0 DEV=cuda
  unset TRITON_INTERPRET    # compiled Triton: tests/conftest.py sets the interpreter only without CUDA
fi
# a fresh machine needs the wheels whatever STEPS says
[ "$REHEARSAL" = 0 ] && [ ! -e "$SITE/.installed" ] && STEPS=",setup$STEPS"
export BENCH="$WB bench --device $DEV --d-model 64 --n-layers 2 --repeats 20 --warmup 5 --timeout 100"
MAD_STORE="${MAD_STORE:-$(mktemp -d /tmp/wb-mad-store.XXXX)}"   # a fresh store: every run anew
export MAD_STORE SSM_WORKBENCH_STORE="${SSM_WORKBENCH_STORE:-/tmp/wb-store}"

step setup        15 env.txt
step env          20 env.txt
step kernel-tests 75 tests.txt
step bench-scan   40 bench.md
step bench-b64    25 bench.md
step bench-b8     25 bench.md
step bench-stream 30 bench.md
step decode       80 bench.md
step fla-tests    60 tests.txt
step bench-mamba2 35 bench.md
step bench-gdn    25 bench.md
step bench-16k    20 bench.md
step mad          90 mad.txt 10     # keeps 10 s for mad-report, which kills what it left
step mad-report   10 mad.txt
step model-tests  30 tests.txt

# the targets once more (a step stopped at its limit may have left its JSON unread)
[ -n "$(ls -A "$BENCH_DIR")" ] && timeout 8 bash -c targets
printf 'total\t-\t-\t%s\t%s\t-\n' "$((SECONDS - T0))" "$TOTAL_S" >> "$SUMMARY"
echo
echo "===== summary ($OUT: $(find "$OUT" -type f | wc -l) files; the device tool brings back 8 at most)"
column -t -s $'\t' "$SUMMARY" 2>/dev/null || cat "$SUMMARY"
[ -s "$OUT/targets.md" ] && { echo; sed -n '/## Issue 18/,$p' "$OUT/targets.md"; }
exit 0
