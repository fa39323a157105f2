"""The compare view: several runs' loss and accuracy curves overlaid, runs that differ only
by seed grouped into one line with a mean ± std (or min..max) band.

Like the run view it polls the store at ~2 Hz in a thread worker, reads only metric rows
newer than the last one seen, and redraws only when rows arrived or a setting changed, so
runs that are still training update live at the run view's rate.

Keys: ``x`` step / epoch / wall time / training tokens / training FLOPs (the last two from
each run's recorded tokens per step and FLOPs per token: compute-matched comparisons of
language models), ``b`` band std / min..max / none, ``g`` group seeds
or show every run, ``l`` / ``a`` which loss (train or eval loss, eval perplexity or bits per byte) / accuracy metric (only those the runs logged),
``f`` write the figures (PNG + SVG, matplotlib) of what is shown into the profile's folder
(:mod:`workbench.tui.paths`). Under 100 columns the legend goes under the plots, so the
group names are not cut. The legend's last two columns are each group's last value of the
metric each plot shows, headed by that metric's short name (:data:`LEGEND_NAMES`:
``train loss``, ``eval bpb``, ``eval acc``), so they follow ``l`` and ``a``; the footer
names the two keys the same way (``l train loss  a eval bpb``), not "Loss/Acc metric". Runs that are
all language models (task ``lm``) open the second plot on eval bits per byte, ``a`` going
through perplexity and accuracy (:data:`LM_SECOND`), not on accuracy.
"""
from __future__ import annotations

import threading
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Header, Static

from workbench.results import curves as cv
from workbench.store import Run, Store
from workbench.tui import paths
from workbench.tui.background import PollsStore, write_in_thread
from workbench.tui.formatting import accuracy, number, set_text, state_text
from workbench.tui.help_screen import KeysFooter
from workbench.tui.plots import COLOURS, CurvePlot

POLL_S = 0.5
LOSS_METRICS = [("train", "loss"), ("eval", "loss"), ("eval", "perplexity"), ("eval", "bits_per_byte")]
ACC_METRICS = [("eval", "accuracy"), ("eval", "sequence_accuracy"), ("train", "accuracy")]
# a language model's second plot: bits per byte first (it compares tokenizers)
LM_SECOND = [("eval", "bits_per_byte"), ("eval", "perplexity"), ("eval", "accuracy")]
# the legend's headers for the metric each plot shows (short: the legend sits beside the plots)
LEGEND_NAMES = {("train", "loss"): "train loss", ("eval", "loss"): "eval loss",
                ("eval", "perplexity"): "eval ppl", ("eval", "bits_per_byte"): "eval bpb",
                ("eval", "accuracy"): "eval acc", ("eval", "sequence_accuracy"): "eval seq acc",
                ("train", "accuracy"): "train acc"}


def _next(options: list, current: Any) -> Any:
    return options[(options.index(current) + 1) % len(options)] if current in options else options[0]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def title_text(what: str, n_runs: int, n_lines: int, axis: str, band: str, by_seed: bool) -> Text:
    """The line above the plots: how many runs in how many groups (or lines), the x axis,
    and the band only where there is one (grouped seeds; one line per run has none)."""
    if by_seed:
        shape = f"{_plural(n_runs, 'run')} in {_plural(n_lines, 'group')}"
        spread = {"std": "band: mean ± std over seeds", "minmax": "band: min..max over seeds",
                  "none": "no band"}[band]
        how = "seeds grouped (g: a line per run)"
    else:
        shape = f"{_plural(n_runs, 'run')}, a line each"
        spread = "no band (one run per line)"
        how = "each run (g: group seeds)"
    return Text.assemble((f"compare {what}", "bold"), f"  {shape}  x: {axis}  {spread}  ", (how, "dim"))


