"""The Mamba mixer, the S6 inner layer and their registry backbones."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import models
from helpers import run_pieces, run_steps
from models.kernels import cpu_kernels
from models.ssm.mamba import Mamba, stream
from models.ssm.s6 import S6
from models.kernels import scan_compiled

F64 = torch.float64
# what "auto" resolves to for CPU tensors: the C kernels when they build here
AUTO_ON_CPU = "cpu" if cpu_kernels.available() else "torch"

# mamba-ssm's Mamba module (checkpoint keys), with shapes for d_model=16, d_state=8, d_conv=4,
# expand=2 -> d_inner=32, dt_rank=ceil(16/16)=1
OFFICIAL = {
    "in_proj.weight": (64, 16),
    "conv1d.weight": (32, 1, 4),
    "conv1d.bias": (32,),
    "x_proj.weight": (1 + 2 * 8, 32),
    "dt_proj.weight": (32, 1),
    "dt_proj.bias": (32,),
    "A_log": (32, 8),
    "D": (32,),
    "out_proj.weight": (16, 32),
}


def test_parameter_names_and_shapes_match_mamba_ssm():
    m = Mamba(16, d_state=8)
    assert {n: tuple(p.shape) for n, p in m.named_parameters()} == OFFICIAL
    assert m.A_log._no_weight_decay and m.D._no_weight_decay
    assert not hasattr(m.in_proj.weight, "_no_weight_decay")
    with_bias = {n for n, _ in Mamba(16, bias=True).named_parameters()}
    assert {"in_proj.bias", "out_proj.bias"} <= with_bias


def test_s4d_real_init_and_dt_bias_range():
    torch.manual_seed(0)
    m = Mamba(64, d_state=16, dt_min=0.002, dt_max=0.05)
    A = -torch.exp(m.A_log)
    assert torch.allclose(A, -torch.arange(1, 17.0).expand(128, 16))
    assert torch.all(m.D == 1)
    dt = F.softplus(m.dt_proj.bias)
    assert dt.min() >= 0.002 * (1 - 1e-5) and dt.max() <= 0.05 * (1 + 1e-5)
    assert dt.max() / dt.min() > 5  # spread over the range, not a constant
    # the floor applies when dt_min is below it
    floored = F.softplus(Mamba(16, dt_min=1e-6, dt_max=2e-6, dt_init_floor=1e-3).dt_proj.bias)
    assert torch.allclose(floored, torch.full_like(floored, 1e-3), rtol=1e-4)


def test_dt_rank_and_bad_options():
    assert Mamba(64).dt_rank == 4 and Mamba(64, dt_rank=7).dt_rank == 7
    assert S6(64).dt_rank == 4
    with pytest.raises(ValueError):
        Mamba(16, dt_rank=0)
    with pytest.raises(ValueError):
        Mamba(16, backend="tritonn")
    with pytest.raises(TypeError, match="d_statee"):
        models.build("mamba", d_model=16, n_layers=1, d_statee=4)


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("name", ["mamba", "s6"])
def test_backbone_shape_causality_and_gradients(name, backend):
    torch.manual_seed(0)
    m = models.build(name, d_model=16, n_layers=2, d_state=4, backend=backend).double()
    x = torch.randn(2, 40, 16, dtype=F64, requires_grad=True)
    y = m(x)
    assert y.shape == x.shape
    # causality: changing inputs from position 25 on leaves outputs before 25 unchanged
    x2 = x.detach().clone()
    x2[:, 25:] += torch.randn_like(x2[:, 25:])
    y2 = m(x2)
    assert torch.equal(y[:, :25], y2[:, :25])
    assert not torch.allclose(y[:, 25:], y2[:, 25:])
    # every parameter gets a gradient
    (y * torch.randn_like(y)).sum().backward()
    for pname, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname
    assert x.grad.abs().sum() > 0
    assert m.backend == (AUTO_ON_CPU if backend == "auto" else backend)


@pytest.mark.parametrize("name", ["mamba", "s6"])
def test_step_and_chunked_match_full_sequence(name):
    torch.manual_seed(1)
    m = models.build(name, d_model=8, n_layers=2, d_state=4).double()
    x = torch.randn(3, 45, 8, dtype=F64)
    with torch.no_grad():
        y = m(x)
        assert torch.allclose(run_steps(m, x), y, atol=1e-10)
        for chunk_len in (1, 7, 45, 100):
            assert torch.allclose(m.forward_chunked(x, chunk_len), y, atol=1e-10)


def test_mixer_step_state_shapes_and_state_size():
    m = Mamba(8, d_state=5, d_conv=3, expand=2)
    conv_state, ssm_state = m.init_state(4)
    assert conv_state.shape == (4, 16, 2) and ssm_state.shape == (4, 16, 5)
    y, (c2, s2) = m.step(torch.randn(4, 8), (conv_state, ssm_state))
    assert y.shape == (4, 8) and c2.shape == conv_state.shape and s2.shape == ssm_state.shape
    stack = models.build("mamba", d_model=8, n_layers=3, d_state=5, d_conv=3)
    assert stack.state_size() == 3 * 16 * (5 + 3 - 1)
    assert models.build("s6", d_model=8, n_layers=2, d_state=5).state_size() == 2 * 8 * 5


def test_mixer_step_and_stream_match_forward():
    torch.manual_seed(2)
    m = Mamba(8, d_state=4, d_conv=4).double()
    x = torch.randn(2, 30, 8, dtype=F64)
    with torch.no_grad():
        y = m(x)
        assert torch.allclose(run_steps(m, x), y, atol=1e-12)
        assert torch.allclose(run_pieces(m, x, [13, 17]), y, atol=1e-12)


def test_stream_generator_over_chunks_matches_forward():
    torch.manual_seed(3)
    m = models.build("mamba", d_model=8, n_layers=2).double()
    x = torch.randn(1, 64, 8, dtype=F64)
    with torch.no_grad():
        outs = list(stream(m, (c for c in x.split(10, dim=1))))
        assert torch.allclose(torch.cat(outs, 1), m(x), atol=1e-10)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("name", ["mamba", "s6"])
def test_backend_option_matches_ref(name, backend):
    """Each fast backend (block conv and scan included) against "ref", outputs and gradients."""
    if backend == "cpu" and AUTO_ON_CPU != "cpu":
        pytest.skip("CPU kernels unavailable")
    torch.manual_seed(4)
    fast = models.build(name, d_model=8, n_layers=1, backend=backend).double()
    slow = models.build(name, d_model=8, n_layers=1, backend="ref").double()
    slow.load_state_dict(fast.state_dict())
    assert (fast.backend, slow.backend) == (backend, "ref")
    x = torch.randn(2, 40, 8, dtype=F64)
    assert torch.allclose(fast(x), slow(x), atol=1e-12)
    fast(x).sin().sum().backward()
    slow(x).sin().sum().backward()
    for (n, p), q in zip(fast.named_parameters(), slow.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-10), n
    with pytest.raises(RuntimeError, match="cuda"):
        models.build(name, d_model=8, n_layers=1, backend="cuda").backend  # no CUDA here


def test_s6_inner_layer_contract():
    """S6 as an inner layer: (batch, length, d_inner) -> same, no gate, no conv."""
    torch.manual_seed(5)
    s6 = S6(12, d_state=4).double()
    assert {n for n, _ in s6.named_parameters()} == {"x_proj.weight", "dt_proj.weight", "dt_proj.bias", "A_log", "D"}
    x = torch.randn(2, 9, 12, dtype=F64)
    y = s6(x)
    assert y.shape == x.shape
    # with B = C = 0 the SSM part vanishes and only the D skip remains
    with torch.no_grad():
        s6.x_proj.weight[s6.dt_rank:] = 0
    assert torch.allclose(s6(x), x * s6.D)


def test_registry_entries():
    assert {"mamba", "s6"} <= set(models.names())
    assert "Mamba" in models.describe("mamba")
    m = models.build("mamba", d_model=16, n_layers=2)
    assert models.param_count(m) == sum(p.numel() for p in m.parameters())
    assert models.backend(m) == AUTO_ON_CPU


def test_mamba_uses_cuda_kernels_when_available(monkeypatch):
    """With the CUDA kernels present and CUDA tensors, forward goes through both of them."""
    from models.kernels import selective_scan as ss

    calls = []

    def fake_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state):
        calls.append("scan")
        return ss.selective_scan_torch(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)

    def fake_conv(x, weight, bias, activation=None):
        calls.append("conv")
        assert weight.dim() == 2 and activation == "silu" and x.is_contiguous()
        return F.silu(F.conv1d(x, weight[:, None], bias, padding=weight.shape[1] - 1, groups=x.shape[1])[..., : x.shape[-1]])

    torch.manual_seed(6)
    m = Mamba(8, d_state=4).double()
    x = torch.randn(2, 11, 8, dtype=F64)
    expected = m(x)
    monkeypatch.setattr(ss, "_load_cuda_scan", lambda: (fake_scan, ""))
    monkeypatch.setattr(ss, "_load_cuda_conv", lambda: (fake_conv, ""))
    monkeypatch.setattr(ss, "_device_of", lambda t: torch.device("cuda", 0))
    assert m.backend == "cuda"
    assert torch.allclose(m(x), expected, atol=1e-12)
    assert calls == ["conv", "scan"]
    assert Mamba(8, backend="torch").backend == "torch"


def test_backend_compiled_option_reaches_the_scan(monkeypatch):
    """backend="compiled" builds, reports itself, and computes what "torch" does (here with a
    broken compiler, so the test stays fast: it must warn and fall back to eager kernels)."""

    monkeypatch.setattr(scan_compiled, "_compiled_forward", scan_compiled._Compiled(scan_compiled._block_forward))
    monkeypatch.setattr(scan_compiled, "_compiled_backward", scan_compiled._Compiled(scan_compiled._block_backward))

    def broken_compile(*a, **k):
        raise RuntimeError("no compiler")

    monkeypatch.setattr(torch, "compile", broken_compile)
    torch.manual_seed(5)
    fast = models.build("mamba", d_model=8, n_layers=1, backend="torch").double()
    comp = models.build("mamba", d_model=8, n_layers=1, backend="compiled").double()
    comp.load_state_dict(fast.state_dict())
    assert models.backend(comp) == "compiled" and models.backend(fast) == "torch"
    x = torch.randn(2, 40, 8, dtype=F64)
    with pytest.warns(RuntimeWarning, match="torch.compile"):
        y = comp(x)
    assert torch.allclose(y, fast(x), atol=1e-12)
    y.pow(2).sum().backward()
    fast(x).pow(2).sum().backward()
    for (n, p), q in zip(comp.named_parameters(), fast.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-10), n
