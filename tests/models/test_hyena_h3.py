"""Hyena and H3: shapes, causality, filter properties, H3 structure (CPU)."""
import pytest
import torch
import torch.nn as nn

from models.ssm.h3 import H3, ShiftSSM
from models.conv.hyena import Hyena, HyenaFilterConv, ImplicitFilter


def _causal_gap(m: nn.Module, d: int, L: int = 48, t0: int = 30, dtype=torch.float64):
    """(max change before t0, max change from t0) when inputs from t0 on are replaced."""
    torch.manual_seed(0)
    x = torch.randn(2, L, d, dtype=dtype)
    x2 = x.clone()
    x2[:, t0:] = torch.randn(2, L - t0, d, dtype=dtype)
    with torch.no_grad():
        y, y2 = m(x), m(x2)
    assert y.shape == x.shape
    return (y[:, :t0] - y2[:, :t0]).abs().max().item(), (y[:, t0:] - y2[:, t0:]).abs().max().item()


@pytest.mark.parametrize("make", [
    lambda: Hyena(8), lambda: Hyena(8, order=3, short_width=4), lambda: HyenaFilterConv(8),
    lambda: H3(8), lambda: H3(8, inner=HyenaFilterConv(8), shift_size=2),
])
def test_causal_and_shape(make):
    torch.manual_seed(1)
    m = make().double()
    before, after = _causal_gap(m, 8)
    assert before < 1e-12
    assert after > 1e-3


def test_hyena_long_sequence_causal_past_l_max():
    m = Hyena(4, l_max=16).double()
    before, after = _causal_gap(m, 4, L=40, t0=33)
    assert before < 1e-12 and after > 1e-3


def test_implicit_filter_independent_of_length_and_decays():
    torch.manual_seed(2)
    f = ImplicitFilter(6, n_filters=2, l_max=64).double()
    with torch.no_grad():
        h20, h80 = f(20), f(80)
    assert h80.shape == (2, 6, 80)
    assert torch.allclose(h20, h80[..., :20])       # a prefix sees the same filter
    # the window exp(-alpha t / l_max): alpha spread over channels, all decaying
    assert (f.alpha > 0).all() and f.alpha[0] < f.alpha[-1]


def test_hyena_validates_options():
    with pytest.raises(ValueError, match="order"):
        Hyena(4, order=1)
    with pytest.raises(ValueError, match="emb_dim"):
        Hyena(4, emb_dim=4)


def test_shift_ssm_is_a_window_over_last_N_inputs():
    torch.manual_seed(3)
    s = ShiftSSM(3, N=4).double()
    x = torch.randn(2, 10, 3, dtype=torch.float64)
    w = s.conv.weight[:, 0, :]                         # (d, N); w[:, N-1] multiplies x_t
    ref = torch.zeros_like(x)
    for t in range(10):
        for j in range(4):
            if t - j >= 0:
                ref[:, t] += w[:, 3 - j] * x[:, t - j]
    with torch.no_grad():
        assert torch.allclose(s(x), ref)
    assert s.state_size() == 3 * 3


def test_h3_structure_q_times_inner_of_shiftK_times_V():
    """With the inner layer replaced by a recorder, H3 = W_o(Q * inner(shift(K) * V))."""
    torch.manual_seed(4)

    class Twice(nn.Module):
        def forward(self, x):
            return 2 * x

        def state_size(self):
            return 0

    m = H3(5, inner=Twice(), shift_size=3).double()
    x = torch.randn(2, 7, 5, dtype=torch.float64)
    with torch.no_grad():
        ref = m.out_proj(m.q_proj(x) * 2 * (m.shift(m.k_proj(x)) * m.v_proj(x)))
        assert torch.allclose(m(x), ref)
    assert m.state_size() == 5 * 2


def test_h3_default_inner_is_s4d_lin_and_state_size():
    m = H3(8, d_state=16, shift_size=4)
    assert m.inner.init == "lin"
    assert m.state_size() == 8 * 16 + 8 * 3
    assert Hyena(8).state_size() is None
