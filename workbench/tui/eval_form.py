"""The "New eval" form (F4): lm-evaluation-harness tasks on several models, as an evaluation
profile (:class:`~workbench.spec.eval_profile.EvalProfile`, an ``[eval]`` table): fill it,
save it (ctrl+s, a file ``ssm-workbench run FILE`` and ``eval --from FILE`` accept), load
one (ctrl+o; the sweep form hands evaluation profiles over to this form), launch it (ctrl+r).

- models: hub ids (owner/name), ``run:N`` (a finished lm run), local folders, comma-separated;
  ``label=model`` names one (else its label is the model as written); a folder is checked as
  a checkpoint as it is typed (eval_profile.check), a ``run:N`` at launch, before anything is
  queued (eval_queue.preflight: it exists, is an lm run, has finished unless the profile's
  ``allow_unfinished`` asks for its last checkpoint), each refusal a line under the field;
- tasks: lm-eval task, group or tag names, checked as they are typed against lm-eval's own
  names and the include folders' (:mod:`workbench.spec.lm_eval_tasks`) in a thread worker
  (indexing lm-eval's tasks takes seconds the first time; the UI never waits on it); an
  unknown name is shown in red under the field with its closest known names;
- include (task folders), limit, batch size, few-shot examples, dtype, device, executor
  (this machine or a Slurm job per model) and its Slurm settings;
- output folder and log samples: lm-eval's own files per task (its results JSON, and with log
  samples every document's prompt, responses and metrics), as ``eval --output-path DIR
  --log-samples`` writes them; a folder that cannot be one (a file, a path under a file, not
  writable) is said under the field when the field is left.

Each field's problem shows under it as the field is left (:meth:`EvalForm._field_left`), not
only at save. Where the hints do not fit whole beside the fields (at 80 columns none did),
each goes on the line under its field (:class:`EvalRow`, :meth:`EvalForm.on_resize`).

What a loaded profile holds beyond the fields (published numbers, [[needs]], max_length,
seed, ...) is kept, so load -> save writes the same profile. The profile is read and
checked by eval_profile's own model and written by
:func:`~workbench.tui.eval_form_profile.profile_data` (eval_profile has no serialiser: this
is the smallest one, a ``model_dump`` without the empty tables; eval_form_profile.py).
A launch queues the runs as ``eval --from FILE``
does (:func:`queue_evals`: workbench/execute/eval_queue.py) in a worker; the app then shows them in
the Runs tab.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Input, Label, Select, Static, Switch

from workbench.spec import eval_profile, lm_eval_tasks
from workbench.spec.eval_profile import EvalProfile
from workbench.spec.profile import DataAbsent, ProfileError
from workbench.spec.schema import FROM_FILE, SCHEMA_VERSION
from workbench.tui.eval_form_profile import (
    format_models, output_problem, parse_models, problem_lines, profile_data, queue_evals, save_profile)
from workbench.tui.form_fields import FormInput, format_settings, parse_settings, split_list
from workbench.tui.formatting import id_ranges, set_text
from workbench.tui.sweep_form import FieldRow

CHECK_S = 0.3  # task names are checked this long after typing stops
DTYPES = ("float32", "bfloat16", "float16")
# the profile's keys -> the form's field ids (pydantic's error locations)
FIELD_OF = {("name",): "ev-name", ("description",): "ev-description", ("eval", "models"): "ev-models",
            ("eval", "tasks"): "ev-tasks", ("eval", "include"): "ev-include", ("eval", "limit"): "ev-limit",
            ("eval", "batch_size"): "ev-batch", ("eval", "num_fewshot"): "ev-fewshot",
            ("eval", "dtype"): "ev-dtype", ("eval", "device"): "ev-device", ("eval", "devices"): "ev-devices",
            ("eval", "output_path"): "ev-output", ("eval", "log_samples"): "ev-log-samples",
            ("executor",): "ev-executor", ("slurm",): "ev-slurm"}


class EvalRow(FieldRow):
    """A form row whose hint (``unit``) sits beside the field, or on the line under it where
    the form has the ``-hints-under`` class (eval_form.tcss: at 80 columns a 60-column
    field left no room beside it, and the hints were gone)."""

    def compose(self) -> ComposeResult:
        with Horizontal(classes="field-line"):
            yield Label(self._label, classes="field-label")
            yield self._control
            if self._unit is not None:
                yield Static(self._unit, id=f"unit-{self.field_id}", classes="field-unit")
        if self._unit is not None:
            yield Static(self._unit, id=f"hint-{self.field_id}", classes="field-hint")
        yield Static("", id=f"err-{self.field_id}", classes="field-error")


class EvalForm(Vertical):
    """The evaluation form (F4): lm-eval tasks on models; saves, loads and launches an
    evaluation profile."""

    BINDINGS = [
        Binding("ctrl+s", "save", "Save", tooltip="Save the evaluation profile (TOML)"),
        Binding("ctrl+o", "load", "Load", tooltip="Load an evaluation profile into the form"),
        Binding("ctrl+r", "launch", "Launch", tooltip="Queue the evaluation runs (one per model)"),
        Binding("ctrl+q", "app.quit", "Quit", tooltip="Quit (runs go on)"),
        # the focus moves as the key arrives, so keys typed right after a Tab go to the next
        # field (as in the sweep form: the Screen's binding ran once the Tab had bubbled up)
        Binding("tab", "app.focus_next", "Next field", show=False, priority=True),
        Binding("shift+tab", "app.focus_previous", "Previous field", show=False, priority=True),
    ]

    class Queued(Message):
        """Evaluation runs ``ids`` were queued (the app shows them in the Runs tab)."""

        def __init__(self, ids: list[int]) -> None:
            super().__init__()
            self.ids = ids

    def __init__(self, profiles_dir: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.profiles_dir = Path(profiles_dir)
        self.last_path: Path | None = None
        self._base: dict[str, Any] = {}  # a loaded profile's data: what the form has no field for
        self._check_timer: Timer | None = None
        self._check_seq = 0  # only the latest check's answer is shown
        # (tasks, include) -> their unknown names with the closest ones (the last check's)
        self._verdict: tuple[tuple, tuple, dict[str, list[str]]] | None = None
        self._errors_shown = False

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="eval-fields"):
            yield Static("Evaluation profile", classes="section")
            yield EvalRow("name", FormInput("eval", id="ev-name", compact=True), "ev-name")
            yield EvalRow("description", FormInput("", id="ev-description", compact=True), "ev-description")
            yield Static("Models and tasks", classes="section")
            yield EvalRow("models", FormInput("", id="ev-models", compact=True,
                                           placeholder="owner/name, run:12, ./folder"), "ev-models",
                           unit="comma-separated; label=model names one")
            yield EvalRow("tasks", FormInput("", id="ev-tasks", compact=True,
                                          placeholder="lambada_openai, hellaswag"), "ev-tasks",
                           unit="lm-eval tasks, groups or tags")
            yield Static("", id="ev-tasks-check", classes="hint")
            yield EvalRow("include", FormInput("", id="ev-include", compact=True, placeholder="none"),
                           "ev-include", unit="folders of your own task YAML files")
            yield Static("Settings", classes="section")
            yield EvalRow("limit", FormInput("", id="ev-limit", compact=True, placeholder="all documents"),
                           "ev-limit", unit="documents per task (a fraction if < 1)")
            yield EvalRow("batch size", FormInput("8", id="ev-batch", compact=True), "ev-batch")
            yield EvalRow("few-shot examples", FormInput("", id="ev-fewshot", compact=True,
                                                      placeholder="the task's own"), "ev-fewshot")
            yield EvalRow("dtype", Select([(d, d) for d in DTYPES], id="ev-dtype", allow_blank=False,
                                           value="float32", compact=True), "ev-dtype")
            yield EvalRow("device", Select([(d, d) for d in ("auto", "cpu", "cuda")], id="ev-device",
                                            allow_blank=False, value="auto", compact=True), "ev-device")
            yield EvalRow("devices", FormInput("1", id="ev-devices", compact=True), "ev-devices",
                           unit="ranks, one process each; lm-eval splits the documents")
            yield Static("Output", classes="section")
            yield EvalRow("output folder", FormInput("", id="ev-output", compact=True, placeholder="none"),
                          "ev-output", unit="lm-eval's results JSON per task here (--output-path)")
            yield EvalRow("log samples", Switch(False, id="ev-log-samples"), "ev-log-samples",
                          unit="and every document's prompt and answers (--log-samples)")
            yield Static("Where", classes="section")
            yield EvalRow("executor", Select([("this machine", "local"), ("Slurm: a job per model", "slurm")],
                                              id="ev-executor", allow_blank=False, value="local", compact=True),
                           "ev-executor")
            yield EvalRow("Slurm settings", FormInput("", id="ev-slurm", compact=True,
                                                   placeholder="partition=gpu, time=02:00:00"), "ev-slurm",
                           unit="key=value; an evaluation uses one device")
        yield Static("", id="eval-status")

    def on_mount(self) -> None:
        self.query_one("#ev-tasks-check", Static).display = False
        self.set_status("")

    def on_resize(self) -> None:
        """Hints beside their fields where every one fits whole (label 22, field 60, a space),
        else each on the line under its field (eval_form.tcss): never cut off."""
        longest = max((len(row._unit) for row in self.query(EvalRow) if isinstance(row._unit, str)), default=0)
        self.set_class(self.size.width < 22 + 60 + 2 + longest, "-hints-under")

    # ------------------------------------------------------------------ reading the form
    def _text(self, fid: str) -> str:
        return self.query_one(f"#{fid}", Input).value.strip()

    def _select(self, fid: str) -> str:
        return str(self.query_one(f"#{fid}", Select).value)

    def form_data(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The profile's data from the fields over a loaded profile's, and the errors found
        before pydantic (numbers that are none, settings that do not parse) by field id."""
        errors: dict[str, str] = {}
        data = copy.deepcopy(self._base) or {"schema_version": SCHEMA_VERSION}
        ev = data.setdefault("eval", {})
        data["name"] = self._text("ev-name")
        data["description"] = self._text("ev-description")
        ev["models"] = parse_models(self._text("ev-models"))
        ev["tasks"] = split_list(self._text("ev-tasks"))
        ev["include"] = split_list(self._text("ev-include"))
        numbers = (("ev-limit", "limit", float, "a number > 0, e.g. 100 (documents) or 0.1 (a fraction)"),
                   ("ev-batch", "batch_size", int, "a whole number > 0, e.g. 8"),
                   ("ev-devices", "devices", int, "a whole number > 0, e.g. 2"),
                   ("ev-fewshot", "num_fewshot", int, "a whole number >= 0, or empty for the task's own"))
        for fid, key, kind, want in numbers:
            text = self._text(fid)
            ev.pop(key, None)
            if not text:
                continue
            try:
                value = kind(text)
            except ValueError:
                errors[fid] = f"{key.replace('_', ' ')}: {text!r} is not {want}"
                continue
            ev[key] = int(value) if kind is float and value.is_integer() else value
        ev["dtype"], ev["device"] = self._select("ev-dtype"), self._select("ev-device")
        ev.pop("output_path", None)
        if self._text("ev-output"):
            ev["output_path"] = self._text("ev-output")
            if output_problem(ev["output_path"]):
                errors["ev-output"] = output_problem(ev["output_path"])
        ev["log_samples"] = self.query_one("#ev-log-samples", Switch).value
        if ev["log_samples"] and not ev.get("output_path"):  # (as eval_profile says it, in the form's words)
            errors["ev-log-samples"] = "log samples writes lm-eval's per-document files into the output folder: give one"
        data["executor"] = self._select("ev-executor")
        try:
            data["slurm"] = parse_settings(self._text("ev-slurm"))
        except ValueError as e:
            errors["ev-slurm"] = f"Slurm settings: {e}"
            data.pop("slurm", None)
        return data, errors

    def build_profile(self, focus: bool = True) -> EvalProfile | None:
        """Validate the form as eval_profile does a file; show each problem in red under its
        field (and all in the status box) and return None, or return the profile."""
        prof, errors, general = self._problems()
        self._errors_shown = bool(errors or general)
        self._show_errors(errors, general, focus)
        return prof

    def _problems(self, refs: bool = True) -> tuple[EvalProfile | None, dict[str, str], list[str]]:
        """The profile (None when refused), the problems by field id and those of no field.
        ``refs``: also eval_profile.check's (model references, include folders)."""
        data, errors = self.form_data()
        general: list[str] = []

        def add(fid: str | None, msg: str) -> None:
            if fid is None or not self.query(f"#err-{fid}"):
                general.append(msg)
            elif msg not in errors.get(fid, ""):
                errors[fid] = f"{errors[fid]}; {msg}" if fid in errors else msg

        if not data["eval"]["models"]:
            add("ev-models", "models: give at least one (a hub id owner/name, run:N or a folder)")
        if not data["eval"]["tasks"]:
            add("ev-tasks", "tasks: give at least one lm-eval task, e.g. lambada_openai")
        prof: EvalProfile | None = None
        before = set(errors)  # fields already refused (their value was left out of data)
        try:
            prof = EvalProfile.model_validate(data, context=FROM_FILE)
        except ValidationError as e:
            for err in e.errors():
                loc = tuple(str(x) for x in err["loc"])
                fid = next((FIELD_OF[loc[:n]] for n in (2, 1) if loc[:n] in FIELD_OF), None)
                if fid not in before:
                    add(fid, f"{'.'.join(loc)}: {err['msg']}")
        if errors or general:
            prof = None
        if prof is not None and refs:
            try:
                eval_profile.check(prof, prof.name, lambda *loc: "")  # model references, include folders
            except DataAbsent:
                pass  # hub ids not in the cache (offline): a launch says so, a save keeps them
            except ProfileError as e:
                for fid, msg in problem_lines(e):
                    add(fid, msg)
        verdict = self._verdict
        if verdict is not None and verdict[:2] == (tuple(data["eval"]["tasks"]), tuple(data["eval"]["include"])) \
                and verdict[2]:
            add("ev-tasks", lm_eval_tasks.describe(verdict[2], list(verdict[1])))
        return (prof if not errors and not general else None), errors, general

    def _show_errors(self, errors: dict[str, str], general: list[str], focus: bool) -> None:
        for w in self.query(".field-error"):
            fid = (w.id or "").removeprefix("err-")
            self._set_error(fid, errors.get(fid, ""))
        lines = list(errors.values()) + general
        if lines:
            self.set_status("Cannot use this evaluation profile:\n" + "\n".join(f"• {x}" for x in lines), bad=True)
            first = next((w for w in self.query("Input, Select, Switch") if w.id in errors), None)
            if focus and first is not None:
                first.focus()
        else:
            self.set_status("")

    def _set_error(self, fid: str, msg: str) -> None:
        hits = self.query(f"#err-{fid}")
        if hits:
            w = hits.first(Static)
            if set_text(w, Text(msg)) or w.display != bool(msg):
                w.display = bool(msg)

    def set_status(self, text: str, bad: bool = False) -> None:
        status = self.query_one("#eval-status", Static)
        status.set_class(bad, "bad")
        set_text(status, Text(text))
        status.display = bool(text)

    @on(Input.Changed)
    @on(Select.Changed)
    @on(Switch.Changed)
    def _edited(self) -> None:
        if self._errors_shown:  # after a refused save/launch, each edit checks again
            self.build_profile(focus=False)

    @on(Input.Blurred)
    def _field_left(self, event: Input.Blurred) -> None:
        """A field's problem shown as it is left (a bad output folder, a limit that is no
        number), under that field only: the others keep theirs until they are left, saved or
        corrected. (Model folders and task names are checked as they are typed.)"""
        fid = event.input.id
        if fid and self.is_attached and self.query(f"#err-{fid}") and fid not in ("ev-models", "ev-tasks"):
            self._set_error(fid, self._problems(refs=False)[1].get(fid, ""))

    def on_descendant_focus(self) -> None:
        """The focused field's whole row (its hint and message lines too) scrolled into view."""
        w = self.app.focused
        row = next((a for a in w.ancestors if isinstance(a, FieldRow)), None) if w is not None else None
        if row is not None:
            self.call_after_refresh(row.scroll_visible, animate=False)

    # ------------------------------------------------------------------ the task names, in a worker
    @on(Input.Changed, "#ev-tasks")
    @on(Input.Changed, "#ev-include")
    def _tasks_edited(self) -> None:
        if self._check_timer is not None:
            self._check_timer.stop()
        self._check_timer = self.set_timer(CHECK_S, self.check_tasks_now)

    def _hint(self, text: str) -> None:
        hint = self.query_one("#ev-tasks-check", Static)
        set_text(hint, Text(text))
        hint.display = bool(text)

    def check_tasks_now(self) -> None:
        """Check the task names against lm-eval's and the include folders' (in a thread)."""
        self._check_seq += 1
        tasks, include = split_list(self._text("ev-tasks")), split_list(self._text("ev-include"))
        self._verdict = None
        self._set_error("ev-tasks", "")
        absent = [d for d in include if not Path(d).expanduser().is_dir()]
        # a folder that is not there is said under its field at once, not only at save/launch
        self._set_error("ev-include", f"include: no such folder {', '.join(map(repr, absent))}" if absent else "")
        if not tasks:
            self._hint("")
            return
        why = lm_eval_tasks.skipped()
        if why or absent:
            self._hint(why or f"task names not checked: task folder(s) {', '.join(absent)} absent")
            return
        self._hint("checking the task names...")
        self._check_names(self._check_seq, tuple(tasks), tuple(include))

    @work(thread=True, exclusive=True, group="eval-task-names")
    def _check_names(self, seq: int, tasks: tuple, include: tuple) -> None:
        def announce(line: str) -> None:
            self.app.call_from_thread(lambda: seq == self._check_seq and self._hint(line))

        folders = [str(Path(d).expanduser()) for d in include]
        try:
            unknown, failed = lm_eval_tasks.unknown_tasks(list(tasks), folders, announce), ""
        except Exception as e:  # a broken task YAML: said, not raised in the UI
            unknown, failed = {}, f"task names not checked: {type(e).__name__}: {e}"
        self.app.call_from_thread(self._names_checked, seq, tasks, include, unknown, failed)

    def _names_checked(self, seq: int, tasks: tuple, include: tuple, unknown: dict, failed: str) -> None:
        if seq != self._check_seq:
            return  # the fields changed since: a newer check answers
        self._verdict = None if failed else (tasks, include, unknown)
        if unknown:
            self._hint("")
            self._set_error("ev-tasks", lm_eval_tasks.describe(unknown, [str(d) for d in include]))
        else:
            self._set_error("ev-tasks", "")
            self._hint(failed or f"{len(tasks)} task name{'s' if len(tasks) > 1 else ''} known to lm-eval"
                       + (" or the include folders" if include else ""))

    # ------------------------------------------------------------------ filling the form
    def fill(self, prof: EvalProfile) -> None:
        """Show ``prof`` in the fields; keep the rest of it for the save."""
        self._base = profile_data(prof)
        e = prof.eval
        values = {"ev-name": prof.name, "ev-description": prof.description, "ev-models": format_models(e.models),
                  "ev-tasks": ", ".join(e.tasks), "ev-include": ", ".join(e.include),
                  "ev-limit": "" if e.limit is None else f"{e.limit:g}", "ev-batch": str(e.batch_size),
                  "ev-devices": str(e.devices), "ev-output": e.output_path or "",
                  "ev-fewshot": "" if e.num_fewshot is None else str(e.num_fewshot),
                  "ev-slurm": format_settings(prof.slurm.model_dump(mode="json", exclude_unset=True,
                                                                    exclude_none=True))}
        for fid, value in values.items():
            self.query_one(f"#{fid}", Input).value = value
        for fid, value in (("ev-dtype", e.dtype), ("ev-device", e.device), ("ev-executor", prof.executor)):
            self.query_one(f"#{fid}", Select).value = value
        self.query_one("#ev-log-samples", Switch).value = e.log_samples
        self._errors_shown = False
        self._show_errors({}, [], False)
        self.check_tasks_now()

    def loaded(self, path: Path, prof: EvalProfile, absent: str = "") -> None:
        """``prof`` (read from ``path``) into the form, with a status line saying so."""
        self.fill(prof)
        self.last_path = Path(path).expanduser().resolve()
        self.set_status(f"loaded {self.last_path}" + (
            f"; it needs data that is absent here (fetch it before a launch):\n{absent}" if absent else ""))

    # ------------------------------------------------------------------ actions
    def action_load(self) -> None:
        from workbench.spec import profile as profiles
        from workbench.tui.dialogs import PathScreen

        def done(path: Path | None) -> None:
            if path is None:
                return
            absent = ""
            try:
                try:
                    prof = profiles.load(path)
                except DataAbsent as e:  # valid, and editable: only a launch needs the data
                    prof, absent = e.profile, str(e).split("\n", 1)[1]
                if not isinstance(prof, EvalProfile):
                    raise ProfileError(f"{path} is a training profile (no [eval] table): the sweep form (F2) "
                                       f"loads it")
            except ProfileError as e:
                self.set_status(str(e), bad=True)
                self.notify(str(e), title="cannot load profile", severity="error", markup=False)
                return
            self.loaded(path, prof, absent)

        folder = self.last_path.parent if self.last_path is not None else self.profiles_dir.expanduser().resolve()
        self.app.push_screen(PathScreen("Load evaluation profile from", str(folder) + "/", browse=folder), done)

    def action_save(self) -> None:
        from workbench.tui.dialogs import PathScreen

        prof = self.build_profile()
        if prof is None:
            return

        def done(path: Path | None) -> None:
            if path is None:
                return
            try:
                written = save_profile(prof, path).resolve()
            except OSError as e:
                self.set_status(f"cannot save {path}: {e.strerror}", bad=True)
                return
            self.last_path = written
            self.set_status(f"saved {written}")
            self.notify(f"saved {written}", markup=False)

        folder = self.last_path.parent if self.last_path is not None else self.profiles_dir.expanduser().resolve()
        default = self.last_path if self.last_path is not None and self.last_path.stem == prof.name \
            else folder / f"{prof.name}.toml"
        self.app.push_screen(PathScreen("Save evaluation profile to", str(default)), done)

    def action_launch(self) -> None:
        if lm_eval_tasks.skipped():  # as `eval` and `run FILE`: nothing is queued without lm-eval
            self.set_status(f"not launched: lm-eval is not installed ({lm_eval_tasks.INSTALL})", bad=True)
            return
        prof = self.build_profile()
        if prof is None:
            return
        try:
            eval_profile.check(prof, prof.name, lambda *loc: "")
        except DataAbsent as e:  # as `eval --from FILE`: absent data is refused before a launch
            self.set_status(str(e), bad=True)
            return
        self.set_status(f"checking the task names and queuing {eval_profile.summary(prof)}...")
        self._queue(prof)

    @work(thread=True, group="scheduler")
    def _queue(self, prof: EvalProfile) -> None:
        from workbench.execute import eval_queue
        from workbench.store import Store
        from workbench.train.eval_models import ModelRefError

        def say(text: str, bad: bool = False) -> None:
            self.app.call_from_thread(self.set_status, text, bad)

        store = Store(self.app.store.root)  # own connection: the 2 Hz polls never wait on it
        try:
            eval_profile.check_tasks(prof, f"profile {prof.name}", announce=say)  # as eval --from does
            ids, notes = queue_evals(store, prof)
        except ProfileError as e:  # unknown task names: under the tasks field
            lines = [line.strip().partition(": ")[2] for line in str(e).splitlines()[1:]]
            self.app.call_from_thread(self._refused_tasks, "; ".join(lines) or str(e))
            return
        except (ModelRefError, eval_queue.Refused) as e:  # eval_queue.preflight: a model refused, nothing queued
            self.app.call_from_thread(self._refused_models, str(e).splitlines())
            return
        except Exception as e:  # a failed launch must not take the UI down
            say(f"launch failed: {e}", True)
            return
        finally:
            store.close()
        self.app.call_from_thread(self._queued, prof, ids, notes)

    def _refused_models(self, lines: list[str]) -> None:
        """The models eval_queue.preflight refused (as ``eval`` does): under the models field,
        one line each, and nothing launched."""
        self._set_error("ev-models", "\n".join(lines))
        self.set_status("not launched:\n" + "\n".join(f"• {x}" for x in lines), bad=True)
        self._errors_shown = True

    def _refused_tasks(self, msg: str) -> None:
        self._set_error("ev-tasks", msg)
        self.set_status(f"not launched: {msg}", bad=True)
        self._errors_shown = True

    def _queued(self, prof: EvalProfile, ids: list[int], notes: list[str]) -> None:
        where = " as Slurm jobs" if prof.executor == "slurm" else ""
        text = (f"evaluation {prof.name}: {len(ids)} run{'' if len(ids) == 1 else 's'} (ids {id_ranges(ids)})"
                f"{where}\n" + "\n".join(notes))
        self.set_status(text)
        self.notify(text, markup=False, timeout=8)
        self.post_message(self.Queued(ids))
