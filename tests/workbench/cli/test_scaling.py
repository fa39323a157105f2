"""The scaling analysis (workbench/results/scaling.py, issue 33 item 4): power-law fits of
loss against training FLOPs recover known laws, the compute multiplier has its analytic
value, too few points are refused per model, and `plot --kind scaling` / `export --scaling`
write the figure and the table from a store."""
from __future__ import annotations

import csv
import io
import json
import math
import os
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from workbench import cli
from workbench.results import plot, scaling
from workbench.store import Store

COMPUTE = (1e15, 4e15, 1.6e16, 6.4e16)          # training FLOPs of the four sizes
LAWS = {"transformer": (40.0, 0.10), "mamba": (36.0, 0.10)}   # (a, b) of L = a C^-b


def law(model: str, C: float) -> float:
    a, b = LAWS[model]
    return a * C ** -b


def add_run(store: Store, model: str, C: float, seed: int, loss: float, d_model: int,
            profile: str = "lm-scaling") -> int:
    fields = {"model": model, "task": "lm", "seq_len": 64, "seed": seed, "d_model": d_model}
    (rid,) = store.add_runs([{"profile": profile, "model": model, "label": model, "task": "lm",
                              "seq_len": 64, "seed": seed, "fields": fields}])
    store.mark_started(rid, os.getpid(), "cpu", "cpu0")
    tokens = C / (6.0 * 1e6)
    store.set_results(rid, {"loss": loss, "perplexity": math.exp(loss), "train_flops": C,
                            "flops_per_token": C / tokens, "tokens_trained": tokens})
    store.set_results(rid, {"loss": loss + 0.5}, "valid")  # the validation set is not the test set
    assert store.finish(rid, "finished")
    return rid


@pytest.fixture()
def store(tmp_path):
    """Profile 'lm-scaling': transformer and mamba at four sizes, two seeds each whose losses
    are the law x (1 ± 0.2%), so each point's mean over seeds is exactly on the law."""
    s = Store(tmp_path / "store")
    for model in LAWS:
        for i, C in enumerate(COMPUTE):
            for seed, eps in ((0, 0.002), (1, -0.002)):
                add_run(s, model, C, seed, law(model, C) * (1 + eps), d_model=32 * 2 ** i)
    return s


# --------------------------------------------------------------------------- fits
def test_power_fit_recovers_a_known_exponent_with_its_standard_error():
    rng = np.random.default_rng(1)
    C = np.geomspace(1e13, 1e19, 10)
    exact = scaling.fit(list(zip(C, 300.0 * C ** -0.12)), "power")
    assert exact.b == pytest.approx(0.12, rel=1e-9) and exact.a == pytest.approx(300.0, rel=1e-9)
    noisy = scaling.fit(list(zip(C, 300.0 * C ** -0.12 * np.exp(rng.normal(0, 0.01, C.size)))), "power")
    assert noisy.se_method == "covariance" and 0 < noisy.b_se < 0.01
    assert abs(noisy.b - 0.12) < 3 * noisy.b_se
    assert noisy.a == pytest.approx(300.0, rel=0.2)
    # the band holds the fitted line and widens away from the middle of the data
    lo, hi = noisy.band([1e13, 1e16, 1e19])
    mid = noisy.predict([1e13, 1e16, 1e19])
    assert np.all(lo < mid) and np.all(mid < hi)
    assert (hi / lo)[0] > (hi / lo)[1] < (hi / lo)[2]


def test_two_points_fit_exactly_with_no_standard_error():
    f = scaling.fit([(1e15, 3.0), (1e16, 3.0 * 10 ** -0.1)], "power")
    assert f.b == pytest.approx(0.1) and f.b_se is None and f.se_method.startswith("none")
    assert f.band([1e15]) is None


@pytest.mark.parametrize("use_scipy", [True, False])
def test_irreducible_fit_recovers_E_a_and_b(use_scipy):
    rng = np.random.default_rng(2)
    C = np.geomspace(1e12, 1e18, 9)
    L = (1.7 + 40.0 * C ** -0.1) * (1 + rng.normal(0, 0.001, C.size))
    f = scaling.fit(list(zip(C, L)), "irreducible", use_scipy=use_scipy)
    assert f.fitter == ("scipy.curve_fit" if use_scipy else "numpy-lm")
    assert f.E == pytest.approx(1.7, rel=0.03)
    assert f.b == pytest.approx(0.1, rel=0.05)
    assert f.a == pytest.approx(40.0, rel=0.15)
    assert f.b_se is not None and f.E_se is not None and abs(f.b - 0.1) < 4 * f.b_se


