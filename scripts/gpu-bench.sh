#!/usr/bin/env bash
# Issue 9/18's speed targets on a CUDA machine: measures, then prints the tables and one
# verdict per target (scripts/gpu_targets.py). Run from anywhere:
#   scripts/gpu-bench.sh | tee gpu-bench.md
# WB overrides the command (e.g. WB="python3 -m workbench" on a machine without .venv);
# BENCH_DIR keeps the JSON measurements (default: a temporary folder, named at the end).
# Rows for backend "cuda" show an error where mamba-ssm is not installed; the scan target
# then compares with mamba-ssm's numbers measured on an H100 (and says so).
set -uo pipefail
cd "$(dirname "$0")/.."
WB="${WB:-.venv/bin/ssm-workbench}"
PY="${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
D="${BENCH_DIR:-$(mktemp -d)}"
mkdir -p "$D"
B="$WB bench --device cuda --d-model 64 --n-layers 2 --repeats 20 --warmup 5 --format json"
echo "measuring: scan alone (b8 d128 n16, L 1024 and 4096)" >&2
$B --batch 8 --scan-backends cuda,triton,torch --seq-lens 1024,4096 > "$D/scan.json"
echo "measuring: train step b64 L784" >&2
$B --batch 64 --models mamba,transformer --backend triton,cuda --seq-lens 784 > "$D/b64.json"
echo "measuring: train step b8 L4096 and L16384" >&2
$B --batch 8 --models mamba,transformer --backend triton,cuda --seq-lens 4096,16384 > "$D/b8.json"
echo "measuring: 2^20-token streaming" >&2
$B --stream-tokens 1048576 --backend triton > "$D/stream.json"
echo "measuring: the shipped MAD profile's wall time" >&2
store="$(mktemp -d)"
start=$SECONDS
SSM_WORKBENCH_STORE="$store" $WB run profiles/mad-selective-copying.toml > "$D/mad-run.txt" 2>&1
rc=$?
err=""; [ "$rc" = 0 ] || err=", \"error\": \"run exited $rc (see mad-run.txt)\""
echo "{\"wall_s\": $((SECONDS - start)), \"exit\": $rc$err}" > "$D/mad.json"
SSM_WORKBENCH_STORE="$store" $WB export --profile mad-selective-copying --metric accuracy \
  --rows model --cols seq_len --format md > "$D/mad-accuracy.md" 2>&1 || true
$PY scripts/gpu_targets.py "$D"
verdict=$?
echo; echo "## MAD profile accuracy on the GPU"; cat "$D/mad-accuracy.md"
echo; echo "(measurements kept in $D)"
exit $verdict
