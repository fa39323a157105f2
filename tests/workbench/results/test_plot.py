"""`ssm-workbench plot`: what the figures draw (means, bands, axes, labels, colours), the
files written, and the errors and exit codes for bad input."""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from test_store import spec
from workbench.results import plot, plot_cli
from workbench.store import Store

MODELS = ("lstm", "s6")
SEEDS = (0, 1, 2)
STEPS = (10, 20, 30)


def acc(model, L, seed, step):
    """Eval accuracy at a step: grows with steps, differs by model, length and seed."""
    return round(0.2 + 0.02 * step * (1 if model == "lstm" else 0.5) - 0.001 * L + 0.03 * seed, 6)


def loss(step, seed):
    """Train loss: down four decades over the steps; seeds 1x, 1.5x, 2x (mean - std > 0)."""
    return 2.0 * 10 ** (-(step - STEPS[0]) / 5) * (1 + 0.5 * seed)


def step_ms(model, L, seed):
    return (1.0 if model == "lstm" else 3.0) * L * (1 + 0.1 * seed)


def set_acc(model, L, seed, test_len):
    return max(0.0, 1.0 - 0.002 * test_len * (1 if model == "lstm" else 2) - 0.05 * seed)


def add_run(store, profile, model, L, seed, state="finished", task="induction_heads",
            eval_lens=(16, 32, 64, 128), dists=(8, 30)):
    fields = {"model": model, "task": task, "seq_len": L, "seed": seed}
    (rid,) = store.add_runs([spec(profile=profile, model=model, label=model, task=task,
                                  seq_len=L, seed=seed, fields=fields)])
    if state == "pending":
        return rid
    store.mark_started(rid, os.getpid(), "cpu", "cpu0")
    store.add_metrics(rid, [(s, s / 10, "eval", "accuracy", acc(model, L, seed, s)) for s in STEPS])
    store.add_metrics(rid, [(s, s / 10, "train", "loss", loss(s, seed)) for s in STEPS])
    store.set_results(rid, {"accuracy": acc(model, L, seed, STEPS[-1]), "step_time_ms": step_ms(model, L, seed),
                            "peak_mem_mb": 300.0 + L})
    for n in eval_lens:
        store.set_results(rid, {"accuracy": set_acc(model, L, seed, n), "eval_sequences": 8}, f"len={n}")
    for d in dists:
        store.set_results(rid, {"accuracy": set_acc(model, L, seed, 2 * d)}, f"dist={d}")
    if state != "running":
        store.finish(rid, state)
    return rid


@pytest.fixture()
def store(tmp_path):
    """Profile 'sweep': lstm and s6 at L=16 and 32, 3 seeds, plus one unfinished run;
    profile 'one-len': lstm and s6 at L=16 only, 3 seeds."""
    s = Store(tmp_path / "store")
    for L in (16, 32):
        for m in MODELS:
            for seed in SEEDS:
                add_run(s, "sweep", m, L, seed)
    add_run(s, "sweep", "lstm", 64, 0, state="running")
    for m in MODELS:
        for seed in SEEDS:
            add_run(s, "one-len", m, 16, seed)
    return s


def line(ax, label):
    (found,) = [ln for ln in ax.get_lines() if ln.get_label() == label]
    return found


def errorbar(ax, label):
    (found,) = [c for c in ax.containers if c.get_label() == label]
    return found


def band_extent(ax, color):
    """{x: (min y, max y)} of the filled band drawn in ``color``."""
    from matplotlib.colors import to_hex

    (poly,) = [c for c in ax.collections if to_hex(c.get_facecolor()[0], keep_alpha=False) == color]
    out = {}
    for x, y in poly.get_paths()[0].vertices:
        lo, hi = out.get(round(x, 9), (y, y))
        out[round(x, 9)] = (min(lo, y), max(hi, y))
    return out


