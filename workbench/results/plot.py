"""Figures for papers and notes: ``ssm-workbench plot`` and the TUI's "write figures".

Four kinds, each written as ``<stem>.png`` (150 dpi) and ``<stem>.svg``:

- **curves**: learning curves of some runs (train/eval loss, eval accuracy, ...) against
  optimizer step, epoch or wall time, one line per group of runs that differ only by seed
  with a mean ± std (or min..max) band; the numbers come from :func:`workbench.results.curves.curves`.
- **length**: a result metric (accuracy, step time, peak memory, ...) against the training
  sequence length, one line per model, mean with error bars over seeds (the published
  accuracy/time/memory-vs-length figures). Needs runs at two or more lengths.
- **eval sets**: a metric against the eval sets named ``<prefix>=<number>`` (``len=1024``:
  test length; ``dist=4094``: trigger-to-end distance), one line per model, with a dotted
  line at the training length (the induction-heads extrapolation figure).
- **mqar**: MQAR accuracy against model width, one panel per sequence length (and number of
  key-value pairs where those vary), one line per model, each point the maximum over
  learning rates (HazyResearch/zoology, Figure 2): the lr chosen per (model, length, pairs,
  width) by :func:`workbench.results.aggregate.best_over`, on the validation split by
  default (zoology takes the best of its held-out set: ``select_on="test"``).
- **scaling**: eval loss (or perplexity, bits per byte) against training FLOPs on log-log
  axes, one colour per model: the measured points (mean over seeds), the fitted power law
  of :mod:`workbench.results.scaling` and a band of ± one standard error; the legend gives
  each exponent b ± se (Kaplan et al. 2020's L(C) form; with ``irreducible`` Hoffmann et
  al. 2022's E + a C^-b).

The length, eval-set and MQAR figures draw one line per configuration: run fields besides
the seed that vary within one point of a model's line (a second task under the profile's
name, runs trained at two lengths on an eval-set figure) split the line, named after the
key (``mamba task=parity``, ``s6 L=32``) in the model's colour, and the title says
"lines apart by ...".

Lengths double in every shipped sweep, so length axes are log2; time and memory grow over
orders of magnitude, so those y axes are log. A model keeps its colour in every figure of a
profile (:func:`model_colors`, keyed by model label in the profile's run order).

matplotlib is imported inside the functions (the CLI starts without it) and only its
object-oriented API is used (``Figure`` + the Agg canvas, never pyplot): no display, no
global figure list to leak in the long-lived TUI, and no state shared between threads.
The ``*_figure`` functions build and return the Figure (tests inspect what was drawn);
the ``plot_*`` functions build, save and return the written paths. Bad input (no runs, a
metric no run has, one sequence length only) raises ValueError with the reason.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

from workbench.results.aggregate import records, sort_key, split_keys
from workbench.results.curves import BANDS, CURVE_METRICS, X_AXES, X_LABELS, curves
from workbench.results.figure_base import (  # noqa: F401  (model_colors: this module's API too)
    FIGSIZE, REFERENCE_LABEL, _check_band, _draw_series, _id_ranges, _legend, _log2_x, _log_y, _missing_metric, _mpl,
    _new_figure, _one_or_many, _records, _seeds_text, _series, _style, _styles, _where, _y_axis, metric_label,
    metric_title, model_colors, model_of, profile_colors, safe_stem, save)
from workbench.store import Run, Store, queries

if TYPE_CHECKING:  # for annotations only: importing matplotlib costs ~0.3 s
    from matplotlib.figure import Figure

KINDS = ("curves", "length", "eval-sets", "mqar", "scaling")
DEFAULT_CURVES = (("train", "loss"), ("eval", "loss"), ("eval", "accuracy"))
DEFAULT_LENGTH_METRICS = ("accuracy", "step_time_ms", "peak_mem_mb")
DEFAULT_EVAL_SET_METRICS = ("accuracy",)
EVAL_SET_AXES = {"len": "test sequence length (tokens)",
                 "dist": "distance from first trigger to end (tokens)"}
AXIS_WORDS = {"step": "optimizer step", "epoch": "epoch", "wall": "wall time",
              "tokens": "training tokens", "flops": "training FLOPs"}
CURVE_POINTS = 1000  # thin very long series (curves.combine's budget): the figure is ~1000 px wide
_EVAL_SET = re.compile(r"^([A-Za-z_]\w*)=(-?\d+(?:\.\d+)?)$")


# --------------------------------------------------------------------------- like with like
def _apart(recs: list[dict], by: list[str], ignore: Sequence[str] = ()) -> tuple[list[dict], list[str]]:
    """The records with each line's name (the ``model`` field, which :func:`_series` draws a
    line per) extended by the run fields that vary inside one point of ``by`` besides the
    seed (:func:`workbench.results.aggregate.split_keys`): four tasks under one profile
    name are four lines ``mamba task=parity``, ..., never one line averaged over them.
    Returns (records, the keys added)."""
    added = split_keys(recs, by, ignore)
    if not added:
        return recs, []
    def name(r: dict) -> str:
        return " ".join([str(r.get("model"))] + [f"{'L' if k == 'seq_len' else k.split('.', 1)[-1]}"
                                                 f"={r.get(k)}" for k in added])
    return [{**r, "model": name(r), "__line_of__": r.get("model")} for r in recs], added


def _colors_apart(colors: dict[str, str], recs: list[dict], added: list[str]) -> dict[str, str]:
    """``colors`` plus each split line's name in its model's colour (lines of one model
    told apart by marker and name, as a model keeps its colour in every figure)."""
    if not added:
        return colors
    out = dict(colors)
    for r in recs:
        base = r.get("__line_of__")  # the model _apart named the line after
        if base in colors:
            out.setdefault(r["model"], colors[base])
    return out


def _apart_note(added: list[str]) -> str:
    return f"; lines apart by {', '.join(added)}" if added else ""


# --------------------------------------------------------------------------- curves
def parse_curve_metric(text: str) -> list[tuple[str, str]]:
    """'eval.accuracy' or 'eval:accuracy' -> [('eval', 'accuracy')]; a bare name gives
    every split of workbench.results.curves.CURVE_METRICS that has it ('loss' -> train and eval)."""
    split, sep, name = text.replace(":", ".").partition(".")
    if sep:
        if split not in ("train", "eval") or not name:
            raise ValueError(f"bad curve metric {text!r}: expected train.NAME or eval.NAME")
        return [(split, name)]
    found = [k for k in CURVE_METRICS if k[1] == text]
    if not found:
        known = ", ".join(f"{s}.{n}" for s, n in CURVE_METRICS)
        raise ValueError(f"{text!r} is not a logged curve metric; known: {known} (or any train.NAME/eval.NAME)")
    return found


def curves_figure(store: Store, runs: Sequence[Run], metric: tuple[str, str] = ("eval", "accuracy"),
                  axis: str = "step", band: str = "std", by_seed: bool = True,
                  title: str | None = None, colors: dict[str, str] | None = None) -> "Figure":
    """Learning curves of ``runs`` for metric (split, name): one line per group of runs
    differing only by seed (per run with ``by_seed=False``), mean with a band."""
    runs = list(runs)
    if not runs:
        raise ValueError("no runs to plot")
    if axis not in X_AXES:
        raise ValueError(f"unknown x axis {axis!r}; expected one of {', '.join(X_AXES)}")
    if band not in BANDS:
        raise ValueError(f"unknown band {band!r}; expected one of {', '.join(BANDS)}")
    split, name = metric
    groups = curves(store, runs, split, name, axis, band, by_seed, budget=CURVE_POINTS)
    if not groups:
        raise ValueError(_no_curve_reason(store, runs, split, name, axis))
    log = _log_y(name, [v for g in groups for v in g.mean])
    std_note = ""
    if log and band == "std" and any(v <= 0 for g in groups for v in g.lo):
        # mean - std <= 0 cannot be drawn on a log axis (a heavy-tailed loss: one seed far
        # above the others); min..max stays positive and says the same honestly
        groups = curves(store, runs, split, name, axis, "minmax", by_seed, budget=CURVE_POINTS)
        band, std_note = "minmax", " (mean − std ≤ 0 on a log axis)"
    by_id = {r.id: r for r in runs}
    models = [model_of(by_id[g.run_ids[0]]) for g in groups]
    profiles = {r.profile for r in runs}
    colors = colors or profile_colors(store, next(iter(profiles)) if len(profiles) == 1 else None, runs)
    with _style():
        fig, ax = _new_figure()
        for g, (color, ls, marker) in zip(groups, _styles(models, colors)):
            # markers when sparse (eval every epoch): a line alone hides where the points are
            ax.plot(g.x, g.mean, color=color, linestyle=ls, marker=marker if len(g.x) <= 30 else None,
                    markersize=3.5, linewidth=1.5, label=g.label)
            if band != "none" and any(h > lo for lo, h in zip(g.lo, g.hi)):
                ax.fill_between(g.x, g.lo, g.hi, color=color, alpha=0.2, linewidth=0)
        ax.set_xlabel(X_LABELS[axis])
        ax.set_ylabel(f"{split} {metric_label(name)}")
        _y_axis(ax, name, log)
        if axis == "step" and max(x for g in groups for x in g.x) >= 1e4:
            # 5k, 10k, 15k: shorter than 20000 and plainer than matplotlib's '1e4' offset
            from matplotlib.ticker import FuncFormatter

            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:g}k"))
        what = CURVE_METRICS.get(metric, f"{split} {name}")
        how = "one line per run" if not by_seed else _seeds_text((max(g.n) for g in groups), band) + std_note
        ax.set_title(title or f"{_runs_heading(runs)}\n{what} by {AXIS_WORDS[axis]}; {how}")
        _legend(fig, ax)
    return fig


def _runs_heading(runs: Sequence[Run]) -> str:
    """'profile — task, L=20' for the runs shown."""
    profiles = sorted({r.profile for r in runs})
    head = profiles[0] if len(profiles) == 1 else f"{len(profiles)} profiles"
    task = _one_or_many((r.task for r in runs), "several tasks")
    lens = _one_or_many((r.seq_len for r in runs), "")
    return head + (f" — {task}" if task else "") + (f", L={lens}" if lens else "")


def _no_curve_reason(store: Store, runs: Sequence[Run], split: str, name: str, axis: str) -> str:
    ids = [r.id for r in runs]
    if not queries.has_metric_values(store, ids, split, name):
        have = queries.logged_metrics(store, ids)
        return (f"none of the {len(runs)} run(s) logged {split}.{name}"
                + (f"; they logged {', '.join(have)}" if have else "; they logged nothing yet"))
    if axis == "epoch":
        return f"the runs logged {split}.{name} without epoch numbers (trained by steps); use the step or wall axis"
    if axis in ("tokens", "flops"):
        return (f"the runs logged {split}.{name} but record no {'FLOP' if axis == 'flops' else 'token'} "
                f"count (info tokens_per_step / flops_per_token: runs from before those were recorded)")
    return f"the runs logged {split}.{name} but have no {axis} values (never started?)"


def plot_curves(store: Store, runs: Sequence[Run], out_dir: str | Path,
                metric: tuple[str, str] = ("eval", "accuracy"), axis: str = "step",
                band: str = "std", by_seed: bool = True, title: str | None = None,
                stem: str | None = None, colors: dict[str, str] | None = None) -> list[Path]:
    """Write the learning-curve figure (see :func:`curves_figure`); returns [png, svg].
    The default stem is ``<profile or runs-ids>-curves-<split>-<name>-by-<axis>``."""
    fig = curves_figure(store, runs, metric, axis, band, by_seed, title, colors)
    if stem is None:
        profiles = {r.profile for r in runs}
        base = next(iter(profiles)) if len(profiles) == 1 else f"runs-{_id_ranges(r.id for r in runs)}"
        stem = f"{base}-curves-{metric[0]}-{metric[1]}-by-{axis}" + ("" if by_seed else "-per-run")
    return save(fig, out_dir, stem)


def vs_length_figure(store: Store, profile: str | None, metric: str = "accuracy", band: str = "std",
                     run_ids: Iterable[int] | None = None, states: Iterable[str] = ("finished",),
                     title: str | None = None, colors: dict[str, str] | None = None) -> "Figure":
    """``metric`` (a run result: accuracy on the default eval set, step_time_ms,
    peak_mem_mb, ...) against the training sequence length, one line per model."""
    _check_band(band)
    states = tuple(states)
    run_ids = None if run_ids is None else list(run_ids)
    where = _where(profile, run_ids)
    recs = [r for r in _records(store, profile, run_ids, states) if r["eval_set"] == ""]
    with_metric = [r for r in recs if r.get(metric) is not None and r.get("seq_len") is not None]
    if not with_metric:
        raise ValueError(_missing_metric(recs, metric, where))
    lengths = sorted({r["seq_len"] for r in with_metric})
    if len(lengths) < 2:
        raise ValueError(f"every run in {where} has sequence length {lengths[0]}: a figure against "
                         "length needs runs at two or more lengths (the curves and eval-set figures apply)")
    with_metric, added = _apart(with_metric, ["model", "seq_len"])
    series = _series(with_metric, metric, lambda r: r["seq_len"], band)
    runs = store.runs(ids=[r["run_id"] for r in with_metric])
    colors = _colors_apart(colors or profile_colors(store, profile, runs), with_metric, added)
    with _style():
        fig, ax = _new_figure()
        _draw_series(ax, series, colors)
        _log2_x(ax, lengths)
        ax.set_xlabel("training sequence length (tokens)")
        ax.set_ylabel(metric_label(metric))
        _y_axis(ax, metric, _log_y(metric, [v for s in series.values() for v in s["mean"]]))
        # time and memory mean nothing without the device they were measured on
        device = _one_or_many((r.device for r in runs), "several devices")
        head = f"{profile or 'runs ' + _id_ranges(run_ids or []).replace('_', ',')}"
        task = _one_or_many((r["task"] for r in with_metric), "several tasks")
        head += (f" — {task}" if task else "") + (f", on {device}" if device else "")
        how = _seeds_text((n for s in series.values() for n in s["n"]), band) + _apart_note(added)
        ax.set_title(title or f"{head}\n{metric_title(metric)} against training length; {how}")
        _legend(fig, ax)
    return fig


def plot_vs_length(store: Store, profile: str | None, metric: str, out_dir: str | Path,
                   band: str = "std", run_ids: Iterable[int] | None = None,
                   states: Iterable[str] = ("finished",), title: str | None = None,
                   stem: str | None = None, colors: dict[str, str] | None = None) -> list[Path]:
    """Write the metric-against-length figure; stem ``<profile>-<metric>-vs-length``."""
    run_ids = None if run_ids is None else list(run_ids)
    fig = vs_length_figure(store, profile, metric, band, run_ids, states, title, colors)
    base = profile or f"runs-{_id_ranges(run_ids or [])}"
    return save(fig, out_dir, stem or f"{base}-{metric}-vs-length")


def eval_set_prefixes(recs: Iterable[dict]) -> list[str]:
    """The prefixes of numeric eval sets among records: ['dist', 'len'] for len=N, dist=D."""
    return sorted({m.group(1) for r in recs if (m := _EVAL_SET.match(r.get("eval_set") or ""))})


def _eval_set_x(r: dict, prefix: str) -> float | None:
    m = _EVAL_SET.match(r.get("eval_set") or "")
    if not m or m.group(1) != prefix:
        return None
    v = float(m.group(2))
    return int(v) if v.is_integer() else v


def eval_sets_figure(store: Store, profile: str | None, metric: str = "accuracy", prefix: str = "len",
                     band: str = "std", run_ids: Iterable[int] | None = None,
                     states: Iterable[str] = ("finished",), title: str | None = None,
                     colors: dict[str, str] | None = None) -> "Figure":
    """``metric`` on the eval sets ``<prefix>=<number>`` against that number, one line per
    model, with a dotted line at the training length when all runs share one."""
    _check_band(band)
    run_ids = None if run_ids is None else list(run_ids)
    where = _where(profile, run_ids)
    recs = _records(store, profile, run_ids, states)
    sets = [r for r in recs if _eval_set_x(r, prefix) is not None]
    if not sets:
        names = sorted({r["eval_set"] for r in recs if r["eval_set"]})
        raise ValueError(f"no eval sets named {prefix}=N in {where}"
                         + (f"; eval sets there: {', '.join(names[:12])}" if names else "; only the default eval set"))
    with_metric = [r for r in sets if r.get(metric) is not None]
    if not with_metric:
        raise ValueError(_missing_metric(sets, metric, f"the {prefix}= eval sets of {where}"))
    with_metric, added = _apart(with_metric, ["model", "eval_set"])
    series = _series(with_metric, metric, lambda r: _eval_set_x(r, prefix), band)
    xs = sorted({x for s in series.values() for x in s["x"]})
    runs = store.runs(ids=[r["run_id"] for r in with_metric])
    colors = _colors_apart(colors or profile_colors(store, profile, runs), with_metric, added)
    train_lens = {r.seq_len for r in runs}
    with _style():
        fig, ax = _new_figure()
        _draw_series(ax, series, colors)
        if len(train_lens) == 1 and None not in train_lens:
            (L,) = train_lens
            ax.axvline(L, linestyle=":", color="0.35", linewidth=1.2, label=f"{REFERENCE_LABEL} L={L}")
        _log2_x(ax, xs)
        if len(train_lens) == 1 and None not in train_lens:  # keep the marker in view
            ax.set_xlim(min(ax.get_xlim()[0], L / 1.2), max(ax.get_xlim()[1], L * 1.2))
        ax.set_xlabel(EVAL_SET_AXES.get(prefix, f"eval set {prefix}=N"))
        ax.set_ylabel(metric_label(metric))
        _y_axis(ax, metric, _log_y(metric, [v for s in series.values() for v in s["mean"]]))
        task = _one_or_many((r["task"] for r in with_metric), "several tasks")
        lens = _one_or_many(train_lens, "several lengths")
        head = (profile or f"runs {_id_ranges(run_ids or []).replace('_', ',')}") \
            + (f" — {task}" if task else "") + (f", trained at L={lens}" if lens else "")
        what = {"len": "test length", "dist": "trigger-to-end distance"}.get(prefix, f"{prefix}")
        how = _seeds_text((n for s in series.values() for n in s["n"]), band) + _apart_note(added)
        ax.set_title(title or f"{head}\n{metric_title(metric)} against {what}; {how}")
        _legend(fig, ax)
    return fig


def plot_eval_sets(store: Store, profile: str | None, out_dir: str | Path, metric: str = "accuracy",
                   prefix: str = "len", band: str = "std", run_ids: Iterable[int] | None = None,
                   states: Iterable[str] = ("finished",), title: str | None = None,
                   stem: str | None = None, colors: dict[str, str] | None = None) -> list[Path]:
    """Write the eval-set figure; stem ``<profile>-<metric>-vs-<prefix>``."""
    run_ids = None if run_ids is None else list(run_ids)
    fig = eval_sets_figure(store, profile, metric, prefix, band, run_ids, states, title, colors)
    base = profile or f"runs-{_id_ranges(run_ids or [])}"
    return save(fig, out_dir, stem or f"{base}-{metric}-vs-{prefix}")


# --------------------------------------------------------------------------- mqar
MQAR_PANEL = ("seq_len", "task.num_kv_pairs")


def mqar_figure(store: Store, profile: str | None, band: str = "std",
                run_ids: Iterable[int] | None = None, states: Iterable[str] = ("finished",),
                select_on: str = "validation", metric: str = "accuracy",
                colors: dict[str, str] | None = None) -> "Figure":
    """Zoology's Figure 2: ``metric`` against model width (``d_model``, log2 axis), one
    panel per sequence length (x number of key-value pairs where several), one line per
    model; each point is the mean over seeds at the learning rate (``train.lr``) whose mean
    ``metric`` on the selection split is best, as chosen by ``best_over``."""
    from workbench.results.aggregate import best_over

    _check_band(band)
    run_ids = None if run_ids is None else list(run_ids)
    where = _where(profile, run_ids)
    recs = [r for r in _records(store, profile, run_ids, tuple(states)) if r.get("task") == "mqar"]
    if not recs:
        raise ValueError(f"no mqar runs in {where}")
    if not any("train.lr" in r for r in recs):
        raise ValueError(f"the mqar runs in {where} have no train.lr grid: nothing to take the maximum over")
    widths = sorted({r["d_model"] for r in recs if r.get("d_model") is not None})
    panels_by = [k for k in MQAR_PANEL if len({r.get(k) for r in recs}) > 1] or ["seq_len"]
    by = [k for k in ["model", "d_model", *panels_by, "task_setting"] if any(k in r for r in recs)]
    # like with like: what else varies within a (model, width, panel) point beyond the seed
    # and the lr chosen among (another task parameter, another grid key) makes its own line
    recs, added = _apart(recs, by + ["train.lr"])
    kept, _ = best_over(recs, ["train.lr"], metric, by + added, select_on)
    kept = [r for r in kept if r["eval_set"] == "" and r.get(metric) is not None]
    panels: dict[tuple, list[dict]] = {}
    for r in kept:
        panels.setdefault(tuple(r.get(k) for k in panels_by), []).append(r)
    panels = dict(sorted(panels.items(), key=lambda kv: tuple(sort_key(v) for v in kv[0])))
    runs = store.runs(ids=[r["run_id"] for r in kept])
    colors = _colors_apart(colors or profile_colors(store, profile, runs), kept, added)
    _mpl()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = len(panels)
    with _style():
        fig = Figure(figsize=(max(FIGSIZE[0], 3.2 * n), FIGSIZE[1]), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(1, n, sharey=True, squeeze=False)[0]
        ns: list[int] = []
        for ax, (key, rs) in zip(axes, panels.items()):
            series = _series(rs, metric, lambda r: r.get("d_model"), band)
            ns += [k for s in series.values() for k in s["n"]]
            _draw_series(ax, series, colors)
            _log2_x(ax, widths)
            ax.set_title(", ".join(f"{'pairs' if k == 'task.num_kv_pairs' else 'length'} {v}"
                                   for k, v in zip(panels_by, key)))
            ax.set_xlabel("model width (d_model)")
        axes[0].set_ylabel(metric_label(metric))
        _y_axis(axes[0], metric, False)
        on = "selected on test" if select_on == "test" else "selected on validation"
        fig.suptitle(f"{profile or 'runs'}: MQAR {metric_title(metric)} against width\nmax over "
                     f"learning rates ({on}); {_seeds_text(ns, band)}{_apart_note(added)}")
        _legend(fig, axes[-1])
    return fig


def plot_mqar(store: Store, profile: str | None, out_dir: str | Path, band: str = "std",
              run_ids: Iterable[int] | None = None, states: Iterable[str] = ("finished",),
              select_on: str = "validation", metric: str = "accuracy", stem: str | None = None,
              colors: dict[str, str] | None = None) -> list[Path]:
    """Write the MQAR accuracy-vs-width figure; stem ``<profile>-mqar-<metric>-vs-width``."""
    run_ids = None if run_ids is None else list(run_ids)
    fig = mqar_figure(store, profile, band, run_ids, states, select_on, metric, colors)
    base = profile or f"runs-{_id_ranges(run_ids or [])}"
    return save(fig, out_dir, stem or f"{base}-mqar-{metric}-vs-width")


# --------------------------------------------------------------------------- scaling
def scaling_figure(store: Store, profile: str | None, metric: str = "loss", form: str = "power",
                   bootstrap: int = 0, run_ids: Iterable[int] | None = None,
                   states: Iterable[str] = ("finished",), title: str | None = None,
                   colors: dict[str, str] | None = None, result: dict | None = None) -> "Figure":
    """``metric`` against training FLOPs (log-log), one colour per model (and one marker and
    dash per value of the settings that split its fits): the points of every row of
    :func:`workbench.results.scaling.analyse`; for a law, its fit over the row's measured range
    (dotted beyond it, out to the range of the laws at the same settings) and its ± 1 se band;
    a row that is no law (too few sizes, a rising or not decreasing loss) gets no line, and its
    legend entry says why. Raises ValueError (ScalingError) where there is nothing to fit."""
    import numpy as np

    from workbench.results import scaling
    from workbench.results.figure_base import MARKERS

    res = result or scaling.analyse(store, profile, metric, form, bootstrap=bootstrap,
                                    run_ids=run_ids, states=states)
    groups = res["groups"]
    fits = res["fits"]
    runs = store.runs(profile=profile, states=tuple(states), ids=None if run_ids is None else list(run_ids))
    colors = colors or profile_colors(store, profile, runs)
    styles = _styles([g.model for g in groups.values()], colors)
    seen: dict[str, int] = {}
    with _style():
        fig, ax = _new_figure()
        for (label, g), (color, _ls, marker) in zip(groups.items(), styles):
            k = seen[g.model] = seen.get(g.model, -1) + 1  # a model's k-th setting: its own marker
            marker = MARKERS[(MARKERS.index(marker) + k) % len(MARKERS)]
            f = g.fit
            ax.plot([c for c, _, _ in g.points], [v for _, v, _ in g.points], linestyle="none",
                    marker=marker, markersize=6, markerfacecolor="none", markeredgewidth=1.3, color=color,
                    label=f"_{label} points" if g.ok else f"{label}: {g.note}")
            if not g.ok:
                continue
            lo, hi = f.compute_range
            xs = np.geomspace(lo, hi, 64)
            se = f"{f.b:.3f} ± {f.b_se:.3f}" if f.b_se is not None else f"{f.b:.3f} (no se: {len(f.points)} points)"
            ax.plot(xs, f.predict(xs), color=color, linewidth=1.5, linestyle=("-", "-.")[k % 2],
                    label=f"{label}: b = {se}")
            # the other laws at the same settings: the fit extrapolated over their range
            cs = [c for h in groups.values() if h.ok and h.context == g.context for c, _, _ in h.points]
            for a, b in ((min(cs), lo), (hi, max(cs))):
                if b > a:
                    ext = np.geomspace(a, b, 16)
                    ax.plot(ext, f.predict(ext), color=color, linewidth=1.0, linestyle=":",
                            label=f"_{label} extrapolated")
            band = f.band(xs)
            if band is not None:
                ax.fill_between(xs, band[0], band[1], color=color, alpha=0.2, linewidth=0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("training FLOPs (forward + backward)")
        ax.set_ylabel(metric_label(metric))
        law = "L = a·C^-b" if res["form"] == "power" else "L = E + a·C^-b"
        how = sorted({f.se_method.split(" (")[0] for f in fits.values()})
        band_text = "band 16–84th pct. of the fits" if bootstrap else "band ± 1 se"
        head = (profile or "runs") + (f" — {res['task']}" if res.get("task") else "")
        fitted = (f"fit {law} along size; b ± se ({', '.join(how)}); {band_text}" if fits else
                  f"no law: {scaling.MIN_SIZES}+ sizes with a falling {metric} needed")
        ax.set_title(title or f"{head}: {metric_title(metric)} against training compute\n"
                              f"{fitted}; points: mean over seeds")
        ys = [v for g in groups.values() for _, v, _ in g.points]
        if max(ys) / min(ys) < 10:  # under a decade: plain numbers, not 3x10^0
            from matplotlib.ticker import FuncFormatter

            plain = FuncFormatter(lambda v, _: f"{v:g}")
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain)
        _legend(fig, ax)
    return fig


def plot_scaling(store: Store, profile: str | None, out_dir: str | Path, metric: str = "loss",
                 form: str = "power", bootstrap: int = 0, run_ids: Iterable[int] | None = None,
                 states: Iterable[str] = ("finished",), stem: str | None = None,
                 colors: dict[str, str] | None = None) -> list[Path]:
    """Write the scaling figure; stem ``<profile>-scaling-<metric>`` (``-irreducible`` with E)."""
    run_ids = None if run_ids is None else list(run_ids)
    fig = scaling_figure(store, profile, metric, form, bootstrap, run_ids, states, colors=colors)
    base = profile or f"runs-{_id_ranges(run_ids or [])}"
    return save(fig, out_dir, stem or f"{base}-scaling-{metric}" + ("-irreducible" if form != "power" else ""))


# --------------------------------------------------------------------------- all at once
def plot_profile(store: Store, profile: str | None, out_dir: str | Path, *,
                 kinds: Iterable[str] = KINDS, metrics: Sequence[str] | None = None,
                 run_ids: Iterable[int] | None = None, axis: str = "step", band: str = "std",
                 by_seed: bool = True, states: Iterable[str] = ("finished",),
                 select_on: str = "validation", scaling_form: str = "power",
                 bootstrap: int = 0) -> tuple[list[Path], list[str]]:
    """Every figure of ``kinds`` that applies to a profile's runs (or the runs ``run_ids``,
    or both): curves of train/eval loss and eval accuracy, accuracy/step time/peak memory
    against length (two lengths or more), each metric on each ``prefix=N`` eval-set family,
    MQAR accuracy against width (MQAR runs), loss against training FLOPs with the fits of
    ``scaling_form`` (``lm`` runs, or when ``kinds`` is just scaling; ``bootstrap`` resamples
    for its standard errors).
    ``metrics`` replaces each kind's defaults (curve metrics as train.NAME/eval.NAME or a
    bare name). Returns (paths written, one note per figure skipped and why). Raises
    ValueError when there is no run to plot at all."""
    states = tuple(states)
    run_ids = None if run_ids is None else list(run_ids)
    kinds = list(kinds)
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown figure kind(s) {', '.join(sorted(unknown))}; expected {', '.join(KINDS)}")
    runs = store.runs(profile=profile, states=states, ids=run_ids)
    if not runs:
        raise ValueError(f"no {'/'.join(states)} runs in {_where(profile, run_ids)}")
    colors = profile_colors(store, profile, runs)  # one map for every figure written here
    # a selection gets its own file names, so it never overwrites the whole profile's figures
    base = safe_stem("-".join(filter(None, [profile, run_ids and f"runs-{_id_ranges(run_ids)}"])))
    ids = [r.id for r in runs] if run_ids is not None else None
    paths: list[Path] = []
    notes: list[str] = []

    def attempt(what: str, fn, *args, **kw) -> None:
        try:
            paths.extend(fn(*args, **kw))
        except ValueError as e:
            notes.append(f"{what}: {e}")

    if "curves" in kinds:
        wanted: list[tuple[str, str]] = []
        for m in metrics or [f"{s}.{n}" for s, n in DEFAULT_CURVES]:
            try:
                wanted += parse_curve_metric(m)
            except ValueError as e:
                notes.append(f"curves {m}: {e}")
        for split, name in dict.fromkeys(wanted):
            stem = f"{base}-curves-{split}-{name}-by-{axis}" + ("" if by_seed else "-per-run")
            attempt(f"curves {split}.{name}", plot_curves, store, runs, out_dir, (split, name), axis,
                    band, by_seed, stem=stem, colors=colors)
    lengths = sorted({r.seq_len for r in runs if r.seq_len is not None})
    if "length" in kinds and len(lengths) < 2:  # one note, not one per metric
        notes.append(f"length: every run in {_where(profile, run_ids)} has sequence length "
                     f"{lengths[0] if lengths else 'unset'}; a figure against length needs two or more")
    elif "length" in kinds:
        for m in metrics or DEFAULT_LENGTH_METRICS:
            attempt(f"length {m}", plot_vs_length, store, profile, m, out_dir, band, ids, states,
                    stem=f"{base}-{m}-vs-length", colors=colors)
    if "eval-sets" in kinds:
        keep = {r.id for r in runs}
        prefixes = eval_set_prefixes(r for r in records(store, profile=profile, states=states)
                                     if r["run_id"] in keep)
        if not prefixes:
            notes.append(f"eval-sets: no eval sets named like len=N or dist=N in {_where(profile, run_ids)}")
        for prefix in prefixes:
            for m in metrics or DEFAULT_EVAL_SET_METRICS:
                attempt(f"eval-sets {prefix}= {m}", plot_eval_sets, store, profile, out_dir, m, prefix,
                        band, ids, states, stem=f"{base}-{m}-vs-{prefix}", colors=colors)
    # mqar: only where the runs are MQAR (said as skipped when asked for alone)
    if "mqar" in kinds and (kinds == ["mqar"] or any(r.task == "mqar" for r in runs)):
        for m in metrics or DEFAULT_EVAL_SET_METRICS:
            attempt(f"mqar {m}", plot_mqar, store, profile, out_dir, band, ids, states, select_on, m,
                    stem=f"{base}-mqar-{m}-vs-width", colors=colors)
    # scaling: for LM runs (or when asked for alone): loss against training FLOPs with fits
    if "scaling" in kinds and (kinds == ["scaling"] or any(r.task == "lm" for r in runs)):
        for m in metrics or ("loss",):
            suffix = "-irreducible" if scaling_form != "power" else ""
            attempt(f"scaling {m}", plot_scaling, store, profile, out_dir, m, scaling_form, bootstrap,
                    ids, states, stem=f"{base}-scaling-{m}{suffix}", colors=colors)
    return paths, notes
