"""Shim: ``python -m workbench.scheduler`` may still be the command line of a scheduler
started before issue 23 (detached, it outlives upgrades) and of scripts that start one;
the scheduler now lives in :mod:`workbench.execute.scheduler`. Nothing in the workbench
imports this module."""

import sys

from workbench.execute.scheduler import main

if __name__ == "__main__":
    sys.exit(main())
