"""Evaluation profiles: lm-evaluation-harness tasks on several models, as a profile file.

A training profile describes a sweep to train; an evaluation profile (a top-level ``[eval]``
table instead of ``[task]``/``[sweep]``/``[train]``) describes evaluations to run::

    schema_version = 2
    name = "zero-shot-table3"
    [eval]
    models = [
      { label = "Mamba-130M", model = "state-spaces/mamba-130m-hf" },  # a hub id
      { label = "mine", model = "run:12" },                            # a finished lm run
      { label = "local", model = "checkpoints/pythia-160m" },          # a folder
    ]
    tasks = ["lambada_openai", "hellaswag"]   # lm-eval task names
    include = ["my_tasks"]                    # optional folders of lm-eval task YAML files
    batch_size = 8                            # and: limit, num_fewshot, dtype, device, ...
    # allow_unfinished = true                 # score an unfinished run:N's last checkpoint
    # output_path = "lm-eval-out"             # lm-eval's results JSON per task there; log_samples = true: per-document JSONL too
    [[published]]
    model = "Mamba-130M"
    eval_set = "lambada_openai"               # an lm-eval task of [eval] tasks
    metric = "perplexity"                     # acc, acc_norm or perplexity
    value = 16.07

It expands to one evaluation run per model (:func:`eval_specs`, the spec
``workbench.spec.eval_spec.eval_spec`` writes, which ``ssm-workbench eval`` queues too), so
``ssm-workbench run FILE`` and ``eval --from FILE`` ask the store for the same runs, and a
finished one is not evaluated again. Validation is as strict as a training profile's:
unknown keys are errors naming the key, its line and the file. Hub ids among the models are
reported by ``profile check`` like other profiles' (``needs data`` offline when they are not
in the Hugging Face cache, with the ``hf download`` command).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from workbench.spec.schema import (MAX_NAME, SCHEMA_VERSIONS, Bool, Float, Int, Need, ProfileError, PublishedValue,
                                   _FieldError, _short, _Strict)
from workbench.spec.slurm_settings import SlurmSettings

# the metrics Table 3-style comparisons report (lm-eval's names); others are stored too,
# but a published number is one of these
PUBLISHED_METRICS = ("acc", "acc_norm", "perplexity")


def slurm_refusal(sl: SlurmSettings, device: str) -> tuple[str, str] | None:
    """Why a Slurm job cannot run an evaluation with these ``[slurm]`` settings, as (key,
    one line), or None. An evaluation is one process on one device (lm-eval's requests go
    through one model, no ranks): one node, at most one GPU, and a GPU when the device is
    ``cuda``. (``eval --executor slurm`` asks the same of its ``--slurm`` settings.)"""
    if sl.nodes != 1:
        return "nodes", f"nodes = {sl.nodes}: an evaluation runs on one device; give nodes = 1"
    if sl.gpus_per_node is not None:
        return "gpus_per_node", "an evaluation runs on one device: give gpus_per_run (0 or 1), not gpus_per_node"
    if sl.gpus_per_run > 1:
        return "gpus_per_run", (f"gpus_per_run = {sl.gpus_per_run}: an evaluation uses one GPU; give 1 "
                                f"(or 0 for a CPU job)")
    if device == "cuda" and sl.gpus_per_run == 0:
        return "gpus_per_run", 'gpus_per_run = 0 with device "cuda": the job would have no GPU; give 1'
    return None


def is_eval_data(data: dict) -> bool:
    """Whether parsed profile TOML is an evaluation profile (it has an ``[eval]`` table)."""
    return isinstance(data, dict) and "eval" in data


class EvalModel(_Strict):
    """One model to evaluate: a hub id (owner/name), a local folder, or ``run:N``."""
    label: str = Field(min_length=1)
    model: str = Field(min_length=1)


class EvalSection(_Strict):
    """The ``[eval]`` table: workbench.spec.eval_spec.DEFAULTS' settings, checked here."""
    models: list[EvalModel] = Field(min_length=1)
    tasks: list[str] = Field(min_length=1)
    include: list[str] = Field(default_factory=list)
    batch_size: Int = Field(default=8, gt=0)
    # documents per task (a fraction if < 1): for a quick look, not for reported numbers
    limit: Float | None = Field(default=None, gt=0)
    num_fewshot: Int | None = Field(default=None, ge=0)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    max_length: Int | None = Field(default=None, gt=0)
    bootstrap_iters: Int = Field(default=100000, ge=0)
    seed: Int = Field(default=0, ge=0)
    # ranks, each holding the model, that split each task's documents (one rank's numbers)
    devices: Int = Field(default=1, ge=1)
    # a run:N that has not finished is refused unless this is true; then its last checkpoint
    # is scored, recorded with its step (run:1@step660), never as the run's result
    allow_unfinished: Bool = False
    # lm-eval's own files (results JSON per task; with log_samples, per-document JSONL) in
    # this folder, as lm_eval --output_path DIR --log_samples writes them (no number changes)
    output_path: str | None = Field(default=None, min_length=1)
    log_samples: Bool = False

    @model_validator(mode="after")
    def _samples_need_a_folder(self):
        if self.log_samples and not self.output_path:
            raise _FieldError(("log_samples",), "log_samples writes lm-eval's per-document files into "
                              "output_path: give output_path too")
        return self

    @field_validator("tasks", "include")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if any(not s.strip() for s in v):
            raise ValueError("an empty name")
        dupes = sorted({x for x in v if v.count(x) > 1})
        if dupes:
            raise ValueError(f"duplicate entries {', '.join(dupes)}")
        return v

    @field_validator("models")
    @classmethod
    def _labels(cls, v: list[EvalModel]) -> list[EvalModel]:
        labels = [m.label for m in v]
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            raise ValueError(f"duplicate model label(s) {', '.join(dupes)}: give each model a distinct label")
        return v


