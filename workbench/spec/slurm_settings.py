"""The ``[slurm]`` table of a profile: what a user puts in ``#SBATCH`` lines today.

Kept apart from ``workbench.execute.slurm`` (the executor) so that reading the store (``runs``,
the TUI's polls) never imports pydantic; ``workbench.execute.slurm.SlurmSettings`` still resolves
here for code and job scripts written before the move.
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

TIME_RE = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")


class SlurmSettings(BaseModel):
    """What a user puts in ``#SBATCH`` lines today (the profile's ``[slurm]`` table)."""

    # strict numbers and booleans, as in the rest of a profile: requeue = "yes" or
    # gpus_per_run = true is a mistake, not a setting
    model_config = ConfigDict(extra="forbid")

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = Field(None, description="time limit per run: MM, HH:MM:SS or D-HH:MM:SS")
    gpus_per_run: StrictInt = Field(1, ge=0)
    # a run on several devices (train.devices = N > 1): N ranks started by srun, spread over
    # `nodes` nodes (N / nodes each), with `gpus_per_node` GPUs each (default: one per rank
    # when gpus_per_run > 0, none otherwise); cpus_per_run is then per rank
    nodes: StrictInt = Field(1, ge=1)
    gpus_per_node: StrictInt | None = Field(None, ge=0)
    cpus_per_run: StrictInt = Field(4, ge=1)
    mem: str | None = Field(None, description="memory per run, e.g. 32G")
    extra: list[str] = Field(default_factory=list, description="more sbatch flags, e.g. ['--constraint=a100']")
    signal_s: StrictInt = Field(120, ge=0, description="SIGUSR1 this many seconds before the time limit: "
                                                  "the worker saves a checkpoint (0: none)")
    requeue: StrictBool = True
    requeue_at_time_limit: StrictBool = Field(True, description="on the SIGUSR1 before the time limit, save "
                                                          "a checkpoint and requeue the job (needs "
                                                          "time, signal_s and requeue)")
    shared_dir: str | None = Field(None, description="a folder every node sees, for job files "
                                                     "(SHARED/slurm/run-N) and checkpoints (default: "
                                                     "the store's folder)")
    python: str | None = Field(None, description="the Python on the nodes (default: this one)")
    setup: list[str] = Field(default_factory=list, description="shell lines before the worker, "
                                                               "e.g. 'module load cuda'")

    @field_validator("time", mode="before")
    @classmethod
    def _time(cls, v: Any) -> str | None:
        if isinstance(v, (dt.time, int)):  # TOML reads 04:00:00 unquoted as a time, 30 as an int
            v = v.strftime("%H:%M:%S") if isinstance(v, dt.time) else str(v)
        if v is not None and not TIME_RE.match(str(v)):
            raise ValueError(f"time {v!r}: write MM, HH:MM:SS or D-HH:MM:SS")
        return v
