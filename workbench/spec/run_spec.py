"""One run's typed specification (:class:`RunSpec`) and its identity (:func:`spec_key`).

A RunSpec is what :func:`workbench.spec.expand.expand` makes of a profile, one per run;
the store keeps it as a dict (``RunSpec.to_dict``) and the worker reads it back with
``RunSpec.from_dict``. Its ``train`` is the profile schema's typed
:class:`~workbench.spec.schema.TrainSection`, so the train settings' defaults live in one
place, the schema. ``spec_key`` is the identity a replay matches on and a checkpoint
header carries. Importing this module imports no pydantic and no torch (the store's
readers and the scheduler import it); ``from_dict`` loads the schema when called.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel

    from workbench.spec.schema import TrainSection

# How a run lays out its data and its evaluation: the worker runs by these and the
# resource estimate (workbench.spec.estimate) predicts by them.
STREAM_ABOVE = 16384      # evaluate longer sequences chunk by chunk where the model can
STREAM_CHUNK = 4096
ATTENTION_EVAL_MAX = 16384  # longer sequences are skipped for models without recurrent state
EVAL_TOKENS_PER_BATCH = 1 << 16
RESIDENT_MAX_BYTES = 1 << 30  # fixed training sets up to this size are moved to the device once

# train settings that change when a checkpoint (or TensorBoard's copy of the curves) is
# written, or on how many devices the run trains and how they hold the model (the same
# computation to float round-off: workbench/train/distributed.py, sharded.py), never what
# is computed
NEUTRAL_TRAIN_KEYS = ("checkpoint_every", "checkpoint_minutes", "tensorboard", "devices", "sharding")
# spec and train keys written only when set (added after stores existed: a spec without
# them keeps its spec_key)
OPTIONAL_KEYS = ("grid", "task_setting", "budget", "size", "recipe", "match")
OPTIONAL_TRAIN_KEYS = ("tokens", "bytes", "flops", "tokens_per_param", "devices", "sharding")


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
    train: "TrainSection"  # typed: train.lr, train.early_stopping.patience, ...
    index: int = 0
    fields: dict[str, Any] = field(default_factory=dict)  # flat fields for grouping tables
    # schema 2 only (None for schema 1 profiles, whose specs, and so their identity
    # spec_key, stay what they were): the grid point {dotted key: value} and the
    # task setting ("baseline" or one variant, "seq_len=512"); readers take a missing
    # task_setting as "baseline" and a missing grid as {}
    grid: dict[str, Any] | None = None
    task_setting: str | None = None
    # only where a profile uses them (absent otherwise, so other specs and their spec_key
    # stay as they were): a budget in tokens / FLOPs / tokens per parameter and the steps it
    # became (workbench.spec.budget), the size preset's name, the recipe's name and the keys
    # it set ({"name", "keys": {dotted key: value}}; workbench.spec.recipes)
    budget: dict[str, Any] | None = None
    size: str | None = None
    recipe: dict[str, Any] | None = None
    # [sweep.match] (workbench.spec.match): the target and the knob values solved for it,
    # {"target": "params", "value": N, "solved": {"d_model": 272}, "got": n, "error": e};
    # d_model / model_options already hold the solved values
    match: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The dict the store keeps (JSON types; without the optional keys that are None)."""
        d = {k: v for k, v in self.__dict__.items() if v is not None or k not in OPTIONAL_KEYS}
        d["train"] = {k: v for k, v in self.train.model_dump(mode="json").items()
                      if v is not None or k not in OPTIONAL_TRAIN_KEYS}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunSpec":
        """The typed spec of a stored spec dict. A key the dict lacks gets its default (the
        dataclass's here, the schema's for ``train``): stores written by earlier versions
        lack ``train.optimizer``, ``train.compile``, ``train.checkpoint_every`` and
        ``train.checkpoint_minutes`` (added since the first stores) and, schema 1 specs,
        ``grid`` and ``task_setting``. An unknown key, or a missing one without a
        default, is a ValueError naming it. Values are taken as stored: they passed the
        schema when the run was queued, and a check added since must not strand a run
        that is already in a store."""
        from workbench.spec.schema import TrainSection

        if not isinstance(d, dict):
            raise ValueError(f"run spec: expected a dict, got {type(d).__name__}")
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ValueError(f"run spec: unknown key(s) {', '.join(unknown)}")
        missing = [n for n, f in known.items() if n not in d and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise ValueError(f"run spec: missing key(s) {', '.join(missing)}")
        return cls(**{**d, "train": _settings(TrainSection, d["train"], "train")})


def _settings(model: "type[BaseModel]", values: Any, where: str) -> "BaseModel":
    """``model`` (a schema section) from stored ``values``: the schema's defaults for keys
    not there, nested sections likewise, tuples back from JSON lists, without running the
    schema's checks again (see RunSpec.from_dict)."""
    from pydantic import BaseModel

    if not isinstance(values, dict):
        raise ValueError(f"run spec: {where} should be a table, got {values!r}")
    unknown = sorted(set(values) - set(model.model_fields))
    if unknown:
        raise ValueError(f"run spec: unknown key(s) {', '.join(f'{where}.{k}' for k in unknown)}")
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if name not in values:
            out[name] = info.get_default(call_default_factory=True)
            continue
        v, kind = values[name], info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            v = _settings(kind, v, f"{where}.{name}")
        elif typing.get_origin(kind) is tuple and isinstance(v, list):
            v = tuple(v)
        out[name] = v
    return model.model_construct(**out)


def run_devices(spec: dict, info: dict | None = None) -> int:
    """How many devices (ranks) a stored run trains on: ``resume --devices N``'s choice in
    its info, else its spec's ``train.devices``, else 1 (read by the scheduler, which
    reserves them, and by the worker, which starts that many ranks)."""
    n = ((info or {}).get("devices") or (spec.get("train") or {}).get("devices")
         or (spec.get("eval") or {}).get("devices") or 1)  # an evaluation run's eval.devices
    return int(n)


def run_sharding(spec: dict, info: dict | None = None) -> str:
    """How a stored run's ranks hold the model: ``resume --sharding``'s choice in its info,
    else its spec's ``train.sharding``, else "ddp" (workbench/train/sharded.py)."""
    return (info or {}).get("sharding") or (spec.get("train") or {}).get("sharding") or "ddp"


def spec_key(spec: dict) -> str:
    """A run's identity as text: its spec without the sweep position (``index``) and the
    checkpoint settings; equal keys mean the same computation."""
    s = json.loads(json.dumps(spec))  # tuples -> lists, as the store holds them
    s.pop("index", None)
    s["train"] = {k: v for k, v in (s.get("train") or {}).items() if k not in NEUTRAL_TRAIN_KEYS}
    if isinstance(s.get("eval"), dict):  # an evaluation's ranks give one rank's numbers
        s["eval"].pop("devices", None)
        for k in ("output_path", "log_samples"):  # where lm-eval's files are written: no number changes
            s["eval"].pop(k, None)
    return json.dumps(s, sort_keys=True)
