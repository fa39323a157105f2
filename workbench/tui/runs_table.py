"""The runs table: one row per run in the store, updated in place as the store changes.

What a row shows: the run's profile, model, task (with its task setting, ``[seq_len=512]``,
when a multi-task profile's variant is not the baseline), sequence length, its grid point
(compactly: ``lr=1e-4 wd=0.1``, each dotted grid key by its shortest unambiguous tail,
:func:`grid_labels`), seed, state, progress, last loss and accuracy, elapsed time, device.

Keys (the footer shows them): ``s`` sorts by the next column and ``S`` reverses the order
(the header marks the sort column with ▲/▼; a click on a header sorts by it); ``f`` keeps
only the profile of the run under the cursor (pressed again: all runs); ``/`` filters by
profile, model, state, task or any word (:class:`RunFilter`); ``space`` marks a run and moves
the cursor down (to mark a list with repeated presses); ``k`` kills and ``r`` resumes every
marked run after one confirmation naming how many (with nothing marked, the run under the
cursor); ``c`` compares the marked runs, ``p`` the profile of the run under the cursor.

Narrow terminals: the mark, id, state, progress and accuracy columns always stay; then the
sweep's axes whose value differs between the rows shown (model, seq_len, task setting, grid
point, seed, profile), so two runs of a sweep never read the same at 80x24; then the model,
loss and elapsed time; columns whose value is the same on every row go last, and so do
axes that tell apart no rows the axes before them do not (:func:`redundant_axes`: beside
evaluation runs, which differ in model, task and seq_len alike, only the model). A grid of
one key is headed by that key and shows its values (``tokenizer``: ``bpe/1024``). Task, grid
and profile may be truncated (…) when a part of them fits; the key columns (id, model,
seq_len, state, accuracy) never are (:func:`layout`). Every column has an explicit width
(:func:`column_width`), so rows added or changed later never leave the header and the
rows misaligned.

Sweeps of thousands of runs: the poll reads the runs without their spec and fields JSON
(:func:`table_runs`: only each run's grid point and task setting, read once per run), a
row's cells are rebuilt only when what they show changed (:func:`row_key`), and the
order is re-applied only when it changed.
"""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable

from workbench.store import Run
from workbench.tui.marked_actions import MarkedRunActions
from workbench.tui.messages import OpenRun
from workbench.tui.run_cells import (
    AXES,
    COLUMNS,
    FIXED,
    HEADERS,
    KEEP,
    MEASURED,
    SORTABLE,
    WIDTHS,
    accuracy_header,
    column_width,
    grid_items,
    grid_labels,
    layout,
    order,
    redundant_axes,
    row_cells,
    row_key,
)
from workbench.tui.run_filter import FilterScreen, RunFilter

REBUILD_AT = 20  # rows leaving at once from which the table is rebuilt, not pruned


