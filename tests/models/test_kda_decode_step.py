"""KDA's C decode step (issue 43: csrc/delta_rule_step.c with the decay per key channel and
the sigmoid gate, ``models.kernels.linear_rnn_cpu.delta_rule_step(key_decay=,
sigmoid_gate=)``, ``KimiDeltaAttention._fused_step``).

The C function against its plain PyTorch twin (float32 / float64, batched, grouped value
heads, strided input, with and without the conv); the twin against KDA's torch step
(``_fast_step``, which it replaces) and the reference step; the layer's decode step (no
autograd) against the reference step and the full forward token by token with the torch
step and the reference operators unreachable; and the fallbacks (library unavailable,
autograd, half precision, another device, a state of another dtype) taking the torch step."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from decode_step_checks import c_step_equals_reference_step_and_forward, perturbed
from decode_step_checks import close as _close
from decode_step_checks import only_the_c_step as _only_the_c_step

from models.kernels import linear_rnn_cpu as lc
from models.linear_rnn.dplr_mixers import KimiDeltaAttention

pytestmark = pytest.mark.skipif(
    bool(lc._DELTA_STEP_LIBRARY.load()[1]),
    reason=f"delta-rule decode-step kernel unavailable: {lc._DELTA_STEP_LIBRARY.load()[1]}")

D = 32
CASES = {
    "kda": lambda: KimiDeltaAttention(D, n_heads=2),
    "kda_gva_neg": lambda: KimiDeltaAttention(D, n_heads=2, num_v_heads=4,
                                              allow_neg_eigval=True),
    "kda_noconv": lambda: KimiDeltaAttention(D, n_heads=4, use_short_conv=False),
    "kda_bias_k3": lambda: KimiDeltaAttention(D, n_heads=2, conv_bias=True, conv_size=3),
}


def _layer(name, dtype=torch.float64):
    return perturbed(CASES[name], dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", sorted(CASES))
def test_c_step_equals_reference_step_and_forward(name, dtype, monkeypatch):
    c_step_equals_reference_step_and_forward(_layer(name, dtype), D, dtype, monkeypatch)


def _twin_step(m, x_t, st):
    """KDA's step through the C step's torch twin (its weights, the low-rank products)."""
    conv = m.qkv_conv1d
    C, nb, r = sum(m._split), m.b_proj.weight.shape[0], m.f_proj[0].weight.shape[0]
    y = F.linear(x_t, torch.cat(m._x_weights()))
    f = F.linear(y[:, C + nb:C + nb + r], m.f_proj[1].weight)
    gate = F.linear(y[:, C + nb + r:], m.g_proj[1].weight, m.g_proj[1].bias)
    o, S, cache = lc.delta_rule_step_ref(
        y, st[0], None if conv is None else st[1], None if conv is None else conv.weight,
        None if conv is None else conv.bias, m.A_log, m.dt_bias, m.o_norm.weight,
        (0, C, None, None), n_heads=m.n_heads, num_householder=m.num_householder,
        allow_neg_eigval=m.allow_neg_eigval, eps=m.o_norm.eps, key_decay=f, sigmoid_gate=gate)
    return F.linear(o, m.o_proj.weight), ((S,) if conv is None else (S, cache))


@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_twin_is_kdas_previous_step_and_the_layers_maths(name):
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


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("B, H, Hv, dk, dv, W, strided", [
    (1, 1, 1, 4, 3, 4, False), (3, 2, 4, 7, 5, 3, True), (2, 2, 2, 5, 6, 0, True),
    (8, 4, 4, 32, 65, 4, False)])
def test_c_step_with_key_decay_and_sigmoid_gate_equals_its_torch_twin(B, H, Hv, dk, dv, W,
                                                                     strided, dtype):
    """The per-key-channel decay and the sigmoid gate, each alone and together, with and
    without negative eigenvalues; (8, 4, 4, 32, 65): the kernel's parallel branch."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(3)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)
    try:
        C = H * dk * 2 + Hv * dv
        y = r(B, (C + Hv) * (2 if strided else 1))
        y = y[:, ::2] if strided else y
        conv = (r(B, C, W - 1), r(C, 1, W), r(C)) if W else (None, None, None)
        S, A_log, norm_w = r(B, Hv, dk, dv), r(Hv), r(dv)
        f, dt_bias, gate = r(B, Hv * dk), r(Hv * dk), r(B, Hv * dv)
        for kd in (f, None):
            for sg in (gate, None):
                for neg in (True, False):
                    args = (y, S, *conv, A_log, dt_bias if kd is not None else None, norm_w,
                            (0, C, None, None))
                    opts = {"n_heads": H, "num_householder": 1, "allow_neg_eigval": neg,
                            "eps": 1e-5, "key_decay": kd, "sigmoid_gate": sg}
                    got = lc.delta_rule_step(*args, **opts)
                    want = lc.delta_rule_step_ref(*args, **opts)
                    for a, b in zip(got, want):
                        if b is None:
                            assert a is None
                        else:
                            _close(a, b, dtype)
    finally:
        torch.set_num_threads(threads)


