"""Run profiles: schema-versioned TOML sweeps, strictly validated.

A profile names a task (schema 2: several, ``[[tasks]]``, each with optional one-at-a-time
``variants``), a list of models, sequence lengths and seeds, the training settings and
(schema 2) a ``[sweep.grid]`` of dotted keys over any of them; :func:`expand` turns it
into one :class:`RunSpec` per (task setting, model, seq_len, grid point, seed).
Schema 1 profiles (one ``[task]``, no grid) load as before and expand to the same specs.
Unknown keys anywhere are errors that name the key, its line and the file (zoology
silently drops them; we don't). Validation matches what runs: every number is finite and
in a range that trains (a value that is certainly a mistake is refused, not run), integers
are integers (``epochs = true`` is refused, not read as 1), booleans are booleans, seeds fit
the store's 64-bit integers and are distinct, and the budget trains at least one step.
Errors name the key and its line in the file (:func:`_key_lines`), or the ``--set`` that
gave the value. Saving from the TUI writes the same format via :func:`dumps`.
"""
from __future__ import annotations

import copy
import itertools
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import tomli_w
from annotated_types import Le
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, ValidationError,
                      field_validator, model_validator)

from workbench.spec.slurm_settings import SlurmSettings

SCHEMA_VERSION = 2  # the version this tool writes; it reads SCHEMA_VERSIONS
SCHEMA_VERSIONS = (1, 2)  # 2 adds [sweep.grid], [[tasks]] and task variants


class ProfileError(Exception):
    """A profile that cannot be used; the message names the file, key and line."""


# Integers are stored in SQLite INTEGER columns (seeds, steps, sizes): beyond 2^63 - 1 a
# value cannot be queued at all, so it is refused here, not as a traceback at submit time.
INT64_MAX = 2**63 - 1


def _int_input(v: Any) -> Any:
    # pydantic's lax int reads true as 1: a boolean in a number field is a mistake (a
    # shifted line, a key mixed up), never a count. Integral floats (TOML reads 1e5 as a
    # float) and numeric text (the TUI form's inputs) go on to pydantic, which refuses
    # fractions ("1.5") and words ("five").
    if isinstance(v, bool):
        raise ValueError(f"expected an integer, got {str(v).lower()}")
    return v


def _float_input(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError(f"expected a number, got {str(v).lower()}")
    return v


Int = Annotated[int, BeforeValidator(_int_input), Le(INT64_MAX)]
Float = Annotated[float, BeforeValidator(_float_input)]  # finite: allow_inf_nan=False below
Bool = StrictBool  # true or false only; "yes" and 1 are refused


class _Strict(BaseModel):
    # allow_inf_nan=False: inf or nan in any float field (TOML has both) is refused; no
    # setting of this tool means "infinity", and nan never compares
    model_config = ConfigDict(extra="forbid", strict=False, allow_inf_nan=False)


def _distinct(what: str, v: list) -> list:
    dupes = sorted({x for x in v if v.count(x) > 1})
    if dupes:
        raise ValueError(f"duplicate {what} {', '.join(map(str, dupes))}: each would repeat "
                         f"the same runs")
    return v


class _FieldError(ValueError):
    """A model-level check that is about one field: the message points at that key's line
    (``key``: a name, or a path of names below the table that failed)."""

    def __init__(self, key: str | tuple, msg: str):
        super().__init__(msg)
        self.key = key


class ModelChoice(_Strict):
    """One model of the sweep: a registry name plus optional per-model settings."""

    model_config = ConfigDict(extra="allow")  # remaining keys are model options, checked below
    name: str
    label: str | None = None
    d_model: Int | None = Field(default=None, gt=0)
    n_layers: Int | None = Field(default=None, gt=0)

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    @property
    def display(self) -> str:
        return self.label or self.name


def _json_key(v: Any) -> str:
    import json

    return json.dumps(v, sort_keys=True)


def _distinct_values(what: str, values: list) -> list:
    keys = [_json_key(v) for v in values]
    dupes = [v for i, v in enumerate(values) if keys.index(keys[i]) != i]
    if dupes:
        raise ValueError(f"duplicate {what} {', '.join(map(repr, dupes))}: each would repeat the same runs")
    return values


class TaskSection(_Strict):
    model_config = ConfigDict(extra="allow")  # task parameters, checked against the registry
    name: str
    # schema 2: mad-lab's one-at-a-time changes of the baseline; { seq_len = [512, 1024],
    # num_train_examples = [800] } gives the baseline plus 3 settings, each one change
    variants: dict[str, Annotated[list[Any], Field(min_length=1)]] = Field(default_factory=dict)

    @field_validator("variants")
    @classmethod
    def _variants(cls, v: dict[str, list]) -> dict[str, list]:
        for key, values in v.items():
            if key in ("name", "variants"):
                raise _FieldError(key, f"{key!r} cannot vary: variants change task parameters")
            _distinct_values(f"variant value(s) of {key}", values)
        return v

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def _flatten_grid(v: Any) -> Any:
    # "train.lr" = [...] (quoted) is one key; train.lr = [...] (a TOML dotted key) arrives
    # as nested tables: both mean the dotted key "train.lr"
    if not isinstance(v, dict):
        return v
    out: dict[str, Any] = {}

    def walk(prefix: str, node: dict) -> None:
        for k, x in node.items():
            if isinstance(x, dict):
                walk(f"{prefix}{k}.", x)
            else:
                out[f"{prefix}{k}"] = x

    walk("", v)
    return out


class SweepSection(_Strict):
    models: list[Union[str, ModelChoice]] = Field(min_length=1)
    seq_lens: list[Annotated[Int, Field(gt=0)]] = Field(default_factory=list)
    # seeds go into torch / numpy generators and the store's INTEGER column: [0, 2^63)
    seeds: list[Annotated[Int, Field(ge=0)]] = Field(default_factory=lambda: [0], min_length=1)
    # schema 2: dotted key -> values, Cartesian with models x lengths x seeds; each value is
    # checked like the same key written in its table (_check_grid)
    grid: Annotated[dict[str, Annotated[list[Any], Field(min_length=1)]],
                    BeforeValidator(_flatten_grid)] = Field(default_factory=dict)

    @field_validator("grid")
    @classmethod
    def _distinct_grid(cls, v: dict[str, list]) -> dict[str, list]:
        for key, values in v.items():
            _distinct_values(f"value(s) of {key}", values)
        return v

    @field_validator("seq_lens")
    @classmethod
    def _distinct_lens(cls, v: list[int]) -> list[int]:
        return _distinct("sequence length(s)", v)

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, v: list[int]) -> list[int]:
        return _distinct("seed(s)", v)

    def model_choices(self) -> list[ModelChoice]:
        return [ModelChoice(name=m) if isinstance(m, str) else m for m in self.models]


