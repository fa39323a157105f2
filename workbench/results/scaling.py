"""Scaling laws from a profile's finished runs: loss against training compute, per architecture.

**Points.** Each finished run with a result of ``metric`` (eval ``loss`` in nats per token by
default; ``perplexity`` or ``bits_per_byte`` too) on eval set ``""`` and a training compute
gives one measurement. The compute is the run's ``train_flops`` result (flops_per_token x
steps x batch x input length, :mod:`workbench.train.compute`), else ``flops_per_token`` x
``tokens_trained``. Runs that differ only by seed are one *point*: the mean compute and the
mean metric over the seeds (the aggregation's :func:`~workbench.results.aggregate.summarize`),
so a size trained with three seeds weighs as much as one trained with one. A fit needs two
points of distinct compute per model (three with the irreducible term); fewer is refused
with one line per model saying how many it has (:class:`ScalingError`).

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

**Compute multiplier.** For a model M and a reference R, at a stated compute ``C*``
(``at``; by default the geometric mean of the smallest and largest training compute among
all fitted points of the table, the same ``C*`` for every row)::

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
in the result says so).
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from workbench.results import catalogue
from workbench.results.aggregate import records, summarize

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


# --------------------------------------------------------------------------- points
def run_compute(rec: dict) -> float | None:
    """A record's training compute: ``train_flops``, else flops_per_token x tokens_trained."""
    c = rec.get("train_flops")
    if c is None and rec.get("flops_per_token") is not None and rec.get("tokens_trained") is not None:
        c = rec["flops_per_token"] * rec["tokens_trained"]
    return float(c) if c is not None and c > 0 else None


def _config_key(rec: dict) -> tuple:
    """What identifies a run up to its seed (the fields that are not bookkeeping or metrics)."""
    metrics = set(rec.get("__metrics__", ()))
    skip = {"seed", "run_id", "profile", "eval_set", "__metrics__", "__grid__"} | metrics
    return tuple(sorted((k, repr(v)) for k, v in rec.items() if k not in skip))


def points_by_model(recs: Iterable[dict], metric: str = "loss", eval_set: str = "") -> \
        tuple[dict[str, list[tuple[float, float, int]]], dict[str, int]]:
    """({model: [(C, L, seeds)] sorted by C}, {model: runs without a compute or the metric}),
    models in the order their first run appears (the profile's run order)."""
    groups: dict[str, dict[tuple, list[tuple[float, float]]]] = {}
    missing: dict[str, int] = {}
    for r in recs:
        if r.get("eval_set", "") != eval_set:
            continue
        model = str(r.get("model"))
        groups.setdefault(model, {})
        c, v = run_compute(r), r.get(metric)
        if c is None or v is None or not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
            missing[model] = missing.get(model, 0) + 1
            continue
        groups[model].setdefault(_config_key(r), []).append((c, float(v)))
    out: dict[str, list[tuple[float, float, int]]] = {}
    for model, cfgs in groups.items():
        pts = [(summarize(c for c, _ in ms)["mean"], summarize(v for _, v in ms)["mean"], len(ms))
               for ms in cfgs.values()]
        out[model] = sorted(pts)
    return out, missing


# --------------------------------------------------------------------------- fits
def _ols(x, y):
    """Slope and intercept of y on x with their covariance (None with two points)."""
    import numpy as np

    X = np.stack([np.ones_like(x), x], axis=1)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    n = len(x)
    cov = None
    if n > 2:
        rss = float(np.sum((y - X @ coef) ** 2))
        cov = rss / (n - 2) * np.linalg.inv(X.T @ X)
    return coef, cov


def _fit_power(C, L):
    """(ln a, b), cov over (ln a, b): ln L = ln a - b ln C by OLS."""
    import numpy as np

    coef, cov = _ols(np.log(C), np.log(L))
    params = (float(coef[0]), float(-coef[1]))
    if cov is not None:  # (intercept, slope) -> (ln a, b = -slope)
        J = np.diag([1.0, -1.0])
        cov = J @ cov @ J.T
    return params, cov


def _scipy_curve_fit():
    try:
        from scipy.optimize import curve_fit
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    return curve_fit


def _lm_bounded(f, jac, p0, lo, hi, x, y, iters: int = 500):
    """Levenberg-Marquardt with the parameters clipped into [lo, hi] after every step
    (the fallback when scipy is not importable)."""
    import numpy as np

    p = np.clip(np.asarray(p0, float), lo, hi)
    lam = 1e-3
    r = f(x, *p) - y
    cost = float(r @ r)
    for _ in range(iters):
        J = jac(x, *p)
        A = J.T @ J
        g = J.T @ r
        step = np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-12), -g)
        q = np.clip(p + step, lo, hi)
        rq = f(x, *q) - y
        cq = float(rq @ rq)
        if cq < cost:
            done = abs(cost - cq) <= 1e-15 * max(cost, 1e-300) or np.max(np.abs(q - p)) < 1e-12
            p, r, cost, lam = q, rq, cq, max(lam / 10, 1e-12)
            if done:
                break
        else:
            lam *= 10
            if lam > 1e12:
                break
    return p


