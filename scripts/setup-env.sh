#!/usr/bin/env bash
# Create .venv (once) and install ssm-workbench with its test tools into it.
# TORCH_SPEC picks the torch build: the default pins the CPU build that installs quickly on
# CPU machines; on a CUDA machine use e.g. TORCH_SPEC="torch==2.13.0" with your CUDA index,
# and add the official kernels with EXTRAS="test,pretrained,cuda".
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
EXTRAS="${EXTRAS:-test,pretrained}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=".venv/.installed-$(cat pyproject.toml scripts/setup-env.sh | cksum | cut -d' ' -f1)-${TORCH_SPEC}-${EXTRAS}"
if [ ! -e "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  .venv/bin/python -m pip install -q "$TORCH_SPEC"
  # Triton: CUDA builds of torch bring it (the GPU kernels need nothing else); beside the CPU
  # build the tests use its interpreter to check the same kernels on CPU tensors.
  if ! .venv/bin/python -c "import triton" >/dev/null 2>&1; then
    .venv/bin/python -m pip install -q "${TRITON_SPEC:-triton==3.6.0}" \
      || echo "setup-env: could not install triton; the Triton kernel tests will be skipped" >&2
  fi
  .venv/bin/python -m pip install -q -e ".[${EXTRAS}]"
  rm -f .venv/.installed-* && touch "$stamp"
fi
