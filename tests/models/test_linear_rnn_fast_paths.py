"""The linear-RNN layers' fast paths (issue 43) against their plain references.

Decode: without autograd the delta-rule layers (DeltaNet, Gated DeltaNet, Gated
DeltaProduct, KDA) and RWKV-7 step through a fused ``_fast_step`` (one stacked matmul, the conv as a
window product, the state update in place of the op's ``*_ref`` loop); with autograd they
run the reference step. Both must agree with each other and with a full forward pass,
token by token, in float64, across the options that change the step's shapes (grouped
value heads, Householder rows, negative eigenvalues, no conv, no forget gate)."""
from __future__ import annotations

import pytest
import torch

from models.kernels import generalized_delta, linear_rnn_ops
from models.linear_rnn.delta_mixers import DeltaNet, GatedDeltaNet, GatedDeltaProduct
from models.linear_rnn.dplr_mixers import KimiDeltaAttention, RWKV7Attention

D = 32
CASES = {
    "deltanet": lambda: DeltaNet(D, n_heads=2),
    "deltanet_noconv_neg": lambda: DeltaNet(D, n_heads=2, use_short_conv=False,
                                            allow_neg_eigval=True),
    "gated_deltanet": lambda: GatedDeltaNet(D, n_heads=2),
    "gated_deltanet_gva": lambda: GatedDeltaNet(D, n_heads=2, num_v_heads=4),
    "gated_deltaproduct": lambda: GatedDeltaProduct(D, n_heads=2, num_householder=3,
                                                    allow_neg_eigval=True),
    "deltaproduct_nogate": lambda: GatedDeltaProduct(D, n_heads=2, use_forget_gate=False),
    "kda": lambda: KimiDeltaAttention(D, n_heads=2),
    "kda_gva": lambda: KimiDeltaAttention(D, n_heads=2, num_v_heads=4, allow_neg_eigval=True),
    "rwkv7": lambda: RWKV7Attention(D, n_heads=2),
}


def _layer(name):
    torch.manual_seed(0)
    m = CASES[name]().double()
    with torch.no_grad():                       # non-trivial biases / gains
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    return m


def _without_reference_ops(monkeypatch):
    """Make every operator's ``*_ref`` unreachable: the fast step must not fall back to it."""
    for table in (linear_rnn_ops.ALL_OPS, generalized_delta.OPS):
        for op, entry in list(table.items()):
            monkeypatch.setitem(table, op, (entry[0], None, *entry[2:]))


