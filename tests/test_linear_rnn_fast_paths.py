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

from models.kernels import generalized_delta, linear_rnn
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
    for table in (linear_rnn.ALL_OPS, generalized_delta.OPS):
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
