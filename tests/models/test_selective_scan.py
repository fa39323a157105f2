"""The selective scan: the fast torch backend against the sequential reference, and dispatch."""
from __future__ import annotations

import sys
import types

import pytest
import torch

from models.kernels import cpu_kernels, triton_kernels
from models.kernels import selective_scan as ss
from models.kernels import scan_compiled

F64 = torch.float64
# what "auto" picks for CUDA tensors when mamba-ssm is missing
AUTO_CUDA_WITHOUT_MAMBA_SSM = "triton" if triton_kernels.available("cuda") else "torch"


def make_inputs(batch=2, dim=5, state=3, length=37, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=dtype) * scale).requires_grad_()

    return dict(
        u=r(batch, dim, length),
        delta=r(batch, dim, length, scale=0.5),
        A=(-torch.rand(dim, state, generator=g, dtype=dtype) * 2 - 0.1).requires_grad_(),
        B=r(batch, state, length),
        C=r(batch, state, length),
        D=r(dim),
        z=r(batch, dim, length),
        delta_bias=r(dim),
        initial_state=r(batch, dim, state),
    )


def run(fn, inputs, use, softplus, last, **kw):
    """Run ``fn`` with the optional inputs named in ``use``; return outputs and all grads."""
    args = {k: v for k, v in inputs.items() if k in ("u", "delta", "A", "B", "C") or k in use}
    res = fn(**args, delta_softplus=softplus, return_last_state=last, **kw)
    outs = list(res) if last else [res]
    # a loss that weights every output element differently
    loss = sum((o * torch.linspace(-1, 2, o.numel(), dtype=o.dtype).view_as(o)).sin().sum() for o in outs)
    grads = torch.autograd.grad(loss, list(args.values()))
    return outs, dict(zip(args, grads))


def assert_close(a, b, rtol=1e-8):
    scale = a.abs().max().clamp_min(1e-30)
    assert ((a - b).abs().max() / scale).item() < rtol


def check_against_ref(fn, inputs, use, softplus, last, **kw):
    """``fn``'s outputs and every gradient equal the reference's to 1e-8 relative."""
    ref_out, ref_grads = run(ss.selective_scan_ref, inputs, use, softplus, last)
    out, grads = run(fn, inputs, use, softplus, last, **kw)
    for a, b in zip(ref_out, out):
        assert a.shape == b.shape
        assert_close(a, b)
    assert set(grads) == set(ref_grads)
    for name in ref_grads:
        assert_close(ref_grads[name], grads[name])


def check_time_major_strided_views(backend, device="cpu"):
    """``selective_scan_tm`` on slices of wider tensors (what the Mamba block's projections
    give: row strides != dim) equals the same on contiguous copies, and the reference;
    gradients reach the wide tensors the same way."""
    g = torch.Generator().manual_seed(3)
    b, L, d, N = 2, 19, 20, 4

    def t(*shape, grad=False):
        return torch.randn(*shape, generator=g, dtype=F64).to(device).requires_grad_(grad)

    xz, dbl = t(b, L, 2 * d, grad=True), t(b, L, 3 + 2 * N, grad=True)
    u, z = xz[..., :d], xz[..., d:]
    B, C = dbl[..., 3:3 + N], dbl[..., 3 + N:]
    delta, D, bias, w = t(b, L, d), t(d), t(d), t(b, L, d)
    A = -torch.rand(d, N, generator=g, dtype=F64).to(device) - 0.1

    def loss(u, z, B, C):
        out = ss.selective_scan_tm(u, delta, A, B, C, D, z, bias, True, backend=backend)
        return (out * w).sum(), out

    (l1, o1), (l2, o2) = loss(u, z, B, C), loss(*(x.contiguous() for x in (u, z, B, C)))
    assert_close(o1, o2, 1e-14)
    ref = ss.selective_scan_ref(u.transpose(1, 2), delta.transpose(1, 2), A, B.transpose(1, 2),
                                C.transpose(1, 2), D, z.transpose(1, 2), bias, True)
    assert_close(ref.transpose(1, 2), o1)
    for a, b_ in zip(torch.autograd.grad(l1, [xz, dbl]), torch.autograd.grad(l2, [xz, dbl])):
        assert_close(a, b_, 1e-14)


OPTION_SETS = [
    ((), False, False),
    (("D", "z", "delta_bias"), True, True),
    (("D",), True, False),
    (("z", "delta_bias"), False, True),
    (("D", "z", "delta_bias", "initial_state"), True, True),
    (("initial_state",), False, True),
]


@pytest.mark.parametrize("length", [1, 7, 8, 9, 33])
@pytest.mark.parametrize("use,softplus,last", OPTION_SETS)
def test_torch_matches_ref_forward_and_backward(length, use, softplus, last):
    inputs = make_inputs(length=length, seed=length)
    if not softplus:  # keep delta (+ bias) positive, as the scan expects without softplus
        for k in ("delta", "delta_bias"):
            inputs[k] = inputs[k].detach().abs().requires_grad_()
    check_against_ref(ss.selective_scan_torch, inputs, use, softplus, last, block_len=8)


