"""Run profiles: schema-versioned TOML sweeps, strictly validated.

A profile names one task, a list of models, sequence lengths and seeds, and the training
settings; :func:`expand` turns it into one :class:`RunSpec` per (model, seq_len, seed).
Unknown keys anywhere are errors that name the key, its line and the file (zoology
silently drops them; we don't). Validation matches what runs: every number is finite and
in a range that trains (a value that is certainly a mistake is refused, not run), integers
are integers (``epochs = true`` is refused, not read as 1), booleans are booleans, seeds fit
the store's 64-bit integers and are distinct, and the budget trains at least one step.
Errors name the key and its line in the file (:func:`_key_lines`), or the ``--set`` that
gave the value. Saving from the TUI writes the same format via :func:`dumps`.
"""
from __future__ import annotations

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

from workbench.slurm import SlurmSettings

SCHEMA_VERSION = 1


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
    """A model-level check that is about one field: the message points at that key's line."""

    def __init__(self, key: str, msg: str):
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


class TaskSection(_Strict):
    model_config = ConfigDict(extra="allow")  # task parameters, checked against the registry
    name: str

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class SweepSection(_Strict):
    models: list[Union[str, ModelChoice]] = Field(min_length=1)
    seq_lens: list[Annotated[Int, Field(gt=0)]] = Field(default_factory=list)
    # seeds go into torch / numpy generators and the store's INTEGER column: [0, 2^63)
    seeds: list[Annotated[Int, Field(ge=0)]] = Field(default_factory=lambda: [0], min_length=1)

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
    task: TaskSection
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
            loc = loc + (cause.key,)
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


def _option_where(p: Profile, i: int, choice: ModelChoice, key: str | None, where: _Where) -> str:
    """Where model option ``key`` of sweep entry ``i`` was set: the entry's own table, else
    [model.options.NAME], else [model]; the entry itself when no option is named."""
    if key is None:
        return where("sweep", "models", i)
    if key in choice.options() or (key in ("d_model", "n_layers") and getattr(choice, key) is not None):
        return where("sweep", "models", i, key)
    if key in p.model.options.get(choice.name, {}):
        return where("model", "options", choice.name, key)
    return where("model", key)


def _check_budget(p: Profile, task, where: _Where) -> list[str]:
    """The epochs budget against the built task: it must train at least one step, and the
    warm-up must fit in it (steps mode is checked by TrainSection). Mirrors the worker's
    plan (Worker._plan): fresh-batch tasks have epochs only with num_train_examples > 0."""
    t = p.train
    if t.epochs is None:
        return []
    n = int(getattr(task, "num_train_examples", 0) or 0)
    if not n:
        if task.fixed_train:
            return []  # a data set read whole (images with num_train_examples = 0): size unknown here
        return [f"  train.epochs{where('train', 'epochs')}: task {p.task.name!r} has no training set "
                f"(num_train_examples = 0 draws fresh batches), so an epoch is no step at all; "
                f"give train.steps, or task.num_train_examples > 0"]
    total = t.epochs * math.ceil(n / t.batch_size)  # an upper bound where the data set is smaller
    if t.warmup_steps > total:
        return [f"  train.warmup_steps{where('train', 'warmup_steps')}: warmup_steps = {t.warmup_steps} "
                f"is longer than the whole run ({t.epochs} epoch(s) x {math.ceil(n / t.batch_size)} "
                f"step(s) = {total}): the learning rate would never reach lr"]
    return []


def _check_registries(p: Profile, path: str, where: _Where) -> None:
    """Model and task names and their options must exist in the registries, and their
    values build (a model on the meta device, the task for every length)."""
    import models
    import tasks
    from workbench.compose import check_compose_options, split_options

    problems: list[str] = []
    try:
        tasks.task_class(p.task.name)
    except KeyError as e:
        problems.append(f"  task.name{where('task', 'name')}: {e}")
    else:
        params = p.task.params()
        if "seq_len" in params:
            problems.append(f"  task.seq_len{where('task', 'seq_len')}: give sequence lengths in sweep.seq_lens")
        try:
            tasks.check_params(p.task.name, params)
        except TypeError as e:
            bad = [k for k in params if k not in tasks.parameters(p.task.name)]
            problems.append(f"  task{where('task', bad[0]) if bad else ''}: {e}")
        else:
            # build the task once per length: bad values (a missing data file, a length
            # too short for the tokens to copy) are caught here, before any run starts
            built = None
            for j, L in enumerate(p.sweep.seq_lens or [None]):
                try:
                    built = tasks.build(p.task.name, **params, **({"seq_len": L} if L is not None else {}))
                except (ValueError, TypeError, OSError) as e:
                    key = _mentioned(str(e), params)
                    at = (where("task", key) if key else
                          where("sweep", "seq_lens", j) if L is not None else where("task"))
                    w = f" with seq_len={L}" if L is not None else ""
                    problems.append(f"  task {p.task.name!r}{w}{at}: {e}")
                    built = None
                    break
            if built is not None:
                problems += _check_budget(p, built, where)
    for i, choice in enumerate(p.sweep.model_choices()):
        try:
            models.entry(choice.name)
        except KeyError as e:
            problems.append(f"  sweep.models{where('sweep', 'models', i)}: {e}")
            continue
        options = _model_options(p, choice)
        backbone_opts, compose_opts = split_options(options)
        try:
            models.check_options(choice.name, backbone_opts)
            check_compose_options(compose_opts)
            _build_on_meta(choice.name, choice.d_model or p.model.d_model,
                           choice.n_layers or p.model.n_layers, backbone_opts)
        except models.OptionError as e:
            at = _option_where(p, i, choice, e.option, where)
            problems.append(f"  model options for {choice.display!r}{at}: {e.option} = {e.value!r}: "
                            f"expected {e.expected}")
        except (TypeError, ValueError) as e:
            key = _mentioned(str(e), [*options, "d_model", "n_layers"])
            problems.append(f"  model options for {choice.display!r}{_option_where(p, i, choice, key, where)}: {e}")
    swept = {c.name for c in p.sweep.model_choices()}
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
    labels = [c.display for c in p.sweep.model_choices()]
    for i, pub in enumerate(p.published):
        if pub.model not in labels:
            problems.append(f"  published[{i}].model{where('published', i, 'model')}: {pub.model!r} is not a "
                            f"model label of the sweep ({', '.join(labels)})")
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        problems.append(f"  sweep.models{where('sweep', 'models')}: duplicate model label(s) {', '.join(dupes)}; "
                        f"give each a distinct 'label'")
    if problems:
        raise ProfileError(f"{path}: invalid profile\n" + "\n".join(problems))


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
