"""A validated profile's checks beyond the schema: grid values in their sections, the
training budget, and the registries (model and task names and options build, at every
task setting and grid point). Every problem names its key and line.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

from pydantic import ValidationError

from workbench.spec.expand import (GRID_SECTIONS, MatchRefused, TaskSetting, _combos, _Sections, _show,
                                   resolve_model, task_settings)
from workbench.spec.schema import (ModelChoice, ModelSection, Profile, ProfileError, TrainSection, _FieldError,
                                   _json_key, grid_values)
from workbench.spec.needs import (DataAbsent, _hub_cached, _hub_id, _hub_missing, _norm,  # noqa: F401
                                  _path_values, _refers, absent_needs)
from workbench.spec.where import _format_loc, _Where

# The checkpoint each pretrained model's folder option expects, for the hint a missing
# folder's message gives (`hf download <this> --local-dir <folder>`): the
# GPT-Neo folders must not be told to fetch the Mamba checkpoint.
_CHECKPOINT_EXAMPLES = {("pretrained_causal_lm", "path"): "EleutherAI/gpt-neo-125m",
                        ("pretrained_hybrid", "gptneo_path"): "EleutherAI/gpt-neo-125m",
                        ("pretrained_hybrid", "mamba_path"): "state-spaces/mamba-130m-hf",
                        ("pretrained_mamba", "path"): "state-spaces/mamba-130m-hf"}


def _folder_options(options: dict[str, Any]) -> list[str]:
    """A pretrained model's options that name a checkpoint folder."""
    return [k for k in options if k == "path" or k.endswith("_path")]


def _check_folders(name: str, options: dict[str, Any], skip=frozenset()) -> None:
    """A pretrained model's checkpoint folders (config and weights present), without
    building it (that would read the weights); values in ``skip`` (absent [[needs]]) are
    not checked: the profile says how to fetch them."""
    from models.pretrained import check_folder

    for key in _folder_options(options):
        if options[key] not in skip:
            check_folder(options[key], _CHECKPOINT_EXAMPLES.get((name, key), "state-spaces/mamba-130m-hf"))


def _build_on_meta(name: str, d_model: int, n_layers: int, options: dict[str, Any]) -> None:
    """Build the backbone without memory (meta device), so bad option values (d_inner = 0,
    n_heads not dividing d_model) are reported before any run; ValueError / TypeError
    propagate, anything the meta device itself cannot do is ignored (the run will tell).
    (Pretrained models are checked by :func:`_check_folders` instead.)"""
    import models

    try:  # on the CPU where small (milliseconds), on meta where not: models.registry.build_shapes
        net = models.registry.build_shapes(name, d_model=d_model, n_layers=n_layers, **options)
        # the estimate's size check counts the same backbone: kept, not built again
        from workbench.spec.cost_probe import note_backbone
        note_backbone(name, d_model, n_layers, options, net)
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
                for sub in (v if isinstance(v, dict) else ()):  # a task.tokenizer table's vocab_size
                    extra[(*loc, sub)] = origin
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


def _build_on_meta_once(name: str, d_model: int, n_layers: int, options: dict[str, Any],
                        skip=frozenset()) -> None:
    """:func:`_build_on_meta`, once per distinct model configuration (grids repeat them).
    Pretrained models' folders are looked at every time: a folder fetched since (the TUI
    checks again in the same process) must be seen."""
    import models

    if models.entry(name).family == "pretrained":
        _check_folders(name, options, skip)
        return
    key = _json_key([name, d_model, n_layers, options])
    if key not in _META_BUILT:
        try:
            _build_on_meta(name, d_model, n_layers, options)
            _META_BUILT[key] = None
        except (TypeError, ValueError) as e:
            _META_BUILT[key] = e
    if _META_BUILT[key] is not None:
        raise _META_BUILT[key]


