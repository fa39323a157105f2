"""Forgetting attention (FoX; issue 35 item 1; models/attention/forgetting_attention.py), float64:
the fast SDPA form equals the definition (outputs and gradients, odd lengths); a forget
gate of 1 is plain causal attention; streaming (KV cache + gates) equals the full forward;
the registry entry builds, is causal, counts its parameters and reports no fixed state."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import models
from models.attention.forgetting_attention import (ForgettingAttention, forgetting_attn_ref, forgetting_attn_torch,
                                         resolve_backend)

D = torch.float64


def _inputs(b=2, L=13, h=3, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, L, h, d, generator=g, dtype=D, requires_grad=True) for _ in range(3))
    logf = F.logsigmoid(torch.randn(b, L, h, generator=g, dtype=D) + 1.0).requires_grad_()
    return q, k, v, logf


def _naive(q, k, v, logf, scale):
    """Loop form of the paper's equation: D_ij = sum_{l=j+1..i} log f_l, written per pair."""
    b, L, h, _ = q.shape
    out = torch.zeros_like(v)
    for i in range(L):
        logits = torch.stack([(q[:, i] * k[:, j]).sum(-1) * scale + logf[:, j + 1:i + 1].sum(1)
                              for j in range(i + 1)], dim=-1)                # (b, h, i+1)
        out[:, i] = torch.einsum("bhj,bjhd->bhd", torch.softmax(logits, -1), v[:, :i + 1])
    return out


@pytest.mark.parametrize("L", [1, 7, 13])
def test_reference_is_the_papers_equation(L):
    q, k, v, g = _inputs(L=L)
    torch.testing.assert_close(forgetting_attn_ref(q, k, v, g), _naive(q, k, v, g, 1 / math.sqrt(5)))


@pytest.mark.parametrize("L,block", [(1, 512), (9, 512), (31, 512), (31, 4), (29, 7)])
def test_fast_form_equals_reference_outputs_and_grads(L, block):
    q, k, v, g = _inputs(L=L, seed=L)
    a, b = forgetting_attn_torch(q, k, v, g, scale=0.3, block=block), forgetting_attn_ref(q, k, v, g, scale=0.3)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    w = torch.randn_like(a)
    ga = torch.autograd.grad((a * w).sum(), (q, k, v, g))
    gb = torch.autograd.grad((b * w).sum(), (q, k, v, g))
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)
    assert L == 1 or ga[3].abs().sum() > 0   # the gates are trained through D (one token: D = 0)


def test_forget_gate_one_is_plain_causal_attention():
    q, k, v, _ = _inputs(L=11)
    zero = torch.zeros(2, 11, 3, dtype=D)                  # log f = 0: f = 1
    plain = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
    for fn in (forgetting_attn_ref, forgetting_attn_torch):
        torch.testing.assert_close(fn(q, k, v, zero), plain.transpose(1, 2))
    _, _, _, g = _inputs(L=11)                             # and a real gate changes the output
    assert not torch.allclose(forgetting_attn_ref(q, k, v, g), plain.transpose(1, 2))


def test_streaming_equals_the_full_forward():
    torch.manual_seed(0)
    layer = ForgettingAttention(24, n_heads=3).double()
    x = torch.randn(2, 17, 24, dtype=D)
    full = layer(x)
    s = layer.init_state(2)
    ys = []
    for chunk in x.split([5, 1, 7, 4], dim=1):   # queries after a cache: n_key > n_query
        y, s = layer.forward_with_state(chunk, s)
        ys.append(y)
    torch.testing.assert_close(torch.cat(ys, 1), full)
    s, steps = layer.init_state(2), []
    for t in range(17):
        y, s = layer.step(x[:, t], s)
        steps.append(y)
    torch.testing.assert_close(torch.stack(steps, 1), full)
    assert s.k.shape == (2, 17, 3, 8) and s.g.shape == (2, 17, 3)   # the KV cache grows
    q, k, v, g = _inputs(L=19)                  # the last 8 queries against 19 keys, in blocks of 3
    torch.testing.assert_close(forgetting_attn_torch(q[:, 11:], k, v, g, block=3),
                               forgetting_attn_ref(q[:, 11:], k, v, g))
    torch.testing.assert_close(forgetting_attn_ref(q[:, 11:], k, v, g), forgetting_attn_ref(q, k, v, g)[:, 11:])


def test_registry_entry_builds_is_causal_and_counts_parameters():
    m = models.build("forgetting_transformer", d_model=32, n_layers=2, n_heads=4).double()
    assert models.state_size(m) is None and models.backend(m) == "torch"
    d, h = 32, 4
    n_mixer = 4 * d * d + (d + 1) * h                     # q, k, v, o and the forget gate (with bias)
    assert sum(p.numel() for p in m.layers[0].mixer.parameters()) == n_mixer
    assert m.mlps is not None                             # SwiGLU after every mixer
    n_rest = sum(p.numel() for p in m.mlps.parameters()) + sum(
        p.numel() for n, p in m.named_parameters() if "norm" in n and not n.startswith("mlps"))
    assert models.param_count(m) == 2 * n_mixer + n_rest
    x = torch.randn(1, 12, 32, dtype=D, requires_grad=True)
    y = m(x)
    (gx,) = torch.autograd.grad(y[0, 5].sum(), x)
    assert gx[0, 6:].abs().max() == 0 and gx[0, :6].abs().max() > 0


def test_backends():
    assert resolve_backend("auto", "cpu") == "torch" and resolve_backend("ref", "cpu") == "ref"
    with pytest.raises(ValueError, match="backend 'fla' unavailable"):
        resolve_backend("fla", "cpu")
    with pytest.raises(ValueError, match="unknown for forgetting attention"):
        models.build("forgetting_transformer", d_model=32, n_layers=1, backend="nope")
