"""Attention, its positions (absolute, RoPE, xPos) and the `transformer` backbone."""
from __future__ import annotations

import math

import pytest
import torch

import models
from helpers import previous_token_accuracy
from models.attention.attention import CausalSelfAttention, Rotary, sinusoidal_positions

POSITIONS = ["absolute", "learned", "rope", "xpos", "none"]


def _score(rot: Rotary, q: torch.Tensor, k: torch.Tensor, m: int, n: int) -> torch.Tensor:
    """q . k after placing q at position m and k at position n. q, k: (d_head,)."""
    qm = rot(q[None, :], torch.tensor([m]), is_key=False)[0]
    kn = rot(k[None, :], torch.tensor([n]), is_key=True)[0]
    return qm @ kn


@pytest.mark.parametrize("xpos", [False, True])
def test_rotary_score_depends_only_on_relative_position(xpos):
    g = torch.Generator().manual_seed(0)
    d = 16
    rot = Rotary(d, xpos=xpos)
    for _ in range(5):
        q = torch.randn(d, generator=g, dtype=torch.float64)
        k = torch.randn(d, generator=g, dtype=torch.float64)
        for m, n in [(5, 2), (40, 0), (7, 7), (300, 100)]:
            base = _score(rot, q, k, m, n)
            for shift in (1, 13, 1000):
                torch.testing.assert_close(_score(rot, q, k, m + shift, n + shift), base,
                                           rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("xpos", [False, True])
def test_rotary_matches_complex_formula(xpos):
    """q_m . k_n = Re sum_i q_i conj(k_i) e^{i (m-n) theta_i} [* zeta_i^((m-n)/512) for xPos]."""
    g = torch.Generator().manual_seed(1)
    d = 8
    rot = Rotary(d, xpos=xpos)
    q = torch.randn(d, generator=g, dtype=torch.float64)
    k = torch.randn(d, generator=g, dtype=torch.float64)
    half = d // 2
    i = torch.arange(half, dtype=torch.float64)
    theta = 10000.0 ** (-2 * i / d)
    zeta = (i / half + 0.4) / 1.4
    qc = torch.complex(q[:half], q[half:])
    kc = torch.complex(k[:half], k[half:])
    for m, n in [(3, 0), (10, 4), (0, 0), (600, 10)]:
        terms = qc * kc.conj() * torch.exp(1j * (m - n) * theta)
        if xpos:
            terms = terms * zeta ** ((m - n) / 512)
        expected = terms.real.sum()
        torch.testing.assert_close(_score(rot, q, k, m, n), expected, rtol=1e-9, atol=1e-9)
    # and it really does depend on the distance (the rotation is not the identity)
    assert not torch.allclose(_score(rot, q, k, 3, 0), _score(rot, q, k, 9, 0))


def test_xpos_decays_with_distance():
    """|scale| of pair i is zeta_i^((m-n)/512) < 1 for m > n: far keys are damped."""
    rot = Rotary(8, xpos=True)
    q = torch.zeros(8, dtype=torch.float64)
    q[0] = 1.0
    k = q.clone()
    # the rotation keeps norms, so any change of norm is the xPos scale
    qm = rot(q[None], torch.tensor([1000]))[0]
    q0 = rot(q[None], torch.tensor([0]))[0]
    assert qm.norm() < q0.norm()
    k1000 = rot(k[None], torch.tensor([1000]), is_key=True)[0]
    assert k1000.norm() > q0.norm()


@pytest.mark.parametrize("pos", ["rope", "xpos", "none"])
def test_attention_layer_is_causal(pos):
    torch.manual_seed(0)
    attn = CausalSelfAttention(16, 4, pos=pos).double()
    x = torch.randn(2, 20, 16, dtype=torch.float64)
    y = attn(x)
    t = 9
    x2 = x.clone()
    x2[:, t + 1:] = torch.randn_like(x2[:, t + 1:])
    y2 = attn(x2)
    torch.testing.assert_close(y2[:, : t + 1], y[:, : t + 1], rtol=0, atol=1e-10)
    assert not torch.allclose(y2[:, t + 1:], y[:, t + 1:])


@pytest.mark.parametrize("pos", ["rope", "xpos"])
def test_relative_attention_is_shift_invariant_and_order_sensitive(pos):
    torch.manual_seed(0)
    attn = CausalSelfAttention(16, 4, pos=pos).double()
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    # shifting all positions changes nothing (only differences enter)
    torch.testing.assert_close(attn(x, offset=0), attn(x, offset=777), rtol=1e-9, atol=1e-9)
    # but the order of the keys matters: swapping two earlier tokens changes the last output.
    # Without positions, causal attention at the last step is a permutation-invariant
    # average of the earlier values, so this is what fails if the rotation is removed.
    xs = x.clone()
    xs[:, [2, 5]] = x[:, [5, 2]]
    assert not torch.allclose(attn(x)[:, -1], attn(xs)[:, -1], atol=1e-6)


def test_no_positions_is_permutation_invariant_at_last_step():
    """Sanity of the test above: with pos='none' the swap does not change the last output."""
    torch.manual_seed(0)
    attn = CausalSelfAttention(16, 4, pos="none").double()
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    xs = x.clone()
    xs[:, [2, 5]] = x[:, [5, 2]]
    torch.testing.assert_close(attn(x)[:, -1], attn(xs)[:, -1], rtol=1e-9, atol=1e-9)


def test_sinusoidal_positions_values():
    pe = sinusoidal_positions(50, 8, dtype=torch.float64)
    assert pe.shape == (50, 8)
    n, i = 7, 1  # channels 2i, 2i+1
    assert math.isclose(pe[n, 2 * i].item(), math.sin(n / 10000 ** (2 * i / 8)), abs_tol=1e-12)
    assert math.isclose(pe[n, 2 * i + 1].item(), math.cos(n / 10000 ** (2 * i / 8)), abs_tol=1e-12)
    assert sinusoidal_positions(5, 7).shape == (5, 7)  # odd widths work


@pytest.mark.parametrize("pos", POSITIONS)
def test_transformer_is_causal_and_shapes(pos):
    torch.manual_seed(0)
    m = models.build("transformer", d_model=16, n_layers=2, n_heads=2, pos=pos).double()
    x = torch.randn(2, 24, 16, dtype=torch.float64)
    y = m(x)
    assert y.shape == x.shape
    x2 = x.clone()
    # random, not a constant shift: LayerNorm would erase a constant added to every channel
    x2[:, 10:] = torch.randn_like(x2[:, 10:])
    y2 = m(x2)
    torch.testing.assert_close(y2[:, :10], y[:, :10], rtol=0, atol=1e-10)
    assert not torch.allclose(y2[:, 10:], y[:, 10:])
    assert m.state_size() is None and m.backend == "torch"


@pytest.mark.parametrize("pos", ["absolute", "learned", "rope", "xpos"])
def test_transformer_positions_break_permutation_symmetry(pos):
    """With positions, swapping two earlier tokens changes the last output (pos='none' would
    still see the change only through the mask-induced asymmetry of deeper layers)."""
    torch.manual_seed(0)
    m = models.build("transformer", d_model=16, n_layers=1, n_heads=2, pos=pos).double()
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    xs = x.clone()
    xs[:, [2, 5]] = x[:, [5, 2]]
    assert not torch.allclose(m(x)[:, -1], m(xs)[:, -1], atol=1e-6)


def test_transformer_one_layer_without_positions_is_order_blind():
    torch.manual_seed(0)
    m = models.build("transformer", d_model=16, n_layers=1, n_heads=2, pos="none").double()
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    xs = x.clone()
    xs[:, [2, 5]] = x[:, [5, 2]]
    torch.testing.assert_close(m(x)[:, -1], m(xs)[:, -1], rtol=1e-9, atol=1e-9)


def test_transformer_option_errors():
    with pytest.raises(ValueError, match="n_heads"):
        models.build("transformer", d_model=18, n_layers=1, n_heads=4)
    with pytest.raises(ValueError, match="pos"):
        models.build("transformer", d_model=16, n_layers=1, pos="alibi")
    with pytest.raises(ValueError, match="even head dimension"):
        models.build("transformer", d_model=12, n_layers=1, n_heads=4, pos="rope")
    models.build("transformer", d_model=12, n_layers=1, n_heads=4, pos="absolute")  # d_head 3 ok
    with pytest.raises(TypeError, match="n_head\\b"):
        models.build("transformer", d_model=16, n_layers=1, n_head=4)
    m = models.build("transformer", d_model=16, n_layers=1, pos="learned", max_len=8)
    with pytest.raises(ValueError, match="max_len"):
        m(torch.randn(1, 9, 16))


def test_transformer_learns_to_copy_previous_token():
    """A tiny end-to-end check that the attention path trains: predict x[t-1] from x[..t]."""
    acc = previous_token_accuracy("transformer", n_heads=2, pos="rope")
    assert acc > 0.9, acc


def test_attention_scale_matches_explicit_softmax():
    # GPT-Neo's unscaled scores (scale 1.0) against a written-out causal softmax
    torch.manual_seed(0)
    attn = CausalSelfAttention(16, n_heads=2, pos="none", scale=1.0)
    x = torch.randn(2, 5, 16)
    q, k, v = attn.qkv(x).view(2, 5, 3, 2, 8).unbind(2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2)                   # no 1/sqrt(d_head)
    scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 16)
    torch.testing.assert_close(attn(x), attn.out_proj(y))
    default = CausalSelfAttention(16, n_heads=2, pos="none")
    default.load_state_dict(attn.state_dict())
    assert not torch.allclose(default(x), attn(x))
    with pytest.raises(ValueError, match="scale"):
        CausalSelfAttention(16, n_heads=2, scale=0.0)
