"""The C decode step of GLA, RetNet and linear attention (issue 43: csrc/linear_rnn_step.c,
``models.kernels.linear_rnn_cpu.*_step``).

Three layers of checks: the C functions against their plain PyTorch twins (``*_step_ref``)
on random inputs, strided and batched, float32 and float64, the parallel branch included;
each layer's fused step (``_fused_step``: one matmul, the C call, o_proj) against its
reference step (the sequence code at T = 1 and the op's ``*_ref``) and the full forward,
token after token, with the reference operators made unreachable; and the fallbacks (the
library unavailable, autograd recording, another dtype) taking the reference step."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from models.kernels import linear_rnn_cpu as lc
from models.kernels import linear_rnn_ops
from models.linear_rnn.linear_mixers import (
    GatedLinearAttention,
    LinearAttention,
    MultiScaleRetention,
)

pytestmark = pytest.mark.skipif(bool(lc._STEP_LIBRARY.load()[1]),
                                reason=f"decode-step kernel unavailable: {lc._STEP_LIBRARY.load()[1]}")

D = 32
CASES = {
    "gla": lambda: GatedLinearAttention(D, n_heads=2),
    "gla_wide_gate": lambda: GatedLinearAttention(D, n_heads=4, expand_k=1.0, gate_low_rank_dim=5,
                                                  gate_logit_normalizer=3.0),
    "retnet": lambda: MultiScaleRetention(D, n_heads=2),
    "retnet_4": lambda: MultiScaleRetention(D, n_heads=4, expand_v=1.0, rope_base=500.0),
    "linear_attention": lambda: LinearAttention(D, n_heads=2),
    "linear_attention_rms": lambda: LinearAttention(D, n_heads=4, output_norm="rms", eps=1e-3),
    "linear_attention_plain": lambda: LinearAttention(D, n_heads=2, feature_map="identity",
                                                      normalize=False),
}


def _layer(name, dtype=torch.float64):
    torch.manual_seed(0)
    m = CASES[name]().to(dtype)
    with torch.no_grad():                       # non-trivial biases / gains
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    return m


def _without_reference_ops(monkeypatch):
    """Every operator's ``*_ref`` unreachable: the fused step must not run the reference."""
    for op, entry in list(linear_rnn_ops.ALL_OPS.items()):
        monkeypatch.setitem(linear_rnn_ops.ALL_OPS, op, (entry[0], None, *entry[2:]))


def _close(a, b, dtype):
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_step_equals_reference_step_and_forward(name, dtype, monkeypatch):
    m = _layer(name, dtype)
    B, P, T = 3, 5, 11
    x = torch.randn(B, T, D, dtype=dtype)
    with torch.no_grad():
        full = m(x)
        _, st_fused = m.forward_with_state(x[:, :P], m.init_state(B))
    st_ref = st_fused
    for t in range(P, T):
        with monkeypatch.context() as mp, torch.no_grad():
            _without_reference_ops(mp)
            y_fused, st_fused = m.step(x[:, t], st_fused)
        with torch.no_grad():
            y_ref, st_ref = m._ref_step(x[:, t], st_ref)
        _close(y_fused, y_ref, dtype)
        _close(y_fused, full[:, t], dtype if dtype == torch.float32 else torch.float32)
        assert len(st_fused) == len(st_ref)
        for a, b in zip(st_fused, st_ref):
            assert a.shape == b.shape and a.dtype == b.dtype
            _close(a, b, dtype) if a.is_floating_point() else torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", sorted(CASES))
def test_decode_takes_the_fused_step_without_autograd(name, monkeypatch):
    """Under no_grad the C step runs (the reference operators are unreachable and it still
    steps); under autograd the reference step runs (the C step is not called)."""
    m = _layer(name)
    st = m.init_state(2)
    x = torch.randn(2, D, dtype=torch.float64)
    with monkeypatch.context() as mp, torch.no_grad():
        _without_reference_ops(mp)
        assert m._fused_step(x, st) is not None
        m.step(x, st)
    calls = []
    for fn in ("gla_step", "retention_step", "linear_attention_step"):
        monkeypatch.setattr(lc, fn, lambda *a, **k: calls.append(1))
    y, _ = m.step(x, st)
    assert y.requires_grad and calls == []


