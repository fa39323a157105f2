"""The "New sweep" form: pick models, a task and its parameters, sweep axes and training
settings; validate them into a :class:`~workbench.profile.Profile`; save, load, launch.
Grid axes (learning rates, weight decays, any dotted key) become ``[sweep.grid]`` (schema
2) and count in the run count.

Values are handed to pydantic as typed (strings included) so that the messages the user
sees are the profile schema's own; each message is shown next to the field it concerns and
all of them in the status line at the bottom.
"""
from __future__ import annotations

import inspect
import json
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Input, Label, Select, Static, Switch

import tasks
from workbench import profile as profiles
from workbench.profile import Profile, ProfileError
from workbench.tui.model_picker import ModelPicker

# Training fields edited as plain inputs: (field id, label, profile section, default text).
TRAIN_INPUTS = [
    ("batch_size", "batch size", "train", "32"),
    ("d_model", "d_model", "model", "64"),
    ("n_layers", "layers", "model", "2"),
    ("lr", "learning rate", "train", "0.001"),
    ("betas", "AdamW betas", "train", "0.9, 0.999"),
    ("weight_decay", "weight decay", "train", "0.0"),
    ("warmup_steps", "warm-up steps", "train", "0"),
    ("grad_clip", "grad clip (0 = off)", "train", "1.0"),
    ("eval_every", "evaluate every", "train", "1"),
]


def split_list(text: str) -> list[str]:
    """'64, 128,256' -> ['64', '128', '256'] (left as strings: pydantic checks the type)."""
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_param(text: str, default: Any) -> Any:
    """Convert a task-parameter input to the type of its default (pydantic cannot: task
    parameters are free-form in the schema and checked against the task's signature)."""
    text = text.strip()
    if isinstance(default, bool):
        low = text.lower()
        if low in ("true", "yes", "1", "on"):
            return True
        if low in ("false", "no", "0", "off"):
            return False
        raise ValueError(f"expected true or false, got {text!r}")
    if isinstance(default, int):
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"expected an integer, got {text!r}") from None
    if isinstance(default, float):
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"expected a number, got {text!r}") from None
    if isinstance(default, (list, tuple)):
        return [parse_param(x, default[0] if default else 0) for x in split_list(text)]
    if default is None:  # required or untyped: take the most specific literal
        for conv in (int, float):
            try:
                return conv(text)
            except ValueError:
                pass
    return text


def _split_top(text: str, seps: str = ";,") -> list[str]:
    """Split on ';' or ',' (``seps``) outside [...] and quotes."""
    parts, cur, depth, quote = [], [], 0, None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch in seps and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return parts


def parse_model_options(text: str) -> dict[str, dict[str, Any]]:
    """'transformer.pos=rope, mamba.d_state=8' -> {'transformer': {'pos': 'rope'}, ...}.

    Values are TOML literals when they parse as one (numbers, true/false, [lists],
    "strings"), otherwise bare strings. Names and options are checked by the profile loader.
    """
    out: dict[str, dict[str, Any]] = {}
    for item in (x.strip() for x in _split_top(text)):
        if not item:
            continue
        key, eq, raw = item.partition("=")
        model, dot, opt = key.strip().partition(".")
        if not eq or not dot or not model or not opt.strip():
            raise ValueError(f"{item!r}: write model.option=value")
        out.setdefault(model.strip(), {})[opt.strip()] = _literal(raw)
    return out


def _literal(raw: str) -> Any:
    """A TOML literal (number, true/false, [list], "string") or else the bare string."""
    try:
        return tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        return raw.strip()


def parse_grid_values(text: str) -> list[Any]:
    """'1e-4, 5e-4, 1e-3' -> [0.0001, 0.0005, 0.001]: a grid axis's values, TOML literals
    where they parse as one (the profile schema checks them at each grid point)."""
    return [_literal(x) for x in _split_top(text, ",") if x.strip()]