# --------------------------------------------------------------------------- curves
def test_curves_draw_the_mean_over_seeds_with_a_std_band(store):
    runs = store.runs(profile="one-len")
    fig = plot.curves_figure(store, runs, ("eval", "accuracy"))
    (ax,) = fig.axes
    colors = plot.model_colors(MODELS)
    for m in MODELS:
        ln = line(ax, f"{m} (3 seeds)")
        per_step = [[acc(m, 16, seed, s) for seed in SEEDS] for s in STEPS]
        assert list(ln.get_xdata()) == list(STEPS)
        assert list(ln.get_ydata()) == pytest.approx([statistics.fmean(v) for v in per_step])
        assert ln.get_color() == colors[m]
        band = band_extent(ax, colors[m])
        for s, v in zip(STEPS, per_step):
            mean, sd = statistics.fmean(v), statistics.stdev(v)
            assert band[s] == pytest.approx((mean - sd, mean + sd))
    assert ax.get_xlabel() == "optimizer step"
    assert ax.get_ylabel() == "eval accuracy (fraction of target tokens)"
    assert ax.get_ylim() == (-0.02, 1.02)
    title = ax.get_title()
    assert "one-len" in title and "induction_heads" in title and "L=16" in title
    assert "eval accuracy by optimizer step; mean ± std over 3 seeds" in title
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["lstm (3 seeds)", "s6 (3 seeds)"]


def test_curves_minmax_band_none_and_one_line_per_run(store):
    runs = store.runs(profile="one-len")
    ax = plot.curves_figure(store, runs, ("eval", "accuracy"), band="minmax").axes[0]
    band = band_extent(ax, plot.model_colors(MODELS)["s6"])
    vals = [acc("s6", 16, seed, 20) for seed in SEEDS]
    assert band[20] == pytest.approx((min(vals), max(vals)))
    assert "mean and min–max over 3 seeds" in ax.get_title()

    ax = plot.curves_figure(store, runs, ("eval", "accuracy"), band="none").axes[0]
    assert not ax.collections and "mean over 3 seeds" in ax.get_title()

    ax = plot.curves_figure(store, runs, ("eval", "accuracy"), by_seed=False).axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert set(lines) == {f"{m} seed {s}" for m in MODELS for s in SEEDS}
    assert list(lines["s6 seed 2"].get_ydata()) == [acc("s6", 16, 2, s) for s in STEPS]
    # one colour per model, told apart by dash pattern
    assert len({lines[f"lstm seed {s}"].get_color() for s in SEEDS}) == 1
    assert len({lines[f"lstm seed {s}"].get_linestyle() for s in SEEDS}) == 3
    assert "one line per run" in ax.get_title() and not ax.collections


def test_curves_of_a_loss_spanning_decades_use_a_log_axis(store):
    runs = store.runs(profile="one-len")
    ax = plot.curves_figure(store, runs, ("train", "loss")).axes[0]
    assert ax.get_yscale() == "log"
    assert ax.get_ylabel() == "train loss (nats per target token)"
    # the seeds' losses are 1x, 2x, 3x a base: mean - std > 0, so the std band is kept
    assert "mean ± std" in ax.get_title()
    # eval accuracy stays linear
    assert plot.curves_figure(store, runs, ("eval", "accuracy")).axes[0].get_yscale() == "linear"


def test_a_std_band_below_zero_on_a_log_axis_becomes_min_max(tmp_path):
    s = Store(tmp_path)
    for seed, scale in enumerate((1.0, 1.0, 1000.0)):  # one seed far above the others
        (rid,) = s.add_runs([spec(profile="p", seed=seed)])
        s.add_metrics(rid, [(st, None, "train", "loss", scale * 1e-3 / st) for st in (1, 10, 100, 1000)])
        s.finish(rid, "finished")
    ax = plot.curves_figure(s, s.runs(), ("train", "loss")).axes[0]
    assert ax.get_yscale() == "log"
    assert "min–max" in ax.get_title() and "log axis" in ax.get_title()
    band = band_extent(ax, plot.model_colors(["lstm"])["lstm"])
    assert band[10] == pytest.approx((1e-4, 0.1))


