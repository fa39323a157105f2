"""Run profiles: schema-versioned TOML sweeps, strictly validated.

A profile names one task, a list of models, sequence lengths and seeds, and the training
settings; :func:`expand` turns it into one :class:`RunSpec` per (model, seq_len, seed).
Unknown keys anywhere are errors that name the key, its line and the file (zoology
silently drops them; we don't). Saving from the TUI writes the same format via
:func:`dumps`.
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from workbench.slurm import SlurmSettings

SCHEMA_VERSION = 1


class ProfileError(Exception):
    """A profile that cannot be used; the message names the file, key and line."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


class ModelChoice(_Strict):
    """One model of the sweep: a registry name plus optional per-model settings."""

    model_config = ConfigDict(extra="allow")  # remaining keys are model options, checked below
    name: str
    label: str | None = None
    d_model: int | None = Field(default=None, gt=0)
    n_layers: int | None = Field(default=None, gt=0)

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    @property
    def display(self) -> str:
        return self.label or self.name


class TaskSection(_Strict):
    model_config = ConfigDict(extra="allow")  # task parameters, checked against the registry
    name: str

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class SweepSection(_Strict):
    models: list[Union[str, ModelChoice]] = Field(min_length=1)
    seq_lens: list[int] = Field(default_factory=list)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)

    @field_validator("seq_lens")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(x <= 0 for x in v):
            raise ValueError("sequence lengths must be positive")
        return v

    def model_choices(self) -> list[ModelChoice]:
        return [ModelChoice(name=m) if isinstance(m, str) else m for m in self.models]


class ModelSection(_Strict):
    d_model: int = Field(default=64, gt=0)
    n_layers: int = Field(default=2, gt=0)
    # Composition options for every model of the sweep (a model's own options win); unset,
    # each model gets its reference implementation's init (`ssm-workbench models`).
    init_scheme: Literal["torch", "mamba", "hf"] | None = None
    init_std: float | None = Field(default=None, gt=0)
    tie_embeddings: bool | None = None
    options: dict[str, dict[str, Any]] = Field(default_factory=dict)

    def shared_options(self) -> dict[str, Any]:
        return {k: v for k in ("init_scheme", "init_std", "tie_embeddings")
                if (v := getattr(self, k)) is not None}


class EarlyStopping(_Strict):
    metric: Literal["accuracy", "loss"] = "accuracy"
    patience: int = Field(default=0, ge=0)  # evaluations without improvement; 0 = off
    min_delta: float = Field(default=0.0, ge=0)
    target: float | None = None  # stop once eval accuracy >= target (accuracy metric only)