class ModelSection(_Strict):
    d_model: Int = Field(default=64, gt=0)
    n_layers: Int = Field(default=2, gt=0)
    # Composition options for every model of the sweep (a model's own options win); unset,
    # each model gets its reference implementation's init (`ssm-workbench models`).
    init_scheme: Literal["torch", "mamba", "hf"] | None = None
    # <= 1 (compose.MAX_INIT_STD): reference inits use 0.02; a unit normal per weight already
    # grows every layer's output by about sqrt(d_model), beyond that nothing trains
    init_std: Float | None = Field(default=None, gt=0, le=1)
    tie_embeddings: Bool | None = None
    options: dict[str, dict[str, Any]] = Field(default_factory=dict)

    def shared_options(self) -> dict[str, Any]:
        return {k: v for k in ("init_scheme", "init_std", "tie_embeddings")
                if (v := getattr(self, k)) is not None}


class EarlyStopping(_Strict):
    metric: Literal["accuracy", "loss"] = "accuracy"
    patience: Int = Field(default=0, ge=0)  # evaluations without improvement; 0 = off
    min_delta: Float = Field(default=0.0, ge=0)
    # stop once eval token accuracy >= target; accuracy is a fraction, so a target above 1
    # would never be reached (and 0 would stop at the first evaluation)
    target: Float | None = Field(default=None, gt=0, le=1)


class TrainSection(_Strict):
    epochs: Int | None = Field(default=None, gt=0)
    steps: Int | None = Field(default=None, gt=0)
    batch_size: Int = Field(default=32, gt=0)
    eval_batch_size: Int | None = Field(default=None, gt=0)
    # lr <= 1: both optimizers are Adam, whose step moves each weight by about lr, so a
    # step above 1 is larger than any weight; published recipes use 1e-4 .. 1e-2
    lr: Float = Field(default=1e-3, gt=0, le=1)
    betas: tuple[Float, Float] = (0.9, 0.999)
    # <= 100: recipes use 0 .. 1 (grokking studies go to ~10); with adamw lr * weight_decay
    # must also stay below 1 (checked below), else each step zeroes or flips every weight
    weight_decay: Float = Field(default=0.0, ge=0, le=100)
    warmup_steps: Int = Field(default=0, ge=0)
    schedule: Literal["cosine", "constant"] = "cosine"
    # "adam": torch.optim.Adam, weight decay (if any) added to the gradient as L2, what the
    # hybrid-model MAD code and the Mamba paper's synthetic runs used; "adamw": decoupled.
    optimizer: Literal["adamw", "adam"] = "adamw"
    min_lr_ratio: Float = Field(default=0.0, ge=0, le=1)
    grad_clip: Float = Field(default=1.0, ge=0)  # 0 = off
    amp: Bool = False
    compile: Bool = False  # train through torch.compile(model); first-step time -> compile_s
    eval_every: Int = Field(default=1, gt=0)  # epochs (epochs mode) or steps (steps mode)
    log_every: Int = Field(default=10, gt=0)  # steps between train-loss records
    early_stopping: EarlyStopping = Field(default_factory=EarlyStopping)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # Checkpoints for resuming (docs/ARCHITECTURE.md, "Checkpoints and resume"): every N
    # optimizer steps (0 = off) and every M minutes of training (0 = off); always on
    # SIGTERM / SIGUSR1. Ten minutes bounds what a crash loses on long runs and never fires
    # on short ones; neither setting changes what a run computes.
    checkpoint_every: Int = Field(default=0, ge=0)
    checkpoint_minutes: Float = Field(default=10.0, ge=0)

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
        # (in epochs mode the total is known only with the task: _check_budget)
        if self.steps is not None and self.warmup_steps > self.steps:
            raise _FieldError("warmup_steps", f"warmup_steps = {self.warmup_steps} is longer than the "
                              f"whole run (steps = {self.steps}): the learning rate would never reach lr")
        if self.optimizer == "adamw" and self.lr * self.weight_decay >= 1:
            raise _FieldError("weight_decay", f"lr * weight_decay = {self.lr * self.weight_decay:g} >= 1: "
                              f"adamw multiplies every weight by 1 - lr * weight_decay each step")
        return self


class PublishedValue(_Strict):
    """A number the published work reports, for ``ssm-workbench report`` to set ours beside.

    ``model`` is a sweep label; the value is eval ``metric`` at ``epoch`` (or ``step``) of
    the training history when given, else the final result on eval set ``eval_set``.
    """
    model: str
    metric: str = "accuracy"
    value: Float
    seq_len: Int | None = Field(default=None, gt=0)
    eval_set: str = ""
    epoch: Float | None = Field(default=None, gt=0)
    step: Int | None = Field(default=None, gt=0)
    source: str = ""

    @model_validator(mode="after")
    def _one_point(self):
        if self.epoch is not None and self.step is not None:
            raise ValueError("give at most one of epoch or step")
        return self


