"""Scaling laws from a profile's finished runs: loss against training compute, per architecture.

**Points.** Each finished run with a result of ``metric`` (eval ``loss`` in nats per token by
default; ``perplexity`` or ``bits_per_byte`` too) on eval set ``""`` and a training compute
gives one measurement. The compute is the run's ``train_flops`` result (flops_per_token x
steps x batch x input length, :mod:`workbench.train.compute`), else ``flops_per_token`` x
``tokens_trained``. Runs that differ only by seed are one *point*: the mean compute and the
mean metric over the seeds (the aggregation's :func:`~workbench.results.aggregate.summarize`),
so a size trained with three seeds weighs as much as one trained with one.

**Along size only.** The points of one fit differ in nothing but the model's size: the run
fields ``d_model``, ``n_layers``, ``size`` and their grid keys (``model.d_model``,
``model.n_layers``, ``model.size``), the options a size or ``[sweep.match]`` solves
(``opt.<name>``, :mod:`workbench.spec.expand` records them), and the training budget where a
grid varies it (``train.steps``, ``train.tokens``, ``train.flops``, ``train.tokens_per_param``,
``train.epochs``). Every other field that differs between runs of a model (``task``, its
settings such as ``task.tokenizer`` or ``task.vocab_size``, ``seq_len``, ``task_setting``, any
other grid key such as ``train.lr``) splits the fits: one row per model and value of each
(:func:`split_axes`), named by the values that tell it apart (``mamba · task.tokenizer=bpe``).
A loss in bytes and a loss in BPE tokens, or four tasks, are never one law.

**A law, or why not** (:func:`judge`; ``status`` in every table). A row is a law (``ok``) with
:data:`MIN_SIZES` (3) or more distinct computes, an exponent ``b > 0`` and a metric lower at
every larger compute. Otherwise it says so instead of showing numbers: ``too_few_sizes``
("2 points: no fit": no fit is made, a line through two points is no evidence of a law),
``rises`` ("loss rises: b = -1.82, not a law") or ``not_decreasing``; those rows get no a, b
or multiplier in the tables (JSON keeps a rejected fit's numbers under ``rejected_fit``), and
the figure draws their points without a line, the legend saying why.

**Fits** (per model, ``x = ln C``):

- ``power``: ``L(C) = a * C**(-b)``, ordinary least squares of ``ln L`` on ``ln C``
  (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", eq. 1.3 form
  ``L = (C_c / C)**alpha``). The standard errors come from the OLS covariance
  ``s**2 (X^T X)^-1`` with ``s**2 = RSS / (n - 2)``: none with two points (the line goes
  through both; nothing is left to estimate the scatter from).
- ``irreducible``: ``L(C) = E + a * C**(-b)`` with ``0 <= E < min L`` and ``b >= 0``
  (the form of Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models",
  eq. 2, in compute alone), a bounded nonlinear least-squares fit in ``L``: scipy's
  ``curve_fit`` (trust-region reflective) when scipy is importable, else a small bounded
  Levenberg-Marquardt written here (``fitter`` in the result says which). Both work in
  ``x - mean(x)`` so that the amplitude is of order one; the covariance is
  ``s**2 (J^T J)^-1`` at the optimum, ``s**2 = RSS / (n - 3)`` (none with three points).
- ``bootstrap=B``: instead of the covariance, the standard errors are the std of the
  estimates over ``B`` resamples of the points with replacement (resamples with too few
  distinct compute values skipped); ``se_method`` in the result says which was used.

The uncertainty band drawn by ``plot --kind scaling`` is the fitted value ± one standard
error, propagated from the parameters' covariance by the delta method (with the bootstrap:
the 16th..84th percentiles of the resampled curves).

**Compute multiplier.** For a model M and a reference R at the same settings (the same values
of the axes that split the fits), both laws, at a stated compute ``C*`` (``at``; by default the
geometric mean of the smallest and largest training compute among the points of the table's
laws, the same ``C*`` for every row)::

    multiplier(M vs R) = C_R / C*,   where L_R(C_R) = L_M(C*)

i.e. the factor of compute the reference needs, by its own fit, to reach the loss that M's
fit gives at ``C*``. Its standard error (power law, covariance standard errors of both fits)
is the delta method on ``ln multiplier = (ln a_R - ln a_M + b_M x*) / b_R - x*``
(``x* = ln C*``; the two fits independent): gradient ``(1/b_R, -ln C_R / b_R)`` in R's
``(ln a, b)`` and ``(-1/b_R, x*/b_R)`` in M's; ``se = multiplier * se(ln multiplier)``.
None for the reference itself, the irreducible form, bootstrap errors, or a fit without
covariance. ``> 1``: M reaches that loss with 1/multiplier of the reference's
compute (M is more compute-efficient); ``< 1``: M needs more; the reference against itself
is exactly 1. For the power law ``C_R = (a_R / L)**(1/b_R)``; with the irreducible term
``C_R = (a_R / (L - E_R))**(1/b_R)``, infinite where ``L <= E_R`` (the reference never gets
there). It extrapolates R's fit when ``C_R`` falls outside R's measured range (``extrapolated``
in the result says so). Where either row is no law, or R's fit never reaches M's loss (the
irreducible form), there is no multiplier: the table says why, never ``inf``.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from workbench.results import catalogue
from workbench.results.aggregate import records
from workbench.results.curve_fits import fit_irreducible as _fit_irreducible
from workbench.results.curve_fits import fit_power as _fit_power
from workbench.results.scaling_points import (NOT_SETTINGS, SIZE_FIELDS, SIZE_PREFIXES,  # noqa: F401
                                              is_size_field, points_by_group, run_compute,
                                              split_axes)
from workbench.results.scaling_points import _value

FORMS = ("power", "irreducible")
MIN_POINTS = {"power": 2, "irreducible": 3}
FORMATS = ("md", "csv", "latex", "json")


class ScalingError(ValueError):
    """No fit can be made: too few points for a model, a metric that no run has, an unknown
    reference. The message names the model(s) and counts (one line each)."""


@dataclass
class Fit:
    """A fitted law for one model. ``params`` and ``cov`` are in the fit's own coordinates
    (``power``: (ln a, b); ``irreducible``: (E, A, b) with ``a = A * exp(b * x0)``,
    ``x0`` the mean ln C); ``cov`` is None where it cannot be estimated."""
    model: str
    form: str
    a: float
    b: float
    E: float | None
    b_se: float | None
    a_se: float | None
    E_se: float | None
    se_method: str          # "covariance", "bootstrap (B resamples)" or "none (n points = parameters)"
    fitter: str             # "ols", "scipy.curve_fit" or "numpy-lm"
    points: list[tuple[float, float, int]] = field(default_factory=list)  # (C, L, seeds)
    params: tuple = ()
    cov: Any = None
    x0: float = 0.0
    boot: list[tuple] = field(default_factory=list)  # (a, b, E) per bootstrap resample

    def predict(self, C: float | Sequence[float]):
        import numpy as np

        C = np.asarray(C, dtype=float)
        return (self.E or 0.0) + self.a * C ** (-self.b)

    def band(self, C: Sequence[float]):
        """(lo, hi) of the fitted value ± one standard error at each C (see the module
        docstring), or None when the fit has no uncertainty."""
        import numpy as np

        C = np.asarray(C, dtype=float)
        if self.boot:
            curves = np.array([(E or 0.0) + a * C ** (-b) for a, b, E in self.boot])
            return np.percentile(curves, 15.87, axis=0), np.percentile(curves, 84.13, axis=0)
        if self.cov is None:
            return None
        cov = np.asarray(self.cov)
        x = np.log(C)
        if self.form == "power":
            g = np.stack([np.ones_like(x), -x])              # d ln L / d (ln a, b)
            se = np.sqrt(np.einsum("in,ij,jn->n", g, cov, g))
            mid = self.predict(C)
            return mid * np.exp(-se), mid * np.exp(se)
        E, A, b = self.params
        p = np.exp(-b * (x - self.x0))
        g = np.stack([np.ones_like(x), p, -(x - self.x0) * A * p])   # d L / d (E, A, b)
        se = np.sqrt(np.einsum("in,ij,jn->n", g, cov, g))
        mid = self.predict(C)
        return np.maximum(mid - se, mid * 1e-3), mid + se

    def compute_for(self, loss: float) -> float:
        """The compute at which this fit reaches ``loss`` (inf where it never does)."""
        excess = loss - (self.E or 0.0)
        if excess <= 0:
            return math.inf
        return (self.a / excess) ** (1.0 / self.b) if self.b > 0 else math.inf

    @property
    def compute_range(self) -> tuple[float, float]:
        cs = [c for c, _, _ in self.points]
        return min(cs), max(cs)


MIN_SIZES = 3          # distinct training computes a law needs (fewer: "no fit")
STATUSES = {"ok": "a law", "too_few_sizes": "no fit", "rises": "not a law (b <= 0)",
            "not_decreasing": "not a law (points do not decrease)"}


def _distinct(C) -> int:
    return len({round(math.log(c), 9) for c in C})


def fit(points: Sequence[tuple], form: str = "power", model: str = "", bootstrap: int = 0,
        seed: int = 0, use_scipy: bool = True) -> Fit:
    """Fit ``form`` to ``points`` [(C, L) or (C, L, seeds)] (see the module docstring).
    ``bootstrap`` > 0: standard errors from that many resamples of the points instead of
    the covariance. Raises ScalingError with too few points of distinct compute."""
    import numpy as np

    if form not in FORMS:
        raise ScalingError(f"unknown fit form {form!r}; expected one of {', '.join(FORMS)}")
    pts = [(float(p[0]), float(p[1]), int(p[2]) if len(p) > 2 else 1) for p in points]
    need = MIN_POINTS[form]
    if _distinct([c for c, _, _ in pts]) < need:
        raise ScalingError(_too_few(model, pts, need, form))
    C = np.array([c for c, _, _ in pts])
    L = np.array([v for _, v, _ in pts])

    def one(C, L):
        if form == "power":
            (lna, b), cov = _fit_power(C, L)
            return (math.exp(lna), b, None), (lna, b), cov, 0.0, "ols"
        (E, A, b), cov, x0, fitter = _fit_irreducible(C, L, use_scipy)
        return (A * math.exp(b * x0), b, E), (E, A, b), cov, x0, fitter

    (a, b, E), params, cov, x0, fitter = one(C, L)
    a_se = b_se = E_se = None
    boot: list[tuple] = []
    n_par = len(params)
    if bootstrap > 0:
        rng = np.random.default_rng(seed)
        for _ in range(bootstrap):
            idx = rng.integers(0, len(pts), len(pts))
            if _distinct(C[idx]) < need:
                continue
            boot.append(one(C[idx], L[idx])[0])
        if len(boot) >= 2:
            arr = np.array([(ba, bb, be if be is not None else np.nan) for ba, bb, be in boot])
            a_se, b_se = float(np.std(arr[:, 0], ddof=1)), float(np.std(arr[:, 1], ddof=1))
            E_se = float(np.std(arr[:, 2], ddof=1)) if E is not None else None
            se_method = f"bootstrap ({len(boot)} resamples)"
        else:
            boot, se_method = [], "none (too few distinct resamples)"
    elif cov is not None:
        se = np.sqrt(np.maximum(np.diag(cov), 0.0))
        if form == "power":
            a_se, b_se = float(a * se[0]), float(se[1])      # a = exp(ln a): delta method
        else:
            E_se, b_se = float(se[0]), float(se[2])
            # a = A exp(b x0): gradient (0, exp(b x0), A x0 exp(b x0))
            g = np.array([0.0, math.exp(b * x0), params[1] * x0 * math.exp(b * x0)])
            a_se = float(math.sqrt(max(g @ cov @ g, 0.0)))
        se_method = "covariance"
    else:
        se_method = f"none ({len(pts)} points for {n_par} parameters)"
    return Fit(model, form, a, b, E, b_se, a_se, E_se, se_method, fitter, pts, params, cov, x0, boot)


def _too_few(model: str, pts: list, need: int, form: str) -> str:
    distinct = _distinct([c for c, _, _ in pts])
    what = f"{len(pts)} point{'s' if len(pts) != 1 else ''}"
    if distinct != len(pts):
        what += f" ({distinct} distinct training-FLOP value{'s' if distinct != 1 else ''})"
    law = "L = a C^-b" if form == "power" else "L = E + a C^-b"
    return f"model {model!r}: {what}; fitting {law} needs {need} or more of distinct compute"


def multiplier_se(m: Fit, ref: Fit, at: float) -> float | None:
    """The standard error of :func:`multiplier` by the delta method (module docstring), or None."""
    import numpy as np

    if m is ref or m.form != "power" or ref.form != "power" or m.cov is None or ref.cov is None \
            or m.boot or ref.boot:
        return None
    mult = multiplier(m, ref, at)
    if not (math.isfinite(mult) and mult > 0):
        return None
    x = math.log(at)
    ln_c_ref = math.log(mult) + x
    g_ref = np.array([1.0 / ref.b, -ln_c_ref / ref.b])
    g_m = np.array([-1.0 / ref.b, x / ref.b])
    var = float(g_ref @ np.asarray(ref.cov) @ g_ref + g_m @ np.asarray(m.cov) @ g_m)
    return mult * math.sqrt(max(var, 0.0))


def multiplier(m: Fit, ref: Fit, at: float) -> float:
    """The compute multiplier of ``m`` against ``ref`` at compute ``at``: C_ref / at where
    ref's fit reaches m's fitted loss at ``at`` (module docstring). 1 for a fit against itself."""
    if m is ref:
        return 1.0
    return ref.compute_for(float(m.predict(at))) / at


# --------------------------------------------------------------------------- a profile
@dataclass
class Group:
    """One fit's row: a model at one value of every setting that is not its size (``context``,
    {} where none varies), its points, and whether they make a law (module docstring):
    ``status`` one of STATUSES, ``note`` its words for the table ('2 points: no fit', 'loss
    rises: b = -1.82, not a law'), ``fit`` the fitted law (kept for a rejected fit too, which
    no table shows as a result), and its compute multiplier against the reference model at
    the same settings (None with ``multiplier_note`` saying why)."""
    label: str
    model: str
    context: dict[str, Any]
    points: list[tuple[float, float, int]]
    status: str
    note: str
    fit: Fit | None = None
    missing: int = 0
    multiplier: float | None = None
    multiplier_se: float | None = None
    multiplier_note: str = ""
    extrapolated: bool | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def judge(points: Sequence[tuple], form: str, label: str, metric: str, bootstrap: int = 0,
          missing: int = 0) -> tuple[str, str, Fit | None]:
    """(status, note, fit) of one group's points: fewer than MIN_SIZES distinct computes is
    no fit; a fit whose b <= 0 (the metric does not fall with compute) or whose points do not
    decrease along compute is made but rejected."""
    n_distinct = _distinct([c for c, _, _ in points]) if points else 0
    if n_distinct < max(MIN_SIZES, MIN_POINTS[form]):
        what = f"{len(points)} point{'s' if len(points) != 1 else ''}"
        if n_distinct != len(points):
            what += f" ({n_distinct} distinct FLOPs)"
        extra = f"; {missing} run(s) without {metric} or a compute" if missing else ""
        return "too_few_sizes", f"{what}: no fit{extra}", None
    f = fit(points, form, label, bootstrap)
    if not f.b > 0:
        word = "rises" if f.b < 0 else "is flat"
        return "rises", f"{metric} {word}: b = {f.b:.2f}, not a law", f
    pts = sorted(points)
    for (c0, l0, _), (c1, l1, _) in zip(pts, pts[1:]):
        if c1 > c0 and l1 >= l0:
            return "not_decreasing", f"not decreasing at {c1:.2g}: b = {f.b:.2f}, not a law", f
    return "ok", "", f


def analyse(store, profile: str | None, metric: str = "loss", form: str = "power",
            reference: str | None = None, at: float | None = None, bootstrap: int = 0,
            run_ids: Iterable[int] | None = None, states: Iterable[str] = ("finished",),
            eval_set: str = "") -> dict[str, Any]:
    """Fit each model of a profile's finished runs along size, once per value of every other
    setting that varies (:func:`points_by_group`), and judge each fit (:func:`judge`).
    Returns {'groups': {label: Group} (every row), 'fits': {label: Fit} (the laws only),
    'axes', 'reference', 'at' (None without a law), 'multipliers' / 'multiplier_se' /
    'extrapolated': {label: ...}, 'metric', 'form', 'profile', 'task', 'missing', 'eval_set'}.
    Raises ScalingError where there is nothing to fit (no runs, no run with the metric and a
    compute), for a metric that is not loss-like, an unknown reference or a bad ``at``."""
    recs = records(store, profile=profile, states=tuple(states))
    if run_ids is not None:
        keep = set(run_ids)
        recs = [r for r in recs if r["run_id"] in keep]
    where = f"profile {profile!r}" if profile else "the runs chosen"
    if not recs:
        raise ScalingError(f"no {'/'.join(states)} runs with results in {where}")
    c = catalogue.get(metric)
    if c is not None and c.better != "min":
        raise ScalingError(f"{metric!r} is not a loss-like metric (lower is better); use loss, "
                           "perplexity or bits_per_byte")
    pts, missing, axes, labels = points_by_group(recs, metric, eval_set)
    if not any(pts.values()):
        have = sorted({k for r in recs for k in r.get("__metrics__", ())})
        raise ScalingError(f"no run in {where} has both {metric!r} and a training compute "
                           f"(train_flops, or flops_per_token and tokens_trained); metrics: {', '.join(have)}")
    models = list(dict.fromkeys(m for m, _ in pts))
    reference = reference or models[0]
    if reference not in models:
        raise ScalingError(f"reference {reference!r} is not a model of {where}; models: {', '.join(models)}")
    if at is not None and not (at > 0 and math.isfinite(at)):
        raise ScalingError(f"the compute to read multipliers at must be a positive number of FLOPs, not {at}")
    groups: dict[str, Group] = {}
    by_key: dict[tuple, Group] = {}
    for key, p in pts.items():
        status, note, f = judge(p, form, labels[key], metric, bootstrap, missing.get(key, 0))
        g = Group(labels[key], key[0], dict(key[1]), p, status, note, f, missing.get(key, 0))
        groups[g.label] = by_key[key] = g
    laws = [g for g in groups.values() if g.ok]
    if at is None and laws:
        cs = [c for g in laws for c, _, _ in g.points]
        at = math.sqrt(min(cs) * max(cs))
    for (model, ctx), g in by_key.items():
        ref = by_key.get((reference, ctx))
        if not g.ok:
            g.multiplier_note = "no law"
        elif ref is None:
            g.multiplier_note = f"no {reference} runs at these settings"
        elif not ref.ok:
            g.multiplier_note = f"{ref.label}: {ref.note}"
        else:
            mult = multiplier(g.fit, ref.fit, at)
            if math.isfinite(mult) and mult > 0:
                lo, hi = ref.fit.compute_range
                g.multiplier, g.multiplier_se = mult, multiplier_se(g.fit, ref.fit, at)
                g.extrapolated = not (lo <= mult * at <= hi)
            else:
                g.multiplier_note = f"{ref.label}'s fit never reaches this {metric}"
    tasks = sorted({str(r.get("task")) for r in recs})
    return {"groups": groups, "fits": {g.label: g.fit for g in laws}, "axes": axes,
            "reference": reference, "at": at,
            "multipliers": {k: g.multiplier for k, g in groups.items()},
            "multiplier_se": {k: g.multiplier_se for k, g in groups.items()},
            "extrapolated": {k: g.extrapolated for k, g in groups.items() if g.extrapolated is not None},
            "metric": metric, "form": form, "profile": profile,
            "task": tasks[0] if len(tasks) == 1 else "several tasks",
            "missing": {labels[k]: n for k, n in missing.items()}, "eval_set": eval_set}


# --------------------------------------------------------------------------- the table
def _g(v: float | None, digits: int = 3) -> str:
    return "–" if v is None else ("inf" if math.isinf(v) else f"{v:.{digits}g}")


def _b_text(f: Fit, digits: int, pm: str = " ± ") -> str:
    return f"{f.b:.{digits}f}" + (f"{pm}{f.b_se:.{digits}f}" if f.b_se is not None else "")


def _law(form: str) -> str:
    return "L(C) = a·C^-b" if form == "power" else "L(C) = E + a·C^-b"


def _groups(res: dict) -> dict[str, Group]:
    return res["groups"]


def caption(res: dict) -> str:
    """What the table shows, in one paragraph: what a row is fitted along and what makes it a
    law, the fit and its uncertainty, and the multiplier's definition."""
    groups = list(_groups(res).values())
    laws = [g.fit for g in groups if g.ok]
    made = [g.fit for g in groups if g.fit is not None]
    how = sorted({f.se_method.split(" (")[0] for f in laws})
    fitters = sorted({f.fitter for f in made}) or ["none"]
    what = catalogue.describe(res["metric"])
    per = "per model" + (f" and value of {', '.join(res['axes'])}" if res.get("axes") else "")
    text = (f"{res['metric']}: {what}, against training FLOPs C {per}, {_law(res['form'])} "
            f"(fit: {', '.join(fitters)}; along size only: a row's points differ in nothing but "
            f"width, depth, size or training budget; one point per size, mean over seeds); a law "
            f"needs {MIN_SIZES} or more sizes, b > 0 and a {res['metric']} that falls at every "
            f"larger size: a row without one says why in its b cell and has no a, b or multiplier")
    if not laws:
        return text + "; no row here is a law"
    return text + (
        f"; b ± its standard error ({', '.join(how)}); multiplier (± its standard error, delta "
        f"method, where both fits have a covariance) vs {res['reference']} at the same settings: the "
        f"compute {res['reference']} needs to reach this row's fitted {res['metric']} at "
        f"C* = {res['at']:.3g} FLOPs, divided by C* (> 1: more compute-efficient than "
        f"{res['reference']}); only between two laws; * marks a reference's fit extrapolated past "
        f"its measured range")