def test_curve_errors_say_why(store):
    runs = store.runs(profile="one-len")
    with pytest.raises(ValueError, match="no runs"):
        plot.curves_figure(store, [], ("eval", "accuracy"))
    with pytest.raises(ValueError, match=r"logged eval.bogus; they logged eval.accuracy, train.loss"):
        plot.curves_figure(store, runs, ("eval", "bogus"))
    with pytest.raises(ValueError, match="unknown x axis"):
        plot.curves_figure(store, runs, ("eval", "accuracy"), axis="bogus")
    assert plot.parse_curve_metric("loss") == [("train", "loss"), ("eval", "loss")]
    assert plot.parse_curve_metric("eval:accuracy") == [("eval", "accuracy")]
    with pytest.raises(ValueError, match="not a logged curve metric"):
        plot.parse_curve_metric("step_time_ms")


# --------------------------------------------------------------------------- vs length
def test_metric_against_length_log2_x_log_y_and_error_bars(store):
    fig = plot.vs_length_figure(store, "sweep", "step_time_ms")
    (ax,) = fig.axes
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert list(ax.get_xticks()) == [16, 32]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["16", "32"]
    assert ax.get_yscale() == "log"  # time spans orders of magnitude
    assert ax.get_xlabel() == "training sequence length (tokens)"
    assert ax.get_ylabel() == "time per training step (ms)"
    title = ax.get_title()
    assert "sweep — induction_heads, on cpu" in title
    assert "time per training step against training length; mean ± std over 3 seeds" in title
    for m in MODELS:
        c = errorbar(ax, m)
        vals = {L: [step_ms(m, L, seed) for seed in SEEDS] for L in (16, 32)}  # the running L=64 run is left out
        assert list(c.lines[0].get_xdata()) == [16, 32]
        assert list(c.lines[0].get_ydata()) == pytest.approx([statistics.fmean(v) for v in vals.values()])
        (bars,) = c.lines[2]
        for seg, v in zip(bars.get_segments(), vals.values()):
            mean, sd = statistics.fmean(v), statistics.stdev(v)
            assert seg[:, 1] == pytest.approx([mean - sd, mean + sd])
        assert c.lines[0].get_color() == plot.model_colors(MODELS)[m]


def test_accuracy_against_length_is_linear_0_to_1_and_includes_unfinished_on_request(store):
    ax = plot.vs_length_figure(store, "sweep", "accuracy").axes[0]
    assert ax.get_yscale() == "linear" and ax.get_ylim() == (-0.02, 1.02)
    assert ax.get_ylabel() == "accuracy (fraction of target tokens)"
    ax = plot.vs_length_figure(store, "sweep", "accuracy", states=("finished", "running")).axes[0]
    c = errorbar(ax, "lstm")
    assert list(c.lines[0].get_xdata()) == [16, 32, 64]
    assert c.lines[0].get_ydata()[-1] == pytest.approx(acc("lstm", 64, 0, STEPS[-1]))
    assert "1–3 seeds" in ax.get_title()


def test_vs_length_errors(store):
    with pytest.raises(ValueError, match="every run in profile 'one-len' has sequence length 16"):
        plot.vs_length_figure(store, "one-len", "accuracy")
    with pytest.raises(ValueError, match=r"has 'bogus'; metrics there: accuracy, peak_mem_mb, step_time_ms"):
        plot.vs_length_figure(store, "sweep", "bogus")
    with pytest.raises(ValueError, match="no finished runs with results in profile 'nope'"):
        plot.vs_length_figure(store, "nope", "accuracy")


