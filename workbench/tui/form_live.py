"""The sweep form's checks as the user types that go beyond one field: sequence lengths
that do not fit the task (it is built at each length, as the profile loader does), the steps a budget in
tokens, FLOPs or tokens per parameter becomes for each run (the form's profile expanded as
``run`` would, workbench/spec/budget.py, in a thread worker once typing pauses; shown under
the budget, and "evaluate every" follows the shortest run), and a task that its parameters
cannot build, whose message is shown under the parameter it names (lm's vocab_size without
a BPE tokenizer). A mixin of :class:`~workbench.tui.sweep_form.SweepForm`, which routes the
change events here (Textual sees @on handlers on widget classes only).
"""
from __future__ import annotations

import itertools
import json
from typing import Any

from pydantic import ValidationError
from rich.text import Text
from textual.css.query import NoMatches
from textual.widgets import Input, Static

import tasks
from workbench.spec import profile as profiles
from workbench.spec.expand import MatchRefused
from workbench.spec.profile import Profile, ProfileError
from workbench.tui.form_checks import budget_steps_text, plain_message
from workbench.spec.schema import grid_values
from workbench.tui.form_fields import (EXAMPLES, STEP_KINDS, default_eval_every, field_for, format_grid_values,
                                       split_list)
from workbench.tui.formatting import set_text

COUNT_PAUSE_S = 0.25  # the steps are counted this long after typing stops