def parse_grid_axes(text: str) -> dict[str, list[Any]]:
    """'model.d_model = 64, 128; task.num_kv_pairs = 4, 8' -> {'model.d_model': [64, 128],
    'task.num_kv_pairs': [4, 8]}: ``[sweep.grid]`` axes over dotted keys, ';' between them.
    The keys are checked by the profile loader (``sweep.grid`` in docs/ARCHITECTURE.md)."""
    out: dict[str, list[Any]] = {}
    for item in (x.strip() for x in _split_top(text, ";")):
        if not item:
            continue
        key, eq, raw = item.partition("=")
        key = key.strip().strip('"')
        values = parse_grid_values(raw)
        if not eq or "." not in key or " " in key or not values:
            raise ValueError(f"{item!r}: write key = v1, v2 with a dotted key (e.g. model.d_model = 64, 128), "
                             f"axes separated by ';'")
        if key in out:
            raise ValueError(f"{key} is given twice")
        out[key] = values
    return out


def format_grid_values(values: list[Any]) -> str:
    return ", ".join(json.dumps(v) for v in values)  # JSON scalars are TOML literals


# grid axes with their own input in the Training section; other keys go in "grid axes"
GRID_INPUTS = {"grid_lr": "train.lr", "grid_wd": "train.weight_decay"}


def parse_settings(text: str) -> dict[str, Any]:
    """'partition=gpu, time="04:00:00", extra=["--exclusive"]' -> a dict (values as in
    :func:`parse_model_options`; the schema checks names and types)."""
    return {opt: v for opts in parse_model_options(
        ", ".join(f"s.{item.strip()}" for item in _split_top(text) if item.strip())).values()
        for opt, v in opts.items()}


def format_settings(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in settings.items())


def format_model_options(options: dict[str, dict[str, Any]]) -> str:
    parts = []
    for model, opts in options.items():
        for k, v in opts.items():
            # JSON scalars and lists are valid TOML literals, on one line
            parts.append(f"{model}.{k}={json.dumps(v)}")
    return ", ".join(parts)