class Profile(_Strict):
    schema_version: Int
    name: str = Field(min_length=1)
    description: str = ""
    task: TaskSection | None = None  # schema 1: the one task; schema 2: this or [[tasks]]
    tasks: list[TaskSection] = Field(default_factory=list)  # schema 2: several tasks
    sweep: SweepSection
    model: ModelSection = Field(default_factory=ModelSection)
    train: TrainSection
    runs_per_gpu: Int | None = Field(default=None, gt=0)  # runs sharing a GPU (--runs-per-gpu wins; None = 1)
    published: list[PublishedValue] = Field(default_factory=list)  # for `ssm-workbench report`
    # where the runs execute: this machine's scheduler, or one Slurm job per run
    executor: Literal["local", "slurm"] = "local"
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)  # the #SBATCH settings

    @field_validator("schema_version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v not in SCHEMA_VERSIONS:
            raise ValueError(f"unsupported schema_version {v}; this tool reads "
                             f"{' and '.join(map(str, SCHEMA_VERSIONS))}")
        return v

    @model_validator(mode="after")
    def _task_tables(self):
        if self.schema_version < 2:
            if self.tasks:
                raise _FieldError("tasks", "[[tasks]] needs schema_version = 2")
            if self.sweep.grid:
                raise _FieldError(("sweep", "grid"), "[sweep.grid] needs schema_version = 2")
            if self.task is not None and self.task.variants:
                raise _FieldError(("task", "variants"), "task variants need schema_version = 2")
        if self.task is None and not self.tasks:
            raise _FieldError("task", "missing: give a [task] table"
                              + (" or [[tasks]] tables" if self.schema_version >= 2 else ""))
        if self.task is not None and self.tasks:
            raise _FieldError("tasks", "give either one [task] table or [[tasks]] tables, not both")
        names = [t.name for t in self.tasks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise _FieldError("tasks", f"duplicate task(s) {', '.join(dupes)}: give one entry per task "
                              f"and its changes as variants")
        return self

    def task_entries(self) -> list[tuple[tuple, TaskSection]]:
        """Each task with its path in the file: ``(("task",), t)`` or ``(("tasks", i), t)``."""
        if self.task is not None:
            return [(("task",), self.task)]
        return [(("tasks", i), t) for i, t in enumerate(self.tasks)]

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
    # schema 2 only (None for schema 1 profiles, whose specs, and so their identity
    # checkpoint.spec_key, stay what they were): the grid point {dotted key: value} and the
    # task setting ("baseline" or one variant, "seq_len=512"); readers take a missing
    # task_setting as "baseline" and a missing grid as {}
    grid: dict[str, Any] | None = None
    task_setting: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None or k not in ("grid", "task_setting")}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunSpec":
        return cls(**d)


# --------------------------------------------------------------------------- loading
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


class _KeyLines:
    """Line of every key, table and array item of a TOML text, keyed by its path
    (``("task", "name")``, ``("sweep", "models", 1, "n_layers")``).

    Error messages need the line of the value that failed. A text search for the last key
    finds the first ``name =`` of the file whatever the table; this follows the document's
    structure (tables, arrays of tables, dotted keys, inline tables, arrays across lines).
    It runs only on text tomllib has accepted, so it need not diagnose anything."""

    def __init__(self, text: str):
        self.s, self.i, self.line = text, 0, 1
        self.lines: dict[tuple, int] = {}
        self.aot: dict[tuple, int] = {}  # array-of-tables path -> index of its last table

    def _adv(self, n: int = 1) -> None:
        self.line += self.s.count("\n", self.i, self.i + n)
        self.i += n

    def _skip(self, newlines: bool = False) -> None:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in " \t\r" or (newlines and c == "\n"):
                self._adv()
            elif c == "#":
                end = s.find("\n", self.i)
                self._adv((len(s) if end < 0 else end) - self.i)
            else:
                return

    def _record(self, path: tuple, line: int) -> None:
        for n in range(1, len(path) + 1):
            self.lines.setdefault(path[:n], line)

    def _string_end(self, j: int) -> int:
        """Index just past the string starting at ``j``."""
        s = self.s
        q = next(q for q in ('"""', "'''", '"', "'") if s.startswith(q, j))
        j += len(q)
        while not s.startswith(q, j):
            j += 2 if (s[j] == "\\" and q[0] == '"') else 1
        j += len(q)
        extra = 0  # a multi-line string's content may end in up to two of its quotes
        while len(q) == 3 and extra < 2 and s[j:j + 1] == q[0]:
            j, extra = j + 1, extra + 1
        return j

    def _key(self) -> tuple:
        parts: list[str] = []
        while True:
            self._skip()
            if self.s[self.i] in "\"'":
                end = self._string_end(self.i)
                parts.append(tomllib.loads(f"k = {self.s[self.i:end]}")["k"])
                self._adv(end - self.i)
            else:
                m = _BARE_KEY.match(self.s, self.i)
                parts.append(m.group())
                self._adv(m.end() - self.i)
            self._skip()
            if self.s.startswith(".", self.i):
                self._adv()
                continue
            return tuple(parts)

    def _value(self, path: tuple) -> None:
        s, c = self.s, self.s[self.i]
        if c in "\"'":
            self._adv(self._string_end(self.i) - self.i)
        elif c == "[":
            self._adv()
            k = 0
            while True:
                self._skip(newlines=True)
                if s[self.i] == "]":
                    self._adv()
                    return
                self._record(path + (k,), self.line)
                self._value(path + (k,))
                self._skip(newlines=True)
                if s[self.i] == ",":
                    self._adv()
                k += 1
        elif c == "{":
            self._adv()
            while True:
                self._skip(newlines=True)
                if s[self.i] == "}":
                    self._adv()
                    return
                self._pair(path)
                self._skip(newlines=True)
                if s[self.i] == ",":
                    self._adv()
        else:  # number, bool, date: up to the next separator
            m = re.compile(r"[^,\]}\n#]*").match(s, self.i)
            self._adv(m.end() - self.i)

    def _pair(self, table: tuple) -> None:
        line = self.line
        key = table + self._key()
        self._record(key, line)
        self._skip()
        self._adv()  # '='
        self._skip()
        self._value(key)

    def _resolve(self, key: tuple) -> tuple:
        """A header's path with the current index of each array of tables on it."""
        out: tuple = ()
        for part in key:
            out += (part,)
            if out in self.aot:
                out += (self.aot[out],)
        return out

    def scan(self) -> dict[tuple, int]:
        s, table = self.s, ()
        while True:
            self._skip(newlines=True)
            if self.i >= len(s):
                return self.lines
            line = self.line
            if s.startswith("[[", self.i):
                self._adv(2)
                key = self._key()
                base = self._resolve(key[:-1]) + key[-1:]
                self.aot[base] = self.aot.get(base, -1) + 1
                table = base + (self.aot[base],)
                self._skip()
                self._adv(2)
                self._record(table, line)
            elif s[self.i] == "[":
                self._adv()
                table = self._resolve(self._key())
                self._skip()
                self._adv()
                self._record(table, line)
            else:
                self._pair(table)


def _key_lines(text: str) -> dict[tuple, int]:
    """``{key path: line}`` of a TOML text (best effort: a text it cannot follow gives
    what it found so far, never an error in the middle of reporting one)."""
    scanner = _KeyLines(text)
    try:
        return scanner.scan()
    except Exception:
        return scanner.lines


class _Where:
    """Where a key's value came from, for messages: ``" (line N)"``, ``" (from --set K=V)"``."""

    def __init__(self, text: str, origins: dict[tuple, str] | None = None):
        self.lines = _key_lines(text)
        self.origins = origins or {}

    def with_origins(self, extra: dict[tuple, str]) -> "_Where":
        """The same lines, with more keys placed by origin (a grid value, a variant)."""
        w = _Where.__new__(_Where)
        w.lines, w.origins = self.lines, {**self.origins, **extra}
        return w

    def line(self, *loc) -> int | None:
        for n in range(len(loc), 0, -1):
            if loc[:n] in self.lines:
                return self.lines[loc[:n]]
        return None

    def __call__(self, *loc) -> str:
        # a value set on the command line has no line in the file: name the --set instead
        for n in range(len(loc), 0, -1):
            if loc[:n] in self.origins:
                return f" ({self.origins[loc[:n]]})"
        line = self.line(*loc)
        return f" (line {line})" if line else ""


_BRANCHES = ("str", "ModelChoice")  # pydantic's names for the two kinds of sweep.models item


def _format_loc(loc: tuple) -> str:
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int):
            parts[-1] = f"{parts[-1]}[{p}]" if parts else f"[{p}]"
        elif p in _BRANCHES:
            continue
        else:
            parts.append(str(p))
    return ".".join(parts)


