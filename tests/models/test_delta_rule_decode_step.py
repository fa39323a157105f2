"""The C decode step of the delta rules (issue 43: csrc/delta_rule_step.c,
``models.kernels.linear_rnn_cpu.delta_rule_step``): DeltaNet, Gated DeltaNet, Gated
DeltaProduct.

Three layers of checks: the C function against its plain PyTorch twin
(``delta_rule_step_ref``) on random inputs, strided and batched, float32 and float64, the
parallel branch included; the twin against the layers' previous decode step
(``_DeltaBase._fast_step``, the chain of torch ops it replaces); each layer's decode step
(``step`` without autograd: one matmul, the C call, o_proj) against the reference step
and the full forward, token after token, with the reference operators and the torch step
made unreachable; and the fallbacks (the library unavailable, autograd recording, another
dtype) taking the previous paths; KDA's C step: tests/models/test_kda_decode_step.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from decode_step_checks import c_step_equals_reference_step_and_forward, perturbed
from decode_step_checks import close as _close
from decode_step_checks import only_the_c_step as _only_the_c_step

from models.kernels import linear_rnn_cpu as lc
from models.linear_rnn.delta_mixers import (
    DeltaNet,
    GatedDeltaNet,
    GatedDeltaProduct,
    _GatedBase,
)

pytestmark = pytest.mark.skipif(
    bool(lc._DELTA_STEP_LIBRARY.load()[1]),
    reason=f"delta-rule decode-step kernel unavailable: {lc._DELTA_STEP_LIBRARY.load()[1]}")

D = 32
CASES = {
    "deltanet": lambda: DeltaNet(D, n_heads=2),
    "deltanet_noconv_neg": lambda: DeltaNet(D, n_heads=2, use_short_conv=False,
                                            allow_neg_eigval=True),
    "deltanet_gva_bias": lambda: DeltaNet(D, n_heads=2, num_v_heads=4, conv_bias=True,
                                          conv_size=3),
    "gated_deltanet": lambda: GatedDeltaNet(D, n_heads=2),
    "gated_deltanet_gva": lambda: GatedDeltaNet(D, n_heads=2, num_v_heads=4),
    "gated_deltaproduct": lambda: GatedDeltaProduct(D, n_heads=2, num_householder=3,
                                                    allow_neg_eigval=True),
    "deltaproduct_nogate": lambda: GatedDeltaProduct(D, n_heads=2, use_forget_gate=False),
    "gated_deltaproduct_noconv": lambda: GatedDeltaProduct(D, n_heads=4, use_short_conv=False),
}


def _layer(name, dtype=torch.float64):
    return perturbed(CASES[name], dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", sorted(CASES))
def test_c_step_equals_reference_step_and_forward(name, dtype, monkeypatch):
    c_step_equals_reference_step_and_forward(_layer(name, dtype), D, dtype, monkeypatch)


def _twin_step(m, x_t, st):
    """The layer's step through the C step's torch twin (its weights, its offsets)."""
    conv = m.qkv_conv1d
    gated = isinstance(m, _GatedBase)
    forget = gated and m.use_forget_gate
    C, nb = sum(m._split), m.b_proj.weight.shape[0]
    offs = (0, C, C + nb if forget else None, C + nb + (m.num_v_heads if forget else 0) if gated else None)
    o, S, cache = lc.delta_rule_step_ref(
        F.linear(x_t, torch.cat(m._x_weights())), st[0], None if conv is None else st[1],
        None if conv is None else conv.weight, None if conv is None else conv.bias,
        m.A_log if forget else None, m.dt_bias if forget else None, m.o_norm.weight, offs,
        n_heads=m.n_heads, num_householder=m.num_householder,
        allow_neg_eigval=m.allow_neg_eigval, eps=m.o_norm.eps)
    return F.linear(o, m.o_proj.weight), ((S,) if conv is None else (S, cache))


@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_twin_is_the_previous_step_and_the_layers_maths(name):
    """The twin (the C step's oracle) against the torch decode step it replaces and the
    reference step (the sequence code at T = 1): a twin that drifts from the layer fails
    here, not only the C code against it."""
    m = _layer(name)
    x = torch.randn(2, 4, D, dtype=torch.float64)
    with torch.no_grad():
        _, st = m.forward_with_state(x[:, :3], m.init_state(2))
        got = _twin_step(m, x[:, 3], st)
        for want in (m._fast_step(x[:, 3], st), m._ref_step(x[:, 3], st)):
            _close(got[0], want[0], torch.float64)
            assert len(got[1]) == len(want[1])
            for a, b in zip(got[1], want[1]):
                _close(a, b, torch.float64)


def _inputs(B, H, Hv, dk, dv, n, W, dtype, seed, strided=False):
    """Random arguments of delta_rule_step: y (B, C + n Hv + Hv + Hv dv), a strided view
    when ``strided``; S, conv cache, conv weight / bias, A_log, dt_bias, norm weight."""
    g = torch.Generator().manual_seed(seed)
    C = H * dk * (1 + n) + Hv * dv * n
    width = C + n * Hv + Hv + Hv * dv
    y = torch.randn(B, width * (2 if strided else 1), generator=g, dtype=dtype)
    y = y[:, ::2] if strided else y

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)
    conv = (r(B, C, W - 1), r(C, 1, W), r(C)) if W else (None, None, None)
    kw = {"y": y, "S": r(B, Hv, dk, dv), "conv_state": conv[0], "conv_w": conv[1],
          "conv_b": conv[2], "A_log": r(Hv), "dt_bias": r(Hv), "norm_w": r(dv)}
    return kw, (0, C, C + n * Hv, C + n * Hv + Hv)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("B, H, Hv, dk, dv, n, W, strided", [
    (1, 1, 1, 4, 3, 1, 4, False), (3, 2, 4, 7, 5, 2, 3, True), (2, 2, 2, 5, 6, 3, 0, True),
    (2, 1, 2, 3, 4, 1, 1, False), (8, 4, 4, 32, 65, 2, 4, False)])
def test_c_step_equals_its_torch_twin(B, H, Hv, dk, dv, n, W, strided, dtype):
    """Every combination of decay / gate / negative eigenvalues, with and without the conv
    (W = 0; W = 1: an empty cache); (8, 4, 4, 32, 65, 2): enough work for the kernel's
    parallel branch (two threads here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        kw, offs = _inputs(B, H, Hv, dk, dv, n, W, dtype, 1, strided)
        for forget in (True, False):
            for gate in (True, False):
                for neg in (True, False):
                    o = (offs[0], offs[1], offs[2] if forget else None, offs[3] if gate else None)
                    opts = {"n_heads": H, "num_householder": n, "allow_neg_eigval": neg,
                            "eps": 1e-5}
                    got = lc.delta_rule_step(**kw, offsets=o, **opts)
                    want = lc.delta_rule_step_ref(**kw, offsets=o, **opts)
                    for a, b in zip(got, want):
                        if b is None:
                            assert a is None
                        else:
                            _close(a, b, dtype)
    finally:
        torch.set_num_threads(threads)


def test_c_step_leaves_its_inputs_unchanged():
    """The new state and conv cache are new tensors: those passed in are not written."""
    kw, offs = _inputs(2, 2, 2, 4, 3, 2, 4, torch.float64, 4)
    before = {k: v.clone() for k, v in kw.items()}
    _, S2, cache2 = lc.delta_rule_step(**kw, offsets=offs, n_heads=2, num_householder=2,
                                       allow_neg_eigval=False, eps=1e-5)
    for k, v in kw.items():
        assert torch.equal(v, before[k]), k
    assert S2.data_ptr() != kw["S"].data_ptr() and cache2.data_ptr() != kw["conv_state"].data_ptr()


@pytest.mark.parametrize("name", ["deltanet", "gated_deltaproduct"])
def test_decode_takes_the_c_step_without_autograd_only(name, monkeypatch):
    """Under no_grad the C step runs; under autograd the reference step runs (neither the C
    step nor the torch step is called)."""
    m = _layer(name)
    st = m.init_state(2)
    x = torch.randn(2, D, dtype=torch.float64)
    with monkeypatch.context() as mp, torch.no_grad():
        _only_the_c_step(mp, m)
        assert m._fused_step(x, st) is not None
        m.step(x, st)
    calls = []
    monkeypatch.setattr(lc, "delta_rule_step", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(m, "_fast_step", lambda *a, **k: calls.append(2))
    y, _ = m.step(x, st)
    assert y.requires_grad and calls == []


def test_the_torch_step_runs_where_the_c_step_cannot(monkeypatch):
    """The library unavailable, a float16 layer, a state or cache of another dtype:
    _fused_step says None and step runs the torch step (_fast_step), whose answer it returns
    (KDA's: tests/models/test_kda_decode_step.py)."""
    m = _layer("gated_deltanet")
    st = m.init_state(2)
    x = torch.randn(2, D, dtype=torch.float64)
    with torch.no_grad():
        want = m._fast_step(x, st)[0]
        monkeypatch.setattr(lc._DELTA_STEP_LIBRARY, "loaded", (None, "no compiler (test)"))
        assert m._fused_step(x, st) is None
        torch.testing.assert_close(m.step(x, st)[0], want)
        monkeypatch.undo()
        assert m._fused_step(x, st) is not None
        assert m._fused_step(x, (st[0].float(), st[1])) is None
        assert m._fused_step(x, (st[0], st[1].float())) is None
        h = _layer("gated_deltanet", torch.float16)
        sth = h.init_state(2)
        assert h._fused_step(x.half(), sth) is None


def test_c_step_follows_a_weight_update():
    """The stacked projection weights are rebuilt after an in-place update of one of them
    (an optimiser step), and the conv and decay parameters are read at each call."""
    m = _layer("gated_deltanet")
    x = torch.randn(2, D, dtype=torch.float64)
    st = m.init_state(2)
    with torch.no_grad():
        m.step(x, st)                                  # stacks and keeps the weights
        m.k_proj.weight.mul_(0.5)
        m.qkv_conv1d.weight.mul_(-1.0)
        m.A_log.add_(0.5)
        got = m.step(x, st)
        want = m._ref_step(x, st)
    _close(got[0], want[0], torch.float64)


def _spy_torch_step(monkeypatch, m):
    """Record the calls of the layer's torch step (still running it)."""
    calls, torch_step = [], m._fast_step

    def spy(*a, **k):
        calls.append(1)
        return torch_step(*a, **k)
    monkeypatch.setattr(m, "_fast_step", spy)
    return calls


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_decodes_through_the_torch_step(dtype, monkeypatch):
    """A half-precision layer: step (no autograd) runs the torch step, its answer."""
    m = _layer("gated_deltaproduct", dtype)
    st = m.init_state(2)
    x = torch.randn(2, D, dtype=dtype)
    with torch.no_grad():
        want = m._fast_step(x, st)
        calls = _spy_torch_step(monkeypatch, m)
        got = m.step(x, st)
    assert calls == [1]
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)


@pytest.mark.parametrize("device", ["meta", "cuda"])
def test_other_devices_decode_through_the_torch_step(device, monkeypatch):
    """Not on a CPU (the meta device here; CUDA where there is one): the C step declines and
    step runs the torch step."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    m = _layer("gated_deltanet", torch.float32).to(device)
    st = m.init_state(2)
    x = torch.randn(2, D, device=device)
    with torch.no_grad():
        assert m._fused_step(x, st) is None
        calls = _spy_torch_step(monkeypatch, m)
        y, st2 = m.step(x, st)
    assert calls == [1] and y.device.type == device and len(st2) == 2