def test_kda_decode_takes_the_c_step_without_autograd_only(monkeypatch):
    m = _layer("kda")
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


def _spy_torch_step(monkeypatch, m):
    calls, torch_step = [], m._fast_step

    def spy(*a, **k):
        calls.append(1)
        return torch_step(*a, **k)
    monkeypatch.setattr(m, "_fast_step", spy)
    return calls


def test_kda_takes_the_torch_step_where_the_c_step_cannot(monkeypatch):
    """The library unavailable, a state or cache of another dtype, a half-precision layer,
    the meta device (CUDA where present): _fused_step says None, step runs the torch step."""
    m = _layer("kda")
    st = m.init_state(2)
    x = torch.randn(2, D, dtype=torch.float64)
    with torch.no_grad():
        want = m._fast_step(x, st)[0]
        with monkeypatch.context() as mp:
            mp.setattr(lc._DELTA_STEP_LIBRARY, "loaded", (None, "no compiler (test)"))
            assert m._fused_step(x, st) is None
            calls = _spy_torch_step(mp, m)
            torch.testing.assert_close(m.step(x, st)[0], want, rtol=0, atol=0)
            assert calls == [1]
        assert m._fused_step(x, st) is not None
        assert m._fused_step(x, (st[0].float(), st[1])) is None
        assert m._fused_step(x, (st[0], st[1].float())) is None
        devices = [("meta", torch.float32), ("cpu", torch.float16), ("cpu", torch.bfloat16)]
        if torch.cuda.is_available():
            devices.append(("cuda", torch.float32))
        for device, dtype in devices:
            h = _layer("kda", dtype).to(device)
            sth = h.init_state(2)
            xh = torch.randn(2, D, dtype=dtype, device=device)
            assert h._fused_step(xh, sth) is None, (device, dtype)
            with monkeypatch.context() as mp:
                calls = _spy_torch_step(mp, h)
                y, _ = h.step(xh, sth)
            assert calls == [1] and y.device.type == device and y.dtype == dtype


def test_kda_c_step_follows_a_weight_update():
    """The stacked weights rebuilt after an in-place update; the low-rank second factors,
    the gate's bias, dt_bias and A_log read at each call."""
    m = _layer("kda")
    x = torch.randn(2, D, dtype=torch.float64)
    st = m.init_state(2)
    with torch.no_grad():
        _, st = m.forward_with_state(torch.randn(2, 3, D, dtype=torch.float64), st)
        m.step(x, st)
        m.f_proj[0].weight.mul_(0.5)
        m.f_proj[1].weight.mul_(-1.0)
        m.g_proj[1].bias.add_(1.0)
        m.dt_bias.add_(0.5)
        m.A_log.add_(0.5)
        got = m.step(x, st)
        want = m._ref_step(x, st)
    _close(got[0], want[0], torch.float64)