def _validation_message(err: ValidationError, path: str, where: _Where) -> str:
    lines = [f"{path}: invalid profile"]
    errors = err.errors()
    failed_as_table = {e["loc"][:-1] for e in errors if e["loc"][-1:] != ("str",)
                       and "ModelChoice" in e["loc"]}
    seen = set()
    for e in errors:
        loc = tuple(e["loc"])
        if loc[-1:] == ("str",) and any(t[:len(loc) - 1] == loc[:-1] for t in failed_as_table):
            continue  # a table item that failed as a table: "not a string" says nothing
        msg = e["msg"].removeprefix("Value error, ")
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, _FieldError):  # a table-level check about one of its keys
            loc = loc + (cause.key if isinstance(cause.key, tuple) else (cause.key,))
        if loc[-1:] == ("ModelChoice",):
            msg = 'expected a model name or a table { name = "..." }'
        key = _format_loc(loc)
        if (key, e["type"]) in seen:
            continue
        seen.add((key, e["type"]))
        clean = tuple(p for p in loc if p not in _BRANCHES)
        if e["type"] == "extra_forbidden":
            lines.append(f"  unknown key '{key}'{where(*clean)}")
        elif e["type"] == "missing":
            parent = where(*clean[:-1]) if len(clean) > 1 else ""
            lines.append(f"  missing key '{key}'{parent.replace(' (line', ' (in the table at line')}")
        else:
            got = e.get("input")
            shown = ("" if isinstance(got, dict) or isinstance(cause, _FieldError) or "got " in msg
                     else f"; got {got!r}")
            lines.append(f"  '{key}'{where(*clean)}: {msg}{shown}")
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


def _mentioned(message: str, keys) -> str | None:
    """The first of ``keys`` the message names as a word (which option a check refused)."""
    return next((k for k in keys if re.search(rf"(?<![\w.]){re.escape(k)}(?!\w)", message)), None)


def _option_where(msec: ModelSection, i: int, choice: ModelChoice, key: str | None, where: _Where) -> str:
    """Where model option ``key`` of sweep entry ``i`` was set: the entry's own table, else
    [model.options.NAME], else [model] (``msec``: that section, at a grid point); the entry
    itself when no option is named."""
    if key is None:
        return where("sweep", "models", i)
    if key in choice.options() or (key in ("d_model", "n_layers") and getattr(choice, key) is not None):
        return where("sweep", "models", i, key)
    if key in msec.options.get(choice.name, {}):
        return where("model", "options", choice.name, key)
    return where("model", key)


def _check_budget(t: TrainSection, task_name: str, task, where: _Where) -> list[str]:
    """The epochs budget against the built task: it must train at least one step, and the
    warm-up must fit in it (steps mode is checked by TrainSection). Mirrors the worker's
    plan (Worker._plan): fresh-batch tasks have epochs only with num_train_examples > 0."""
    if t.epochs is None:
        return []
    n = int(getattr(task, "num_train_examples", 0) or 0)
    if not n:
        if task.fixed_train:
            return []  # a data set read whole (images with num_train_examples = 0): size unknown here
        return [f"  train.epochs{where('train', 'epochs')}: task {task_name!r} has no training set "
                f"(num_train_examples = 0 draws fresh batches), so an epoch is no step at all; "
                f"give train.steps, or task.num_train_examples > 0"]
    total = t.epochs * math.ceil(n / t.batch_size)  # an upper bound where the data set is smaller
    if t.warmup_steps > total:
        return [f"  train.warmup_steps{where('train', 'warmup_steps')}: warmup_steps = {t.warmup_steps} "
                f"is longer than the whole run ({t.epochs} epoch(s) x {math.ceil(n / t.batch_size)} "
                f"step(s) = {total}): the learning rate would never reach lr"]
    return []


