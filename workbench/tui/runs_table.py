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

Narrow terminals: the mark, id, state, progress and accuracy columns always stay; the
others are shown in :data:`KEEP` order while they fit, columns whose value is the same on
every row shown go last, and model, task, grid and profile are truncated (…) rather than
dropped when a part of them fits (:func:`layout`).

Sweeps of thousands of runs: the poll reads the runs without their spec and fields JSON
(:func:`table_runs`: only each run's grid point and task setting, read once per run), a
row's cells are rebuilt only when what they show changed (:func:`row_key`), and the
order is re-applied only when it changed.
"""
from __future__ import annotations

import fnmatch
import threading
from typing import Any, Iterable

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Input, Label, Static

from workbench.store import progress
from workbench.execute import slurm
from workbench.results.aggregate import sort_key
from workbench.store import STATES, TERMINAL, Run, Store
from workbench.tui.dialogs import ConfirmScreen
from workbench.tui.formatting import duration, number, percent, state_text
from workbench.tui.messages import CompareRuns, KillRequested, OpenRun, ResumeRequested


def table_runs(store: Store, profile: str | None = None) -> list[Run]:
    """The runs as the table shows them: :func:`workbench.store.progress.table_runs` with each
    run's grid point and task setting (the app's poll reads with this)."""
    return progress.table_runs(store, profile, grid=True)


# (column key, header, fixed width or None = fit the content). Fixed widths for the
# columns that change while a run trains: a cell update then never re-lays out the table;
# each leaves room for the sort mark (" ▲") after its header.
COLUMNS = [
    ("mark", "", 1), ("id", "id", None), ("profile", "profile", None), ("model", "model", None),
    ("task", "task", None), ("seq_len", "seq_len", None), ("grid", "grid", None), ("seed", "seed", None),
    ("state", "state", 9), ("progress", "progress", 10), ("loss", "loss", 8),
    ("accuracy", "accuracy", 10), ("elapsed", "elapsed", 9), ("device", "device", None),
]
HEADERS = {k: label for k, label, _ in COLUMNS}
WIDTHS = {k: w for k, _, w in COLUMNS}
FIXED = {k for k, _, w in COLUMNS if w}
SORTABLE = [k for k, *_ in COLUMNS if k != "mark"]
ALWAYS = ("mark", "id", "state", "progress", "accuracy")  # never dropped, however narrow
KEEP = ("model", "task", "grid", "profile", "elapsed", "loss", "seq_len", "seed", "device")
MEASURED = KEEP + ("id",)  # widths (of those not FIXED) and variety measured
TRUNCATE = {"model": 8, "task": 10, "grid": 10, "profile": 8}  # least width when truncated
PAD = 1  # DataTable's cell padding, each side
STATE_ORDER = {s: i for i, s in enumerate(("running", "pending") + tuple(s for s in STATES
                                                                        if s not in ("running", "pending")))}
FILTER_KEYS = ("profile", "model", "state", "task")
RESUMABLE = TERMINAL - {"finished"}
REBUILD_AT = 20  # rows leaving at once from which the table is rebuilt, not pruned

MARK = Text("●", style="bold yellow")
ABBREV = {"weight_decay": "wd", "batch_size": "bs", "warmup_steps": "warmup", "learning_rate": "lr"}


# --------------------------------------------------------------------------- grid values
def grid_labels(keys: Iterable[str]) -> dict[str, str]:
    """Each dotted grid key's short label: its last part (``train.lr`` -> ``lr``,
    ``train.weight_decay`` -> ``wd`` by :data:`ABBREV`), or as many trailing parts as tell it
    apart from the other keys (``model.d_model`` and ``task.d_model`` stay whole)."""
    keys = list(dict.fromkeys(keys))
    out = {}
    for k in keys:
        parts = k.split(".")
        for n in range(1, len(parts) + 1):
            tail = ".".join(parts[-n:])
            if not any(o != k and (o == tail or o.endswith("." + tail)) for o in keys):
                break
        short = ABBREV.get(tail, tail) if n == 1 else tail
        # an abbreviation must not collide with another key's label
        out[k] = short if short == tail or not any(
            o != k and (o.split(".")[-1] == short) for o in keys) else tail
    return out


def compact(v: Any) -> str:
    """A grid value in few characters: 1e-4 rather than 0.0001, 0.1, 16, cosine."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        plain = f"{v:.4g}"
        if v != 0:
            mant, _, exp = f"{v:.3e}".partition("e")
            sci = f"{mant.rstrip('0').rstrip('.')}e{int(exp)}"
            if len(sci) < len(plain):
                return sci
        return plain
    if isinstance(v, (list, tuple)):
        return ",".join(compact(x) for x in v)
    return str(v)


