"""The "New sweep" form: pick models, a task and its parameters, sweep axes and training
settings; validate them into a :class:`~workbench.spec.profile.Profile`; save, load, launch.
Grid axes (learning rates, weight decays, any dotted key) become ``[sweep.grid]`` (schema
2) and count in the run count.

Values are handed to pydantic as typed (strings included); its errors are turned into plain
sentences naming the form's field (:func:`plain_message`), shown under the field they
concern and all of them in the status box at the bottom, which stays in view. Once a save
or launch found problems, every edit checks again, so a corrected value loses its message.
Sequence lengths are checked against the task as they are typed (the task is built at each
length, as the profile loader does): a length that does not fit is reported once, under
the lengths, and the run count waits until it does.

"evaluate every" counts steps or epochs like the budget and follows it (about
``EVALS_PER_RUN`` evaluations a run) until the user types a value of their own.
"""
from __future__ import annotations

import inspect
import json
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.message import Message
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Input, Label, Select, Static, Switch

import tasks
from workbench.spec import profile as profiles
from workbench.spec.profile import Profile, ProfileError
from workbench.spec.where import _key_lines
from workbench.tui import paths
from workbench.tui.formatting import set_text
from workbench.tui.model_picker import ModelPicker

DEFAULT_BUDGET = "200"  # steps
RECHECK_S = 0.25  # after a failed save/launch, the form is checked again this long after typing stops
EVALS_PER_RUN = 20  # the default "evaluate every" gives about this many evaluations a run

# Training fields edited as plain inputs: (field id, label, profile section, default text;
# eval_every's default follows the budget: default_eval_every).
TRAIN_INPUTS = [
    ("batch_size", "batch size", "train", "32"),
    ("d_model", "d_model", "model", "64"),
    ("n_layers", "layers", "model", "2"),
    ("lr", "learning rate", "train", "0.001"),
    ("betas", "AdamW betas", "train", "0.9, 0.999"),
    ("weight_decay", "weight decay", "train", "0.0"),
    ("warmup_steps", "warm-up", "train", "0"),
    ("grad_clip", "grad clip", "train", "1.0"),
    ("eval_every", "evaluate every", "train", "10"),
]
# what a number in these fields counts (eval_every's says steps or epochs, as the budget)
UNITS = {"batch_size": "sequences a step", "lr": "peak (after warm-up)", "eval_every": "steps",
         "warmup_steps": "steps", "betas": "2 numbers in [0, 1)", "grad_clip": "max norm; 0 = off"}


def default_eval_every(kind: str, budget: str) -> str | None:
    """The default "evaluate every" for a budget of ``budget`` steps or epochs (``kind``):
    about EVALS_PER_RUN evaluations a run, at least one step or epoch apart; None while
    the budget is not a positive whole number."""
    try:
        n = int(budget)
    except ValueError:
        return None
    if n <= 0 or kind not in ("steps", "epochs"):
        return None
    return str(max(1, round(n / EVALS_PER_RUN)))


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


class FieldRow(Vertical):
    """A label, a control (and its unit, or a second control) on one line; the control's
    validation message on the line below, shown only while there is one."""

    def __init__(self, label: str, control, field_id: str, unit: str | Widget | None = None) -> None:
        super().__init__(classes="field")
        self._label, self._control, self.field_id, self._unit = label, control, field_id, unit

    def compose(self) -> ComposeResult:
        with Horizontal(classes="field-line"):
            yield Label(self._label, classes="field-label")
            yield self._control
            if isinstance(self._unit, Widget):
                yield self._unit
            elif self._unit is not None:
                yield Static(self._unit, id=f"unit-{self.field_id}", classes="field-unit")
        yield Static("", id=f"err-{self.field_id}", classes="field-error")


# ---------------------------------------------------------------------------- messages
def _shown_value(v: Any) -> str:
    return repr(v) if isinstance(v, str) else str(v)