class FormLive:
    """The budget's steps and the task's parameter problem (see the module docstring)."""

    def _show_param_problem(self) -> None:
        """A task that its parameters cannot build (e.g. lm's vocab_size with a tokenizer
        other than bpe) says why under the parameter its message names, as they are typed."""
        fid, msg = self._param_problem()
        if self._param_error not in (None, fid):
            self._set_error(self._param_error, "")
        if fid is not None:
            self._set_error(fid, msg)
        self._param_error = fid
        grid = "" if fid is not None else self._grid_problem()
        if grid or getattr(self, "_grid_shown", False):
            self._set_error("grid_axes", grid)
        self._grid_shown = bool(grid)

    def _built_task_params(self) -> tuple[str, dict[str, Any], dict[str, str]] | None:
        """(the task's name, its parameters as the inputs hold them, their errors), or None
        while they cannot be read: the task's inputs are not mounted yet (another task's
        are), are being rebuilt, or the task has no sequence length to check."""
        name = str(self._select("task"))
        if name != self._params_task or "seq_len" not in tasks.parameters(name):
            return None
        try:
            params, errors = self._task_params(name)
        except NoMatches:  # the parameter inputs are being rebuilt
            return None
        return name, params, errors

    def _grid_problem(self) -> str:
        """The first grid point whose task values the task cannot build, in the task's words
        ('' when all build, or when the parameters or axes do not parse yet): for "other grid
        axes", where the values are (lm's vocab_size beside a "bytes" value, a BPE of 256
        ids). The grid's points are built as the profile loader builds them (cheap: data is
        generated lazily); the refusal used to show only under "train for", as the budget's
        count failed (issue 42 item 6)."""
        got = self._built_task_params()
        if got is None:
            return ""
        name, params, errors = got
        grid, grid_errors = self._grid_data()
        keys = [k for k in grid if k.startswith("task.")]
        if errors or grid_errors or not keys:
            return ""
        lens = [int(t) for t in split_list(self._text("seq_lens")) if t.isdigit()]
        L = next(iter(lens), tasks.parameters(name)["seq_len"])
        for combo in itertools.product(*(grid[k] for k in keys)):
            point = dict(zip(keys, combo))
            err = self._build_error(name, {**params, **{k[5:]: v for k, v in grid_values(point).items()}}, L)
            if err:
                where = ", ".join(f"{k} = {format_grid_values([v])}" for k, v in point.items())
                return f"grid point {where}: {err}"
        return ""

    def _param_problem(self) -> tuple[str | None, str]:
        """(the parameter field at fault, the task's message), or (None, '') when the task
        builds, when its parameters do not parse yet, or when only a length is at fault."""
        name = str(self._select("task"))
        if name != self._params_task:
            return None, ""
        try:
            params, errors = self._task_params(name)
        except NoMatches:  # the parameter inputs are being rebuilt
            return None, ""
        if errors:
            return None, ""
        lens = []
        for text in split_list(self._text("seq_lens")):
            try:
                lens.append(int(text))
            except ValueError:
                pass
        if "seq_len" not in tasks.parameters(name):
            return None, ""  # (building some of those reads their data: checked on save)
        default = tasks.parameters(name)["seq_len"]
        errs = [self._build_error(name, params, L) for L in dict.fromkeys(lens + [default]) if L is not None]
        if not errs or not all(errs):
            return None, ""  # builds at some length: _length_problems says which do not
        msg = errs[0]
        named = sorted((msg.find(p), p) for p in params if p in msg) or \
            sorted((msg.find(p), p) for p in tasks.parameters(name) if p in msg and p != "seq_len")
        return (f"param-{named[0][1]}" if named else "task"), f"task {name}: {msg}"

    def _length_problems(self) -> str:
        """Why some sequence lengths do not fit the task as its parameters stand ('' when
        they all do, or when the parameters themselves are not valid yet): the task is
        built at each length (cheap: data is generated lazily), as the profile loader
        would, so the message is the task's own."""
        got = self._built_task_params()
        if got is None:
            return ""
        name, params, errors = got
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

    def _schedule_budget_steps(self) -> None:
        """Work out the steps of a token / FLOP / tokens-per-parameter budget once typing
        pauses (it depends on the models, sizes, lengths, batch size and task)."""
        if str(self._select("budget_kind")) in STEP_KINDS and not self.query_one("#budget-steps").display:
            return
        if self._budget_timer is not None:
            self._budget_timer.stop()
        self._budget_timer = self.set_timer(COUNT_PAUSE_S, self._budget_steps_now)

    def _budget_steps_now(self) -> None:
        self._budget_timer = None
        hint = self.query_one("#budget-steps", Static)
        self._budget_seq += 1
        if str(self._select("budget_kind")) in STEP_KINDS:
            self._show_budget_steps(self._budget_seq, "", True, None)
            return
        if self._select("task") != self._params_task:  # its parameter inputs are being rebuilt
            self._schedule_budget_steps()
            return
        data, errors = self.form_data()
        # its answer writes no field edited after the edit it follows: the last edit of a field
        # other than "evaluate every" (stamped at the key), not now: under load the count
        # starts after later keys, and a field cleared by them would be refilled
        self._budget_read_at = max((getattr(w, "changed_at", 0.0) for w in self.query(Input)
                                    if w.id != "eval_every"), default=0.0)
        if "budget" in errors or not self._text("budget"):
            self._show_budget_steps(self._budget_seq, errors.get("budget", ""), False, None)
            return
        if not hint.display:  # at once, not only after the count (a FLOP count may take a second)
            self._show_budget_steps(self._budget_seq, "counting the steps...", True, self._budget_steps)
        seq = self._budget_seq
        self.run_worker(lambda: self._count_budget(data, seq), thread=True, group="budget-steps",
                        exit_on_error=False)

    def _count_budget(self, data: dict[str, Any], seq: int) -> None:
        """(thread) The steps each run's budget becomes: the profile's own expansion."""
        refused = False  # the profile does not expand (said where it belongs, when a field has it)
        try:
            text, ok, steps = budget_steps_text(profiles.expand(Profile.model_validate(data)))
        except ValidationError as e:
            errs = e.errors()
            budget = [err for err in errs if field_for(tuple(err["loc"])) == "budget"]
            first = budget[0] if budget else errs[0]
            fid = field_for(tuple(first["loc"]))
            why = plain_message(first, self._label(fid, tuple(first["loc"])), EXAMPLES.get(fid))
            text = why if budget else f"the steps show once the form is valid ({why})"
            ok, steps = not budget, None
        except MatchRefused:  # said in full under "match size" (form_match), not again here
            text, ok, steps = "no step count while a model cannot be matched (see match size)", False, None
        except (ProfileError, ValueError) as e:
            text, ok, steps = str(e).splitlines()[0], False, None
            refused = True
        except Exception as e:  # a hint never takes the form down, and never stays "counting"
            text, ok, steps = f"no step count: {type(e).__name__}: {e}", False, None
        try:
            self.app.call_from_thread(self._show_budget_steps, seq, text, ok, steps, refused)
        except RuntimeError:  # the app closed meanwhile
            pass

    def _show_budget_steps(self, seq: int, text: str, ok: bool, steps: list[int] | None,
                           refused: bool = False) -> None:
        if seq != self._budget_seq:  # an older count than the form shows now
            return
        if refused and getattr(self, "_grid_shown", False):  # the grid point's refusal: said there
            text = "no step count while a grid point is refused (see other grid axes)"
        hint = self.query_one("#budget-steps", Static)
        hint.set_class(not ok, "bad")
        set_text(hint, Text(text))
        if hint.display != bool(text):
            hint.display = bool(text)
        if steps != self._budget_steps:
            self._budget_steps = steps
            if steps:
                self._follow_eval(default_eval_every("steps", str(min(steps))),
                                  getattr(self, "_budget_read_at", 0.0))
            self._show_eval_unit()