# --------------------------------------------------------------------------- grid and task settings
GRID_SECTIONS = ("train", "model", "task")


def _show(v: Any) -> str:
    """A value as TOML writes it (strings quoted, booleans lower case)."""
    return tomli_w.dumps({"v": v}).strip()[4:]


@dataclass
class TaskSetting:
    """One setting of one task: its baseline, or one variant value applied alone."""

    loc: tuple                      # the task's path in the file: ("task",) or ("tasks", i)
    task: TaskSection
    setting: str                    # "baseline" or "key=value"
    params: dict[str, Any]          # the task's parameters in this setting, without seq_len
    seq_lens: list[int | None]      # the lengths it runs at
    len_locs: list[tuple]           # where each length is written
    variant: tuple | None = None    # (key, index) of its variant value


def task_settings(p: Profile) -> list[TaskSetting]:
    """Every task's settings in file order: the baseline, then each variant value applied
    alone to the baseline (mad-lab's one-at-a-time changes: 1 + sum of the lists).

    Lengths (schema 2, after mad-lab, where each task setting has its own length): a
    setting with its own seq_len (written in the task, or a seq_len variant) runs at that
    length only; the others run at each of sweep.seq_lens (none given: the task's default).
    Schema 1 tasks take lengths from sweep.seq_lens only (a task seq_len is refused)."""
    out: list[TaskSetting] = []
    sweep_lens = list(p.sweep.seq_lens) or [None]
    sweep_locs = [("sweep", "seq_lens", j) for j in range(len(p.sweep.seq_lens))] or [("sweep",)]
    for loc, t in p.task_entries():
        base = t.params()
        changes = [(None, None, None)] + [(k, j, v) for k, vs in t.variants.items() for j, v in enumerate(vs)]
        for key, j, value in changes:
            params = dict(base)
            if key is not None:
                params[key] = value
            own = params.pop("seq_len", None) if p.schema_version >= 2 else None
            if own is None:
                lens, locs = sweep_lens, sweep_locs
            else:
                lens = [own]
                locs = [(*loc, "variants", "seq_len", j) if key == "seq_len" else (*loc, "seq_len")]
            out.append(TaskSetting(loc, t, "baseline" if key is None else f"{key}={_show(value).strip(chr(34))}",
                                   params, lens, locs, None if key is None else (key, j)))
    return out


def grid_points(p: Profile) -> list[dict[str, Any]]:
    """The grid's points in file order (the last key varies fastest); [{}] without a grid."""
    keys = list(p.sweep.grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(p.sweep.grid[k] for k in keys))]


def _combos(p: Profile, section: str) -> list[dict[str, Any]]:
    """The grid points restricted to the keys of one section ([{}] when it has none)."""
    keys = [k for k in p.sweep.grid if k.split(".")[0] == section]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(p.sweep.grid[k] for k in keys))]


def _set_path(d: dict, parts: list[str], value: Any) -> None:
    for k in parts[:-1]:
        nxt = d.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ValueError(f"{k!r} is not a table")
        d = nxt
    d[parts[-1]] = value


class _Sections:
    """The train and model sections at grid points: the profile's own with the point's
    values set, validated by the same schema; cached per distinct combination."""

    def __init__(self, p: Profile):
        self.p = p
        self.base = {s: getattr(p, s).model_dump(mode="json", exclude_none=True) for s in ("train", "model")}
        self.cache: dict[tuple, Any] = {}

    def get(self, section: str, point: dict[str, Any]):
        vals = {k: v for k, v in point.items() if k.split(".")[0] == section}
        if not vals:
            return getattr(self.p, section)
        key = (section, _json_key(vals))
        if key not in self.cache:
            data = copy.deepcopy(self.base[section])
            for k, v in vals.items():
                _set_path(data, k.split(".")[1:], v)
            self.cache[key] = (TrainSection if section == "train" else ModelSection).model_validate(data)
        return self.cache[key]


def _grid_at(where: _Where, key: str, j: int | None = None) -> str:
    """Where grid key ``key`` (its value ``j``) is written: quoted ("train.lr" = [...]) or
    as a TOML dotted key (train.lr = [...]), or the --set that gave it."""
    tail = () if j is None else (j,)
    for base in (("sweep", "grid", key), ("sweep", "grid", *key.split("."))):
        loc = base + tail
        if any(loc[:n] in where.origins or loc[:n] in where.lines for n in range(len(base), len(loc) + 1)):
            return where(*loc)
    return where("sweep", "grid")


def _value_index(p: Profile, key: str, v: Any) -> int | None:
    want = _json_key(v)
    return next((j for j, x in enumerate(p.sweep.grid[key]) if _json_key(x) == want), None)


def _point_where(p: Profile, where: _Where, point: dict[str, Any], setting: TaskSetting | None = None) -> _Where:
    """``where`` for checks at a grid point (and task setting): a key the point or the
    variant sets is placed at its grid value or variant, not at the file's own value."""
    extra: dict[tuple, str] = {}
    for key, v in point.items():
        at = _grid_at(where, key, _value_index(p, key, v))
        origin = f"sweep.grid '{key}' = {_show(v)}" + (f", {at[2:-1]}" if at else "")
        sec, *rest = key.split(".")
        if sec == "task":
            for loc, _ in p.task_entries():
                extra[(*loc, *rest)] = origin
        else:
            extra[(sec, *rest)] = origin
    if setting is not None and setting.variant is not None:
        vkey, j = setting.variant
        at = where(*setting.loc, "variants", vkey, j)
        extra[(*setting.loc, vkey)] = f"variant {setting.setting}" + (f", {at[2:-1]}" if at else "")
    return where.with_origins(extra) if extra else where