def _bound(ctx: dict[str, Any]) -> str | None:
    for key, words in (("gt", "greater than"), ("ge", "at least"), ("lt", "less than"), ("le", "at most")):
        if key in ctx:
            v = ctx[key]
            return f"{words} {int(v) if isinstance(v, float) and v.is_integer() else v}"
    return None


def plain_message(err: dict[str, Any], label: str, example: str | None = None) -> str:
    """One pydantic error as a sentence that names the form's field, e.g. ``learning rate:
    'abc' is not a number`` for "Input should be a valid number, unable to parse string as
    a number". ``example``: a valid value to quote when values are missing."""
    kind, ctx = err["type"], err.get("ctx") or {}
    got = err.get("input")
    item = any(isinstance(p, int) for p in err["loc"])  # one value of a list field
    value = _shown_value(got) if isinstance(got, (str, int, float)) and not isinstance(got, bool) else None
    eg = f" (e.g. {example})" if example else ""
    if kind == "too_short":
        n = ctx.get("min_length", 1)
        if label == "models":
            return f"models: pick at least {n} model (space in the list picks the one under the cursor)"
        return f"{label}: give at least {n} value{'' if n == 1 else 's'}{eg}"
    if kind == "too_long":
        return f"{label}: give at most {ctx.get('max_length')} values{eg}"
    if kind == "missing":
        idx = next((p for p in err["loc"] if isinstance(p, int)), None)
        if idx is not None:
            return f"{label}: value {idx + 1} is missing{eg}"
        return f"{label}: required"
    if kind in ("int_parsing", "int_from_float", "int_type"):
        return f"{label}: {value} is not a whole number" if value else f"{label}: give a whole number"
    if kind in ("float_parsing", "float_type"):
        return f"{label}: {value} is not a number" if value else f"{label}: give a number"
    if kind in ("bool_parsing", "bool_type"):
        return f"{label}: {value} is not true or false"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        rule = f"{label} must {'each ' if item else ''}be {_bound(ctx)}"
        return f"{rule}; {got} is not" if value else rule
    if kind == "string_too_short":
        return f"{label}: must not be empty"
    if kind == "literal_error":
        return f"{label}: must be one of {ctx.get('expected')}"
    msg = str(err.get("msg", "")).removeprefix("Value error, ")
    return f"{label}: {msg[:1].lower()}{msg[1:]}"


def _line_keys(text: str) -> dict[int, tuple]:
    """{line: key path} of a TOML text written by ``profiles.dumps``: the loader's messages
    say "(line N)" of that text, and the line tells which field the message is about."""
    return {line: path for path, line in sorted(_key_lines(text).items(), key=lambda kv: len(kv[0]))}


LINE_REF = re.compile(r" \(line (\d+)\)")


