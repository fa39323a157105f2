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

from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.timer import Timer
from textual.suggester import SuggestFromList
from textual.widget import Widget
from textual.widgets import Input, Label, Select, Static, Switch

import tasks
from workbench.spec import profile as profiles
from workbench.spec.profile import Profile
from workbench.tui import paths
from workbench.tui.form_checks import (plain_message, registry_problems,
                                       run_count_text)
from workbench.tui.form_fields import (ALIASES, BUDGET_KINDS, DEFAULT_BUDGET, DEFAULT_LENGTHS, EXAMPLES, LABELS,
                                       MATCH_KINDS, SHARDING_KINDS, STEP_KINDS, TRAIN_INPUTS, UNITS, _fmt, default_eval_every, field_for,
                                       required_params, task_cpu_note, task_param_defaults,
                                       task_train_defaults)
from workbench.tui.form_fields import PARAM_SUGGESTIONS, PARAM_UNITS
from workbench.tui.form_fields import FormInput, now, put
from workbench.tui.form_launch import FormLaunch
from workbench.tui.form_live import FormLive
from workbench.tui.form_match import FormMatch
from workbench.tui.form_presets import RECIPE_OPTIONS, SIZE_OPTIONS, FormPresets
from workbench.tui.form_profile import FormProfile
from workbench.tui.formatting import set_text
from workbench.tui.model_picker import ModelPicker
from workbench.tui.model_options import ModelOptions

DEFAULT_NAME = "sweep"  # the name field's starting value: never launched under (a fresh one is proposed)
RECHECK_S = 0.25  # after a failed save/launch, the form is checked again this long after typing stops


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


