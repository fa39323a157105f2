"""The ssm-workbench TUI application: tabs for the runs table, the sweep form, the results and
the evaluation form (:mod:`workbench.tui.eval_form`); the run view is a pushed screen. The
widgets live in their own modules; this file wires them up.

``?`` shows every key of the current screen (:mod:`workbench.tui.help_screen`), and the
command palette (ctrl+p) holds the app's own commands (:mod:`workbench.tui.commands`).
Figures and tables go to one folder per profile under ``<store>/figures/`` or ``--out``
(:mod:`workbench.tui.paths`).

Run it as ``python -m workbench.tui.app [--store DIR] [--profiles DIR] [--out DIR]``.
"""
from __future__ import annotations

import argparse
from collections import Counter
import importlib
import threading
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widget import Widget
from textual.widgets import Header, Static, TabbedContent, TabPane

from workbench.execute import dispatch, executor
from workbench.spec.schema import Profile
from workbench.store import STATE_STYLES, STATES, Run, Store, progress
from workbench.tui import paths
from workbench.tui.background import PollsStore
from workbench.tui.commands import WorkbenchCommands
from workbench.tui.dialogs import ConfirmScreen
from workbench.tui.eval_form import EvalForm
from workbench.tui.help_screen import HelpScreen, KeysFooter, sections_for
from workbench.tui.marked_actions import RESUMABLE
from workbench.tui.form_checks import launch_extras
from workbench.tui.formatting import id_ranges, set_text
from workbench.tui.compare_view import CompareScreen
from workbench.tui.messages import CompareRuns, KillRequested, OpenRun, ResumeRequested
from workbench.tui.results_view import ResultsView
from workbench.tui.run_view import RunScreen
from workbench.tui.run_cells import table_runs
from workbench.tui.runs_table import RunsTable
from workbench.tui.sweep_form import SweepForm

POLL_S = 0.5  # the runs table follows the store at 2 Hz
MAX_PROGRESS_LINES = 3  # profiles under way listed under the runs table


def launch_summary(name: str, ids: Any, cmd: str = "ssm-workbench") -> str:
    """What submitting a sweep did, from :class:`workbench.execute.launch.Submission` (a plain
    list of ids counts as all queued): new runs queued, and the runs the store already
    held (skipped as finished, still pending or running, resumed, restarted, refused).
    ``cmd``: the workbench's command as the user types it (:func:`progress.command`)."""
    queued = list(getattr(ids, "queued", ids))
    text = f"sweep {name}: {len(queued)} run{'' if len(queued) == 1 else 's'} queued"
    if queued:
        text += f" (ids {id_ranges(queued)})"
    held = [(k, getattr(ids, k, [])) for k in ("skipped", "attached", "resumed", "restarted", "refused")]
    n_held = sum(len(v) for _, v in held)
    if n_held:
        words = {"skipped": "finished (skipped)", "attached": "pending or running",
                 "resumed": "resumed from a checkpoint", "restarted": "restarted from step 0",
                 "refused": "not requeued"}
        parts = ", ".join(f"{len(v)} {words[k]}" for k, v in held if v)
        text += f"; {n_held} already in the store: {parts}"
        if not queued and len(getattr(ids, "skipped", [])) == n_held:
            text += f" (`{cmd} run --fresh` trains them anew)"
    return text