def _section_error(e: Exception, section: str) -> str:
    if not isinstance(e, ValidationError):
        return str(e)
    err = e.errors()[0]
    cause = (err.get("ctx") or {}).get("error")
    loc = tuple(err["loc"]) + ((cause.key if isinstance(cause.key, tuple) else (cause.key,))
                               if isinstance(cause, _FieldError) else ())
    if err["type"] == "extra_forbidden":
        return f"unknown key '{section}.{_format_loc(loc)}'"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{section}.{_format_loc(loc)}: {msg}" if loc else msg


def _check_grid(p: Profile, where: _Where) -> list[str]:
    """The grid's keys and values against the schema: each value set in its section and
    validated exactly as if written there (once per distinct value), then each combination
    of one section's keys (rules across keys: adamw's lr * weight_decay < 1)."""
    problems: list[str] = []
    sections = _Sections(p)
    for key, values in p.sweep.grid.items():
        parts = key.split(".")
        sec, at = parts[0], _grid_at(where, key)
        if sec not in GRID_SECTIONS or len(parts) < 2 or not all(parts):
            problems.append(f"  sweep.grid '{key}'{at}: a grid key names a setting as train.<key>, "
                            f"model.<key>, model.options.<model>.<option> or task.<parameter>")
            continue
        if sec == "task":
            if len(parts) != 2 or parts[1] in ("name", "variants"):
                problems.append(f"  sweep.grid '{key}'{at}: a task grid key is task.<parameter>")
            elif parts[1] == "seq_len":
                problems.append(f"  sweep.grid '{key}'{at}: sequence lengths go in sweep.seq_lens "
                                f"(or a task's seq_len and its variants)")
            continue  # values are checked against the task registry (_check_registries)
        if sec == "model" and parts[1] == "options" and len(parts) != 4:
            problems.append(f"  sweep.grid '{key}'{at}: a model option is model.options.<model>.<option>")
            continue
        for j, v in enumerate(values):
            try:
                sections.get(sec, {key: v})
            except (ValidationError, ValueError) as e:
                problems.append(f"  sweep.grid '{key}' = {_show(v)}{_grid_at(where, key, j)}: {_section_error(e, sec)}")
    if problems:
        return problems
    for sec in ("train", "model"):
        keys = [k for k in p.sweep.grid if k.split(".")[0] == sec]
        if len(keys) < 2:
            continue
        for point in _combos(p, sec):
            try:
                sections.get(sec, point)
            except (ValidationError, ValueError) as e:
                shown = ", ".join(f"'{k}' = {_show(v)}" for k, v in point.items())
                problems.append(f"  sweep.grid point {shown}{_grid_at(where, keys[0])}: {_section_error(e, sec)}")
    return problems


def _problems_text(path: str, problems: list[str], limit: int = 30) -> str:
    """The error text: each distinct problem once (a grid repeats them), at most ``limit``."""
    seen = list(dict.fromkeys(problems))
    more = f"\n  ... and {len(seen) - limit} more" if len(seen) > limit else ""
    return f"{path}: invalid profile\n" + "\n".join(seen[:limit]) + more


_META_BUILT: dict[str, Exception | None] = {}


def _build_on_meta_once(name: str, d_model: int, n_layers: int, options: dict[str, Any]) -> None:
    """:func:`_build_on_meta`, once per distinct model configuration (grids repeat them)."""
    key = _json_key([name, d_model, n_layers, options])
    if key not in _META_BUILT:
        try:
            _build_on_meta(name, d_model, n_layers, options)
            _META_BUILT[key] = None
        except (TypeError, ValueError) as e:
            _META_BUILT[key] = e
    if _META_BUILT[key] is not None:
        raise _META_BUILT[key]