def test_the_fallback_fitter_agrees_with_scipy():
    C = np.geomspace(1e12, 1e18, 7)
    pts = list(zip(C, 2.0 + 25.0 * C ** -0.08))
    a, b = (scaling.fit(pts, "irreducible", use_scipy=s) for s in (True, False))
    assert (b.E, b.a, b.b) == pytest.approx((a.E, a.a, a.b), rel=1e-4)
    assert (a.E, a.b) == pytest.approx((2.0, 0.08), rel=1e-4)


def test_bootstrap_standard_errors_are_labelled_and_reproducible():
    rng = np.random.default_rng(3)
    C = np.geomspace(1e13, 1e18, 8)
    pts = list(zip(C, 50.0 * C ** -0.1 * np.exp(rng.normal(0, 0.01, C.size))))
    f1, f2 = (scaling.fit(pts, "power", bootstrap=200, seed=5) for _ in range(2))
    assert f1.se_method.startswith("bootstrap (") and f1.b_se == f2.b_se > 0
    cov = scaling.fit(pts, "power")
    assert f1.b_se == pytest.approx(cov.b_se, rel=1.0)  # the same order as the covariance's


# --------------------------------------------------------------------------- multiplier
def test_multiplier_against_itself_is_one_and_a_known_pair_is_analytic():
    C = list(np.geomspace(1e14, 1e17, 4))
    ref = scaling.fit([(c, 40.0 * c ** -0.1) for c in C], "power", "ref")
    same_b = scaling.fit([(c, 36.0 * c ** -0.1) for c in C], "power", "m")
    assert scaling.multiplier(ref, ref, 3e15) == 1.0
    # equal exponents: the reference needs (a_ref / a_m)^(1/b) times the compute, at every C*
    for at in (1e14, 3e15, 1e18):
        assert scaling.multiplier(same_b, ref, at) == pytest.approx((40.0 / 36.0) ** 10, rel=1e-9)
    # different exponents: C_ref = (a_ref / L_m(C*))^(1/b_ref)
    steeper = scaling.fit([(c, 60.0 * c ** -0.12) for c in C], "power", "s")
    at = 1e16
    want = (40.0 / (60.0 * at ** -0.12)) ** (1 / 0.1) / at
    assert scaling.multiplier(steeper, ref, at) == pytest.approx(want, rel=1e-9)
    # with E: a loss below the reference's irreducible term is never reached
    C6 = list(np.geomspace(1e12, 1e18, 6))
    ref_e = scaling.fit([(c, 2.0 + 30.0 * c ** -0.1) for c in C6], "irreducible", "ref")
    low = scaling.fit([(c, 1.0 + 30.0 * c ** -0.1) for c in C6], "irreducible", "low")
    assert math.isinf(scaling.multiplier(low, ref_e, 1e18))
    assert scaling.multiplier(ref_e, ref_e, 1e15) == 1.0


# --------------------------------------------------------------------------- refusal
def test_too_few_points_are_refused_naming_the_model():
    with pytest.raises(scaling.ScalingError, match=r"model 'gla': 1 point; .* needs 2 or more"):
        scaling.fit([(1e15, 3.0)], "power", "gla")
    # two seeds at one size are one compute value
    with pytest.raises(scaling.ScalingError, match=r"2 points \(1 distinct training-FLOP value\)"):
        scaling.fit([(1e15, 3.0), (1e15, 3.1)], "power", "gla")
    with pytest.raises(scaling.ScalingError, match=r"needs 3 or more"):
        scaling.fit([(1e15, 3.0), (1e16, 2.5)], "irreducible", "gla")


def test_a_profile_with_a_one_point_model_shows_it_as_no_fit(store, capsys):
    # issue 41: a model with too few sizes is a row that says so, not a refusal of the table
    add_run(store, "gla", 1e15, 0, 3.0, d_model=32)
    res = scaling.analyse(store, "lm-scaling")
    g = res["groups"]["gla"]
    assert (g.status, g.note, g.fit) == ("too_few_sizes", "1 point: no fit", None)
    assert list(res["fits"]) == ["transformer", "mamba"]
    root = str(store.root)
    assert cli.main(["--store", root, "export", "--profile", "lm-scaling", "--scaling"]) == 0
    assert "| gla | 1 | 1.00e+15 | – | 1 point: no fit | – |" in capsys.readouterr().out
    assert cli.main(["--store", root, "plot", "lm-scaling", "--kind", "scaling",
                     "--out", str(store.root / "figs")]) == 0
    capsys.readouterr()
    # nothing to fit at all (no run with the metric and a compute) is still refused in one line
    with pytest.raises(scaling.ScalingError, match="has both 'bits_per_byte' and a training compute"):
        scaling.analyse(store, "lm-scaling", "bits_per_byte")