# --------------------------------------------------------------------------- eval sets
def test_accuracy_against_test_length_with_the_training_length_marked(store):
    ax = plot.eval_sets_figure(store, "one-len", "accuracy", "len").axes[0]
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert list(ax.get_xticks()) == [16, 32, 64, 128]
    assert ax.get_xlabel() == "test sequence length (tokens)"
    marker = line(ax, "training length L=16")
    assert list(marker.get_xdata()) == [16, 16] and marker.get_linestyle() == ":"
    for m in MODELS:
        c = errorbar(ax, m)
        means = [statistics.fmean(set_acc(m, 16, seed, n) for seed in SEEDS) for n in (16, 32, 64, 128)]
        assert list(c.lines[0].get_ydata()) == pytest.approx(means)
    title = ax.get_title()
    assert "one-len — induction_heads, trained at L=16" in title and "accuracy against test length" in title
    # models first in the legend, the reference line last
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["lstm", "s6", "training length L=16"]


def test_distance_sets_and_no_marker_when_training_lengths_differ(store):
    ax = plot.eval_sets_figure(store, "sweep", "accuracy", "dist").axes[0]
    assert list(ax.get_xticks()) == [8, 30]
    assert ax.get_xlabel() == "distance from first trigger to end (tokens)"
    assert not [ln for ln in ax.get_lines() if ln.get_label().startswith("training length")]
    # runs trained at L=16 and L=32 are never pooled as seeds (issue 41): a line each
    assert "lines apart by seq_len" in ax.get_title()
    for L in (16, 32):
        c = errorbar(ax, f"s6 L={L}")
        v = [set_acc("s6", L, seed, 16) for seed in SEEDS]
        assert c.lines[0].get_ydata()[0] == pytest.approx(statistics.fmean(v))
    with pytest.raises(ValueError, match="no eval sets named pos=N in profile 'sweep'; eval sets there: dist=30"):
        plot.eval_sets_figure(store, "sweep", "accuracy", "pos")


def test_a_model_keeps_its_colour_in_every_figure_of_a_profile(store):
    colors = plot.profile_colors(store, "sweep")
    assert colors == plot.model_colors(MODELS)
    s6_runs = [r for r in store.runs(profile="sweep", states=["finished"]) if r.label == "s6"]
    curves_ax = plot.curves_figure(store, s6_runs, ("eval", "accuracy")).axes[0]
    length_ax = plot.vs_length_figure(store, "sweep", "peak_mem_mb").axes[0]
    sets_ax = plot.eval_sets_figure(store, "sweep", "accuracy", "len").axes[0]
    # s6 is the profile's second model even in a figure of s6's runs alone
    assert {ln.get_color() for ln in curves_ax.get_lines()} == {colors["s6"]}
    assert errorbar(length_ax, "s6").lines[0].get_color() == colors["s6"]
    # (its lines at two training lengths, drawn apart, keep the model's colour)
    assert errorbar(sets_ax, "s6 L=16").lines[0].get_color() == colors["s6"]
    assert errorbar(sets_ax, "s6 L=32").lines[0].get_color() == colors["s6"]
    assert colors["s6"] != colors["lstm"]