class TrainSection(_Strict):
    epochs: int | None = Field(default=None, gt=0)
    steps: int | None = Field(default=None, gt=0)
    batch_size: int = Field(default=32, gt=0)
    eval_batch_size: int | None = Field(default=None, gt=0)
    lr: float = Field(default=1e-3, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(default=0.0, ge=0)
    warmup_steps: int = Field(default=0, ge=0)
    schedule: Literal["cosine", "constant"] = "cosine"
    # "adam": torch.optim.Adam, weight decay (if any) added to the gradient as L2, what the
    # hybrid-model MAD code and the Mamba paper's synthetic runs used; "adamw": decoupled.
    optimizer: Literal["adamw", "adam"] = "adamw"
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    grad_clip: float = Field(default=1.0, ge=0)  # 0 = off
    amp: bool = False
    compile: bool = False  # train through torch.compile(model); first-step time -> compile_s
    eval_every: int = Field(default=1, gt=0)  # epochs (epochs mode) or steps (steps mode)
    log_every: int = Field(default=10, gt=0)  # steps between train-loss records
    early_stopping: EarlyStopping = Field(default_factory=EarlyStopping)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # Checkpoints for resuming (docs/ARCHITECTURE.md, "Checkpoints and resume"): every N
    # optimizer steps (0 = off) and every M minutes of training (0 = off); always on
    # SIGTERM / SIGUSR1. Ten minutes bounds what a crash loses on long runs and never fires
    # on short ones; neither setting changes what a run computes.
    checkpoint_every: int = Field(default=0, ge=0)
    checkpoint_minutes: float = Field(default=10.0, ge=0)

    @field_validator("betas")
    @classmethod
    def _betas(cls, v):
        if not all(0 <= b < 1 for b in v):
            raise ValueError("betas must lie in [0, 1)")
        return v

    @model_validator(mode="after")
    def _one_budget(self):
        if (self.epochs is None) == (self.steps is None):
            raise ValueError("give exactly one of train.epochs or train.steps")
        return self


class PublishedValue(_Strict):
    """A number the published work reports, for ``ssm-workbench report`` to set ours beside.

    ``model`` is a sweep label; the value is eval ``metric`` at ``epoch`` (or ``step``) of
    the training history when given, else the final result on eval set ``eval_set``.
    """
    model: str
    metric: str = "accuracy"
    value: float
    seq_len: int | None = None
    eval_set: str = ""
    epoch: float | None = Field(default=None, gt=0)
    step: int | None = Field(default=None, gt=0)
    source: str = ""

    @model_validator(mode="after")
    def _one_point(self):
        if self.epoch is not None and self.step is not None:
            raise ValueError("give at most one of epoch or step")
        return self


class Profile(_Strict):
    schema_version: int
    name: str = Field(min_length=1)
    description: str = ""
    task: TaskSection
    sweep: SweepSection
    model: ModelSection = Field(default_factory=ModelSection)
    train: TrainSection
    runs_per_gpu: int | None = Field(default=None, gt=0)  # runs sharing a GPU (--runs-per-gpu wins; None = 1)
    published: list[PublishedValue] = Field(default_factory=list)  # for `ssm-workbench report`
    # where the runs execute: this machine's scheduler, or one Slurm job per run
    executor: Literal["local", "slurm"] = "local"
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)  # the #SBATCH settings

    @field_validator("schema_version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != SCHEMA_VERSION:
            raise ValueError(f"unsupported schema_version {v}; this tool reads {SCHEMA_VERSION}")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", v):
            raise ValueError("profile names use letters, digits, '.', '_' and '-'")
        return v


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

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunSpec":
        return cls(**d)


# --------------------------------------------------------------------------- loading
def _line_of(text: str, key: str, parent: str | None = None) -> int | None:
    """Best-effort line number of ``key`` (as a TOML key) in the source text."""
    pat = re.compile(rf'^\s*(?:"{re.escape(key)}"|{re.escape(key)})\s*=|[{{,]\s*{re.escape(key)}\s*=')
    section = re.compile(r"^\s*\[+\s*([^\]]*?)\s*\]+")
    current = ""
    for i, line in enumerate(text.splitlines(), 1):
        m = section.match(line)
        if m:
            current = m.group(1)
            if current.split(".")[-1] == key:
                return i
            continue
        if pat.search(line) and (parent is None or current.startswith(parent) or parent in line):
            return i
    return None


def _format_loc(loc: tuple) -> str:
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int):
            parts[-1] = f"{parts[-1]}[{p}]" if parts else f"[{p}]"
        elif p in ("str", "ModelChoice"):  # pydantic union branch names
            continue
        else:
            parts.append(str(p))
    return ".".join(parts)


def _validation_message(err: ValidationError, path: str, text: str) -> str:
    lines = [f"{path}: invalid profile"]
    seen = set()
    for e in err.errors():
        loc = e["loc"]
        key = _format_loc(loc)
        if (key, e["type"]) in seen:
            continue
        seen.add((key, e["type"]))
        last = next((str(p) for p in reversed(loc) if isinstance(p, str) and p not in ("str", "ModelChoice")), None)
        line = _line_of(text, last) if last else None
        where = f" (line {line})" if line else ""
        if e["type"] == "extra_forbidden":
            lines.append(f"  unknown key '{key}'{where}")
        elif e["type"] == "missing":
            lines.append(f"  missing key '{key}'")
        else:
            lines.append(f"  '{key}'{where}: {e['msg']}; got {e.get('input')!r}")
    # a union of str | table yields two messages per bad item; keep them readable
    return "\n".join(lines)


