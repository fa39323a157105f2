"""Profile schema: the pydantic models of a profile's sections, strictly validated.

What a profile holds and the rules it is checked by are in :mod:`workbench.spec.profile`'s
docstring (the profile API). Here: unknown keys forbidden, every float finite, ints not
booleans and below 2^63, booleans strict, upper bounds only where a value is certainly a
mistake (each with its reason beside the field).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from annotated_types import Le
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, ValidationInfo,
                      field_validator, model_validator)

from workbench.spec.recipes import RECIPE_NAMES, SIZE_NAMES
from workbench.spec.slurm_settings import SlurmSettings

SizeName = Literal[SIZE_NAMES]      # workbench.spec.recipes.SIZES
RecipeName = Literal[RECIPE_NAMES]  # workbench.spec.recipes.RECIPES

SCHEMA_VERSION = 2  # the version this tool writes; it reads SCHEMA_VERSIONS
SCHEMA_VERSIONS = (1, 2)  # 2 adds [sweep.grid], [[tasks]] and task variants


class ProfileError(Exception):
    """A profile that cannot be used; the message names the file, key and line."""


# Integers are stored in SQLite INTEGER columns (seeds, steps, sizes): beyond 2^63 - 1 a
# value cannot be queued at all, so it is refused here, not as a traceback at submit time.
INT64_MAX = 2**63 - 1


# The validation context of data read from a profile file (or a --set): TOML has typed
# values, so a quoted number there ("12") is a mistake, refused like a word. Without it
# (the TUI form, whose inputs are text) numeric text goes on to pydantic's lax parsing.
FROM_FILE = {"from_file": True}


def _from_file(info: ValidationInfo | None) -> bool:
    return bool(info is not None and isinstance(info.context, dict) and info.context.get("from_file"))


def _int_input(v: Any, info: ValidationInfo) -> Any:
    # pydantic's lax int reads true as 1: a boolean in a number field is a mistake (a
    # shifted line, a key mixed up), never a count. Integral floats (TOML reads 1e5 as a
    # float) go on to pydantic, which refuses fractions; so does numeric text from the TUI
    # form's inputs ("1.5" and "five" refused there).
    if isinstance(v, bool):
        raise ValueError(f"expected an integer, got {str(v).lower()}")
    if isinstance(v, str) and _from_file(info):
        raise ValueError(f"expected an integer, got the string {_short(v)}: write numbers without quotes")
    return v


def _float_input(v: Any, info: ValidationInfo) -> Any:
    if isinstance(v, bool):
        raise ValueError(f"expected a number, got {str(v).lower()}")
    if isinstance(v, str) and _from_file(info):
        raise ValueError(f"expected a number, got the string {_short(v)}: write numbers without quotes")
    return v


def _short(v: str, n: int = 40) -> str:
    return repr(v) if len(v) <= n else repr(v[:n]) + f"... ({len(v)} characters)"


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
    size: SizeName | None = None      # this model's size preset (wins over [model] size)
    recipe: RecipeName | None = None  # this model's recipe (wins over the profile's)

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


# A task.tokenizer grid value may be a table that sets the tokenizer and its vocabulary size
# together, one grid axis: "task.tokenizer" = ["bytes", {name = "bpe", vocab_size = 2048}]
# (a `task.vocab_size` axis beside it would pair every size with every tokenizer, and
# bytes has none). grid_values() turns such a point into plain task parameters.
TOKENIZER_GRID_KEY = "task.tokenizer"
TOKENIZER_TABLE_KEYS = ("name", "vocab_size")
# the lm task's tokenizers whose vocabulary is their own (tasks/lm/tokenizer.py): bytes has
# 256 bytes + end of text, char one id per character of the corpus
FIXED_VOCAB = {"bytes": "257 ids: 256 bytes and end of text", "char": "one id per character of the corpus"}


def _check_tokenizer_tables(grid: dict[str, list]) -> None:
    """The table values of a ``task.tokenizer`` axis: only ``name`` (a tokenizer, required)
    and ``vocab_size`` (an integer, not for a tokenizer with its own vocabulary), and no
    ``task.vocab_size`` axis beside them. Each problem a _FieldError at the value's key."""
    for j, v in enumerate(grid.get(TOKENIZER_GRID_KEY, [])):
        if not isinstance(v, dict):
            continue
        at = (TOKENIZER_GRID_KEY, j)
        unknown = [k for k in v if k not in TOKENIZER_TABLE_KEYS]
        if unknown:
            raise _FieldError((*at, unknown[0]), f"unknown key {unknown[0]!r} in a task.tokenizer table "
                              f"(it takes name and vocab_size)")
        name = v.get("name")
        if not isinstance(name, str) or not name:
            raise _FieldError(at, "a task.tokenizer table needs name = \"bpe\" (or another tokenizer) "
                              "beside its vocab_size")
        if "vocab_size" not in v:
            continue
        size = v["vocab_size"]
        if isinstance(size, bool) or not isinstance(size, int):
            raise _FieldError((*at, "vocab_size"), f"vocab_size must be an integer, got {size!r}")
        if name in FIXED_VOCAB:
            raise _FieldError((*at, "vocab_size"), f"tokenizer {name!r} has its own vocabulary "
                              f"({FIXED_VOCAB[name]}): vocab_size goes with \"bpe\" (or a pretrained "
                              f"tokenizer's embedding rows)")
        if "task.vocab_size" in grid:
            raise _FieldError(at, "task.tokenizer tables set vocab_size and sweep.grid also has "
                              "'task.vocab_size': vary it in one place")


