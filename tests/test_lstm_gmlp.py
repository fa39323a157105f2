"""The `lstm` backbone (incl. step mode) and the `gated_mlp` backbone."""
from __future__ import annotations

import pytest
import torch

import models


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
    ys = []
    for t in range(x.shape[1]):
        y_t, state = m.step(x[:, t], state)
        ys.append(y_t)
    torch.testing.assert_close(torch.stack(ys, 1), y, rtol=1e-10, atol=1e-10)


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
