"""The Results tab's scaling fits: for a profile whose runs form a scaling grid (each model
trained at several sizes), each model's power law L(C) = a·C^-b of a loss-like metric against
training FLOPs, fitted along size only (one row per model and value of every other setting
that varies, such as task.tokenizer), its exponent b and its compute multiplier against the
first model at the same settings: :func:`workbench.results.scaling.analyse`, the table
``export --scaling`` prints. A row that is no law (fewer than three sizes, a loss that rises
or does not decrease with compute) says why in its b cell, in yellow, and gets no line on the
plot; with no law at all the title says why per row.

Beside the table (wide terminals) a log-log plot of the points, one colour per model, with
the fitted lines; ``x`` in the Results tab puts training tokens on its x axis instead of
FLOPs (the points only: the laws are fitted in FLOPs). The fits are made off the UI thread
(:meth:`ResultsView.read`); this widget only shows them.
"""
from __future__ import annotations

import math
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Static
from textual_plotext import PlotextPlot

from workbench.results import scaling
from workbench.tui.formatting import set_text
from workbench.tui.plots import COLOURS

LOSS_LIKE = ("loss", "perplexity", "bits_per_byte")  # what a scaling law is fitted to
X_AXES = {"flops": "training FLOPs", "tokens": "training tokens"}
FIT_POINTS = 40  # points along each fitted line


def fit_metric(metric: str | None) -> str:
    """The metric the fits are shown for: the table's when it is loss-like, else loss."""
    return metric if metric in LOSS_LIKE else "loss"


def analyse_all(store, profile: str, recs: list[dict]) -> dict[str, Any]:
    """{metric: analyse()'s result, or the ScalingError's text} for the loss-like metrics
    the records hold; {} when the profile is no scaling grid (no run with a compute)."""
    if not any(scaling.run_compute(r) for r in recs):
        return {}
    have = {m for r in recs for m in r.get("__metrics__", ())}
    out: dict[str, Any] = {}
    for metric in LOSS_LIKE:
        if metric not in have:
            continue
        try:
            out[metric] = scaling.analyse(store, profile, metric)
        except scaling.ScalingError as e:
            out[metric] = str(e)
    return out


def token_points(recs: list[dict], metric: str) -> dict[str, list[tuple[float, float, int]]]:
    """{row label: [(training tokens, metric, seeds)]}: the fits' points with tokens trained
    in place of the compute (grouped along size and over seeds the same way)."""
    swapped = [{**r, "train_flops": r.get("tokens_trained"), "flops_per_token": None} for r in recs]
    pts, _, _, labels = scaling.points_by_group(swapped, metric)
    return {labels[k]: p for k, p in pts.items()}


def no_law_text(res: dict) -> str:
    """Why no row of ``res`` is a law: each distinct reason with the rows it holds for."""
    why: dict[str, list[str]] = {}
    for g in res["groups"].values():
        why.setdefault(g.note, []).append(g.label)
    return "; ".join(f"{', '.join(labels)}: {note}" for note, labels in why.items())


def short(cell: str) -> str:
    """A table cell with exponents written short: '1.60e+13..6.40e+13' -> '1.60e13..6.40e13'."""
    return cell.replace("e+", "e")


def log_ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    """About ``n`` x ticks from lo to hi, evenly spaced on a log axis (lo alone when lo == hi)."""
    if not (lo > 0 and hi > lo):
        return [lo]
    return [lo * (hi / lo) ** (k / (n - 1)) for k in range(n)]


