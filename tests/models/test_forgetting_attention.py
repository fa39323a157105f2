"""Forgetting attention (FoX; issue 35 item 1; models/attention/forgetting_attention.py and
models/kernels/forgetting_attn_cpu.py), float64: the shift-trick SDPA form, the C kernel and
the step-by-step reference equal the definition (outputs and gradients incl. the gates', odd
lengths, head dims off 16, queries after a cache, strong forgetting); in float32 both fast
forms stay within 2e-5 (relative) of the float64 definition under strong forgetting, where
|c| reaches thousands (without re-centring the error is ~eps |c|); a forget gate of 1 is
plain causal attention; streaming (KV cache + gates) equals the full forward; the registry
entry builds, is causal, counts its parameters and reports no fixed state."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import models
from models.attention.forgetting_attention import (ForgettingAttention, cpu_status, forgetting_attn_ref,
                                         forgetting_attn_step_ref, forgetting_attn_torch, resolve_backend)
from models.kernels import forgetting_attn_cpu as fa_cpu


D = torch.float64


def _inputs(b=2, L=13, h=3, d=5, seed=0, gate_bias=1.0, dtype=D):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, L, h, d, generator=g, dtype=dtype, requires_grad=True) for _ in range(3))
    logf = F.logsigmoid(torch.randn(b, L, h, generator=g, dtype=dtype) + gate_bias).requires_grad_()
    return q, k, v, logf


def _outputs_and_grads(fn, q, k, v, g, w):
    o = fn(q, k, v, g)
    return (o, *torch.autograd.grad((o * w).sum(), (q, k, v, g)))


def _naive(q, k, v, logf, scale):
    """Loop form of the paper's equation: D_ij = sum_{l=j+1..i} log f_l, written per pair."""
    b, L, h, _ = q.shape
    out = torch.zeros_like(v)
    for i in range(L):
        logits = torch.stack([(q[:, i] * k[:, j]).sum(-1) * scale + logf[:, j + 1:i + 1].sum(1)
                              for j in range(i + 1)], dim=-1)                # (b, h, i+1)
        out[:, i] = torch.einsum("bhj,bjhd->bhd", torch.softmax(logits, -1), v[:, :i + 1])
    return out


@pytest.mark.parametrize("L", [1, 7, 13])
def test_reference_is_the_papers_equation(L):
    q, k, v, g = _inputs(L=L)
    torch.testing.assert_close(forgetting_attn_ref(q, k, v, g), _naive(q, k, v, g, 1 / math.sqrt(5)))


@pytest.mark.parametrize("L,block", [(1, 512), (9, 512), (31, 512), (31, 4), (29, 7)])
def test_fast_form_equals_reference_outputs_and_grads(L, block):
    q, k, v, g = _inputs(L=L, seed=L)
    a, b = forgetting_attn_torch(q, k, v, g, scale=0.3, block=block), forgetting_attn_ref(q, k, v, g, scale=0.3)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    w = torch.randn_like(a)
    ga = torch.autograd.grad((a * w).sum(), (q, k, v, g))
    gb = torch.autograd.grad((b * w).sum(), (q, k, v, g))
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)
    assert L == 1 or ga[3].abs().sum() > 0   # the gates are trained through D (one token: D = 0)


@pytest.mark.parametrize("L,nq,d,gate_bias", [(1, 1, 5, 1.0), (13, 13, 5, 1.0), (37, 37, 16, 1.0),
                                               (29, 11, 32, 1.0), (9, 1, 7, 1.0), (41, 41, 16, -4.0)])
def test_kernel_equals_reference_outputs_and_grads(L, nq, d, gate_bias):
    """The C kernel (backend cpu) in float64: odd lengths, head dims off 16 (zero-padded),
    queries after a cache (nq < L), one query, strong forgetting (log f ~ -4)."""
    if cpu_status():
        pytest.skip(cpu_status())
    q, k, v, g = _inputs(L=L, d=d, seed=L + d, gate_bias=gate_bias)
    q = q[:, L - nq:].detach().requires_grad_()
    w = torch.randn(2, nq, 3, d, dtype=D)
    got = _outputs_and_grads(lambda *a: fa_cpu.forgetting_attn_cpu(*a, scale=0.3), q, k, v, g, w)
    want = _outputs_and_grads(lambda *a: forgetting_attn_ref(*a, scale=0.3), q, k, v, g, w)
    for name, x, y in zip(("out", "dq", "dk", "dv", "dlogf"), got, want):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12, msg=name)
    assert L == 1 or got[4].abs().sum() > 0


@pytest.mark.parametrize("L", [1, 6, 23])
def test_step_by_step_reference_equals_definition(L):
    q, k, v, g = _inputs(L=L, seed=3)
    torch.testing.assert_close(forgetting_attn_step_ref(q, k, v, g), forgetting_attn_ref(q, k, v, g))
    if L > 2:                                                   # queries after a cache
        torch.testing.assert_close(forgetting_attn_step_ref(q[:, 2:], k, v, g),
                                   forgetting_attn_ref(q[:, 2:], k, v, g))


