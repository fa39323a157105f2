"""Learning curves of several runs, grouped over seeds: the data behind the TUI's compare
view and ``ssm-workbench plot``.

A *group* is the runs that differ only by seed (same profile and every other run field);
its curve is the mean over those runs with a band (mean ± std, or min..max). Runs log at
their own x values (a live run is shorter, wall-clock times never coincide), so each run
is interpolated linearly onto a common grid, never extrapolated: at an x where only some
runs have data the mean is over those, and ``n`` says how many.

x axes: ``step`` (optimizer steps), ``epoch`` (the worker's fractional epoch of the
logged step), ``wall`` (seconds since the run started), ``tokens`` (training tokens
processed: step x the run's ``tokens_per_step``, batch x input length) and ``flops``
(training FLOPs: that x the run's ``flops_per_token``; both from the run's info, written
by workbench/train/compute.py, so every row of the run has them, not only the evaluations
that log ``train/flops``; runs without a count have no point on these axes).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from workbench.results.aggregate import split_keys, summarize
from workbench.store import Run, Store, queries

X_AXES = ("step", "epoch", "wall", "tokens", "flops")
X_LABELS = {"step": "optimizer step", "epoch": "epoch", "wall": "wall time (s)",
            "tokens": "training tokens", "flops": "training FLOPs"}
BANDS = ("std", "minmax", "none")
# the metrics a curve can follow: (split, name) -> legend/axis text
CURVE_METRICS = {
    ("train", "loss"): "train loss",
    ("eval", "loss"): "eval loss",
    ("train", "accuracy"): "train accuracy",
    ("eval", "accuracy"): "eval accuracy",
    ("eval", "sequence_accuracy"): "eval sequence accuracy",
    ("eval", "perplexity"): "eval perplexity",        # language modelling (tasks/lm)
    ("eval", "bits_per_byte"): "eval bits per byte",
}


@dataclass
class Points:
    """One run's (x, y) series of one metric, x ascending."""

    x: list[float] = field(default_factory=list)
    y: list[float] = field(default_factory=list)

    def add(self, x: float, y: float) -> None:
        if self.x and x < self.x[-1]:  # out of order (never from one worker, but be safe)
            i = next(i for i, v in enumerate(self.x) if v > x)
            self.x.insert(i, x)
            self.y.insert(i, y)
        else:
            self.x.append(x)
            self.y.append(y)


@dataclass
class GroupCurve:
    """The mean and band of one group's runs on a common x grid."""

    label: str
    run_ids: list[int]
    x: list[float]
    mean: list[float]
    lo: list[float]
    hi: list[float]
    n: list[int]


def group_key(run: Run) -> tuple:
    """Runs with equal keys differ only by seed."""
    fields = {k: v for k, v in run.fields.items() if k != "seed"}
    fields.setdefault("model", run.label)
    return (run.profile, tuple(sorted((k, repr(v)) for k, v in fields.items())))


def group_runs(runs: Iterable[Run], by_seed: bool = True) -> dict[tuple, list[Run]]:
    """{group key: runs}, in the order the groups' first runs come. ``by_seed=False``
    keeps every run on its own."""
    out: dict[tuple, list[Run]] = {}
    for r in runs:
        out.setdefault(group_key(r) if by_seed else (r.id,), []).append(r)
    return out


def group_labels(groups: dict[tuple, list[Run]]) -> dict[tuple, str]:
    """A short legend label per group: the model's label (prefixed by the profile when
    several are in view), plus the fewest run fields that tell apart groups sharing that
    label (e.g. ``mamba L=256``; four tasks: ``mamba task=parity``, not each task's own
    parameters too), then the seed or the number of seeds."""
    firsts = {k: rs[0] for k, rs in groups.items()}
    several_profiles = len({r.profile for r in firsts.values()}) > 1
    seeds_vary = len({r.seed for rs in groups.values() for r in rs}) > 1
    buckets: dict[tuple, list[tuple]] = {}
    for k, r in firsts.items():
        buckets.setdefault((r.profile, r.label), []).append(k)
    labels = {}
    for (profile, label), keys in buckets.items():
        runs = [firsts[k] for k in keys]
        names = sorted({f for r in runs for f in r.fields} - {"model", "seed"}, key=_field_order)
        varying = [f for f in names if len({repr(r.fields.get(f)) for r in runs}) > 1]
        # the fewest of them that tell the groups apart (four tasks: 'task=parity', not
        # also each task's own parameters, which follow the task)
        fewest = split_keys([dict(r.fields) for r in runs], [])
        if fewest and len({tuple(repr(r.fields.get(f)) for f in fewest) for r in runs}) == len(runs):
            varying = sorted(fewest, key=_field_order)
        for k, r in zip(keys, runs):
            parts = [f"{profile}: {label}" if several_profiles else label]
            parts += [f"{'L' if f == 'seq_len' else f.split('.', 1)[-1]}={r.fields.get(f)}"
                      for f in varying]
            n = len(groups[k])
            if n > 1:
                parts.append(f"({n} seeds)")
            elif seeds_vary:
                parts.append(f"seed {r.seed}")
            labels[k] = " ".join(parts)
    return labels


def _field_order(f: str) -> tuple:
    # the sweep axes first, then task parameters, then model options
    first = ("seq_len", "task", "d_model", "n_layers")
    return (first.index(f) if f in first else len(first) + (f.startswith("opt.")), f)