def _fit_irreducible(C, L, use_scipy: bool = True):
    """(E, A, b), cov, x0, fitter: L = E + A exp(-b (ln C - x0)), x0 = mean ln C."""
    import numpy as np

    x = np.log(C)
    x0 = float(np.mean(x))
    xc = x - x0
    lmin = float(np.min(L))

    def f(xc, E, A, b):
        return E + A * np.exp(-b * xc)

    def jac(xc, E, A, b):
        p = np.exp(-b * xc)
        return np.stack([np.ones_like(xc), p, -xc * A * p], axis=1)

    # start: E at half the smallest loss, then a log-log line through L - E
    E0 = 0.5 * lmin
    (lnA0, b0), _ = _fit_power(np.exp(xc), L - E0)
    lo = np.array([0.0, 1e-12, 0.0])
    hi = np.array([lmin * (1 - 1e-9), np.inf, 10.0])
    p0 = np.clip([E0, math.exp(lnA0), max(b0, 1e-3)], lo, np.where(np.isfinite(hi), hi, 1e300))
    curve_fit = _scipy_curve_fit() if use_scipy else None
    if curve_fit is not None:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # OptimizeWarning: no covariance with n = 3
            p, _ = curve_fit(f, xc, L, p0=p0, bounds=(lo, hi), jac=jac, method="trf",
                             max_nfev=10000)
        fitter = "scipy.curve_fit"
    else:
        p = _lm_bounded(f, jac, p0, lo, np.where(np.isfinite(hi), hi, 1e300), xc, L)
        fitter = "numpy-lm"
    p = np.asarray(p, float)
    n = len(L)
    cov = None
    if n > 3:
        r = f(xc, *p) - L
        J = jac(xc, *p)
        try:
            cov = float(r @ r) / (n - 3) * np.linalg.inv(J.T @ J)
        except np.linalg.LinAlgError:
            cov = None
    return tuple(float(v) for v in p), cov, x0, fitter


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
def analyse(store, profile: str | None, metric: str = "loss", form: str = "power",
            reference: str | None = None, at: float | None = None, bootstrap: int = 0,
            run_ids: Iterable[int] | None = None, states: Iterable[str] = ("finished",),
            eval_set: str = "") -> dict[str, Any]:
    """Fit every model of a profile's finished runs. Returns {'fits': {model: Fit}, 'reference',
    'at', 'multipliers': {model: float}, 'metric', 'form', 'profile', 'task', 'missing'}.
    Raises ScalingError (one line per model with too few points, or a bad metric/reference)."""
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
    pts, missing = points_by_model(recs, metric, eval_set)
    if not any(pts.values()):
        have = sorted({k for r in recs for k in r.get("__metrics__", ())})
        raise ScalingError(f"no run in {where} has both {metric!r} and a training compute "
                           f"(train_flops, or flops_per_token and tokens_trained); metrics: {', '.join(have)}")
    need = MIN_POINTS[form]
    short = [m for m, p in pts.items() if _distinct([x[0] for x in p] or [1.0]) < need or not p]
    if short:
        lines = []
        for m in short:
            line = _too_few(m, pts[m], need, form)
            if missing.get(m):
                line += f" ({missing[m]} finished run(s) without {metric} or a training compute)"
            lines.append(line)
        raise ScalingError("\n".join(lines))
    fits = {m: fit(p, form, m, bootstrap) for m, p in pts.items()}
    reference = reference or next(iter(fits))
    if reference not in fits:
        raise ScalingError(f"reference {reference!r} is not a model of {where}; models: {', '.join(fits)}")
    if at is not None and not (at > 0 and math.isfinite(at)):
        raise ScalingError(f"the compute to read multipliers at must be a positive number of FLOPs, not {at}")
    if at is None:
        cs = [c for f in fits.values() for c, _, _ in f.points]
        at = math.sqrt(min(cs) * max(cs))
    ref = fits[reference]
    mult = {m: multiplier(f, ref, at) for m, f in fits.items()}
    mult_se = {m: multiplier_se(f, ref, at) for m, f in fits.items()}
    lo, hi = ref.compute_range
    extrapolated = {m: not (lo <= v * at <= hi) for m, v in mult.items() if math.isfinite(v)}
    tasks = sorted({str(r.get("task")) for r in recs})
    return {"fits": fits, "reference": reference, "at": at, "multipliers": mult, "multiplier_se": mult_se,
            "extrapolated": extrapolated, "metric": metric, "form": form, "profile": profile,
            "task": tasks[0] if len(tasks) == 1 else "several tasks", "missing": missing,
            "eval_set": eval_set}


# --------------------------------------------------------------------------- the table
def _g(v: float | None, digits: int = 3) -> str:
    return "–" if v is None else ("inf" if math.isinf(v) else f"{v:.{digits}g}")