def test_the_reference_step_runs_where_the_c_step_cannot(monkeypatch):
    """The library unavailable, a float16 layer, a state of another dtype (RetNet: positions
    not int64): _fused_step says None and step runs the reference."""
    m = _layer("gla")
    st = m.init_state(2)
    x = torch.randn(2, D, dtype=torch.float64)
    with torch.no_grad():
        want = m._ref_step(x, st)[0]
        monkeypatch.setattr(lc._STEP_LIBRARY, "loaded", (None, "no compiler (test)"))
        assert m._fused_step(x, st) is None
        torch.testing.assert_close(m.step(x, st)[0], want)
        monkeypatch.undo()
        assert m._fused_step(x, (st[0].float(),)) is None
        r = _layer("retnet")
        S, pos = r.init_state(2)
        assert r._fused_step(x, (S, pos)) is not None and r._fused_step(x, (S, pos.int())) is None
        assert lc.step_unsupported(x.half(), st[0].half())
        assert lc.step_unsupported(x, st[0].float())


def _inputs(B, H, K, V, extra, dtype, seed, strided=False):
    """A random projection row y (B, 2 H K + H V + extra), a state S (B, H, K, V); y a
    strided view (every other column of a wider tensor) when ``strided``."""
    g = torch.Generator().manual_seed(seed)
    n = 2 * H * K + H * V + extra
    y = torch.randn(B, n * (2 if strided else 1), generator=g, dtype=dtype)
    y = y[:, ::2] if strided else y
    return y, torch.randn(B, H, K, V, generator=g, dtype=dtype), g


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("B, H, K, V, strided", [(1, 1, 4, 3, False), (3, 2, 7, 5, True),
                                                   (8, 4, 32, 65, False)])
