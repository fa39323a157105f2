"""Options that let a profile express what published code actually ran (issue 10): an
explicit Mamba width, and Adam beside AdamW."""
from __future__ import annotations

import pytest
import torch

import models
from workbench.train import optim
from workbench.spec.profile import ProfileError, loads


def test_mamba_width_as_in_a_hugging_face_config():
    """hybrid-model's Mamba row: MambaForCausalLM from mamba-130m-hf's config with hidden 32,
    2 layers, vocab 16 (intermediate_size 1536, time_step_rank 48, tied embedding) has
    759,392 parameters; the backbone is that minus the 16 x 32 embedding."""
    m = models.build("mamba", d_model=32, n_layers=2, d_inner=1536, dt_rank=48)
    mixer = m.layers[0].mixer
    assert mixer.d_inner == 1536 and mixer.dt_rank == 48
    assert mixer.in_proj.weight.shape == (2 * 1536, 32) and mixer.x_proj.weight.shape == (48 + 32, 1536)
    assert sum(p.numel() for p in m.parameters()) == 759_392 - 16 * 32
    y = m(torch.randn(2, 9, 32))
    assert y.shape == (2, 9, 32)
    # without d_inner, expand decides as before
    assert models.build("mamba", d_model=32, n_layers=1, expand=3).layers[0].mixer.d_inner == 96
    for bad in (0, -4, 1.5, True):
        with pytest.raises(ValueError, match="d_inner"):
            models.build("mamba", d_model=8, n_layers=1, d_inner=bad)


PROFILE = """
schema_version = 1
name = "t"
[task]
name = "mad_selective_copying"
[sweep]
models = ["lstm"]
[train]
steps = 2
{line}
"""


def test_profile_optimizer_choice():
    assert loads(PROFILE.format(line="")).train.optimizer == "adamw"
    assert loads(PROFILE.format(line='optimizer = "adam"')).train.optimizer == "adam"
    with pytest.raises(ProfileError, match="optimizer"):
        loads(PROFILE.format(line='optimizer = "sgd"'))


@pytest.mark.parametrize("name,cls", [("adamw", torch.optim.AdamW), ("adam", torch.optim.Adam)])
def test_make_optimizer_class_groups_and_decay(name, cls):
    torch.manual_seed(0)
    model = models.build("mamba", d_model=8, n_layers=1, d_state=4)
    cfg = {"optimizer": name, "lr": 1e-3, "betas": (0.9, 0.98), "weight_decay": 0.1}
    opt = optim.make_optimizer(model, **cfg)
    assert type(opt) is cls
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert any(p is model.layers[0].mixer.A_log for p in no_decay["params"])
    assert opt.defaults["betas"] == (0.9, 0.98)
    # the two differ where it matters: Adam's decay goes through the moments, AdamW's not
    w = model.layers[0].mixer.in_proj.weight
    before = w.detach().clone()
    w.grad = torch.zeros_like(w)
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    opt.step()
    step = (before - w.detach()).abs().max().item()
    if name == "adamw":   # lr * wd * w: tiny
        assert step <= 1.01 * 1e-3 * 0.1 * before.abs().max().item()
    else:                 # the L2 gradient is normalised by Adam: about lr
        assert step == pytest.approx(1e-3, rel=0.05)
