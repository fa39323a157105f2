"""Checks the C decode-step tests share (test_delta_rule_decode_step.py,
test_kda_decode_step.py): a layer with non-trivial gains, tolerances by dtype, the C step
made the only way to step, and the step held to the reference step and the full forward."""
from __future__ import annotations

import torch

from models.kernels import linear_rnn_ops


def perturbed(make, dtype=torch.float64):
    """``make()`` in ``dtype``, seeded, its 1-d parameters (biases, gains) moved off their
    initial values so that a term dropped from the step shows."""
    torch.manual_seed(0)
    m = make().to(dtype)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    return m


def close(a, b, dtype):
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def only_the_c_step(mp, m):
    """Every operator's ``*_ref`` and the torch step unreachable: what steps is the C."""
    for op, entry in list(linear_rnn_ops.ALL_OPS.items()):
        mp.setitem(linear_rnn_ops.ALL_OPS, op, (entry[0], None, *entry[2:]))

    def no_torch_step(*a, **k):
        raise AssertionError("the torch step ran")
    mp.setattr(m, "_fast_step", no_torch_step)


def c_step_equals_reference_step_and_forward(m, d_model, dtype, monkeypatch):
    """After a 5-token prompt, each of 6 steps (C step only) equals the reference step and
    the full forward at that position, outputs and every state tensor."""
    B, P, T = 3, 5, 11
    x = torch.randn(B, T, d_model, dtype=dtype)
    with torch.no_grad():
        full = m(x)
        _, st_c = m.forward_with_state(x[:, :P], m.init_state(B))
    st_ref = st_c
    for t in range(P, T):
        with monkeypatch.context() as mp, torch.no_grad():
            only_the_c_step(mp, m)
            y_c, st_c = m.step(x[:, t], st_c)
        with torch.no_grad():
            y_ref, st_ref = m._ref_step(x[:, t], st_ref)
        close(y_c, y_ref, dtype)
        close(y_c, full[:, t], dtype if dtype == torch.float32 else torch.float32)
        assert len(st_c) == len(st_ref)
        for a, b in zip(st_c, st_ref):
            assert a.shape == b.shape and a.dtype == b.dtype
            close(a, b, dtype)
