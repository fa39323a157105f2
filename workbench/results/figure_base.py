"""What every figure of :mod:`workbench.results.plot` shares: matplotlib set up without a
display (Agg, the object-oriented API, one rc style), saving PNG + SVG, one colour per model
in all of a profile's figures, axis text with units, log axes, legends, and the mean and
spread over seeds of result records (:func:`_series`) drawn as error bars.
"""
from __future__ import annotations

import re
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

from workbench.results import catalogue
from workbench.results.aggregate import records, summarize
from workbench.results.curves import BANDS
from workbench.results.export import CannotWrite, cannot_write_text, write_atomic
from workbench.store import Run, Store

if TYPE_CHECKING:  # for annotations only: importing matplotlib costs ~0.3 s
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# y-axis text with units for the metrics figures usually show; others are derived from
# the catalogue's units (workbench.results.catalogue)
Y_LABELS = {
    "accuracy": "accuracy (fraction of target tokens)",
    "sequence_accuracy": "sequence accuracy (fraction exact)",
    "best_accuracy": "best accuracy (fraction of target tokens)",
    "loss": "loss (nats per target token)",
    "step_time_ms": "time per training step (ms)",
    "inference_ms": "inference time per eval batch (ms)",
    "peak_mem_mb": "peak memory (MiB)",
    "gpu_mem_peak_mb": "peak GPU memory (MiB)",
    "tokens_per_s": "training throughput (tokens/s)",
    "wall_s": "wall time of the run (s)",
    "compile_s": "compile time (s)",
    "bits_per_char": "bits per character",
    "bits_per_byte": "bits per byte",
    "perplexity": "perplexity",
}
# metrics spanning orders of magnitude across lengths/models: log y
LOG_Y = {"step_time_ms", "inference_ms", "peak_mem_mb", "gpu_mem_peak_mb", "tokens_per_s",
         "wall_s", "train_s", "compile_s", "params", "params_trainable", "state_size"}
ACCURACY_LIKE = {"accuracy", "sequence_accuracy", "best_accuracy"}
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = "osD^vP<X>p"
REFERENCE_LABEL = "training length"
FIGSIZE = (6.4, 4.2)
DPI = 150
STYLE = {
    "font.size": 9, "axes.titlesize": 9.5, "axes.labelsize": 9, "legend.fontsize": 8,
    "xtick.labelsize": 8, "ytick.labelsize": 8, "axes.grid": True, "grid.alpha": 0.3,
    "axes.spines.top": False, "axes.spines.right": False,
    # the same data gives byte-identical SVGs (clean diffs when figures are committed)
    "svg.hashsalt": "ssm-workbench",
}


def _mpl():
    """matplotlib, imported on first use with the Agg backend (no display needed)."""
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:  # never switch a backend someone else chose
        matplotlib.use("Agg")
    return matplotlib


@contextmanager
def _style() -> Iterator[None]:
    # rc settings are read when artists are created and when saving, so both happen inside
    with _mpl().rc_context(STYLE):
        yield


def _new_figure() -> tuple["Figure", "Axes"]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def safe_stem(text: str) -> str:
    """A file name stem from free text: letters, digits, '.', '_' and '-' only."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return stem or "figure"


def save(fig: "Figure", out_dir: str | Path, stem: str) -> list[Path]:
    """Write ``<out_dir>/<stem>.png`` and ``.svg``, each whole or not at all
    (:func:`workbench.results.export.write_atomic`: CannotWrite on a full disk); returns both
    paths."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CannotWrite(cannot_write_text(out, e)) from None
    stem = safe_stem(stem)
    paths = [out / f"{stem}.png", out / f"{stem}.svg"]
    with _style():  # the format named: the temporary file's suffix is not the figure's
        write_atomic(paths[0], lambda f: fig.savefig(f, format="png", dpi=DPI))
        # no timestamp: reproducible files
        write_atomic(paths[1], lambda f: fig.savefig(f, format="svg", metadata={"Date": None}))
    return paths


def model_of(run: Run) -> str:
    """The model label a run is grouped and coloured by (export's ``model`` field)."""
    return run.fields.get("model", run.label)


