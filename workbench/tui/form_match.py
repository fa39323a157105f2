"""The sweep form's models matched by size (``[sweep.match]``, workbench/spec/match.py) and
the devices a run trains on (``train.devices``, and ``train.sharding``: ddp or fsdp).

Match: a count typed beside a Select (params or state size; empty = no match) becomes
``[sweep.match] params = N`` / ``state_size = N``. Once typing pauses, each picked model's
profile is expanded in a thread worker as ``run`` would (so by the same solver, with the
same options, size preset and recipe), and the form shows, per model, the values solved
and the count they give, in ``run --dry-run``'s words, or the reason the target cannot be
met. The width (d_model) is what most families solve: while a target is set the d_model
field is left empty where it holds the form's own value (as a size preset does, form_presets),
since a written d_model is one the match may not change.

Devices: one line under the field says what N ranks mean here, and, where the machine has
fewer GPUs than asked, that the run cannot start (the scheduler's own check,
:func:`workbench.execute.scheduler.devices_refusal`); a launch is refused with that line.

A mixin of :class:`~workbench.tui.sweep_form.SweepForm` (which routes the change events here).
"""
from __future__ import annotations

import copy
import os
from typing import Any

from pydantic import ValidationError
from rich.text import Text
from textual.widgets import Input, Select, Static

from workbench.spec import profile as profiles
from workbench.spec.expand import MatchRefused
from workbench.spec.profile import Profile, ProfileError
from workbench.tui.form_fields import LABELS, _fmt, _model_name, parse_count
from workbench.tui.formatting import set_text

SOLVE_PAUSE_S = 0.3  # the models are solved this long after typing stops
MATCH_FIELDS = {"d_model"}  # the form's inputs a match solves (left empty while one is set)


def devices_text(text: str, executor: str, gpus: list[str], sharding: str = "ddp") -> tuple[str, bool]:
    """(one line under the devices field, whether a launch may go on) for ``text`` ranks
    (``sharding``: ddp or fsdp) on this machine (``gpus``: its GPU ids) or as a Slurm job;
    ('', True) for one process or a value the schema's message is about."""
    from workbench.execute.scheduler import devices_refusal

    try:
        n = int(text)
    except ValueError:
        return "", True
    if n <= 1:
        return "", True
    if executor == "slurm":
        return f"{n} ranks in one Slurm job (nodes, gpus_per_node in the Slurm settings)", True
    why = devices_refusal(n, gpus)
    if why:
        return f"cannot launch here: {why}", False
    if gpus:
        return (f"{n} ranks ({sharding.upper()}), one GPU each of the {len(gpus)} here; batch size is the "
                f"global batch"), True
    return (f"no GPU here: {n} CPU processes ({sharding.upper()} over gloo) share its {os.cpu_count()} cores; "
            f"batch size is the global batch"), True


def match_lines(specs: list, label: str) -> list[str]:
    """The solved values of a model's runs (distinct ones), as ``run --dry-run`` prints
    them, shorter (one line at 120 columns): 'mamba: d_model = 274 (1,001,470 params,
    +0.15%)', with the width kept where the match solved another knob (d_state)."""
    out: list[str] = []
    for s in specs:
        m = s.match
        if not m:
            continue
        knobs = ", ".join(f"{k} = {v:.4g}" if isinstance(v, float) else f"{k} = {v}" for k, v in m["solved"].items())
        if "d_model" not in m["solved"]:
            knobs += f" at d_model {s.d_model}"
        what = "params" if m["target"] == "params" else "state floats"
        line = f"{label}: {knobs} ({m['got']:,} {what}, {m['got'] / m['value'] - 1:+.2%})"
        if line not in out:
            out.append(line)
    return out


