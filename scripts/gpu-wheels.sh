#!/usr/bin/env bash
# Download, on a machine with a package registry, the wheels a GPU machine without one lacks
# (the lent H100 image, ../shared/FACTS.md: Python 3.12 with torch, triton, pytest, rich,
# jinja2, aiohttp ... but not textual, pydantic, tomli-w ...), into .whl/ (git-ignored).
# Versions are this machine's .venv's where it has the package, so both run the same code.
#   scripts/gpu-wheels.sh                 # then carry .whl to the GPU machine and run there
#   scripts/gpu-one-call.sh               # (or a phase of scripts/gpu-session.sh): both
#                                         # install them into /tmp/site first
# PY_VERSION (3.12) and PLATFORM (x86_64) describe the GPU machine's Python.
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VERSION="${PY_VERSION:-3.12}"
PLATFORM="${PLATFORM:-x86_64}"
# what the project and its tests import, less what the GPU image already holds
PKGS="textual textual-plotext plotext pydantic pydantic-core annotated-types typing-inspection
      tomli-w pytest-asyncio pytest-textual-snapshot syrupy mdit-py-plugins platformdirs
      linkify-it-py uc-micro-py typing-extensions rich markdown-it-py textual-serve
      aiohttp-jinja2 flash-linear-attention fla-core"
pins=()
for p in $PKGS; do
  v=$(.venv/bin/python -m pip show "$p" 2>/dev/null | awk '/^Version:/{print $2}' || true)
  pins+=("$p${v:+==$v}")
done
# plotext must stay below 6 (textual-plotext's import breaks on 6)
pins=("${pins[@]/#plotext/plotext<6,}"); pins=("${pins[@]/plotext<6,==/plotext==}")
mkdir -p .whl
plat=()
for m in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do plat+=(--platform "${m}_${PLATFORM}"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
  --implementation cp "${plat[@]}" -d .whl "${pins[@]}"
# mamba-ssm's CUDA kernels build there from the source tarball (~165 s for sm_90 alone)
# (pip reads its metadata by running setup.py: without torch's build isolation and CUDA build)
MAMBA_SKIP_CUDA_BUILD=TRUE .venv/bin/python -m pip download -q --no-deps --no-binary=:all: \
  --no-build-isolation -d .whl "mamba-ssm==${MAMBA_SSM_VERSION:-2.3.2.post1}" \
  || echo "gpu-wheels: mamba-ssm's source tarball not downloaded (the cuda rows will say so)" >&2
# ... and its Python part alone as a wheel, built here without CUDA, in .whl/ssd/ (not among
# the .whl/*.whl installed everywhere): Mamba-2's `mamba_ssm` backend needs only its Triton
# SSD kernels. FORCE_BUILD: its setup.py otherwise guesses a prebuilt wheel's URL from
# torch's CUDA version and fails on a CPU torch.
tarball=$(find .whl -maxdepth 1 -name 'mamba_ssm-*.tar.gz' | head -1)
if [ -n "$tarball" ]; then
  MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE .venv/bin/python -m pip wheel -q --no-deps \
    --no-build-isolation -w .whl/ssd "$tarball" \
    || echo "gpu-wheels: mamba-ssm's Python wheel not built (the mamba_ssm rows will say so)" >&2
fi
ls .whl .whl/ssd
du -sh .whl