def _build_on_meta(name: str, d_model: int, n_layers: int, options: dict[str, Any]) -> None:
    """Build the backbone without memory (meta device), so bad option values (d_inner = 0,
    n_heads not dividing d_model) are reported before any run; ValueError / TypeError
    propagate, anything the meta device itself cannot do is ignored (the run will tell)."""
    import torch

    import models

    if models.entry(name).family == "pretrained":
        # building would read the weights: check the folders (config and weights present)
        from models.pretrained import check_folder

        for key, value in options.items():
            if key == "path" or key.endswith("_path"):
                check_folder(value)
        return
    try:
        with torch.device("meta"):
            models.build(name, d_model=d_model, n_layers=n_layers, **options)
    except (TypeError, ValueError):
        raise
    except Exception:
        pass


def _check_registries(p: Profile, path: str, text: str) -> None:
    """Model and task names and their options must exist in the registries."""
    import models
    import tasks
    from workbench.compose import check_compose_options, split_options

    problems: list[str] = []
    try:
        tasks.task_class(p.task.name)
    except KeyError as e:
        problems.append(f"  task.name (line {_line_of(text, 'name', 'task')}): {e}")
    else:
        params = p.task.params()
        if "seq_len" in params:
            problems.append("  task.seq_len: give sequence lengths in sweep.seq_lens")
        try:
            tasks.check_params(p.task.name, params)
        except TypeError as e:
            bad = [k for k in params if k not in tasks.parameters(p.task.name)]
            line = _line_of(text, bad[0], "task") if bad else None
            problems.append(f"  task (line {line}): {e}" if line else f"  task: {e}")
        else:
            # build the task once per length: bad values (a missing data file, a length
            # too short for the tokens to copy) are caught here, before any run starts
            for L in p.sweep.seq_lens or [None]:
                try:
                    tasks.build(p.task.name, **params, **({"seq_len": L} if L is not None else {}))
                except (ValueError, TypeError, OSError) as e:
                    where = f" with seq_len={L}" if L is not None else ""
                    problems.append(f"  task {p.task.name!r}{where}: {e}")
                    break
    for choice in p.sweep.model_choices():
        try:
            models.entry(choice.name)
        except KeyError as e:
            problems.append(f"  sweep.models (line {_line_of(text, 'models')}): {e}")
            continue
        backbone_opts, compose_opts = split_options(_model_options(p, choice))
        try:
            models.check_options(choice.name, backbone_opts)
            check_compose_options(compose_opts)
            _build_on_meta(choice.name, choice.d_model or p.model.d_model,
                           choice.n_layers or p.model.n_layers, backbone_opts)
        except (TypeError, ValueError) as e:
            problems.append(f"  model options for {choice.display!r}: {e}")
    for name in p.model.options:
        if name not in models.names():
            problems.append(f"  model.options.{name} (line {_line_of(text, name)}): unknown model {name!r}")
    labels = [c.display for c in p.sweep.model_choices()]
    for i, pub in enumerate(p.published):
        if pub.model not in labels:
            problems.append(f"  published[{i}].model: {pub.model!r} is not a model label of the "
                            f"sweep ({', '.join(labels)})")
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        problems.append(f"  sweep.models: duplicate model label(s) {', '.join(dupes)}; give each a distinct 'label'")
    if problems:
        raise ProfileError(f"{path}: invalid profile\n" + "\n".join(problems))


def loads(text: str, path: str = "<string>", check_registries: bool = True) -> Profile:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"{path}: malformed TOML: {e}") from None
    if "name" not in data and path not in ("<string>",):
        data["name"] = Path(path).stem
    try:
        prof = Profile.model_validate(data)
    except ValidationError as e:
        raise ProfileError(_validation_message(e, path, text)) from None
    if check_registries:
        _check_registries(prof, path, text)
    return prof