class EvalPublished(PublishedValue):
    """A published number for an evaluation: ``eval_set`` is an lm-eval task of ``[eval]
    tasks`` and ``metric`` is one of :data:`PUBLISHED_METRICS` (acc as lm-eval reports it, a
    fraction: a paper's 44.3 % is 0.443)."""
    metric: Literal[PUBLISHED_METRICS]  # type: ignore[valid-type]
    eval_set: str = Field(min_length=1)


class EvalProfile(_Strict):
    schema_version: Int
    name: str = Field(min_length=1, max_length=MAX_NAME)
    description: str = ""
    eval: EvalSection
    published: list[EvalPublished] = Field(default_factory=list)
    needs: list[Need] = Field(default_factory=list)
    # where the evaluations execute, as for a training profile: this machine's scheduler, or
    # one Slurm job per model ([slurm]: one task on one device, see _one_device)
    executor: Literal["local", "slurm"] = "local"
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)
    _where: object = PrivateAttr(default=None)  # the file's key lines, for check_tasks' messages

    @field_validator("schema_version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v not in SCHEMA_VERSIONS:
            raise ValueError(f"unsupported schema_version {v}; this tool reads "
                             f"{' and '.join(map(str, SCHEMA_VERSIONS))}")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        import re

        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", v):
            raise ValueError(f"profile names start with a letter or digit and use letters, digits, "
                             f"'.', '_' and '-' (they name files and folders); got {_short(v)}")
        return v

    @model_validator(mode="after")
    def _published_points(self):
        labels = [m.label for m in self.eval.models]
        for i, pub in enumerate(self.published):
            if pub.model not in labels:
                raise _FieldError(("published", i, "model"), f"{pub.model!r} is not a model label of [eval] "
                                  f"models ({', '.join(labels)})")
            if pub.eval_set not in self.eval.tasks:
                raise _FieldError(("published", i, "eval_set"), f"{pub.eval_set!r} is not one of [eval] "
                                  f"tasks ({', '.join(self.eval.tasks)})")
            if pub.epoch is not None or pub.step is not None or pub.seq_len is not None:
                raise _FieldError(("published", i), "an evaluation has no epoch, step or seq_len: give "
                                  "model, eval_set, metric and value")
        return self

    @model_validator(mode="after")
    def _one_device(self):
        if self.executor == "slurm":
            bad = slurm_refusal(self.slurm, self.eval.device)
            if bad:
                raise _FieldError(("slurm", bad[0]), bad[1])
            if self.eval.devices > 1:
                raise _FieldError(("eval", "devices"), "devices > 1 runs on this machine's scheduler; a "
                                  "Slurm evaluation is one process (its ranks are not split across a job yet)")
        return self

    @property
    def kind(self) -> str:
        return "eval"


def summary(p: EvalProfile) -> str:
    n, t = len(p.eval.models), len(p.eval.tasks)
    return (f"evaluation: {n} model(s) x {t} lm-eval task(s) = {n} run(s)"
            f"{f', limit {p.eval.limit:g}' if p.eval.limit is not None else ''}")


def _resolve(value: str) -> str:
    """A folder as an absolute path (the worker runs elsewhere), anything else as written."""
    expanded = os.path.expanduser(value)
    return os.path.abspath(expanded) if os.path.isdir(expanded) else value


def eval_specs(p: EvalProfile) -> list[dict]:
    """One evaluation run spec per model (``eval_spec.eval_spec``, profile = the profile's
    name, label = the model's label): what ``run`` queues and ``run --dry-run`` lists."""
    from workbench.spec.eval_spec import eval_spec

    e = p.eval
    include = [os.path.abspath(os.path.expanduser(d)) for d in e.include]
    outputs = {"output_path": os.path.abspath(os.path.expanduser(e.output_path)),
               "log_samples": e.log_samples} if e.output_path else {}
    return [eval_spec(_resolve(m.model), list(e.tasks), profile=p.name, label=m.label, include=include,
                      limit=e.limit, num_fewshot=e.num_fewshot, batch_size=e.batch_size, device=e.device,
                      dtype=e.dtype, max_length=e.max_length, bootstrap_iters=e.bootstrap_iters, seed=e.seed,
                      devices=e.devices, allow_unfinished=e.allow_unfinished, **outputs)
            for m in e.models]


def absent_needs(p: EvalProfile) -> list[Need]:
    """[[needs]] whose path a model or include folder reads and that is absent here, and
    hub ids among the models that cannot be had (offline, not in the cache), each with the
    command that fetches it (as spec/check.py's absent_needs for training profiles)."""
    from models import hub
    from workbench.spec.needs import _hub_id, _hub_missing, _norm, _refers

    values = [m.model for m in p.eval.models] + list(p.eval.include)
    out = [n for n in p.needs
           if (_hub_missing(n.path) if n.path.startswith("hf:") else not os.path.exists(_norm(n.path)))
           and any(_refers(v, n.path) or _refers("hf:" + v, n.path) for v in values)]
    for v in dict.fromkeys(m.model for m in p.eval.models):
        if _hub_id(v) and not any(_refers(v, n.path) or _refers("hf:" + v, n.path) for n in p.needs) \
                and _hub_missing(v):
            out.append(Need(path=v, fetch=hub.download_command(hub.parse(v), "model"),
                            what=f"a Hugging Face Hub model, not in the cache {hub.cache_dir()} (offline mode)"))
    return out


def output_folder_problem(text: str) -> str:
    """Why ``text`` cannot be lm-eval's output folder ("" when it can: a folder, or a path
    that can be made one): a file, a path under a file, a place this user cannot write.
    One check for the profile (:func:`check`), ``eval --output-path`` and the eval form."""
    if not text:
        return ""
    path = Path(text).expanduser().absolute()
    if path.exists() and not path.is_dir():
        return f"{text} is a file, not a folder"
    have = next(p for p in (path, *path.parents) if p.exists())
    if not have.is_dir():
        return f"{have} is a file: no folder can be made under it"
    if not os.access(have, os.W_OK | os.X_OK):
        return f"{have} is not writable"
    return ""


def check(p: EvalProfile, path: str, where) -> None:
    """What the schema cannot see: each model names something loadable (``run:N``, a
    folder, a hub id; a path named by [[needs]] may be absent) and each include folder
    exists, and output_path can be a folder. A folder is checked as a checkpoint (models/checkpoint_check.py: config.json,
    weights present and whole, a tokenizer whose ids fit the embedding), each problem one
    line naming the file. (lm-eval itself, an optional extra, is asked for by ``run``, not
    here: the file is valid without it; a ``run:N`` needs the store, which
    workbench/execute/eval_queue.py's ``preflight`` reads before anything is queued.)
    Raises ProfileError listing the problems, else DataAbsent when needed data is absent,
    else returns."""
    from models.checkpoint_check import folder_problems
    from workbench.spec.check import _problems_text
    from workbench.spec.needs import DataAbsent, _hub_id, _refers

    problems: list[str] = []
    needed = [n.path for n in p.needs]
    for i, m in enumerate(p.eval.models):
        ref = m.model
        if ref.startswith("run:"):
            if not ref[4:].isdigit():
                problems.append(f"  eval.models[{i}].model{where('eval', 'models', i, 'model')}: {ref!r}: "
                                f"a run is written run:N (N its id)")
        elif os.path.isdir(os.path.expanduser(ref)):
            problems += [f"  eval.models[{i}].model{where('eval', 'models', i, 'model')}: {line}"
                         for line in folder_problems(ref)]
        elif not (_hub_id(ref) or any(_refers(ref, n) for n in needed)):
            problems.append(f"  eval.models[{i}].model{where('eval', 'models', i, 'model')}: {ref!r} is no "
                            f"folder here, no Hugging Face hub id (owner/name) and no run:N")
    for i, d in enumerate(p.eval.include):
        if not os.path.isdir(os.path.expanduser(d)) and not any(_refers(d, n) for n in needed):
            problems.append(f"  eval.include[{i}]{where('eval', 'include')}: no such folder {d!r}")
    why = output_folder_problem(p.eval.output_path or "")
    if why:
        problems.append(f"  eval.output_path{where('eval', 'output_path')}: {why}")
    if problems:
        raise ProfileError(_problems_text(path, problems))
    absent = absent_needs(p)
    if absent:
        raise DataAbsent(path, p, absent)


def check_tasks(p: EvalProfile, path: str, announce=None) -> str | None:
    """Every ``[eval] tasks`` name is an lm-eval task, group or tag, or a task of the include
    folders (workbench/spec/lm_eval_tasks.py): a ProfileError naming each unknown one, its
    key and line and its closest known names. Apart from :func:`check` (which ``load`` runs):
    it needs lm-eval, and indexing lm-eval's tasks the first time takes seconds, so only the
    commands that check or launch an evaluation ask for it. Returns a one-line note when the
    names could not be checked (lm-eval not installed; an include folder absent, which
    :func:`check` reports as needed data), else None. ``announce(line)`` is told before
    lm-eval's tasks are indexed (the first time)."""
    from workbench.spec import lm_eval_tasks
    from workbench.spec.check import _problems_text

    why = lm_eval_tasks.skipped()
    if why:
        return why
    include = [os.path.expanduser(d) for d in p.eval.include]
    absent = [d for d in include if not os.path.isdir(d)]
    if absent:
        return f"lm-eval task names not checked: task folder(s) {', '.join(absent)} absent"
    unknown = lm_eval_tasks.unknown_tasks(list(p.eval.tasks), include, announce)
    if not unknown:
        return None
    where = p._where if callable(p._where) else (lambda *loc: "")
    problems = []
    for i, t in enumerate(p.eval.tasks):
        if t in unknown:
            near = unknown[t]
            problems.append(f"  eval.tasks[{i}]{where('eval', 'tasks')}: {lm_eval_tasks.describe({t: near}, include)}")
    raise ProfileError(_problems_text(path, problems))


def validate(data: dict, path: str, where, check_registries: bool = True) -> EvalProfile:
    """``data`` (parsed TOML, --set applied) as an :class:`EvalProfile`, or ProfileError."""
    from pydantic import ValidationError

    from workbench.spec.schema import FROM_FILE
    from workbench.spec.where import _validation_message

    try:
        prof = EvalProfile.model_validate(data, context=FROM_FILE)
    except ValidationError as e:
        raise ProfileError(_validation_message(e, path, where)) from None
    prof._where = where
    if check_registries:
        check(prof, path, where)
    return prof


__all__ = ["PUBLISHED_METRICS", "EvalModel", "EvalProfile", "EvalPublished", "EvalSection", "absent_needs",
           "check", "check_tasks", "eval_specs", "is_eval_data", "summary", "validate"]
