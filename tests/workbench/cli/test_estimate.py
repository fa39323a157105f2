"""The resource estimate before launch (workbench/spec/estimate.py): `profile check`,
`run`, `run --dry-run` and the sweep form refuse runs that cannot fit, with the numbers
and the limit; --force overrides; and the method's parts (the measured comparison is `ssm-workbench bench --estimate`)."""
from __future__ import annotations

import contextlib
import io
import json
from types import SimpleNamespace

import pytest
import torch

from workbench.cli import bench
from workbench.spec import cost_probe, estimate


PROFILE = """
schema_version = 1
name = "{name}"
[task]
name = "induction_heads"
vocab_size = 16
[sweep]
models = ["{model}"]
seq_lens = [{L}]
[model]
d_model = {d}
n_layers = {n}
[train]
steps = 10
batch_size = {B}
{extra}
"""


def write(tmp_path, name="big", model="transformer", L=200000, d=256, n=4, B=64, extra=""):
    # a Transformer at L = 200,000, batch 64 (issue 19, finding 7): d_model 256 and 4 layers
    # put it near a TiB, beyond any machine the tests run on (CPU RAM or an 80 GB GPU)
    p = tmp_path / f"{name}.toml"
    p.write_text(PROFILE.format(name=name, model=model, L=L, d=d, n=n, B=B, extra=extra))
    return p


@pytest.fixture(autouse=True)
def probe_cache(cache_env):
    """The estimate's probe cache in a folder of this test session (not the home folder),
    shared by this module's tests: a probe (seconds on a loaded machine) is made once."""


def cli(tmp_path, *args):
    """The command in this process (as `ssm-workbench --store ST ...`; no interpreter and
    torch import per call): its exit status and what it printed."""
    from workbench import cli as workbench_cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = workbench_cli.main(["--store", str(tmp_path / "store"), *args])
    return SimpleNamespace(returncode=rc, stdout=out.getvalue(), stderr=err.getvalue())


def test_a_run_that_cannot_fit_is_refused_with_its_numbers(tmp_path):
    prof = write(tmp_path)
    r = cli(tmp_path, "profile", "check", str(prof))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "1 run(s) cannot fit" in r.stderr
    assert "transformer on induction_heads L=200000 seed=0: estimated peak" in r.stderr
    assert "activations" in r.stderr and "exceeds the limit" in r.stderr
    assert "transformer" in r.stdout and "3.16M" in r.stdout  # the table: params, peak, fits
    # `run` refuses the same before anything is queued: no store is even created
    r = cli(tmp_path, "run", str(prof))
    assert r.returncode == 2 and "cannot fit" in r.stderr, r.stdout + r.stderr
    assert not (tmp_path / "store").exists()
    # --force: checked, reported, not refused (not trained: only the check runs here)
    r = cli(tmp_path, "profile", "check", "--force", str(prof))
    assert r.returncode == 0 and "going on because of --force" in r.stderr, r.stderr


def test_a_billion_tokens_is_refused(tmp_path):
    prof = write(tmp_path, name="huge", model="mamba", L=1_000_000_000, d=64, n=2, B=8)
    r = cli(tmp_path, "profile", "check", str(prof))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "L=1000000000" in r.stderr and "TiB" in r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_a_gpu_is_refused_before_queuing(tmp_path):
    prof = write(tmp_path, name="gpu", L=64, d=32, n=1, B=2, extra='device = "cuda"')
    for args in (("profile", "check", str(prof)), ("run", str(prof)), ("run", "--force", str(prof))):
        r = cli(tmp_path, *args)
        assert r.returncode == 2 and "no GPU here" in r.stderr, (args, r.stdout, r.stderr)
    assert not (tmp_path / "store").exists()


def test_dry_run_lists_runs_and_touches_no_store(tmp_path):
    prof = tmp_path / "small.toml"
    text = PROFILE.format(name="small", model="transformer", L="32, 64", d=32, n=1, B=4, extra="")
    prof.write_text(text.replace('models = ["transformer"]', 'models = ["transformer", "lstm"]\nseeds = [0, 1]'))
    r = cli(tmp_path, "run", "--dry-run", "--format", "json", str(prof))
    assert r.returncode == 0, r.stderr
    runs = json.loads(r.stdout)
    assert len(runs) == 8
    assert {(x["model"], x["seq_len"], x["seed"]) for x in runs} == {
        (m, L, s) for m in ("transformer", "lstm") for L in (32, 64) for s in (0, 1)}
    for x in runs:
        assert x["task"] == "induction_heads" and x["params"] > 0 and x["est_peak_mb"] > 0
    r = cli(tmp_path, "run", "--dry-run", str(prof))
    assert r.returncode == 0 and "8 run(s) would be launched" in r.stdout, r.stdout + r.stderr
    assert not (tmp_path / "store").exists()
    # a run that cannot fit: listed, and the dry run says it would be refused
    r = cli(tmp_path, "run", "--dry-run", "--format", "json", str(write(tmp_path)))
    assert r.returncode == 2 and json.loads(r.stdout)[0]["fits"] is False


