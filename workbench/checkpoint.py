"""Checkpoints of a run: everything the worker needs to continue exactly where it stopped.

One file per run, ``<store>/checkpoints/<run_id>/last.pt``, replaced atomically: written to
a temporary file in the same folder, flushed and fsynced, then ``os.replace``d over the old
one (and the folder fsynced), so a process killed mid-write leaves the previous checkpoint
whole. The worker fills the dictionary (see ``Trainer.checkpoint_state``); this module owns
the file, the RNG snapshots and the check that a checkpoint belongs to a run.

Files are read with ``torch.load(weights_only=True)``: a checkpoint holds only tensors and
plain Python values (the numpy RNG keys are stored as a list), so loading never runs code.
"""
from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT = 1
FILENAME = "last.pt"
# train settings that do not change what a run computes: a run checkpointed more or less
# often is the same run (used when a replayed profile looks for runs it already has)
NEUTRAL_TRAIN_KEYS = ("checkpoint_every", "checkpoint_minutes")


class CheckpointError(Exception):
    """A checkpoint that is missing, unreadable or belongs to another run."""


def folder(store_root: str | Path, run_id: int) -> Path:
    return Path(store_root) / "checkpoints" / str(run_id)


def path_for(store_root: str | Path, run_id: int) -> Path:
    return folder(store_root, run_id) / FILENAME


def spec_key(spec: dict) -> str:
    """A run's identity as text: its spec without the sweep position (``index``) and the
    checkpoint settings; equal keys mean the same computation."""
    s = json.loads(json.dumps(spec))  # tuples -> lists, as the store holds them
    s.pop("index", None)
    s["train"] = {k: v for k, v in (s.get("train") or {}).items() if k not in NEUTRAL_TRAIN_KEYS}
    return json.dumps(s, sort_keys=True)


# --------------------------------------------------------------------------- files
def save(state: dict[str, Any], path: str | Path) -> int:
    """Write ``state`` to ``path`` atomically; returns the size in bytes.

    Leftover temporary files (from a writer killed mid-write) are removed first: there is
    one writer per run, the worker, so none of them can still be in use."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)  # and the rename itself survives a power cut
    return path.stat().st_size


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename is still atomic
    finally:
        os.close(fd)


def load(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint onto the CPU; CheckpointError when missing or unreadable."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"checkpoint {path} cannot be read: {type(e).__name__}: {e}") from e
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not a format-{FORMAT} workbench checkpoint")
    return state


def load_for_run(store_root: str | Path, run_id: int, spec: dict) -> dict[str, Any]:
    """The run's checkpoint, checked to be this run's (same id, same computation)."""
    path = path_for(store_root, run_id)
    state = load(path)
    if state.get("run_id") != run_id or state.get("spec_key") != spec_key(spec):
        raise CheckpointError(f"checkpoint {path} belongs to another run or another spec")
    return state


def remove(store_root: str | Path, run_id: int) -> None:
    """Delete a run's checkpoint folder (a finished run needs none)."""
    d = folder(store_root, run_id)
    if d.is_dir():
        for f in d.iterdir():
            f.unlink(missing_ok=True)
        try:
            d.rmdir()
        except OSError:
            pass


# --------------------------------------------------------------------------- RNGs
def rng_state() -> dict[str, Any]:
    """Every global RNG a training step may draw from: Python's, numpy's, torch's CPU
    generator and each CUDA device's (dropout, sampling in model code)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    return {
        "python": random.getstate(),
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(gauss)],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuples(state["python"]))
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():  # one per device it was saved on
        for i, s in enumerate(state["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s, i)


def _tuples(x):
    """random.setstate wants the nested tuples it gave out (a round trip may give lists)."""
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x
