"""Where a run's files lie in the store folder: its checkpoint ``checkpoints/<id>/last.pt``.

Here, in the store layer, so that the store and the run file (which looks for a checkpoint
a Slurm restart left) need not import :mod:`workbench.train.checkpoint` (and torch).
"""

from __future__ import annotations

from pathlib import Path

CHECKPOINT_FILE = "last.pt"


def checkpoint_folder(store_root: str | Path, run_id: int) -> Path:
    return Path(store_root) / "checkpoints" / str(run_id)


def checkpoint_path(store_root: str | Path, run_id: int) -> Path:
    return checkpoint_folder(store_root, run_id) / CHECKPOINT_FILE
