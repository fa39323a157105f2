"""Mamba-3's rotation in C (``models.kernels.rotate_cpu``, issue 43) equals the torch
rotation (``mamba3_scan.rotate``), values and gradients, and a Mamba-3 layer takes it (spied)
with the same output and gradients as without it."""
from __future__ import annotations

import pytest
import torch

from models.kernels import mamba3_scan
from models.kernels import rotate_cpu as rc
from models.ssm.mamba3 import Mamba3

F64 = torch.float64

pytestmark = pytest.mark.skipif(rc.load()[0] is None, reason="no C compiler: " + rc.load()[1])


def _inputs(lead, N, R, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*lead, N, generator=g, dtype=dtype)
    k = torch.randn(*lead, N, generator=g, dtype=dtype)
    th = (torch.rand(*lead, R, generator=g, dtype=dtype) * 2 - 1) * 7
    return [t.requires_grad_() for t in (q, k, th)]


@pytest.mark.parametrize("N,R", [(8, 2), (8, 4), (6, 1)])
def test_gradcheck_float64(N, R):
    q, k, th = _inputs((2, 5, 3), N, R, F64)
    assert torch.autograd.gradcheck(lambda a, b, c: rc.RotatePairFn.apply(a, b, c), (q, k, th))


@pytest.mark.parametrize("N,R", [(16, 4), (16, 8), (10, 3)])
@pytest.mark.parametrize("dtype,atol", [(F64, 1e-12), (torch.float32, 1e-5)])
def test_equals_torch_rotation(N, R, dtype, atol):
    """More rows than work items (several blocks of cos and sin), the channels past 2R
    copied; q as a strided view (a slice of a wider tensor)."""
    q, k, th = _inputs((3, 70, 5), N, R, dtype)
    wide = torch.randn(3, 70, 5, N + 3, dtype=dtype)
    qv = wide[..., 1:N + 1].requires_grad_()
    qv = qv.detach().copy_(q.detach()).requires_grad_()
    dq, dk = (torch.randn(3, 70, 5, N, dtype=dtype) for _ in range(2))
    got = rc.RotatePairFn.apply(qv, k, th)
    want = (mamba3_scan.rotate(q, th), mamba3_scan.rotate(k, th))
    gg = torch.autograd.grad(got, [qv, k, th], (dq, dk))
    gw = torch.autograd.grad(want, [q, k, th], (dq, dk))
    for a, b in zip([*got, *gg], [*want, *gw]):
        torch.testing.assert_close(a, b, atol=atol, rtol=atol)


@pytest.mark.parametrize("rope_fraction", [0.5, 1.0])
def test_mamba3_layer_same_with_and_without_the_kernel(rope_fraction, monkeypatch):
    """The training forward (the recomputed segments, SEGMENT_LEN 16 so several) in
    float64: output and every gradient the same with the kernel (spied) and without."""
    from models.ssm import mamba3

    monkeypatch.setattr(mamba3, "SEGMENT_LEN", 16)
    torch.manual_seed(1)
    m = Mamba3(16, d_state=8, headdim=8, rope_fraction=rope_fraction, backend="cpu").double()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn(p.shape, dtype=F64))
    u = torch.randn(2, 45, 16, dtype=F64, requires_grad=True)

    def run():
        out = m(u)
        m.zero_grad(set_to_none=True)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=F64)
        (out * g).sum().backward()
        return [out.detach(), u.grad.clone()] + [p.grad for p in m.parameters()]

    calls = []
    fwd = rc.RotatePairFn.forward
    monkeypatch.setattr(rc.RotatePairFn, "forward",
                        staticmethod(lambda ctx, *a: calls.append(1) or fwd(ctx, *a)))
    got = run()
    assert calls
    u.grad = None
    monkeypatch.setattr(rc, "ENABLED", False)
    n = len(calls)
    want = run()
    assert len(calls) == n
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9)


def test_applies_only_where_shapes_and_dtypes_fit():
    q = torch.randn(2, 3, 8)
    th = torch.randn(2, 3, 2)
    assert rc.applies(q, q, th)
    assert not rc.applies(q.bfloat16(), q.bfloat16(), th.bfloat16())
    assert not rc.applies(q, q, th[:1])                      # broadcast angles: torch form
    assert not rc.applies(q, q, torch.randn(2, 3, 5))        # 2R > N
    assert not rc.applies(q, q.double(), th)


@pytest.mark.parametrize("span", [7.0, 3000.0, 1e5])
def test_float32_sin_cos_over_wide_angles(span):
    """float32 takes an inlined sin/cos (angles up to ROT_BIG_ANGLE) or libm's (a block
    with a larger angle): within float32 round-off of the float64 rotation either way."""
    g = torch.Generator().manual_seed(0)
    th = (torch.rand(4096, 8, generator=g) * 2 - 1) * span
    th[0, 0] = span
    q = torch.randn(4096, 16, generator=g)
    got, _ = rc.RotatePairFn.apply(q, q, th)
    want = mamba3_scan.rotate(q.double(), th.double())
    torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=0)


