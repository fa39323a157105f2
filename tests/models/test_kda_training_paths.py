"""Issue 43, training at LM shapes: KDA's fast training paths against their plain twins.

- The C generalised delta rule normalises KDA's q and k per step inside the kernel
  (``generalized_delta_cpu.L2NORM_IN_KERNEL``; csrc/dplr_impl.h, its ``l2norm`` flag) and
  maps dq, dk back through the norm: equal to the step-by-step ``kda_ref`` and to the twin
  that normalises in torch first, values and gradients (float64, gradcheck too).
- KDA's output piece (low-rank gate, gated norm, o_proj) runs under plain autograd while it
  fits ``dplr_mixers.OUT_WHOLE_MAX_BYTES``: equal to the piece recomputed in slices.
"""
from __future__ import annotations

import pytest
import torch

from models import common
from models.kernels import generalized_delta as gd
from models.kernels import generalized_delta_cpu as gdc
from models.linear_rnn import dplr_mixers
from helpers import assert_results_close, op_outputs_and_grads, op_state

F64 = torch.float64

needs_c = pytest.mark.skipif(not gdc.available(),
                             reason=f"no C kernels: {gdc.unavailable_reason()}")


def _raw_inputs(time=37, key_dim=8, value_dim=8, value_heads=None, seed=0):
    """KDA's inputs with q and k NOT normalised (norms 0.01 .. 30), as the layer hands them
    over with use_qk_l2norm_in_kernel."""
    args = gd.make_inputs("kda", time=time, key_dim=key_dim, value_dim=value_dim,
                          value_heads=value_heads, seed=seed, gate_range=(-2.0, 0.0))
    gen = torch.Generator().manual_seed(seed + 11)
    for i in (0, 1):
        B, T, H, _ = args[i].shape
        scale = torch.exp(torch.empty(B, T, H, 1, dtype=F64).uniform_(-4.6, 3.4, generator=gen))
        args[i] = (torch.randn(args[i].shape, generator=gen, dtype=F64) * scale).requires_grad_()
    return args


@needs_c
@pytest.mark.parametrize("time, value_dim, chunk_len, value_heads", [
    (37, 8, 8, None),       # odd length, the last chunk short, value rows padded
    (33, 70, 16, None),     # two column groups, 3 chunks
    (19, 16, 4, 4),         # grouped value heads (q, k repeated before the kernel)
])
def test_in_kernel_l2norm_equals_ref_and_the_torch_norm(time, value_dim, chunk_len,
                                                         value_heads, monkeypatch):
    args = _raw_inputs(time=time, value_dim=value_dim, value_heads=value_heads)
    kw = {"use_qk_l2norm_in_kernel": True}
    want = op_outputs_and_grads(gd.kda_ref, args, op_state(args), **kw)
    monkeypatch.setattr(gdc, "L2NORM_IN_KERNEL", True)
    got = op_outputs_and_grads(gdc.kda, args, op_state(args), chunk_len=chunk_len, **kw)
    assert_results_close(got, want)
    monkeypatch.setattr(gdc, "L2NORM_IN_KERNEL", False)
    twin = op_outputs_and_grads(gdc.kda, args, op_state(args), chunk_len=chunk_len, **kw)
    assert_results_close(got, twin)


@needs_c
def test_in_kernel_l2norm_reaches_the_kernel_and_passes_gradcheck(monkeypatch):
    seen = []
    apply = gdc.DPLRCPU.apply

    def spy(*a):
        seen.append(a[-1])
        return apply(*a)
    monkeypatch.setattr(gdc.DPLRCPU, "apply", spy)
    args = _raw_inputs(time=9, key_dim=4, value_dim=3, seed=2)
    S0 = op_state(args)

    def f(q, k, v, g, beta, h0):
        o, s = gdc.kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                       use_qk_l2norm_in_kernel=True, chunk_len=4)
        return o, s
    assert torch.autograd.gradcheck(f, (*args, S0), eps=1e-6, atol=1e-7, rtol=1e-5)
    assert seen and all(seen)       # the kernel normalised (no torch copies made)


@needs_c
def test_float32_in_kernel_l2norm_is_close_to_float64_ref():
    args = _raw_inputs(time=50, key_dim=16, value_dim=16)
    S0 = op_state(args)
    gen = torch.Generator().manual_seed(5)
    w_o = torch.randn(*args[2].shape, generator=gen, dtype=F64)
    w_s = torch.randn(*S0.shape, generator=gen, dtype=F64)

    def run(fn, xs, h0):
        o, s = fn(*xs, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
        loss = (o * w_o.to(o.dtype)).sum() + (s * w_s.to(s.dtype)).sum()
        return [o, s, *torch.autograd.grad(loss, [*xs, h0])]
    want = run(gd.kda_ref, args, S0)
    a32 = [x.detach().float().requires_grad_() for x in (*args, S0)]
    got = run(gdc.kda, a32[:-1], a32[-1])
    assert all(x.dtype == torch.float32 for x in got)
    assert_results_close(got, [x.float() for x in want], atol=2e-4, rtol=2e-4)


def _kda_layer():
    from models.linear_rnn.dplr_mixers import KimiDeltaAttention

    torch.manual_seed(0)
    m = KimiDeltaAttention(32, n_heads=2).to(F64)
    with torch.no_grad():                      # off the init, so the gate's bias counts
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


@pytest.mark.parametrize("limit", [64 * 2**20, 0])
def test_kda_output_piece_whole_equals_recomputed_slices(limit, monkeypatch):
    m = _kda_layer()
    x = torch.randn(2, 40, 32, dtype=F64, requires_grad=True)
    w = torch.randn(2, 40, 32, dtype=F64)

    def run():
        m.zero_grad(set_to_none=True)
        y = m(x)
        gx, = torch.autograd.grad((y * w).sum(), x, retain_graph=True)
        (y * w).sum().backward()
        return [y, gx, *(p.grad for p in m.parameters())]
    monkeypatch.setattr(common, "SLICE_LEN", 16)      # several slices on the recomputed path
    monkeypatch.setattr(dplr_mixers, "OUT_WHOLE_MAX_BYTES", 0)
    want = run()
    calls = []
    sliced = dplr_mixers.recomputed_in_slices

    def spy(fn, *a):
        calls.append(fn.__name__)
        return sliced(fn, *a)
    monkeypatch.setattr(dplr_mixers, "recomputed_in_slices", spy)
    monkeypatch.setattr(dplr_mixers, "OUT_WHOLE_MAX_BYTES", limit)
    got = run()
    assert_results_close(got, want, atol=1e-12, rtol=1e-10)
    # the whole path skips the recomputed piece; the limit 0 (and long inputs) keep it
    assert ("_gated_out" in calls) == (limit == 0)


def test_kda_output_piece_is_recomputed_above_its_limit(monkeypatch):
    m = _kda_layer()
    x = torch.randn(1, 12, 32, dtype=F64, requires_grad=True)
    calls = []
    sliced = dplr_mixers.recomputed_in_slices

    def spy(fn, *a):
        calls.append(fn.__name__)
        return sliced(fn, *a)
    monkeypatch.setattr(dplr_mixers, "recomputed_in_slices", spy)
    width = (m.value_dim + m.head_v_dim) * 8
    monkeypatch.setattr(dplr_mixers, "OUT_WHOLE_MAX_BYTES", 12 * width - 1)
    m(x).sum().backward()
    assert calls == ["_gated_out"]
    calls.clear()
    monkeypatch.setattr(dplr_mixers, "OUT_WHOLE_MAX_BYTES", 12 * width)
    m(x).sum().backward()
    assert calls == []