class RunsTable(MarkedRunActions, DataTable):
    """DataTable of runs keyed by run id; :meth:`update_runs` changes only cells that moved.

    Rebuilding the table on every poll would flicker and lose the cursor, so rows are
    added once and afterwards only their changed cells are rewritten. :attr:`filter`
    (``f``, ``/``) keeps some rows; :attr:`all_runs` holds every run of the last poll.
    """

    # short footer words (the tooltip is what `?` lists), so that / s f ? q fit at 120 columns
    BINDINGS = [
        Binding("enter", "open_run", "Open", tooltip="Open the run: curves, settings, results"),
        Binding("space", "toggle_mark", "Mark+down", tooltip="Mark or unmark the run, then move down"),
        Binding("k", "kill_run", "Kill", tooltip="Kill the marked runs (or this one), after a confirmation"),
        Binding("r", "resume_run", "Resume",
                tooltip="Resume the marked runs (or this one) from their checkpoints, after a confirmation"),
        Binding("c", "compare", "Compare", tooltip="Compare the marked runs' curves"),
        Binding("p", "compare_profile", "Compare profile", show=False,
                tooltip="Compare every run of this run's profile"),
        Binding("f", "filter_profile", "This profile", tooltip="Only this run's profile / all runs"),
        Binding("slash", "filter_dialog", "Filter", tooltip="Filter: profile:, model:, state:, task:, words"),
        Binding("s", "sort_next", "Sort", tooltip="Sort by the next column"),
        Binding("S", "sort_reverse", "Sort order", show=False, tooltip="Reverse the sort order"),
        Binding("u", "unmark", "Unmark all", show=False),
    ]

    class FilterChanged(Message):
        """The filter was set or cleared (the app redraws the summary line). ``profile``:
        the one profile shown, if the filter is just that; ``text``: the whole filter."""

        def __init__(self, profile: str | None, text: str = "") -> None:
            super().__init__()
            self.profile, self.text = profile, text

    _batch = False  # class default: DataTable.__init__ already refreshes

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._cells: dict[int, dict[str, Any]] = {}
        self._keys: dict[int, tuple | None] = {}
        self._runs: dict[int, Run] = {}  # the rows shown
        self.all_runs: list[Run] = []  # the last poll's runs, all profiles
        self.filter = RunFilter()
        self.marked: set[int] = set()  # runs picked for compare, kill, resume
        self.sort_column, self.sort_reverse = "id", False
        self._order: list[int] = []  # the row order applied last
        self._labels: dict[str, str] = {}  # grid key -> short label
        self._grid_keys: list[str] = []
        self._grid_sig: tuple = ()
        self._natural: dict[str, int] = self._no_cells()
        # the columns shown, key -> width: before the first layout every column at its header
        self._columns: dict[str, int] = {k: column_width(k, self._natural[k], self.sort_column)
                                         for k, *_ in COLUMNS}
        self._first: dict[str, str] = {}  # each measured column's first value
        self._varies: set[str] = set()  # the measured columns whose value differs between rows
        self._acc_header = HEADERS["accuracy"]  # run_cells.accuracy_header of the rows shown
        self._grid_header = HEADERS["grid"]  # the one grid key's label when it is the whole grid

    # ------------------------------------------------------------------ columns
    def _header(self, key: str) -> Text:
        # the accuracy column holds language models' bits per byte: its header says so
        label = {"accuracy": self._acc_header, "grid": self._grid_header}.get(key, HEADERS[key])
        if key == self.sort_column:
            return Text(f"{label} {'▼' if self.sort_reverse else '▲'}", style="bold")
        return Text(label)

    def on_mount(self) -> None:
        self._add_columns()

    def _add_columns(self) -> None:
        # explicit widths only: a content-sized column is widened by DataTable lazily, and
        # until its next full repaint the header and the rows not repainted kept the old
        # width (misaligned, cut cells for seconds after a launch)
        for key, width in self._columns.items():
            self.add_column(self._header(key), key=key, width=width)

    def _no_cells(self) -> dict[str, int]:
        """The content widths before any row: 0, the format's width for fixed columns (the
        accuracy column's: its header's, when that is the wider)."""
        out = {k: WIDTHS[k] if k in FIXED else 0 for k, *_ in COLUMNS}
        out["accuracy"] = max(out["accuracy"], len(getattr(self, "_acc_header", "")))
        out["grid"] = max(out["grid"], len(getattr(self, "_grid_header", "")))
        return out

    def _avail(self) -> int:
        return self.size.width - self.styles.scrollbar_size_vertical

    def _relayout(self) -> bool:
        """Show the columns that fit (:func:`layout`): when they change, the table is
        built anew from the cells at hand (rows in their order, the cursor on its run).
        True when it was rebuilt."""
        if self.size.width <= 0:
            return False
        empty = {k for k in KEEP if k not in self._varies and not self._first.get(k)}
        # axes that tell apart no rows the axes before them do not rank as the same on every row
        redundant = redundant_axes(({k: c[k].plain for k in AXES} for c in self._cells.values()),
                                   self._varies & set(AXES))
        want = layout(self._avail(), self._natural, self._varies - redundant, empty, self.sort_column)
        if want == self._columns:
            return False
        rid = self.current_run_id
        self._columns = want
        self.clear(columns=True)
        self._add_columns()
        runs = sorted(self._runs.values(), key=lambda r: r.id)
        for run in runs:
            cells = self._cells[run.id]
            self.add_row(*(cells[k] for k in want), key=str(run.id))
        self._order = []
        self._apply_order(runs, force=True)
        self._keep_cursor(rid)
        self.refresh()
        return True

    def on_resize(self) -> None:
        self._relayout()

    def _measure(self, shown: list[Run]) -> None:
        """Each column's widest cell (never narrower than its header and sort mark) and
        which columns differ between the rows shown, from scratch (rows came or went)."""
        self._natural = self._no_cells()
        self._first: dict[str, str] = {}
        self._varies = set()
        for run in shown:
            cells = self._cells.get(run.id)
            if cells is not None:
                self._note(cells)

    def _note(self, cells: dict[str, Any]) -> None:
        """Widen the natural widths to a row's cells; a value other than the first seen
        makes its column one that varies."""
        natural = self._natural
        for k in MEASURED:
            plain = cells[k].plain
            if len(plain) > natural[k] and k not in FIXED:
                natural[k] = len(plain)
            if k not in self._varies and self._first.setdefault(k, plain) != plain:
                self._varies.add(k)

    # ------------------------------------------------------------------ rows
    def refresh(self, *regions, **kwargs):
        # DataTable.update_cell repaints the whole table; while update_runs runs, those
        # bare refreshes are dropped and only the rows that changed are repainted after
        if self._batch and not regions and not kwargs:
            return self
        return super().refresh(*regions, **kwargs)

    def _grid_of(self, runs: list[Run]) -> None:
        """The grid keys of all runs and their short labels (when runs came or went)."""
        sig = (len(runs), runs[0].id, runs[-1].id) if runs else ()
        if sig == self._grid_sig:
            return
        self._grid_sig = sig
        keys = list(dict.fromkeys(k for r in runs for k in (r.spec.get("grid") or ())))
        shown = list(dict.fromkeys(k for r in runs for k, _ in grid_items(r)))
        if keys != self._grid_keys or (len(shown) == 1) != (self._grid_header != HEADERS["grid"]):
            self._grid_keys = keys
            self._labels = grid_labels(keys)
            # one key (after a tokenizer took its vocabulary size in) is the whole grid of
            # every row: the header names it and the cells hold the values (``tokenizer``:
            # ``bytes``, ``bpe/1024``), which fit 80 columns where ``tokenizer=bpe/1024`` did not
            self._grid_header = self._labels[shown[0]] if len(shown) == 1 else HEADERS["grid"]
            if len(shown) == 1:
                self._labels = {**self._labels, shown[0]: ""}
            self._keys.clear()  # the grid cells of every row change
            self._natural, self._first, self._varies = self._no_cells(), {}, set()  # measured anew
            if "grid" in self.columns:
                self.columns["grid"].label = self._header("grid")

    def update_runs(self, runs: list[Run]) -> None:
        """Show ``runs`` (the filter applied): new rows added, rows gone removed, changed
        cells rewritten, the order and the columns (:meth:`_relayout`) kept up."""
        self.all_runs = runs
        self.marked &= {r.id for r in runs}  # runs gone from the store
        self._grid_of(runs)
        if self.filter:
            runs = [r for r in runs if self.filter(r)]
        ids = {r.id for r in runs}
        before = (dict(self._natural), set(self._varies), dict(self._first))
        acc_header = accuracy_header(runs)  # "eval acc|bpb" is wider than the others: a relayout
        if acc_header != self._acc_header:
            self._acc_header = acc_header
            self._natural["accuracy"] = max(WIDTHS["accuracy"], len(acc_header))
            if "accuracy" in self.columns:
                self.columns["accuracy"].label = self._header("accuracy")
                self.refresh()
        gone = [i for i in self._cells if i not in ids]
        rebuild = len(gone) >= REBUILD_AT
        cursor_run = self.current_run_id if rebuild else None
        if rebuild:
            # DataTable.remove_row re-indexes every row (~15 ms at 5,000 rows): many rows
            # going (a filter) is faster as a new table
            self.clear()
            self._cells.clear()
            self._keys.clear()
            self._runs.clear()
            self._order = []
        new: list[int] = []
        changed: list[tuple[int, dict, dict]] = []
        for run in runs:
            self._runs[run.id] = run
            marked = run.id in self.marked
            rk = row_key(run, marked)
            if rk is not None and rk == self._keys.get(run.id):
                continue  # shows the same as at the last poll
            self._keys[run.id] = rk
            cells = row_cells(run, marked, self._labels)
            old = self._cells.get(run.id)
            self._cells[run.id] = cells
            self._note(cells)
            if old is None:
                new.append(run.id)
            else:
                changed.append((run.id, old, cells))
        for rid in gone:
            if not rebuild:
                self.remove_row(str(rid))
            self._cells.pop(rid, None)
            self._keys.pop(rid, None)
            self._runs.pop(rid, None)
        if gone:  # rows went: widths and variety from scratch
            self._measure(runs)
        if (self._natural, self._varies, self._first) != before and self._relayout():
            self._keep_cursor(cursor_run)
            return  # built anew, new and changed cells included
        shown = self._columns
        full = bool(new or gone)  # rows added or removed: repaint everything
        repaint: list[str] = []
        self._batch = True
        try:
            for rid in new:
                cells = self._cells[rid]
                self.add_row(*(cells[k] for k in shown), key=str(rid))
            for rid, old, cells in changed:
                key = str(rid)
                for k in shown:
                    if old[k] != cells[k]:
                        # (a wider cell than its column changed the natural widths: the
                        # table was laid out anew above, so widths never change here)
                        self.update_cell(key, k, cells[k])
                        repaint.append(key)
        finally:
            self._batch = False
        resorted = self._apply_order(runs, force=full)
        self._keep_cursor(cursor_run)
        if full or resorted:
            self.refresh()
        else:
            for key in dict.fromkeys(repaint):
                self.refresh_row(self.get_row_index(key))

    def _apply_order(self, runs: list[Run], force: bool = False) -> bool:
        """Put the rows in the sort order when it changed; the cursor stays on its run."""
        if self.sort_column == "id" and not self.sort_reverse and not force:
            return False  # new rows come in id order, at the end
        want = order(runs, self.sort_column, self.sort_reverse, self._grid_keys)
        if want == self._order:
            return False
        rid = self.current_run_id
        pos = {str(r): i for i, r in enumerate(want)}
        self.sort("id", key=lambda cell: pos[cell.plain])
        self._order = want
        self._keep_cursor(rid)
        return True

    def _keep_cursor(self, rid: int | None) -> None:
        if rid is not None and str(rid) in self.rows:
            row = self.get_row_index(str(rid))
            if row != self.cursor_row:
                self.move_cursor(row=row)

    # ------------------------------------------------------------------ sort
    def sort_by(self, column: str, reverse: bool = False) -> None:
        if column not in SORTABLE:
            raise ValueError(f"sort: unknown column {column!r}; columns: {', '.join(SORTABLE)}")
        old = self.sort_column
        self.sort_column, self.sort_reverse = column, reverse
        if self._relayout():  # the sort column's header needs room for its mark
            return
        for key in {old, column}:
            if key in self.columns:
                self.columns[key].label = self._header(key)
        self._order = []
        self._apply_order(list(self._runs.values()), force=True)
        self.refresh()

    def action_sort_next(self) -> None:
        """The next column (of those shown) ascending."""
        cols = [k for k in SORTABLE if k in self._columns]
        i = cols.index(self.sort_column) if self.sort_column in cols else -1
        self.sort_by(cols[(i + 1) % len(cols)])

    def action_sort_reverse(self) -> None:
        self.sort_by(self.sort_column, not self.sort_reverse)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        key = event.column_key.value
        if key in SORTABLE:
            self.sort_by(key, not self.sort_reverse if key == self.sort_column else False)

    # ------------------------------------------------------------------ filter
    @property
    def profile_filter(self) -> str | None:
        """The profile shown when the filter names exactly one (``f``), else None."""
        vs = self.filter.terms.get("profile", [])
        if len(vs) == 1 and "*" not in vs[0]:
            return next((r.profile for r in self.all_runs if r.profile.lower() == vs[0]), vs[0])
        return None

    @profile_filter.setter
    def profile_filter(self, profile: str | None) -> None:
        # the app clears it so that a launched sweep's first run is shown: every term goes
        self.filter = RunFilter() if profile is None else RunFilter.of(profile=profile)

    @property
    def shown_runs(self) -> list[Run]:
        """The runs the filter keeps (what the rows show), in id order."""
        return [r for r in self.all_runs if self.filter(r)] if self.filter else self.all_runs

    @property
    def filter_label(self) -> str:
        """The filter in words for the line under the table: 'profile b only', 'filter
        state:running model:lstm', or '' when every run is shown."""
        if not self.filter:
            return ""
        only = self.profile_filter
        if only is not None and len(self.filter.terms) == 1 and not self.filter.words:
            return f"profile {only} only"
        return f"filter {self.filter.text()}"

    def set_filter(self, f: RunFilter) -> None:
        rid = self.current_run_id
        self.filter = f
        self.update_runs(self.all_runs)
        self._keep_cursor(rid)  # the cursor stays on its run when it is still shown
        self.post_message(self.FilterChanged(self.profile_filter, f.text()))

    def action_filter_profile(self) -> None:
        """Only the runs of the profile under the cursor; pressed again, all runs."""
        if self.filter:
            self.set_filter(RunFilter())
            return
        rid = self.current_run_id
        if rid is None or rid not in self._runs:
            return
        self.set_filter(RunFilter.of(profile=self._runs[rid].profile))

    def action_filter_dialog(self) -> None:
        def done(text: str | None) -> None:
            if text is None:
                return
            self.set_filter(RunFilter(text))
            n = len(self.shown_runs)
            self.notify(f"filter {text!r}: {n} of {len(self.all_runs)} runs" if text else
                        f"no filter: all {n} runs", markup=False)

        self.app.push_screen(FilterScreen(self.filter.text(), self.all_runs), done)

    # ------------------------------------------------------------------ cursor actions
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