def model_colors(labels: Iterable[str]) -> dict[str, str]:
    """One colour per distinct label, in first-seen order (tab10, tab20 past 10 models)."""
    mpl = _mpl()
    order = list(dict.fromkeys(labels))
    cmap = mpl.colormaps["tab10" if len(order) <= 10 else "tab20"]
    return {m: mpl.colors.to_hex(cmap(i % cmap.N)) for i, m in enumerate(order)}


def profile_colors(store: Store, profile: str | None, runs: Sequence[Run] = ()) -> dict[str, str]:
    """The colour map of a profile: every run's model in run order, whatever state or
    figure, so a model has one colour in all of the profile's figures."""
    every = store.runs(profile=profile) if profile else []
    return model_colors([model_of(r) for r in every] + [model_of(r) for r in runs])


def metric_label(metric: str) -> str:
    """Axis text with the unit: 'peak memory (MiB)'."""
    if metric in Y_LABELS:
        return Y_LABELS[metric]
    unit = catalogue.unit(metric)
    return f"{metric.replace('_', ' ')} ({unit})" if unit else metric.replace("_", " ")


def metric_title(metric: str) -> str:
    """The axis text without its unit, for titles: 'peak memory'."""
    return re.sub(r"\s*\([^()]*\)$", "", metric_label(metric))


def _id_ranges(ids: Iterable[int]) -> str:
    """[1, 2, 5, 6, 7] -> '1-2_5-7' (a file-name-safe form of a run selection)."""
    ids = sorted(set(ids))
    parts, start = [], None
    for i, v in enumerate(ids):
        start = v if start is None else start
        if i + 1 == len(ids) or ids[i + 1] != v + 1:
            parts.append(str(v) if v == start else f"{start}-{v}")
            start = None
    return "_".join(parts)


def _seeds_text(ns: Iterable[int], band: str) -> str:
    ns = sorted(set(ns))
    if not ns or ns == [1]:
        return "1 seed"
    count = f"{ns[0]} seeds" if len(ns) == 1 else f"{ns[0]}–{ns[-1]} seeds"
    return {"std": f"mean ± std over {count}", "minmax": f"mean and min–max over {count}",
            "none": f"mean over {count}"}[band]


def _one_or_many(values: Iterable, many: str) -> str | None:
    vals = sorted({v for v in values if v is not None}, key=str)
    return None if not vals else str(vals[0]) if len(vals) == 1 else many


def _where(profile: str | None, run_ids: Iterable[int] | None) -> str:
    if profile and run_ids:
        return f"profile {profile!r} (runs {_id_ranges(run_ids).replace('_', ',')})"
    if profile:
        return f"profile {profile!r}"
    return f"runs {_id_ranges(run_ids or []).replace('_', ',')}"


def _log_y(metric: str, means: Sequence[float]) -> bool:
    """Time/memory: always log; other positive metrics (losses) log when their means span
    more than two decades (a loss going to 1e-6 is flat on a linear axis); accuracy never.
    The means decide, not the bands: mean - std of a loss near zero is often negative."""
    vals = [v for v in means if v is not None]
    return (metric not in ACCURACY_LIKE and bool(vals) and min(vals) > 0
            and (metric in LOG_Y or max(vals) / min(vals) > 100))


def _y_axis(ax: "Axes", metric: str, log: bool) -> None:
    if metric in ACCURACY_LIKE:
        ax.set_ylim(-0.02, 1.02)  # the whole 0..1 range, so figures compare at a glance
    elif log:
        ax.set_yscale("log")


def _log2_x(ax: "Axes", xs: Sequence[float]) -> None:
    """A log2 x axis ticked at exactly the lengths measured, written as plain numbers."""
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullLocator

    xs = sorted(set(xs))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(xs))
    ax.xaxis.set_major_formatter(FixedFormatter([f"{x:g}" for x in xs]))
    ax.xaxis.set_minor_locator(NullLocator())
    if len(xs) > 9:  # long labels like 16384 would touch
        ax.tick_params(axis="x", labelrotation=45)