async def test_the_sweep_form_shows_the_estimate_and_refuses(tmp_path, monkeypatch):
    from test_tui import SIZE, FakeScheduler, make_app, settle, type_into
    from test_tui_sweep_form import open_form, text
    from textual.widgets import Static

    from workbench.store import Store

    sched = FakeScheduler()
    app = make_app(Store(tmp_path / "store"), tmp_path, sched)
    async with app.run_test(size=SIZE) as pilot:
        form, picker = await open_form(pilot)
        picker.set_picked(["transformer"])
        await type_into(pilot, "#seq_lens", "200000")
        await type_into(pilot, "#batch_size", "64")
        await type_into(pilot, "#d_model", "256")
        await pilot.press("ctrl+r")
        await settle(pilot)
        status = text(form.query_one("#form-status", Static))
        assert "cannot launch" in status and "L=200000" in status and "exceeds the limit" in status
        assert "largest est. peak" in text(form.query_one("#run-count", Static))
        assert sched.submitted == []
        await type_into(pilot, "#seq_lens", "40")  # a small run goes
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert len(sched.submitted) == 1


# --------------------------------------------------------------------------- the method
# How close the estimate comes to a measurement depends on the machine and its load (RSS
# noise only adds: one model measured 107 MiB against 52 estimated in a full suite run and
# half that alone), so that comparison is a benchmark: `ssm-workbench bench --estimate`
# prints it, docs/RESULTS.md keeps it. The tests below check what is deterministic: the
# fit, what a forward keeps, how the parts add up, and how they grow.


def test_the_fit_goes_through_its_probe_points_and_never_shrinks():
    lens = cost_probe.PROBE_LENS
    quad = cost_probe._Fit.through([3 + 2 * L + 0.5 * L * L for L in lens])
    assert (quad.a, quad.b, quad.c) == pytest.approx((3, 2, 0.5))
    assert quad(1024) == pytest.approx(3 + 2 * 1024 + 0.5 * 1024 ** 2)
    line = cost_probe._Fit.through([100 + 7 * L for L in lens])
    assert line.c == 0 and line(10 ** 6) == pytest.approx(100 + 7 * 10 ** 6)
    # a probe that shrinks with L (rounding, a cache) is not extrapolated below zero
    falling = cost_probe._Fit.through([1000 - L for L in lens])
    assert falling.b == 0 and falling.c == 0 and falling(10 ** 6) >= 0
    mid = line.mix(quad, 0.5)  # halfway between two depths
    assert mid(64) == pytest.approx((line(64) + quad(64)) / 2)


def test_saved_bytes_counts_each_kept_storage_once_and_no_parameters():
    x = torch.randn(3, 5, 8)
    one = 3 * 5 * 8 * 4  # bytes of x, and of the layer's output
    # backward keeps x (for the weight's gradient) and y (pow's input); not the weight
    assert cost_probe.saved_bytes(torch.nn.Linear(8, 8, bias=False), x, None) == (2 * one, one)
    # tanh keeps its output and pow keeps the same tensor: one storage, counted once
    net = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False), torch.nn.Tanh())
    assert cost_probe.saved_bytes(net, x, None) == (2 * one, one)


