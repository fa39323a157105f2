"""Budgets in tokens, FLOPs and tokens per parameter; size presets; named recipes (issue 33,
item 3; workbench/spec/budget.py and recipes.py).

Steps are computed by hand here: a step trains batch_size x seq_len tokens; the FLOPs of a
gated MLP stack are its weights' 6N (no sequence mixing, no family term) plus the head's.
"""
from __future__ import annotations

import math
import os

import pytest

import models
from helpers import tiny_lm_profile_text
from workbench.spec.profile import ProfileError, expand, loads

BASE = """
schema_version = 2
name = "budget-test"
{top}
[task]
name = "induction_heads"
vocab_size = 16
[sweep]
models = [{models}]
seq_lens = [64]
{grid}
[model]
{model}
[train]
batch_size = 8
{train}
"""


def specs(train="tokens = 5120", models_='"gated_mlp"', top="", grid="", model="d_model = 16\nn_layers = 2"):
    return expand(loads(BASE.format(train=train, models=models_, top=top, grid=grid, model=model)))


def one(**kw):
    (s,) = specs(**kw)
    return s


# ----------------------------------------------------------------------------- budgets
def test_a_token_budget_is_batch_times_length_tokens_a_step():
    s = one(train="tokens = 5120")               # 5120 / (8 x 64) = 10 steps exactly
    assert s.budget["steps"] == 10 and s.budget["tokens"] == 5120 and s.budget["tokens_per_step"] == 512
    assert s.train.tokens == 5120 and s.train.steps is None   # the budget asked stays in the spec
    assert one(train="tokens = 5121").budget["steps"] == 11   # rounds up: at least the budget
    assert s.to_dict()["budget"]["asked"] == {"tokens": 5120}


# gated_mlp, d = 16, 2 layers, mult 2, no biases: W1, W2 (d -> 2d) and W3 (2d -> d) = 6 d^2
# weights a layer; an RMSNorm weight (d) a layer and a final one. Head: Linear(d, 16).
D, LAYERS, V = 16, 2, 16
N_HAND = LAYERS * (6 * D * D + D) + D
FPT_HAND = 6 * (LAYERS * 6 * D * D) + 6 * D * V     # 6N of the matrices + the head's 6 d V


def test_the_hand_counts_are_the_registry_counts():
    c = models.flops("gated_mlp", 64, d_model=D, n_layers=LAYERS)
    assert c.params.non_embedding == N_HAND and c.extra == 0


def test_a_flop_budget_uses_the_composed_model_flops_per_token():
    s = one(train=f"flops = {float(FPT_HAND * 512 * 7)}")
    assert s.budget["flops_per_token"] == FPT_HAND
    assert s.budget["steps"] == 7
    assert one(train=f"flops = {float(FPT_HAND * 512 * 7 + 1)}").budget["steps"] == 8


def test_tokens_per_parameter_counts_non_embedding_parameters():
    s = one(train="tokens_per_param = 20.0")
    assert s.budget["params_non_embedding"] == N_HAND
    assert s.budget["steps"] == math.ceil(20 * N_HAND / 512)   # 20 x 3,104 / 512 -> 122


@pytest.mark.parametrize("train,got", [
    ("steps = 5\ntokens = 100", "got train.steps, train.tokens"),
    ("epochs = 1\nflops = 1e12", "got train.epochs, train.flops"),
    ("tokens = 100\ntokens_per_param = 20.0", "got train.tokens, train.tokens_per_param"),
    ("lr = 1e-3", "got none"),
])
def test_exactly_one_budget(train, got):
    with pytest.raises(ProfileError) as e:
        specs(train=train)
    msg = str(e.value)
    assert "exactly one of train.epochs or train.steps" in msg and "train.tokens_per_param" in msg and got in msg


def test_a_warmup_longer_than_the_budget_is_refused():
    with pytest.raises(ProfileError, match="warmup_steps = 20 is longer than the whole run") as e:
        specs(train="tokens = 5120\nwarmup_steps = 20")
    assert "train.tokens (line " in str(e.value)   # a problem of the profile, at its line


