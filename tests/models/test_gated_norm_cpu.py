"""The gated RMS norm's C kernel (``models.kernels.gated_norm_cpu``, issue 43) equals the
unfused arithmetic, values and gradients: the kernel against its reference (gradcheck in
float64, float32 to ~1e-5), and the modules that dispatch to it (Mamba-2's GatedRMSNorm,
group-wise, gate before norm; the linear RNNs' GatedHeadRMSNorm, per head, norm before
gate) against their own torch forms, with the kernel spied on so a silent fallback fails."""
from __future__ import annotations

import pytest
import torch

from models.kernels import gated_norm_cpu as gn
from models.linear_rnn.linear_mixers import GatedHeadRMSNorm
from models.ssm.mamba2 import GatedRMSNorm, Mamba2

F64 = torch.float64

pytestmark = pytest.mark.skipif(gn.load()[0] is None, reason="no C compiler: " + gn.load()[1])


def _spy(monkeypatch) -> list:
    calls = []
    fwd = gn.GatedRMSNormFn.forward
    monkeypatch.setattr(gn.GatedRMSNormFn, "forward",
                        staticmethod(lambda ctx, *a: calls.append(a[4:]) or fwd(ctx, *a)))
    return calls


def _inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=dtype)
    z = 3 * torch.randn(shape, generator=g, dtype=dtype)        # the gate's tails too
    w = 1 + 0.3 * torch.randn(shape[-1], generator=g, dtype=dtype)
    return [t.requires_grad_() for t in (x, z, w)]


def _value_and_grads(fn, x, z, w, seed=1):
    out = fn(x, z, w)
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return [out.detach(), *torch.autograd.grad((out * dy).sum(), [x, z, w])]


@pytest.mark.parametrize("norm_before_gate", [False, True])
@pytest.mark.parametrize("sigmoid", [False, True])
@pytest.mark.parametrize("group_size", [4, 12])
def test_kernel_gradcheck_float64(norm_before_gate, sigmoid, group_size):
    x, z, w = _inputs((2, 5, 12), F64)
    fn = lambda a, b, c: gn.GatedRMSNormFn.apply(a, b, c, 1e-5, group_size,
                                                 norm_before_gate, sigmoid)
    assert torch.autograd.gradcheck(fn, (x, z, w))


@pytest.mark.parametrize("norm_before_gate", [False, True])
@pytest.mark.parametrize("sigmoid", [False, True])
@pytest.mark.parametrize("dtype,atol", [(F64, 1e-12), (torch.float32, 1e-5)])
def test_kernel_equals_reference(norm_before_gate, sigmoid, dtype, atol):
    """Rows in several items (the weight's partial sums), groups of 16 in 48, float64 and
    float32 (the inlined exp of the float32 sigmoid)."""
    x, z, w = _inputs((3, 70, 48), dtype)
    args = (1e-5, 16, norm_before_gate, sigmoid)
    got = _value_and_grads(lambda a, b, c: gn.GatedRMSNormFn.apply(a, b, c, *args), x, z, w)
    want = _value_and_grads(lambda a, b, c: gn.gated_rms_norm_ref(a, b, c, *args), x, z, w)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=atol, rtol=atol)


def test_kernel_reads_strided_rows():
    """x and z as slices of a wider tensor (a projection's output: rows at a stride), and
    a transposed gradient: read in place, same numbers as contiguous copies."""
    base = torch.randn(2, 9, 40, dtype=F64)
    x = base[..., :16].requires_grad_(False)
    z = base[..., 20:36]
    w = torch.randn(16, dtype=F64)
    x, z, w = (t.clone().requires_grad_() if t is w else t for t in (x, z, w))
    xs, zs = x.detach().requires_grad_(), z.detach().requires_grad_()
    xc, zc = xs.detach().contiguous().requires_grad_(), zs.detach().contiguous().requires_grad_()
    dy = torch.randn(16, 9, 2, dtype=F64).permute(2, 1, 0)
    out = gn.GatedRMSNormFn.apply(xs, zs, w, 1e-5, 8, False, False)
    got = torch.autograd.grad(out, [xs, zs], dy)
    want_out = gn.gated_rms_norm_ref(xc, zc, w, 1e-5, 8)
    want = torch.autograd.grad(want_out, [xc, zc], dy)
    torch.testing.assert_close(out, want_out, atol=1e-12, rtol=1e-10)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("d,group_size", [(32, 32), (32, 8)])
