"""Models matched by size (issue 35, item 3; workbench/spec/match.py): [sweep.match]
params / state_size solves each model's width (or d_state, or expand_v) to within 2%.

Every solution is checked by building the model again at the solved values and counting
(non-embedding parameters on the meta device, or ``models.state_size``), not by trusting
the solver's own number.
"""
from __future__ import annotations

import pytest
import torch

import models
from models.compute import param_counts
from workbench.spec import match
from workbench.spec.profile import ProfileError, expand, loads

N_LAYERS = 2
SLOW = {"s4_dplr", "none_s4_dplr", "h3_s4_dplr", "mamba_s4_dplr"}  # DPLR init: CPU build, seconds each


def _build(name: str, solved: dict, d_model: int = 64):
    opts = dict(solved)
    d = opts.pop("d_model", d_model)
    try:
        with torch.device("meta"):
            return models.build(name, d_model=d, n_layers=N_LAYERS, **opts)
    except RuntimeError:
        return models.build(name, d_model=d, n_layers=N_LAYERS, **opts)


def _params(name: str):
    return [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in models.names()]


def _solve_or_skip(name, target, value):
    try:
        return match.solve(name, target, value, d_model=64, n_layers=N_LAYERS)
    except match.MatchError as e:
        if "cannot be matched" in str(e):  # the family's reason (pretrained, no state, ...)
            pytest.skip(str(e))
        raise


@pytest.mark.parametrize("name", _params("params"))
@pytest.mark.parametrize("value", [1_000_000, pytest.param(300_000, marks=pytest.mark.slow)])
def test_every_model_meets_a_param_target_within_2_percent(name, value):
    s = _solve_or_skip(name, "params", value)
    got = param_counts(_build(name, s.solved)).non_embedding
    assert got == s.got
    assert abs(got / value - 1) <= 0.02 + 1e-9, (name, s.solved, got)


@pytest.mark.parametrize("name", ["mamba", "mamba2", "mamba3", "s4d", "s6", "h3", "deltanet", "gated_deltanet",
                                  "gla", "retnet", "rwkv7", "kda", "lstm", "sliding_window_attention"])
def test_recurrent_models_meet_a_state_size_target(name):
    s = match.solve(name, "state_size", 20_000, d_model=64, n_layers=N_LAYERS)
    got = models.state_size(_build(name, s.solved))
    assert got == s.got and abs(got / 20_000 - 1) <= 0.02 + 1e-9, (name, s.solved, got)
    if models.registry.entry(name).family == "ssm":   # the state dimension, at the width given
        assert set(s.solved) == {"d_state"}
    else:
        assert "d_model" in s.solved


@pytest.mark.parametrize("name", ["transformer", "mamba", "mamba2", "deltanet", "hyena", "lstm", "s4"])
def test_a_smaller_param_target(name):   # (every model at 300k: the slow case above)
    s = match.solve(name, "params", 300_000, d_model=64, n_layers=N_LAYERS)
    got = param_counts(_build(name, s.solved)).non_embedding
    assert got == s.got and abs(got / 300_000 - 1) <= 0.02 + 1e-9, (name, s.solved, got)


def test_the_fine_knob_is_used_where_the_width_steps_are_too_coarse():
    # gated_deltaproduct's valid widths near 1M are 240 (-3.3%) and 251 (+5.6%)
    s = match.solve("gated_deltaproduct", "params", 1_000_000, d_model=64, n_layers=N_LAYERS)
    assert set(s.solved) == {"d_model", "expand_v"}
    assert s.solved["expand_v"] * s.solved["d_model"] % 4 == pytest.approx(0, abs=1e-6)


def test_impossible_targets_are_refused_with_the_reason():
    with pytest.raises(match.MatchError, match=r"cannot meet params 10: even the smallest d_model = 4 that builds gives 464"):
        match.solve("transformer", "params", 10, d_model=64, n_layers=N_LAYERS)
    with pytest.raises(match.MatchError, match=r"out of reach: d_model up to 32768 gives at most"):
        match.solve("lstm", "params", 10**13, d_model=64, n_layers=N_LAYERS)
    with pytest.raises(match.MatchError, match="no fixed-size state"):
        match.solve("transformer", "state_size", 20_000, d_model=64, n_layers=N_LAYERS)
    with pytest.raises(match.MatchError, match="carries no state"):
        match.solve("gated_mlp", "state_size", 20_000, d_model=64, n_layers=N_LAYERS)
    with pytest.raises(match.MatchError, match="do not also write d_state"):
        match.solve("mamba", "state_size", 20_000, d_model=64, n_layers=N_LAYERS, options={"d_state": 8})


PROFILE = """
schema_version = 1
name = "match-test"
[task]
name = "induction_heads"
vocab_size = 16
[sweep]
models = [{models}]
seq_lens = [64]
[sweep.match]
{match}
[model]
{model}
[train]
steps = 2
batch_size = 2
"""


def test_a_profile_records_the_solved_values_and_dry_run_shows_them(tmp_path, capsys):
    text = PROFILE.format(models='"mamba", "mamba2"', match="params = 300_000", model="n_layers = 2")
    a, b = expand(loads(text))
    assert a.match["solved"] == {"d_model": a.d_model} and a.d_model != 64
    assert b.match["solved"]["d_model"] == b.d_model
    for s in (a, b):   # the spec as built is the one that meets the target
        m = _build(s.model, {"d_model": s.d_model, **s.model_options})
        assert abs(param_counts(m).non_embedding / 300_000 - 1) <= 0.02
        assert type(s).from_dict(s.to_dict()).match == s.match
    p = tmp_path / "m.toml"
    p.write_text(text)
    from workbench.cli import main

    main(["run", "--dry-run", str(p)])
    out = capsys.readouterr().out
    assert f"matched: mamba: d_model = {a.d_model} (" in out and "of 300,000)" in out


def test_profile_refusals():
    with pytest.raises(ProfileError, match="one of params or state_size"):
        loads(PROFILE.format(models='"mamba"', match="params = 1000\nstate_size = 10", model=""))
    with pytest.raises(ProfileError, match="do not also write d_model"):
        expand(loads(PROFILE.format(models='"mamba"', match="params = 300_000", model="d_model = 32")))
    with pytest.raises(ProfileError, match=r"sweep.match \(line 10\): model 'transformer' cannot be matched by "
                                           r"state_size: it has no fixed-size state"):
        loads(PROFILE.format(models='"transformer"', match="state_size = 1000", model=""))   # as profile check says
    with pytest.raises(ProfileError, match=r"sweep.match \(line 10\): model 'lstm' cannot meet params 10"):
        loads(PROFILE.format(models='"lstm"', match="params = 10", model=""))