def required_params(task: str) -> set[str]:
    """Task parameters without a default (``tasks.parameters`` shows both these and
    optional ``None`` defaults as None; the constructor's signature tells them apart)."""
    sig = inspect.signature(tasks.task_class(task).__init__)
    return {p.name for p in sig.parameters.values() if p.default is inspect.Parameter.empty
            and p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def _default_value(default: Any) -> Any:
    return list(default) if isinstance(default, tuple) else default


def _model_name(m: Any) -> str:
    """A sweep entry's registry name (entries are names or tables with a name)."""
    return m if isinstance(m, str) else m["name"]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def run_count_text(sweep: dict[str, Any], task: str) -> tuple[str, bool]:
    """'will launch N runs = M models x K lengths x S seeds' for the form's sweep section,
    or what keeps it from being counted; and whether it could be counted.

    The count is ``len(expand(...))`` of a profile with the form's sweep and placeholders
    elsewhere: the runs are the sweep's product, whatever the other fields say, so the count
    shows while they are still being edited (about a millisecond for hundreds of runs)."""
    try:
        prof = Profile.model_validate({"schema_version": profiles.SCHEMA_VERSION, "name": "count",
                                       "task": {"name": task}, "sweep": sweep, "train": {"steps": 1}})
    except ValidationError as e:
        axis = {"models": "models", "seq_lens": "sequence lengths", "seeds": "seeds"}
        problems = []
        for err in e.errors():
            where = next((axis[p] for p in err["loc"] if p in axis), "sweep")
            if err["type"] == "too_short":
                problem = "pick at least one model" if where == "models" else f"give at least one of the {where}"
            else:
                bad = f" ({err['input']!r})" if not isinstance(err.get("input"), (dict, list)) else ""
                problem = f"{where}{bad}: {err['msg']}"
            if problem not in problems:
                problems.append(problem)
        return "cannot count the runs yet: " + "; ".join(problems), False
    try:
        n = len(profiles.expand(prof))
    except ProfileError as e:  # a grid value its section refuses (shown in full on launch/save)
        first = str(e).splitlines()[0].removeprefix("count: ")
        return f"cannot count the runs yet: {first}", False
    lens = prof.sweep.seq_lens
    length_part = _plural(len(lens), "length") if lens else "1 length (the task's default)"
    grid = f" x {_plural(len(profiles.grid_points(prof)), 'grid point')}" if prof.sweep.grid else ""
    return (f"will launch {_plural(n, 'run')} = "
            f"{_plural(len(prof.sweep.models), 'model')} x {length_part} x "
            f"{_plural(len(prof.sweep.seeds), 'seed')}{grid}"), True


def estimate_text(prof: Profile) -> tuple[str, str | None]:
    """('largest est. peak ...' for beside the run count, the refusal or None).

    The resource estimate (workbench/spec/estimate.py) of the validated profile: the
    largest run's estimated peak memory and the device's limit; the refusal names every
    run that cannot fit with its numbers, or says there is no GPU for train.device = cuda."""
    from workbench.spec import estimate

    try:
        ests = estimate.estimate_profile(prof, estimate.share_of(prof))
    except estimate.EstimateError as e:
        return "no estimate", f"cannot launch: {e}"
    known = [e for e in ests if e.peak is not None]
    if not known:
        return "peak memory not estimated", None
    top = max(known, key=lambda e: e.peak)
    limit = f" of {estimate.fmt_bytes(top.limit)}" if top.limit is not None else ""
    peak = (f"largest est. peak {estimate.fmt_bytes(top.peak)}{limit} on {top.device} "
            f"({top.model}, L={top.seq_len})")
    bad = estimate.too_big(ests)
    if not bad:
        return peak, None
    return peak, (f"cannot launch: {_plural(len(bad), 'run')} cannot fit: {bad[0].refusal()}"
                  + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
                  + "; lower the batch size, lengths, d_model or n_layers")


def _fmt(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ", ".join(_fmt(x) for x in v)
    if isinstance(v, bool):
        return "true" if v else "false"
    return "" if v is None else str(v)


class FieldRow(Horizontal):
    """A label, a control and the control's validation message on one line."""

    def __init__(self, label: str, control, field_id: str) -> None:
        super().__init__(classes="field")
        self._label, self._control, self.field_id = label, control, field_id

    def compose(self) -> ComposeResult:
        yield Label(self._label, classes="field-label")
        yield self._control
        yield Static("", id=f"err-{self.field_id}", classes="field-error")


class SweepForm(VerticalScroll):
    """The sweep form. Posts :class:`Launch` with a validated profile; saves/loads itself."""

    BINDINGS = [
        Binding("ctrl+s", "save", "Save profile"),
        Binding("ctrl+o", "load", "Load profile"),
        Binding("ctrl+r", "launch", "Launch sweep"),
        Binding("ctrl+q", "app.quit", "Quit (runs go on)"),
    ]

    class Launch(Message):
        def __init__(self, profile: Profile) -> None:
            super().__init__()
            self.profile = profile

    def __init__(self, profiles_dir: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.profiles_dir = Path(profiles_dir)
        self._params_task: str | None = None  # task whose parameter inputs are shown
        # What a loaded profile holds beyond the form (per-model labels/options, min_lr_ratio,
        # ...): kept so that load -> save does not silently drop settings.
        self._base: dict[str, Any] = {}
        self._loaded_models: list[Any] = []

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        task_names = tasks.names()
        # start on a task that runs without further input (no required parameters)
        ready = [n for n in task_names
                 if all(v is not None for k, v in tasks.parameters(n).items() if k != "seq_len")]
        first = "mad_selective_copying" if "mad_selective_copying" in task_names else (ready or task_names)[0]
        yield Static("Profile", classes="section")
        yield FieldRow("name", Input("sweep", id="name", compact=True), "name")
        yield FieldRow("description", Input("", id="description", compact=True), "description")
        yield Static("Models (type to filter, down to the list, space toggles)", classes="section")
        yield ModelPicker(id="models")
        yield Static("", id="err-models", classes="field-error")
        yield FieldRow("model options", Input("", id="model_options", compact=True,
                                              placeholder="e.g. transformer.pos=rope, mamba.d_state=8"),
                       "model_options")
        yield Static("Task", classes="section")
        yield FieldRow("task", Select([(n, n) for n in task_names], id="task", allow_blank=False,
                                      value=first, compact=True), "task")
        yield Static("", id="task-desc", classes="hint")
        yield Vertical(id="task-params")
        yield Static("Sweep", classes="section")
        yield FieldRow("sequence lengths", Input("64", id="seq_lens", compact=True,
                                                 placeholder="comma-separated, e.g. 64, 256"), "seq_lens")
        yield FieldRow("seeds", Input("0", id="seeds", compact=True, placeholder="e.g. 0, 1, 2"), "seeds")
        yield Static("", id="run-count")
        yield Static("Training", classes="section")
        yield FieldRow("budget", Select([("epochs", "epochs"), ("steps", "steps")], id="budget_kind",
                                        allow_blank=False, value="steps", compact=True), "budget_kind")
        yield FieldRow("epochs / steps", Input("200", id="budget", compact=True), "budget")
        for fid, label, _, default in TRAIN_INPUTS:
            yield FieldRow(label, Input(default, id=fid, compact=True), fid)
        # [sweep.grid] axes: each value list multiplies the runs (empty: no grid)
        yield FieldRow("lr grid", Input("", id="grid_lr", compact=True,
                                        placeholder="e.g. 1e-4, 5e-4, 1e-3 (a run per value)"), "grid_lr")
        yield FieldRow("weight decay grid", Input("", id="grid_wd", compact=True,
                                                  placeholder="e.g. 0, 0.01, 0.1"), "grid_wd")
        yield FieldRow("other grid axes", Input("", id="grid_axes", compact=True,
                                                placeholder="e.g. model.d_model = 64, 128; "
                                                            "train.warmup_steps = 0, 100"), "grid_axes")
        yield FieldRow("lr schedule", Select([("cosine", "cosine"), ("constant", "constant")],
                                             id="schedule", allow_blank=False, value="cosine",
                                             compact=True), "schedule")
        yield FieldRow("mixed precision", Switch(False, id="amp"), "amp")
        yield FieldRow("early stop on", Select([("eval accuracy", "accuracy"), ("eval loss", "loss")],
                                               id="es_metric", allow_blank=False, value="accuracy",
                                               compact=True), "es_metric")
        yield FieldRow("patience (0 = off)", Input("0", id="patience", compact=True), "patience")
        yield FieldRow("device", Select([(d, d) for d in ("auto", "cpu", "cuda")], id="device",
                                        allow_blank=False, value="auto", compact=True), "device")
        yield Static("Where", classes="section")
        yield FieldRow("executor", Select([("this machine", "local"), ("Slurm: a job per run", "slurm")],
                                          id="executor", allow_blank=False, value="local", compact=True),
                       "executor")
        yield FieldRow("Slurm settings", Input("", id="slurm", compact=True,
                                               placeholder="partition=gpu, time=04:00:00, gpus_per_run=1, mem=32G"),
                       "slurm")
        yield Static("#SBATCH settings as key=value: partition, account, qos, time, gpus_per_run, "
                     "cpus_per_run, mem, extra=[...], signal_s, requeue, shared_dir, setup=[...]",
                     classes="hint")
        yield Static("", id="form-status")

    async def on_mount(self) -> None:
        await self._show_task(self.query_one("#task", Select).value)
        self._show_run_count()

    # the number of runs follows the three sweep axes as they are edited
    @on(ModelPicker.Changed, "#models")
    @on(Input.Changed, "#seq_lens")
    @on(Input.Changed, "#seeds")
    @on(Input.Changed, "#grid_lr")
    @on(Input.Changed, "#grid_wd")
    @on(Input.Changed, "#grid_axes")
    def _show_run_count(self) -> None:
        _, grid_errors = self._grid_data()
        if grid_errors:
            text, ok = "cannot count the runs yet: " + "; ".join(grid_errors.values()), False
        else:
            text, ok = run_count_text(self._sweep_data(), str(self._select("task")))
        count = self.query_one("#run-count", Static)
        count.set_class(not ok, "bad")
        count.update(Text(text))

    # ------------------------------------------------------------------ task parameters
    @on(Select.Changed, "#task")
    async def _task_changed(self, event: Select.Changed) -> None:
        if event.value != self._params_task and event.value is not Select.NULL:
            await self._show_task(str(event.value))

    async def _show_task(self, name: str, values: dict[str, Any] | None = None) -> None:
        """Generate one input per task parameter (seq_len comes from the sweep's lengths)."""
        self._params_task = name
        self.query_one("#task-desc", Static).update(Text(tasks.describe(name)))
        box = self.query_one("#task-params", Vertical)
        await box.remove_children()
        values = values or {}
        required = required_params(name)
        rows = []
        for p, default in tasks.parameters(name).items():
            if p == "seq_len":
                continue
            text = _fmt(values.get(p, default))
            hint = ("required" if p in required else "not set" if default is None
                    else f"default {_fmt(default)}")
            rows.append(FieldRow(f"  {p}", Input(text, id=f"param-{p}", compact=True,
                                                 placeholder=hint), f"param-{p}"))
        await box.mount_all(rows)

    # ------------------------------------------------------------------ reading the form
    def _text(self, fid: str) -> str:
        return self.query_one(f"#{fid}", Input).value.strip()

    def _select(self, fid: str) -> Any:
        return self.query_one(f"#{fid}", Select).value

    def form_data(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The profile as a plain dict (values as typed) and errors found before pydantic."""
        errors: dict[str, str] = {}
        base = self._base
        task_name = str(self._select("task"))
        params: dict[str, Any] = {}
        required = required_params(task_name)
        for p, default in tasks.parameters(task_name).items():
            if p == "seq_len":
                continue
            text = self._text(f"param-{p}")
            if not text:
                if p in required:
                    errors[f"param-{p}"] = "required"
                continue
            try:
                value = parse_param(text, default)
            except ValueError as e:
                errors[f"param-{p}"] = str(e)
                continue
            # write what differs from the task's default, or what the loaded profile had:
            # a profile then keeps following the registry's defaults where it never chose
            if value != _default_value(default) or p in base.get("task", {}):
                params[p] = value
        sweep = self._sweep_data()
        errors.update(self._grid_data()[1])
        chosen = sweep["models"]
        model = {k: v for k, v in base.get("model", {}).items() if k not in ("d_model", "n_layers", "options")}
        try:
            opts = parse_model_options(self._text("model_options"))
        except ValueError as e:
            errors["model_options"] = str(e)
        else:
            if opts:
                model["options"] = opts
        train = {k: v for k, v in base.get("train", {}).items() if k not in ("epochs", "steps")}
        es = dict(train.get("early_stopping", {}))
        for fid, _, section, _ in TRAIN_INPUTS:
            text = self._text(fid)
            target = model if section == "model" else train
            if not text:
                target.pop(fid, None)  # empty = the schema's default
            elif fid == "betas":
                target[fid] = split_list(text)
            else:
                target[fid] = text
        budget = self._text("budget")
        if budget:
            train[str(self._select("budget_kind"))] = budget
        train["schedule"] = self._select("schedule")
        train["amp"] = self.query_one("#amp", Switch).value
        train["device"] = self._select("device")
        es["metric"] = self._select("es_metric")
        if self._text("patience"):
            es["patience"] = self._text("patience")
        train["early_stopping"] = es
        data = {
            # a loaded schema 1 profile stays schema 1: its runs keep their identity
            # (checkpoint.spec_key), so launching it from here replays, not duplicates
            # (a grid needs schema 2)
            "schema_version": 2 if sweep.get("grid") else base.get("schema_version", profiles.SCHEMA_VERSION),
            "name": self._text("name"),
            "description": self.query_one("#description", Input).value,
            "task": {"name": task_name, **params},
            "sweep": sweep,
            "model": model,
            "train": train,
        }
        data["executor"] = self._select("executor")
        try:
            slurm_settings = parse_settings(self._text("slurm"))
        except ValueError as e:
            errors["slurm"] = str(e)
        else:
            if slurm_settings:
                data["slurm"] = slurm_settings
        if base.get("runs_per_gpu"):  # no field in the form: keep a loaded profile's
            data["runs_per_gpu"] = base["runs_per_gpu"]
        # a loaded profile's published numbers, for the models still picked
        labels = {m if isinstance(m, str) else m.get("label") or m.get("name") for m in chosen}
        published = [e for e in base.get("published", []) if e.get("model") in labels]
        if published:
            data["published"] = published
        return data, errors

    def _sweep_data(self) -> dict[str, Any]:
        """The sweep section as typed: models, sequence lengths, seeds."""
        picked = self.query_one("#models", ModelPicker).picked
        # a loaded profile's entries (labels, options) for the models still picked, in its
        # order (the order its runs go in); models picked since follow in registry order
        chosen: list[Any] = [m for m in self._loaded_models if _model_name(m) in picked]
        kept = {_model_name(m) for m in chosen}
        chosen += [n for n in picked if n not in kept]
        sweep = {"models": chosen, "seq_lens": split_list(self._text("seq_lens")),
                 "seeds": split_list(self._text("seeds"))}
        grid, _ = self._grid_data()
        if grid:
            sweep["grid"] = grid
        return sweep

    def _grid_data(self) -> tuple[dict[str, list[Any]], dict[str, str]]:
        """``[sweep.grid]`` from the lr, weight decay and other-axes inputs (a loaded
        profile's keys keep their order, the order its runs go in), and the inputs' parse
        errors by field id."""
        grid: dict[str, list[Any]] = {}
        errors: dict[str, str] = {}
        for fid, key in GRID_INPUTS.items():
            values = parse_grid_values(self._text(fid))
            if values:
                grid[key] = values
        try:
            axes = parse_grid_axes(self._text("grid_axes"))
        except ValueError as e:
            errors["grid_axes"] = f"grid axes: {e}"
            axes = {}
        for key, values in axes.items():
            fid = next((f for f, k in GRID_INPUTS.items() if k == key), None)
            if key in grid:
                errors["grid_axes"] = f"grid axes: {key} has its own input ({fid.replace('_', ' ')})"
            else:
                grid[key] = values
        order = list(self._base.get("sweep", {}).get("grid", {}))
        grid = dict(sorted(grid.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))
        return grid, errors

    def build_profile(self) -> Profile | None:
        """Validate the form; show every problem and return None, or return the profile."""
        data, errors = self.form_data()
        general: list[str] = []
        prof: Profile | None = None
        try:
            prof = Profile.model_validate(data)
        except ValidationError as e:
            for err in e.errors():
                fid = self._field_for(err["loc"])
                where = ".".join(str(p) for p in err["loc"] if p not in ("str", "ModelChoice"))
                msg = err["msg"]
                if err["type"] != "missing" and "input" in err and not isinstance(err["input"], (dict, list)):
                    msg += f" (got {err['input']!r})"
                if fid and fid not in errors:
                    errors[fid] = msg
                general.append(f"{where or 'profile'}: {msg}")
        if prof is not None and not errors:
            try:  # the registry checks (model/task names, options) the loader applies
                prof = profiles.loads(profiles.dumps(prof), path="form")
            except ProfileError as e:
                general.append(str(e))
                for line in str(e).splitlines()[1:]:  # point at the field where we can
                    if "sweep.grid" in line:
                        errors.setdefault(next((f for f, k in GRID_INPUTS.items() if f"'{k}'" in line),
                                               "grid_axes"), line.strip())
                    elif "model options" in line or "model.options" in line:
                        errors.setdefault("model_options", line.strip())
                    elif line.strip().startswith("task"):
                        errors.setdefault("task", line.strip())
                prof = None
        self._show_errors(errors, general)
        return prof if not errors and not general else None

    @staticmethod
    def _field_for(loc: tuple) -> str | None:
        keys = [p for p in loc if isinstance(p, str)]
        if "grid" in keys[:2]:
            key = keys[keys.index("grid") + 1] if len(keys) > keys.index("grid") + 1 else ""
            return next((f for f, k in GRID_INPUTS.items() if k == key), "grid_axes")
        if keys[:1] == ["train"] and (len(keys) == 1 or keys[1] in ("epochs", "steps")):
            return "budget"  # "give exactly one of epochs or steps" is a train-level error
        if keys[:1] in (["slurm"], ["executor"]):
            return keys[0]
        mapping = {"models": "models", "seq_lens": "seq_lens", "seeds": "seeds", "name": "name",
                   "patience": "patience", "metric": "es_metric", "description": "description"}
        for k in reversed(keys):
            if k in mapping:
                return mapping[k]
            if any(k == fid for fid, *_ in TRAIN_INPUTS) or k in ("schedule", "amp", "device"):
                return k
        return None

    def _show_errors(self, errors: dict[str, str], general: list[str]) -> None:
        for w in self.query(".field-error"):
            w.update("")
        for fid, msg in errors.items():
            hits = self.query(f"#err-{fid}")
            if hits:
                hits.first().update(Text(msg))
        status = self.query_one("#form-status", Static)
        lines = [f"{fid}: {msg}" for fid, msg in errors.items()
                 if not any(line.split(":")[0].endswith(fid) for line in general)] + general
        if lines:
            status.set_class(True, "bad")
            status.update(Text("Cannot use this profile:\n" + "\n".join(lines)))
            # take the user to the first field (in form order) that needs fixing
            first = next((w for w in self.query("Input, Select, ModelPicker") if w.id in errors), None)
            if first is not None:
                first.focus()
        else:
            status.set_class(False, "bad")
            status.update("")

    def set_status(self, text: str, bad: bool = False) -> None:
        status = self.query_one("#form-status", Static)
        status.set_class(bad, "bad")
        status.update(Text(text))

    # ------------------------------------------------------------------ filling the form
    async def fill(self, prof: Profile) -> None:
        """Show a loaded profile in the form (settings the form has no field for are kept)."""
        if prof.task is None:
            raise ProfileError(f"profile {prof.name!r} has {len(prof.tasks)} tasks ([[tasks]]): the form edits "
                               f"profiles with one [task]; run it with `ssm-workbench run`")
        d = profiles.to_dict(prof)
        self._base = d
        self._loaded_models = list(d["sweep"]["models"])
        self.query_one("#name", Input).value = prof.name
        self.query_one("#description", Input).value = prof.description
        self.query_one("#models", ModelPicker).set_picked(_model_name(m) for m in self._loaded_models)
        self.query_one("#model_options", Input).value = format_model_options(prof.model.options)
        await self._show_task(prof.task.name, prof.task.params())
        self.query_one("#task", Select).value = prof.task.name
        self.query_one("#seq_lens", Input).value = _fmt(prof.sweep.seq_lens)
        self.query_one("#seeds", Input).value = _fmt(prof.sweep.seeds)
        grid = dict(prof.sweep.grid)
        for fid, key in GRID_INPUTS.items():
            self.query_one(f"#{fid}", Input).value = format_grid_values(grid.pop(key, []))
        self.query_one("#grid_axes", Input).value = "; ".join(
            f"{k} = {format_grid_values(v)}" for k, v in grid.items())
        t = prof.train
        kind = "epochs" if t.epochs is not None else "steps"
        self.query_one("#budget_kind", Select).value = kind
        self.query_one("#budget", Input).value = str(t.epochs if kind == "epochs" else t.steps)
        for fid, _, section, _ in TRAIN_INPUTS:
            src = prof.model if section == "model" else t
            self.query_one(f"#{fid}", Input).value = _fmt(getattr(src, fid))
        self.query_one("#schedule", Select).value = t.schedule
        self.query_one("#amp", Switch).value = t.amp
        self.query_one("#es_metric", Select).value = t.early_stopping.metric
        self.query_one("#patience", Input).value = str(t.early_stopping.patience)
        self.query_one("#device", Select).value = t.device
        self.query_one("#executor", Select).value = prof.executor
        self.query_one("#slurm", Input).value = format_settings(prof.slurm.model_dump(exclude_defaults=True))
        self._show_errors({}, [])

    # ------------------------------------------------------------------ actions
    def action_save(self) -> None:
        from workbench.tui.dialogs import PathScreen

        prof = self.build_profile()
        if prof is None:
            return

        def done(path: Path | None) -> None:
            if path is None:
                return
            try:
                written = profiles.save(prof, path)
            except OSError as e:
                self.set_status(f"cannot save {path}: {e.strerror}", bad=True)
                return
            self.set_status(f"saved {written}")
            self.notify(f"saved {written}", markup=False)

        default = self.profiles_dir / f"{prof.name}.toml"
        self.app.push_screen(PathScreen("Save profile to", str(default)), done)

    def action_load(self) -> None:
        from workbench.tui.dialogs import PathScreen

        async def done(path: Path | None) -> None:
            if path is None:
                return
            try:
                prof = profiles.load(path)
                await self.fill(prof)
            except ProfileError as e:
                self.set_status(str(e), bad=True)
                self.notify(str(e), title="cannot load profile", severity="error", markup=False)
                return
            self.set_status(f"loaded {path}")

        self.app.push_screen(PathScreen("Load profile from", str(self.profiles_dir) + "/",
                                        browse=self.profiles_dir), done)

    def action_launch(self) -> None:
        prof = self.build_profile()
        if prof is not None:
            text, _ = run_count_text(self._sweep_data(), prof.task.name)
            peak, refusal = estimate_text(prof)
            count = self.query_one("#run-count", Static)
            count.set_class(refusal is not None, "bad")
            count.update(Text(f"{text} · {peak}"))
            if refusal is not None:  # a run that cannot fit is not launched (the CLI has --force)
                self.set_status(refusal, bad=True)
                return
            # the app replaces this with the ids once the runs are queued
            self.set_status(text.replace("will launch", "launching", 1))
            self.post_message(self.Launch(prof))
