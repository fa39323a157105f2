#!/usr/bin/env bash
# Set up (first time only) and run the test suite on CPU.
#
#   ./test.sh            the everyday set: every test not marked `slow` (a few minutes)
#   ./test.sh --slow     only the `slow` group: long end-to-end runs, the real Slurm cluster,
#                        the Triton/torch.compile builds, `profile check` of the big profiles
#   ./test.sh --all      both (CI runs ./test.sh, then ./test.sh --slow)
#   ./test.sh ARGS...    any pytest arguments after the option, e.g. ./test.sh tests/workbench/cli/test_grid.py -x
#
# Tests run in SSM_WORKBENCH_TEST_JOBS processes (pytest-xdist; default 2, 0 = in this
# process). --dist loadgroup keeps the tests of one xdist_group (the Slurm cluster's) on one
# worker, one at a time.
set -euo pipefail
cd "$(dirname "$0")"
marks=(-m "not slow")
case "${1:-}" in
    --slow) marks=(-m slow); shift ;;
    --all) marks=(); shift ;;
esac
scripts/setup-env.sh
jobs="${SSM_WORKBENCH_TEST_JOBS:-2}"
parallel=()
if [ "$jobs" != 0 ]; then
    parallel=(-n "$jobs" --dist loadgroup)
fi
# (${a[@]+"${a[@]}"}: an empty array under set -u on bash before 4.4)
exec .venv/bin/python -m pytest -q ${parallel[@]+"${parallel[@]}"} ${marks[@]+"${marks[@]}"} "$@"