class ScalingPanel(Vertical):
    """The fits table, its caption and (wide terminals) the log-log plot."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.result: dict | str | None = None  # analyse()'s result, its error text, or none
        self.recs: list[dict] = []
        self.axis = "flops"
        self._shown: tuple | None = None
        self._title: tuple[str, str] | None = None  # (metric, law) of the fits' title

    def compose(self) -> ComposeResult:
        yield Static("", id="scaling-title")
        with Horizontal(id="scaling-body"):
            yield DataTable(id="scaling-table", cursor_type="none", zebra_stripes=True)
            yield PlotextPlot(id="scaling-plot")
        yield Static("", id="scaling-caption")

    def on_mount(self) -> None:
        self.display = False

    def show(self, fits: dict[str, Any], metric: str | None, recs: list[dict]) -> None:
        """Show the fits of the table's metric (loss when it is not loss-like); hidden when
        the profile has no runs with a training compute."""
        m = fit_metric(metric)
        res = fits.get(m) if fits else None
        if fits and res is None:
            res = f"no finished run has {m}"
        key = (m, self.axis, res if not isinstance(res, dict) else
               (res["reference"], tuple((name, g.status, tuple(g.points)) for name, g in res["groups"].items())))
        if key == self._shown:
            return
        self._shown = key
        self.result, self.recs = res, recs
        self.display = res is not None
        if res is None:
            return
        title = self.query_one("#scaling-title", Static)
        table = self.query_one("#scaling-table", DataTable)
        table.clear(columns=True)
        if isinstance(res, dict) and not res["fits"]:  # rows, but none is a law: say why
            res = self.result = no_law_text(res)
            self._title = None
        if isinstance(res, str):  # not (yet) a grid with enough sizes per model
            set_text(title, Text.assemble(("Scaling fits", "bold"), f" of {m} against training FLOPs: ",
                                          ("none yet: ", "yellow"), res.replace("\n", "; ")))
            set_text(self.query_one("#scaling-caption", Static), "")
            self.query_one("#scaling-body").display = False
            return
        self.query_one("#scaling-body").display = True
        header, body = scaling.rows(res)
        for i, h in enumerate(header):
            table.add_column(h, key=str(i))
        for i, (row, g) in enumerate(zip(body, res["groups"].values())):  # the row's colour on the plot
            colour = COLOURS[i % len(COLOURS)].replace("orange", "dark_orange")
            # 1.6e13, not 1.6e+13: the multiplier column still fits 80 columns; a row that is
            # no law has its reason in the b cell, in yellow
            table.add_row(Text(row[0], style=f"bold {colour}"),
                          *(Text(short(c), justify="right", style="" if g.ok or j != 3 else "yellow")
                            for j, c in enumerate(row[1:])))
        law = "L(C) = a·C^-b" if res["form"] == "power" else "L(C) = E + a·C^-b"
        self._title = (m, law)
        self._show_title()
        set_text(self.query_one("#scaling-caption", Static), Text(scaling.caption(res), style="dim"))
        self.redraw()

    def _show_title(self) -> None:
        """The fits' title; it names ``x`` (plot against tokens / FLOPs) only while the plot
        shows (a narrow terminal hides it: results.tcss)."""
        if self._title is None or not isinstance(self.result, dict):
            return
        m, law = self._title
        parts = [("Scaling fits", "bold"), f" (export --scaling): {m} against training FLOPs C, {law}"]
        if self.query_one("#scaling-plot").display:
            parts += ["; ", ("x: plot against ", "dim"), (X_AXES["tokens" if self.axis == "flops" else "flops"], "dim")]
        set_text(self.query_one("#scaling-title", Static), Text.assemble(*parts))

    def on_resize(self) -> None:
        # the -narrow / -wide class (and so the plot's display) follows the terminal's width
        self.call_after_refresh(self._show_title)

    def redraw(self) -> None:
        res = self.result
        plot = self.query_one("#scaling-plot", PlotextPlot)
        plt = plot.plt
        plt.clear_data()
        plt.clear_figure()
        if not isinstance(res, dict):
            plot.refresh()
            return
        metric = res["metric"]
        plt.title(f"{metric} vs {X_AXES[self.axis]} (log-log)")
        plt.xlabel(X_AXES[self.axis])
        plt.xscale("log")
        plt.yscale("log")
        pts = ({m: g.points for m, g in res["groups"].items()} if self.axis == "flops"
               else token_points(self.recs, metric))
        xs_all = [c for p in pts.values() for c, _, _ in p]
        if xs_all:  # plotext writes 16000000000000.0 on a log axis: short labels instead
            ticks = log_ticks(min(xs_all), max(xs_all))
            plt.xticks(ticks, [short(f"{t:.2g}") for t in ticks])
        for i, (label, g) in enumerate(res["groups"].items()):
            colour = COLOURS[i % len(COLOURS)]
            p = pts.get(label) or []
            if p:
                # no legend inside the plot (it hid the points): the table's names are in these colours
                plt.scatter([c for c, _, _ in p], [v for _, v, _ in p], color=colour,
                            marker="●" if g.ok else "○")
            fit = g.fit
            if g.ok and self.axis == "flops":  # a law, and in FLOPs: its line only there
                lo, hi = fit.compute_range
                xs = [lo * (hi / lo) ** (k / (FIT_POINTS - 1)) for k in range(FIT_POINTS)] if hi > lo else [lo]
                ys = [float(y) for y in fit.predict(xs)]
                if all(math.isfinite(y) and y > 0 for y in ys):
                    plt.plot(xs, ys, color=colour, marker="braille")
        plot.refresh()

    def toggle_axis(self) -> str:
        self.axis = "tokens" if self.axis == "flops" else "flops"
        self._shown = None
        if isinstance(self.result, dict):
            self.show({self.result["metric"]: self.result}, self.result["metric"], self.recs)
        return self.axis

    def plotted(self) -> dict[str, list[float]]:
        """{model: the x values of its points} as the plot draws them now (tests)."""
        res = self.result
        if not isinstance(res, dict):
            return {}
        pts = ({m: g.points for m, g in res["groups"].items()} if self.axis == "flops"
               else token_points(self.recs, res["metric"]))
        return {m: [c for c, _, _ in p] for m, p in pts.items()}
