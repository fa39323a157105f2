"""The least-squares fits behind the scaling laws (workbench/results/scaling.py), apart from the
grouping, judging and tables there: ``L = a C^-b`` by OLS of ln L on ln C, and
``L = E + A exp(-b (ln C - x0))`` by bounded nonlinear least squares (scipy's ``curve_fit``
when importable, else a bounded Levenberg-Marquardt in numpy). Each returns its parameters
and their covariance (None where the points leave no degrees of freedom).
"""
from __future__ import annotations

import math

def ols(x, y):
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


def fit_power(C, L):
    """(ln a, b), cov over (ln a, b): ln L = ln a - b ln C by OLS."""
    import numpy as np

    coef, cov = ols(np.log(C), np.log(L))
    params = (float(coef[0]), float(-coef[1]))
    if cov is not None:  # (intercept, slope) -> (ln a, b = -slope)
        J = np.diag([1.0, -1.0])
        cov = J @ cov @ J.T
    return params, cov


def scipy_curve_fit():
    try:
        from scipy.optimize import curve_fit
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    return curve_fit


def lm_bounded(f, jac, p0, lo, hi, x, y, iters: int = 500):
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


def fit_irreducible(C, L, use_scipy: bool = True):
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
    (lnA0, b0), _ = fit_power(np.exp(xc), L - E0)
    lo = np.array([0.0, 1e-12, 0.0])
    hi = np.array([lmin * (1 - 1e-9), np.inf, 10.0])
    p0 = np.clip([E0, math.exp(lnA0), max(b0, 1e-3)], lo, np.where(np.isfinite(hi), hi, 1e300))
    curve_fit = scipy_curve_fit() if use_scipy else None
    if curve_fit is not None:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # OptimizeWarning: no covariance with n = 3
            p, _ = curve_fit(f, xc, L, p0=p0, bounds=(lo, hi), jac=jac, method="trf",
                             max_nfev=10000)
        fitter = "scipy.curve_fit"
    else:
        p = lm_bounded(f, jac, p0, lo, np.where(np.isfinite(hi), hi, 1e300), xc, L)
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
