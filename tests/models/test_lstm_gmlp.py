"""The `lstm` backbone (incl. step mode) and the `gated_mlp` backbone."""
from __future__ import annotations

import pytest
import torch

import models
from helpers import previous_token_accuracy, run_steps


def test_lstm_shapes_state_size_and_backend():
    m = models.build("lstm", d_model=16, n_layers=3)
    y = m(torch.randn(2, 7, 16))
    assert y.shape == (2, 7, 16)
    assert m.state_size() == 3 * 2 * 16
    assert models.state_size(m) == 96
    assert m.backend == "torch"


@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_lstm_step_matches_forward(norm):
    torch.manual_seed(0)
    m = models.build("lstm", d_model=16, n_layers=2, norm=norm).double().eval()
    x = torch.randn(3, 15, 16, dtype=torch.float64)
    y = m(x)
    state = m.init_state(3)
    assert len(state) == 2 and state[0][0].shape == (3, 16)
    assert sum(h.numel() + c.numel() for h, c in state) == 3 * m.state_size()
    torch.testing.assert_close(run_steps(m, x), y, rtol=1e-10, atol=1e-10)


def test_lstm_step_continues_a_prefix():
    """State after stepping a prefix, then stepping on, equals the full forward's suffix."""
    torch.manual_seed(1)
    m = models.build("lstm", d_model=8, n_layers=2).double().eval()
    x = torch.randn(2, 10, 8, dtype=torch.float64)
    y = m(x)
    state = m.init_state(2)
    for t in range(6):
        _, state = m.step(x[:, t], state)
    y6, _ = m.step(x[:, 6], state)
    torch.testing.assert_close(y6, y[:, 6], rtol=1e-10, atol=1e-10)


def test_lstm_is_causal():
    torch.manual_seed(0)
    m = models.build("lstm", d_model=8, n_layers=2).double()
    x = torch.randn(2, 12, 8, dtype=torch.float64)
    x2 = x.clone()
    x2[:, 5:] = -x2[:, 5:]
    torch.testing.assert_close(m(x2)[:, :5], m(x)[:, :5], rtol=0, atol=1e-12)
    assert not torch.allclose(m(x2)[:, 5:], m(x)[:, 5:])


def test_gated_mlp_formula():
    from models.gated_mlp import GatedMLP

    torch.manual_seed(0)
    g = GatedMLP(8, mult=2.0)
    x = torch.randn(3, 5, 8)
    expected = g.W3(g.W1(x) * torch.sigmoid(g.W2(x)) * g.W2(x))  # SiLU(a) = a * sigmoid(a)
    torch.testing.assert_close(g(x), expected)
    assert g.W1.out_features == 16


def test_gated_mlp_mixes_no_positions():
    """Each output position depends on its own input only: changing any other position,
    earlier or later, leaves it unchanged; and positions are treated identically."""
    torch.manual_seed(0)
    m = models.build("gated_mlp", d_model=16, n_layers=3).double()
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    y = m(x)
    x2 = x.clone()
    x2[:, :4] = torch.randn_like(x2[:, :4])   # change the past of positions 4..9
    torch.testing.assert_close(m(x2)[:, 4:], y[:, 4:], rtol=0, atol=1e-12)
    # the same token at two positions gives the same output
    x3 = x.clone()
    x3[:, 7] = x3[:, 2]
    y3 = m(x3)
    torch.testing.assert_close(y3[:, 7], y3[:, 2], rtol=0, atol=1e-12)
    assert "NO positions" in models.describe("gated_mlp")
    assert m.state_size() == 0


def test_gated_mlp_bad_mult():
    with pytest.raises(ValueError, match="mult"):
        models.build("gated_mlp", d_model=8, n_layers=1, mult=0)


def test_lstm_learns_previous_token_but_gated_mlp_cannot():
    """The control does its job: with no position mixing the previous token is invisible,
    so the gated MLP stays at chance (1/8) while the LSTM solves the task."""
    assert previous_token_accuracy("lstm") > 0.9
    assert previous_token_accuracy("gated_mlp") < 0.25


def test_lstm_chunked_forward_matches_full():
    import models

    torch.manual_seed(0)
    m = models.build("lstm", d_model=8, n_layers=2).double().eval()
    x = torch.randn(2, 37, 8, dtype=torch.float64)
    with torch.no_grad():
        full = m(x)
        for chunk in (1, 5, 16, 37):
            assert torch.allclose(m.forward_chunked(x, chunk), full, atol=1e-12), chunk