def test_c_steps_equal_their_torch_twins(B, H, K, V, strided, dtype):
    """(8, 4, 32, 65): enough work for the kernel's parallel branch (two threads here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _c_steps_equal_their_torch_twins(B, H, K, V, strided, dtype)
    finally:
        torch.set_num_threads(threads)


def _c_steps_equal_their_torch_twins(B, H, K, V, strided, dtype):
    R = 3
    # GLA: q, k, v, gate, low-rank hidden
    y, S, g = _inputs(B, H, K, V, H * V + R, dtype, 1, strided)
    W2, b2 = torch.randn(H * K, R, generator=g, dtype=dtype), torch.randn(H * K, generator=g, dtype=dtype)
    nw = torch.randn(V, generator=g, dtype=dtype)
    offs = (0, H * K, 2 * H * K, 2 * H * K + H * V, 2 * H * K + 2 * H * V)
    kw = {"low_rank": R, "normalizer": 4.0, "eps": 1e-5}
    for a, b in zip(lc.gla_step(y, S, W2, b2, nw, offs, **kw), lc.gla_step_ref(y, S, W2, b2, nw, offs, **kw)):
        _close(a, b, dtype)
    # retention: q, k (rotated), v, gate; K even
    Ke = K + K % 2
    y, S, g = _inputs(B, H, Ke, V, H * V, dtype, 2, strided)
    pos = torch.randint(0, 5000, (B,), generator=g)
    inv_freq = 1000.0 ** (-2.0 * torch.arange(Ke // 2, dtype=torch.float64) / Ke)
    decay = torch.rand(H, generator=g, dtype=dtype)
    nw, nb = torch.randn(H * V, generator=g, dtype=dtype), torch.randn(H * V, generator=g, dtype=dtype)
    offs = (0, H * Ke, 2 * H * Ke, 2 * H * Ke + H * V)
    args = (y, S, pos, inv_freq, decay, nw, nb, offs)
    for a, b in zip(lc.retention_step(*args, eps=1e-5), lc.retention_step_ref(*args, eps=1e-5)):
        _close(a, b, dtype)
    # linear attention: every feature map, normaliser and norm
    offs = (0, H * K, 2 * H * K)
    for elu in (True, False):
        for normalize in (True, False):
            for norm in (True, False):
                y, S, g = _inputs(B, H, K, V + normalize, 0, dtype, 3, strided)
                y = y[:, :2 * H * K + H * V]
                if normalize and elu:
                    S = S.abs()                 # a positive running key sum, as the layer's
                nw = torch.randn(V, generator=g, dtype=dtype) if norm else None
                kw = {"elu_features": elu, "normalize": normalize, "eps": 1e-2, "norm_eps": 1e-5}
                for a, b in zip(lc.linear_attention_step(y, S, nw, offs, **kw),
                                lc.linear_attention_step_ref(y, S, nw, offs, **kw)):
                    _close(a, b, dtype)


def test_c_step_leaves_its_inputs_unchanged():
    """The new state is a new tensor: the state passed in (which a caller may keep) is not
    written."""
    y, S, _ = _inputs(2, 2, 4, 3, 0, torch.float64, 4)
    before = S.clone()
    _, S2 = lc.linear_attention_step(y, S, None, (0, 8, 16), elu_features=True, normalize=False,
                                     eps=0.0, norm_eps=1e-5)
    assert torch.equal(S, before) and S2.data_ptr() != S.data_ptr()


def _twin_step(m, x_t, st):
    """The layer's step through its C step's torch twin (its weights, its offsets)."""
    K, V = m.key_dim, m.value_dim
    if isinstance(m, GatedLinearAttention):
        ws = [m.q_proj.weight, m.k_proj.weight, m.v_proj.weight, m.g_proj.weight, m.gk_proj[0].weight]
        low, n = m.gk_proj[1], m.g_norm_swish_gate
        o, S = lc.gla_step_ref(F.linear(x_t, torch.cat(ws)), st[0], low.weight, low.bias, n.weight,
                               (0, K, 2 * K, 2 * K + V, 2 * K + 2 * V), low_rank=low.in_features,
                               normalizer=m.gate_logit_normalizer, eps=n.eps)
        return F.linear(o, m.o_proj.weight), (S,)
    if isinstance(m, MultiScaleRetention):
        ws = [m.q_proj.weight, m.k_proj.weight, m.v_proj.weight, m.g_proj.weight]
        gn = m.group_norm
        o, S = lc.retention_step_ref(F.linear(x_t, torch.cat(ws)), st[0], st[1], m._inv_freq(),
                                     m._decay(x_t.dtype), gn.weight, gn.bias, (0, K, 2 * K, 2 * K + V),
                                     eps=gn.eps)
        return F.linear(o, m.o_proj.weight), (S, st[1] + 1)
    ws = [m.q_proj.weight, m.k_proj.weight, m.v_proj.weight]
    nw = None if m.norm is None else m.norm.weight
    o, S = lc.linear_attention_step_ref(F.linear(x_t, torch.cat(ws)), st[0], nw, (0, K, 2 * K),
                                        elu_features=m.feature_map == "elu+1", normalize=m.normalize,
                                        eps=m.eps, norm_eps=1e-5 if m.norm is None else m.norm.eps)
    return F.linear(o, m.o_proj.weight), (S,)


@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_twins_are_the_layers_maths(name):
    """The twins (the C step's oracle) against the layers' sequence code at T = 1 through
    the layer's own weights: a twin that drifts from the layer fails here, not only the C
    code against it."""
    m = _layer(name)
    x = torch.randn(2, 4, D, dtype=torch.float64)
    with torch.no_grad():
        _, st = m.forward_with_state(x[:, :3], m.init_state(2))
        want = m._ref_step(x[:, 3], st)
        got = _twin_step(m, x[:, 3], st)
    _close(got[0], want[0], torch.float64)
    for a, b in zip(got[1], want[1]):
        _close(a, b, torch.float64) if a.is_floating_point() else torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", ["gla", "retnet", "linear_attention"])
def test_fused_step_follows_a_weight_update(name):
    """The stacked projection weights the fused step keeps are rebuilt after an in-place
    update of one of them (an optimiser step)."""
    m = _layer(name)
    x = torch.randn(2, D, dtype=torch.float64)
    st = m.init_state(2)
    with torch.no_grad():
        m.step(x, st)                                  # stacks and keeps the weights
        m.k_proj.weight.mul_(0.5)
        got = m.step(x, st)
        want = m._ref_step(x, st)
    _close(got[0], want[0], torch.float64)