# ----------------------------------------------------------------------------- recipes
def test_a_profile_key_overrides_the_recipes():
    s = one(top='recipe = "gpt3"', models_='"transformer"', train="tokens = 5120\nweight_decay = 0.0",
            model='d_model = 16\n[model.options.transformer]\npos = "rope"')
    assert s.train.weight_decay == 0.0 and s.model_options["pos"] == "rope"     # written: kept
    assert s.train.betas == (0.9, 0.95) and s.train.min_lr_ratio == 0.1         # the recipe's
    assert s.model_options["norm"] == "layer"
    keys = s.recipe["keys"]
    assert "train.weight_decay" not in keys and "model.options.transformer.pos" not in keys
    # a grid value is written too
    a, b = specs(top='recipe = "gpt3"', models_='"transformer"', grid='[sweep.grid]\n"train.weight_decay" = [0.0, 0.05]')
    assert (a.train.weight_decay, b.train.weight_decay) == (0.0, 0.05)


def test_the_recipe_is_recorded_in_the_run_spec():
    t, m = specs(top='recipe = "gpt3"', models_='"transformer", {name = "mamba", recipe = "mamba"}')
    d = t.to_dict()
    assert d["recipe"]["name"] == "gpt3" and d["fields"]["recipe"] == "gpt3"
    assert d["recipe"]["keys"]["train.betas"] == [0.9, 0.95]
    assert d["recipe"]["keys"]["model.options.transformer.pos"] == "learned"
    assert d["train"]["weight_decay"] == 0.1 and d["train"]["grad_clip"] == 1.0
    # a sweep entry's own recipe wins over the profile's
    dm = m.to_dict()
    assert dm["recipe"]["name"] == "mamba" and dm["model_options"]["bias"] is False
    assert dm["model_options"]["norm"] == "rms"
    # without a size the lr is the profile's; min lr 1e-5 as a ratio of it
    assert dm["train"]["lr"] == 1e-3 and dm["train"]["min_lr_ratio"] == pytest.approx(1e-2)


def test_without_a_recipe_or_budget_the_spec_has_no_new_keys():
    d = one(train="steps = 5").to_dict()
    assert not {"budget", "recipe", "size"} & set(d)
    assert not {"tokens", "flops", "tokens_per_param"} & set(d["train"])


# ----------------------------------------------------------------------------- sizes
def test_size_presets_give_width_depth_and_lr_and_mamba_twice_the_layers():
    t, m = specs(models_='"transformer", "mamba"', model='size = "125m"', train="steps = 5")
    assert (t.d_model, t.n_layers, t.train.lr) == (768, 12, 6e-4)
    assert (m.d_model, m.n_layers) == (768, 24)        # one Mamba block = attention + MLP
    assert t.fields["size"] == "125m"
    # the recipe's 5x GPT-3's lr; written width wins
    (p,) = specs(models_='{name = "transformer", d_model = 32}', top='recipe = "transformer++"',
                 model='size = "350m"', train="steps = 5")
    assert (p.d_model, p.n_layers, p.train.lr) == (32, 24, 1.5e-3)
    assert p.model_options == {"pos": "rope", "norm": "rms"}


def test_a_size_grid_is_refused_where_a_model_sets_its_own_size():
    with pytest.raises(ProfileError, match="sets its own size"):
        specs(models_='{name = "mamba", size = "tiny-1m"}', train="steps = 5", model="",
              grid='[sweep.grid]\n"model.size" = ["tiny-1m", "tiny-3m"]')


def test_size_is_a_grid_axis():
    out = specs(models_='"mamba"', grid='[sweep.grid]\n"model.size" = ["tiny-1m", "tiny-3m", "tiny-10m"]',
                train="steps = 5", model="")
    assert [(s.d_model, s.n_layers, s.size) for s in out] == [(128, 8, "tiny-1m"), (192, 12, "tiny-3m"),
                                                               (320, 16, "tiny-10m")]


# GPT-3's sizes (Brown et al. 2020, Table 2.1) count its 50,257-token embedding; the Mamba
# paper's Mamba sizes (130M ... 1.4B) the GPT-NeoX tokenizer's 50,280 rows.
@pytest.mark.parametrize("size,gpt3,mamba", [("125m", 125e6, 130e6), ("350m", 350e6, 370e6),
                                             ("760m", 760e6, 790e6), ("1.3b", 1.3e9, 1.4e9)])
