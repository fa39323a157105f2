#!/usr/bin/env bash
# Issue 9's speed targets on a CUDA machine, as tables (run from the repository root):
#   scripts/gpu-bench.sh | tee gpu-bench.md
# WB overrides the command (e.g. WB="python3 -m workbench" on a machine without .venv).
# Rows for backend "cuda" show an error where mamba-ssm is not installed; that is expected.
set -uo pipefail
cd "$(dirname "$0")/.."
WB="${WB:-.venv/bin/ssm-workbench}"
B="$WB bench --device cuda --d-model 64 --n-layers 2 --repeats 20 --warmup 5"
echo "## Scan alone, b8 d128 n16: triton within 1.5x of cuda (mamba-ssm) at 1024 and 4096"
$B --batch 8 --scan-backends cuda,triton,torch --seq-lens 1024,4096
echo; echo "## Train step, b64 L784: mamba[triton] no slower than the transformer"
$B --batch 64 --models mamba,transformer --backend triton,cuda --seq-lens 784
echo; echo "## Train step, b8 L4096 (<= half the transformer) and L16384 (peak memory <= the transformer's)"
$B --batch 8 --models mamba,transformer --backend triton,cuda --seq-lens 4096,16384
echo; echo "## 2^20-token streaming evaluation on the GPU (< 10 s)"
$B --stream-tokens 1048576 --backend triton
echo; echo "## Shipped MAD profile: wall time (<= half of the 2-core CPU's 58 s)"
export SSM_WORKBENCH_STORE="$(mktemp -d)"
start=$SECONDS
$WB run profiles/mad-selective-copying.toml | tail -5
echo "wall: $((SECONDS - start)) s"
$WB export --profile mad-selective-copying --metric accuracy --rows model --cols seq_len --format md || true
