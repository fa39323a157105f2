"""The Table-1 block grid {none, h3, mamba} x inner layers: builds, causal, state, step, options."""
import pytest
import torch

import models
from models.ssm.blocks import BLOCKS, INNERS, MambaBlock, NoGateBlock, make_block, make_inner
from models.catalog_s4 import GRID_NAMES

from helpers import run_steps

D = 8


def test_every_combination_is_registered():
    assert sorted(GRID_NAMES) == sorted(f"{b}_{i}" for b in BLOCKS for i in INNERS)
    for name in GRID_NAMES + ["s4", "s4_dplr", "s4d", "hyena", "h3"]:
        assert name in models.names()
        assert models.describe(name)


@pytest.mark.parametrize("name", sorted(f"{b}_{i}" for b in BLOCKS for i in INNERS))
def test_grid_entry_builds_and_is_causal(name):
    torch.manual_seed(0)
    kw = {} if name.endswith("hyena") else {"d_state": 4}
    m = models.build(name, d_model=D, n_layers=2, **kw).double()
    L, t0 = 24, 15
    x = torch.randn(2, L, D, dtype=torch.float64)
    x2 = x.clone()
    x2[:, t0:] = torch.randn(2, L - t0, D, dtype=torch.float64)
    with torch.no_grad():
        y, y2 = m(x), m(x2)
    assert y.shape == x.shape and torch.isfinite(y).all()
    assert (y[:, :t0] - y2[:, :t0]).abs().max() < 1e-10
    assert (y[:, t0:] - y2[:, t0:]).abs().max() > 1e-4
    assert models.param_count(m) > 0
    assert isinstance(models.backend(m), str)
    s = models.state_size(m)
    if name.endswith("hyena"):
        assert s is None
    else:
        assert isinstance(s, int) and s > 0


def test_state_sizes():
    d, N = D, 4
    assert models.state_size(models.build("none_s4d_lin", d_model=d, n_layers=3, d_state=N)) == 3 * d * N
    # mamba block: inner on 2d channels + the conv's last 3 inputs
    assert models.state_size(models.build("mamba_s4d_real", d_model=d, n_layers=2, d_state=N)) \
        == 2 * (2 * d * N + 2 * d * 3)
    # h3 block: inner + shift SSM's last shift_size-1 inputs
    assert models.state_size(models.build("h3_s4_dplr", d_model=d, n_layers=1, d_state=N,
                                          shift_size=3)) == d * N + d * 2
    assert models.state_size(models.build("mamba_s6", d_model=d, n_layers=1, d_state=N)) \
        == 2 * d * N + 2 * d * 3


def test_options_are_checked():
    with pytest.raises(TypeError, match="expand"):
        models.build("h3_s6", d_model=D, n_layers=1, expand=2)
    with pytest.raises(TypeError, match="d_state"):
        models.build("none_hyena", d_model=D, n_layers=1, d_state=4)
    with pytest.raises(TypeError, match="shift_size"):
        models.build("mamba_s4d_lin", d_model=D, n_layers=1, shift_size=2)
    assert models.entry("mamba_s4").options()["expand"] == 2
    with pytest.raises(ValueError, match="inner"):
        make_inner("s5", D)
    with pytest.raises(ValueError, match="block"):
        make_block("gated", "s4d_lin", D)


def test_mamba_block_uses_expanded_inner_and_gate():
    torch.manual_seed(1)
    blk = MambaBlock(D, lambda c: make_inner("s4d_lin", c, 4), expand=3)
    assert blk.inner.d == 3 * D
    # zero gate branch => zero output (y = W_o(inner(.) * SiLU(z)), SiLU(0) = 0)
    with torch.no_grad():
        blk.in_proj.weight[3 * D:].zero_()
        assert blk(torch.randn(2, 5, D)).abs().max() == 0


@pytest.mark.parametrize("name", [
    "none_s4d_real", "mamba_s4d_inv", "none_s6", "mamba_s6", "h3_s4d_lin", "h3_s6", "h3",
])
def test_step_mode_matches_forward(name):
    torch.manual_seed(2)
    m = models.build(name, d_model=D, n_layers=2, d_state=4).double()
    x = torch.randn(2, 12, D, dtype=torch.float64)
    with torch.no_grad():
        y = m(x)
    assert torch.allclose(run_steps(m, x), y, atol=1e-8)


def test_step_mode_absent_is_an_error():
    m = models.build("none_hyena", d_model=D, n_layers=1)
    with pytest.raises(NotImplementedError):
        m.init_state(1)


def test_no_gate_block_is_linear_gelu_inner():
    torch.manual_seed(3)
    blk = NoGateBlock(D, make_inner("s4d_lin", D, 4)).double()
    x = torch.randn(1, 6, D, dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(blk(x), blk.out_proj(torch.nn.functional.gelu(blk.inner(x))))