def _mult_text(g: Group, digits: int) -> str:
    if g.multiplier is None:
        return "–" if not g.ok else f"– ({g.multiplier_note})"
    return _g(g.multiplier, digits) + (f" ± {_g(g.multiplier_se, 2)}" if g.multiplier_se is not None else "") + \
        ("*" if g.extrapolated else "")


def rows(res: dict, digits: int = 3) -> tuple[list[str], list[list[str]]]:
    """The table's header and rows: one row per group; a row that is no law has '–' for a
    (and E) and multiplier, and the reason in its b cell."""
    irr = res["form"] == "irreducible"
    header = ["model", "points", "FLOPs range", "a", "b"] + (["E"] if irr else []) + \
        [f"multiplier vs {res['reference']}"]
    body = []
    for g in _groups(res).values():
        cs = [c for c, _, _ in g.points]
        span = "–" if not cs else f"{cs[0]:.2e}" if min(cs) == max(cs) else f"{min(cs):.2e}..{max(cs):.2e}"
        f = g.fit
        if g.ok:
            row = [g.label, str(len(g.points)), span, _g(f.a, digits), _b_text(f, digits)]
            if irr:
                row.append(f"{f.E:.{digits}f}" + (f" ± {f.E_se:.{digits}f}" if f.E_se is not None else ""))
        else:
            row = [g.label, str(len(g.points)), span, "–", g.note] + (["–"] if irr else [])
        body.append(row + [_mult_text(g, digits)])
    return header, body