@pytest.mark.parametrize("dtype,atol", [(F64, 1e-12), (torch.float32, 1e-5)])
def test_scaled_keys_and_dot_products(dtype, atol):
    """With coef the call also gives kc = rot(k) coef and qk = rot(q) . rot(k) (the chunked
    form's keys and its correction's dots): values and gradients of all four outputs as the
    torch rotation followed by the torch products; gradcheck in float64."""
    q, k, th = _inputs((3, 70, 5), 16, 4, dtype)
    cf = torch.randn(3, 70, 5, generator=torch.Generator().manual_seed(3), dtype=dtype)
    cf.requires_grad_()
    got = rc.RotatePairFn.apply(q, k, th, cf)
    qr, kr = mamba3_scan.rotate(q, th), mamba3_scan.rotate(k, th)
    want = (qr, kr, kr * cf[..., None], (qr * kr).sum(-1))
    g = torch.Generator().manual_seed(4)
    dys = [torch.randn(t.shape, generator=g, dtype=dtype) for t in want]
    gg = torch.autograd.grad(got, [q, k, th, cf], dys)
    gw = torch.autograd.grad(want, [q, k, th, cf], dys)
    for a, b in zip([*got, *gg], [*want, *gw]):
        torch.testing.assert_close(a, b, atol=atol, rtol=atol)
    if dtype == F64:
        small = [t.detach()[:1, :4].requires_grad_() for t in (q, k, th, cf)]
        assert torch.autograd.gradcheck(lambda *a: rc.RotatePairFn.apply(*a), small)


@pytest.mark.parametrize("with_coef", [False, True])
@pytest.mark.parametrize("dtype,atol", [(F64, 1e-12), (torch.float32, 1e-5)])
def test_head_biases_on_keys_broadcast_over_heads(with_coef, dtype, atol):
    """q, k (b, L, 1 -> h, N) broadcast over the heads (stride 0, as Mamba-3's B and C) with
    per-head biases (h, N): the call turns q + q_bias and k + k_bias, reading q and k in
    place; values and gradients (q and k before the broadcast, both biases, theta, coef) as
    the torch sum then the torch rotation and products; gradcheck in float64."""
    g = torch.Generator().manual_seed(5)
    b, L, h, N, R = 2, 70, 3, 16, 5
    q0, k0 = (torch.randn(b, L, 1, N, generator=g, dtype=dtype).requires_grad_()
              for _ in range(2))
    qb, kb = (torch.randn(h, N, generator=g, dtype=dtype).requires_grad_() for _ in range(2))
    th = ((torch.rand(b, L, h, R, generator=g, dtype=dtype) * 2 - 1) * 7).requires_grad_()
    cf = torch.randn(b, L, h, generator=g, dtype=dtype).requires_grad_() if with_coef else None
    leaves = [t for t in (q0, k0, qb, kb, th, cf) if t is not None]

    def fused(q0, k0, qb, kb, th, cf=None):
        q, k = q0.expand(b, L, h, N), k0.expand(b, L, h, N)
        return rc.RotatePairFn.apply(q, k, th, cf, qb, kb)

    def torch_form(q0, k0, qb, kb, th, cf=None):
        qr, kr = mamba3_scan.rotate(q0 + qb, th), mamba3_scan.rotate(k0 + kb, th)
        return (qr, kr) if cf is None else (qr, kr, kr * cf[..., None], (qr * kr).sum(-1))

    got, want = fused(*leaves), torch_form(*leaves)
    assert len(got) == len(want)
    dys = [torch.randn(t.shape, generator=g, dtype=dtype) for t in want]
    gg = torch.autograd.grad(got, leaves, dys)
    gw = torch.autograd.grad(want, leaves, dys)
    for a, c in zip([*got, *gg], [*want, *gw]):
        torch.testing.assert_close(a, c, atol=atol, rtol=atol)
    if dtype == F64:
        small = [t.detach()[:1, :3].requires_grad_() if t.dim() > 2 else t.detach().requires_grad_()
                 for t in leaves]
        b, L = 1, 3
        assert torch.autograd.gradcheck(fused, small)


@pytest.mark.parametrize("ngroups", [1, 2])
def test_mamba3_layer_biases_in_the_kernel_same_as_before_the_scan(ngroups, monkeypatch):
    """Mamba-3's training forward in float64 with B and C's per-head biases added in the
    rotation's C call (mamba3.BIAS_APART, the kernel spied receiving them) and added before
    the scan: the same output and gradients."""
    from models.ssm import mamba3

    monkeypatch.setattr(mamba3, "SEGMENT_LEN", 16)
    torch.manual_seed(3)
    m = Mamba3(32, d_state=8, headdim=8, ngroups=ngroups, backend="cpu").double()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn(p.shape, dtype=F64))
    u = torch.randn(2, 45, 32, dtype=F64, requires_grad=True)

    def run():
        u.grad = None
        m.zero_grad(set_to_none=True)
        out = m(u)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=F64)
        (out * g).sum().backward()
        return [out.detach(), u.grad.clone()] + [p.grad for p in m.parameters()]

    biased = []
    fwd = rc.RotatePairFn.forward

    def spy(ctx, q, k, th, cf=None, qb=None, kb=None):
        biased.append(qb is not None and kb is not None)
        return fwd(ctx, q, k, th, cf, qb, kb)

    monkeypatch.setattr(rc.RotatePairFn, "forward", staticmethod(spy))
    monkeypatch.setattr(mamba3, "BIAS_APART", True)
    got = run()
    assert biased and all(biased)
    monkeypatch.setattr(mamba3, "BIAS_APART", False)
    n = len(biased)
    want = run()
    assert len(biased) > n and not any(biased[n:])
    for a, c in zip(got, want):
        torch.testing.assert_close(a, c, atol=1e-11, rtol=1e-9)
