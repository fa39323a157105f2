"""Where a run executes and where its files lie: which executor runs it (its info's
``executor``, absent = local) and its checkpoint ``checkpoints/<id>/last.pt`` under a root
folder (the store's, or the shared folder of a Slurm run's jobs:
:meth:`workbench.execute.executor.Executor.files_root`).

Here, in the store layer, so that the store (whose ``reap`` checks only the runs this
host executes) and the run file (which looks for a checkpoint a Slurm restart left) need
not import the execute layer or :mod:`workbench.train.checkpoint` (and torch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CHECKPOINT_FILE = "last.pt"
EXECUTOR_KEY = "executor"  # the run's info key naming its executor
LOCAL = "local"


def executor_name(run: Any) -> str:
    """The name of the executor running ``run`` (anything with an ``info`` dict): 'local'
    unless its info says otherwise (workbench.execute.dispatch.executor_for)."""
    return (getattr(run, "info", None) or {}).get(EXECUTOR_KEY) or LOCAL


def checkpoint_folder(store_root: str | Path, run_id: int) -> Path:
    return Path(store_root) / "checkpoints" / str(run_id)


def checkpoint_path(store_root: str | Path, run_id: int) -> Path:
    return checkpoint_folder(store_root, run_id) / CHECKPOINT_FILE