class SweepForm(FormLaunch, FormLive, FormMatch, FormPresets, FormProfile, Vertical):
    """The sweep form. Posts :class:`Launch` with a validated profile; saves/loads itself.

    Wide terminals show two columns (models on the left; task, sweep and training settings
    on the right), narrow ones a single scrolling column; the status box with the
    problems of the last save/launch stays at the bottom either way."""

    BINDINGS = [
        Binding("ctrl+s", "save", "Save", tooltip="Save the profile (TOML)"),
        Binding("ctrl+o", "load", "Load", tooltip="Load a profile into the form"),
        Binding("ctrl+r", "launch", "Launch", tooltip="Launch the sweep"),
        Binding("ctrl+q", "app.quit", "Quit", tooltip="Quit (runs go on)"),
        # the focus moves as the key arrives (a priority binding runs in the app's key
        # order): the Screen's own Tab binding ran only once the key had bubbled up, so the
        # keys typed right after a Tab went to the field being left (issue 42 item 3)
        Binding("tab", "app.focus_next", "Next field", show=False, priority=True),
        Binding("shift+tab", "app.focus_previous", "Previous field", show=False, priority=True),
    ]

    class Launch(Message):
        def __init__(self, profile: Profile) -> None:
            super().__init__()
            self.profile = profile

    class EvalProfileLoaded(Message):
        """ctrl+o read an evaluation profile (``absent``: the data it needs that is absent
        here): the app puts it in the evaluation form."""

        def __init__(self, path: Path, profile: profiles.EvalProfile, absent: str = "") -> None:
            super().__init__()
            self.path, self.profile, self.absent = path, profile, absent

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
        self._need_data = True  # the last check was a launch's (absent data is a problem)
        self._recheck_timer: Timer | None = None
        self._left_shown: set[str] = set()  # fields showing the problem found as they were left
        self._preset_init()
        self._param_error: str | None = None  # the parameter field showing the task's build error
        # a token / FLOP budget's steps per run (None: a step or epoch budget, or not known)
        self._budget_steps: list[int] | None = None
        self._budget_timer: Timer | None = None
        self._budget_seq = 0  # counts run in threads: only the latest one's answer is shown
        self._eval_auto = default_eval_every("steps", DEFAULT_BUDGET)
        # fields the form filled itself (budget, learning rate, model options: the task's
        # defaults) and what it put there: they follow the task until the user types their own
        self._auto: dict[str, str] = task_train_defaults("")
        self._built: dict[tuple, str | None] = {}  # (task, params, length) -> build error
        self._match_timer: Timer | None = None  # [sweep.match] solved after typing pauses (FormMatch)
        self._match_seq = 0  # only the latest solve's answer is shown
        self._gpus: list[str] | None = None  # this machine's GPU ids, read when first needed
        # the name field's value while the form chose it (the default, then the name it
        # proposed at a launch): such a name follows the sweep; a typed or loaded one is the
        # user's (None), and a launch into it asks when the store holds another sweep there
        self._auto_name: str | None = DEFAULT_NAME
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
                yield FieldRow("name", FormInput(DEFAULT_NAME, id="name", compact=True), "name")
                yield FieldRow("description", FormInput("", id="description", compact=True), "description")
                yield Static("Models (type to filter; space picks)", classes="section")
                yield ModelPicker(id="models")
                yield ModelOptions(id="models-options")  # the picked models' options
                yield Static("", id="err-models", classes="field-error")
                yield FieldRow("model options", FormInput("", id="model_options", compact=True,
                                                      placeholder="e.g. transformer.pos=rope"),
                               "model_options")
            with _RightColumn(id="form-right", classes="form-column"):
                yield Static("Task", classes="section")
                yield FieldRow("task", Select([(n, n) for n in task_names], id="task", allow_blank=False,
                                              value=first, compact=True), "task")
                yield Static("", id="task-desc", classes="hint")
                yield Static("", id="task-note", classes="hint")
                yield Vertical(id="task-params")
                yield Static("Sweep", classes="section")
                yield FieldRow("sequence lengths", FormInput(DEFAULT_LENGTHS, id="seq_lens", compact=True,
                                                         placeholder="e.g. 64, 256"), "seq_lens",
                               unit="tokens")
                yield FieldRow("seeds", FormInput("0", id="seeds", compact=True, placeholder="e.g. 0, 1, 2"),
                               "seeds")
                # [sweep.match]: every model solved to one size; the values solved, per model
                yield FieldRow("match size", FormInput("", id="match_value", compact=True, placeholder="off (e.g. 1M)"),
                               "match_value", unit=Select(MATCH_KINDS, id="match_kind", allow_blank=False,
                                                          value="params", compact=True))
                yield Static("", id="match-solved", classes="hint")
                yield Static("", id="run-count")
                yield Static("Training", classes="section")
                yield FieldRow("train for", FormInput(DEFAULT_BUDGET, id="budget", compact=True), "budget",
                               unit=Select(BUDGET_KINDS, id="budget_kind", allow_blank=False, value="steps",
                                           compact=True))
                # a token / FLOP / tokens-per-parameter budget: the steps it becomes per run
                yield Static("", id="budget-steps", classes="hint")
                # presets (workbench/spec/recipes.py): they fill the fields left empty
                yield FieldRow("size preset", Select(SIZE_OPTIONS, id="size", allow_blank=False, value="none",
                                                     compact=True), "size", unit="d_model, layers, lr")
                yield FieldRow("recipe", Select(RECIPE_OPTIONS, id="recipe", allow_blank=False, value="none",
                                                compact=True), "recipe", unit="optimizer settings")
                for fid, label, _, default in TRAIN_INPUTS:
                    if fid == "eval_every":
                        default = self._eval_auto
                    yield FieldRow(label, FormInput(default, id=fid, compact=True), fid, unit=UNITS.get(fid))
                # [sweep.grid] axes: each value list multiplies the runs (empty: no grid)
                yield FieldRow("lr grid", FormInput("", id="grid_lr", compact=True,
                                                placeholder="e.g. 1e-4, 5e-4, 1e-3"), "grid_lr",
                               unit="a run per value")
                yield FieldRow("weight decay grid", FormInput("", id="grid_wd", compact=True,
                                                          placeholder="e.g. 0, 0.01, 0.1"), "grid_wd")
                yield FieldRow("other grid axes", FormInput("", id="grid_axes", compact=True,
                                                        placeholder="e.g. model.d_model = 64, 128"),
                               "grid_axes", unit="key = values; ...")
                yield FieldRow("lr schedule", Select([("cosine", "cosine"), ("constant", "constant")],
                                                     id="schedule", allow_blank=False, value="cosine",
                                                     compact=True), "schedule")
                yield FieldRow("mixed precision", Switch(False, id="amp"), "amp")
                yield FieldRow("early stop on", Select([("eval accuracy", "accuracy"), ("eval loss", "loss")],
                                                       id="es_metric", allow_blank=False, value="accuracy",
                                                       compact=True), "es_metric")
                yield FieldRow("patience", FormInput("0", id="patience", compact=True), "patience",
                               unit="evaluations (0 = off)")
                yield FieldRow("device", Select([(d, d) for d in ("auto", "cpu", "cuda")], id="device",
                                                allow_blank=False, value="auto", compact=True), "device")
                # ranks a run trains on (train.devices) and how they hold the model (train.sharding)
                yield FieldRow("devices", FormInput("", id="devices", compact=True, placeholder="1"), "devices",
                               unit=Select(SHARDING_KINDS, id="sharding", allow_blank=False, value="ddp",
                                           compact=True))
                yield Static("", id="devices-note", classes="hint")  # what N ranks mean on this machine
                yield Static("Where", classes="section")
                yield FieldRow("executor", Select([("this machine", "local"), ("Slurm: a job per run", "slurm")],
                                                  id="executor", allow_blank=False, value="local",
                                                  compact=True), "executor")
                yield FieldRow("Slurm settings", FormInput("", id="slurm", compact=True,
                                                       placeholder="partition=gpu, time=04:00:00"), "slurm")
                yield Static("#SBATCH settings as key=value: partition, account, qos, time, gpus_per_run, "
                             "cpus_per_run, mem, extra=[...], signal_s, requeue, shared_dir, setup=[...]",
                             classes="hint")
        # outside the scrolling columns: always in view when a save or launch fails
        yield Static("", id="form-status")

    async def on_mount(self) -> None:
        await self._show_task(self.query_one("#task", Select).value)
        self._apply_task_training(str(self.query_one("#task", Select).value), now())
        for hint in ("#budget-steps", "#match-solved", "#devices-note"):
            self.query_one(hint, Static).display = False
        self._show_run_count()
        self._show_eval_unit()
        self.set_status("")

    @on(ModelPicker.Changed, "#models")
    def _show_model_options(self, event: ModelPicker.Changed) -> None:
        self.query_one("#models-options", ModelOptions).show(event.picker.picked)

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
            self._show_param_problem()

    # ------------------------------------------------------------------ units and defaults
    @on(Input.Changed, "#budget")
    @on(Select.Changed, "#budget_kind")
    def _budget_changed(self, event: Message) -> None:
        """'evaluate every' follows the budget (about EVALS_PER_RUN evaluations a run)
        until the user types a value of their own. A budget in tokens, FLOPs or tokens per
        parameter is followed once its steps are known (:meth:`_show_budget_steps`)."""
        self._follow_eval(default_eval_every(str(self._select("budget_kind")), self._text("budget")), event.time)
        self._show_eval_unit()

    def _follow_eval(self, auto: str | None, since: float) -> None:
        """'evaluate every' to ``auto`` where it holds the form's value or nothing, and
        has not been edited since ``since`` (when the change it follows happened:
        form_fields.put; a cleared field being retyped keeps what is typed)."""
        field = self.query_one("#eval_every", Input)
        if (auto is not None and field.value.strip() in ("", self._eval_auto)
                and not put(field, auto, since)):
            return  # typed since: the user's value, not the form's any more
        if auto is not None:
            self._eval_auto = auto

    @on(Input.Changed, "#eval_every")
    def _show_eval_unit(self) -> None:
        """'steps, N evals' (or epochs) beside "evaluate every"; with a token or FLOP budget
        the count is of the shortest run's steps, once known."""
        kind = str(self._select("budget_kind"))
        unit = "epochs" if kind == "epochs" else "steps"
        steps: int | None = None
        if kind in STEP_KINDS:
            try:
                steps = int(self._text("budget"))
            except ValueError:
                pass
        elif self._budget_steps:
            steps = min(self._budget_steps)
        text = unit
        try:
            every = int(self._text("eval_every"))
        except ValueError:
            every = 0
        if every > 0 and steps is not None and steps > 0:
            n = steps // every
            shortest = " (shortest run)" if kind not in STEP_KINDS and len(set(self._budget_steps)) > 1 else ""
            text = f"{unit}, {n} eval{'' if n == 1 else 's'}{shortest}"
        self.query_one("#unit-eval_every", Static).update(text)

    @on(Select.Changed, "#recipe")
    @on(Select.Changed, "#size")
    @on(Input.Changed, "#match_value")
    def _presets_changed(self, event: Message) -> None:
        self.preset_changed(event.time)  # (FormPresets: a plain mixin, whose @on handlers Textual would not see)

    @on(Input.Changed, "#devices")
    @on(Select.Changed, "#sharding")
    @on(Select.Changed, "#executor")
    def _devices_changed(self) -> None:
        self.devices_note()  # (FormMatch)

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
        if not (isinstance(event, Input.Changed) and event.input.id in ("name", "description", "eval_every")):
            self._schedule_budget_steps()
            self.schedule_match()
        if self._errors_shown or self._left_shown:
            # once typing pauses: a full check (the registry's too) takes 50-200 ms
            if self._recheck_timer is not None:
                self._recheck_timer.stop()
            self._recheck_timer = self.set_timer(RECHECK_S, self._recheck_now)

    def _recheck_now(self) -> None:
        self._recheck_timer = None
        if self._select("task") != self._params_task:
            return  # (a new task's inputs: after _task_changed)
        if self._errors_shown:
            self.build_profile(focus=False)
        elif self._left_shown:  # a problem shown as its field was left follows the form: it
            # goes once corrected, there or in another field (its unit), and never names a
            # value the field no longer holds
            _, errors, _ = self._problems(need_data=False, registry=False)
            for fid in list(self._left_shown):
                self._set_error(fid, errors.get(fid, ""))
                if not errors.get(fid):
                    self._left_shown.discard(fid)

    # ------------------------------------------------------------------ task parameters
    @on(Select.Changed, "#task")
    async def _task_changed(self, event: Select.Changed) -> None:
        if event.value != self._params_task and event.value is not Select.NULL:
            if self._auto_name is not None and self._text("name") == self._auto_name:
                # a name the form chose follows the task (made free of other sweeps at the launch)
                from workbench.spec.sweep_identity import name_base

                if put(self.query_one("#name", Input), name_base(str(event.value)), event.time):
                    self._auto_name = name_base(str(event.value))
            await self._show_task(str(event.value), since=event.time)
            self._apply_task_training(str(event.value), event.time)
            self._show_run_count()
            self._recheck()

    def _apply_task_training(self, name: str, since: float | None = None) -> None:
        """The task's budget, learning rate, model options and lengths
        (:func:`task_train_defaults`) into the fields that still hold what the form put
        there itself and were not edited since ``since`` (the task's change); a value the
        user typed stays."""
        since = now() if since is None else since
        self.es_metric_follows(name)  # (FormPresets: lm stops early on eval loss)
        for fid, value in task_train_defaults(name).items():
            if fid == "budget" and self._select("budget_kind") != "steps":
                continue
            field = self.query_one(f"#{fid}", Input)
            if fid in self._auto and field.value.strip() == self._auto[fid] and put(field, value, since):
                self._auto[fid] = value
                if fid == "budget":  # "evaluate every" follows now, not on the Changed event
                    self._follow_eval(default_eval_every("steps", value), since)

    async def _show_task(self, name: str, values: dict[str, Any] | None = None,
                         since: float | None = None) -> None:
        """Generate one input per task parameter (seq_len comes from the sweep's lengths),
        holding ``values`` (a loaded profile's) or else the form's starting values for the
        task (:func:`task_param_defaults`), the registry's for the others. ``since``: when
        the task changed; what was typed after it into a parameter the new task also has
        is kept (the inputs are built anew, and a late rebuild must not drop keys).
        ``_params_task`` names the task only once its inputs are mounted: handlers that run
        while they are rebuilt (a field left, a re-check) see None and wait for them."""
        self._params_task = None
        self.query_one("#task-desc", Static).update(Text(tasks.describe(name)))
        note = self.query_one("#task-note", Static)  # defaults that will not learn on a CPU say so
        note.update(Text(task_cpu_note(name)))
        note.display = bool(task_cpu_note(name))
        box = self.query_one("#task-params", Vertical)
        typed = {} if since is None else {
            w.id.removeprefix("param-"): w.value for w in box.query(Input)
            if w.id and getattr(w, "changed_at", 0.0) > since}
        refocus = next((w.id for w in box.query(Input) if w.has_focus), None)
        await box.remove_children()
        values = task_param_defaults(name) if values is None else values
        required = required_params(name)
        rows = []
        for p, default in tasks.parameters(name).items():
            if p == "seq_len":
                continue
            text = typed[p] if p in typed else _fmt(values.get(p, default))
            hint = ("required" if p in required else "not set" if default is None
                    else f"default {_fmt(default)}")
            offered = PARAM_SUGGESTIONS.get((name, p))
            suggester = SuggestFromList(offered, case_sensitive=False) if offered else None
            rows.append(FieldRow(f"  {p}", FormInput(text, id=f"param-{p}", compact=True, placeholder=hint,
                                                 suggester=suggester),
                                 f"param-{p}", unit=PARAM_UNITS.get((name, p))))
        await box.mount_all(rows)
        self._params_task = name
        if refocus is not None and box.query(f"#{refocus}"):
            box.query_one(f"#{refocus}").focus()  # the same parameter keeps the keys coming

    def build_profile(self, focus: bool = True, need_data: bool | None = None) -> Profile | None:
        """Validate the form; show every problem next to its field (and all of them in
        the status box) and return None, or return the profile. ``focus``: take the user
        to the first field that needs fixing (not while re-checking as they type).
        ``need_data``: whether absent [[needs]] paths are problems (launch: yes; save: no;
        None: as the last save or launch, for the re-checks as the user types)."""
        if need_data is None:
            need_data = self._need_data
        self._need_data = need_data
        if self._select("task") != self._params_task:
            return None  # the new task's parameter inputs are being built (_task_changed)
        prof, errors, general = self._problems(need_data)
        self._show_errors(errors, general, focus)
        return prof

    def _problems(self, need_data: bool, registry: bool = True
                  ) -> tuple[Profile | None, dict[str, str], list[str]]:
        """(the profile or None, each field's problems, the problems of no one field):
        the schema's, the lengths' and (``registry``, once the schema passes) the
        registry's, as the loader checks them."""
        data, errors = self.form_data()
        general: list[str] = []
        unread = set(errors)  # fields whose value could not be read: the schema's word on its
        # absence ('give exactly one of train.epochs or ...') follows from that, not said again

        def add(fid: str | None, msg: str) -> None:
            fid = ALIASES.get(fid, fid)
            if fid in unread:
                return
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
        if registry and prof is not None and not errors and not general:
            # the registry checks (model/task names, options) the loader applies
            problems = registry_problems(prof, need_data)
            for loc, msg in problems:
                add(field_for(loc) if loc else None, msg)
            if problems:
                prof = None
        return (prof if not errors and not general else None), errors, general

    # ------------------------------------------------------------------ focus
    def on_descendant_focus(self, event) -> None:
        """The focused field's whole row (its message line included) scrolled into view,
        in the pane that holds it (issue 42 item 4: at 80x24 the focus went off-screen)."""
        self.call_after_refresh(self._show_focus)
        # and once more when the keys typed behind a burst of Tabs have been laid out (a
        # message line shown or hidden meanwhile moves the rows)
        self.set_timer(0.1, self._show_focus)

    def _show_focus(self) -> None:
        """Scroll the field that has the focus now (not the one a late event names) into view."""
        w = self.app.focused
        if w is None or self not in w.ancestors:
            return
        row = next((a for a in w.ancestors if isinstance(a, FieldRow)), None)
        (row if row is not None else w).scroll_visible(animate=False)

    @on(Input.Blurred)
    def _field_left(self, event: Input.Blurred) -> None:
        """A field's problem shown as it is left (not only at save): the schema's and the
        lengths' checks of the whole form, shown under this field only (the others keep
        theirs until they are left, saved or corrected)."""
        fid = ALIASES.get(event.input.id, event.input.id) if event.input.id else None
        if fid is None or not self.is_attached or not self.query(f"#err-{fid}") \
                or self._select("task") != self._params_task:
            return
        _, errors, _ = self._problems(need_data=False, registry=False)
        self._set_error(fid, errors.get(fid, ""))
        (self._left_shown.add if errors.get(fid) else self._left_shown.discard)(fid)
        if fid == "grid_axes" and not errors.get(fid):
            self._show_param_problem()  # (FormLive: a grid point the task cannot build)

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
            w = hits.first(Static)
            shown = w.display
            self._error_text(w, msg)
            # a message appearing under the field being typed in: onto the screen with it
            if msg and not shown and isinstance(w.parent, FieldRow) and w.parent.has_focus_within:
                self.call_after_refresh(w.parent.scroll_visible, animate=False)

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
                # focus scrolls the control into view; its message is on the lines below
                row = next((a for a in first.ancestors if isinstance(a, FieldRow)), None)
                if row is not None:
                    self.call_after_refresh(row.scroll_visible, animate=False)
        else:
            self.set_status("")

    def set_status(self, text: str, bad: bool = False) -> None:
        status = self.query_one("#form-status", Static)
        status.set_class(bad, "bad")
        set_text(status, Text(text))
        if status.display != bool(text):
            status.display = bool(text)


class _RightColumn(VerticalScroll, can_focus=False):
    """The right column (wide terminals scroll it on its own): no focus stop of its own,
    which Tab would land on unseen (its fields take the focus, and scroll it)."""


class _Columns(VerticalScroll, can_focus=False):
    """The form's two columns side by side (wide terminals; app.tcss switches the layout)
    or one under the other, scrolling as one (narrow terminals)."""
