"""The Mamba-2 mixer (models/ssm/mamba2.py) and its registry entry ``mamba2``.

Shape, gradients and causality of the entry are checked by tests/models/test_registry_contract.py
(``-k mamba2``). Here: an independent naive Mamba-2 (explicit per-head recurrence), the
three ways of running a sequence (forward, chunks with carried state, token steps),
backends, the state's size and layout, init and option errors.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import models
from models.ssm import mamba2 as m2
from models.kernels import cpu_kernels
from models.kernels.linear_rnn_backends import BackendError
from models.ssm.mamba2 import Mamba2

F64 = torch.float64


def _randomise(m: Mamba2, seed: int = 0) -> Mamba2:
    """Move the parameters away from their init (D = 1, norm weight = 1, ...) so that a
    term that is dropped or has the wrong sign shows in the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
        m.A_log.copy_(torch.empty(m.nheads, dtype=m.A_log.dtype).uniform_(0.0, 1.5, generator=g))
        m.dt_bias.copy_(torch.empty(m.nheads, dtype=m.A_log.dtype).uniform_(-3.0, 0.0, generator=g))
    return m


def _mixer(seed=0, d_model=16, **kw) -> Mamba2:
    torch.manual_seed(seed)
    kw = {"d_state": 8, "headdim": 8, **kw}
    return _randomise(Mamba2(d_model, **kw).double(), seed)


