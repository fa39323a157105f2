#!/usr/bin/env bash
# Set up (first time only) and run the test suite on CPU (a few minutes).
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup-env.sh
exec .venv/bin/python -m pytest -q "$@"
