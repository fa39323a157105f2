"""Shim: ``python -m workbench.worker`` is written into Slurm job scripts already queued
on clusters (workbench.execute.slurm.job_script before issue 23); the worker now lives in
:mod:`workbench.train.worker`. Nothing in the workbench imports this module."""

import sys

from workbench.train.worker import main

if __name__ == "__main__":
    sys.exit(main())
