#!/usr/bin/env bash
# Set up (first time only) and run ssm-workbench. No arguments: the TUI.
#   ./run.sh                                          open the TUI
#   ./run.sh run profiles/mad-selective-copying.toml  replay a shipped profile headlessly
#   ./run.sh export --profile mad-selective-copying   comparison table
set -euo pipefail
# The commands the workbench suggests (`Table: ./run.sh export ...`, `... resume --pending`)
# must work as typed, and neither run.sh nor .venv/bin is on the PATH: they name this script
# as it was invoked (before the cd below, so relative to the caller's folder).
case "$0" in
  */*) SSM_WORKBENCH_CMD=$(printf '%q' "$0") ;;
  *) SSM_WORKBENCH_CMD=$(printf './%q' "$0") ;;
esac
export SSM_WORKBENCH_CMD
cd "$(dirname "$0")"
scripts/setup-env.sh
exec .venv/bin/ssm-workbench "$@"
