#!/usr/bin/env bash
# Create .venv (once) and install ssm-workbench with its test tools into it.
# TORCH_SPEC picks the torch build: the default pins the CPU build that installs quickly on
# CPU machines; on a CUDA machine use e.g. TORCH_SPEC="torch==2.13.0" with your CUDA index,
# and add the official kernels with EXTRAS="test,cuda".
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
EXTRAS="${EXTRAS:-test}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=".venv/.installed-$(cat pyproject.toml scripts/setup-env.sh | cksum | cut -d' ' -f1)-${TORCH_SPEC}-${EXTRAS}"
if [ ! -e "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  .venv/bin/python -m pip install -q "$TORCH_SPEC"
  .venv/bin/python -m pip install -q -e ".[${EXTRAS}]"
  rm -f .venv/.installed-* && touch "$stamp"
fi
