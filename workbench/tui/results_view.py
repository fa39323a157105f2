"""The results view: the ``export`` comparison table inside the TUI.

One profile's finished runs (or all profiles'), one metric, rows and columns by any run
field or by eval set (e.g. induction heads' test lengths as columns); cells are mean ± std
over seeds; the best cells of each column are highlighted by the Welch rule of
:func:`workbench.results.aggregate.winners` (the best mean and every cell not significantly
different from it; cells of one run never).

Like with like: a cell averages runs that differ in the seed only. Where the chosen rows
and columns leave runs of different configurations in one cell (a profile name holding
four tasks, two tokenizers, a grid key neither laid out nor selected over), the differing
keys become row keys (:func:`workbench.results.export.build`) and the caption's first line
says so ("task varies within cells: added as a row key").

Grids: ``b`` chooses the grid keys each cell takes the best over (by default every grid key
of the profile's runs, :func:`workbench.results.aggregate.grid_keys`; then each smaller set,
then none) and ``v`` the split the choice is made on (validation, the default, or test,
the anchors' practice, labelled so). The table is :func:`workbench.results.export.build`'s, the
caption names the rule ("best over train.lr, train.weight_decay, selected on
validation"), and the line under it the grid point chosen for the cell under the cursor.

``w`` writes the table as Markdown, LaTeX and CSV files (the same selection), ``f`` the
figures of the profile (matplotlib). The store is re-read every few seconds while the tab
is shown, off the UI thread; the table is rebuilt only when the finished runs or the
choices changed.
"""
from __future__ import annotations

import itertools
import threading
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Label, Select, Static

from workbench.results import export
from workbench.results import aggregate as agg
from workbench.results import catalogue
from workbench.results.figure_base import safe_stem  # matplotlib itself is imported only to draw
from workbench.store import Store, progress, queries
from workbench.tui.background import PollsStore, write_in_thread
from workbench.tui.formatting import set_text
from workbench.tui.scaling_panel import ScalingPanel, analyse_all

POLL_S = 2.0  # results change only when a run finishes
ALL = "(all profiles)"
NONE = "(none)"  # best over no grid key: every run of a cell counts
SPLITS = ("validation", "test")
MAX_SUBSETS = 4  # grids of more keys offer all, all but one, each one, none


def over_options(keys: list[str]) -> list[str]:
    """The best-over choices for these grid keys, as Select labels: all of them first (the
    default), then smaller sets, then :data:`NONE`. Up to MAX_SUBSETS keys every subset;
    beyond, all but one key and each key alone."""
    if not keys:
        return [NONE]
    n = len(keys)
    sizes = range(n, 0, -1) if n <= MAX_SUBSETS else sorted({n, n - 1, 1}, reverse=True)
    subsets = [c for k in sizes for c in itertools.combinations(keys, k)]
    return [", ".join(c) for c in subsets] + [NONE]


DEFAULT_METRICS = ("accuracy", "acc", "perplexity", "loss")  # the first of these a profile holds is shown first
# a profile of language models (task lm) opens on bits per byte: it compares tokenizers,
# where a next-token accuracy says little and loss per token does not compare
LM_METRICS = ("bits_per_byte", "perplexity", "loss")


def over_keys(label: str | None) -> list[str]:
    """A best-over label back to its keys ([] for NONE)."""
    return [] if not label or label == NONE else label.split(", ")