def _legend(fig: "Figure", ax: "Axes") -> None:
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    # the models first, reference lines (training length) after them
    order = sorted(range(len(labels)), key=lambda i: labels[i].startswith(REFERENCE_LABEL))
    handles, labels = [handles[i] for i in order], [labels[i] for i in order]
    if len(handles) <= 4:
        ax.legend(handles, labels, loc="best", frameon=False)
    else:  # many lines: below the axes, where it cannot cover data
        fig.legend(handles, labels, loc="outside lower center", ncols=min(3, len(handles)),
                   frameon=False)


def _styles(models: Sequence[str], colors: dict[str, str]) -> list[tuple[str, str, str]]:
    """(colour, linestyle, marker) per line. Colour and marker shape follow the model (its
    place in ``colors``), so models whose points coincide (several at accuracy 1.0) stay
    distinguishable; lines sharing a model (two lengths of it, or one per seed) get
    different dash patterns."""
    # models outside the map (a caller's partial map) continue it rather than reuse its colours
    full = model_colors(list(colors) + list(models))
    place = {m: i for i, m in enumerate(full)}
    seen: Counter = Counter()
    out = []
    for m in models:
        out.append((colors.get(m) or full[m], LINESTYLES[seen[m] % len(LINESTYLES)],
                    MARKERS[place[m] % len(MARKERS)]))
        seen[m] += 1
    return out


def _records(store: Store, profile: str | None, run_ids: Iterable[int] | None,
             states: Iterable[str]) -> list[dict]:
    recs = records(store, profile=profile, states=states)
    if run_ids is not None:
        keep = set(run_ids)
        recs = [r for r in recs if r["run_id"] in keep]
    if not recs:
        raise ValueError(f"no {'/'.join(states)} runs with results in {_where(profile, run_ids)}")
    return recs


def _series(recs: list[dict], metric: str, x_of, band: str) -> dict[str, dict]:
    """{model: {'x', 'mean', 'lo', 'hi', 'n'}} over the records' seeds at each x, models in
    record order and x ascending; points without a value are left out."""
    cells: dict[str, dict[float, list[float]]] = {}
    for r in recs:
        x, v = x_of(r), r.get(metric)
        if x is not None and v is not None:
            cells.setdefault(r.get("model"), {}).setdefault(x, []).append(v)
    out = {}
    for model, by_x in cells.items():
        s = {"x": [], "mean": [], "lo": [], "hi": [], "n": []}
        for x in sorted(by_x):
            vals = by_x[x]
            agg = summarize(vals, ci=False)
            m, sd = agg["mean"], agg["std"] or 0.0
            lo, hi = {"std": (m - sd, m + sd), "minmax": (min(vals), max(vals)), "none": (m, m)}[band]
            for k, v in zip(("x", "mean", "lo", "hi", "n"), (x, m, lo, hi, agg["n"])):
                s[k].append(v)
        out[model] = s
    return out


def _draw_series(ax: "Axes", series: dict[str, dict], colors: dict[str, str]) -> None:
    """Mean with error bars (lo..hi) per model; no bars where one seed gives no spread."""
    for (model, s), (color, ls, marker) in zip(series.items(), _styles(list(series), colors)):
        err = [[m - lo for m, lo in zip(s["mean"], s["lo"])], [hi - m for m, hi in zip(s["mean"], s["hi"])]]
        ax.errorbar(s["x"], s["mean"], yerr=err if any(map(any, err)) else None, color=color,
                    linestyle=ls, marker=marker, markersize=6, capsize=3,
                    # hollow: when models tie (accuracy 1.0) both outlines stay visible
                    markerfacecolor="none", markeredgewidth=1.3, linewidth=1.5, label=model)


def _missing_metric(recs: list[dict], metric: str, where: str) -> str:
    have = sorted({k for r in recs for k in r.get("__metrics__", ())})
    return f"no run in {where} has {metric!r}" + (f"; metrics there: {', '.join(have)}" if have else "")


def _check_band(band: str) -> None:
    if band not in BANDS:
        raise ValueError(f"unknown band {band!r}; expected one of {', '.join(BANDS)}")