def test_default_block_len_and_long_sequence():
    inputs = make_inputs(batch=1, dim=3, state=2, length=ss.DEFAULT_BLOCK_LEN * 2 + 5, seed=3)
    use = ("D", "z", "delta_bias")
    ref_out, ref_grads = run(ss.selective_scan_ref, inputs, use, True, True)
    out, grads = run(ss.selective_scan_torch, inputs, use, True, True)
    for a, b in zip(ref_out, out):
        assert_close(a, b)
    for name in ref_grads:
        assert_close(ref_grads[name], grads[name])


def test_ref_matches_direct_recurrence():
    """The reference itself, against the paper's recurrence written out with indices."""
    x = make_inputs(batch=1, dim=2, state=2, length=4, seed=5)
    u, delta, A, B, C = (x[k].detach() for k in ("u", "delta", "A", "B", "C"))
    out = ss.selective_scan_ref(u, delta, A, B, C, delta_softplus=True)
    dt = torch.nn.functional.softplus(delta)
    for d in range(2):
        h = torch.zeros(2, dtype=F64)
        for t in range(4):
            h = torch.exp(dt[0, d, t] * A[d]) * h + dt[0, d, t] * B[0, :, t] * u[0, d, t]
            assert torch.allclose(out[0, d, t], (C[0, :, t] * h).sum())


FAST_BACKENDS = ["torch", pytest.param("cpu", marks=pytest.mark.skipif(
    not cpu_kernels.available(), reason="CPU kernels unavailable"))]


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_chunks_with_initial_state_equal_one_pass(backend):
    x = make_inputs(length=70, seed=7)
    args = {k: x[k].detach() for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")}
    full, last = ss.selective_scan_fn(**args, delta_softplus=True, return_last_state=True,
                                      backend=backend)
    h, pieces = None, []
    for s, e in [(0, 6), (6, 7), (7, 40), (40, 70)]:
        part = {k: (v[..., s:e] if v.dim() == 3 else v) for k, v in args.items()}
        y, h = ss.selective_scan_fn(**part, delta_softplus=True, return_last_state=True,
                                    backend=backend, initial_state=h)
        pieces.append(y)
    assert_close(full, torch.cat(pieces, -1), 1e-12)
    assert_close(last, h, 1e-12)


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_float32_and_group_dimension(backend):
    x = make_inputs(length=40, seed=2, dtype=torch.float32)
    args = {k: x[k].detach() for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")}
    ref = ss.selective_scan_ref(**args, delta_softplus=True)
    fast = ss.selective_scan_fn(**args, delta_softplus=True, backend=backend)
    assert fast.dtype == torch.float32
    assert torch.allclose(ref, fast, atol=1e-5, rtol=1e-4)
    grouped = dict(args, B=args["B"][:, None], C=args["C"][:, None])  # (batch, 1, state, L)
    assert torch.allclose(ss.selective_scan_fn(**grouped, delta_softplus=True, backend=backend), fast)
    two_groups = dict(args, B=args["B"][:, None].expand(-1, 2, -1, -1), C=args["C"][:, None].expand(-1, 2, -1, -1))
    with pytest.raises(NotImplementedError):
        ss.selective_scan_fn(**two_groups, backend=backend)


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_bfloat16_inputs_are_scanned_in_float32(backend):
    x = make_inputs(length=10, seed=4, dtype=torch.float32)
    args = {k: x[k].detach() for k in ("u", "delta", "A", "B", "C")}
    out = ss.selective_scan_fn(**{k: v.bfloat16() for k, v in args.items()}, backend=backend)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), ss.selective_scan_ref(**args), atol=0.1, rtol=0.1)


# ---------------------------------------------------------------------------------------
# dispatch
# ---------------------------------------------------------------------------------------

@pytest.fixture
def fresh_cuda_cache(monkeypatch):
    """Forget any cached import result so a test can fake mamba-ssm's presence."""
    monkeypatch.setattr(ss, "_cuda_cache", {})


def test_auto_on_cpu_never_picks_the_slow_or_opt_in_backends():
    assert ss.choose_backend("auto", torch.device("cpu")) in ("cpu", "torch")
    assert ss.choose_backend("ref", "cpu") == "ref"


def test_forcing_cuda_without_it_is_a_clear_error():
    if ss.cuda_available():
        pytest.skip("this machine has the CUDA kernels")
    assert ss.cuda_unavailable_reason()
    x = make_inputs(length=4)
    args = {k: x[k].detach() for k in ("u", "delta", "A", "B", "C")}
    with pytest.raises(RuntimeError, match="'cuda' unavailable"):
        ss.selective_scan_fn(**args, backend="cuda")