@pytest.mark.parametrize("dtype,atol", [(F64, 1e-12), (torch.float32, 1e-5)])
def test_mamba2_gated_rms_norm_dispatches_and_equals_torch_form(d, group_size, dtype, atol,
                                                                monkeypatch):
    torch.manual_seed(0)
    m = GatedRMSNorm(d, group_size).to(dtype)
    with torch.no_grad():
        m.weight.add_(0.3 * torch.randn(d, dtype=dtype))
    x, z, _ = _inputs((2, 33, d), dtype)
    calls = _spy(monkeypatch)
    got = _value_and_grads(lambda a, b, c: m(a, b), x, z, m.weight)
    assert calls == [(group_size, False, False)]
    monkeypatch.setattr(gn, "ENABLED", False)
    want = _value_and_grads(lambda a, b, c: m(a, b), x, z, m.weight)
    assert len(calls) == 1                                    # the torch form this time
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=atol, rtol=atol)


@pytest.mark.parametrize("dtype,atol", [(F64, 1e-12), (torch.float32, 1e-5)])
def test_gated_head_rms_norm_dispatches_and_equals_torch_form(dtype, atol, monkeypatch):
    torch.manual_seed(0)
    m = GatedHeadRMSNorm(16).to(dtype)
    with torch.no_grad():
        m.weight.add_(0.3 * torch.randn(16, dtype=dtype))
    x, z, _ = _inputs((2, 21, 3, 16), dtype)
    calls = _spy(monkeypatch)
    got = _value_and_grads(lambda a, b, c: m(a, b), x, z, m.weight)
    assert calls == [(16, True, False)]
    monkeypatch.setattr(gn, "ENABLED", False)
    want = _value_and_grads(lambda a, b, c: m(a, b), x, z, m.weight)
    assert len(calls) == 1
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=atol, rtol=atol)


@pytest.mark.parametrize("whole", [True, False])
def test_mamba2_layer_same_with_and_without_the_kernel(whole, monkeypatch):
    """A Mamba-2 layer (two groups), its whole path and its sliced recomputed path (which
    calls the norm inside the recomputed piece), float64: output and every gradient the
    same with the kernel (spied) and without it."""
    from models import common
    from models.ssm import mamba2

    monkeypatch.setattr(common, "SLICE_LEN", 8)
    if not whole:
        monkeypatch.setattr(mamba2, "WHOLE_MAX_BYTES", 0)
    torch.manual_seed(1)
    m = Mamba2(16, d_state=8, headdim=8, ngroups=2, backend="cpu").double()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn(p.shape, dtype=F64))
    u = torch.randn(2, 29, 16, dtype=F64, requires_grad=True)

    def run():
        out = m(u)
        m.zero_grad(set_to_none=True)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=F64)
        (gu,) = torch.autograd.grad((out * g).sum(), [u], retain_graph=True)
        (out * g).sum().backward()
        return [out.detach(), gu] + [p.grad for p in m.parameters()]

    calls = _spy(monkeypatch)
    got = run()
    assert calls
    monkeypatch.setattr(gn, "ENABLED", False)
    n = len(calls)
    want = run()
    assert len(calls) == n
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9)


def test_applies_only_to_cpu_float32_float64_without_autocast():
    x = torch.randn(2, 8)
    w = torch.ones(8)
    assert gn.applies(x, x, w)
    assert gn.applies(x.double(), x.double(), w.double())
    assert not gn.applies(x.bfloat16(), x.bfloat16(), w.bfloat16())
    assert not gn.applies(x, x.double(), w)                 # mixed dtypes
    assert not gn.applies(x, x[:1], w)                      # a broadcast gate
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not gn.applies(x, x, w)


def test_skip_gate_gradcheck_float64():
    g = torch.Generator().manual_seed(0)
    y, x, z = (torch.randn(2, 5, 3, 4, generator=g, dtype=F64).requires_grad_() for _ in range(3))
    D = torch.randn(3, generator=g, dtype=F64).requires_grad_()
    assert gn.skip_gate_applies(y, x, z, D)
    assert torch.autograd.gradcheck(gn.skip_gate, (y, x, z, D))