def grid_text(run: Run, labels: dict[str, str]) -> str:
    grid = run.spec.get("grid") or {}
    return " ".join(f"{labels.get(k, k)}={compact(v)}" for k, v in grid.items())


def task_text(run: Run) -> str:
    setting = run.spec.get("task_setting")
    return run.task if setting in (None, "baseline") else f"{run.task} [{setting}]"


# --------------------------------------------------------------------------- rows
def row_key(run: Run, marked: bool) -> tuple | None:
    """What :func:`row_cells` shows of a run, or None when it changes with the clock (a
    running run's elapsed time): equal keys mean equal cells, so those are not rebuilt.
    (The grid point and task setting never change for a run.)"""
    if run.state == "running" or (run.started is not None and run.ended is None):
        return None
    return (marked, run.profile, run.label, run.task, run.seq_len, run.seed, run.state,
            run.progress, run.last_loss, run.last_accuracy, run.started, run.ended, run.device,
            run.slot, slurm.describe(run) if slurm.is_slurm(run) else None)


def _t(s: str, justify: str = "left") -> Text:
    # Text, never str: DataTable reads a str cell as markup ("[seq_len=512]" would vanish)
    return Text(s, justify=justify, no_wrap=True, overflow="ellipsis")


def row_cells(run: Run, marked: bool = False, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The table cells of one run, by column key."""
    return {
        "mark": MARK if marked else "",
        "id": _t(str(run.id), "right"),
        "profile": _t(run.profile),
        "model": _t(run.label),
        "task": _t(task_text(run)),
        "seq_len": _t("" if run.seq_len is None else str(run.seq_len), "right"),
        "grid": _t(grid_text(run, labels or {})),
        "seed": _t(str(run.seed), "right"),
        "state": state_text(run.state),
        "progress": _t(percent(run.progress), "right"),
        "loss": _t(number(run.last_loss), "right"),
        "accuracy": _t(number(run.last_accuracy, 3), "right"),
        "elapsed": _t(duration(run.elapsed), "right"),
        # which GPU, when there are several: the scheduler's slot is the CUDA index; Slurm
        # runs: the job id and Slurm's state (PENDING with its reason, TIMEOUT, NODE_FAIL...)
        "device": _t(slurm.describe(run) if slurm.is_slurm(run) else
                     f"{run.device}:{run.slot}" if run.device == "cuda" and run.slot else (run.device or "")),
    }


def sort_value(run: Run, column: str, grid_keys: list[str]) -> Any:
    """The value a column sorts by (None: sorted last in either direction)."""
    if column == "task":
        return (run.task, run.spec.get("task_setting") or "")
    if column == "grid":
        grid = run.spec.get("grid") or {}
        return tuple(sort_key(grid.get(k)) for k in grid_keys) if grid else None
    if column == "state":
        return STATE_ORDER.get(run.state, len(STATE_ORDER))
    if column == "model":
        return run.label
    if column == "accuracy":
        return run.last_accuracy
    if column == "loss":
        return run.last_loss
    if column == "elapsed":
        return run.elapsed
    if column == "device":
        return run.device
    return getattr(run, column)


def order(runs: list[Run], column: str = "id", reverse: bool = False,
          grid_keys: list[str] | None = None) -> list[int]:
    """The run ids sorted by ``column`` (ties by id, ascending), empty values last."""
    keyed = [(sort_value(r, column, grid_keys or []), r.id) for r in sorted(runs, key=lambda r: r.id)]
    have = [x for x in keyed if x[0] is not None]
    have.sort(key=lambda x: x[0], reverse=reverse)  # stable: equal values keep id order
    return [rid for _, rid in have] + [rid for v, rid in keyed if v is None]


# --------------------------------------------------------------------------- filter
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


# --------------------------------------------------------------------------- layout
def layout(avail: int, natural: dict[str, int], varies: set[str],
           empty: set[str] = frozenset()) -> dict[str, int | None]:
    """The columns to show in ``avail`` cells of width, by key: None = its natural width,
    a number = truncated to that width. :data:`ALWAYS` first; then :data:`KEEP` in order,
    columns whose value varies between rows before those that do not, and those empty on
    every row last; a column that does not fit is truncated if it may be
    (:data:`TRUNCATE`) and its least width fits, else left out. ``natural``: each column's
    widest cell or header."""
    out: dict[str, int | None] = {k: None for k in ALWAYS}
    used = sum(natural[k] + 2 * PAD for k in ALWAYS)
    for k in sorted(KEEP, key=lambda k: (k not in varies, k in empty)):  # stable: KEEP order within
        need = natural[k] + 2 * PAD
        if used + need <= avail:
            out[k] = None
            used += need
        elif k in TRUNCATE and avail - used - 2 * PAD >= TRUNCATE[k]:
            out[k] = avail - used - 2 * PAD
            used = avail
    return {k: out[k] for k, *_ in COLUMNS if k in out}


class RunsTable(DataTable):
    """DataTable of runs keyed by run id; :meth:`update_runs` changes only cells that moved.

    Rebuilding the table on every poll would flicker and lose the cursor, so rows are
    added once and afterwards only their changed cells are rewritten. :attr:`filter`
    (``f``, ``/``) keeps some rows; :attr:`all_runs` holds every run of the last poll.
    """

    BINDINGS = [
        Binding("enter", "open_run", "Open run"),
        Binding("k", "kill_run", "Kill marked/this"),
        Binding("r", "resume_run", "Resume marked/this"),
        Binding("space", "toggle_mark", "Mark + down"),
        Binding("c", "compare", "Compare marked"),
        Binding("p", "compare_profile", "Compare profile"),
        Binding("f", "filter_profile", "Only this profile / all"),
        Binding("slash", "filter_dialog", "Filter"),
        Binding("s", "sort_next", "Sort column"),
        Binding("S", "sort_reverse", "Sort order", show=False),
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
        self._columns: dict[str, int | None] = {k: None for k, *_ in COLUMNS}  # shown: width
        self._natural: dict[str, int] = {k: len(h) + 2 for k, h, _ in COLUMNS} | {k: WIDTHS[k] for k in FIXED}
        self._first: dict[str, str] = {}  # each measured column's first value
        self._varies: set[str] = set()  # the measured columns whose value differs between rows

    # ------------------------------------------------------------------ columns
    def _header(self, key: str) -> Text:
        label = HEADERS[key]
        if key == self.sort_column:
            return Text(f"{label} {'▼' if self.sort_reverse else '▲'}", style="bold")
        return Text(label)

    def on_mount(self) -> None:
        self._add_columns()

    def _add_columns(self) -> None:
        for key, width in self._columns.items():
            w = WIDTHS[key] if key in FIXED else width
            self.add_column(self._header(key), key=key, width=w)

    def _avail(self) -> int:
        return self.size.width - self.styles.scrollbar_size_vertical

    def _relayout(self) -> bool:
        """Show the columns that fit (:func:`layout`): when they change, the table is
        built anew from the cells at hand (rows in their order, the cursor on its run).
        True when it was rebuilt."""
        if self.size.width <= 0:
            return False
        empty = {k for k in KEEP if k not in self._varies and not self._first.get(k)}
        want = layout(self._avail(), self._natural, self._varies, empty)
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
        self._natural = {k: len(h) + 2 for k, h, _ in COLUMNS} | {k: WIDTHS[k] for k in FIXED}
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
        if keys != self._grid_keys:
            self._grid_keys = keys
            self._labels = grid_labels(keys)
            self._keys.clear()  # the grid cells of every row change

    def update_runs(self, runs: list[Run]) -> None:
        """Show ``runs`` (the filter applied): new rows added, rows gone removed, changed
        cells rewritten, the order and the columns (:meth:`_relayout`) kept up."""
        self.all_runs = runs
        self.marked &= {r.id for r in runs}  # runs gone from the store
        self._grid_of(runs)
        if self.filter:
            runs = [r for r in runs if self.filter(r)]
        ids = {r.id for r in runs}
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
        before = (dict(self._natural), set(self._varies), dict(self._first))
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
                        # content-sized columns may need to grow (then the virtual size
                        # changes and DataTable repaints all by itself)
                        self.update_cell(key, k, cells[k], update_width=k not in FIXED and shown[k] is None)
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

    def _marked_runs(self) -> list[Run]:
        by_id = {r.id: r for r in self.all_runs}
        return [by_id[i] for i in sorted(self.marked) if i in by_id]

    @staticmethod
    def _ids(runs: list[Run], limit: int = 12) -> str:
        ids = [str(r.id) for r in runs]
        return ", ".join(ids[:limit]) + (f", ... ({len(ids)} in all)" if len(ids) > limit else "")

    def _hidden_note(self, runs: list[Run]) -> str:
        hidden = sum(r.id not in self._runs for r in runs)
        return f" ({hidden} of them hidden by the filter)" if hidden else ""

    def action_kill_run(self) -> None:
        """The marked runs, after one confirmation naming how many; nothing marked: the run
        under the cursor (the app confirms)."""
        if not self.marked:
            rid = self.current_run_id
            if rid is not None:
                self.post_message(KillRequested(rid))
            return
        marked = self._marked_runs()
        live = [r for r in marked if r.state not in TERMINAL]
        if not live:
            self.notify(f"none of the {len(marked)} marked runs is pending or running", severity="warning")
            return
        ended = len(marked) - len(live)
        question = (f"Kill {len(live)} marked run{'s' * (len(live) > 1)} (ids {self._ids(live)})"
                    f"{self._hidden_note(live)}?"
                    + (f"\n{ended} more marked run{'s' * (ended > 1)} already ended: left alone." if ended else ""))

        def answer(yes: bool | None) -> None:
            if yes:
                self.kill_runs([r.id for r in live])

        self.app.push_screen(ConfirmScreen(Text(question)), answer)

    def action_resume_run(self) -> None:
        """The marked runs that can resume (killed, crashed, preempted, failed), after one
        confirmation naming how many; nothing marked: the run under the cursor."""
        if not self.marked:
            rid = self.current_run_id
            if rid is not None:
                self.post_message(ResumeRequested(rid))
            return
        marked = self._marked_runs()
        can = [r for r in marked if r.state in RESUMABLE]
        if not can:
            self.notify(f"none of the {len(marked)} marked runs can resume (only killed, crashed, "
                        "preempted or failed runs do)", severity="warning")
            return
        other = len(marked) - len(can)
        question = (f"Resume {len(can)} marked run{'s' * (len(can) > 1)} (ids {self._ids(can)}) from "
                    f"their checkpoints{self._hidden_note(can)}?"
                    + (f"\n{other} more marked run{'s' * (other > 1)} pending, running or finished: "
                       "left alone." if other else ""))

        def answer(yes: bool | None) -> None:
            if yes:
                self.resume_runs([r.id for r in can])

        self.app.push_screen(ConfirmScreen(Text(question)), answer)

    # the kills and resumes run in a thread with their own store connection (a kill may
    # wait seconds for its worker; a resume may start a scheduler): the app's store root
    # and scheduler, as its own one-run kill uses
    def _store(self) -> Store:
        return Store(self.app.store.root)

    @work(thread=True, group="runs-action", exit_on_error=False)
    def kill_runs(self, ids: list[int]) -> None:
        store = self._store()
        killed, failed = [], []
        try:
            for rid in ids:
                try:
                    (killed if self.app.scheduler.kill(store, rid) else failed).append(rid)
                except Exception as e:  # shown; the other kills go on
                    failed.append(rid)
                    self.app.call_from_thread(self.notify, f"kill of run {rid} failed: {e}",
                                              severity="error", markup=False)
        finally:
            store.close()
        text = f"killed {len(killed)} run{'s' * (len(killed) != 1)}"
        if failed:
            text += f"; {len(failed)} not running (nothing killed): {', '.join(map(str, failed))}"
        self.app.call_from_thread(self.notify, text, severity="warning" if failed else "information",
                                  markup=False)
        self.app.call_from_thread(self._after_action)

    @work(thread=True, group="runs-action", exit_on_error=False)
    def resume_runs(self, ids: list[int]) -> None:
        from workbench.execute import resume

        store = self._store()
        try:
            done, errors = resume.resume_runs(store, ids)
        except Exception as e:
            done, errors = [], [f"resume failed: {e}"]
        finally:
            store.close()
        for text in errors[:5]:
            self.app.call_from_thread(self.notify, text, severity="warning", markup=False)
        if len(errors) > 5:
            self.app.call_from_thread(self.notify, f"... and {len(errors) - 5} more runs could not resume",
                                      severity="warning")
        if done:
            self.app.call_from_thread(self.notify, f"{len(done)} run{'s' * (len(done) > 1)} resume from "
                                      f"their checkpoints", markup=False)
        self.app.call_from_thread(self._after_action)

    def _after_action(self) -> None:
        poll = getattr(self.app, "poll_runs", None)
        if poll is not None:
            poll()

    # ------------------------------------------------------------------ marks, compare
    def _set_mark(self, run_id: int, on: bool) -> None:
        (self.marked.add if on else self.marked.discard)(run_id)
        cells = self._cells.get(run_id)
        if cells is not None:
            cells["mark"] = MARK if on else ""
            self._keys.pop(run_id, None)
            self.update_cell(str(run_id), "mark", cells["mark"])

    def action_toggle_mark(self) -> None:
        """Mark or unmark the run under the cursor, then move down (the footer says so):
        repeated presses mark a list."""
        rid = self.current_run_id
        if rid is None:
            return
        self._set_mark(rid, rid not in self.marked)
        if self.cursor_row < self.row_count - 1:
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