def test_the_disk_cache_is_dropped_when_the_probing_code_changes(tmp_path, monkeypatch):
    """Probes on disk are stamped by the code that decides them: the probing module itself
    and the model's composition among it; a change to any of those files starts afresh."""
    from pathlib import Path

    import workbench.train.compose as compose

    sources = cost_probe._probe_sources()
    assert Path(cost_probe.__file__) in sources and Path(compose.__file__) in sources
    code = tmp_path / "code.py"
    code.write_text("x = 1\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(cost_probe, "_probe_sources", lambda: [code])
    monkeypatch.setattr(cost_probe, "_DISK", None)
    cost_probe._code_stamp.cache_clear()
    try:
        cost_probe._save_disk_cache({"key": [1]})
        assert cost_probe._disk_cache() == {"key": [1]}  # the same code: the probe is kept
        code.write_text("x = 2\n")
        cost_probe._code_stamp.cache_clear()
        monkeypatch.setattr(cost_probe, "_DISK", None)  # as a new command would read it
        assert cost_probe._disk_cache() == {}
    finally:
        cost_probe._code_stamp.cache_clear()  # the real sources' stamp for later tests


@pytest.mark.parametrize("model", ["transformer", "mamba", "lstm", "gated_mlp"])
def test_bench_estimate_is_its_parts_and_grows_with_batch_and_length(model):
    """At a probe length the fits are exact, so `bench_estimate` is gradients + what the
    forward keeps + the transient term, computed here from the probe itself."""
    import models

    d, n, L = 16, 1, cost_probe.PROBE_LENS[-1]
    torch.manual_seed(0)
    net = models.build(model, d_model=d, n_layers=n)
    grads = 4 * sum(p.numel() for p in net.parameters() if p.requires_grad)  # float32
    kept1, _ = cost_probe.saved_bytes(net, torch.randn(1, L, d), None)
    kept2, largest2 = cost_probe.saved_bytes(net, torch.randn(2, L, d), None)
    per_sample = kept2 - kept1

    def est(B, length=L):
        return estimate.bench_estimate(model, {}, d, n, B, length)

    assert est(1) == pytest.approx(grads + kept1 + estimate.TRANSIENT_FACTOR * largest2 / 2, rel=1e-6)
    # each sequence of the batch adds its activations and its share of the transient
    step = per_sample + estimate.TRANSIENT_FACTOR * largest2 / 2
    assert est(4) - est(3) == pytest.approx(step, rel=1e-6)
    assert est(9) - est(5) == pytest.approx(4 * step, rel=1e-6)
    # longer sequences never cost less, and 4x the length costs more
    sizes = [est(2, length) for length in (256, 512, 1024, 4096)]
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]


def test_a_runs_estimate_adds_up_and_grows_with_batch_and_length(tmp_path, monkeypatch):
    """estimate_run's parts: weights, gradients and AdamW's two moments of the trainable
    parameters, the CPU runtime, the data; more batch or length never costs less."""
    # probe afresh (no cached probe from an earlier test)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(cost_probe, "_PROBES", {})
    import models
    from workbench.spec import profile as P
    from workbench.spec.expand import expand
    from workbench.train.compose import build_model

    limit = estimate.Limit(device="cpu", bytes=None, what="")

    def run(L, B):
        text = PROFILE.format(name="e", model="gated_mlp", L=L, d=16, n=1, B=B, extra="")
        (spec,) = expand(P.loads(text, "e.toml"))
        return spec, estimate.estimate_run(spec, limit)

    spec, e = run(64, 4)
    assert e.error is None and e.fits, e.error
    task = cost_probe.run_task(spec)
    torch.manual_seed(0)
    params = models.param_count(build_model(task, "gated_mlp", d_model=16, n_layers=1))
    assert e.params == params  # the probe counts the composed model's parameters exactly
    parts = e.parts
    assert parts["runtime"] == estimate.CPU_RUNTIME_BYTES
    assert parts["grads"] == 4 * params and parts["optimizer"] == 2 * parts["grads"]
    assert parts["weights"] >= parts["grads"]  # parameters + buffers
    peaks = [run(L, B)[1].peak for L, B in ((64, 4), (64, 16), (256, 16), (1024, 16))]
    assert peaks == sorted(peaks) and peaks[-1] > peaks[0]


def test_bench_estimate_mode_prints_the_estimate_beside_the_measurement(capsys):
    """`bench --estimate` (the benchmark the tests leave to a person): one row per model
    and length, the estimate from bench_estimate, the measured peak from a fresh process,
    and their ratio; the speed table is not measured."""
    rc = bench.main(["--estimate", "--models", "gated_mlp", "--seq-lens", "64", "--batch", "2",
                     "--d-model", "8", "--n-layers", "1", "--estimate-tries", "1", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["runs"] == []
    (row,) = doc["estimate"]
    assert set(bench.ESTIMATE_COLUMNS) <= set(row), row
    assert (row["family"], row["model"], row["seq_len"], row["batch"]) == ("mlp", "gated_mlp", 64, 2)
    expected = estimate.bench_estimate("gated_mlp", {}, 8, 1, 2, 64) / estimate.MiB
    assert row["est_mib"] == round(expected, 1)
    assert row["measured_mib"] > 0  # a training step allocates something
    assert row["ratio"] == pytest.approx(expected / row["measured_mib"], abs=0.006)  # rounded to 0.01
    header = bench.format_table([row], bench.ESTIMATE_COLUMNS).splitlines()[0]
    assert [c.strip() for c in header.strip("|").split("|")] == bench.ESTIMATE_COLUMNS