def grid_values(point: dict[str, Any]) -> dict[str, Any]:
    """A grid point with each ``task.tokenizer`` table turned into plain settings:
    ``{"task.tokenizer": {"name": "bpe", "vocab_size": 2048}}`` -> ``{"task.tokenizer":
    "bpe", "task.vocab_size": 2048}``, so a run's task parameters, fields and grid hold
    both (results tables and the no-pooling rule tell them apart). Points without tables
    come back as they are (same keys, same order: their runs' identity is unchanged)."""
    v = point.get(TOKENIZER_GRID_KEY)
    if not isinstance(v, dict):
        return point
    out: dict[str, Any] = {}
    for k, x in point.items():
        if k == TOKENIZER_GRID_KEY:
            out[k] = x.get("name")
            if "vocab_size" in x:
                out["task.vocab_size"] = x["vocab_size"]
        else:
            out[k] = x
    return out


class MatchSection(_Strict):
    """[sweep.match]: every model of the sweep solved to one size (workbench.spec.match):
    non-embedding parameters or floats of recurrent state, within 2%."""
    params: Int | None = Field(default=None, gt=0)
    state_size: Int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one(self) -> "MatchSection":
        if (self.params is None) == (self.state_size is None):
            raise ValueError("[sweep.match] takes one of params or state_size")
        return self

    def target(self) -> tuple[str, int]:
        return ("params", self.params) if self.params is not None else ("state_size", self.state_size)


class SweepSection(_Strict):
    models: list[Union[str, ModelChoice]] = Field(min_length=1)
    seq_lens: list[Annotated[Int, Field(gt=0)]] = Field(default_factory=list)
    # seeds go into torch / numpy generators and the store's INTEGER column: [0, 2^63)
    seeds: list[Annotated[Int, Field(ge=0)]] = Field(default_factory=lambda: [0], min_length=1)
    # schema 2: dotted key -> values, Cartesian with models x lengths x seeds; each value is
    # checked like the same key written in its table (_check_grid)
    grid: Annotated[dict[str, Annotated[list[Any], Field(min_length=1)]],
                    BeforeValidator(_flatten_grid)] = Field(default_factory=dict)
    match: MatchSection | None = None  # models matched by size (workbench.spec.match)

    @field_validator("grid")
    @classmethod
    def _distinct_grid(cls, v: dict[str, list]) -> dict[str, list]:
        for key, values in v.items():
            _distinct_values(f"value(s) of {key}", values)
        _check_tokenizer_tables(v)
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
    # a size preset (workbench.spec.recipes): d_model, n_layers (2x for one-mixer models) and
    # the lr, each unless written; a grid axis as "model.size"
    size: SizeName | None = None
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


BUDGET_KEYS = ("epochs", "steps", "tokens", "bytes", "flops", "tokens_per_param")
# budgets turned into steps when a profile expands (workbench.spec.budget); a RunSpec keeps
# the one asked and records the steps in its ``budget``. ``bytes`` (of UTF-8 text, the lm
# task's) becomes steps when the worker has the data: only then is the tokenizer's bytes
# per token on the training split known (budget.resolve_bytes)
STEP_BUDGETS = ("tokens", "bytes", "flops", "tokens_per_param")