@pytest.mark.parametrize("name", sorted(CASES))
def test_fast_step_equals_reference_step_and_forward(name, monkeypatch):
    m = _layer(name)
    B, P, T = 3, 5, 9
    x = torch.randn(B, T, D, dtype=torch.float64)
    with torch.no_grad():
        full = m(x)
        _, st_fast = m.forward_with_state(x[:, :P], m.init_state(B))
    st_ref = st_fast
    for t in range(P, T):
        with monkeypatch.context() as mp, torch.no_grad():
            _without_reference_ops(mp)
            y_fast, st_fast = m.step(x[:, t], st_fast)
        with torch.enable_grad():                      # autograd on: the reference step
            y_ref, st_ref = m.step(x[:, t], st_ref)
        torch.testing.assert_close(y_fast, y_ref.detach(), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(y_fast, full[:, t], rtol=1e-9, atol=1e-9)
        assert len(st_fast) == len(st_ref)
        for a, b in zip(st_fast, st_ref):
            assert a.shape == b.shape
            torch.testing.assert_close(a, b.detach(), rtol=1e-10, atol=1e-10)


def test_stacked_weights_follow_an_optimizer_step():
    """The fused step's stacked projection weights are rebuilt after the parameters change."""
    m = _layer("gated_deltanet")
    x = torch.randn(2, D, dtype=torch.float64)
    st = m.init_state(2)
    with torch.no_grad():
        m.step(x, st)                                  # stacks and keeps the weights
        m.q_proj.weight.mul_(0.5)                     # an in-place update (as an optimiser's)
        y_fast = m.step(x, st)[0]
    y_ref = m.step(x, st)[0]
    torch.testing.assert_close(y_fast, y_ref.detach(), rtol=1e-10, atol=1e-10)


# -- training: RWKV-7's recomputed pre-operator piece ------------------------------------

def _plain_rwkv7(m, x):
    """RWKV-7 time mixing written out under plain autograd, every intermediate kept (the
    layer's form before its pre- and post-operator pieces were recomputed), over the
    step-by-step ``rwkv7_ref``: the reference for the layer's values and gradients."""
    import math

    import torch.nn.functional as F
    B, T, D = x.shape
    H = m.n_heads
    shifted = torch.cat([x.new_zeros(B, 1, D), x[:, :-1]], 1)
    xr, xw, xk, xv, xa, xg = (x + (shifted - x) * mu for mu in m.mu)
    r, k, v = m.r_proj(xr), m.k_proj(xk), m.v_proj(xv)
    log_w = -math.exp(-0.5) * m.w_lora(xw).sigmoid()
    a = m.a_lora(xa).sigmoid()
    gate = m.g_lora(xg)
    def heads(t):
        return t.unflatten(-1, (H, -1))
    kk = F.normalize(heads(k * m.k_k), dim=-1)
    k = k * (1 + (a - 1) * m.k_a)
    r, k, v, a, log_w = (heads(t) for t in (r, k, v, a, log_w))
    bonus = (r * k * m.r_k).sum(-1, keepdim=True) * v
    o, _ = generalized_delta.rwkv7_ref(r, k, v, -kk, kk * a, log_w, scale=1.0)
    o = m.g_norm(o.reshape(B * T, -1)).reshape(B, T, H, -1)
    return m.o_proj((o + bonus).flatten(-2) * gate)


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_rwkv7_training_piece_equals_plain_autograd(backend, monkeypatch):
    """Values and gradients (input and every parameter) of the layer, whose pre-operator
    piece is recomputed in pieces and slices with one step of token-shift context, equal
    the plain form; PREP_STEPS and SLICE_LEN are shrunk so the sequence spans several of
    each."""
    from models import common
    from models.linear_rnn import dplr_mixers
    monkeypatch.setattr(common, "SLICE_LEN", 2)
    monkeypatch.setattr(dplr_mixers, "PREP_STEPS", 5)
    torch.manual_seed(0)
    m = RWKV7Attention(D, n_heads=2, backend=backend).double()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.2 * torch.randn_like(p))
    x = torch.randn(2, 11, D, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 11, D, dtype=torch.float64)
    y = m(x)
    (y * w).sum().backward()
    got = [x.grad.clone()] + [p.grad.clone() for p in m.parameters()]
    x.grad = None
    m.zero_grad()
    y_ref = _plain_rwkv7(m, x)
    (y_ref * w).sum().backward()
    want = [x.grad] + [p.grad for p in m.parameters()]
    torch.testing.assert_close(y, y_ref, rtol=1e-9, atol=1e-9)
    for (name, _), g, r in zip([("x", None), *m.named_parameters()], got, want):
        torch.testing.assert_close(g, r, rtol=1e-8, atol=1e-9, msg=f"gradient of {name}")


# -- training: the delta-rule layers' projections under plain autograd --------------------

@pytest.mark.parametrize("name", sorted(n for n in CASES if n != "rwkv7"))
def test_one_projection_matmul_equals_recomputed_piece(name, monkeypatch):
    """The pre-operator piece of short inputs (one matmul of x with every projection under
    autograd, then the conv) gives the values, next state and gradients of the piece that
    recomputes the q/k/v projection in the backward (inputs above
    ``PROJ_WHOLE_MAX_BYTES``), from a fresh state and from a carried one (conv cache and
    S)."""
    from models import common
    from models.linear_rnn import delta_mixers
    monkeypatch.setattr(common, "SLICE_LEN", 4)
    m = _layer(name)
    x = torch.randn(2, 10, D, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 10, D, dtype=torch.float64)
    with torch.no_grad():
        st0 = m.forward_with_state(torch.randn(2, 3, D, dtype=torch.float64), m.init_state(2))[1]
    runs = []
    for limit in (2**40, 0):
        monkeypatch.setattr(delta_mixers, "PROJ_WHOLE_MAX_BYTES", limit)
        x.grad = None
        m.zero_grad()
        y1 = m(x)
        y2, st = m.forward_with_state(x, st0)
        ((y1 + y2) * w).sum().backward()
        runs.append([y1, y2, *st, x.grad] + [p.grad for p in m.parameters()])
    for got, want in zip(*runs):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