# --------------------------------------------------------------------------- from a store
def test_analyse_fits_each_model_from_the_store(store):
    res = scaling.analyse(store, "lm-scaling")
    assert list(res["fits"]) == ["transformer", "mamba"] and res["reference"] == "transformer"
    for model, (a, b) in LAWS.items():
        f = res["fits"][model]
        assert [(c, n) for c, _, n in f.points] == [(c, 2) for c in COMPUTE]  # seeds -> one point
        # the seeds' mean is the law x (1 + 0.002 - 0.002)/2... exactly on it: the fit is exact
        assert (f.a, f.b) == pytest.approx((a, b), rel=1e-6)
    assert res["at"] == pytest.approx(math.sqrt(COMPUTE[0] * COMPUTE[-1]))
    assert res["multipliers"]["transformer"] == 1.0
    assert res["multipliers"]["mamba"] == pytest.approx((40.0 / 36.0) ** 10, rel=1e-5)
    other = scaling.analyse(store, "lm-scaling", reference="mamba", metric="perplexity")
    assert other["multipliers"]["mamba"] == 1.0 and other["multipliers"]["transformer"] < 1
    with pytest.raises(scaling.ScalingError, match="reference 'gpt' is not a model"):
        scaling.analyse(store, "lm-scaling", reference="gpt")