class TrainSection(_Strict):
    epochs: Int | None = Field(default=None, gt=0)
    steps: Int | None = Field(default=None, gt=0)
    tokens: Int | None = Field(default=None, gt=0)      # batch_size x seq_len tokens a step
    # bytes of UTF-8 text (the lm task): tokens = bytes / the tokenizer's bytes per token on
    # the training split, so runs of different tokenizers see the same text
    bytes: Int | None = Field(default=None, gt=0)
    flops: Float | None = Field(default=None, gt=0)     # training FLOPs (models.flops' count)
    # x the backbone's non-embedding parameters (Chinchilla's rule: about 20)
    tokens_per_param: Float | None = Field(default=None, gt=0)
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
    # Data parallelism (workbench/train/distributed.py): the run trains as this many ranks,
    # one device each (a GPU, or a CPU slot), batch_size being the global batch split
    # between them; results equal one process's to float round-off. None: one process.
    devices: Int | None = Field(default=None, gt=0)
    # How the ranks hold the model (workbench/train/sharded.py): "ddp" (None: the default),
    # each rank the whole model, gradients and optimizer state; "fsdp", each rank 1/N of
    # them, sharded per block of the backbone. The same computation to float round-off.
    sharding: Literal["ddp", "fsdp"] | None = None
    # Checkpoints for resuming (docs/ARCHITECTURE.md, "Checkpoints and resume"): every N
    # optimizer steps (0 = off) and every M minutes of training (0 = off); always on
    # SIGTERM / SIGUSR1. Ten minutes bounds what a crash loses on long runs and never fires
    # on short ones; neither setting changes what a run computes.
    checkpoint_every: Int = Field(default=0, ge=0)
    checkpoint_minutes: Float = Field(default=10.0, ge=0)
    # Also write the run's curves and results as TensorBoard event files while it trains
    # (<store>/tensorboard/<profile>/<run>/, workbench/results/tensorboard.py; the
    # `tensorboard` extra). Like the checkpoint keys it changes what is written, never what
    # is computed (a neutral key of spec_key).
    tensorboard: Bool = False

    @field_validator("betas")
    @classmethod
    def _betas(cls, v):
        if not all(0 <= b < 1 for b in v):
            raise ValueError("betas must lie in [0, 1)")
        return v

    @model_validator(mode="after")
    def _one_budget(self):
        given = [k for k in BUDGET_KEYS if getattr(self, k) is not None]
        if len(given) != 1:
            got = f"got {', '.join('train.' + k for k in given)}" if given else "got none"
            raise ValueError("give exactly one of train.epochs or train.steps, or a budget in "
                             f"train.tokens, train.bytes, train.flops or train.tokens_per_param ({got})")
        # (in epochs mode the total is known only with the task: _check_budget)
        if self.steps is not None and self.warmup_steps > self.steps:
            raise _FieldError("warmup_steps", f"warmup_steps = {self.warmup_steps} is longer than the "
                              f"whole run (steps = {self.steps}): the learning rate would never reach lr")
        if self.devices and self.batch_size % self.devices:
            raise _FieldError("devices", f"batch_size = {self.batch_size} is not divisible by devices = "
                              f"{self.devices}: the global batch is split evenly between the ranks")
        if self.sharding == "fsdp" and (self.devices or 1) < 2:
            raise _FieldError("sharding", "sharding = \"fsdp\" splits the model between ranks: set "
                              "train.devices to 2 or more")
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


class Need(_Strict):
    """A file or folder a profile reads that the repository does not ship (a data set, a
    checkpoint), with the command that fetches it. ``profile check`` reports a profile
    whose needed paths are absent as "needs data", not invalid, and prints ``fetch``;
    ``run`` refuses it with the same commands. A need counts only while a task parameter
    or model option of the profile names its path (or a path inside it, or a folder that
    holds it): pointing the profile elsewhere (``--set task.data_path=...``) drops it.
    A path written ``hf:owner/name`` is a Hugging Face Hub id (models/hub.py): present when
    its snapshot is in the Hugging Face cache, or while not offline (the run fetches it); a
    Hub id the profile reads without such an entry is treated the same way (spec/check.py)."""

    path: str = Field(min_length=1)   # relative to where ssm-workbench runs, as the profile's own paths
    fetch: str = Field(min_length=1)  # a shell command, run from that directory, that creates path
    what: str = ""                    # what it is, in a few words


# A profile's name becomes file and folder names (<store>/figures/<name>/<name>-curves-...
# .png, export's tables): 255 bytes is the usual limit of a file name, and the longest
# suffix the workbench adds is about 60 characters, so 100 leaves room.
MAX_NAME = 100


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
    needs: list[Need] = Field(default_factory=list)  # data and checkpoints not in the repository
    # a named preset of train keys and model options (workbench.spec.recipes); keys the
    # profile writes win; a sweep entry's own recipe wins over this one
    recipe: RecipeName | None = None

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

    @model_validator(mode="after")
    def _devices_on_slurm(self):
        """Slurm's nodes and GPUs add up to train.devices (one rank per device)."""
        n, sl = self.train.devices or 1, self.slurm
        if self.executor != "slurm":
            return self
        if sl.nodes > 1 and n == 1:
            raise _FieldError(("slurm", "nodes"), f"nodes = {sl.nodes} needs a run on several devices: "
                              f"set train.devices (ranks in all)")
        if n % sl.nodes:
            raise _FieldError(("slurm", "nodes"), f"train.devices = {n} cannot be split evenly over "
                              f"nodes = {sl.nodes}")
        if n > 1 and sl.gpus_per_node and sl.nodes * sl.gpus_per_node != n:
            raise _FieldError(("slurm", "gpus_per_node"), f"nodes * gpus_per_node = {sl.nodes} * "
                              f"{sl.gpus_per_node} = {sl.nodes * sl.gpus_per_node}, but train.devices = "
                              f"{n}: one rank per GPU")
        return self

    def task_entries(self) -> list[tuple[tuple, TaskSection]]:
        """Each task with its path in the file: ``(("task",), t)`` or ``(("tasks", i), t)``."""
        if self.task is not None:
            return [(("task",), self.task)]
        return [(("tasks", i), t) for i, t in enumerate(self.tasks)]

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if len(v) > MAX_NAME:
            raise ValueError(f"a profile name is at most {MAX_NAME} characters (it names the "
                             f"figure and table files); got {len(v)} characters")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", v):
            raise ValueError(f"profile names start with a letter or digit and use letters, digits, "
                             f"'.', '_' and '-' (they name files and folders); got {_short(v)}")
        return v