class SweepForm(Vertical):
    """The sweep form. Posts :class:`Launch` with a validated profile; saves/loads itself.

    Wide terminals show two columns (models on the left; task, sweep and training settings
    on the right), narrow ones a single scrolling column; the status box with the
    problems of the last save/launch stays at the bottom either way."""

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

    def __init__(self, profiles_dir: Path, state_dir: Path | None = None, **kwargs: Any) -> None:
        """``state_dir``: where the last profile path is remembered (the store folder;
        :mod:`workbench.tui.paths`); None remembers for this session only."""
        super().__init__(**kwargs)
        self.profiles_dir = Path(profiles_dir)
        self.state_dir = state_dir
        self._params_task: str | None = None  # task whose parameter inputs are shown
        # What a loaded profile holds beyond the form (per-model labels/options, min_lr_ratio,
        # ...): kept so that load -> save does not silently drop settings.
        self._base: dict[str, Any] = {}
        self._loaded_models: list[Any] = []
        self._errors_shown = False  # a save/launch found problems: re-check as fields change
        self._recheck_timer: Timer | None = None
        self._eval_auto = default_eval_every("steps", DEFAULT_BUDGET)
        self._built: dict[tuple, str | None] = {}  # (task, params, length) -> build error
        saved = paths.load_state(state_dir).get("profile_path") if state_dir is not None else None
        self.last_path: Path | None = Path(saved) if saved else None

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        task_names = tasks.names()
        # start on a task that runs without further input (no required parameters)
        ready = [n for n in task_names
                 if all(v is not None for k, v in tasks.parameters(n).items() if k != "seq_len")]
        first = "mad_selective_copying" if "mad_selective_copying" in task_names else (ready or task_names)[0]
        with _Columns(id="form-columns"):
            with Vertical(id="form-left", classes="form-column"):
                yield Static("Profile", classes="section")
                yield FieldRow("name", Input("sweep", id="name", compact=True), "name")
                yield FieldRow("description", Input("", id="description", compact=True), "description")
                yield Static("Models (type to filter; space picks)", classes="section")
                yield ModelPicker(id="models")
                yield Static("", id="err-models", classes="field-error")
                yield FieldRow("model options", Input("", id="model_options", compact=True,
                                                      placeholder="e.g. transformer.pos=rope"),
                               "model_options")
            with VerticalScroll(id="form-right", classes="form-column"):
                yield Static("Task", classes="section")
                yield FieldRow("task", Select([(n, n) for n in task_names], id="task", allow_blank=False,
                                              value=first, compact=True), "task")
                yield Static("", id="task-desc", classes="hint")
                yield Vertical(id="task-params")
                yield Static("Sweep", classes="section")
                yield FieldRow("sequence lengths", Input("64", id="seq_lens", compact=True,
                                                         placeholder="e.g. 64, 256"), "seq_lens",
                               unit="tokens")
                yield FieldRow("seeds", Input("0", id="seeds", compact=True, placeholder="e.g. 0, 1, 2"),
                               "seeds")
                yield Static("", id="run-count")
                yield Static("Training", classes="section")
                yield FieldRow("train for", Input(DEFAULT_BUDGET, id="budget", compact=True), "budget",
                               unit=Select([("steps", "steps"), ("epochs", "epochs")], id="budget_kind",
                                           allow_blank=False, value="steps", compact=True))
                for fid, label, _, default in TRAIN_INPUTS:
                    if fid == "eval_every":
                        default = self._eval_auto
                    yield FieldRow(label, Input(default, id=fid, compact=True), fid, unit=UNITS.get(fid))
                # [sweep.grid] axes: each value list multiplies the runs (empty: no grid)
                yield FieldRow("lr grid", Input("", id="grid_lr", compact=True,
                                                placeholder="e.g. 1e-4, 5e-4, 1e-3"), "grid_lr",
                               unit="a run per value")
                yield FieldRow("weight decay grid", Input("", id="grid_wd", compact=True,
                                                          placeholder="e.g. 0, 0.01, 0.1"), "grid_wd")
                yield FieldRow("other grid axes", Input("", id="grid_axes", compact=True,
                                                        placeholder="e.g. model.d_model = 64, 128"),
                               "grid_axes", unit="key = values; ...")
                yield FieldRow("lr schedule", Select([("cosine", "cosine"), ("constant", "constant")],
                                                     id="schedule", allow_blank=False, value="cosine",
                                                     compact=True), "schedule")
                yield FieldRow("mixed precision", Switch(False, id="amp"), "amp")
                yield FieldRow("early stop on", Select([("eval accuracy", "accuracy"), ("eval loss", "loss")],
                                                       id="es_metric", allow_blank=False, value="accuracy",
                                                       compact=True), "es_metric")
                yield FieldRow("patience", Input("0", id="patience", compact=True), "patience",
                               unit="evaluations (0 = off)")
                yield FieldRow("device", Select([(d, d) for d in ("auto", "cpu", "cuda")], id="device",
                                                allow_blank=False, value="auto", compact=True), "device")
                yield Static("Where", classes="section")
                yield FieldRow("executor", Select([("this machine", "local"), ("Slurm: a job per run", "slurm")],
                                                  id="executor", allow_blank=False, value="local",
                                                  compact=True), "executor")
                yield FieldRow("Slurm settings", Input("", id="slurm", compact=True,
                                                       placeholder="partition=gpu, time=04:00:00"), "slurm")
                yield Static("#SBATCH settings as key=value: partition, account, qos, time, gpus_per_run, "
                             "cpus_per_run, mem, extra=[...], signal_s, requeue, shared_dir, setup=[...]",
                             classes="hint")
        # outside the scrolling columns: always in view when a save or launch fails
        yield Static("", id="form-status")

    async def on_mount(self) -> None:
        await self._show_task(self.query_one("#task", Select).value)
        self._show_run_count()
        self._show_eval_unit()
        self.set_status("")

    # the number of runs follows the sweep axes (and the task, which bounds the lengths)
    @on(ModelPicker.Changed, "#models")
    @on(Input.Changed, "#seq_lens")
    @on(Input.Changed, "#seeds")
    @on(Input.Changed, "#grid_lr")
    @on(Input.Changed, "#grid_wd")
    @on(Input.Changed, "#grid_axes")
    def _show_run_count(self) -> None:
        _, grid_errors = self._grid_data()
        lengths = self._length_problems()
        if grid_errors:
            text, ok = "cannot count the runs yet: " + "; ".join(grid_errors.values()), False
        elif lengths:
            # the problem itself is shown once, under the lengths
            text, ok = "no run count while a sequence length does not fit the task", False
        else:
            text, ok = run_count_text(self._sweep_data(), str(self._select("task")))
        count = self.query_one("#run-count", Static)
        count.set_class(not ok, "bad")
        set_text(count, Text(text))  # (only when it changed: each update is a repaint)
        if not self._errors_shown:  # (else the full check below shows every field's problem)
            self._set_error("seq_lens", lengths)

    def _length_problems(self) -> str:
        """Why some sequence lengths do not fit the task as its parameters stand ('' when
        they all do, or when the parameters themselves are not valid yet): the task is
        built at each length (cheap: data is generated lazily), as the profile loader
        would, so the message is the task's own."""
        name = str(self._select("task"))
        if name != self._params_task or "seq_len" not in tasks.parameters(name):
            return ""
        try:
            params, errors = self._task_params(name)
        except NoMatches:  # the parameter inputs are being rebuilt
            return ""
        if errors:
            return ""
        lens = []
        for text in split_list(self._text("seq_lens")):
            try:
                lens.append(int(text))
            except ValueError:
                pass  # not a length at all: the schema's message says so
        bad = {L: e for L in dict.fromkeys(lens) if (e := self._build_error(name, params, L))}
        if not bad:
            return ""
        # a length is at fault only when the same parameters build at another length
        others = [L for L in lens if L not in bad] + [tasks.parameters(name)["seq_len"]]
        if all(self._build_error(name, params, L) for L in others if L is not None):
            return ""
        (L, err), *more = bad.items()
        also = f" (also {', '.join(map(str, (m for m, _ in more)))})" if more else ""
        return f"sequence lengths: {L}{also} does not fit task {name}: {err}"

    def _build_error(self, name: str, params: dict[str, Any], L: int) -> str | None:
        key = (name, json.dumps(params, sort_keys=True, default=str), L)
        if key not in self._built:
            if len(self._built) > 512:
                self._built.clear()
            try:
                tasks.build(name, **params, seq_len=L)
                self._built[key] = None
            except (ValueError, TypeError, OSError) as e:
                self._built[key] = str(e)
        return self._built[key]

    # ------------------------------------------------------------------ units and defaults
    @on(Input.Changed, "#budget")
    @on(Select.Changed, "#budget_kind")
    def _budget_changed(self) -> None:
        """'evaluate every' follows the budget (about EVALS_PER_RUN evaluations a run)
        until the user types a value of their own."""
        auto = default_eval_every(str(self._select("budget_kind")), self._text("budget"))
        field = self.query_one("#eval_every", Input)
        if auto is not None and field.value.strip() in ("", self._eval_auto):
            field.value = auto
        if auto is not None:
            self._eval_auto = auto
        self._show_eval_unit()

    @on(Input.Changed, "#eval_every")
    def _show_eval_unit(self) -> None:
        kind = str(self._select("budget_kind"))
        text = kind
        try:
            every, budget = int(self._text("eval_every")), int(self._text("budget"))
        except ValueError:
            pass
        else:
            if every > 0 and budget > 0:
                n = budget // every
                text = f"{kind}, {n} eval{'' if n == 1 else 's'}"
        self.query_one("#unit-eval_every", Static).update(text)

    # ------------------------------------------------------------------ live re-checking
    @on(Input.Changed)
    @on(Select.Changed)
    @on(Switch.Changed)
    @on(ModelPicker.Changed)
    def _recheck(self, event: Message | None = None) -> None:
        """Once a save or launch showed problems, every edit checks the form again, so a
        message goes away as soon as its value is corrected (and a new one appears). A
        task parameter may also change which sequence lengths fit."""
        if isinstance(event, Input.Changed) and (event.input.id or "").startswith("param-"):
            self._show_run_count()
        if self._errors_shown:
            # once typing pauses: a full check (the registry's too) takes 50-200 ms
            if self._recheck_timer is not None:
                self._recheck_timer.stop()
            self._recheck_timer = self.set_timer(RECHECK_S, self._recheck_now)

    def _recheck_now(self) -> None:
        self._recheck_timer = None
        if self._errors_shown and self._select("task") == self._params_task:
            self.build_profile(focus=False)  # (a new task's inputs: after _task_changed)

    # ------------------------------------------------------------------ task parameters
    @on(Select.Changed, "#task")
    async def _task_changed(self, event: Select.Changed) -> None:
        if event.value != self._params_task and event.value is not Select.NULL:
            await self._show_task(str(event.value))
            self._show_run_count()
            self._recheck()

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

    def _task_params(self, task_name: str) -> tuple[dict[str, Any], dict[str, str]]:
        """The task parameters the profile should hold (what differs from the task's
        defaults, or what a loaded profile had) and their parse errors by field id."""
        errors: dict[str, str] = {}
        params: dict[str, Any] = {}
        base = self._base
        required = required_params(task_name)
        for p, default in tasks.parameters(task_name).items():
            if p == "seq_len":
                continue
            text = self._text(f"param-{p}")
            if not text:
                if p in required:
                    errors[f"param-{p}"] = f"task parameter {p}: required"
                continue
            try:
                value = parse_param(text, default)
            except ValueError as e:
                errors[f"param-{p}"] = f"task parameter {p}: {e}"
                continue
            # write what differs from the task's default, or what the loaded profile had:
            # a profile then keeps following the registry's defaults where it never chose
            if value != _default_value(default) or p in base.get("task", {}):
                params[p] = value
        return params, errors

    def form_data(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The profile as a plain dict (values as typed) and errors found before pydantic."""
        base = self._base
        task_name = str(self._select("task"))
        params, errors = self._task_params(task_name)
        sweep = self._sweep_data()
        errors.update(self._grid_data()[1])
        chosen = sweep["models"]
        model = {k: v for k, v in base.get("model", {}).items() if k not in ("d_model", "n_layers", "options")}
        try:
            opts = parse_model_options(self._text("model_options"))
        except ValueError as e:
            errors["model_options"] = f"model options: {e}"
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
            errors["slurm"] = f"Slurm settings: {e}"
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

    def build_profile(self, focus: bool = True) -> Profile | None:
        """Validate the form; show every problem next to its field (and all of them in
        the status box) and return None, or return the profile. ``focus``: take the user
        to the first field that needs fixing (not while re-checking as they type)."""
        if self._select("task") != self._params_task:
            return None  # the new task's parameter inputs are being built (_task_changed)
        data, errors = self.form_data()
        general: list[str] = []

        def add(fid: str | None, msg: str) -> None:
            fid = ALIASES.get(fid, fid)
            if fid is None or not self.query(f"#err-{fid}"):
                if msg not in general:
                    general.append(msg)
            elif msg not in errors.get(fid, ""):  # each field's problems once
                errors[fid] = f"{errors[fid]}; {msg}" if fid in errors else msg

        lengths = self._length_problems()
        if lengths:
            add("seq_lens", lengths)
        prof: Profile | None = None
        try:
            prof = Profile.model_validate(data)
        except ValidationError as e:
            for err in e.errors():
                loc = tuple(err["loc"])
                cause = (err.get("ctx") or {}).get("error")
                key = getattr(cause, "key", None)  # a section-level check about one key
                if key is not None:
                    loc += key if isinstance(key, tuple) else (key,)
                fid = field_for(loc)
                add(fid, plain_message(err, self._label(fid, loc), EXAMPLES.get(fid)))
        if prof is not None and not errors and not general:
            text = profiles.dumps(prof)
            try:  # the registry checks (model/task names, options) the loader applies
                prof = profiles.loads(text, path="form")
            except ProfileError as e:
                keys = _line_keys(text)
                for line in str(e).splitlines()[1:]:
                    ref = LINE_REF.search(line)
                    fid = field_for(keys.get(int(ref.group(1)), ())) if ref else None
                    add(fid, LINE_REF.sub("", line).strip())
                prof = None
        self._show_errors(errors, general, focus)
        return prof if not errors and not general else None

    def _label(self, fid: str | None, loc: tuple) -> str:
        """The form's name for a field (a task parameter: 'task parameter P')."""
        if fid is None:
            return ".".join(str(p) for p in loc if p not in ("str", "ModelChoice")) or "profile"
        if fid.startswith("param-"):
            return f"task parameter {fid.removeprefix('param-')}"
        return LABELS.get(fid, fid.replace("_", " "))

    def _set_error(self, fid: str, msg: str) -> None:
        hits = self.query(f"#err-{fid}")
        if hits:
            self._error_text(hits.first(Static), msg)

    @staticmethod
    def _error_text(w: Static, msg: str) -> None:
        # touched only when it changes: as the user types, most messages stay as they are
        if set_text(w, Text(msg)) and w.display != bool(msg):
            w.display = bool(msg)

    def _show_errors(self, errors: dict[str, str], general: list[str], focus: bool = True) -> None:
        for w in self.query(".field-error"):
            self._error_text(w, errors.get(w.id.removeprefix("err-"), ""))
        # the status box: every problem once, in the form's order
        order = [w.id for w in self.query("Input, Select, ModelPicker, Switch")]
        ranked = sorted(errors, key=lambda f: order.index(f) if f in order else len(order))
        lines = [errors[f] for f in ranked] + general
        self._errors_shown = bool(lines)
        if lines:
            self.set_status("Cannot use this profile:\n" + "\n".join(f"• {x}" for x in lines), bad=True)
            first = next((w for w in self.query("Input, Select, ModelPicker") if w.id in errors), None)
            if focus and first is not None:
                first.focus()
        else:
            self.set_status("")

    def set_status(self, text: str, bad: bool = False) -> None:
        status = self.query_one("#form-status", Static)
        status.set_class(bad, "bad")
        set_text(status, Text(text))
        if status.display != bool(text):
            status.display = bool(text)

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
        budget = str(t.epochs if kind == "epochs" else t.steps)
        self.query_one("#budget_kind", Select).value = kind
        self.query_one("#budget", Input).value = budget
        # the profile's own eval_every stays: only a value equal to the budget's default
        # follows later budget edits
        self._eval_auto = default_eval_every(kind, budget) or self._eval_auto
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
        self._show_errors({}, [], focus=False)

    # ------------------------------------------------------------------ actions
    def _remember(self, path: Path) -> None:
        self.last_path = Path(path).expanduser().resolve()
        if self.state_dir is not None:
            paths.remember(self.state_dir, profile_path=str(self.last_path))

    def save_default(self, name: str) -> Path:
        """Where the save dialog starts: the folder of the last profile saved or loaded
        (this file itself when it has this name), else the profiles folder; absolute."""
        if self.last_path is not None:
            if self.last_path.stem == name:
                return self.last_path
            return self.last_path.parent / f"{name}.toml"
        return self.profiles_dir.expanduser().resolve() / f"{name}.toml"

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
            self._remember(written)
            self.set_status(f"saved {Path(written).resolve()}")
            self.notify(f"saved {Path(written).resolve()}", markup=False)

        self.app.push_screen(PathScreen("Save profile to", str(self.save_default(prof.name))), done)

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
            self._remember(path)
            self.set_status(f"loaded {Path(path).resolve()}")

        folder = self.last_path.parent if self.last_path is not None else \
            self.profiles_dir.expanduser().resolve()
        self.app.push_screen(PathScreen("Load profile from", str(folder) + "/", browse=folder), done)

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


class _Columns(VerticalScroll, can_focus=False):
    """The form's two columns side by side (wide terminals; app.tcss switches the layout)
    or one under the other, scrolling as one (narrow terminals)."""


# ---------------------------------------------------------------------------- fields
TRAIN_FIELD_IDS = {fid for fid, *_ in TRAIN_INPUTS}
# the form's names for its fields, used in messages
LABELS: dict[str, str] = {
    "name": "name", "description": "description", "models": "models", "model_options": "model options",
    "task": "task", "seq_lens": "sequence lengths", "seeds": "seeds", "budget": "train for",
    "grid_lr": "lr grid", "grid_wd": "weight decay grid", "grid_axes": "grid axes",
    "schedule": "lr schedule", "amp": "mixed precision", "es_metric": "early stop on",
    "patience": "patience", "device": "device", "executor": "executor", "slurm": "Slurm settings",
    **{fid: label for fid, label, *_ in TRAIN_INPUTS},
}
EXAMPLES = {fid: default for fid, _, _, default in TRAIN_INPUTS} | {"seeds": "0, 1, 2"}
ALIASES = {"budget_kind": "budget"}  # fields whose messages show under another's


def field_for(loc: tuple) -> str | None:
    """The form field a profile key path is about (a pydantic error's ``loc`` or a key of
    the TOML the form writes), or None when no field shows it."""
    keys = [p for p in loc if isinstance(p, str) and p not in ("str", "ModelChoice")]
    if not keys:
        return None
    head, sub = keys[0], keys[1] if len(keys) > 1 else ""
    if head in ("name", "description", "executor", "slurm"):
        return head
    if head == "sweep":
        if sub == "grid":
            key = keys[2] if len(keys) > 2 else ""
            return next((f for f, k in GRID_INPUTS.items() if k == key), "grid_axes")
        return sub if sub in ("models", "seq_lens", "seeds") else None
    if head in ("task", "tasks"):
        return "task" if sub in ("", "name") else f"param-{sub}"
    if head == "model":
        return sub if sub in ("d_model", "n_layers") else "model_options" if sub == "options" else None
    if head == "train":
        if sub in ("", "epochs", "steps"):
            return "budget"  # "give exactly one of epochs or steps" is a train-level error
        if sub == "early_stopping":
            return {"metric": "es_metric"}.get(keys[2] if len(keys) > 2 else "", "patience")
        if sub in TRAIN_FIELD_IDS or sub in ("schedule", "amp", "device"):
            return sub
    return None
