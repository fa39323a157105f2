"""The Triton kernels of the Mamba block (backend "triton") against the sequential reference
and PyTorch's conv1d, outputs and every gradient.

On a machine without a GPU they run on CPU tensors through Triton's interpreter
(tests/conftest.py sets TRITON_INTERPRET=1 before anything imports them); on a CUDA machine
the same tests run the compiled kernels on the GPU. Shapes are small (the interpreter runs
every program of the grid in Python) but cross tile edges: chunks of SCAN_BT = 16 steps,
channel tiles of SCAN_BD = 16 (fewer above N = 16), state sizes that are not powers of two.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import models
from models.kernels import selective_scan as ss
from models.kernels import triton_kernels as tk
from test_selective_scan import (OPTION_SETS, assert_close,
                                       check_time_major_strided_views, make_inputs, run)

F64 = torch.float64
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

pytestmark = pytest.mark.skipif(
    not tk.available(DEVICE), reason=f"Triton kernels unavailable: {tk.unavailable_reason(DEVICE)}")


def on_device(inputs: dict) -> dict:
    return {k: v.detach().to(DEVICE).requires_grad_() for k, v in inputs.items()}


def check(inputs, use, softplus, last, rtol=1e-8, **kw):
    """Outputs and all gradients of backend "triton" equal the reference's (relative rtol)."""
    ref_out, ref_grads = run(ss.selective_scan_ref, inputs, use, softplus, last)
    out, grads = run(ss.selective_scan_fn, inputs, use, softplus, last, backend="triton", **kw)
    for a, b in zip(ref_out, out):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert_close(a.to(F64), b.to(F64), rtol)
    assert set(grads) == set(ref_grads)
    for name in ref_grads:
        assert grads[name].dtype == inputs[name].dtype, name
        assert_close(ref_grads[name].to(F64), grads[name].to(F64), rtol)


# ---------------------------------------------------------------------------------------
# the scan
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("length", [1, 16, 17, 40])
@pytest.mark.parametrize("use,softplus,last", OPTION_SETS)
def test_triton_scan_matches_ref_forward_and_backward(length, use, softplus, last):
    """float64, (batch, dim, L) layout (read and written in place through strides)."""
    inputs = on_device(make_inputs(length=length, seed=length))
    if not softplus:  # keep delta (+ bias) positive, as the scan expects without softplus
        for k in ("delta", "delta_bias"):
            inputs[k] = inputs[k].detach().abs().requires_grad_()
    check(inputs, use, softplus, last)