@pytest.mark.parametrize("dtype,atol", [(F64, 1e-12), (torch.float32, 1e-5)])
def test_skip_gate_equals_reference_on_strided_views(dtype, atol):
    """x and z as head views of slices of one wider tensor (in_proj's output), rows in
    several items (D's partial sums)."""
    g = torch.Generator().manual_seed(0)
    proj = torch.randn(3, 70, 80, generator=g, dtype=dtype)
    y = torch.randn(3, 70, 4, 8, generator=g, dtype=dtype).requires_grad_()
    x = proj[..., 3:35].unflatten(-1, (4, 8)).detach().requires_grad_()
    z = (3 * proj[..., 40:72]).unflatten(-1, (4, 8)).detach().requires_grad_()
    D = torch.randn(4, generator=g, dtype=dtype).requires_grad_()
    dout = torch.randn(3, 70, 4, 8, generator=g, dtype=dtype)
    got = gn.skip_gate(y, x, z, D)
    want = gn.skip_gate_ref(y, x, z, D)
    gg = torch.autograd.grad(got, [y, x, z, D], dout)
    gw = torch.autograd.grad(want, [y, x, z, D], dout)
    for a, b in zip([got, *gg], [want, *gw]):
        torch.testing.assert_close(a, b, atol=atol, rtol=atol)


def test_mamba3_layer_same_with_and_without_the_skip_gate_kernel(monkeypatch):
    """Mamba-3's training forward takes the fused skip gate (spied): output and every
    gradient as with the recomputed torch gate, float64."""
    from models.ssm.mamba3 import Mamba3

    torch.manual_seed(1)
    m = Mamba3(16, d_state=8, headdim=8, backend="cpu").double()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn(p.shape, dtype=F64))
    u = torch.randn(2, 29, 16, dtype=F64, requires_grad=True)

    def run():
        u.grad = None
        out = m(u)
        m.zero_grad(set_to_none=True)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=F64)
        (out * g).sum().backward()
        return [out.detach(), u.grad.clone()] + [p.grad for p in m.parameters()]

    calls = []
    fwd = gn.SkipGateFn.forward
    monkeypatch.setattr(gn.SkipGateFn, "forward",
                        staticmethod(lambda ctx, *a: calls.append(1) or fwd(ctx, *a)))
    got = run()
    assert calls
    monkeypatch.setattr(gn, "ENABLED", False)
    n = len(calls)
    want = run()
    assert len(calls) == n
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9)


def test_fallback_matches_the_torch_forms_in_half_precision():
    """gated_rms_norm off the kernel (bfloat16) is the arithmetic of the forms it stands for:
    rms_norm(x) * silu(z) per head, Mamba-2's GatedRMSNorm group-wise."""
    from models.common import rms_norm

    g = torch.Generator().manual_seed(0)
    x, z = (torch.randn(2, 7, 16, generator=g).bfloat16() for _ in range(2))
    w = (1 + 0.3 * torch.randn(16, generator=g)).bfloat16()
    assert not gn.applies(x, z, w)
    torch.testing.assert_close(gn.gated_rms_norm(x, z, w, 1e-5, None, True),
                               rms_norm(x, w, 1e-5) * torch.nn.functional.silu(z), atol=0, rtol=0)
    m = GatedRMSNorm(16, 8).bfloat16()
    with torch.no_grad():
        m.weight.copy_(w)
    torch.testing.assert_close(gn.gated_rms_norm(x, z, w, m.eps, 8), m(x, z), atol=0, rtol=0)


@pytest.mark.parametrize("layer", ["gated_deltanet", "kda"])
def test_delta_rule_output_piece_same_with_and_without_the_kernel(layer, monkeypatch):
    """Gated DeltaNet's (silu gate) and KDA's (sigmoid gate) output piece takes the kernel in
    training (spied: one call a forward, the gate named), float64: output and every gradient
    the same without it."""
    from models.linear_rnn.delta_mixers import GatedDeltaNet
    from models.linear_rnn.dplr_mixers import KimiDeltaAttention as KDA

    torch.manual_seed(3)
    m = (GatedDeltaNet if layer == "gated_deltanet" else KDA)(16, n_heads=2, backend="torch").double()
    u = torch.randn(2, 13, 16, dtype=F64, requires_grad=True)

    def run():
        out = m(u)
        m.zero_grad(set_to_none=True)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=F64)
        (out * g).sum().backward()
        return [out.detach(), u.grad.clone()] + [p.grad for p in m.parameters() if p.grad is not None]

    calls = _spy(monkeypatch)
    got = run()
    assert calls and calls[0][1:] == (True, layer == "kda"), calls   # (norm first, sigmoid gate)
    u.grad = None
    monkeypatch.setattr(gn, "ENABLED", False)
    n = len(calls)
    want = run()
    assert len(calls) == n
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9)