def test_float32_error_stays_small_under_strong_forgetting():
    """log f ~ -5: |c| reaches ~5000 at L = 1024. Without re-centring (one block; or the
    float32 definition itself) the bias is rounded to eps |c| and the errors reach 1e-4 to
    2e-4; re-centred at every block of 16 queries (the torch form's error grows with block
    times |log f|) or in the C kernel (float64 c, blocks of 16) they stay near 1e-6."""
    q, k, v, g = _inputs(b=1, L=1024, h=2, d=16, seed=7, gate_bias=-5.0)
    w = torch.randn(1, 1024, 2, 16, dtype=D)
    want = _outputs_and_grads(forgetting_attn_ref, q, k, v, g, w)
    forms = {"torch": lambda *a: forgetting_attn_torch(*a, block=16)}
    if not cpu_status():
        forms["cpu"] = fa_cpu.forgetting_attn_cpu
    for form, fn in forms.items():
        f32 = [t.detach().float().requires_grad_() for t in (q, k, v, g)]
        got = _outputs_and_grads(fn, *f32, w.float())
        for name, x, y in zip(("out", "dq", "dk", "dv", "dlogf"), got, want):
            err = ((x.double() - y).abs().max() / y.abs().max()).item()
            assert err < 2e-5, f"{form} {name}: relative error {err:.1e}"


def test_forget_gate_one_is_plain_causal_attention():
    q, k, v, _ = _inputs(L=11)
    zero = torch.zeros(2, 11, 3, dtype=D)                  # log f = 0: f = 1
    plain = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
    fns = [forgetting_attn_ref, forgetting_attn_torch, forgetting_attn_step_ref]
    for fn in fns + ([] if cpu_status() else [fa_cpu.forgetting_attn_cpu]):
        torch.testing.assert_close(fn(q, k, v, zero), plain.transpose(1, 2))
    _, _, _, g = _inputs(L=11)                             # and a real gate changes the output
    assert not torch.allclose(forgetting_attn_ref(q, k, v, g), plain.transpose(1, 2))


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_streaming_equals_the_full_forward(backend):
    torch.manual_seed(0)
    layer = ForgettingAttention(24, n_heads=3, backend=backend).double()
    x = torch.randn(2, 17, 24, dtype=D)
    full = layer(x)
    s = layer.init_state(2)
    ys = []
    for chunk in x.split([5, 1, 7, 4], dim=1):   # queries after a cache: n_key > n_query
        y, s = layer.forward_with_state(chunk, s)
        ys.append(y)
    torch.testing.assert_close(torch.cat(ys, 1), full)
    s, steps = layer.init_state(2), []
    for t in range(17):
        y, s = layer.step(x[:, t], s)
        steps.append(y)
    torch.testing.assert_close(torch.stack(steps, 1), full)
    assert s.length == 17 and s.nbytes() == 2 * 3 * 17 * (2 * 8 + 1) * 8   # the cache grows (k, v, c)
    q, k, v, g = _inputs(L=19)                  # the last 8 queries against 19 keys, in blocks of 3
    torch.testing.assert_close(forgetting_attn_torch(q[:, 11:], k, v, g, block=3),
                               forgetting_attn_ref(q[:, 11:], k, v, g))
    torch.testing.assert_close(forgetting_attn_ref(q[:, 11:], k, v, g), forgetting_attn_ref(q, k, v, g)[:, 11:])


def test_registry_entry_builds_is_causal_and_counts_parameters():
    m = models.build("forgetting_transformer", d_model=32, n_layers=2, n_heads=4).double()
    assert models.state_size(m) is None and models.backend(m) == ("torch" if cpu_status() else "cpu")
    d, h = 32, 4
    n_mixer = 4 * d * d + (d + 1) * h                     # q, k, v, o and the forget gate (with bias)
    assert sum(p.numel() for p in m.layers[0].mixer.parameters()) == n_mixer
    assert m.mlps is not None                             # SwiGLU after every mixer
    n_rest = sum(p.numel() for p in m.mlps.parameters()) + sum(
        p.numel() for n, p in m.named_parameters() if "norm" in n and not n.startswith("mlps"))
    assert models.param_count(m) == 2 * n_mixer + n_rest
    x = torch.randn(1, 12, 32, dtype=D, requires_grad=True)
    y = m(x)
    (gx,) = torch.autograd.grad(y[0, 5].sum(), x)
    assert gx[0, 6:].abs().max() == 0 and gx[0, :6].abs().max() > 0


def test_backends():
    assert resolve_backend("auto", "cpu") == ("torch" if cpu_status() else "cpu")
    assert resolve_backend("ref", "cpu") == "ref" and resolve_backend("torch", "cpu") == "torch"
    with pytest.raises(ValueError, match="backend 'cpu' unavailable"):
        resolve_backend("cpu", "cuda")
    with pytest.raises(ValueError, match="backend 'fla' unavailable"):
        resolve_backend("fla", "cpu")
    with pytest.raises(ValueError, match="unknown for forgetting attention"):
        models.build("forgetting_transformer", d_model=32, n_layers=1, backend="nope")


@pytest.mark.slow   # a subprocess per backend: ~10 s on a loaded 2-core machine
def test_bench_ops_measures_fox_against_its_step_by_step_reference(capsys):
    import json

    from workbench.cli import bench

    backends = ["ref", "torch", *([] if cpu_status() else ["cpu"])]
    rc = bench.main(["--ops", "forgetting_attn", "--seq-lens", "9", "--batch", "1", "--heads", "1",
                     "--head-dim", "4", "--repeats", "1", "--warmup", "0",
                     "--op-backends", ",".join(backends), "--format", "json"])
    rows = json.loads(capsys.readouterr().out)["ops"]
    assert rc == 0
    assert [(r["op"], r["backend"]) for r in rows] == [("forgetting_attn", b) for b in backends]
    assert all("error" not in r and r["x_ref"] > 0 for r in rows)
