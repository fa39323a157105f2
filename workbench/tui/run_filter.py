"""The runs table's filter: :class:`RunFilter` (which runs a line such as
``state:running,pending model:mamba grid`` keeps) and :class:`FilterScreen` (the ``/``
dialog that asks for that line).
"""
from __future__ import annotations

import fnmatch
from typing import Iterable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, Label, Static

from workbench.store import STATES, Run
from workbench.tui.run_cells import task_text

FILTER_KEYS = ("profile", "model", "state", "task")


class RunFilter:
    """Which runs the table shows, from a line such as ``state:running,pending model:mamba
    grid``: ``key:value[,value...]`` terms with key profile, model, state or task (the
    values of one key are alternatives, case-insensitive, ``*`` a wildcard; a model
    matches its label or registry name, a task its name or setting); a bare word must occur
    in the profile, model, task or state. Every term must hold."""

    def __init__(self, text: str = "") -> None:
        self.terms: dict[str, list[str]] = {}
        self.words: list[str] = []
        for tok in text.split():
            key, sep, values = tok.partition(":")
            if sep and key.lower() in FILTER_KEYS:
                self.terms.setdefault(key.lower(), []).extend(v.lower() for v in values.split(",") if v)
            elif sep and key:
                raise ValueError(f"filter: unknown key {key!r} in {tok!r}; keys: {', '.join(FILTER_KEYS)}")
            else:
                self.words.append(tok.lower())

    @classmethod
    def of(cls, **terms: str) -> "RunFilter":
        f = cls()
        f.terms = {k: [v.lower()] for k, v in terms.items()}
        return f

    def __bool__(self) -> bool:
        return bool(self.terms or self.words)

    def text(self) -> str:
        return " ".join([f"{k}:{','.join(vs)}" for k, vs in self.terms.items()] + self.words)

    @staticmethod
    def _values(run: Run, key: str) -> list[str]:
        if key == "profile":
            return [run.profile]
        if key == "model":
            return [run.label, run.model]
        if key == "state":
            return [run.state]
        return [run.task, task_text(run)]

    def __call__(self, run: Run) -> bool:
        for key, wanted in self.terms.items():
            have = [v.lower() for v in self._values(run, key) if v]
            if not any(fnmatch.fnmatchcase(h, w) for h in have for w in wanted):
                return False
        if self.words:
            hay = " ".join(v for k in FILTER_KEYS for v in self._values(run, k) if v).lower()
            if not all(w in hay for w in self.words):
                return False
        return True


class FilterScreen(ModalScreen["str | None"]):
    """Ask for the filter line (enter applies, an empty line shows every run, escape keeps
    the filter as it was); lists the values there are to filter by."""

    DEFAULT_CSS = """
    FilterScreen { align: center middle; }
    FilterScreen > Vertical { width: 90%; max-width: 100; height: auto; border: thick $accent;
                              background: $surface; padding: 1 2; }
    FilterScreen #filter-hint { color: $text-muted; }
    FilterScreen #filter-error { color: $error; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, current: str, runs: list[Run]) -> None:
        super().__init__()
        self.current, self.runs = current, runs

    def compose(self) -> ComposeResult:
        def some(values: Iterable[str], limit: int = 8) -> str:
            vs = list(dict.fromkeys(values))
            return ", ".join(vs[:limit]) + (f", ... ({len(vs)})" if len(vs) > limit else "")

        counts = {s: sum(r.state == s for r in self.runs) for s in STATES}
        with Vertical():
            yield Label("Filter runs: key:value terms (profile, model, state, task; values "
                        "comma-separated, * wildcard) and/or words; empty: all runs")
            yield Input(self.current, id="filter-input", placeholder="e.g. state:running,pending model:mamba")
            yield Static("", id="filter-error")
            yield Static("\n".join([
                f"profiles: {some(r.profile for r in self.runs)}",
                f"models:   {some(r.label for r in self.runs)}",
                f"states:   {', '.join(f'{s} {n}' for s, n in counts.items() if n)}",
                f"tasks:    {some(r.task for r in self.runs)}"]), id="filter-hint", markup=False)
        yield Footer()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            RunFilter(event.value)
        except ValueError as e:
            self.query_one("#filter-error", Static).update(str(e))
            return
        self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)
