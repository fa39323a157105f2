"""The runs table: one row per run in the store, updated in place as the store changes.

Sweeps of thousands of runs: the poll reads the runs without their spec and fields JSON
(:func:`workbench.progress.table_runs`), a row's cells are rebuilt only when what they show changed
(:func:`row_key`), and ``f`` narrows the table to the profile under the cursor (the line
under the table then shows that profile's progress and ETA, :mod:`workbench.progress`).
"""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable

from workbench import slurm
from workbench.progress import table_runs  # noqa: F401  (the app's poll reads with it)
from workbench.store import Run
from workbench.tui.messages import CompareRuns, KillRequested, OpenRun, ResumeRequested
from workbench.tui.formatting import duration, number, percent, state_text

# (column key, header, fixed width or None = fit the content). Fixed widths for the
# columns that change while a run trains: a cell update then never re-lays out the table.
COLUMNS = [
    ("mark", "", 1), ("id", "id", None), ("profile", "profile", None), ("model", "model", None),
    ("task", "task", None), ("seq_len", "seq_len", None), ("seed", "seed", None),
    ("state", "state", 9), ("progress", "progress", 8), ("loss", "loss", 8),
    ("accuracy", "accuracy", 8), ("elapsed", "elapsed", 7), ("device", "device", None),
]
FIXED = {k for k, _, w in COLUMNS if w}


MARK = Text("●", style="bold yellow")

def row_key(run: Run, marked: bool) -> tuple | None:
    """What :func:`row_cells` shows of a run, or None when it changes with the clock (a
    running run's elapsed time): equal keys mean equal cells, so those are not rebuilt."""
    if run.state == "running" or (run.started is not None and run.ended is None):
        return None
    return (marked, run.profile, run.label, run.task, run.seq_len, run.seed, run.state,
            run.progress, run.last_loss, run.last_accuracy, run.started, run.ended, run.device,
            run.slot, slurm.describe(run) if slurm.is_slurm(run) else None)


def row_cells(run: Run, marked: bool = False) -> dict[str, Any]:
    """The table cells of one run, by column key."""
    return {
        "mark": MARK if marked else "",
        "id": Text(str(run.id), justify="right"),
        "profile": run.profile,
        "model": run.label,
        "task": run.task,
        "seq_len": "" if run.seq_len is None else str(run.seq_len),
        "seed": str(run.seed),
        "state": state_text(run.state),
        "progress": Text(percent(run.progress), justify="right"),
        "loss": Text(number(run.last_loss), justify="right"),
        "accuracy": Text(number(run.last_accuracy, 3), justify="right"),
        "elapsed": Text(duration(run.elapsed), justify="right"),
        # which GPU, when there are several: the scheduler's slot is the CUDA index; Slurm
        # runs: the job id and Slurm's state (PENDING with its reason, TIMEOUT, NODE_FAIL...)
        "device": slurm.describe(run) if slurm.is_slurm(run) else
        f"{run.device}:{run.slot}" if run.device == "cuda" and run.slot else (run.device or ""),
    }