def _b_text(f: Fit, digits: int, pm: str = " ± ") -> str:
    return f"{f.b:.{digits}f}" + (f"{pm}{f.b_se:.{digits}f}" if f.b_se is not None else "")


def _law(form: str) -> str:
    return "L(C) = a·C^-b" if form == "power" else "L(C) = E + a·C^-b"


def caption(res: dict) -> str:
    """What the table shows, in one paragraph (fit, uncertainty, multiplier's definition)."""
    fits = list(res["fits"].values())
    how = sorted({f.se_method.split(" (")[0] for f in fits})
    fitters = sorted({f.fitter for f in fits})
    what = catalogue.describe(res["metric"])
    return (f"{res['metric']}: {what}, against training FLOPs C per model, {_law(res['form'])} "
            f"(fit: {', '.join(fitters)}; one point per configuration, mean over seeds); "
            f"b ± its standard error ({', '.join(how)}); multiplier (± its standard error, delta "
            f"method, where both fits have a covariance) vs {res['reference']}: the "
            f"compute {res['reference']} needs to reach this model's fitted {res['metric']} at "
            f"C* = {res['at']:.3g} FLOPs, divided by C* (> 1: more compute-efficient than "
            f"{res['reference']}); * marks a reference's fit extrapolated past its measured range")


def rows(res: dict, digits: int = 3) -> tuple[list[str], list[list[str]]]:
    irr = res["form"] == "irreducible"
    header = ["model", "points", "FLOPs range", "a", "b"] + (["E"] if irr else []) + \
        [f"multiplier vs {res['reference']}"]
    body = []
    for m, f in res["fits"].items():
        lo, hi = f.compute_range
        mult = res["multipliers"][m]
        se = res.get("multiplier_se", {}).get(m)
        mt = _g(mult, digits) + (f" ± {_g(se, 2)}" if se is not None else "") + \
            ("*" if res["extrapolated"].get(m) else "")
        row = [m, str(len(f.points)), f"{lo:.2e}..{hi:.2e}", _g(f.a, digits), _b_text(f, digits)]
        if irr:
            row.append(f"{f.E:.{digits}f}" + (f" ± {f.E_se:.{digits}f}" if f.E_se is not None else ""))
        body.append(row + [mt])
    return header, body


def to_json(res: dict) -> list[dict]:
    out = []
    for m, f in res["fits"].items():
        mult = res["multipliers"][m]
        out.append({"model": m, "metric": res["metric"], "form": f.form, "points": len(f.points),
                    "data": [{"train_flops": c, res["metric"]: v, "seeds": n} for c, v, n in f.points],
                    "a": f.a, "a_se": f.a_se, "b": f.b, "b_se": f.b_se, "E": f.E, "E_se": f.E_se,
                    "se_method": f.se_method, "fitter": f.fitter, "reference": res["reference"],
                    "at_flops": res["at"], "multiplier": mult if math.isfinite(mult) else None,
                    "multiplier_se": res.get("multiplier_se", {}).get(m),
                    "multiplier_extrapolated": res["extrapolated"].get(m)})
    return out


def render(res: dict, fmt: str = "md", digits: int = 3) -> str:
    """The scaling table of :func:`analyse`'s result in md, csv, latex or json."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected md, csv, latex or json")
    if fmt == "json":
        return json.dumps(to_json(res), indent=2) + "\n"
    if fmt == "csv":  # long and loadable: numbers unformatted
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        irr = res["form"] == "irreducible"
        w.writerow(["model", "metric", "form", "points", "flops_min", "flops_max", "a", "a_se", "b", "b_se"]
                   + (["E", "E_se"] if irr else []) + ["se_method", "reference", "at_flops", "multiplier", "multiplier_se"])
        num = lambda v: "" if v is None else f"{v:.6g}"  # noqa: E731
        for m, f in res["fits"].items():
            lo, hi = f.compute_range
            w.writerow([m, res["metric"], f.form, len(f.points), num(lo), num(hi), num(f.a), num(f.a_se),
                        num(f.b), num(f.b_se)] + ([num(f.E), num(f.E_se)] if irr else [])
                       + [f.se_method, res["reference"], num(res["at"]), num(res["multipliers"][m]),
                          num(res.get("multiplier_se", {}).get(m))])
        return buf.getvalue()
    header, body = rows(res, digits)
    if fmt == "md":
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        return "\n".join(lines) + f"\n\n{caption(res)}\n"
    from workbench.results.export import _tex_escape

    lines = ["\\begin{table}[t]", "\\centering", "\\begin{tabular}{l" + "c" * (len(header) - 1) + "}",
             "\\toprule", " & ".join(_tex_escape(h) for h in header) + " \\\\", "\\midrule"]
    lines += [" & ".join(_tex_escape(c).replace("±", "$\\pm$") for c in r) + " \\\\" for r in body]
    cap = _tex_escape(caption(res)).replace("·", "$\\cdot$")
    lines += ["\\bottomrule", "\\end{tabular}", "\\caption{" + cap + "}", "\\end{table}"]
    return "\n".join(lines) + "\n"