class FormMatch:
    """[sweep.match] and train.devices in the form (see the module docstring)."""

    # ------------------------------------------------------------------ reading and filling
    def match_target(self) -> tuple[str, str] | None:
        """(kind, the text typed) while a target is set, else None."""
        text = self.query_one("#match_value", Input).value.strip()
        return (str(self.query_one("#match_kind", Select).value), text) if text else None

    def match_data(self, data: dict[str, Any], errors: dict[str, str]) -> None:
        """The form's target into ``data["sweep"]["match"]`` (a parse problem into ``errors``)."""
        data["sweep"].pop("match", None)
        target = self.match_target()
        if target is None:
            return
        kind, text = target
        try:
            data["sweep"]["match"] = {kind: parse_count(text, "parameters" if kind == "params" else
                                                        "state floats")}
        except ValueError as e:
            errors["match_value"] = f"{LABELS['match_value']}: {e}"

    def fill_match(self, prof: Profile, d: dict[str, Any]) -> None:
        """A loaded profile's [sweep.match] in its fields; a width the profile leaves to the
        match shown empty (saving it leaves it out again)."""
        value, kind = self.query_one("#match_value", Input), self.query_one("#match_kind", Select)
        with value.prevent(Input.Changed), kind.prevent(Select.Changed):
            target = prof.sweep.match.target() if prof.sweep.match is not None else None
            kind.value = target[0] if target else "params"
            value.value = _fmt(target[1]) if target else ""
            if target and "d_model" not in prof.model.model_fields_set:
                self.query_one("#d_model", Input).value = ""
        self._show_placeholders()
        self.schedule_match()

    def match_fills(self) -> set[str]:
        """The form's inputs the match fills while a target is set (FormPresets empties them)."""
        return set(MATCH_FIELDS) if self.match_target() else set()

    # ------------------------------------------------------------------ solving as typed
    def schedule_match(self) -> None:
        """Solve the picked models once typing pauses (and hide the lines without a target)."""
        if self._match_timer is not None:
            self._match_timer.stop()
            self._match_timer = None
        self._match_seq += 1
        if self.match_target() is None:
            self._show_match(self._match_seq, [])
            return
        self._match_timer = self.set_timer(SOLVE_PAUSE_S, self._match_now)

    def _match_now(self) -> None:
        self._match_timer = None
        if self._select("task") != self._params_task:  # its parameter inputs are being rebuilt
            self.schedule_match()
            return
        data, errors = self.form_data()
        seq = self._match_seq
        if "match_value" in errors:
            self._show_match(seq, [(errors["match_value"], False)])
            return
        self._show_match(seq, [("solving each model's size...", True)], keep=True)
        self.run_worker(lambda: self._solve(data, seq), thread=True, group="match", exit_on_error=False)

    def _solve(self, data: dict[str, Any], seq: int) -> None:
        """(thread) Each picked model's profile expanded: its solved values or the refusal
        (every model's own, in full), and which models cannot be matched."""
        lines: list[tuple[str, bool]] = []
        unmatched: list[str] = []
        for entry in data["sweep"]["models"] or []:
            one = copy.deepcopy(data)
            one["sweep"]["models"] = [entry]
            one["sweep"]["seq_lens"] = one["sweep"]["seq_lens"][:1]  # the solution does not depend on them
            one["sweep"]["seeds"] = one["sweep"]["seeds"][:1]
            label = entry if isinstance(entry, str) else entry.get("label") or _model_name(entry)
            try:
                specs = profiles.expand(Profile.model_validate(one))
                lines += [(line, True) for line in match_lines(specs, label)]
            except ValidationError as e:
                err = e.errors()[0]
                where = ".".join(str(p) for p in err["loc"])
                lines = [(f"the solved sizes show once the form is valid ({where}: {err['msg']})", False)]
                break
            except MatchRefused as e:  # each reason in full (one per configuration of the model)
                unmatched.append(label)
                lines += [(why if why.startswith(("model ", label)) else f"{label}: {why}", False)
                          for why in e.reasons]
            except (ProfileError, ValueError) as e:
                msg = str(e).splitlines()[0].removeprefix(f"{one['name']}: ").removeprefix("sweep.match: ")
                lines.append((f"{label}: {msg}" if not msg.startswith(("model ", label)) else msg, False))
            except Exception as e:  # a hint never takes the form down
                lines.append((f"{label}: not solved: {type(e).__name__}: {e}", False))
        try:
            self.app.call_from_thread(self._show_match, seq, lines, False, unmatched)
        except RuntimeError:  # the app closed meanwhile
            pass

    def _show_match(self, seq: int, lines: list[tuple[str, bool]], keep: bool = False,
                    unmatched: list[str] | None = None) -> None:
        """Show the solved lines (refusals in red), each in full; ``keep``: a progress line
        that waits for the answer (shown only when nothing was shown before);
        ``unmatched``: the models the target cannot be met for (the run count says that
        nothing launches while they are picked)."""
        if seq != self._match_seq:  # an older answer than the form shows now
            return
        hint = self.query_one("#match-solved", Static)
        if keep and hint.display:
            return
        text = Text()
        for i, (line, ok) in enumerate(lines):
            text.append(("\n" if i else "") + line, style="" if ok else "red")
        if getattr(hint, "_wb_content", None) != text:
            # laid out again on every change: a line wraps, so its height is not its count
            # of newlines (set_text's shortcut kept one line's height and cut the rest)
            hint._wb_content = text
            hint.update(text, layout=True)
        if hint.display != bool(lines):
            hint.display = bool(lines)
        if not keep:
            # the run count as it will really be (every edit that changes the count solves
            # again, so this note follows the count's own update)
            self._match_unmatched = list(unmatched or [])
            self._show_run_count()
            count = self.query_one("#run-count", Static)
            base = str(getattr(count, "_wb_content", "") or "")
            note, ok = self.match_count_note(base, not count.has_class("bad"))
            if note != base:
                count.set_class(not ok, "bad")
                set_text(count, Text(note))

    def match_count_note(self, text: str, ok: bool) -> tuple[str, bool]:
        """The run count's line as it will really be: while a picked model cannot be
        matched, a launch is refused, so none of the counted runs would start."""
        names = [n for n in getattr(self, "_match_unmatched", []) or []]
        if not names or not ok or self.match_target() is None:
            return text, ok
        return (f"no run launches while {len(names)} model{'' if len(names) == 1 else 's'} cannot be "
                f"matched ({', '.join(names)}: see match size); unpick {'it' if len(names) == 1 else 'them'} "
                f"or change the target ({text.removeprefix('will launch ')} otherwise)"), False

    # ------------------------------------------------------------------ devices
    def gpus(self) -> list[str]:
        """This machine's GPU ids as the local scheduler sees them (read once per form)."""
        if self._gpus is None:
            from workbench.execute.scheduler import visible_gpus

            try:
                self._gpus = visible_gpus()
            except Exception:  # NVML missing or broken: the scheduler finds none either
                self._gpus = []
        return self._gpus

    def devices_note(self) -> tuple[str, bool]:
        """(the line under the devices field, whether a launch may go on), shown as well."""
        text, ok = devices_text(self.query_one("#devices", Input).value.strip(),
                                str(self._select("executor")), self.gpus(), str(self._select("sharding")))
        note = self.query_one("#devices-note", Static)
        note.set_class(not ok, "bad")
        set_text(note, Text(text))
        if note.display != bool(text):
            note.display = bool(text)
        return text, ok