class CompareScreen(PollsStore, Screen):
    CSS_PATH = "compare.tcss"
    BINDINGS = [
        Binding("escape,backspace", "app.pop_screen", "Back"),
        Binding("x", "cycle_axis", "x axis"),
        Binding("b", "cycle_band", "Band"),
        Binding("g", "toggle_group", "Group seeds"),
        # shown in the footer as the metric each key's plot shows now (:meth:`_name_keys`)
        Binding("l", "cycle_loss", "Loss metric", tooltip="Cycle the first plot: train loss, eval loss, "
                "eval perplexity, eval bits per byte"),
        Binding("a", "cycle_acc", "Second metric", tooltip="Cycle the second plot: eval accuracy, sequence "
                "accuracy, train accuracy (language models: eval bits per byte, perplexity, accuracy)"),
        Binding("f", "figures", "Write figures"),
    ]

    def __init__(self, store: Store, run_ids: list[int], lock: threading.Lock | None = None,
                 title: str = "", figures_dir: Path | None = None) -> None:
        """``figures_dir``: the folder under which ``f`` writes, into the folder of the
        runs' profile (:func:`workbench.tui.paths.runs_dir`); default the store's."""
        super().__init__()
        self.store, self.run_ids = store, sorted(run_ids)
        self.lock = lock or nullcontext()
        self.what = title or f"{len(run_ids)} runs"
        self.figures_dir = paths.output_root(store.root, figures_dir)
        self.axis, self.band, self.by_seed = "step", "std", True
        self.loss_metric, self.acc_metric = LOSS_METRICS[0], ACC_METRICS[0]
        self.second = ACC_METRICS  # what `a` goes through (language models: LM_SECOND)
        self.runs: list[Run] = []
        self.rows: list[Any] = []  # every curve-metric row of these runs read so far
        self.last_rowid = 0
        self._dirty = True  # settings changed or rows arrived: recompute and redraw

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="compare-title")
        with Horizontal(id="compare-body"):
            with Vertical(id="compare-plots"):
                yield CurvePlot("loss", id="compare-loss")
                yield CurvePlot("accuracy", id="compare-acc")  # auto range: differences near 1 show
            yield DataTable(id="compare-legend", cursor_type="none", zebra_stripes=True)
        yield KeysFooter()

    def on_mount(self) -> None:
        self.title = f"compare {self.what}"
        self._legend_columns()
        self.poll()
        self.set_interval(POLL_S, self.poll)

    # ------------------------------------------------------------------ polling
    def read(self) -> tuple[list[Run], list[Any]]:
        with self.lock:
            return (self.store.runs(ids=self.run_ids),
                    cv.read_rows(self.store, self.run_ids, self.last_rowid))

    def apply(self, got: tuple[list[Run], list[Any]]) -> None:
        runs, rows = got
        states = [(r.state, r.started) for r in runs]
        if rows:
            self.rows.extend(rows)
            self.last_rowid = rows[-1]["rowid"]
            self._dirty = True
        if states != [(r.state, r.started) for r in self.runs]:
            self._dirty = True  # a run started (wall x needs it) or ended
        if runs and not self.runs and all(r.task == "lm" for r in runs) and self.second is ACC_METRICS:
            self.second, self.acc_metric = LM_SECOND, LM_SECOND[0]
            self._dirty = True
        self.runs = runs
        if self._dirty:
            self._dirty = False
            self.redraw()

    # ------------------------------------------------------------------ drawing
    def current_curves(self) -> tuple[list[cv.GroupCurve], list[cv.GroupCurve]]:
        budget = max(200, 4 * self.size.width)
        return tuple(cv.curves_from_rows(self.runs, self.rows, split, name, self.axis, self.band,
                                         self.by_seed, budget)
                     for split, name in (self.loss_metric, self.acc_metric))

    def redraw(self) -> None:
        loss, acc = self.current_curves()
        # one colour per group in both plots, even when a group has no points in one of them
        order = [k for k in cv.group_runs(self.runs, self.by_seed)]
        labels = cv.group_labels(cv.group_runs(self.runs, self.by_seed))
        colour_of = {labels[k]: COLOURS[i % len(COLOURS)] for i, k in enumerate(order)}
        xlabel = cv.X_LABELS[self.axis]
        live = any(not r.finished for r in self.runs)  # (pending or running: rows may come)
        for plot, metric, cs in ((self.query_one("#compare-loss", CurvePlot), self.loss_metric, loss),
                                 (self.query_one("#compare-acc", CurvePlot), self.acc_metric, acc)):
            plot.colours = [colour_of.get(c.label, COLOURS[0]) for c in cs]
            plot.empty_text = self.empty_text(metric, live)
            plot.show(cv.CURVE_METRICS[metric], cs, xlabel)
        self._show_legend(order, labels, colour_of, loss, acc)
        self._name_keys()
        set_text(self.query_one("#compare-title", Static),
                 title_text(self.what, len(self.runs), len(order), self.axis, self.band, self.by_seed))

    def empty_text(self, metric: tuple[str, str], live: bool) -> str:
        """Why a plot is empty: the runs logged the metric but not against this x axis (runs
        on fresh batches have no epochs; runs not started no wall time), nothing logged
        yet, or nothing at all."""
        name = cv.CURVE_METRICS[metric]
        if self.logged([metric]):
            why = ("they draw fresh batches, so they have no epochs" if self.axis == "epoch"
                   else "they record no token or FLOP count" if self.axis in ("tokens", "flops")
                   else f"it has no {cv.X_LABELS[self.axis]}")
            return f"no {name} against {cv.X_LABELS[self.axis]}: these runs logged it, but {why} (x: another axis)"
        return f"no {name} yet" if live else f"no {name}: these runs ended without logging it"

    def _name_keys(self) -> None:
        """The footer names ``l`` and ``a`` by the metric each plot shows (``l train loss``,
        ``a eval bpb``): a fixed "Acc metric" read as accuracy while a language model's second
        plot showed bits per byte or perplexity."""
        keys = self._bindings.key_to_bindings
        changed = False
        for key, metric in (("l", self.loss_metric), ("a", self.acc_metric)):
            name = LEGEND_NAMES.get(metric, cv.CURVE_METRICS.get(metric, metric[1]))
            if any(b.description != name for b in keys.get(key, [])):
                keys[key] = [replace(b, description=name) for b in keys[key]]
                changed = True
        if changed:
            self.refresh_bindings()

    def _legend_columns(self) -> None:
        """The legend's columns, the last two headed by the metrics the plots show (built
        anew when ``l`` or ``a`` changed one: a column's width follows its header)."""
        table = self.query_one("#compare-legend", DataTable)
        heads = [LEGEND_NAMES.get(m, cv.CURVE_METRICS.get(m, m[1])) for m in (self.loss_metric, self.acc_metric)]
        if [str(table.columns[k].label) for k in ("loss", "acc") if k in table.columns] == heads:
            return
        table.clear(columns=True)
        for key, label in (("colour", ""), ("group", "group"), ("runs", "runs"), ("state", "state"),
                           ("loss", heads[0]), ("acc", heads[1])):
            table.add_column(label, key=key)

    def _show_legend(self, order, labels, colour_of, loss, acc) -> None:
        table = self.query_one("#compare-legend", DataTable)
        groups = cv.group_runs(self.runs, self.by_seed)
        last = {c.label: c.mean[-1] for c in loss}, {c.label: c.mean[-1] for c in acc}
        self._legend_columns()
        table.clear()
        for k in order:
            label, rs = labels[k], groups[k]
            states = sorted({r.state for r in rs})
            table.add_row(
                Text("━━", style=colour_of[label].replace("orange", "dark_orange")),
                label, ",".join(str(r.id) for r in rs),
                state_text(states[0]) if len(states) == 1 else Text("/".join(states)),
                Text(number(last[0].get(label)), justify="right"),
                Text(accuracy(last[1].get(label)) if "accuracy" in self.acc_metric[1] else
                     number(last[1].get(label)), justify="right"))

    # ------------------------------------------------------------------ actions
    def _changed(self) -> None:
        self.redraw()

    def action_cycle_axis(self) -> None:
        self.axis = _next(list(cv.X_AXES), self.axis)
        self._changed()

    def action_cycle_band(self) -> None:
        self.band = _next(list(cv.BANDS), self.band)
        if not self.by_seed:
            self.notify("one line per run has no band: g groups the seeds again", markup=False)
        self._changed()

    def action_toggle_group(self) -> None:
        self.by_seed = not self.by_seed
        self._changed()

    def logged(self, metrics: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Those of ``metrics`` that the runs logged (in the rows read so far)."""
        have = {(r["split"], r["name"]) for r in self.rows}
        return [m for m in metrics if m in have]

    def _cycle(self, metrics: list[tuple[str, str]], current: tuple[str, str], what: str) -> tuple[str, str]:
        """The next of ``metrics`` the runs logged; a note when there is no other."""
        offered = self.logged(metrics)
        if not offered or offered == [current]:
            have = cv.CURVE_METRICS[current] if offered else f"no {what} metric yet"
            self.notify(f"these runs logged only {have}" if offered else have, markup=False)
            return current
        return _next(offered, current)

    def action_cycle_loss(self) -> None:
        self.loss_metric = self._cycle(LOSS_METRICS, self.loss_metric, "loss")
        self._changed()

    def action_cycle_acc(self) -> None:
        self.acc_metric = self._cycle(self.second, self.acc_metric, "accuracy")
        self._changed()

    def action_figures(self) -> None:
        from workbench.results import plot

        runs, axis, band, by_seed = list(self.runs), self.axis, self.band, self.by_seed
        metrics = [m for m in (self.loss_metric, self.acc_metric) if m in self.logged([m])]
        if not runs or not metrics:
            self.notify("nothing to draw yet: no loss or accuracy logged", severity="warning", markup=False)
            return
        out = paths.runs_dir(self.figures_dir, (r.profile for r in runs))
        write_in_thread(self, self.store.root, lambda store: [
            path for metric in metrics for path in plot.plot_curves(
                store, runs, out, metric=metric, axis=axis, band=band, by_seed=by_seed)],
            "figures")