def naive_mamba2(m: Mamba2, u: torch.Tensor) -> torch.Tensor:
    """Mamba-2 from its definition (Dao & Gu 2024; mamba-ssm Mamba2.step), loops over
    time and heads, state h (headdim, d_state) as mamba-ssm stores it:

        h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T,   y_t = h_t C_t + D x_t,
        out = out_proj(rmsnorm_per_group(y * silu(z)) * w)
    """
    b, L, _ = u.shape
    H, P, N, G, K = m.nheads, m.headdim, m.d_state, m.ngroups, m.d_conv
    di = m.d_inner
    zxbcdt = u @ m.in_proj.weight.T
    if m.in_proj.bias is not None:
        zxbcdt = zxbcdt + m.in_proj.bias
    z, xBC, dt_raw = zxbcdt[..., :di], zxbcdt[..., di:di + m.conv_dim], zxbcdt[..., di + m.conv_dim:]
    w = m.conv1d.weight[:, 0, :]                                   # (conv_dim, K)
    conv = torch.zeros_like(xBC)
    for t in range(L):
        for j in range(K):
            s = t - (K - 1) + j
            if s >= 0:
                conv[:, t] += w[:, j] * xBC[:, s]
    if m.conv1d.bias is not None:
        conv = conv + m.conv1d.bias
    xBC = conv * torch.sigmoid(conv)
    x = xBC[..., :di].reshape(b, L, H, P)
    Bm = xBC[..., di:di + G * N].reshape(b, L, G, N)
    Cm = xBC[..., di + G * N:].reshape(b, L, G, N)
    dt = torch.log1p(torch.exp(dt_raw + m.dt_bias))                # softplus, (b, L, H)
    A = -torch.exp(m.A_log)
    ys = torch.zeros(b, L, H, P, dtype=u.dtype)
    for hd in range(H):
        grp = hd // (H // G)
        h = torch.zeros(b, P, N, dtype=u.dtype)
        for t in range(L):
            d = dt[:, t, hd][:, None, None]
            h = torch.exp(d * A[hd]) * h + d * x[:, t, hd][:, :, None] * Bm[:, t, grp][:, None, :]
            ys[:, t, hd] = (h @ Cm[:, t, grp][:, :, None])[..., 0] + m.D[hd] * x[:, t, hd]
    y = ys.reshape(b, L, di) * (z * torch.sigmoid(z))
    yg = y.reshape(b, L, G, di // G)
    yg = yg / torch.sqrt(yg.pow(2).mean(-1, keepdim=True) + 1e-5)
    out = yg.reshape(b, L, di) * m.norm.weight
    out = out @ m.out_proj.weight.T
    return out if m.out_proj.bias is None else out + m.out_proj.bias


@pytest.mark.parametrize("kw", [{}, {"ngroups": 2, "bias": True}, {"d_conv": 2, "expand": 1}])
def test_matches_a_naive_per_head_recurrence(kw):
    m = _mixer(**kw)
    u = torch.randn(2, 19, 16, dtype=F64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = naive_mamba2(m, u)
        for backend in ("torch", "ref"):
            m.backend_choice = backend
            assert torch.allclose(m(u), expected, atol=1e-11, rtol=1e-9), backend


def test_pure_torch_conv_matches_the_c_kernel_and_the_naive(monkeypatch):
    """The conv's fallback (no C kernel: other devices, half precision) is the same conv."""
    m = _mixer(d_conv=3)
    u = torch.randn(2, 11, 16, dtype=F64, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        y = m(u)
        s = m.init_state(2)
        _, s = m.forward_with_state(u[:, :4], s)
        y_tail = m.forward_with_state(u[:, 4:], s)[0]
        monkeypatch.setattr(cpu_kernels, "available", lambda: False)
        assert torch.allclose(m(u), y, atol=1e-12)
        assert torch.allclose(m.forward_with_state(u[:, 4:], s)[0], y_tail, atol=1e-12)
        assert torch.allclose(y, naive_mamba2(m, u), atol=1e-11)


def _pieces(u, sizes):
    out, start = [], 0
    for s in sizes:
        out.append(u[:, start:start + s])
        start += s
    assert start == u.shape[1]
    return out


@pytest.mark.parametrize("kw", [{}, {"ngroups": 2}, {"d_conv": 1}])
def test_forward_equals_chunks_equals_steps(kw):
    m = _mixer(chunk_size=16, **kw)
    L = 70
    u = torch.randn(2, L, 16, dtype=F64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        y = m(u)
        state, ys = m.init_state(2), []
        for piece in _pieces(u, [1, 2, 17, 0, 33, 17]):
            yp, state = m.forward_with_state(piece, state)
            ys.append(yp)
        assert torch.allclose(torch.cat(ys, 1), y, atol=1e-12, rtol=1e-10)
        chunk_final = state
        state, ys = m.init_state(2), []
        for u_t in u.unbind(1):
            yt, state = m.step(u_t, state)
            ys.append(yt)
        assert torch.allclose(torch.stack(ys, 1), y, atol=1e-12, rtol=1e-10)
        for a, b in zip(state, chunk_final):  # the same state, whichever way it was reached
            assert a.shape == b.shape and torch.allclose(a, b, atol=1e-12)


def test_backbone_forward_chunked_and_step_equal_forward():
    torch.manual_seed(0)
    for channel_mixer in ("none", "swiglu"):
        m = models.build("mamba2", d_model=16, n_layers=2, d_state=8, headdim=8,
                         channel_mixer=channel_mixer).double().eval()
        u = torch.randn(2, 20, 16, dtype=F64)
        with torch.no_grad():
            y = m(u)
            # the stack's RMSNorm rounds through float32, hence 1e-6 rather than 1e-12
            assert torch.allclose(m.forward_chunked(u, 7), y, atol=1e-6)
            state, ys = m.init_state(2), []
            for u_t in u.unbind(1):
                yt, state = m.step(u_t, state)
                ys.append(yt)
            assert torch.allclose(torch.stack(ys, 1), y, atol=1e-6)


def test_backend_ref_equals_torch_outputs_and_gradients(monkeypatch):
    m = _mixer(ngroups=2, chunk_size=8)
    u = torch.randn(2, 37, 16, dtype=F64, generator=torch.Generator().manual_seed(5))
    ops, get_op = [], m2.lrb.get_op
    monkeypatch.setattr(m2.lrb, "get_op", lambda *a: ops.append(get_op(*a)[0].__name__) or get_op(*a))
    res = {}
    for backend in ("torch", "ref"):
        m.backend_choice = backend
        m.zero_grad(set_to_none=True)
        y = m(u)
        assert m.backend == backend
        assert ops.pop() == {"torch": "simple_gla", "ref": "simple_gla_ref"}[backend]
        (y * torch.linspace(-1, 1, y.numel(), dtype=F64).view_as(y)).sum().backward()
        res[backend] = (y.detach(), {n: p.grad.clone() for n, p in m.named_parameters()})
    assert torch.allclose(res["torch"][0], res["ref"][0], atol=1e-12, rtol=1e-10)
    for n, g in res["torch"][1].items():
        assert torch.allclose(g, res["ref"][1][n], atol=1e-10, rtol=1e-8), n


def test_state_size_is_the_numel_of_the_state():
    m = Mamba2(16, d_state=8, headdim=8, ngroups=2)
    conv, ssm = m.init_state(3)
    assert conv.shape == (3, m.conv_dim, m.d_conv - 1)
    assert ssm.shape == (3, m.nheads, m.d_state, m.headdim)  # operator layout (key=N, value=P)
    assert m.state_size() == (conv.numel() + ssm.numel()) // 3
    _, (conv2, ssm2) = m.forward_with_state(torch.randn(3, 5, 16), (conv, ssm))
    assert conv2.shape == conv.shape and ssm2.shape == ssm.shape
    stack = models.build("mamba2", d_model=16, n_layers=3, d_state=8, headdim=8)
    assert models.state_size(stack) == sum(t.numel() for s in stack.init_state(1) for t in s)


def test_gradients_finite_in_float32_at_large_decays():
    # dt = 1 and A up to -16: log-gates of -16 per step sum to -1000 within a chunk of 64
    torch.manual_seed(0)
    m = Mamba2(16, d_state=8, headdim=8, dt_min=1.0, dt_max=1.0, dt_init_floor=1.0)
    u = torch.randn(2, 70, 16, requires_grad=True)
    y = m(u)
    y.square().sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(u.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())
    m.backend_choice = "ref"
    with torch.no_grad():
        assert torch.allclose(m(u), y, atol=1e-5)


def test_parameter_names_shapes_and_optimiser_flags_follow_mamba_ssm():
    # mamba-ssm Mamba2(d_model=16, d_state=8, headdim=8): d_inner 32, 4 heads, conv_dim 48
    m = Mamba2(16, d_state=8, headdim=8)
    assert {n: tuple(p.shape) for n, p in m.named_parameters()} == {
        "in_proj.weight": (2 * 32 + 2 * 8 + 4, 16), "conv1d.weight": (48, 1, 4),
        "conv1d.bias": (48,), "dt_bias": (4,), "A_log": (4,), "D": (4,),
        "norm.weight": (32,), "out_proj.weight": (16, 32)}
    flagged = {n for n, p in m.named_parameters() if getattr(p, "_no_weight_decay", False)}
    assert flagged == {"dt_bias", "A_log", "D"}


def test_init_ranges():
    torch.manual_seed(0)
    m = Mamba2(256, headdim=8, dt_min=0.002, dt_max=0.05)       # 64 heads
    a = torch.exp(m.A_log)
    assert a.min() >= 1 and a.max() <= 16 and a.max() - a.min() > 5
    dt = F.softplus(m.dt_bias)
    assert dt.min() >= 0.002 * (1 - 1e-5) and dt.max() <= 0.05 * (1 + 1e-5) and dt.max() / dt.min() > 5
    assert torch.all(m.D == 1)
    floored = F.softplus(Mamba2(16, headdim=8, dt_min=1e-6, dt_max=2e-6, dt_init_floor=1e-3).dt_bias)
    assert torch.allclose(floored, torch.full_like(floored, 1e-3), rtol=1e-4)
    # the entry shrinks out_proj by 1/sqrt(n_layers), as the mamba entry does
    torch.manual_seed(1)
    one = models.build("mamba2", d_model=16, n_layers=1).layers[0].mixer.out_proj.weight
    torch.manual_seed(1)
    four = models.build("mamba2", d_model=16, n_layers=4).layers[0].mixer.out_proj.weight
    assert torch.allclose(four * 2, one)
    assert models.entry("mamba2").family == "ssm" and models.entry("mamba2").init == "mamba"


@pytest.mark.parametrize("kw, name", [
    ({"backend": "cuda_please"}, "cuda_please"),
    ({"headdim": 24}, "headdim"),          # d_inner 32
    ({"ngroups": 3}, "ngroups"),           # 4 heads
    ({"headdim": 0}, "headdim"),
    ({"chunk_size": 0}, "chunk_size"),
    ({"dt_min": 0.5, "dt_max": 0.1}, "dt_min"),
])
def test_bad_options_are_value_errors_naming_them(kw, name):
    with pytest.raises(ValueError, match=name):
        Mamba2(16, d_state=8, **kw)
    with pytest.raises(ValueError, match=name):
        models.build("mamba2", d_model=16, n_layers=1, d_state=8, **kw)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
@pytest.mark.parametrize("backend", ["mamba_ssm", "fla"])
def test_gpu_backends_without_a_gpu_are_clear_errors(backend):
    with pytest.raises(BackendError, match=backend):
        Mamba2(16, backend=backend)


def test_auto_resolves_to_the_c_kernels_on_cpu():
    from models.kernels import linear_rnn_cpu

    want = "cpu" if linear_rnn_cpu.available() else "torch"
    m = Mamba2(16)
    assert m.backend == want
    m(torch.randn(1, 3, 16))
    assert m.backend == want
    assert m2.resolve_backend("auto", "cpu") == want
    assert models.backend(models.build("mamba2", d_model=16, n_layers=1)) == want


def test_cpu_backend_equals_torch_backend():
    from models.kernels import linear_rnn_cpu

    if not linear_rnn_cpu.available():
        pytest.skip(f"no C kernels: {linear_rnn_cpu.unavailable_reason()}")
    torch.manual_seed(0)
    a, b = Mamba2(16, backend="torch").double(), Mamba2(16, backend="cpu").double()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 70, 16, dtype=torch.float64, requires_grad=True)
    ya, yb = a(x), b(x)
    torch.testing.assert_close(yb, ya, atol=1e-10, rtol=1e-9)
    ga = torch.autograd.grad(ya.square().sum(), [x, *a.parameters()])
    gb = torch.autograd.grad(yb.square().sum(), [x, *b.parameters()])
    for u, w in zip(ga, gb):
        torch.testing.assert_close(w, u, atol=1e-9, rtol=1e-8)


def _fake_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                              initial_states=None, dt_softplus=False, return_final_states=False):
    """mamba-ssm's mamba_chunk_scan_combined as its docstring states it, as a loop:
    x (b, l, h, p), dt (b, l, h), A (h,), B, C (b, l, g, n), D (h,),
    initial_states / final states (b, h, p, n)."""
    b, L, H, P = x.shape
    G, N = B.shape[2:]
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = F.softplus(dt)
    h = torch.zeros(b, H, P, N, dtype=x.dtype) if initial_states is None else initial_states.clone()
    Bh, Ch = (t.repeat_interleave(H // G, dim=2) for t in (B, C))
    ys = []
    for t in range(L):
        h = torch.exp(dt[:, t] * A)[..., None, None] * h \
            + dt[:, t][..., None, None] * x[:, t][..., None] * Bh[:, t][:, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", h, Ch[:, t]) + D[:, None] * x[:, t])
    y = torch.stack(ys, 1)
    return (y, h) if return_final_states else y


def test_mamba_ssm_path_passes_its_arguments_in_its_layout(monkeypatch):
    """The mamba_ssm branch (CUDA only) run on CPU against a loop of the documented
    interface: catches a transposed state, a missing dt_bias / D or swapped B and C."""
    monkeypatch.setattr(m2, "mamba_ssm_status", lambda: (_fake_chunk_scan_combined, "fake"))
    monkeypatch.setattr(m2, "resolve_backend", lambda b, dev: "mamba_ssm" if b == "mamba_ssm" else "torch")
    m = _mixer(ngroups=2, d_state=6)
    u = torch.randn(2, 23, 16, dtype=F64, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        m.backend_choice = "torch"
        y = m(u)
        s = m.init_state(2)
        for piece in _pieces(u, [9, 14]):
            _, s = m.forward_with_state(piece, s)
        m.backend_choice = "mamba_ssm"
        assert torch.allclose(m(u), y, atol=1e-12)
        assert m.backend == "mamba_ssm"
        st, ys = m.init_state(2), []
        for piece in _pieces(u, [9, 14]):
            yp, st = m.forward_with_state(piece, st)
            ys.append(yp)
        assert torch.allclose(torch.cat(ys, 1), y, atol=1e-12)
        assert st[1].shape == s[1].shape and torch.allclose(st[1], s[1], atol=1e-12)
