"""The workbench's own commands in Textual's command palette (ctrl+p).

A :class:`textual.command.Provider` over the app's actions: what a user looks for by name
rather than by key (new sweep, new evaluation, open profile, compare the marked runs, export the results
table, write figures, the help screen). Each command calls the app's action, which goes
back to the main screen first when needed, so it works from any screen.
"""
from __future__ import annotations

from typing import Callable

from textual.command import DiscoveryHit, Hit, Hits, Provider

# (name in the palette, help line, App action it runs)
COMMANDS: list[tuple[str, str, str]] = [
    ("New sweep", "open the sweep form (F2)", "show_tab('sweep')"),
    ("Open profile", "load a profile (TOML) into the sweep form (ctrl+o there)", "open_profile"),
    ("Save profile", "save the sweep form as a profile (ctrl+s there)", "save_profile"),
    ("Launch sweep", "validate the sweep form and queue its runs (ctrl+r there)", "launch_sweep"),
    ("New evaluation", "open the evaluation form: lm-eval tasks on models (F4)", "show_tab('eval')"),
    ("Open evaluation profile", "load an evaluation profile into the evaluation form (ctrl+o there)",
     "open_eval_profile"),
    ("Launch evaluation", "validate the evaluation form and queue its runs (ctrl+r there)", "launch_eval"),
    ("Runs", "the runs table (F1)", "show_tab('runs')"),
    ("Compare marked runs", "overlay the curves of the runs marked with space (c in the runs table)",
     "compare_marked"),
    ("Compare profile", "overlay the curves of every run of the cursor's profile (p in the runs table)",
     "compare_profile"),
    ("Results", "the results table of a profile (F3)", "show_tab('results')"),
    ("Export results table", "write the Results tab's table as Markdown, LaTeX and CSV (w there)",
     "export_table"),
    ("Write figures", "the figures of what is shown: compare view's curves, or the Results tab's "
                      "profile (f there)", "write_figures"),
    ("Keys of this screen", "the help screen (?)", "help"),
]


class WorkbenchCommands(Provider):
    """Palette entries for :data:`COMMANDS`; matched on the name by Textual's fuzzy matcher."""

    def _callback(self, action: str) -> Callable[[], object]:
        return lambda: self.app.run_action(action)

    async def discover(self) -> Hits:
        for name, help_text, action in COMMANDS:
            yield DiscoveryHit(name, self._callback(action), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, action in COMMANDS:
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), self._callback(action), help=help_text)