def _check_registries(p: Profile, path: str, where: _Where) -> None:
    """Model and task names and their options must exist in the registries, and their
    values build (a model on the meta device, the task for every length), at every task
    setting and grid point (each distinct task or model configuration once)."""
    import models
    import tasks
    from workbench.compose import check_compose_options, split_options

    problems: list[str] = []
    sections = _Sections(p)
    grid_task_keys = [k for k in p.sweep.grid if k.startswith("task.")]
    bad_tasks: set[tuple] = set()
    for loc, t in p.task_entries():
        label = _format_loc(loc)
        try:
            tasks.task_class(t.name)
        except KeyError as e:
            problems.append(f"  {label}.name{where(*loc, 'name')}: {e}")
            bad_tasks.add(loc)
            continue
        allowed = tasks.parameters(t.name)
        if p.schema_version < 2 and "seq_len" in t.params():
            problems.append(f"  {label}.seq_len{where(*loc, 'seq_len')}: give sequence lengths in sweep.seq_lens")
        for k in t.variants:
            if k not in allowed:
                problems.append(f"  {label}.variants.{k}{where(*loc, 'variants', k)}: task {t.name!r} has no "
                                f"parameter {k!r} (its parameters: {', '.join(allowed)})")
                bad_tasks.add(loc)
        for key in grid_task_keys:
            param = key.split(".", 1)[1]
            if param not in allowed:
                problems.append(f"  sweep.grid '{key}'{_grid_at(where, key)}: task {t.name!r} has no parameter "
                                f"{param!r} (its parameters: {', '.join(allowed)})")
                bad_tasks.add(loc)
            elif param in t.variants:
                problems.append(f"  sweep.grid '{key}'{_grid_at(where, key)}: {param} is also a variant of "
                                f"{label} {t.name!r}{where(*loc, 'variants', param)}; vary it in one place")
                bad_tasks.add(loc)
    trains = [sections.get("train", c) for c in _combos(p, "train")]
    built_tasks: dict[str, tuple] = {}
    for ts in task_settings(p):
        if ts.loc in bad_tasks:
            continue
        label, name = _format_loc(ts.loc), ts.task.name
        for tc in _combos(p, "task"):
            w = _point_where(p, where, tc, ts)
            params = {**ts.params, **{k.split(".", 1)[1]: v for k, v in tc.items()}}
            try:
                tasks.check_params(name, params)
            except TypeError as e:
                bad = [k for k in params if k not in tasks.parameters(name)]
                problems.append(f"  {label}{w(*ts.loc, bad[0]) if bad else ''}: {e}")
                break
            # build the task once per length: bad values (a missing data file, a length
            # too short for the tokens to copy) are caught here, before any run starts
            built = None
            for L, len_loc in zip(ts.seq_lens, ts.len_locs):
                kwargs = {**params, **({"seq_len": L} if L is not None else {})}
                ck = _json_key([name, kwargs])
                if ck not in built_tasks:
                    try:
                        built_tasks[ck] = (tasks.build(name, **kwargs), None)
                    except (ValueError, TypeError, OSError) as e:
                        built_tasks[ck] = (None, e)
                built, err = built_tasks[ck]
                if err is not None:
                    key = _mentioned(str(err), params)
                    at = (w(*ts.loc, key) if key else w(*len_loc) if L is not None else w(*ts.loc))
                    with_len = f" with seq_len={L}" if L is not None else ""
                    setting = f" ({ts.setting})" if ts.setting != "baseline" else ""
                    problems.append(f"  task {name!r}{setting}{with_len}{at}: {err}")
                    built = None
                    break
            if built is not None:
                for tc_train, train in zip(_combos(p, "train"), trains):
                    problems += _check_budget(train, name, built, _point_where(p, w, tc_train))
    choices = p.sweep.model_choices()
    swept = {c.name for c in choices}
    for key in (k for k in p.sweep.grid if k.startswith("model.")):
        parts = key.split(".")
        target, opt = (parts[2], parts[3]) if parts[1] == "options" else (None, parts[1])
        if target is not None and target not in swept:
            problems.append(f"  sweep.grid '{key}'{_grid_at(where, key)}: {target!r} is not a model of the "
                            f"sweep ({', '.join(sorted(swept))}), so every value would repeat the same runs")
        for i, c in enumerate(choices):
            own = opt in c.options() or (opt in ("d_model", "n_layers") and getattr(c, opt) is not None)
            if (target is None or c.name == target) and own:
                problems.append(f"  sweep.grid '{key}'{_grid_at(where, key)}: model {c.display!r} sets its own "
                                f"{opt}{where('sweep', 'models', i, opt)}, which wins over the grid")
    for i, choice in enumerate(choices):
        try:
            models.entry(choice.name)
        except KeyError as e:
            problems.append(f"  sweep.models{where('sweep', 'models', i)}: {e}")
            continue
        for mc in _combos(p, "model"):
            msec = sections.get("model", mc)
            w = _point_where(p, where, mc)
            options = _model_options(msec, choice)
            backbone_opts, compose_opts = split_options(options)
            try:
                models.check_options(choice.name, backbone_opts)
                check_compose_options(compose_opts)
                _build_on_meta_once(choice.name, choice.d_model or msec.d_model,
                                    choice.n_layers or msec.n_layers, backbone_opts)
            except models.OptionError as e:
                at = _option_where(msec, i, choice, e.option, w)
                problems.append(f"  model options for {choice.display!r}{at}: {e.option} = {e.value!r}: "
                                f"expected {e.expected}")
            except (TypeError, ValueError) as e:
                key = _mentioned(str(e), [*options, "d_model", "n_layers"])
                problems.append(f"  model options for {choice.display!r}{_option_where(msec, i, choice, key, w)}: {e}")
    for name, opts in p.model.options.items():
        if name not in models.names():
            problems.append(f"  model.options.{name}{where('model', 'options', name)}: unknown model {name!r}")
        elif name not in swept:  # unused here, but a --set of sweep.models would use them
            try:
                models.check_options(name, split_options(opts)[0])
                check_compose_options(split_options(opts)[1])
            except models.OptionError as e:
                problems.append(f"  model.options.{name}{where('model', 'options', name, e.option)}: "
                                f"{e.option} = {e.value!r}: expected {e.expected}")
            except (TypeError, ValueError) as e:
                key = _mentioned(str(e), opts)
                at = where("model", "options", name, *([key] if key else []))
                problems.append(f"  model.options.{name}{at}: {e}")
    labels = [c.display for c in choices]
    for i, pub in enumerate(p.published):
        if pub.model not in labels:
            problems.append(f"  published[{i}].model{where('published', i, 'model')}: {pub.model!r} is not a "
                            f"model label of the sweep ({', '.join(labels)})")
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        problems.append(f"  sweep.models{where('sweep', 'models')}: duplicate model label(s) {', '.join(dupes)}; "
                        f"give each a distinct 'label'")
    if problems:
        raise ProfileError(_problems_text(path, problems))


def loads(text: str, path: str = "<string>", check_registries: bool = True,
          overrides: list[str] | None = None) -> Profile:
    """Validate profile ``text``; ``overrides`` as for :func:`load` (applied to the parsed
    data, so line numbers in messages stay those of ``text``)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"{path}: malformed TOML: {e}") from None
    origins = apply_overrides(data, overrides or [], path)
    if "name" not in data and path not in ("<string>",):
        data["name"] = Path(path).stem
        origins[("name",)] = "from the file name"
    where = _Where(text, origins)
    try:
        prof = Profile.model_validate(data)
    except ValidationError as e:
        raise ProfileError(_validation_message(e, path, where)) from None
    problems = _check_grid(prof, where)
    if problems:
        raise ProfileError(_problems_text(path, problems))
    if check_registries:
        _check_registries(prof, path, where)
    return prof


def _decode(raw: bytes, path: str) -> str:
    """The text of a profile file, or a one-line ProfileError: profiles are UTF-8 TOML."""
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ProfileError(f"{path}: not UTF-8 text (it starts with a UTF-16 byte-order mark); "
                           f"save the profile as UTF-8")
    if b"\x00" in raw:
        raise ProfileError(f"{path}: not a TOML profile: it contains NUL bytes (a binary file, or "
                           f"UTF-16 text); profiles are UTF-8 text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ProfileError(f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} on line {line}); "
                           f"save the profile as UTF-8") from None
    return text.removeprefix("\ufeff")  # a UTF-8 byte-order mark is still UTF-8


def load(path: str | Path, check_registries: bool = True,
         overrides: list[str] | None = None) -> Profile:
    """Read and validate a profile; ``overrides`` are ``dotted.key=TOML value`` settings
    (``run --set``) applied before validation, e.g. ``task.data_path="/data/aclImdb"``.
    Every failure, unreadable or non-UTF-8 files included, is a :class:`ProfileError`."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ProfileError(f"{path}: cannot read profile: {e.strerror}") from None
    return loads(_decode(raw, str(path)), str(path), check_registries, overrides)


