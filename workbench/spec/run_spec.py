"""One run's typed specification (:class:`RunSpec`) and its identity (:func:`spec_key`).

A RunSpec is what :func:`workbench.spec.expand.expand` makes of a profile, one per run;
the store keeps it as a dict (``RunSpec.to_dict``). ``spec_key`` is the identity a replay
matches on and a checkpoint header carries. No pydantic, no torch: the store's readers,
the scheduler and the worker import this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# How a run lays out its data and its evaluation: the worker runs by these and the
# resource estimate (workbench.spec.estimate) predicts by them.
STREAM_ABOVE = 16384      # evaluate longer sequences chunk by chunk where the model can
STREAM_CHUNK = 4096
ATTENTION_EVAL_MAX = 16384  # longer sequences are skipped for models without recurrent state
EVAL_TOKENS_PER_BATCH = 1 << 16
RESIDENT_MAX_BYTES = 1 << 30  # fixed training sets up to this size are moved to the device once

# train settings that change when a checkpoint is written, never what is computed
NEUTRAL_TRAIN_KEYS = ("checkpoint_every", "checkpoint_minutes")


@dataclass
class RunSpec:
    """One run of a sweep: everything the worker needs, JSON-serialisable."""

    profile: str
    model: str          # registry name
    label: str          # display name (model label or name)
    model_options: dict[str, Any]
    d_model: int
    n_layers: int
    task: str
    task_params: dict[str, Any]
    seq_len: int | None
    seed: int
    train: dict[str, Any]
    index: int = 0
    fields: dict[str, Any] = field(default_factory=dict)  # flat fields for grouping tables
    # schema 2 only (None for schema 1 profiles, whose specs, and so their identity
    # spec_key, stay what they were): the grid point {dotted key: value} and the
    # task setting ("baseline" or one variant, "seq_len=512"); readers take a missing
    # task_setting as "baseline" and a missing grid as {}
    grid: dict[str, Any] | None = None
    task_setting: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None or k not in ("grid", "task_setting")}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunSpec":
        return cls(**d)


def spec_key(spec: dict) -> str:
    """A run's identity as text: its spec without the sweep position (``index``) and the
    checkpoint settings; equal keys mean the same computation."""
    s = json.loads(json.dumps(spec))  # tuples -> lists, as the store holds them
    s.pop("index", None)
    s["train"] = {k: v for k, v in (s.get("train") or {}).items() if k not in NEUTRAL_TRAIN_KEYS}
    return json.dumps(s, sort_keys=True)