class WorkbenchApp(PollsStore, App):
    CSS_PATH = ["app.tcss", "results.tcss", "eval_form.tcss"]
    TITLE = "ssm-workbench"
    # the screens' -narrow / -wide classes (app.tcss): the sweep form's two columns and the
    # compare view's legend beside the plots need 100 columns
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    COMMANDS = App.COMMANDS | {WorkbenchCommands}
    # The footer shows short words and only the keys a screen is about (120 columns hold
    # them all, ? and q included); `?` lists every key with its tooltip, hidden ones too.
    BINDINGS = [
        Binding("question_mark", "help", "Keys", key_display="?", tooltip="Every key of this screen"),
        Binding("q", "quit_key", "Quit", tooltip="Quit (runs go on)"),
        # not a priority binding (as Textual's default is), so the form's footer can show it
        Binding("ctrl+q", "quit", "Quit", show=False, tooltip="Quit (runs go on)"),
        # the tabs' titles name these keys: no room taken in the footer
        Binding("f1", "show_tab('runs')", "Runs", show=False),
        Binding("f2", "show_tab('sweep')", "New sweep", show=False),
        Binding("f3", "show_tab('results')", "Results", show=False),
        Binding("f4", "show_tab('eval')", "New eval", show=False),
    ]

    def __init__(self, store: Store, profiles_dir: Path = Path("profiles"),
                 scheduler: Any = None, figures_dir: Path | None = None, **kwargs: Any) -> None:
        """``scheduler``: an object with ``submit`` and ``kill`` (tests); by default the
        :mod:`workbench.execute.launch` module, imported when first needed. ``figures_dir``:
        the folder under which the compare and results views write figures and tables,
        one folder per profile (default: the store folder's ``figures/``)."""
        super().__init__(**kwargs)
        self.store = store
        self.profiles_dir = Path(profiles_dir)
        self.figures_dir = paths.output_root(store.root, figures_dir)
        self._scheduler = scheduler
        # One SQLite connection serves the UI's threads; a lock keeps their statements
        # (and reap's write transaction) from interleaving.
        self.store_lock = threading.Lock()
        self._goto_run: int | None = None  # put the cursor here once the row exists
        self.runs_seen: list[Run] = []
        self._slurm_error = ""

    @property
    def scheduler(self) -> Any:
        if self._scheduler is None:
            self._scheduler = importlib.import_module("workbench.execute.launch")
        return self._scheduler

    def compose(self) -> ComposeResult:
        yield Header()
        with TabbedContent(initial="runs"):
            with TabPane("Runs (F1)", id="runs"):
                yield RunsTable(id="runs-table")
                yield Static("", id="runs-summary")
            # the two forms (most of the app's widgets) are mounted when their tab is first
            # shown (mount_tab): a session that only watches runs never builds them
            yield TabPane("New sweep (F2)", id="sweep")
            with TabPane("Results (F3)", id="results"):
                yield ResultsView(self.store, self.store_lock, self.figures_dir, id="results-view")
            yield TabPane("New eval (F4)", id="eval")
        yield KeysFooter()

    async def mount_tab(self, tab: str) -> None:
        """Mount the sweep or evaluation form into its tab, if not yet there (and wait
        until its widgets are composed); other tabs are mounted at start."""
        forms = {"sweep": lambda: SweepForm(self.profiles_dir, state_dir=self.store.root, id="sweep-form"),
                 "eval": lambda: EvalForm(self.profiles_dir, id="eval-form")}
        if tab not in forms:
            return
        pane = self.query_one(f"#{tab}", TabPane)
        if not pane.children:
            await pane.mount(forms[tab]())

    @on(TabbedContent.TabActivated)
    async def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id is not None:  # a click on the tab: its form, if not yet mounted
            await self.mount_tab(event.pane.id)

    def on_mount(self) -> None:
        self.sub_title = str(self.store.root) + (
            f" (read-only: {self.store.readonly_reason})" if self.store.readonly else "")
        self.query_one(RunsTable).focus()
        self.poll_runs()
        self.set_interval(POLL_S, self.poll_runs)

    async def action_show_tab(self, tab: str) -> None:
        while len(self.screen_stack) > 1:  # from the run view (or a dialog) back to the tabs
            self.pop_screen()
        await self.mount_tab(tab)
        self.query_one(TabbedContent).active = tab
        # the form opens on its model list: typing there filters, space picks, ? is help
        # (on the profile name, with its text selected, ? or a filter replaced the name)
        target = {"runs": RunsTable, "sweep": "#models", "results": "#results-table", "eval": "#ev-models"}[tab]
        self.query_one(target).focus()
        if tab == "results":  # read now, not at the next 2 s tick (once the tab is drawn)
            self.call_after_refresh(self.query_one(ResultsView).refresh_data)

    # ------------------------------------------------------------------ runs table
    def poll_runs(self) -> None:
        if not self.screen_stack:  # a tick while the app shuts down
            return
        if isinstance(self.screen, (RunScreen, CompareScreen)):
            return  # the table is hidden (and those views poll for themselves)
        self.poll()  # (skips a tick rather than queue reads behind a slow one)

    def read(self) -> list[Run]:  # PollsStore: in a thread worker
        with self.store_lock:
            self.store.reap()  # runs whose worker died become 'crashed'
            from workbench.execute.scheduler import revive  # a scheduler this TUI spawned died: restart it
            if revived := revive(self.store):
                self.call_from_thread(self.notify, revived, markup=False,
                                      severity="information" if revived.restarted else "error")
            runs = table_runs(self.store)
            try:  # Slurm runs: ingest their rows, read job states (throttled); never submits
                if dispatch.sync(self.store, runs=runs):
                    runs = table_runs(self.store)  # as the sync left them
            except executor.ExecutorError as e:
                self.call_from_thread(self._slurm_problem, str(e))
        return runs

    def _slurm_problem(self, text: str) -> None:
        if text != self._slurm_error:  # once per distinct problem, not at every poll
            self._slurm_error = text
            self.notify(f"slurm: {text}", severity="error", markup=False)

    def apply(self, runs: list[Run]) -> None:  # PollsStore: on the UI thread
        self.runs_seen = runs
        table = self.query_one(RunsTable)
        if self._goto_run is not None and table.filter:
            table.profile_filter = None  # a launched sweep's first run must be shown: no filter
        table.update_runs(runs)
        if self._goto_run is not None and str(self._goto_run) in table.rows:
            table.move_cursor(row=table.get_row_index(str(self._goto_run)))
            self._goto_run = None
        self._show_summary()

    @on(RunsTable.FilterChanged)
    def _show_summary(self) -> None:
        """The line(s) under the runs table: counts by state, then the progress and ETA
        (:mod:`workbench.store.progress`) of the filtered profile, or of each profile still
        running or pending (the first MAX_PROGRESS_LINES)."""
        table = self.query_one(RunsTable)
        runs = table.all_runs
        shown = table.shown_runs          # under any filter: profile, model, state, task
        counts = Counter(r.state for r in shown)
        summary = Text(f"{len(shown)} runs  ")
        for s in STATES:
            if counts[s]:
                summary.append(f"{counts[s]} {s}  ", style=STATE_STYLES[s])
        if not runs:
            summary.append("none yet: F2 opens the sweep form", style="dim")
        if table.filter:
            summary.append(f"{table.filter_label} (f: all {len(runs)} runs)", style="bold")
        lines = progress.by_profile(shown)
        if table.profile_filter is None:  # (a profile whose runs all ended, some killed: not under way)
            lines = [p for p in lines if p.under_way]
        for p in lines[:MAX_PROGRESS_LINES]:
            summary.append("\n" + p.text())
        if len(lines) > MAX_PROGRESS_LINES:
            summary.append(f"\n... and {len(lines) - MAX_PROGRESS_LINES} more profiles under way "
                           f"(f on a run: its profile only)", style="dim")
        set_text(self.query_one("#runs-summary", Static), summary)

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        # 'q' would be a typo away in the form (lists and switches don't take letters):
        # there ctrl+q quits, as the form's footer says
        if action == "quit_key" and isinstance(self.screen.focused, Widget) and \
                any(isinstance(a, (SweepForm, EvalForm)) for a in self.screen.focused.ancestors_with_self):
            return False
        return True

    async def action_quit_key(self) -> None:
        await self.action_quit()  # workers are detached: quitting leaves them running

    # ------------------------------------------------------------------ run view, kill
    def on_data_table_row_selected(self, event: RunsTable.RowSelected) -> None:
        # a mouse click on a row (the keyboard's enter is RunsTable's own binding)
        if event.row_key.value is not None:
            self.push_screen(RunScreen(self.store, int(event.row_key.value), self.store_lock))

    def on_open_run(self, message: OpenRun) -> None:
        self.push_screen(RunScreen(self.store, message.run_id, self.store_lock))

    def on_compare_runs(self, message: CompareRuns) -> None:
        self.push_screen(CompareScreen(self.store, message.run_ids, self.store_lock, message.title,
                                       figures_dir=self.figures_dir))

    def on_kill_requested(self, message: KillRequested) -> None:
        with self.store_lock:
            run = self.store.get(message.run_id)
        if run is None:
            return
        if run.finished:
            self.notify(f"run {run.id} is already {run.state}", severity="warning")
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self.kill_run(run.id)

        self.push_screen(ConfirmScreen(Text(f"Kill run {run.id} ({run.label}, {run.task}, "
                                            f"seed {run.seed}), now {run.state}?")), answer)

    def on_resume_requested(self, message: ResumeRequested) -> None:
        """`r` on one run (nothing marked): confirmed first, as the README says of `k` / `r`
        (resuming starts a worker; a stray key must not)."""
        with self.store_lock:
            run = self.store.get(message.run_id)
        if run is None:
            return
        if run.state not in RESUMABLE:
            self.notify(f"run {run.id} is {run.state}: only killed, crashed, preempted or failed runs resume",
                        severity="warning", markup=False)
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self.resume_run(run.id)

        self.push_screen(ConfirmScreen(Text(f"Resume run {run.id} ({run.label}, {run.task}, seed {run.seed}), "
                                            f"now {run.state}, from its checkpoint?")), answer)

    @work(thread=True, group="scheduler")
    def resume_run(self, run_id: int) -> None:
        from workbench.execute import resume

        store = Store(self.store.root)  # own connection: it may start a scheduler or sbatch
        try:
            done, errors = resume.resume_runs(store, [run_id])
        except Exception as e:
            errors = [f"resume failed: {e}"]
            done = []
        finally:
            store.close()
        for text in errors:
            self.call_from_thread(self.notify, text, severity="warning", markup=False)
        if done:
            self.call_from_thread(self.notify, f"run {run_id} resumes from its checkpoint", markup=False)

    @work(thread=True, group="scheduler")
    def kill_run(self, run_id: int) -> None:
        store = Store(self.store.root)  # own connection: kill may wait seconds for the worker
        try:
            ok = self.scheduler.kill(store, run_id)
        except Exception as e:
            self.call_from_thread(self.notify, f"kill failed: {e}", severity="error", markup=False)
            return
        finally:
            store.close()
        self.call_from_thread(self.notify, f"run {run_id} killed" if ok else
                              f"run {run_id} was not running (nothing killed)",
                              severity="information" if ok else "warning")

    # ------------------------------------------------------------------ launch
    @on(SweepForm.Launch)
    def on_launch(self, message: SweepForm.Launch) -> None:
        self.notify(f"launching sweep {message.profile.name!r}...", markup=False)
        self.submit_sweep(message.profile)

    @work(thread=True, group="scheduler")
    def submit_sweep(self, profile: Profile) -> None:
        # submit starts the detached scheduler process: off the UI thread
        store = Store(self.store.root)  # own connection, so the 2 Hz polls never wait on it
        try:
            ids = self.scheduler.submit(store, profile)
        except Exception as e:  # show it; a failed launch must not take the UI down
            self.call_from_thread(self.notify, f"launch failed: {e}", severity="error", markup=False)
            return
        finally:
            store.close()
        self.call_from_thread(self._launched, profile, ids)

    async def _launched(self, profile: Profile, ids: list[int]) -> None:
        text = launch_summary(profile.name, ids, progress.command(self.store.root))
        if extra := launch_extras(profile):  # devices per run, models matched by size
            text += f"; {extra}"
        self.notify(text, markup=False, timeout=8)
        for form in self.query(SweepForm):  # (a launch from the palette mounted it)
            form.set_status(text)
        # the cursor goes to the first run that will train now (else the sweep's first)
        moving = [i for k in ("queued", "resumed", "restarted") for i in getattr(ids, k, [])]
        self._goto_run = (moving or list(ids) or [None])[0]
        await self.action_show_tab("runs")
        self.poll_runs()

    @on(EvalForm.Queued)
    async def _evals_queued(self, message: EvalForm.Queued) -> None:
        self._goto_run = (message.ids or [None])[0]
        await self.action_show_tab("runs")
        self.poll_runs()

    @on(SweepForm.EvalProfileLoaded)
    async def _eval_profile_loaded(self, message: SweepForm.EvalProfileLoaded) -> None:
        """ctrl+o in the sweep form read an evaluation profile: into the evaluation form."""
        await self.action_show_tab("eval")
        self.query_one(EvalForm).loaded(message.path, message.profile, message.absent)

    # ------------------------------------------------------------------ help, palette commands
    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            return
        screen = self.screen
        if len(self.screen_stack) > 1:  # the run view, the compare view, a dialog
            where = screen.title or type(screen).__name__
        else:
            pane = self.query_one(TabbedContent).active_pane
            where = str(pane._title) if pane is not None else self.title
        self.push_screen(HelpScreen(sections_for(self, screen), f"Keys: {where}   (esc closes)"))

    async def _to_tabs(self, tab: str | None = None) -> None:
        while len(self.screen_stack) > 1:
            self.pop_screen()
        if tab is not None:
            await self.action_show_tab(tab)

    async def action_open_profile(self) -> None:
        await self._to_tabs("sweep")
        self.query_one(SweepForm).action_load()

    async def action_save_profile(self) -> None:
        await self._to_tabs("sweep")
        self.query_one(SweepForm).action_save()

    async def action_launch_sweep(self) -> None:
        await self._to_tabs("sweep")
        self.query_one(SweepForm).action_launch()

    async def action_open_eval_profile(self) -> None:
        await self._to_tabs("eval")
        self.query_one(EvalForm).action_load()

    async def action_launch_eval(self) -> None:
        await self._to_tabs("eval")
        self.query_one(EvalForm).action_launch()

    async def action_compare_marked(self) -> None:
        await self._to_tabs("runs")
        self.query_one(RunsTable).action_compare()

    async def action_compare_profile(self) -> None:
        await self._to_tabs("runs")
        self.query_one(RunsTable).action_compare_profile()

    async def action_export_table(self) -> None:
        await self._to_tabs()
        if self.query_one(TabbedContent).active != "results":
            await self.action_show_tab("results")
            self.notify("the Results tab's table: pick the profile and metric, then w writes it",
                        markup=False)
            return
        self.query_one(ResultsView).action_write_table()

    async def action_write_figures(self) -> None:
        if isinstance(self.screen, CompareScreen):
            self.screen.action_figures()
            return
        await self._to_tabs()
        if self.query_one(TabbedContent).active != "results":
            await self.action_show_tab("results")
        self.query_one(ResultsView).action_figures()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m workbench.tui.app", description=__doc__)
    ap.add_argument("--store", help="store directory (default: $SSM_WORKBENCH_STORE or the XDG data dir)")
    ap.add_argument("--profiles", default="profiles", help="folder for saved profiles (default: ./profiles)")
    ap.add_argument("--out", help="folder for figures and tables, one folder per profile "
                                  "(default: the store folder's figures/)")
    args = ap.parse_args(argv)
    WorkbenchApp(store=Store(args.store), profiles_dir=Path(args.profiles), figures_dir=args.out).run()


if __name__ == "__main__":
    main()