def _json_row(res: dict, g: Group) -> dict:
    f = g.fit if g.ok else None
    rejected = None
    if g.fit is not None and not g.ok:
        rejected = {"a": g.fit.a, "b": g.fit.b, "E": g.fit.E, "b_se": g.fit.b_se}
    return {"model": g.model, "label": g.label, "settings": g.context, "status": g.status,
            "status_text": g.note or "a law", "metric": res["metric"], "form": res["form"],
            "points": len(g.points),
            "data": [{"train_flops": c, res["metric"]: v, "seeds": n} for c, v, n in g.points],
            "a": f and f.a, "a_se": f and f.a_se, "b": f and f.b, "b_se": f and f.b_se,
            "E": f and f.E, "E_se": f and f.E_se, "se_method": f and f.se_method,
            "fitter": g.fit.fitter if g.fit is not None else None, "rejected_fit": rejected,
            "reference": res["reference"], "at_flops": res["at"], "multiplier": g.multiplier,
            "multiplier_se": g.multiplier_se, "multiplier_extrapolated": g.extrapolated,
            "multiplier_note": g.multiplier_note or None}


def to_json(res: dict) -> list[dict]:
    """One object per row: ``status`` (one of STATUSES) and ``status_text``; a, b, E and their
    errors only for a law (a rejected fit's numbers under ``rejected_fit``); ``multiplier``
    null unless both this row and the reference's at the same settings are laws."""
    return [_json_row(res, g) for g in _groups(res).values()]