def test_unknown_backend_is_an_error():
    x = make_inputs(length=4)
    with pytest.raises(ValueError, match="unknown selective-scan backend"):
        ss.selective_scan_fn(**{k: x[k].detach() for k in ("u", "delta", "A", "B", "C")}, backend="tritonn")


def test_cuda_kernel_chosen_for_cuda_tensors(monkeypatch, fresh_cuda_cache):
    calls = []

    def fake_kernel(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state):
        calls.append((D is not None, z is not None, delta_softplus, return_last_state))
        return torch.full_like(u, 7.0)

    monkeypatch.setattr(ss, "_load_cuda_scan", lambda: (fake_kernel, ""))
    monkeypatch.setattr(ss, "_device_of", lambda t: torch.device("cuda", 0))
    x = make_inputs(length=4)
    args = {k: x[k].detach() for k in ("u", "delta", "A", "B", "C", "D")}
    out = ss.selective_scan_fn(**args, delta_softplus=True, backend="auto")
    assert calls == [(True, False, True, False)] and torch.all(out == 7.0)
    assert ss.choose_backend("auto", "cuda") == "cuda"
    assert ss.choose_backend("auto", "cpu") != "cuda"            # CPU tensors never go to CUDA
    # mamba-ssm's kernel takes no h0: the Triton kernels (or torch) take over
    assert ss.choose_backend("auto", "cuda", initial_state=True) == AUTO_CUDA_WITHOUT_MAMBA_SSM
    assert ss.choose_backend("auto", "cuda") == "cuda"
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        ss.choose_backend("cuda", "cpu")
    # an explicit torch/ref request is honoured on CUDA too
    out = ss.selective_scan_fn(**args, backend="torch")
    assert len(calls) == 1 and not torch.all(out == 7.0)


def test_import_guard_catches_non_import_errors(monkeypatch, fresh_cuda_cache):
    """mamba-ssm raises arbitrary errors at import on machines without its extension."""

    class Boom(types.ModuleType):
        def __getattr__(self, name):
            raise OSError("libcudart.so: cannot open shared object file")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for mod in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.selective_scan_interface", "causal_conv1d"):
        monkeypatch.setitem(sys.modules, mod, Boom(mod))
    assert not ss.cuda_available()
    assert "OSError" in ss.cuda_unavailable_reason() and "libcudart" in ss.cuda_unavailable_reason()
    assert ss.causal_conv1d_cuda() is None
    assert ss.choose_backend("auto", "cuda") == AUTO_CUDA_WITHOUT_MAMBA_SSM


def test_no_cuda_device_reason(monkeypatch, fresh_cuda_cache):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ss.cuda_unavailable_reason() == "torch sees no CUDA device"


# ---------------------------------------------------------------------------------------
# backend "compiled": the same blocks as pure functions under torch.compile (opt-in)
# ---------------------------------------------------------------------------------------

def _fresh_kernels(monkeypatch):
    """Fresh lazily-compiled kernels, so one test's compile state does not leak into another."""
    monkeypatch.setattr(scan_compiled, "_compiled_forward", scan_compiled._Compiled(scan_compiled._block_forward))
    monkeypatch.setattr(scan_compiled, "_compiled_backward", scan_compiled._Compiled(scan_compiled._block_backward))


def _check_compiled_against_ref(length, block_len):
    check_against_ref(ss.selective_scan_torch, make_inputs(length=length, seed=length),
                      ("D", "z", "delta_bias", "initial_state"), True, True,
                      block_len=block_len, compiled=True)


def test_compiled_falls_back_to_eager_with_one_warning(monkeypatch):
    """No compiler: one RuntimeWarning, then the same pure block functions run eagerly, exact."""
    _fresh_kernels(monkeypatch)

    def broken_compile(*a, **k):
        raise RuntimeError("no C compiler found\nsecond line")

    monkeypatch.setattr(torch, "compile", broken_compile)
    with pytest.warns(RuntimeWarning, match="torch.compile of _block_forward failed"):
        _check_compiled_against_ref(length=11, block_len=4)  # blocks of 4, 4, 3
    assert scan_compiled._compiled_forward.failed and scan_compiled._compiled_backward.failed


@pytest.mark.slow
def test_compiled_matches_ref(monkeypatch):
    """Really compiled (cold: ~1 min on 2 cores, so marked slow). Blocks of 4 and a tail of 3."""
    _fresh_kernels(monkeypatch)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a silent eager fallback would fail here
        _check_compiled_against_ref(length=11, block_len=4)
    assert not scan_compiled._compiled_forward.failed and scan_compiled._compiled_forward.compiled is not None


def test_compiled_is_opt_in_only():
    assert ss.choose_backend("compiled", "cpu") == "compiled"
    assert ss.choose_backend("auto", "cpu") != "compiled"
    assert "compiled" in ss.BACKENDS
