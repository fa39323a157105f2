#!/usr/bin/env bash
# Create .venv (once) and install ssm-workbench with its test tools into it.
# TORCH_SPEC picks the torch build: the default pins the CPU build that installs quickly on
# CPU machines; on a CUDA machine use e.g. TORCH_SPEC="torch==2.13.0" with your CUDA index,
# and add the official kernels with EXTRAS="test,pretrained,lm,eval,cuda" (EXTRAS replaces the list).
#
# Each step says what it does and how long it took; pip's own chatter (and setuptools'
# warnings about an editable install beside top-level folders, which do not apply here)
# goes to .venv/setup.log and is shown only when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
# eval: lm-evaluation-harness for `ssm-workbench eval` and its tests (pip install took 16 s on top of the others)
EXTRAS="${EXTRAS:-test,pretrained,lm,eval}"
stamp_of() { echo ".venv/.installed-$(cat pyproject.toml scripts/setup-env.sh | cksum | cut -d' ' -f1)-${TORCH_SPEC}-${EXTRAS}"; }
if [ -x .venv/bin/python ] && [ -e "$(stamp_of)" ]; then
  exit 0   # set up already: say nothing, so `./run.sh` output is the command's own
fi

say() { echo "setup: $*" >&2; }
log=.venv/setup.log
step() {   # step "what it does" command...: run quietly into the log, report time or failure
  local what=$1; shift
  local t0=$SECONDS
  printf 'setup: %s ... ' "$what" >&2
  if "$@" >>"$log" 2>&1; then
    echo "done ($((SECONDS - t0)) s)" >&2
  else
    local rc=$?
    echo "FAILED (exit $rc); the last lines of $log:" >&2
    tail -n 25 "$log" >&2
    exit "$rc"
  fi
}

t_all=$SECONDS
if [ ! -x .venv/bin/python ]; then
  say "first run: creating .venv with $("$PY" --version 2>&1) (a few minutes, once; log in $log)"
  "$PY" -m venv .venv
fi
: >"$log"
# a newer pip is nice to have, not needed (offline mirrors may lack it): no step, no failure
.venv/bin/python -m pip install -q --upgrade pip >>"$log" 2>&1 || true
step "installing $TORCH_SPEC" .venv/bin/python -m pip install -q "$TORCH_SPEC"
# Triton: CUDA builds of torch bring it (the GPU kernels need nothing else); beside the CPU
# build the tests use its interpreter to check the same kernels on CPU tensors.
if ! .venv/bin/python -c "import triton" >/dev/null 2>&1; then
  if ! ( step "installing ${TRITON_SPEC:-triton==3.6.0} (the Triton kernel tests' interpreter)" \
          .venv/bin/python -m pip install -q "${TRITON_SPEC:-triton==3.6.0}" ); then
    say "could not install triton; the Triton kernel tests will be skipped"
  fi
fi
step "installing ssm-workbench and its dependencies (extras: $EXTRAS)" \
  .venv/bin/python -m pip install -q -e ".[${EXTRAS}]"
rm -f .venv/.installed-* && touch "$(stamp_of)"
say "ready in $((SECONDS - t_all)) s: .venv/bin/ssm-workbench"
