"""The C kernels of the Mamba block (backend "cpu"): the fused selective scan and the causal
conv, against the sequential reference and PyTorch's conv1d; building, caching, fallback."""
from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from models.kernels import cpu_kernels
from models.kernels import selective_scan as ss
from test_selective_scan import (OPTION_SETS, assert_close, check_against_ref,
                                       check_time_major_strided_views, make_inputs, run)

F64 = torch.float64

needs_kernel = pytest.mark.skipif(not cpu_kernels.available(),
                                  reason=f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")


def _positive_delta(inputs):
    for k in ("delta", "delta_bias"):
        inputs[k] = inputs[k].detach().abs().requires_grad_()
    return inputs


# ---------------------------------------------------------------------------------------
# the scan
# ---------------------------------------------------------------------------------------

@needs_kernel
@pytest.mark.parametrize("length", [1, 31, 32, 33, 70])
@pytest.mark.parametrize("use,softplus,last", OPTION_SETS)
def test_cpu_scan_matches_ref_forward_and_backward(length, use, softplus, last):
    """float64 to 1e-8 relative, every output and gradient; lengths around the chunk (32)."""
    inputs = make_inputs(length=length, seed=length)
    if not softplus:
        _positive_delta(inputs)
    check_against_ref(ss.selective_scan_fn, inputs, use, softplus, last, backend="cpu")


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
def test_many_tiles_and_channel_groups(threads):
    """37 channels = two full tiles of 16 and a tail of 5; batch 3 with 2 threads splits each
    batch row into channel groups whose dB / dC partial sums are added up."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        inputs = make_inputs(batch=3, dim=37, state=16, length=45, seed=11)
        check_against_ref(ss.selective_scan_fn, inputs, ("D", "z", "delta_bias", "initial_state"),
                          True, True, backend="cpu")
    finally:
        torch.set_num_threads(before)


@needs_kernel
def test_results_do_not_depend_on_thread_count():
    inputs = make_inputs(batch=2, dim=40, state=4, length=50, seed=12, dtype=torch.float32)
    use = ("D", "z", "delta_bias")
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(run(ss.selective_scan_fn, inputs, use, True, False, backend="cpu"))
    finally:
        torch.set_num_threads(before)
    (out1, g1), (out2, g2) = results
    assert torch.equal(out1[0], out2[0])
    for name in g1:
        assert torch.equal(g1[name], g2[name]), name


@needs_kernel
def test_time_major_strided_views_equal_contiguous_copies():
    """The Mamba block hands the kernel slices of projection outputs (row strides != dim)."""
    check_time_major_strided_views("cpu")


@needs_kernel
def test_time_major_entry_matches_for_every_backend():
    """selective_scan_tm gives the same answer whichever backend runs it."""
    x = make_inputs(batch=2, dim=6, state=3, length=25, seed=9)
    args = {k: x[k].detach() for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")}
    tm = {k: (v.transpose(1, 2) if v.dim() == 3 else v) for k, v in args.items()}
    outs = {be: ss.selective_scan_tm(**tm, delta_softplus=True, backend=be) for be in ("cpu", "torch", "ref")}
    assert outs["cpu"].shape == (2, 25, 6)
    assert_close(outs["ref"], outs["cpu"])
    assert_close(outs["ref"], outs["torch"])


@needs_kernel
def test_nan_in_the_input_reaches_the_output_and_gradients():
    """The trainer stops a run on a NaN loss: the kernel must not swallow NaNs."""
    x = make_inputs(length=12, seed=5)
    args = {k: x[k].detach().clone() for k in ("u", "delta", "A", "B", "C", "D")}
    args["u"][0, 1, 3] = float("nan")
    nan_maps = []
    for backend in ("ref", "cpu"):
        inputs = {k: v.clone().requires_grad_() for k, v in args.items()}
        out = ss.selective_scan_fn(**inputs, delta_softplus=True, backend=backend)
        out.sum().backward()
        nan_maps.append([torch.isnan(out)] + [torch.isnan(v.grad) for v in inputs.values()])
    ref_map, cpu_map = nan_maps
    assert cpu_map[0][0, 1, 3:].all() and not cpu_map[0][1].any()   # NaN from t = 3 on, row 0
    assert any(m.any() for m in cpu_map[1:])                        # and in the gradients
    for a, b in zip(ref_map, cpu_map):
        assert torch.equal(a, b)


@needs_kernel
def test_no_grad_forward_stores_nothing_and_empty_sequences_work():
    x = make_inputs(length=9, seed=1)
    args = {k: x[k].detach() for k in ("u", "delta", "A", "B", "C")}
    with torch.no_grad():
        out = ss.selective_scan_fn(**args, backend="cpu")
    assert_close(ss.selective_scan_ref(**args), out)
    empty = {k: (v[..., :0] if v.dim() == 3 else v) for k, v in args.items()}
    out, last = ss.selective_scan_fn(**empty, backend="cpu", return_last_state=True,
                                     initial_state=x["initial_state"].detach())
    assert out.shape == (2, 5, 0) and torch.equal(last, x["initial_state"].detach())


# ---------------------------------------------------------------------------------------
# the conv
# ---------------------------------------------------------------------------------------

@needs_kernel
@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("silu", [True, False])
@pytest.mark.parametrize("with_left", [True, False])
def test_causal_conv_matches_conv1d(k, silu, with_left):
    g = torch.Generator().manual_seed(k)
    b, L, d = 2, 9, 19
    xz = torch.randn(b, L, 2 * d, generator=g, dtype=F64, requires_grad=True)
    x = xz[..., :d]                                            # a strided view, as in Mamba
    w = torch.randn(d, 1, k, generator=g, dtype=F64, requires_grad=True)
    bias = torch.randn(d, generator=g, dtype=F64, requires_grad=True)
    left = (torch.randn(b, k - 1, d, generator=g, dtype=F64, requires_grad=True) if with_left
            else None)
    out = cpu_kernels.CausalConv1dCPU.apply(x, w, bias, left, silu)
    padded = torch.cat([left if with_left else x.new_zeros(b, k - 1, d), x], 1)
    ref = F.conv1d(padded.transpose(1, 2), w, bias, groups=d).transpose(1, 2)
    ref = F.silu(ref) if silu else ref
    assert_close(ref, out, 1e-13)
    dout = torch.randn(b, L, d, generator=g, dtype=F64)
    ins = [xz, w, bias] + ([left] if with_left else [])
    for a, r in zip(torch.autograd.grad(out, ins, dout), torch.autograd.grad(ref, ins, dout)):
        assert a.shape == r.shape
        if r.numel():                                          # left is empty when k = 1
            assert_close(r, a, 1e-13)


# ---------------------------------------------------------------------------------------
# dispatch, building, fallback
# ---------------------------------------------------------------------------------------

@needs_kernel
def test_auto_picks_the_kernel_on_cpu():
    assert ss.choose_backend("auto", "cpu") == "cpu"
    assert ss.choose_backend("auto", "cpu", initial_state=True) == "cpu"
    with pytest.raises(RuntimeError, match="needs CPU tensors"):
        ss.choose_backend("cpu", "cuda")


def test_without_the_kernel_auto_falls_back_to_torch(monkeypatch):
    from models.ssm.mamba import Mamba

    monkeypatch.setattr(cpu_kernels._LIBRARY, "loaded", (None, "no C compiler found ($CC or cc)"))
    assert ss.choose_backend("auto", "cpu") == "torch"
    assert Mamba(8, d_state=4).backend == "torch"
    with pytest.raises(RuntimeError, match="'cpu' unavailable: no C compiler"):
        ss.choose_backend("cpu", "cpu")


def test_build_caches_by_content_and_reports_failures(monkeypatch, tmp_path):
    real_compile = cpu_kernels._compile
    monkeypatch.setenv("SSM_WORKBENCH_KERNEL_CACHE", str(tmp_path))
    monkeypatch.delenv("SSM_WORKBENCH_NO_CPU_KERNEL", raising=False)
    if cpu_kernels._compiler() is None:
        lib, reason = cpu_kernels._LIBRARY.build()
        assert lib is None and "no C compiler" in reason
        return
    lib, reason = cpu_kernels._LIBRARY.build()
    assert lib is not None and reason == ""
    built = list(tmp_path.glob("cpu_kernels-*.so"))
    assert len(built) == 1
    # a second process (here: a second load) reuses the file instead of compiling
    monkeypatch.setattr(cpu_kernels, "_compile", lambda *a: pytest.fail("compiled again"))
    assert cpu_kernels._LIBRARY.build()[0] is not None
    # a broken compiler is reported, not raised
    monkeypatch.setenv("SSM_WORKBENCH_KERNEL_CACHE", str(tmp_path / "other"))
    monkeypatch.setenv("CC", "/bin/false")
    monkeypatch.setattr(cpu_kernels, "_compile", real_compile)
    lib, reason = cpu_kernels._LIBRARY.build()
    assert lib is None and reason.startswith("building the CPU kernels failed")
    monkeypatch.setenv("SSM_WORKBENCH_NO_CPU_KERNEL", "1")
    assert cpu_kernels._LIBRARY.build() == (None, "disabled by SSM_WORKBENCH_NO_CPU_KERNEL")



def test_a_kernel_library_is_built_once_and_says_why_it_cannot_run(monkeypatch):
    """KernelLibrary (the loader every C kernel shares): the tensor's device and dtype first,
    then the caller's shape limit, then the library's own reason; built once per process."""
    from models.kernels import forgetting_attn_cpu

    calls = []
    monkeypatch.setattr(cpu_kernels, "build_library",
                        lambda *a: calls.append(a) or (None, "no compiler here"))
    lib = cpu_kernels.KernelLibrary("t", ("cpu_kernels.c",), ("ss_abi_version", 0), (), "test kernel")
    x = torch.zeros(2, 3, dtype=F64)
    assert lib.load() == lib.load() == (None, "no compiler here") and len(calls) == 1
    assert calls[0] == ("t", ("cpu_kernels.c",), ("ss_abi_version", 0), (), "test kernel")
    assert lib.unsupported(x.to("meta")) == "tensors on 'meta', the kernel runs on the CPU"
    assert lib.unsupported(x.half()) == "dtype torch.float16: the kernel takes float32 or float64"
    assert lib.unsupported(x, "too wide") == "too wide"
    assert lib.unsupported(x) == "no compiler here"
    with pytest.raises(RuntimeError, match="^test kernel unavailable: no compiler here$"):
        lib.library()
    monkeypatch.setattr(forgetting_attn_cpu._LIBRARY, "loaded", (None, "not built"))
    assert forgetting_attn_cpu.unsupported(torch.zeros(1, 1, 1, 272)) == "head dimension 272 > 256"
    assert forgetting_attn_cpu.unsupported(torch.zeros(1, 1, 1, 256)) == "not built"


def test_an_edited_header_builds_anew_even_when_no_library_lists_it(monkeypatch, tmp_path):
    """The cache key covers every csrc/*.h, listed or not: a header that a source includes
    but a KernelLibrary forgot to name must not leave a stale library loaded."""
    src = tmp_path / "csrc"
    shutil.copytree(cpu_kernels._SRC_DIR, src)
    monkeypatch.setattr(cpu_kernels, "_SRC_DIR", src)
    listed = ("cpu_kernels.c",)             # names no header at all
    before = cpu_kernels._source_bytes(listed)
    assert cpu_kernels._source_bytes(listed) == before
    (src / "kernel_common.h").write_text((src / "kernel_common.h").read_text() + "\n/* edited */\n")
    edited = cpu_kernels._source_bytes(listed)
    assert edited != before
    # a header's name counts too: the same bytes under another name are another source
    (src / "kernel_common.h").rename(src / "zz_common.h")
    assert cpu_kernels._source_bytes(listed) != edited