def _check_registries(p: Profile, path: str, where: _Where, data: bool = False) -> None:
    """Model and task names and their options must exist in the registries, and their
    values build (a model on the meta device, the task for every length), at every task
    setting and grid point (each distinct task or model configuration once). ``data``:
    whether each built task's data is checked too (:func:`preflight`: what a launch will
    read; a profile opened or saved to be edited is not wrong for data too small)."""
    import models
    import tasks
    from workbench.spec.compose_options import check_compose_options, split_options

    problems: list[str] = []
    sections = _Sections(p)
    absent = absent_needs(p)
    waiting = {v for v in _path_values(p) if any(_refers(v, n.path) for n in absent)}
    # a Hub id not in the cache is fetched by the run, not by the check (nor read here)
    waiting |= {v for v in _path_values(p) if _hub_id(v) and not _hub_cached(v)}
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
            params = {**ts.params, **{k.split(".", 1)[1]: v for k, v in grid_values(tc).items()}}
            try:
                tasks.check_params(name, params)
            except TypeError as e:
                bad = [k for k in params if k not in tasks.parameters(name)]
                problems.append(f"  {label}{w(*ts.loc, bad[0]) if bad else ''}: {e}")
                break
            if any(isinstance(v, str) and v in waiting for v in params.values()):
                # it reads data the profile says is not fetched yet (raised below); values
                # that read nothing are still checked where building needs no data
                problems += _check_without_data(name, params, waiting, ts, w)
                continue
            # build the task once per length: bad values (a missing data file, a length
            # too short for the tokens to copy) are caught here, before any run starts
            built = None
            for L, len_loc in zip(ts.seq_lens, ts.len_locs):
                kwargs = {**params, **({"seq_len": L} if L is not None else {})}
                ck = _json_key([name, kwargs])
                if ck not in built_tasks:
                    try:
                        built_task = tasks.build(name, **kwargs)
                        if data:
                            preflight(built_task)
                        built_tasks[ck] = (built_task, None)
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
            own = opt in c.options() or (opt in ("d_model", "n_layers", "size") and getattr(c, opt) is not None)
            if (target is None or c.name == target) and own:
                problems.append(f"  sweep.grid '{key}'{_grid_at(where, key)}: model {c.display!r} sets its own "
                                f"{opt}{where('sweep', 'models', i, opt)}, which wins over the grid")
    labels = [c.display for c in choices]
    counts = Counter(labels)  # (a count per label: list.count per entry was quadratic)
    dupes = sorted(x for x, n in counts.items() if n > 1)
    checked: set[str] = set()
    for i, choice in enumerate(choices if not dupes else ()):  # duplicates: refused before any build
        try:
            models.entry(choice.name)
        except KeyError as e:
            problems.append(f"  sweep.models{where('sweep', 'models', i)}: {e}")
            continue
        key = choice.model_dump_json(exclude={"label"})
        if key in checked:  # the same entry again (another label): checked once
            continue
        checked.add(key)
        for mc in _combos(p, "model"):
            msec = sections.get("model", mc)
            w = _point_where(p, where, mc)
            res = resolve_model(p, choice, msec, p.train)  # its size and recipe
            options = res.options
            backbone_opts, compose_opts = split_options(options)
            try:
                models.check_options(choice.name, backbone_opts)
                check_compose_options(compose_opts)
                _build_on_meta_once(choice.name, res.d_model, res.n_layers, backbone_opts, waiting)
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
    for i, pub in enumerate(p.published):
        if pub.model not in labels:
            problems.append(f"  published[{i}].model{where('published', i, 'model')}: {pub.model!r} is not a "
                            f"model label of the sweep ({', '.join(labels)})")
    if dupes:
        problems.append(f"  sweep.models{where('sweep', 'models')}: duplicate model label(s) {', '.join(dupes)}; "
                        f"give each a distinct 'label'")
    if not problems and not absent:
        problems += _check_budgets(p, where)
    problems += _check_tensorboard(p, where)
    if problems:
        raise ProfileError(_problems_text(path, problems))
    if absent:
        raise DataAbsent(path, p, absent)


def preflight(task) -> str:
    """The task's own check of its data before launch, where it has one (``preflight()``:
    the ``lm`` task counts what each split of its corpus would get, tasks/lm/preflight.py):
    ValueError in one line when the data cannot train it; else a line saying what the data
    gives ('' for nothing to say). A missing optional library is such a ValueError too."""
    check = getattr(task, "preflight", None)
    if check is None:
        return ""
    try:
        return check() or ""
    except ImportError as e:
        raise ValueError(str(e)) from None


def data_notes(p: Profile) -> list[str]:
    """What each distinct task setting's data gives (the ``lm`` task: tokens per split), one
    line each, for ``profile check`` to show under a valid profile. Builds the tasks again
    (cheap) and asks their :func:`preflight`, whose counts are memoised from the check."""
    import tasks

    notes: list[str] = []
    for ts in task_settings(p):
        for tc in _combos(p, "task"):
            params = {**ts.params, **{k.split(".", 1)[1]: v for k, v in grid_values(tc).items()}}
            for L in ts.seq_lens:
                try:
                    note = preflight(tasks.build(ts.task.name, **{**params, **({"seq_len": L} if L else {})}))
                except Exception:  # noqa: BLE001 - the check proper reports problems; notes are extra
                    continue
                if note and note not in notes:
                    notes.append(note)
    return notes


def _check_without_data(name: str, params: dict[str, Any], waiting: set[str], ts: TaskSetting,
                        w: _Where) -> list[str]:
    """A task whose data is not here yet (absent [[needs]], a Hub id not cached): build it
    anyway, and report a refusal that names a parameter other than the data's (a
    ``streaming = 0.5``, a ``vocab_size = 3.5``); a refusal about the absent data itself, or
    an error of reading it, is the data's (reported as absent, or read by the run)."""
    import tasks

    try:
        tasks.build(name, **params)
    except (ValueError, TypeError) as e:
        key = _mentioned(str(e), [k for k, v in params.items() if not (isinstance(v, str) and v in waiting)])
        if key is not None:
            setting = f" ({ts.setting})" if ts.setting != "baseline" else ""
            return [f"  task {name!r}{setting}{w(*ts.loc, key)}: {e}"]
    except Exception:  # noqa: BLE001 - reading data that is not here: the run's concern
        pass
    return []