def apply_overrides(data: dict[str, Any], overrides: list[str], path: str = "<string>") -> dict[tuple, str]:
    """Set each ``a.b.c=value`` in the parsed profile ``data`` (value parsed as TOML; a bare
    word that is not valid TOML is taken as a string, so paths need no quotes). Returns
    ``{key path: "from --set a.b.c=value"}`` so messages can name the --set, not a line."""
    origins: dict[tuple, str] = {}
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
        origins[tuple(parts)] = f"from --set {item}"
    return origins


def _task_dict(t: TaskSection) -> dict[str, Any]:
    return {"name": t.name, **t.params(), **({"variants": t.variants} if t.variants else {})}


def to_dict(p: Profile) -> dict[str, Any]:
    """The profile as TOML data (what :func:`dumps` writes): sections it does not use
    (a schema 1 profile's grid and [[tasks]]) are left out, so it loads back the same."""
    d = p.model_dump(mode="json", exclude_none=True)
    d.pop("task", None)
    d.pop("tasks", None)
    if p.task is not None:
        d["task"] = _task_dict(p.task)
    if p.tasks:
        d["tasks"] = [_task_dict(t) for t in p.tasks]
    d["sweep"]["models"] = [
        m if isinstance(m, str) else {k: v for k, v in {**m.model_dump(exclude_none=True), **m.options()}.items()}
        for m in p.sweep.models
    ]
    if not d["sweep"]["seq_lens"]:
        del d["sweep"]["seq_lens"]
    if not d["sweep"].get("grid"):
        d["sweep"].pop("grid", None)
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
    """One RunSpec per (task setting, model, seq_len, grid point, seed), in that nesting
    order; a schema 1 profile (one task, no grid) gives (model, seq_len, seed) as always,
    with the same specs. Schema 2 specs carry ``grid`` and ``task_setting``, and their
    ``fields`` each grid key under its dotted name and "task_setting"."""
    specs: list[RunSpec] = []
    v2 = p.schema_version >= 2
    sections = _Sections(p)
    points = grid_points(p)
    try:
        at_point = [(point, sections.get("train", point).model_dump(mode="json"), sections.get("model", point))
                    for point in points]
    except (ValidationError, ValueError) as e:  # a profile built without loads()
        raise ProfileError(f"{p.name}: invalid sweep.grid: {e}") from None
    for ts in task_settings(p):
        for choice in p.sweep.model_choices():
            for L in ts.seq_lens:
                for point, train, msec in at_point:
                    opts = _model_options(msec, choice)
                    d_model = choice.d_model or msec.d_model
                    n_layers = choice.n_layers or msec.n_layers
                    params = {**ts.params, **{k[5:]: v for k, v in point.items() if k.startswith("task.")}}
                    for seed in p.sweep.seeds:
                        task_params = dict(params)
                        if L is not None:
                            task_params["seq_len"] = L
                        fields = {
                            "model": choice.display, "task": ts.task.name, "seq_len": L, "seed": seed,
                            "d_model": d_model, "n_layers": n_layers,
                            **{f"task.{k}": v for k, v in params.items() if _scalar(v)},
                            **{f"opt.{k}": v for k, v in opts.items() if _scalar(v)},
                        }
                        if v2:
                            fields.update(point)
                            fields["task_setting"] = ts.setting
                        specs.append(RunSpec(
                            profile=p.name, model=choice.name, label=choice.display, model_options=opts,
                            d_model=d_model, n_layers=n_layers, task=ts.task.name, task_params=task_params,
                            seq_len=L, seed=seed, train=train, index=len(specs), fields=fields,
                            grid=dict(point) if v2 else None, task_setting=ts.setting if v2 else None,
                        ))
    return specs


def summary(p: Profile, n_runs: int | None = None) -> str:
    """One line: what the sweep multiplies out to, e.g. "task mqar, 2 model(s) x 1 length(s)
    x 2 seed(s) x 6 grid point(s) = 24 run(s)"."""
    n = len(expand(p)) if n_runs is None else n_runs
    settings = task_settings(p)
    names = [t.name for _, t in p.task_entries()]
    if len(names) == 1 and len(settings) == 1:
        head = f"task {names[0]}, "
        lens = f"{len(settings[0].seq_lens)} length(s) x "
    else:
        head = f"{len(names)} task(s) ({', '.join(names)}) in {len(settings)} setting(s), "
        lens = ""
    grid = f" x {len(grid_points(p))} grid point(s)" if p.sweep.grid else ""
    return (f"{head}{len(p.sweep.models)} model(s) x {lens}{len(p.sweep.seeds)} seed(s){grid} = {n} run(s)")


def _model_options(msec: ModelSection, choice: ModelChoice) -> dict[str, Any]:
    """One model's options: [model] shared < [model.options.NAME] < the sweep entry's own."""
    return {**msec.shared_options(), **msec.options.get(choice.name, {}), **choice.options()}


def _scalar(v: Any) -> bool:
    return isinstance(v, (int, float, str, bool))
