"""Mamba-3 (models/kernels/mamba3_scan.py, models/ssm/mamba3.py): the chunked scan equals the
step-by-step oracle (outputs, final state, gradients; initial state, odd lengths), the
Euler end without rotation is Mamba-2's SSD, the scan agrees with a transcription of
mamba-ssm's step reference, and the mixer streams exactly."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import models
from models.kernels import linear_rnn, linear_rnn_backends as lrb
from models.kernels.mamba3_scan import mamba3, mamba3_ref, rotate, rotate_fast
from models.ssm.mamba3 import Mamba3

D64 = torch.float64
CHUNKED = ["torch"] + (["cpu"] if lrb.cpu_status()[0] else [])


def _inputs(b=2, L=37, h=3, N=8, P=5, R=2, seed=0, state=True):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=D64)  # noqa: E731
    u = lambda *s: torch.rand(*s, generator=g, dtype=D64)  # noqa: E731
    dt = u(b, L, h) * 0.5 + 0.05
    x = dict(q=r(b, L, h, N), k=r(b, L, h, N), v=r(b, L, h, P), adt=-u(b, L, h) * dt * 2, dt=dt,
             lam=u(b, L, h), omega=r(b, L, h, R) * 2 if R else None)
    s0 = (u(b, h, R) * 6, r(b, h, N, P), r(b, h, N), r(b, h, P)) if state else None
    return x, s0


def test_rotate_turns_pairs_and_keeps_the_rest():
    x = torch.tensor([1.0, 0.0, 0.0, 2.0, 5.0], dtype=D64)
    y = rotate(x, torch.tensor([math.pi / 2, math.pi / 2], dtype=D64))
    torch.testing.assert_close(y, torch.tensor([0.0, 1.0, -2.0, 0.0, 5.0], dtype=D64))


def assert_op_equals_ref(op, ref, x, s0, **kw):
    """op(**x) == ref(**x) from initial state s0: outputs, the four state tensors and the
    gradients of a random functional of both w.r.t. every input and initial-state tensor."""
    leaves = [t.requires_grad_() for t in (*x.values(), *s0) if t is not None]
    o1, s1 = ref(**x, initial_state=s0, output_final_state=True)
    o2, s2 = op(**x, initial_state=s0, output_final_state=True, **kw)
    torch.testing.assert_close(o2, o1, rtol=1e-10, atol=1e-10)
    for a, c in zip(s2, s1):
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-10)
    w, ws = torch.randn_like(o1), [torch.randn_like(t) for t in s1]
    loss = lambda o, s: (o * w).sum() + sum((a * c).sum() for a, c in zip(s, ws))  # noqa: E731
    g1 = torch.autograd.grad(loss(o1, s1), leaves, allow_unused=True)
    g2 = torch.autograd.grad(loss(o2, s2), leaves, allow_unused=True)
    for a, c in zip(g2, g1):
        if c is None:
            assert a is None or a.abs().max() == 0
        else:
            torch.testing.assert_close(a, c, rtol=1e-9, atol=1e-9)


def test_rotate_fast_equals_rotate_with_its_own_backward():
    """The chunked forms' rotation (hand-written backward): values, and gradients by
    gradcheck, with theta broadcast over a rank axis as MIMO's."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 4, 2, 10, generator=g, dtype=D64, requires_grad=True)
    th = torch.randn(2, 3, 1, 2, 3, generator=g, dtype=D64, requires_grad=True)
    torch.testing.assert_close(rotate_fast(x, th), rotate(x, th), rtol=1e-14, atol=1e-14)
    assert torch.autograd.gradcheck(rotate_fast, (x, th))


@pytest.mark.parametrize("backend", CHUNKED)
@pytest.mark.parametrize("R", [2, 0])
@pytest.mark.parametrize("L", [1, 37])
def test_chunked_equals_ref_outputs_state_and_gradients(backend, R, L):
    x, s0 = _inputs(L=L, R=R)
    kw = {"chunk_size": 8} if backend == "torch" else {}
    assert_op_equals_ref(mamba3, mamba3_ref, x, s0, backend=backend, **kw)


