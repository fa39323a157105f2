"""Streaming line plots of metric series (textual-plotext).

A series whose values are all equal (an accuracy stuck at 0, a loss at its floor) would
get plotext's own -1..1-style range around it; :func:`flat_range` gives it a range that
starts at zero instead, so 0 sits at the bottom and a constant reads as what it is. An
empty plot says why it is empty (``empty_text``: waiting, or the run failed).

A :class:`MetricPlot` keeps its points by step and draws them against ``xscale`` x step
under ``xlabel``: a language model's run view sets the tokens a step and "training tokens"
(the count is known from the run's info, maybe after the first points came), so its
curves read against the tokens seen, with short tick labels (512k, 2.6e8).
"""
from __future__ import annotations

from textual_plotext import PlotextPlot

# plotext colour names, one per series in insertion order
COLOURS = ["cyan", "orange", "green", "magenta", "red", "blue"]


def thin(values: list[float], budget: int) -> list[float]:
    """Every k-th value (and the last) so at most ~budget points are drawn: a long run's
    thousands of loss records would otherwise make each redraw slow, for pixels the
    terminal cannot show anyway."""
    if len(values) <= budget:
        return values
    k = -(-len(values) // budget)
    out = values[::k]
    if (len(values) - 1) % k:  # the newest point is always drawn
        out.append(values[-1])
    return out


def flat_range(values) -> tuple[float, float] | None:
    """(lo, hi) for the y axis when every value is the same (None otherwise, or when there
    are none): from 0 up to twice the value (or 1 when it is 0), or from twice a negative
    value up to 0."""
    vals = [v for v in values if v is not None and v == v]  # (NaN != NaN)
    if not vals or min(vals) != max(vals):
        return None
    v = vals[0]
    if v > 0:
        return 0.0, 2 * v
    if v < 0:
        return 2 * v, 0.0
    return 0.0, 1.0


def short_ticks(plt, xs: list[float], n: int = 5) -> None:
    """Tick labels like 2.6e8 (FLOPs) or 512k (tokens) where plotext would write every digit
    (256000000): x values of a million or more get ``n`` evenly spaced ticks, labelled with
    3 significant digits."""
    if not xs or max(abs(x) for x in xs) < 1e6:
        return
    lo, hi = min(xs), max(xs)
    ticks = [lo + (hi - lo) * k / (n - 1) for k in range(n)] if hi > lo else [lo]
    plt.xticks(ticks, [f"{t:.3g}".replace("e+0", "e").replace("e+", "e") for t in ticks])


class MetricPlot(PlotextPlot):
    """Plot several (step, value) series. Appending data does not redraw; :meth:`redraw`
    does, so the caller decides the rate (the run view redraws only when rows arrived)."""

    def __init__(self, title: str, ylabel: str, ylim: tuple[float, float] | None = None,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.title, self.ylabel, self.ylim = title, ylabel, ylim
        self.series: dict[str, tuple[list[float], list[float]]] = {}
        self.xmax: float | None = None  # the run's total steps: both plots share one x range
        self.xlabel, self.xscale = "step", 1.0  # x drawn = step x xscale (LM: tokens a step)
        self.empty_text = "waiting for metrics..."  # the run view says why when the run ended
        self.draws = 0  # how many times the data was replotted (tests check the throttle)

    def on_mount(self) -> None:
        super().on_mount()
        self.redraw()

    def append(self, label: str, x: float, y: float | None) -> None:
        if y is None:  # the store keeps non-finite values as NULL
            return
        xs, ys = self.series.setdefault(label, ([], []))
        xs.append(x)
        ys.append(y)

    def redraw(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.title)
        plt.xlabel(self.xlabel)
        plt.ylabel(self.ylabel)
        flat = flat_range(y for _, ys in self.series.values() for y in ys)
        if self.ylim is not None:
            plt.ylim(*self.ylim)
        elif flat is not None:
            plt.ylim(*flat)
        if self.xmax:
            plt.xlim(0, self.xmax * self.xscale)
        budget = max(200, 4 * self.size.width)  # braille: 2 dots per cell, x2 to spare
        if self.xscale != 1.0:  # tokens: long counts as 512k / 2.6e8 ticks
            short_ticks(plt, [0.0, *([self.xmax * self.xscale] if self.xmax else []),
                              *(x * self.xscale for xs, _ in self.series.values() for x in xs)])
        for i, (label, (xs, ys)) in enumerate(self.series.items()):
            xs, ys = thin(xs, budget), thin(ys, budget)
            if self.xscale != 1.0:
                xs = [x * self.xscale for x in xs]
            plt.plot(xs, ys, label=label, color=COLOURS[i % len(COLOURS)], marker="braille")
        if not self.series:
            plt.text(self.empty_text, x=0.5, y=0.5, alignment="center")
            plt.xlim(0, 1)
            plt.ylim(0, 1)
        self.draws += 1
        self.refresh()  # textual-plotext needs this after the data changed


class CurvePlot(PlotextPlot):
    """Group curves (:class:`workbench.results.curves.GroupCurve`): the mean as a line, its band's
    edges as faint dots in the same colour. The legend is the caller's (the compare view's
    table: a legend inside the plot would hide the curves once there are a few groups);
    ``colours`` keeps one colour per group across the view's plots."""

    def __init__(self, title: str, ylim: tuple[float, float] | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.title, self.ylim = title, ylim
        self.curves: list = []
        self.colours: list[str] = []  # per curve; default: COLOURS in order
        self.xlabel = "step"
        self.empty_text = "waiting for metrics..."
        self.draws = 0

    def on_mount(self) -> None:
        super().on_mount()
        self.redraw()

    def show(self, title: str, curves: list, xlabel: str) -> None:
        self.title, self.curves, self.xlabel = title, curves, xlabel
        self.redraw()

    def redraw(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.title)
        plt.xlabel(self.xlabel)
        flat = flat_range(y for c in self.curves for y in (*c.lo, *c.mean, *c.hi))
        if self.ylim is not None:
            plt.ylim(*self.ylim)
        elif flat is not None:
            plt.ylim(*flat)
        short_ticks(plt, [x for c in self.curves for x in c.x])
        for i, c in enumerate(self.curves):
            colour = self.colours[i] if i < len(self.colours) else COLOURS[i % len(COLOURS)]
            if c.lo != c.mean:  # a band to show (several seeds, or min/max)
                plt.plot(c.x, c.lo, color=colour, marker="·")
                plt.plot(c.x, c.hi, color=colour, marker="·")
            plt.plot(c.x, c.mean, color=colour, marker="braille")
        if not self.curves:
            plt.text(self.empty_text, x=0.5, y=0.5, alignment="center")
            plt.xlim(0, 1)
            plt.ylim(0, 1)
        self.draws += 1
        self.refresh()