def test_export_scaling_table_in_every_format(store, capsys):
    root = str(store.root)
    base = ["--store", root, "export", "--profile", "lm-scaling", "--scaling"]
    assert cli.main(base) == 0
    md = capsys.readouterr().out
    assert md.splitlines()[0] == "| model | points | FLOPs range | a | b | multiplier vs transformer |"
    assert "| transformer | 4 | 1.00e+15..6.40e+16 | 40 | 0.100 ± 0.000 | 1 |" in md
    assert "C* = 8e+15 FLOPs" in md and "covariance" in md
    assert cli.main(base + ["--format", "json"]) == 0
    js = {r["model"]: r for r in json.loads(capsys.readouterr().out)}
    assert js["mamba"]["b"] == pytest.approx(0.1, rel=1e-6) and js["mamba"]["points"] == 4
    assert js["mamba"]["multiplier"] == pytest.approx((40.0 / 36.0) ** 10, rel=1e-5)
    assert js["transformer"]["multiplier"] == 1.0 and js["mamba"]["se_method"] == "covariance"
    assert cli.main(base + ["--format", "csv", "--reference", "mamba", "--irreducible"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["model"] for r in rows] == ["transformer", "mamba"]
    assert rows[1]["multiplier"] == "1" and {"E", "E_se"} <= set(rows[0])
    assert cli.main(base + ["--format", "latex", "--metric", "perplexity"]) == 0
    tex = capsys.readouterr().out
    assert "\\begin{tabular}" in tex and "$\\pm$" in tex
    assert cli.main(base + ["--metric", "accuracy"]) == 2
    assert "not a loss-like metric" in capsys.readouterr().err


def test_plot_scaling_writes_png_and_svg_with_fits_and_exponents(store, tmp_path, capsys):
    fig = plot.scaling_figure(store, "lm-scaling")
    (ax,) = fig.axes
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    labels = [ln.get_label() for ln in ax.get_lines()]
    assert "transformer: b = 0.100 ± 0.000" in labels and "mamba: b = 0.100 ± 0.000" in labels
    (fitted,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("mamba: b")]
    xs = np.asarray(fitted.get_xdata())
    assert np.asarray(fitted.get_ydata()) == pytest.approx(36.0 * xs ** -0.1, rel=1e-5)
    (points,) = [ln for ln in ax.get_lines() if ln.get_label() == "_mamba points"]
    assert list(points.get_xdata()) == list(COMPUTE)
    assert len(ax.collections) == 2  # one band per model
    colors = plot.model_colors(LAWS)
    assert fitted.get_color() == colors["mamba"]
    out = tmp_path / "figs"
    assert cli.main(["--store", str(store.root), "plot", "lm-scaling", "--kind", "scaling",
                     "--out", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(out / "lm-scaling-scaling-loss.png"), str(out / "lm-scaling-scaling-loss.svg")]
    assert (out / "lm-scaling-scaling-loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ET.parse(out / "lm-scaling-scaling-loss.svg")


def test_without_scipy_the_irreducible_fit_falls_back_to_numpy(store, monkeypatch):
    from workbench.results import curve_fits

    monkeypatch.setattr(curve_fits, "scipy_curve_fit", lambda: None)
    res = scaling.analyse(store, "lm-scaling", form="irreducible")
    assert {f.fitter for f in res["fits"].values()} == {"numpy-lm"}
    assert "fit: numpy-lm" in scaling.render(res, "md")


def test_plot_all_draws_scaling_for_lm_runs(store, tmp_path):
    paths, notes = plot.plot_profile(store, "lm-scaling", tmp_path / "all")
    assert {p.name for p in paths} >= {"lm-scaling-scaling-loss.png", "lm-scaling-scaling-loss.svg"}
    assert not [n for n in notes if n.startswith("scaling")]


def test_multiplier_standard_error_is_the_delta_method_of_both_fits():
    x = math.log(1e15)
    pts = [(1e12, 5.0), (1e14, 3.0)]
    ref = scaling.Fit("ref", "power", a=50.0, b=0.1, E=None, b_se=None, a_se=None, E_se=None,
                      se_method="covariance", fitter="ols", points=pts, params=(math.log(50.0), 0.1),
                      cov=np.zeros((2, 2)))
    cov_m = np.array([[0.04, 0.0], [0.0, 0.0]])            # only ln a_M uncertain: se(ln a_M) = 0.2
    m = scaling.Fit("m", "power", a=45.0, b=0.1, E=None, b_se=None, a_se=None, E_se=None,
                    se_method="covariance", fitter="ols", points=pts, params=(math.log(45.0), 0.1), cov=cov_m)
    mult = scaling.multiplier(m, ref, 1e15)
    assert scaling.multiplier_se(m, ref, 1e15) == pytest.approx(mult * 0.2 / 0.1, rel=1e-9)
    # only b_R uncertain: d ln mult / d b_R = -ln C_R / b_R
    ref_b = scaling.Fit("ref", "power", a=50.0, b=0.1, E=None, b_se=None, a_se=None, E_se=None,
                        se_method="covariance", fitter="ols", points=pts, params=(math.log(50.0), 0.1),
                        cov=np.array([[0.0, 0.0], [0.0, 1e-4]]))
    m0 = scaling.Fit("m", "power", a=45.0, b=0.1, E=None, b_se=None, a_se=None, E_se=None,
                     se_method="covariance", fitter="ols", points=pts, params=(math.log(45.0), 0.1),
                     cov=np.zeros((2, 2)))
    want = mult * (math.log(mult) + x) / 0.1 * 1e-2
    assert scaling.multiplier_se(m0, ref_b, 1e15) == pytest.approx(want, rel=1e-9)
    # only b_M uncertain: d ln mult / d b_M = x* / b_R
    m_b = scaling.Fit("m", "power", a=45.0, b=0.1, E=None, b_se=None, a_se=None, E_se=None,
                      se_method="covariance", fitter="ols", points=pts, params=(math.log(45.0), 0.1),
                      cov=np.array([[0.0, 0.0], [0.0, 1e-6]]))
    assert scaling.multiplier_se(m_b, ref, 1e15) == pytest.approx(mult * x / 0.1 * 1e-3, rel=1e-9)
    assert scaling.multiplier_se(ref, ref, 1e15) is None
    # through a fit of noisy points: a positive error, shown in the table as ± beside the multiplier
    rng = np.random.default_rng(0)
    C = np.geomspace(1e12, 1e15, 5)
    f_ref = scaling.fit([(c, 40 * c ** -0.1 * math.exp(rng.normal(0, 0.01))) for c in C], model="ref")
    f_m = scaling.fit([(c, 36 * c ** -0.1 * math.exp(rng.normal(0, 0.01))) for c in C], model="m")
    se = scaling.multiplier_se(f_m, f_ref, 1e13)
    assert se is not None and 0 < se < scaling.multiplier(f_m, f_ref, 1e13)