def test_state_carry_chains_exactly():
    x, s0 = _inputs(L=29)
    o, s = mamba3(**x, initial_state=s0, output_final_state=True, backend="torch")
    cut = 11
    first = {k: v[:, :cut] for k, v in x.items()}
    second = {k: v[:, cut:] for k, v in x.items()}
    oa, sa = mamba3(**first, initial_state=s0, output_final_state=True, backend="torch")
    ob, sb = mamba3(**second, initial_state=sa, output_final_state=True, backend="torch")
    torch.testing.assert_close(torch.cat([oa, ob], 1), o, rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(sb[1], s[1], rtol=1e-11, atol=1e-11)


def test_euler_end_without_rotation_is_mamba2_ssd():
    """lam = 1, no angles: S_t = exp(A dt) S_{t-1} + dt B x^T, the SSD simple_gla computes."""
    x, _ = _inputs(L=23, R=0, state=False)
    x["lam"] = torch.ones_like(x["lam"])
    o, s = mamba3(**x, output_final_state=True, backend="torch")
    o2, s2 = linear_rnn.simple_gla_ref(x["q"], x["k"], x["v"] * x["dt"][..., None], x["adt"],
                                       scale=1.0, output_final_state=True)
    torch.testing.assert_close(o, o2, rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(s[1], s2, rtol=1e-11, atol=1e-11)
    x["lam"] = torch.full_like(x["lam"], 0.5)          # the trapezoid is not the Euler step
    assert (mamba3(**x, backend="torch")[0] - o).abs().max() > 1e-3


def _ssm_rot(t, th):
    """mamba-ssm's step references' rotation (own code): pairs (2i, 2i+1) of t (..., N) turned
    by th (..., R), the angles padded with cos 1, sin 0."""
    R = th.shape[-1]
    t0, t1 = t[..., 0::2], t[..., 1::2]
    c = F.pad(torch.cos(th), (0, t0.shape[-1] - R), value=1.0)
    s = F.pad(torch.sin(th), (0, t0.shape[-1] - R), value=0.0)
    return torch.stack([t0 * c - t1 * s, t0 * s + t1 * c], -1).reshape(t.shape)


def _mamba_ssm_step_ref(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z):
    """Transcription (own code) of state-spaces/mamba tests/ops/triton/test_mamba3_siso.py
    ``mamba3_siso_step_ref``, in its layouts: Q, K (b, L, h, N), V, Z (b, L, h, P), ADT, DT,
    Trap (b, h, L) (Trap before its sigmoid), Angles (b, L, h, R) before tanh * pi, state S
    (b, h, P, N). Returns y (b, L, h, P)."""
    b, L, h, N = Q.shape
    P, R = V.shape[-1], Angles.shape[-1]
    ang = torch.tanh(Angles) * math.pi
    theta = torch.zeros(b, h, R, dtype=Q.dtype)
    S = torch.zeros(b, h, P, N, dtype=Q.dtype)
    k_prev, v_prev = torch.zeros(b, h, N, dtype=Q.dtype), torch.zeros(b, h, P, dtype=Q.dtype)

    ys = []
    for i in range(L):
        dt, adt = DT[:, :, i], ADT[:, :, i]
        theta = theta + ang[:, i] * dt[..., None]
        theta = theta - 2 * math.pi * torch.floor(theta / (2 * math.pi))
        q, k = _ssm_rot(Q[:, i] + Q_bias, theta), _ssm_rot(K[:, i] + K_bias, theta)
        tr = torch.sigmoid(Trap[:, :, i])
        a = torch.exp(adt)
        S = (a[..., None, None] * S
             + ((1 - tr) * dt * a)[..., None, None] * v_prev[..., :, None] * k_prev[..., None, :]
             + (tr * dt)[..., None, None] * V[:, i, :, :, None] * k[..., None, :])
        y = torch.einsum("bhpn,bhn->bhp", S, q) + D[None, :, None] * V[:, i]
        ys.append(y * F.silu(Z[:, i]))
        k_prev, v_prev = k, V[:, i]
    return torch.stack(ys, 1)


def test_agrees_with_mamba_ssm_step_reference():
    g = torch.Generator().manual_seed(3)
    b, L, h, N, P, R = 2, 19, 2, 8, 4, 2
    r = lambda *s: torch.randn(*s, generator=g, dtype=D64)  # noqa: E731
    Q, K, V, Z, Angles = r(b, L, h, N), r(b, L, h, N), r(b, L, h, P), r(b, L, h, P), r(b, L, h, R)
    DT = F.softplus(r(b, h, L)) * 0.3
    ADT, Trap, Qb, Kb, D = -DT * torch.rand(b, h, L, generator=g, dtype=D64), r(b, h, L), r(h, N), r(h, N), r(h)
    want = _mamba_ssm_step_ref(Q, K, V, ADT, DT, Trap, Qb, Kb, Angles, D, Z)
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    y, _ = mamba3(Q + Qb, K + Kb, V, t(ADT), t(DT), torch.sigmoid(t(Trap)),
                  torch.tanh(Angles) * math.pi, backend="torch", chunk_size=8)
    got = (y + D[:, None] * V) * F.silu(Z)
    assert (got - want).abs().max() < 1e-11, (got - want).abs().max()


def _mixer(**kw):
    torch.manual_seed(0)
    return Mamba3(16, d_state=8, headdim=8, **kw).double()


@pytest.mark.parametrize("kw", [{}, {"complex_state": False}, {"ngroups": 2, "outproj_norm": True,
                                                                "rope_fraction": 1.0}])
def test_mixer_streaming_equals_forward_and_ref(kw):
    m = _mixer(**kw)
    u = torch.randn(2, 13, 16, dtype=D64)
    y = m(u)
    m.backend_choice = "ref"
    torch.testing.assert_close(m(u), y, rtol=1e-10, atol=1e-10)
    m.backend_choice = "torch"
    s = m.init_state(2)
    ya, s = m.forward_with_state(u[:, :6], s)
    yb, s = m.forward_with_state(u[:, 6:], s)
    torch.testing.assert_close(torch.cat([ya, yb], 1), y, rtol=1e-10, atol=1e-10)
    s, steps = m.init_state(2), []
    for t in range(u.shape[1]):
        o, s = m.step(u[:, t], s)
        steps.append(o)
    torch.testing.assert_close(torch.stack(steps, 1), y, rtol=1e-10, atol=1e-10)
    assert m.state_size() == sum(t[0].numel() for t in s)


def test_registry_entry_builds_counts_and_is_causal():
    assert "mamba3" in models.names() and "ICLR 2026" in models.describe("mamba3")
    net = models.build("mamba3", d_model=32, n_layers=2).double()
    x = torch.randn(1, 20, 32, dtype=D64)
    y = net(x)
    x2 = x.clone()
    x2[:, 12:] += 1.0
    torch.testing.assert_close(net(x2)[:, :12], y[:, :12])
    mix = net.layers[0].mixer
    # in_proj: z, x (2 * 64), B, C (2 * 64), dt, A, trap (3 * 2 heads), angles (16)
    assert mix.in_proj.weight.shape == (2 * 64 + 2 * 64 + 3 * 2 + 16, 32)
    assert models.state_size(net) == 2 * 2 * (64 * 32 + 64 + 32 + 16)
    assert models.param_count(net) == sum(p.numel() for p in net.parameters())


def test_bad_options_are_one_line_errors():
    with pytest.raises(ValueError, match="rope_fraction"):
        Mamba3(16, rope_fraction=0.3)
    with pytest.raises(ValueError, match="backend"):
        Mamba3(16, backend="nope")


def _mimo_inputs(L, R, r=3, seed=5, N=8, P=5):
    """SISO-like inputs with a rank axis: q, k, v (b, L, r, h, .), state kr/v_prev (b, r, h, .)."""
    x, s0 = _inputs(L=L, R=R, seed=seed, N=N, P=P)
    g = torch.Generator().manual_seed(seed + 1)
    b, _, h, N = x["q"].shape
    P = x["v"].shape[-1]
    for name, n in (("q", N), ("k", N), ("v", P)):
        x[name] = torch.randn(b, L, r, h, n, generator=g, dtype=D64)
    s0 = (s0[0], s0[1], torch.randn(b, r, h, N, generator=g, dtype=D64),
          torch.randn(b, r, h, P, generator=g, dtype=D64))
    return x, s0


@pytest.mark.parametrize("backend, N, P, r", [("torch", 8, 5, 3)] + [
    ("cpu", 8, 5, 3), ("cpu", 16, 8, 3), ("cpu", 16, 16, 4)] * ("cpu" in CHUNKED))
@pytest.mark.parametrize("R", [2, 0])
@pytest.mark.parametrize("L", [1, 23])
def test_mimo_chunked_equals_ref_outputs_state_and_gradients(backend, N, P, r, R, L):
    """torch: one SSD call over the L r rank positions (chunk 7 splits steps' ranks across
    chunks) plus the per-step r x r correction; cpu: the fused C kernel (rotation inside),
    its backward from states stored every 5 steps (L = 23: a partial last chunk) == the
    step-by-step MIMO recurrence. Head sizes: (8, 5) runs the kernel's scalar copy, (16, 8)
    its float64 vector copy with the sizes given at run time, (16, 16) at rank 4 the copy
    compiled for those sizes."""
    from models.kernels import mamba3_mimo_cpu
    from models.kernels.mamba3_scan import mamba3_mimo, mamba3_mimo_ref
    if backend == "cpu":    # the cpu backend is the fused kernel wherever the C kernels build
        assert mamba3_mimo_cpu.load()[0] is not None, mamba3_mimo_cpu.load()[1]
    x, s0 = _mimo_inputs(L, R, r=r, N=N, P=P)
    kw = {"chunk_size": 7 if backend == "torch" else 5}
    assert_op_equals_ref(mamba3_mimo, mamba3_mimo_ref, x, s0, backend=backend, **kw)


@pytest.mark.skipif("cpu" not in CHUNKED, reason="no C compiler")
def test_mimo_cpu_kernel_float32_and_fallback(monkeypatch):
    """The fused kernel in float32 is close to the float64 oracle (head size 16, compiled with
    the size fixed), and without the kernel backend cpu runs the SSD form, still exact."""
    from models.kernels import mamba3_mimo_cpu
    from models.kernels.mamba3_scan import mamba3_mimo, mamba3_mimo_ref
    x, s0 = _mimo_inputs(L=40, R=4)
    g = torch.Generator().manual_seed(9)
    for name in "qkv":
        x[name] = torch.randn(*x[name].shape[:-1], 16, generator=g, dtype=D64)
    s0 = (s0[0], torch.randn(2, 3, 16, 16, generator=g, dtype=D64),
          *(torch.randn(2, 3, 3, 16, generator=g, dtype=D64) for _ in range(2)))
    want, ws = mamba3_mimo_ref(**x, initial_state=s0, output_final_state=True)
    o, s = mamba3_mimo(**{n: t.float() if t is not None else t for n, t in x.items()},
                       initial_state=tuple(t.float() for t in s0), output_final_state=True,
                       backend="cpu")
    assert o.dtype == torch.float32
    torch.testing.assert_close(o.double(), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s[1].double(), ws[1], rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(mamba3_mimo_cpu._LIBRARY, "loaded", (None, "disabled in this test"))
    x, s0 = _mimo_inputs(L=9, R=2)
    assert_op_equals_ref(mamba3_mimo, mamba3_mimo_ref, x, s0, backend="cpu")


def test_mimo_rank_one_is_siso_and_state_chains():
    from models.kernels.mamba3_scan import mamba3_mimo, mamba3_mimo_ref
    x, s0 = _mimo_inputs(L=19, R=2)
    one = {n: t[:, :, :1] if n in "qkv" else t for n, t in x.items()}
    o3 = mamba3_mimo(**one, backend="torch")[0]
    o4 = mamba3(**{n: t[:, :, 0] if n in "qkv" else t for n, t in x.items()}, backend="torch")[0]
    torch.testing.assert_close(o3[:, :, 0], o4, rtol=1e-11, atol=1e-11)
    o, s = mamba3_mimo_ref(**x, initial_state=s0, output_final_state=True)
    cut = 8
    oa, sa = mamba3_mimo(**{n: t[:, :cut] for n, t in x.items()}, initial_state=s0,
                         output_final_state=True, backend="torch")
    ob, sb = mamba3_mimo(**{n: t[:, cut:] for n, t in x.items()}, initial_state=sa,
                         output_final_state=True, backend="torch")
    torch.testing.assert_close(torch.cat([oa, ob], 1), o, rtol=1e-11, atol=1e-11)
    for a, c in zip(sb, s):
        torch.testing.assert_close(a, c, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("kw", [{"mimo_rank": 2}, {"mimo_rank": 3, "outproj_norm": True}])
def test_mimo_mixer_streams_and_counts(kw):
    test_mixer_streaming_equals_forward_and_ref(kw)
    m = _mixer(**kw)
    r = kw["mimo_rank"]
    assert m.mimo_x.shape == m.mimo_o.shape == (m.nheads, r, 8) and m.B_bias.shape == (m.nheads, r, 8)
    assert m.in_proj.weight.shape[0] == 2 * 32 + 2 * 8 * r + 3 * 4 + 2


def test_registry_mimo_option():
    net = models.build("mamba3", d_model=32, n_layers=1, mimo_rank=4)
    assert net.layers[0].mixer.mimo_rank == 4
    assert models.state_size(net) == 2 * (64 * 32 + 4 * (64 + 32) + 16)
    assert net(torch.randn(1, 5, 32)).shape == (1, 5, 32)


def test_bench_ops_measures_mamba3_against_its_ref(capsys, bench_in_process):
    import json

    from workbench.cli import bench
    rc = bench.main(["--ops", "mamba3,mamba3_mimo", "--seq-lens", "12", "--batch", "1",
                     "--heads", "1", "--head-dim", "4", "--repeats", "1", "--warmup", "0",
                     "--format", "json"])
    rows = json.loads(capsys.readouterr().out)["ops"]
    assert rc == 0 and [(r["op"], r["backend"]) for r in rows][:2] == [("mamba3", "ref"),
                                                                          ("mamba3", "torch")]
    assert all("error" not in r and r["fwd_bwd_ms"] > 0 for r in rows), rows
    assert rows[-1]["op"] == "mamba3_mimo" and rows[-1]["x_ref"] > 0


def test_flops_count_the_state_update_per_rank():
    one = models.flops("mamba3", 256).terms["state_update"]
    assert one > 0 and models.flops("mamba3", 256, mimo_rank=4).terms["state_update"] == 4 * one


def _mamba_ssm_mimo_step_ref(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, MIMO_V, MIMO_O,
                             D, Z, MIMO_Z):
    """Transcription (own code) of state-spaces/mamba tests/ops/tilelang/test_mamba3_mimo.py
    ``mamba3_MIMO_step_ref`` (no fused norm), in its layouts: Q, K (b, L, r, h, N), V, Z
    (b, L, h, P), ADT, DT, Trap (b, h, L), biases (h, r, N), Angles (b, L, h, R) raw,
    MIMO_* (h, r, P). Returns y (b, L, h, P)."""
    b, L, r, h, N = Q.shape
    P, R = V.shape[-1], Angles.shape[-1]
    theta = torch.zeros(b, h, R, dtype=Q.dtype)
    S = torch.zeros(b, h, P, N, dtype=Q.dtype)
    Kp, Vp = torch.zeros(b, h, r, N, dtype=Q.dtype), torch.zeros(b, h, r, P, dtype=Q.dtype)
    vr = torch.einsum("bthp,hrp->btrhp", V, MIMO_V)
    zr = torch.einsum("bthp,hrp->btrhp", Z, MIMO_Z)

    ys = []
    for i in range(L):
        q = (Q[:, i] + Q_bias.transpose(0, 1)).permute(0, 2, 1, 3)     # (b, h, r, N)
        k = (K[:, i] + K_bias.transpose(0, 1)).permute(0, 2, 1, 3)
        v, z = vr[:, i].permute(0, 2, 1, 3), zr[:, i].permute(0, 2, 1, 3)
        dt, tr = DT[:, :, i], torch.sigmoid(Trap[:, :, i])
        theta = theta + torch.tanh(Angles[:, i]) * dt[..., None] * math.pi
        q, k = _ssm_rot(q, theta[:, :, None]), _ssm_rot(k, theta[:, :, None])
        a = torch.exp(ADT[:, :, i])
        S = (a[..., None, None] * S
             + ((1 - tr) * dt * a)[..., None, None] * torch.einsum("bhrn,bhrp->bhpn", Kp, Vp)
             + (tr * dt)[..., None, None] * torch.einsum("bhrn,bhrp->bhpn", k, v))
        o = torch.einsum("bhpn,bhrn->bhrp", S, q) + D[None, :, None, None] * v
        o = o * F.silu(z)
        ys.append(torch.einsum("bhrp,hrp->bhp", o, MIMO_O))
        Kp, Vp = k, v
    return torch.stack(ys, 1)


def test_mimo_agrees_with_mamba_ssm_step_reference():
    from models.kernels.mamba3_scan import mamba3_mimo
    g = torch.Generator().manual_seed(4)
    b, L, r, h, N, P, R = 2, 17, 3, 2, 8, 4, 2
    rn = lambda *s: torch.randn(*s, generator=g, dtype=D64)  # noqa: E731
    Q, K, V, Z, Angles = rn(b, L, r, h, N), rn(b, L, r, h, N), rn(b, L, h, P), rn(b, L, h, P), rn(b, L, h, R)
    DT = F.softplus(rn(b, h, L)) * 0.3
    ADT, Trap = -DT * torch.rand(b, h, L, generator=g, dtype=D64), rn(b, h, L)
    Qb, Kb, D = rn(h, r, N), rn(h, r, N), rn(h)
    MV, MO, MZ = rn(h, r, P), rn(h, r, P), rn(h, r, P)
    want = _mamba_ssm_mimo_step_ref(Q, K, V, ADT, DT, Trap, Qb, Kb, Angles, MV, MO, D, Z, MZ)
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    v = V[:, :, None] * MV.transpose(0, 1)
    y, _ = mamba3_mimo(Q + Qb.transpose(0, 1), K + Kb.transpose(0, 1), v, t(ADT), t(DT),
                       torch.sigmoid(t(Trap)), torch.tanh(Angles) * math.pi, chunk_size=5)
    y = (y + D[:, None] * v) * F.silu(Z[:, :, None] * MZ.transpose(0, 1))
    got = (y * MO.transpose(0, 1)).sum(2)
    assert (got - want).abs().max() < 1e-11, (got - want).abs().max()