class RunsTable(DataTable):
    """DataTable of runs keyed by run id; :meth:`update_runs` changes only cells that moved.

    Rebuilding the table on every poll would flicker and lose the cursor, so rows are
    added once and afterwards only their changed cells are rewritten. ``profile_filter``
    (the ``f`` key) keeps only one profile's rows; :attr:`all_runs` holds every run.
    """

    BINDINGS = [
        Binding("enter", "open_run", "Open run"),
        Binding("k", "kill_run", "Kill run"),
        Binding("r", "resume_run", "Resume run"),
        Binding("space", "toggle_mark", "Mark"),
        Binding("c", "compare", "Compare marked"),
        Binding("p", "compare_profile", "Compare profile"),
        Binding("f", "filter_profile", "Only this profile / all"),
        Binding("u", "unmark", "Unmark all", show=False),
    ]

    class FilterChanged(Message):
        """The profile filter was set or cleared (the app redraws the summary line)."""

        def __init__(self, profile: str | None) -> None:
            super().__init__()
            self.profile = profile

    _batch = False  # class default: DataTable.__init__ already refreshes

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._cells: dict[int, dict[str, Any]] = {}
        self._keys: dict[int, tuple | None] = {}
        self._runs: dict[int, Run] = {}  # the rows shown
        self.all_runs: list[Run] = []  # the last poll's runs, all profiles
        self.profile_filter: str | None = None
        self.marked: set[int] = set()  # runs picked for the compare view

    def on_mount(self) -> None:
        for key, label, width in COLUMNS:
            self.add_column(label, key=key, width=width)

    def refresh(self, *regions, **kwargs):
        # DataTable.update_cell repaints the whole table; while update_runs runs, those
        # bare refreshes are dropped and only the rows that changed are repainted after
        if self._batch and not regions and not kwargs:
            return self
        return super().refresh(*regions, **kwargs)

    def update_runs(self, runs: list[Run]) -> None:
        self.all_runs = runs
        self.marked &= {r.id for r in runs}  # runs gone from the store
        if self.profile_filter is not None:
            runs = [r for r in runs if r.profile == self.profile_filter]
        seen = set()
        changed: list[str] = []
        full = False  # rows added or removed: repaint everything
        self._batch = True
        try:
            for run in runs:
                seen.add(run.id)
                self._runs[run.id] = run
                marked = run.id in self.marked
                rk = row_key(run, marked)
                if rk is not None and rk == self._keys.get(run.id):
                    continue  # shows the same as at the last poll
                self._keys[run.id] = rk
                key = str(run.id)
                cells = row_cells(run, marked)
                old = self._cells.get(run.id)
                if old is None:
                    self.add_row(*(cells[k] for k, *_ in COLUMNS), key=key)
                    full = True
                else:
                    for k, value in cells.items():
                        if old[k] != value:
                            # content-sized columns may need to grow (then the virtual
                            # size changes and DataTable repaints all by itself)
                            self.update_cell(key, k, value, update_width=k not in FIXED)
                            changed.append(key)
                self._cells[run.id] = cells
            for gone in set(self._cells) - seen:
                self.remove_row(str(gone))
                del self._cells[gone]
                self._keys.pop(gone, None)
                self._runs.pop(gone, None)
                full = True
        finally:
            self._batch = False
        if full:
            self.refresh()
        else:
            for key in dict.fromkeys(changed):
                self.refresh_row(self.get_row_index(key))

    def action_filter_profile(self) -> None:
        """Only the runs of the profile under the cursor; pressed again, all runs."""
        if self.profile_filter is not None:
            self.profile_filter = None
        else:
            rid = self.current_run_id
            if rid is None or rid not in self._runs:
                return
            self.profile_filter = self._runs[rid].profile
        rid = self.current_run_id
        self.update_runs(self.all_runs)
        if rid is not None and str(rid) in self.rows:  # the cursor stays on its run
            self.move_cursor(row=self.get_row_index(str(rid)))
        self.post_message(self.FilterChanged(self.profile_filter))

    @property
    def current_run_id(self) -> int | None:
        if self.row_count == 0:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        return int(key.value) if key.value is not None else None

    def action_open_run(self) -> None:
        rid = self.current_run_id
        if rid is not None:
            self.post_message(OpenRun(rid))

    def action_resume_run(self) -> None:
        rid = self.current_run_id
        if rid is not None:
            self.post_message(ResumeRequested(rid))

    def action_kill_run(self) -> None:
        rid = self.current_run_id
        if rid is not None:
            self.post_message(KillRequested(rid))

    # ------------------------------------------------------------------ marks, compare
    def _set_mark(self, run_id: int, on: bool) -> None:
        (self.marked.add if on else self.marked.discard)(run_id)
        cells = self._cells.get(run_id)
        if cells is not None:
            cells["mark"] = MARK if on else ""
            self.update_cell(str(run_id), "mark", cells["mark"])

    def action_toggle_mark(self) -> None:
        rid = self.current_run_id
        if rid is None:
            return
        self._set_mark(rid, rid not in self.marked)
        if self.cursor_row < self.row_count - 1:  # mark down a list with repeated presses
            self.move_cursor(row=self.cursor_row + 1)

    def action_unmark(self) -> None:
        for rid in list(self.marked):
            self._set_mark(rid, False)

    def action_compare(self) -> None:
        if not self.marked:
            self.notify("mark runs with space first (or p: the whole profile of this run)",
                        severity="warning")
            return
        ids = sorted(self.marked)
        self.post_message(CompareRuns(ids, "runs " + ", ".join(map(str, ids))))

    def action_compare_profile(self) -> None:
        rid = self.current_run_id
        if rid is None or rid not in self._runs:
            return
        profile = self._runs[rid].profile
        ids = sorted(r.id for r in self.all_runs if r.profile == profile)
        self.post_message(CompareRuns(ids, f"profile {profile}"))
