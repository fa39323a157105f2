#!/usr/bin/env bash
# Set up (first time only) and run ssm-workbench. No arguments: the TUI.
#   ./run.sh                                          open the TUI
#   ./run.sh run profiles/mad-selective-copying.toml  replay a shipped profile headlessly
#   ./run.sh export --profile mad-selective-copying   comparison table
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup-env.sh
exec .venv/bin/ssm-workbench "$@"