# --------------------------------------------------------------------------- files
def test_files_are_valid_png_and_svg_with_safe_names(store, tmp_path):
    out = tmp_path / "figs"
    paths = plot.plot_eval_sets(store, "one-len", out, stem="a b/c: d")
    assert [p.name for p in paths] == ["a-b-c-d.png", "a-b-c-d.svg"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert ET.parse(paths[1]).getroot().tag == "{http://www.w3.org/2000/svg}svg"
    # the same figure twice gives the same SVG (no timestamp, fixed ids): clean diffs
    first = paths[1].read_bytes()
    plot.plot_eval_sets(store, "one-len", out, stem="a b/c: d")
    assert paths[1].read_bytes() == first
    assert plot.plot_vs_length(store, "sweep", "accuracy", out)[0].name == "sweep-accuracy-vs-length.png"
    runs = store.runs(profile="sweep", states=["finished"])
    assert plot.plot_curves(store, runs, out, ("train", "loss"))[0].name == "sweep-curves-train-loss-by-step.png"


def test_plot_profile_writes_what_applies_and_says_what_it_skipped(store, tmp_path):
    paths, notes = plot.plot_profile(store, "one-len", tmp_path)
    names = sorted(p.name for p in paths if p.suffix == ".png")
    assert names == ["one-len-accuracy-vs-dist.png", "one-len-accuracy-vs-len.png",
                     "one-len-curves-eval-accuracy-by-step.png", "one-len-curves-train-loss-by-step.png"]
    assert all(p.exists() for p in paths)
    assert any(n.startswith("curves eval.loss: none of the 6 run(s) logged eval.loss") for n in notes)
    assert any(n.startswith("length: every run in profile 'one-len' has sequence length 16") for n in notes)
    paths, notes = plot.plot_profile(store, "sweep", tmp_path, kinds=["length"], run_ids=[1, 2, 3, 7, 8, 9])
    assert sorted(p.name for p in paths if p.suffix == ".png") == [
        f"sweep-runs-1-3_7-9-{m}-vs-length.png" for m in ("accuracy", "peak_mem_mb", "step_time_ms")]
    with pytest.raises(ValueError, match="no finished runs in profile 'nope'"):
        plot.plot_profile(store, "nope", tmp_path)


# --------------------------------------------------------------------------- CLI
def run_cli(store, *argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--store")
    plot_cli.add_parser(ap.add_subparsers())
    args = ap.parse_args(["--store", str(store.root), "plot", *argv])
    return args.fn(args)


def test_cli_writes_figures_and_prints_their_paths(store, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_cli(store, "sweep", "--out", str(out)) == 0
    printed = capsys.readouterr()
    lines = printed.out.split()
    # png + svg of: train loss and eval accuracy curves (no eval loss was logged), three
    # metrics against length, accuracy on the len= and dist= sets
    assert len(lines) == 2 * (2 + 3 + 2)
    assert all(os.path.exists(p) for p in lines)
    assert str(out / "sweep-step_time_ms-vs-length.svg") in lines
    assert "skipped curves eval.loss" in printed.err

    assert run_cli(store, "--runs", "1-3", "--kind", "curves", "--metric", "eval.accuracy",
                   "--x", "epoch", "--band", "minmax", "--out", str(out)) == 0
    assert capsys.readouterr().out.split() == [str(out / f"runs-1-3-curves-eval-accuracy-by-epoch.{e}")
                                               for e in ("png", "svg")]


def test_cli_default_folder(store, tmp_path, capsys, monkeypatch):
    """Without --out: the store's figures/<profile>/, as the TUI writes them, printed as a
    full path; nothing in the folder the command ran in (a checkout, issue 32)."""
    here = tmp_path / "checkout"
    here.mkdir()
    monkeypatch.chdir(here)
    assert run_cli(store, "one-len", "--kind", "eval-sets", "--metric", "accuracy") == 0
    first = capsys.readouterr().out.split()[0]
    assert first == str(store.root.absolute() / "figures" / "one-len" / "one-len-accuracy-vs-dist.png")
    assert os.path.isfile(first) and list(here.iterdir()) == []


@pytest.mark.parametrize("argv, message", [
    ((), "name a profile or --runs; profiles in the store: one-len, sweep"),
    (("nope",), "no profile 'nope' in"),
    (("sweep", "--runs", "3-1"), "the end is before the start"),
    (("sweep", "--runs", "13"), "13 (running; add --include-unfinished)"),
    (("one-len", "--runs", "1"), "1 (profile sweep)"),
    (("--runs", "99"), "99 (not in the store)"),
    (("one-len", "--kind", "length"), "skipped length: every run in profile 'one-len' has sequence length 16"),
    (("one-len", "--kind", "curves", "--metric", "bogus"), "'bogus' is not a logged curve metric"),
])
def test_cli_bad_input_exits_2_with_a_reason(store, tmp_path, capsys, argv, message):
    assert run_cli(store, *argv, "--out", str(tmp_path)) == 2
    assert message in capsys.readouterr().err


def test_importing_the_module_does_not_import_matplotlib():
    code = "import sys, workbench.results.plot; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