def load(path: str | Path, check_registries: bool = True,
         overrides: list[str] | None = None) -> Profile:
    """Read and validate a profile; ``overrides`` are ``dotted.key=TOML value`` settings
    (``run --set``) applied before validation, e.g. ``task.data_path="/data/aclImdb"``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ProfileError(f"{path}: cannot read profile: {e.strerror}") from None
    if overrides:
        text = apply_overrides(text, overrides, str(path))
    return loads(text, str(path), check_registries)


def apply_overrides(text: str, overrides: list[str], path: str = "<string>") -> str:
    """The profile text with each ``a.b.c=value`` set (value parsed as TOML; a bare word
    that is not valid TOML is taken as a string, so paths need no quotes)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"{path}: {e}") from None
    for item in overrides:
        key, sep, raw = item.partition("=")
        parts = [k.strip() for k in key.split(".")]
        if not sep or not all(parts):
            raise ProfileError(f"--set {item!r}: expected dotted.key=value")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        node = data
        for k in parts[:-1]:
            nxt = node.setdefault(k, {})
            if not isinstance(nxt, dict):
                raise ProfileError(f"--set {item!r}: {k!r} is not a table in {path}")
            node = nxt
        node[parts[-1]] = value
    return tomli_w.dumps(data)


def to_dict(p: Profile) -> dict[str, Any]:
    d = p.model_dump(mode="json", exclude_none=True)
    d["task"] = {"name": p.task.name, **p.task.params()}
    d["sweep"]["models"] = [
        m if isinstance(m, str) else {k: v for k, v in {**m.model_dump(exclude_none=True), **m.options()}.items()}
        for m in p.sweep.models
    ]
    if not d["sweep"]["seq_lens"]:
        del d["sweep"]["seq_lens"]
    if not d.get("published"):
        d.pop("published", None)
    return d


def dumps(p: Profile) -> str:
    return tomli_w.dumps(to_dict(p))


def save(p: Profile, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(dumps(p), encoding="utf-8")
    tmp.replace(path)  # atomic: a crash never leaves half a profile
    return path


# --------------------------------------------------------------------------- sweep
def expand(p: Profile) -> list[RunSpec]:
    """One RunSpec per (model, seq_len, seed), in that nesting order."""
    specs: list[RunSpec] = []
    seq_lens: list[int | None] = list(p.sweep.seq_lens) or [None]
    train = p.train.model_dump(mode="json")
    for choice in p.sweep.model_choices():
        opts = _model_options(p, choice)
        d_model = choice.d_model or p.model.d_model
        n_layers = choice.n_layers or p.model.n_layers
        for L in seq_lens:
            for seed in p.sweep.seeds:
                task_params = p.task.params()
                if L is not None:
                    task_params["seq_len"] = L
                fields = {
                    "model": choice.display, "task": p.task.name, "seq_len": L, "seed": seed,
                    "d_model": d_model, "n_layers": n_layers,
                    **{f"task.{k}": v for k, v in p.task.params().items() if _scalar(v)},
                    **{f"opt.{k}": v for k, v in opts.items() if _scalar(v)},
                }
                specs.append(RunSpec(
                    profile=p.name, model=choice.name, label=choice.display, model_options=opts,
                    d_model=d_model, n_layers=n_layers, task=p.task.name, task_params=task_params,
                    seq_len=L, seed=seed, train=train, index=len(specs), fields=fields,
                ))
    return specs


def _model_options(p: Profile, choice: ModelChoice) -> dict[str, Any]:
    """One model's options: [model] shared < [model.options.NAME] < the sweep entry's own."""
    return {**p.model.shared_options(), **p.model.options.get(choice.name, {}), **choice.options()}


def _scalar(v: Any) -> bool:
    return isinstance(v, (int, float, str, bool))