def test_parameter_counts_are_within_5_percent_of_nominal(size, gpt3, mamba):
    from workbench.spec.recipes import SIZES

    s = SIZES[size]
    t = models.flops("transformer", 2048, d_model=s.d_model, n_layers=s.n_layers).params.non_embedding
    m = models.flops("mamba", 2048, d_model=s.d_model, n_layers=2 * s.n_layers).params.non_embedding
    assert abs(t + 50257 * s.d_model - gpt3) / gpt3 < 0.05
    assert abs(m + 50280 * s.d_model - mamba) / mamba < 0.05


# ----------------------------------------------------------------------------- a real run


def test_a_token_budget_trains_exactly_those_tokens_through_the_worker(tmp_path, monkeypatch):
    from workbench.store import Store
    from workbench.train import worker

    monkeypatch.setenv("SSM_WORKBENCH_DATA", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(20):
        (corpus / f"d{i}.txt").write_text(f"document {i}: " + "the quick brown fox " * (i + 3), "utf-8")
    (s,) = expand(loads(tiny_lm_profile_text(corpus, "tokens-run", schema_version=2, head='recipe = "mamba"',
                                             models=["lstm"], seq_len=16, num_test_examples=4, steps=None,
                                             tokens=320, eval_every=100)))
    assert s.budget["steps"] == 5                       # 320 / (4 x 16)
    store = Store(tmp_path / "st")
    (rid,) = store.add_runs([s.to_dict()])
    store.mark_started(rid, os.getpid(), "cpu", "cpu0")
    worker.run(str(store.root), rid)
    run = store.get(rid)
    assert run.state == "finished", run.error
    summary = store.results([rid])[rid][""]
    assert summary["tokens_trained"] == 320 and summary["steps"] == 5
    info = run.info
    assert info["flops_per_token"] == pytest.approx(s.budget["flops_per_token"])   # the run's own count
    assert run.spec["budget"]["asked"] == {"tokens": 320} and run.spec["recipe"]["name"] == "mamba"


def test_dry_run_lines_show_steps_tokens_and_flops():
    from workbench.cli.run import _budget_lines

    out = specs(models_='"gated_mlp"', train=f"flops = {float(FPT_HAND * 512 * 7)}")
    (line,) = _budget_lines(out + out)           # one line per distinct run
    assert f"flops {FPT_HAND * 512 * 7:.4g} -> 7 steps x 512 = 3,584 tokens" in line
    assert f"{FPT_HAND * 512 * 7:.3g} FLOPs" in line
    (line,) = _budget_lines(specs(models_='"gated_mlp"', train="steps = 5"))   # steps: FLOPs too
    assert f"steps 5 x 512 = 2,560 tokens, {FPT_HAND:.3g} FLOPs/token, {FPT_HAND * 2560:.3g} FLOPs" in line


def test_a_saved_profile_keeps_its_recipe_and_size_in_force():
    from workbench.spec.profile import dumps

    text = BASE.format(top='recipe = "transformer++"', models='"transformer", "mamba"', grid="",
                       model='size = "tiny-1m"', train="tokens = 5120")
    before = [s.to_dict() for s in expand(loads(text))]
    again = dumps(loads(text))
    assert "lr" not in again and "d_model" not in again     # defaults are not written back
    assert [s.to_dict() for s in expand(loads(again))] == before


def test_a_budget_given_with_set_replaces_the_files():
    text = BASE.format(top="", models='"gated_mlp"', grid="", model="d_model = 16\nn_layers = 2", train="steps = 5")
    (s,) = expand(loads(text, overrides=["train.tokens=5120"]))
    assert s.train.steps is None and s.budget["steps"] == 10


def test_the_layers_that_are_not_doubled_are_models_computes():
    from models.compute import TABLE_MLP_ENTRIES
    from workbench.spec.recipes import MIXER_AND_MLP, doubles_depth

    assert MIXER_AND_MLP == TABLE_MLP_ENTRIES
    assert doubles_depth("mamba2", {}) and not doubles_depth("mamba2", {"channel_mixer": "swiglu"})
