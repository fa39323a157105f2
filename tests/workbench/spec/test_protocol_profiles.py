"""The shipped protocol profiles: mad-lab's MAD benchmark (profiles/mad-benchmark.toml and its
REDUCED CPU version) and Zoology's MQAR grid (profiles/mqar-grid-gpu.toml, -reduced).

The expected numbers are copied from the sources, not from the profiles, so a profile
changed away from its source fails here:
- athms/mad-lab configs/tasks/*.yml (baseline and changes of each task) and
  mad/configs.py (make_benchmark_mad_configs: lrs [1e-4, 5e-4, 1e-3] x wds [0.0, 0.1];
  MADConfig: batch 128, 200 epochs, adamw, cosine, min_lr 1e-6; benchmark.py: dim 128);
- HazyResearch/zoology zoology/experiments/paper_configs/iclr24_zoology_figure2/configs.py
  (d_model [64, 128, 256, 512], lr np.logspace(-4, -2, 4), vocab 8 192, 100 000 / 3 000
  examples, power_a 0.01, row (256, 16) with batch 256, 64 epochs, n_layers 2).
"""
from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from workbench.spec import profile as P

ROOT = Path(__file__).resolve().parents[3]
PROFILES = ROOT / "profiles"

# athms/mad-lab configs/tasks/<yml>: (baseline, changes), keyed by our task name; mad-lab's
# parameter names are the workbench's (seq_len, vocab_size, num_train_examples,
# num_tokens_to_copy, frac_noise, noise_vocab_size, multi_query, k/v_motif_size).
MAD_LAB = {
    "mad_in_context_recall": (  # in-context-recall.yml
        dict(vocab_size=16, seq_len=128, num_train_examples=12800, multi_query=True),
        dict(vocab_size=[32, 64, 128], seq_len=[256, 512, 1024],
             num_train_examples=[6400, 3200, 1600, 800])),
    "mad_fuzzy_in_context_recall": (  # fuzzy-in-context-recall.yml
        dict(vocab_size=16, seq_len=128, num_train_examples=12800, multi_query=True,
             k_motif_size=3, v_motif_size=3),
        dict(vocab_size=[32, 64, 128], seq_len=[256, 512, 1024],
             num_train_examples=[6400, 3200, 1600, 800])),
    "mad_noisy_in_context_recall": (  # noisy-in-context-recall.yml
        dict(vocab_size=32, noise_vocab_size=16, seq_len=128, num_train_examples=12800,
             multi_query=True, frac_noise=0.2),
        dict(vocab_size=[48, 80, 144], seq_len=[256, 512, 1024],
             num_train_examples=[6400, 3200, 1600, 800], frac_noise=[0.4, 0.6, 0.8])),
    "mad_selective_copying": (  # selective-copying.yml
        dict(vocab_size=16, seq_len=256, num_tokens_to_copy=16, num_train_examples=12800),
        dict(vocab_size=[32, 64, 128], seq_len=[512, 1024],
             num_train_examples=[6400, 3200, 1600, 800], num_tokens_to_copy=[32, 64, 96])),
    "mad_compression": (  # compression.yml
        dict(vocab_size=16, seq_len=32, num_train_examples=12800),
        dict(vocab_size=[32, 64, 128], seq_len=[64, 128, 256],
             num_train_examples=[6400, 3200, 1600, 800])),
    "mad_memorization": (  # memorization.yml
        dict(vocab_size=256, seq_len=32, num_train_examples=256),
        dict(vocab_size=[512, 1024, 2048, 4096, 8192])),
}
MAD_GRID = {(lr, wd) for lr in (1e-4, 5e-4, 1e-3) for wd in (0.0, 0.1)}  # mad/configs.py


def _params(s: P.RunSpec) -> dict:
    return {**s.task_params, "seq_len": s.seq_len}


def _settings(specs) -> dict[tuple[str, str], dict]:
    """(task, task_setting) -> the task parameters it trains with (one per setting)."""
    out: dict[tuple[str, str], dict] = {}
    for s in specs:
        key = (s.task, s.task_setting)
        assert out.setdefault(key, _params(s)) == _params(s), key
    return out


@pytest.fixture(scope="module")
def mad():
    p = P.load(PROFILES / "mad-benchmark.toml")
    return p, P.expand(p)


def test_mad_benchmark_expands_to_66_settings_and_6_grid_points_per_model(mad):
    p, specs = mad
    settings = _settings(specs)
    assert len(settings) == 66
    per_task = Counter(task for task, _ in settings)
    assert per_task == {t: 1 + sum(map(len, ch.values())) for t, (_, ch) in MAD_LAB.items()}
    models = sorted({s.model for s in specs})
    assert {"transformer", "mamba"} <= set(models)
    seeds = {s.seed for s in specs}
    assert len(specs) == 66 * 6 * len(models) * len(seeds)
    for model in models:
        for key in settings:
            points = [(s.grid["train.lr"], s.grid["train.weight_decay"]) for s in specs
                      if s.model == model and (s.task, s.task_setting) == key]
            assert len(points) == 6 * len(seeds)
            assert set(points) == MAD_GRID
    for s in specs:  # the grid value is what trains
        assert (s.train.lr, s.train.weight_decay) == (s.grid["train.lr"], s.grid["train.weight_decay"])


