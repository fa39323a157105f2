"""A profile's runs: task settings (baseline and one-at-a-time variants), grid points,
and :func:`expand` into one :class:`~workbench.spec.run_spec.RunSpec` per run.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Any

import tomli_w
from pydantic import ValidationError

from workbench.spec import recipes
from workbench.spec.budget import run_budget
from workbench.spec.run_spec import RunSpec
from workbench.spec.schema import (FROM_FILE, ModelChoice, ModelSection, Profile, ProfileError, TaskSection,
                                   TrainSection, _json_key, grid_values)

# --------------------------------------------------------------------------- grid and task settings
GRID_SECTIONS = ("train", "model", "task")


def _show(v: Any) -> str:
    """A value as TOML writes it (strings quoted, booleans lower case; a table inline)."""
    if isinstance(v, dict):  # a task.tokenizer table: {name = "bpe", vocab_size = 2048}
        return "{" + ", ".join(f"{k} = {_show(x)}" for k, x in v.items()) + "}"
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
        # only the keys written (exclude_unset): the sections at a point then know which keys
        # the profile wrote (model_fields_set), which a size or recipe must not change
        self.base = {s: getattr(p, s).model_dump(mode="json", exclude_unset=True) for s in ("train", "model")}
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
            # FROM_FILE: a grid value is a TOML literal (the file's, or the form's parsed
            # one), so a quoted number is refused here as in its own table
            self.cache[key] = (TrainSection if section == "train" else ModelSection).model_validate(
                data, context=FROM_FILE)
        return self.cache[key]


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
        # each point's own copy of its train section: a RunSpec holds it typed
        at_point = [(point, sections.get("train", point).model_copy(deep=True), sections.get("model", point))
                    for point in points]
    except (ValidationError, ValueError) as e:  # a profile built without loads()
        raise ProfileError(f"{p.name}: invalid sweep.grid: {e}") from None
    refused: dict[str, str] = {}  # [sweep.match]: every model the target cannot be met for
    for ts in task_settings(p):
        for choice in p.sweep.model_choices():
            for L in ts.seq_lens:
                for point, train, msec in at_point:
                    res = resolve_model(p, choice, msec, train)
                    opts, d_model, n_layers = res.options, res.d_model, res.n_layers
                    matched = None
                    if p.sweep.match is not None:
                        try:
                            d_model, opts, matched = _match(p, choice, msec, d_model, n_layers, opts)
                        except MatchRefused as e:  # the others are still solved, to name them all
                            for why in e.reasons:
                                refused.setdefault(why, choice.display)
                            continue
                    train_r = res.train_section if res.train_section is not None else train
                    train_r = task_early_stopping(train_r, ts.task.name)
                    flat = grid_values(point)  # a task.tokenizer table: tokenizer and vocab_size
                    params = {**ts.params, **{k[5:]: v for k, v in flat.items() if k.startswith("task.")}}
                    bparams = dict(params, **({"seq_len": L} if L is not None else {}))
                    try:
                        budget = run_budget(train_r, model=choice.name, d_model=d_model, n_layers=n_layers,
                                            options=opts, task=ts.task.name, task_params=bparams)
                    except ProfileError as e:
                        raise ProfileError(f"{p.name}: model {choice.display!r}, task {ts.task.name!r}"
                                           f"{f' at seq_len {L}' if L is not None else ''}: {e}") from None
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
                        if res.size is not None:
                            fields["size"] = res.size
                        if res.recipe is not None:
                            fields["recipe"] = res.recipe["name"]
                        if v2:
                            fields.update(flat)
                            fields["task_setting"] = ts.setting
                        specs.append(RunSpec(
                            profile=p.name, model=choice.name, label=choice.display, model_options=opts,
                            d_model=d_model, n_layers=n_layers, task=ts.task.name, task_params=task_params,
                            seq_len=L, seed=seed, train=train_r, index=len(specs), fields=fields,
                            grid=dict(flat) if v2 else None, task_setting=ts.setting if v2 else None,
                            budget=budget, size=res.size, recipe=res.recipe, match=matched,
                        ))
    if refused:
        raise MatchRefused(p.name, {why: label for why, label in refused.items()})
    return specs


class MatchRefused(ProfileError):
    """[sweep.match]: the target cannot be met for some of the sweep's models. ``reasons``:
    each distinct reason (one per model and configuration, in sweep order) -> the model's
    label; the message names them all, in one line."""

    def __init__(self, name: str, reasons: dict[str, str]):
        self.reasons = reasons
        models = list(dict.fromkeys(reasons.values()))
        head = "" if len(reasons) == 1 else f"{len(models)} model(s) cannot be matched ({', '.join(models)}): "
        super().__init__(f"{name}: sweep.match: {head}" + "; ".join(reasons))


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


_RESOLVED: dict[str, Any] = {}


def task_early_stopping(train: TrainSection, task: str) -> TrainSection:
    """``train`` with the task's early-stopping metric where the profile did not write one:
    eval loss for a language model (``lm``: its accuracy says little), else as it is (the
    schema's eval accuracy). Only where early stopping is on (``patience`` > 0): while it
    is off the metric changes nothing, and the spec (and its spec_key) stays as before."""
    es = train.early_stopping
    if task != "lm" or not es.patience or "metric" in es.model_fields_set or es.metric == "loss":
        return train
    return train.model_copy(update={"early_stopping": es.model_copy(update={"metric": "loss"})})


def resolve_model(p: Profile, choice: ModelChoice, msec: ModelSection, train: TrainSection) -> recipes.Resolved:
    """One model's width, depth, options and train section at a grid point (``msec`` and
    ``train``: the sections there) after its size and recipe (workbench.spec.recipes); keys
    the profile writes win. ``.train_section`` is None where neither applies (the section
    as written, so a profile without them expands to the same specs as before)."""
    written_train = {k: getattr(train, k) for k in train.model_fields_set}
    written = lambda k: getattr(choice, k) or (getattr(msec, k) if k in msec.model_fields_set else None)  # noqa: E731
    res = recipes.resolve(choice.name, recipe=choice.recipe or p.recipe, size=choice.size or msec.size,
                          written_train=written_train, d_model=written("d_model"), n_layers=written("n_layers"),
                          default_d_model=msec.d_model, default_n_layers=msec.n_layers,
                          options=_model_options(msec, choice))
    res.train_section = None
    if res.train is not None:
        key = _json_key({k: (v.model_dump() if hasattr(v, "model_dump") else v) for k, v in res.train.items()})
        if key not in _RESOLVED:
            try:
                _RESOLVED[key] = TrainSection.model_validate(res.train)
            except ValidationError as e:
                what = " and ".join(x for x in (res.recipe and f"recipe {res.recipe['name']!r}",
                                                res.size and f"size {res.size!r}") if x)
                raise ProfileError(f"{p.name}: model {choice.display!r} with {what}: {e}") from None
        res.train_section = _RESOLVED[key].model_copy(deep=True)
    return res


def _match(p: Profile, choice: ModelChoice, msec: ModelSection, d_model: int, n_layers: int,
           opts: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """[sweep.match]: the model's width and options with the knobs solved for the target
    (workbench.spec.match), and the record the RunSpec keeps; ProfileError with the reason
    where the target cannot be met."""
    from workbench.spec import match

    target, value = p.sweep.match.target()
    written = {"d_model"} if choice.d_model is not None or "d_model" in msec.model_fields_set else set()
    try:
        s = match.solve(choice.name, target, value, d_model=d_model, n_layers=n_layers, options=opts,
                        written=written)
    except match.MatchError as e:
        raise MatchRefused(p.name, {str(e): choice.display}) from None
    solved = dict(s.solved)
    d_model = solved.pop("d_model", d_model)
    return d_model, {**opts, **solved}, s.to_dict()


def _model_options(msec: ModelSection, choice: ModelChoice) -> dict[str, Any]:
    """One model's options: [model] shared < [model.options.NAME] < the sweep entry's own."""
    return {**msec.shared_options(), **msec.options.get(choice.name, {}), **choice.options()}


def _scalar(v: Any) -> bool:
    return isinstance(v, (int, float, str, bool))
