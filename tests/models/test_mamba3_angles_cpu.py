"""Issue 43, training at LM shapes: Mamba-3's angles theta_t = (theta0 + sum_{s<=t} omega_s
dt_s) mod 2 pi in C (``rotate_cpu.AnglesFn``, csrc/rotate_impl.h) against the torch form of
``mamba3_scan.angles`` (its twin: ``rotate_cpu.ANGLES_ENABLED = False``), values and
gradients in float64 (gradcheck too), omega broadcast over the heads as the layer passes it;
and a Mamba-3 layer's training step equal with the kernel on and off."""
from __future__ import annotations

import math

import pytest
import torch

from models.kernels import mamba3_scan as ms
from models.kernels import rotate_cpu as rc

F64 = torch.float64

needs_c = pytest.mark.skipif(rc.load()[0] is None, reason="rotation kernel not built")


def _inputs(b=2, L=37, h=3, R=5, dtype=F64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    omega = (torch.rand(b, L, 1, R, generator=gen, dtype=dtype) * 2 - 1) * math.pi * 3
    dt = torch.rand(b, L, h, generator=gen, dtype=dtype)
    theta0 = torch.randn(b, h, R, generator=gen, dtype=dtype) * 5
    return [t.requires_grad_() for t in (omega, dt, theta0)]


def _run(omega, dt, theta0, w):
    """The angles (through cos and sin: a 2 pi step at a floor boundary is no difference)
    and the gradients of a random functional of them."""
    b, L, _, R = omega.shape
    th = ms.angles(omega.expand(b, L, dt.shape[2], R), dt, theta0)
    cs = torch.stack([th.cos(), th.sin()])
    return [cs, *torch.autograd.grad((cs * w).sum(), [omega, dt, theta0])]


@needs_c
@pytest.mark.parametrize("L, h, R", [(37, 3, 5), (1, 2, 16), (130, 4, 16)])
def test_c_angles_equal_the_torch_form(L, h, R, monkeypatch):
    args = _inputs(L=L, h=h, R=R)
    w = torch.randn(2, 2, L, h, R, generator=torch.Generator().manual_seed(9), dtype=F64)
    calls = []
    apply = rc.AnglesFn.apply
    monkeypatch.setattr(rc.AnglesFn, "apply", lambda *a: calls.append(1) or apply(*a))
    monkeypatch.setattr(rc, "ANGLES_ENABLED", True)
    got = _run(*args, w)
    assert calls                           # the C form ran
    monkeypatch.setattr(rc, "ANGLES_ENABLED", False)
    want = _run(*args, w)
    assert len(calls) == 1                 # and the twin did not
    for i, (a, c) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, c, atol=1e-10, rtol=1e-9, msg=lambda m, i=i: f"result {i}: {m}")
    # the angles themselves are reduced to [0, 2 pi)
    th = ms.angles(args[0].expand(2, L, h, R), args[1], args[2])
    assert th.min() >= 0 and th.max() < 2 * math.pi


@needs_c
def test_c_angles_pass_gradcheck_and_float32_is_close():
    om, dt, th0 = (torch.randn(2, 9, 3, 4, dtype=F64, requires_grad=True),
                   torch.rand(2, 9, 3, dtype=F64, requires_grad=True),
                   torch.randn(2, 3, 4, dtype=F64, requires_grad=True))
    assert torch.autograd.gradcheck(lambda a, b, c: rc.AnglesFn.apply(a, b, c).sin(),
                                    (om, dt, th0))
    args = _inputs(L=50, h=4, R=8)
    w = torch.randn(2, 2, 50, 4, 8, generator=torch.Generator().manual_seed(3), dtype=F64)
    want = _run(*args, w)
    got = _run(*(a.detach().float().requires_grad_() for a in args), w.float())
    for a, c in zip(got, want):
        torch.testing.assert_close(a, c.float(), atol=2e-4, rtol=2e-4)


@needs_c
def test_mamba3_training_step_equal_with_the_c_angles_on_and_off(monkeypatch):
    import models

    torch.manual_seed(0)
    m = models.build("mamba3", d_model=32, n_layers=1).to(F64)
    x = torch.randn(2, 40, 32, dtype=F64)

    def step():
        m.zero_grad(set_to_none=True)
        y = m(x)
        (y * y).mean().backward()
        return [y, *(p.grad for p in m.parameters() if p.grad is not None)]
    monkeypatch.setattr(rc, "ANGLES_ENABLED", False)
    want = step()
    monkeypatch.setattr(rc, "ANGLES_ENABLED", True)
    calls = []
    apply = rc.AnglesFn.apply
    monkeypatch.setattr(rc.AnglesFn, "apply", lambda *a: calls.append(1) or apply(*a))
    got = step()
    assert calls                           # the layer's step took the C angles
    for i, (a, c) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, c, atol=1e-11, rtol=1e-9, msg=lambda m, i=i: f"tensor {i}: {m}")