def test_mad_benchmark_baselines_and_changes_match_mad_lab(mad):
    _, specs = mad
    settings = _settings(specs)
    for task, (baseline, changes) in MAD_LAB.items():
        base = settings[(task, "baseline")]
        assert {k: base[k] for k in baseline} == baseline, task
        assert base["num_test_examples"] == 1280  # MADConfig.num_test_examples
        # each change applied alone to the baseline (make_benchmark_mad_configs)
        expected = [{**base, key: v} for key, values in changes.items() for v in values]
        got = [params for (t, name), params in settings.items() if t == task and name != "baseline"]
        assert sorted(map(repr, got)) == sorted(map(repr, expected)), task


def test_mad_benchmark_training_follows_mad_lab(mad):
    p, specs = mad
    for s in specs:
        t = s.train
        assert (t.batch_size, t.epochs, t.optimizer, t.schedule) == (128, 200, "adamw", "cosine")
        # MADConfig.min_lr = 1e-6 at its default lr 5e-4
        assert math.isclose(t.min_lr_ratio * 5e-4, 1e-6)
        assert t.early_stopping.target == 0.999 and t.early_stopping.patience == 0
        assert t.grad_clip == 0 and t.warmup_steps == 0 and t.amp is True
        assert (s.d_model, s.n_layers) == (128, 2)  # benchmark.py --dim 128, two mixers
        assert t.device != "cpu"  # a GPU profile
    opts = {s.model: s.model_options for s in specs}
    assert opts["transformer"]["n_heads"] == 16  # configs/layers/mh-attention.yml
    assert opts["mamba"]["d_state"] == 4  # configs/layers/mamba.yml


def test_mad_benchmark_reduced_is_labelled_and_keeps_the_protocol_shape():
    path = PROFILES / "mad-benchmark-reduced.toml"
    text = path.read_text()
    p = P.load(path)
    assert "REDUCED" in p.description and "REDUCED" in text
    assert "Wall time" in text and "ESTIMATED_HERE" not in text  # the measured estimate
    specs = P.expand(p)
    settings = _settings(specs)
    assert {t for t, _ in settings} == set(MAD_LAB)  # all six tasks
    models = {s.model for s in specs}
    assert len(models) == 2
    assert {(s.grid["train.lr"], s.grid["train.weight_decay"]) for s in specs} == MAD_GRID
    assert len(specs) == len(settings) * 6 * 2 * len({s.seed for s in specs})
    for s in specs:
        assert s.train.device == "cpu"


ZOO_LRS = [1e-4, 10 ** (-4 + 2 / 3), 10 ** (-4 + 4 / 3), 1e-2]  # np.logspace(-4, -2, 4)


def test_mqar_grid_gpu_is_zoology_figure2_shape():
    p = P.load(PROFILES / "mqar-grid-gpu.toml")
    specs = P.expand(p)
    models = {s.model for s in specs}
    assert {"transformer", "mamba"} <= models
    assert len(specs) == len(models) * 4 * 4  # 4 widths x 4 lrs, one row, one seed
    assert sorted({s.d_model for s in specs}) == [64, 128, 256, 512]
    lrs = sorted({s.grid["train.lr"] for s in specs})
    assert len(lrs) == 4 and all(math.isclose(a, b, rel_tol=1e-12) for a, b in zip(lrs, ZOO_LRS))
    for s in specs:
        assert s.d_model == s.grid["model.d_model"] and s.train.lr == s.grid["train.lr"]
        assert _params(s) == dict(seq_len=256, num_kv_pairs=16, vocab_size=8192, power_a=0.01,
                                  num_train_examples=100000, num_test_examples=3000)
        assert (s.n_layers, s.train.batch_size, s.train.epochs) == (2, 256, 64)
        assert (s.train.weight_decay, s.train.min_lr_ratio) == (0.1, 0.0)
        assert s.train.early_stopping.target == 0.99


def test_mqar_grid_reduced_is_labelled_and_small():
    path = PROFILES / "mqar-grid-reduced.toml"
    text = path.read_text()
    p = P.load(path)
    assert "REDUCED" in p.description and "ESTIMATED_HERE" not in text
    specs = P.expand(p)
    assert len(specs) == 2 * 2 * 2  # 2 models x 2 widths x 2 lrs
    assert sorted({s.d_model for s in specs}) == [32, 64]
    for s in specs:
        prm = _params(s)
        assert prm["vocab_size"] > prm["seq_len"] >= 4 * prm["num_kv_pairs"]  # zoology's and ours
        assert s.train.device == "cpu"


NEW = ["mad-benchmark", "mad-benchmark-reduced", "mqar-grid-gpu", "mqar-grid-reduced"]


@pytest.mark.slow  # minutes on a cold probe cache: the estimate probes every model on every task
def test_profile_check_passes():
    """`profile check --force` on all four at once (one start-up): on a CPU machine a GPU
    profile may exceed the RAM estimate (--force lets only that through); anything else
    check refuses (a bad value, a task or model that does not build) fails here. (What the
    schema and registry checks say is checked in-process by the tests above, in the fast set.)"""
    r = subprocess.run([sys.executable, "-m", "workbench", "profile", "check", "--force",
                        *(str(PROFILES / f"{n}.toml") for n in NEW)],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for n in NEW:
        assert f"profiles/{n}.toml: profile '{n}'" in r.stdout, n