def _check_tensorboard(p: Profile, where: _Where) -> list[str]:
    """train.tensorboard = true needs tensorboardX where the runs start (said before they do)."""
    import importlib.util

    asked = p.train.tensorboard or True in p.sweep.grid.get("train.tensorboard", [])
    if not asked or importlib.util.find_spec("tensorboardX") is not None:
        return []
    return [f"  train.tensorboard{where('train', 'tensorboard')}: TensorBoard event files need "
            f"tensorboardX: pip install 'ssm-workbench[tensorboard]'"]


def _check_budgets(p: Profile, where: _Where) -> list[str]:
    """Budgets in tokens, FLOPs or tokens per parameter become steps per run
    (workbench.spec.budget) when the profile expands: expand it here, so a budget that
    cannot be counted, or a warm-up longer than it, is a problem of the profile."""
    from workbench.spec.expand import expand
    from workbench.spec.schema import STEP_BUDGETS

    kinds = [k for k in STEP_BUDGETS if getattr(p.train, k) is not None or f"train.{k}" in p.sweep.grid]
    if not kinds and p.sweep.match is None:
        return []
    try:
        expand(p)
    except (ValueError, TypeError) as e:  # a task the budget builds (to count FLOPs) refused a value
        key = _mentioned(str(e), [k for _, t in p.task_entries() for k in t.params()])
        if key is not None:
            return [f"  task.{key}{where('task', key)}: {e}"]
        head = f"train.{kinds[0]}" if kinds else "sweep.match"
        return [f"  {head}{where(*head.split('.'))}: {e}"]
    except ProfileError as e:
        msg = str(e).removeprefix(p.name + ": ")
        if isinstance(e, MatchRefused):  # every model the target cannot be met for, each its reason
            return [f"  sweep.match{where('sweep', 'match')}: {why}" for why in e.reasons]
        if msg.startswith("sweep.match: "):  # [sweep.match]: a target a model cannot meet
            return [f"  sweep.match{where('sweep', 'match')}: {msg.removeprefix('sweep.match: ')}"]
        return [f"  train.{kinds[0]}{where('train', kinds[0])}: {msg}"]
    return []


# ---------------------------------------------------------------------------------------
# The same checks for a form: problems by key path, no profile text involved
# ---------------------------------------------------------------------------------------

LINE_REF = re.compile(r" \(line (\d+)\)")
_AT_LINE = re.compile(r", line \d+\)")  # the end of an origin: " (sweep.grid 'train.lr' = 0.1, line N)"


class _PathNumbers(dict):
    """Stands in for a profile text's ``{key path: line}`` in a :class:`_Where`: every key
    path counts as written, at its number in :attr:`paths` (from 1). The checks' messages
    then say " (line N)" where N gives back the key path they named."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[tuple] = []

    def __contains__(self, loc: object) -> bool:
        return True

    def __getitem__(self, loc: tuple) -> int:
        if not dict.__contains__(self, loc):
            self.paths.append(loc)
            dict.__setitem__(self, loc, len(self.paths))
        return dict.__getitem__(self, loc)


def registry_problems(prof: Profile, need_data: bool = True) -> list[tuple[tuple, str]]:
    """What the profile loader checks beyond the schema (grid values in their sections;
    model and task names, options and builds at every grid point) for a validated
    profile, as (key path, message) pairs; the key path is () where a problem names no key
    (a grid point's, a variant's). The checks place each key they name through a
    :class:`_Where`; given :class:`_PathNumbers` instead of a text's lines, the path comes
    back as the check named it, with no TOML written and read again.

    ``need_data``: whether absent [[needs]] paths, and data the tasks cannot train on (an
    empty or binary corpus, a split shorter than a context), are problems (a launch reads
    them; a save does not, and nothing in such a profile is wrong)."""
    where = _Where("")
    where.lines = numbers = _PathNumbers()
    problems = _check_grid(prof, where)
    if problems:
        text = _problems_text("form", problems)
    else:
        try:
            _check_registries(prof, "form", where, data=need_data)
            return []
        except DataAbsent as e:  # one line per absent path, with its command
            if not need_data:
                return []
            return [((), f"{n.path}{f' ({n.what})' if n.what else ''} is absent (not shipped); "
                         f"fetch it with: {n.fetch}") for n in e.needs]
        except ProfileError as e:
            text = str(e)
    out = []
    for line in text.splitlines()[1:]:  # (the first: "form: invalid profile")
        ref = LINE_REF.search(line)
        loc = numbers.paths[int(ref.group(1)) - 1] if ref else ()
        out.append((loc, _AT_LINE.sub(")", LINE_REF.sub("", line)).strip()))
    return out