def x_of(row, run: Run, axis: str) -> float | None:
    """The x of one metric row (a sqlite3.Row or mapping with step, epoch, t)."""
    if axis == "step":
        return float(row["step"])
    if axis == "epoch":
        return None if row["epoch"] is None else float(row["epoch"])
    if axis == "wall":
        return None if run.started is None else max(0.0, row["t"] - run.started)
    if axis in ("tokens", "flops"):
        info = run.info or {}
        per_step = info.get("tokens_per_step")
        per_token = 1.0 if axis == "tokens" else info.get("flops_per_token")
        if per_step is None or per_token is None:
            return None
        return float(row["step"]) * per_step * per_token
    raise ValueError(f"unknown x axis {axis!r}; expected one of {', '.join(X_AXES)}")


def read_rows(store: Store, run_ids: Sequence[int], after_rowid: int = 0) -> list:
    """The metric rows (rowid, run_id, step, epoch, t, split, name, value) of the curve
    metrics of these runs after a rowid, in insertion order: incremental reads for a live
    view (rowids only grow; :func:`workbench.store.queries.metric_rows`)."""
    return queries.metric_rows(store, run_ids, CURVE_METRICS, after_rowid)


def points(rows: Iterable, runs: Sequence[Run], split: str, name: str,
           axis: str = "step") -> dict[int, Points]:
    """{run id: its (x, y) points of metric (split, name)} from metric rows; rows without
    a value (non-finite values are stored as NULL) or without an x are skipped."""
    by_id = {r.id: r for r in runs}
    out: dict[int, Points] = {r.id: Points() for r in runs}
    for row in rows:
        run = by_id.get(row["run_id"])
        if run is None or row["split"] != split or row["name"] != name or row["value"] is None:
            continue
        x = x_of(row, run, axis)
        if x is not None:
            out[run.id].add(x, row["value"])
    return out


def interpolate(p: Points, grid: Sequence[float]) -> list[float | None]:
    """p's y linearly interpolated at each grid x inside [p.x[0], p.x[-1]], else None."""
    out: list[float | None] = []
    for g in grid:
        if not p.x or g < p.x[0] or g > p.x[-1]:
            out.append(None)
            continue
        j = bisect.bisect_left(p.x, g)  # p.x[j] >= g, and j > 0 unless g == p.x[0]
        if p.x[j] == g:
            out.append(p.y[j])
            continue
        x0, x1, y0, y1 = p.x[j - 1], p.x[j], p.y[j - 1], p.y[j]
        out.append(y0 + (y1 - y0) * (g - x0) / (x1 - x0))
    return out


def common_grid(series: Sequence[Points], budget: int | None = None) -> list[float]:
    """The sorted union of the series' x values, thinned evenly to ~budget points (the
    ends kept) so a long run's thousands of records stay cheap to draw."""
    xs = sorted({x for p in series for x in p.x})
    if budget and len(xs) > budget:
        k = -(-len(xs) // budget)
        xs = xs[::k] + ([xs[-1]] if (len(xs) - 1) % k else [])
    return xs


def combine(label: str, run_ids: list[int], series: Sequence[Points], band: str = "std",
            budget: int | None = None) -> GroupCurve:
    """Mean and band over several runs' series (see the module docstring)."""
    if band not in BANDS:
        raise ValueError(f"unknown band {band!r}; expected one of {', '.join(BANDS)}")
    grid = common_grid(series, budget)
    cols = [interpolate(p, grid) for p in series]
    curve = GroupCurve(label, run_ids, [], [], [], [], [])
    for i, x in enumerate(grid):
        ys = [c[i] for c in cols if c[i] is not None]
        if not ys:
            continue
        agg = summarize(ys, ci=False)
        m = agg["mean"]
        if band == "std" and agg["n"] > 1:
            lo, hi = m - agg["std"], m + agg["std"]
        elif band == "minmax":
            lo, hi = min(ys), max(ys)
        else:
            lo = hi = m
        curve.x.append(x)
        curve.mean.append(m)
        curve.lo.append(lo)
        curve.hi.append(hi)
        curve.n.append(len(ys))
    return curve


def curves_from_rows(runs: Sequence[Run], rows: Iterable, split: str, name: str, axis: str = "step",
                     band: str = "std", by_seed: bool = True,
                     budget: int | None = None) -> list[GroupCurve]:
    """One curve per group of ``runs`` for metric (split, name) from their metric
    ``rows`` (:func:`read_rows`); groups without any point of that metric are left out."""
    pts = points(rows, runs, split, name, axis)
    groups = group_runs(runs, by_seed)
    labels = group_labels(groups)
    out = []
    for k, rs in groups.items():
        series = [pts[r.id] for r in rs if pts[r.id].x]
        if series:
            out.append(combine(labels[k], [r.id for r in rs], series, band, budget))
    return out


def curves(store: Store, runs: Sequence[Run], split: str, name: str, axis: str = "step",
           band: str = "std", by_seed: bool = True, budget: int | None = None) -> list[GroupCurve]:
    """:func:`curves_from_rows` of runs as the store holds them now."""
    return curves_from_rows(runs, read_rows(store, [r.id for r in runs]), split, name, axis, band, by_seed, budget)