@pytest.mark.parametrize("dim,state", [(37, 16), (18, 5), (11, 40)])
def test_channel_tiles_and_state_padding(dim, state):
    """37 channels = two full tiles of 16 and a tail of 5; a state size of 5 is padded to 8;
    a state size of 40 is padded to 64, where the channel tile shrinks to 4 (11 = 4 + 4 + 3)."""
    if state == 40:
        assert tk.scan_tiles(state)[1:] == (tk.SCAN_BD * 16 // 64, 64)
    inputs = on_device(make_inputs(batch=2, dim=dim, state=state, length=35, seed=dim))
    check(inputs, ("D", "z", "delta_bias", "initial_state"), True, True)


def test_narrow_tiles_chosen_to_fill_a_gpu(monkeypatch):
    """As on a GPU whose SMs a small grid cannot fill (132 SMs, batch 2, 37 channels): the
    forward narrows to 2-channel tiles and the backward to 4 (its floor), different from
    each other and crossing the 37-channel edge; results as with the wide tiles."""
    monkeypatch.setattr(tk, "_TILE_PINNED", False)
    monkeypatch.setattr(tk, "sm_count", lambda t: 132)
    assert tk.scan_tiles(16, 2, 37, 132)[1] == 2
    assert tk.scan_tiles(16, 2, 37, 132, backward=True)[1] == 4
    inputs = on_device(make_inputs(batch=2, dim=37, state=16, length=35, seed=3))
    check(inputs, ("D", "z", "delta_bias", "initial_state"), True, True)


def test_float32_inputs_float32_state():
    inputs = on_device(make_inputs(length=40, seed=8, dtype=torch.float32))
    ref_inputs = {k: v.detach().double().requires_grad_() for k, v in inputs.items()}
    use = ("D", "z", "delta_bias", "initial_state")
    ref_out, ref_grads = run(ss.selective_scan_ref, ref_inputs, use, True, True)
    out, grads = run(ss.selective_scan_fn, inputs, use, True, True, backend="triton")
    assert out[0].dtype == torch.float32 and out[1].dtype == torch.float32
    for a, b in zip(ref_out, out):
        assert_close(a, b.double(), 1e-5)
    for name in ref_grads:
        assert grads[name].dtype == torch.float32
        assert_close(ref_grads[name], grads[name].double(), 1e-4)


def test_bfloat16_inputs_are_scanned_in_float32():
    x = make_inputs(length=20, seed=4, dtype=torch.float32)
    args = {k: x[k].detach().to(DEVICE) for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")}
    half = {k: v.bfloat16().requires_grad_() for k, v in args.items()}
    out = ss.selective_scan_fn(**half, delta_softplus=True, backend="triton")
    assert out.dtype == torch.bfloat16
    # the reference on the same (rounded) bfloat16 values, in float32
    ref = ss.selective_scan_ref(**{k: v.detach().float() for k, v in half.items()}, delta_softplus=True)
    assert torch.allclose(out.float(), ref, atol=0.05, rtol=0.02)
    out.float().sum().backward()
    for k, v in half.items():
        assert v.grad is not None and v.grad.dtype == torch.bfloat16 and torch.isfinite(v.grad.float()).all(), k


def test_time_major_strided_views_equal_contiguous_copies():
    """The Mamba block hands the kernel slices of projection outputs (row strides != dim)."""
    check_time_major_strided_views("triton", DEVICE)


def test_chunks_with_initial_state_equal_one_pass():
    """Streaming: the last state of one chunk starts the next (what mamba-ssm's kernel lacks)."""
    x = make_inputs(length=70, seed=7)
    args = {k: x[k].detach().to(DEVICE) for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")}
    full, last = ss.selective_scan_fn(**args, delta_softplus=True, return_last_state=True,
                                      backend="triton")
    h, pieces = None, []
    for s, e in [(0, 6), (6, 7), (7, 40), (40, 70)]:
        part = {k: (v[..., s:e] if v.dim() == 3 else v) for k, v in args.items()}
        y, h = ss.selective_scan_fn(**part, delta_softplus=True, return_last_state=True,
                                    backend="triton", initial_state=h)
        pieces.append(y)
    assert_close(full, torch.cat(pieces, -1), 1e-12)
    assert_close(last, h, 1e-12)


def test_nan_in_the_input_reaches_the_output_and_gradients():
    """The trainer stops a run on a NaN loss: the kernel must not swallow NaNs."""
    x = make_inputs(length=12, seed=5)
    args = {k: x[k].detach().clone().to(DEVICE) for k in ("u", "delta", "A", "B", "C", "D")}
    args["u"][0, 1, 3] = float("nan")
    inputs = {k: v.clone().requires_grad_() for k, v in args.items()}
    out = ss.selective_scan_fn(**inputs, delta_softplus=True, backend="triton")
    out.sum().backward()
    assert torch.isnan(out[0, 1, 3:]).all() and not torch.isnan(out[1]).any()
    assert torch.isnan(inputs["B"].grad).any()


def test_no_grad_forward_and_empty_sequences():
    x = make_inputs(length=9, seed=1)
    args = {k: x[k].detach().to(DEVICE) for k in ("u", "delta", "A", "B", "C")}
    with torch.no_grad():
        out = ss.selective_scan_fn(**args, backend="triton")
    assert_close(ss.selective_scan_ref(**args), out)
    h0 = x["initial_state"].detach().to(DEVICE)
    empty = {k: (v[..., :0] if v.dim() == 3 else v) for k, v in args.items()}
    out, last = ss.selective_scan_fn(**empty, backend="triton", return_last_state=True,
                                     initial_state=h0)
    assert out.shape == (2, 5, 0) and torch.equal(last, h0)


# ---------------------------------------------------------------------------------------
# the conv
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("silu", [True, False])
@pytest.mark.parametrize("with_left", [True, False])
def test_causal_conv_matches_conv1d(k, silu, with_left):
    g = torch.Generator().manual_seed(k)
    b, L, d = 2, 70, 37                                         # two time tiles, two channel tiles

    def t(*shape):
        return torch.randn(*shape, generator=g, dtype=F64).to(DEVICE).requires_grad_()

    xz, w, bias = t(b, L, 2 * d), t(d, 1, k), t(d)
    x = xz[..., :d]                                            # a strided view, as in Mamba
    left = t(b, k - 1, d) if with_left else None
    out = tk.CausalConv1dTriton.apply(x, w, bias, left, silu)
    padded = torch.cat([left if with_left else x.new_zeros(b, k - 1, d), x], 1)
    ref = F.conv1d(padded.transpose(1, 2), w, bias, groups=d).transpose(1, 2)
    ref = F.silu(ref) if silu else ref
    assert_close(ref, out, 1e-13)
    dout = torch.randn(b, L, d, generator=g, dtype=F64).to(DEVICE)
    ins = [xz, w, bias] + ([left] if with_left else [])
    for a, r in zip(torch.autograd.grad(out, ins, dout, allow_unused=True),
                    torch.autograd.grad(ref, ins, dout, allow_unused=True)):
        if r is None or not r.numel():                          # left is empty when k = 1
            continue
        assert a.shape == r.shape
        assert_close(r, a, 1e-13)


def test_causal_conv_float32_without_bias():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 20, 8, generator=g).to(DEVICE).requires_grad_()
    w = torch.randn(8, 1, 4, generator=g).to(DEVICE).requires_grad_()
    out = tk.CausalConv1dTriton.apply(x, w, None, None, True)
    ref = F.silu(F.conv1d(F.pad(x.transpose(1, 2), (3, 0)), w, None, groups=8)).transpose(1, 2)
    assert out.dtype == torch.float32
    assert torch.allclose(out, ref, atol=1e-5)
    (ga, gw), (ra, rw) = (torch.autograd.grad(o.sum(), [x, w]) for o in (out, ref))
    assert torch.allclose(ga, ra, atol=1e-5) and torch.allclose(gw, rw, atol=1e-4)


# ---------------------------------------------------------------------------------------
# the Mamba block on the Triton backend
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["mamba", "s6"])
def test_model_backend_triton_matches_ref(name):
    """Block conv and scan on Triton against "ref", outputs and parameter gradients."""
    torch.manual_seed(4)
    fast = models.build(name, d_model=8, n_layers=1, d_state=4, backend="triton").double().to(DEVICE)
    slow = models.build(name, d_model=8, n_layers=1, d_state=4, backend="ref").double().to(DEVICE)
    slow.load_state_dict(fast.state_dict())
    assert (fast.backend, slow.backend) == ("triton", "ref")
    x = torch.randn(2, 21, 8, dtype=F64).to(DEVICE)
    assert torch.allclose(fast(x), slow(x), atol=1e-12)
    fast(x).sin().sum().backward()
    slow(x).sin().sum().backward()
    for (n, p), q in zip(fast.named_parameters(), slow.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-10), n


def test_chunked_streaming_runs_on_triton_and_matches_forward():
    torch.manual_seed(2)
    m = models.build("mamba", d_model=8, n_layers=2, d_state=4, backend="triton").double().to(DEVICE)
    x = torch.randn(2, 30, 8, dtype=F64).to(DEVICE)
    with torch.no_grad():
        assert torch.allclose(m.forward_chunked(x, 7), m(x), atol=1e-12)


# ---------------------------------------------------------------------------------------
# dispatch
# ---------------------------------------------------------------------------------------

def test_auto_on_cuda_picks_triton_without_mamba_ssm(monkeypatch):
    monkeypatch.setattr(ss, "_load_cuda_scan", lambda: (None, "import mamba_ssm failed: test"))
    monkeypatch.setattr(tk, "unavailable_reason", lambda device=None: "")
    assert ss.choose_backend("auto", "cuda") == "triton"
    assert ss.choose_backend("auto", "cuda", initial_state=True) == "triton"
    assert ss.choose_backend("auto", "cpu") in ("cpu", "torch")         # never the interpreter
    monkeypatch.setattr(ss, "_load_cuda_scan", lambda: (object(), ""))
    assert ss.choose_backend("auto", "cuda") == "cuda"                  # mamba-ssm first
    assert ss.choose_backend("auto", "cuda", initial_state=True) == "triton"  # it takes no h0


def test_forcing_triton_where_it_cannot_run_says_why(monkeypatch):
    monkeypatch.setattr(tk, "interpreting", lambda: False)
    with pytest.raises(RuntimeError, match="'triton' unavailable: Triton kernels need CUDA tensors"):
        ss.choose_backend("triton", "cpu")
    monkeypatch.setattr(tk, "_module", None)
    monkeypatch.setattr(tk, "_import_error", "import triton failed: ModuleNotFoundError: no triton")
    monkeypatch.setattr(tk, "_load", lambda: None)
    assert "no triton" in ss.triton_unavailable_reason()
    assert ss.choose_backend("auto", "cpu") in ("cpu", "torch")
    with pytest.raises(RuntimeError, match="no triton"):
        ss.choose_backend("triton", "cuda")


def test_self_check_passes_and_catches_a_broken_kernel(monkeypatch):
    """On first CUDA use the kernels are checked on a tiny problem; a failure makes auto fall
    back to torch with the reason instead of failing the run."""
    assert tk.self_check(DEVICE) == ""
    real = tk.SelectiveScanTriton.apply

    def off_by_a_bit(*args):
        out, last = real(*args)
        return out * 1.01, last

    monkeypatch.setattr(tk.SelectiveScanTriton, "apply", off_by_a_bit)
    assert "disagree with the reference" in tk.self_check(DEVICE)

    def does_not_compile(*args):
        raise RuntimeError("PassManager::run failed")

    monkeypatch.setattr(tk.SelectiveScanTriton, "apply", does_not_compile)
    reason = tk.self_check(DEVICE)
    assert "failed" in reason and "PassManager" in reason
    # the cached verdict drives dispatch on CUDA
    monkeypatch.setattr(tk, "_self_check_result", reason)
    monkeypatch.setattr(tk, "interpreting", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ss, "_load_cuda_scan", lambda: (None, "no mamba-ssm"))
    assert tk.unavailable_reason("cuda") == reason
    assert ss.choose_backend("auto", "cuda") == "torch"
    monkeypatch.setenv("SSM_WORKBENCH_NO_TRITON", "1")
    assert tk.unavailable_reason("cpu") == "disabled by SSM_WORKBENCH_NO_TRITON"