class ResultsView(PollsStore, Vertical):
    BINDINGS = [
        Binding("m", "cycle('metric')", "Metric"),
        Binding("r", "cycle('rows')", "Rows"),
        Binding("o", "cycle('cols')", "Columns"),
        Binding("n", "cycle('profile')", "Profile", tooltip="Next profile"),
        Binding("b", "cycle('over')", "Best over", tooltip="Grid keys to take the best over"),
        Binding("v", "cycle('select_on')", "Val/test", tooltip="Select the grid point on validation or test"),
        Binding("w", "write_table", "Write", tooltip="Write the table as .md, .tex and .csv"),
        # (not in the footer, which is full: the fits' title says x, and ? lists it)
        Binding("x", "scaling_axis", "Fits' x", show=False,
                tooltip="Scaling fits' plot: training FLOPs or tokens on x"),
        Binding("f", "figures", "Figures", tooltip="Write every figure of the profile"),
    ]

    def __init__(self, store: Store, lock: threading.Lock | None = None,
                 out_dir: Path = Path("figures"), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.store, self.lock, self.out_dir = store, lock or nullcontext(), Path(out_dir)
        self.recs: list[dict] = []
        self.profiles: list[str] = []
        self._reading: str | None = None
        self.options: dict[str, list[str]] = {}  # each Select's values, in order
        self.chosen: set[str] = set()  # the choices the user made (the rest follow the data)
        self._shown: tuple | None = None  # what the table was last built from
        self.built: dict | None = None  # export.build's result for the table shown
        self._keys: tuple[list, list] = ([], [])  # the row and column keys shown, in order
        self.under_way: dict[str, int] = {}  # the profile's runs running and pending, by state
        self.fits: dict = {}  # scaling_panel.analyse_all's fits of the profile (none: not a grid)

    def compose(self) -> ComposeResult:
        with Horizontal(id="results-choices", classes="choices"):
            for fid, label in (("profile", "profile"), ("metric", "metric"), ("rows", "rows"),
                               ("cols", "columns")):
                yield Label(label, classes="choice-label")
                yield Select([], id=f"results-{fid}", allow_blank=True, compact=True,
                             prompt="–")
        with Horizontal(id="results-selection", classes="choices"):
            yield Label("best over", classes="choice-label")
            yield Select([], id="results-over", allow_blank=True, compact=True, prompt="–")
            yield Label("selected on", classes="choice-label")
            yield Select([(v, v) for v in SPLITS], id="results-select_on", allow_blank=False,
                         compact=True, value="validation")
        yield DataTable(id="results-table", zebra_stripes=True, cursor_type="cell")
        yield Static("", id="results-caption")
        yield Static("", id="results-cell")
        yield ScalingPanel(id="results-scaling")  # a scaling grid's fits (export --scaling)

    def on_mount(self) -> None:
        self.options["select_on"] = list(SPLITS)
        self.set_interval(POLL_S, self.refresh_data)

    # ------------------------------------------------------------------ reading
    def _value(self, fid: str) -> Any:
        v = self.query_one(f"#results-{fid}", Select).value
        return None if v is Select.NULL else v

    def refresh_data(self) -> None:
        """Re-read the store (in a thread) when the view is on screen."""
        if not self.is_attached or not self.screen.is_current:
            return
        if not self.is_on_screen:  # another tab in front (was not drawn in the last update)
            return
        self.poll()

    def poll(self) -> None:
        self._reading = self._value("profile")  # read on the UI thread, used by read()
        super().poll()

    def read(self) -> tuple[list[str], str | None, list[dict], dict[str, int], dict]:
        profile = self._reading
        with self.lock:
            profiles = self.store.profiles()
            if profile is None and profiles:  # the first time: the newest profile
                profile = queries.newest_profile(self.store) or profiles[0]
            recs = agg.records(self.store, None if profile == ALL else profile)
            # runs still to come (the caption says so rather than "F2 launches a sweep"):
            # the table's light read, no spec JSON decoded
            under_way: dict[str, int] = {}
            if not recs and profiles:
                for r in progress.table_runs(self.store, None if profile == ALL else profile):
                    if r.state in ("running", "pending"):
                        under_way[r.state] = under_way.get(r.state, 0) + 1
            # the scaling fits of a grid whose runs record their training compute
            fits = analyse_all(self.store, profile, recs) if profile and profile != ALL else {}
        return profiles, profile, recs, under_way, fits

    def apply(self, got: tuple[list[str], str | None, list[dict], dict[str, int], dict]) -> None:
        profiles, profile, recs, self.under_way, self.fits = got
        if "profile" in self.chosen and self._value("profile") not in (None, profile):
            self.call_later(self.poll)  # the user picked another profile during the read
            return
        if profiles != self.profiles:
            self.profiles = profiles
            self._set_options("profile", [ALL] + profiles, profile)
        elif self._value("profile") != profile:
            self._set_value("profile", profile)
        self.recs = recs
        self._choices_for(recs)
        self.rebuild()

    def _choices_for(self, recs: list[dict]) -> None:
        """Metric and field options from what the records hold, keeping the user's picks
        when they still apply; the others take defaults that follow the data (columns
        become the eval sets once a run has them)."""
        metrics = agg.metrics_of(recs) or list(catalogue.CATALOGUE)
        # lm-eval's <metric>_stderr is shown beside its metric (aggregate.with_stderr), not as a
        # metric of its own to cycle through
        metrics = [m for m in metrics if not (m.endswith("_stderr") and m.removesuffix("_stderr") in metrics)]
        fields = agg.fields_of(recs) if recs else ["model", "seq_len", "seed", "eval_set"]
        has_sets = any(r.get("eval_set") not in ("", "valid") for r in recs)  # not just validation
        metric, rows, cols, over = (self._value(f) if f in self.chosen else None
                                    for f in ("metric", "rows", "cols", "over"))
        # accuracy first; lm-eval's (an evaluation run's) before run-level counts like params
        firsts = LM_METRICS if recs and all(r.get("task") == "lm" for r in recs) else DEFAULT_METRICS
        self._set_options("metric", metrics, metric if metric in metrics else
                          next((m for m in firsts if m in metrics), metrics[0]))
        rows = rows if rows in fields else "model"
        # eval sets as columns when there are any (accuracy against test length), else the
        # sequence lengths (one column of mean ± std over seeds when there is one length)
        default_cols = "eval_set" if has_sets else "seq_len"
        cols = cols if cols in fields and cols != rows else default_cols
        self._set_options("rows", fields, rows)
        self._set_options("cols", fields, cols)
        overs = over_options(agg.grid_keys(recs))
        self._set_options("over", overs, over if over in overs else overs[0])

    def _set_options(self, fid: str, options: list[str], value: str | None) -> None:
        sel = self.query_one(f"#results-{fid}", Select)
        if self.options.get(fid) != options:
            self.options[fid] = list(options)
            with sel.prevent(Select.Changed):
                sel.set_options([(o, o) for o in options])
        self._set_value(fid, value)

    def _set_value(self, fid: str, value: str | None) -> None:
        sel = self.query_one(f"#results-{fid}", Select)
        if value is not None and sel.value != value:
            with sel.prevent(Select.Changed):
                sel.value = value

    @on(Select.Changed)
    def _changed(self, event: Select.Changed) -> None:
        event.stop()
        fid = event.select.id.removeprefix("results-")
        self.chosen.add(fid)  # programmatic changes are prevented: this is the user's
        if fid == "profile":
            self.chosen -= {"rows", "cols", "over"}  # another profile: its own default layout
            self._shown = None
            self.poll()
        else:
            self.rebuild()

    # ------------------------------------------------------------------ the table
    def current(self) -> tuple[str | None, str | None, str | None, str | None]:
        return tuple(self._value(f) for f in ("profile", "metric", "rows", "cols"))

    def selection(self) -> tuple[list[str], str]:
        """(the grid keys each cell takes the best over, the split the choice is made on).
        Keys that lay out the table (rows, columns) are not selected over: their values
        are the table's own rows or columns."""
        _, _, rows, cols = self.current()
        over = [k for k in over_keys(self._value("over")) if k not in (rows, cols)]
        return over, self._value("select_on") or "validation"

    def rebuild(self) -> None:
        profile, metric, rows, cols = self.current()
        self.query_one(ScalingPanel).show(self.fits, metric, self.recs)
        over, select_on = self.selection()
        key = (profile, metric, rows, cols, tuple(over), select_on,
               tuple((r["run_id"], r["eval_set"], r.get(metric)) for r in self.recs),
               tuple(sorted(self.under_way.items())))
        if key == self._shown:
            return
        self._shown = key
        self.built = None
        self._keys = ([], [])
        table = self.query_one("#results-table", DataTable)
        table.clear(columns=True)
        caption = self.query_one("#results-caption", Static)
        set_text(self.query_one("#results-cell", Static), "")
        if not self.recs or not metric or not rows or not cols:
            where = f" in profile {profile}" if profile and profile != ALL else ""
            if self.under_way:  # a sweep runs: the way on is to wait, not to launch one
                counts = ", ".join(f"{n} {s}" for s, n in sorted(self.under_way.items(), reverse=True))
                hint = f"{counts}; the table fills in as they finish (F1: the runs)"
            else:
                hint = "F2 launches a sweep"
            set_text(caption, Text(f"no finished runs{where} yet: {hint}", style="dim"))
            return
        try:
            b = export.build(self.recs, [metric], [rows], [cols], best_over=over, select_on=select_on)
        except agg.SelectionError as e:  # never a silent fall-back to another rule
            set_text(caption, Text.assemble(
                ("no table: ", "bold red"), str(e),
                ("\nv: select on the other split; b: best over other keys or none", "dim")))
            return
        self.built = b
        t, best = b["tables"][0]["table"], b["tables"][0]["best"]
        count = catalogue.is_count(metric)
        # a column without a number for this metric is left out (an evaluation's tasks: acc
        # on lambada and piqa, perplexity on lambada only; its run-level eval set has neither)
        shown = [ck for ck in t["cols"] if any((t["cells"].get((rk, ck)) or {}).get("mean") is not None
                                               for rk in t["rows"])] or t["cols"]
        row_fields = b["rows"]  # rows, then the keys that vary within its cells (b["added"])
        table.add_column(f"{'/'.join(row_fields)} \\ {cols}", key="__row__")
        for ck in shown:
            table.add_column(export._col_header([cols], ck), key=repr(ck))
        for rk in t["rows"]:
            cells: list[Any] = [export._label(row_fields, rk)]
            for ck in shown:
                text = export.fmt_cell(t["cells"].get((rk, ck)), count=count)
                cells.append(Text(text, style="bold green" if (rk, ck) in best else "",
                                  justify="right"))
            table.add_row(*cells, key=repr(rk))
        self._keys = (list(t["rows"]), shown)
        set_text(caption, self.caption(b, t, metric))
        self._show_cell(table.cursor_coordinate)

    @staticmethod
    def rule_text(b: dict) -> str:
        """'best over train.lr, train.weight_decay, selected on validation', or what counts
        without a selection."""
        if not b["best_over"]:
            return "no best-over: every run of a cell counts"
        return (f"best over {', '.join(b['best_over'])}, selected on "
                f"{'test' if b['select_on'] == 'test' else 'validation'} (by mean "
                f"{b['select_metric']}; each cell shows its chosen grid point's test numbers)")

    def caption(self, b: dict, t: dict, metric: str) -> Text:
        # evaluation runs (one a cell): '±' is lm-eval's standard error, and no cell is marked
        how = "" if t.get("evaluation") else {"max": "highest", "min": "lowest"}.get(catalogue.better(metric) or "", "")
        rule = self.rule_text(b)
        split = agg.split_note(b.get("added") or [])
        return Text.assemble(
            (f"{split}\n" if split else "", "bold yellow"),
            (f"{metric}", "bold"), f": {catalogue.describe(metric)}; {export.spread_text(t)}",
            (f"; green: {how} of each column, and ties within seed noise (Welch 5%; one run never)"
             if how else "", "green"),
            "\n", (rule, "bold yellow" if b["best_over"] and b["select_on"] == "test" else "bold"))

    def on_data_table_cell_highlighted(self, event: DataTable.CellHighlighted) -> None:
        event.stop()
        self._show_cell(event.coordinate)

    def _show_cell(self, coord) -> None:
        """The line under the caption: the grid point chosen for the cell under the cursor."""
        b, (row_keys, col_keys) = self.built, self._keys
        line = self.query_one("#results-cell", Static)
        if not b or not b["choices"] or not (0 <= coord.row < len(row_keys)) or not \
                (1 <= coord.column <= len(col_keys)):
            set_text(line, "")
            return
        _, _, rows, cols = self.current()
        fields = {**dict(zip(b["rows"], row_keys[coord.row])), cols: col_keys[coord.column - 1][0]}
        by = [k for k in (*b["rows"], cols) if k != "eval_set" and k not in b["best_over"]]
        c = next((c for c in b["choices"] if all(c.get(k) == fields[k] for k in by)), None)
        if c is None:
            set_text(line, "")
            return
        where = ", ".join(f"{k}={fields[k]}" for k in by)
        point = ", ".join(f"{k}={v}" for k, v in c["chosen"].items())
        set_text(line, Text.assemble(
            f"{where}: ", (point, "bold"), f", best of {c['candidates']} grid point(s) by "
            f"{'test' if c['select_on'] == 'test' else 'validation'} {c['metric']} "
            f"{c['mean']:.4g} (n={c['n']})"))

    # ------------------------------------------------------------------ actions
    def action_cycle(self, fid: str) -> None:
        sel = self.query_one(f"#results-{fid}", Select)
        options = self.options.get(fid, [])
        if not options:
            return
        value = sel.value
        nxt = options[(options.index(value) + 1) % len(options)] if value in options else options[0]
        if fid in ("rows", "cols"):  # rows and columns by the same field make no table
            other = self._value("cols" if fid == "rows" else "rows")
            if nxt == other:
                nxt = options[(options.index(nxt) + 1) % len(options)]
        sel.value = nxt  # posts Changed: rebuilds (or re-reads, for the profile)

    def action_scaling_axis(self) -> None:
        panel = self.query_one(ScalingPanel)
        if not isinstance(panel.result, dict):
            self.notify("no scaling fits here: x puts training tokens or FLOPs on their plot", markup=False)
            return
        panel.toggle_axis()

    def action_write_table(self) -> None:
        profile, metric, rows, cols = self.current()
        if not self.recs or not metric:
            self.notify("no table to write", severity="warning")
            return
        from workbench.tui.paths import profile_dir  # the profile's own folder, absolute

        out = profile_dir(self.out_dir, None if profile == ALL else profile)
        over, select_on = self.selection()
        sel = f"-best-over-{'-'.join(over)}-on-{select_on}" if over else ""
        stem = out / safe_stem(f"{profile}-{metric}-by-{rows}-{cols}{sel}")
        try:  # every format rendered before any file is written
            texts = {stem.parent / (stem.name + ext): export.render(  # not with_suffix: keys have dots
                self.recs, metric, [rows], [cols], fmt, best_over=over, select_on=select_on)
                for fmt, ext in (("md", ".md"), ("latex", ".tex"), ("csv", ".csv"))}
        except agg.SelectionError as e:
            self.notify(f"no table to write: {e}", severity="warning", markup=False)
            return
        written = []
        try:
            try:
                out.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise export.CannotWrite(export.cannot_write_text(out, e)) from None
            for path, text in texts.items():
                # whole or not at all: a full disk leaves no 0-byte table that looks like a result
                written.append(export.write_atomic(path, text))
        except export.CannotWrite as e:
            done = f" (wrote {', '.join(p.name for p in written)})" if written else ""
            self.notify(f"{e}{done}", title="cannot write the table", severity="error", markup=False)
            return
        self.notify("wrote " + ", ".join(map(str, written)), markup=False)

    def action_figures(self) -> None:
        from workbench.results import plot

        profile = self.current()[0]
        if not profile or profile == ALL or not self.recs:
            self.notify("pick one profile with finished runs first", severity="warning")
            return
        from workbench.tui.paths import profile_dir  # the profile's own folder, absolute

        out = profile_dir(self.out_dir, profile)
        write_in_thread(self, self.store.root, lambda store: plot.plot_profile(store, profile, out)[0],
                        f"the figures of {profile}")
