"""Sliding-window attention (models/attention/sliding_window.py) and its registry entry."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import models
from helpers import run_pieces, run_steps
from models.attention.attention import CausalSelfAttention
from models.kernels.linear_rnn_backends import BackendError
from models.attention.sliding_window import SlidingWindowAttention

D, H = 16, 2


def _layer(window: int, pos: str = "rope", backend: str = "auto", seed: int = 0):
    torch.manual_seed(seed)
    return SlidingWindowAttention(D, n_heads=H, window=window, pos=pos, backend=backend).double()


def _explicit(m: SlidingWindowAttention, x: torch.Tensor) -> torch.Tensor:
    """Full (L, L) causal attention with an explicit band mask: t sees t-window+1 .. t."""
    b, L, _ = x.shape
    dh = D // H
    q, k, v = m.qkv(x).view(b, L, 3, H, dh).unbind(2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if m.rotary is not None:
        pos = torch.arange(L)
        q, k = m.rotary(q, pos), m.rotary(k, pos)
    scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
    mask = torch.zeros(L, L, dtype=torch.bool)
    for t in range(L):
        for s in range(L):
            mask[t, s] = t - m.window < s <= t
    attn = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return m.out_proj((attn @ v).transpose(1, 2).reshape(b, L, D))


@pytest.mark.parametrize("window,length", [(5, 23), (8, 17), (1, 9), (4, 4), (3, 2)])
@pytest.mark.parametrize("pos", ["rope", "none"])
def test_equals_masked_full_attention(window, length, pos):
    m = _layer(window, pos)
    x = torch.randn(2, length, D, dtype=torch.float64)
    torch.testing.assert_close(m(x), _explicit(m, x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("window", [20, 21, 64])
def test_window_at_least_length_is_plain_causal_attention(window):
    m = _layer(window)
    full = CausalSelfAttention(D, n_heads=H, pos="rope").double()
    full.load_state_dict(m.state_dict())            # same names: qkv, out_proj
    x = torch.randn(2, 20, D, dtype=torch.float64)
    torch.testing.assert_close(m(x), full(x), rtol=0, atol=1e-12)


def test_window_shorter_than_length_differs_from_causal_attention():
    # guards the test above: a window that cuts context must change the output
    m = _layer(5)
    full = CausalSelfAttention(D, n_heads=H, pos="rope").double()
    full.load_state_dict(m.state_dict())
    x = torch.randn(2, 20, D, dtype=torch.float64)
    y, y_full = m(x), full(x)
    torch.testing.assert_close(y[:, :5], y_full[:, :5], rtol=0, atol=1e-12)
    assert (y[:, 5:] - y_full[:, 5:]).abs().max() > 1e-3


@pytest.mark.parametrize("window", [1, 4, 7])
def test_streaming_equals_forward(window):
    m = _layer(window)
    x = torch.randn(2, 29, D, dtype=torch.float64)
    y = m(x)
    for sizes in ([3] * 9 + [2], [1, 10, 18], [29]):
        torch.testing.assert_close(run_pieces(m, x, sizes), y, rtol=0, atol=1e-12)
    torch.testing.assert_close(run_steps(m, x), y, rtol=0, atol=1e-12)


def test_batch_elements_at_different_points_of_their_streams():
    """A state batched from sequences that have seen 2 and 9 tokens (cache partly empty for
    one, full for the other) gives each sequence what it gets alone."""
    m = _layer(5)
    xa, xb = torch.randn(1, 2 + 6, D, dtype=torch.float64), torch.randn(1, 9 + 6, D, dtype=torch.float64)
    _, sa = m.forward_with_state(xa[:, :2], m.init_state(1))
    _, sb = m.forward_with_state(xb[:, :9], m.init_state(1))
    state = tuple(torch.cat([a, b]) for a, b in zip(sa, sb))
    assert state[2].tolist() == [2, 4]
    y, _ = m.forward_with_state(torch.cat([xa[:, 2:], xb[:, 9:]]), state)
    torch.testing.assert_close(y[:1], m(xa)[:, 2:], rtol=0, atol=1e-12)
    torch.testing.assert_close(y[1:], m(xb)[:, 9:], rtol=0, atol=1e-12)


def test_ref_backend_equals_torch_backend():
    m = _layer(6)
    ref = _layer(6, backend="ref")
    ref.load_state_dict(m.state_dict())
    x = torch.randn(2, 31, D, dtype=torch.float64)
    torch.testing.assert_close(ref(x), m(x), rtol=0, atol=1e-12)
    assert (m.backend, ref.backend) == ("torch", "ref")


def test_state_size_is_the_states_numel_per_sequence():
    m = _layer(7)
    state = m.init_state(3)
    assert m.state_size() == sum(s.numel() for s in state) // 3 == 2 * 6 * D + 1


def test_blocked_form_never_forms_length_by_length_scores(monkeypatch):
    """Each query block sees at most 2 * window - 1 keys, however long the sequence."""
    seen = []
    real_sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((q.shape[-2], k.shape[-2]))
        return real_sdpa(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    m = SlidingWindowAttention(D, n_heads=H, window=16)
    x = torch.randn(1, 16384, D)
    with torch.no_grad():
        y = m(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    assert seen == [(16, 31)]


def test_gradients_finite():
    m = _layer(4)
    x = torch.randn(2, 13, D, dtype=torch.float64, requires_grad=True)
    m(x).pow(2).sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert torch.isfinite(x.grad).all()


def test_bad_options_are_errors_naming_them():
    with pytest.raises(ValueError, match="window"):
        SlidingWindowAttention(D, window=0)
    with pytest.raises(ValueError, match="pos"):
        SlidingWindowAttention(D, pos="xpos")
    with pytest.raises(BackendError, match="fla"):
        SlidingWindowAttention(D, backend="fla")
    with pytest.raises(ValueError, match="n_heads"):
        SlidingWindowAttention(D, n_heads=3)


def test_registry_entry_streams_like_forward():
    torch.manual_seed(0)
    m = models.build("sliding_window_attention", d_model=D, n_layers=2, n_heads=H, window=5,
                     channel_mixer="swiglu").double()
    x = torch.randn(2, 23, D, dtype=torch.float64)
    torch.testing.assert_close(m.forward_chunked(x, 4), m(x), rtol=0, atol=1e-12)
    assert m.state_size() == 2 * (2 * 4 * D + 1)
    assert models.entry("sliding_window_attention").family == "attention"