def render(res: dict, fmt: str = "md", digits: int = 3) -> str:
    """The scaling table of :func:`analyse`'s result in md, csv, latex or json."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected md, csv, latex or json")
    if fmt == "json":
        return json.dumps(to_json(res), indent=2) + "\n"
    if fmt == "csv":  # long and loadable: numbers unformatted, a column per setting that splits the fits
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        irr = res["form"] == "irreducible"
        axes = list(res.get("axes") or ())
        w.writerow(["model"] + axes + ["metric", "form", "points", "flops_min", "flops_max", "a", "a_se", "b", "b_se"]
                   + (["E", "E_se"] if irr else []) + ["se_method", "reference", "at_flops", "multiplier",
                                                       "multiplier_se", "status", "status_text"])
        num = lambda v: "" if v is None else f"{v:.6g}"  # noqa: E731
        for g in _groups(res).values():
            cs = [c for c, _, _ in g.points]
            f = g.fit if g.ok else None
            fv = lambda name: num(getattr(f, name)) if f is not None else ""  # noqa: E731
            w.writerow([g.model] + [_value(g.context.get(k)) for k in axes]
                       + [res["metric"], res["form"], len(g.points), num(min(cs) if cs else None),
                          num(max(cs) if cs else None), fv("a"), fv("a_se"), fv("b"), fv("b_se")]
                       + ([fv("E"), fv("E_se")] if irr else [])
                       + [f.se_method if f is not None else "", res["reference"], num(res["at"]),
                          num(g.multiplier), num(g.multiplier_se), g.status, g.note or "a law"])
        return buf.getvalue()
    header, body = rows(res, digits)
    if fmt == "md":
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        return "\n".join(lines) + f"\n\n{caption(res)}\n"
    from workbench.results.export import _tex_escape

    lines = ["\\begin{table}[t]", "\\centering", "\\begin{tabular}{l" + "c" * (len(header) - 1) + "}",
             "\\toprule", " & ".join(_tex_escape(h) for h in header) + " \\\\", "\\midrule"]
    lines += [" & ".join(_tex_escape(c).replace("±", "$\\pm$").replace("·", "$\\cdot$") for c in r) + " \\\\"
              for r in body]
    cap = _tex_escape(caption(res)).replace("·", "$\\cdot$")
    lines += ["\\bottomrule", "\\end{tabular}", "\\caption{" + cap + "}", "\\end{table}"]
    return "\n".join(lines) + "\n"
