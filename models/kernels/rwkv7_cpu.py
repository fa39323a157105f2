"""RWKV-7's pre-operator piece with a hand-written backward (issue 43, training at LM shapes):
the token shift, the five mixes, the r/k/v projections, the decay and in-context-rate
LoRAs, kk and the modified k of ``models.linear_rnn.dplr_mixers.RWKV7Attention``:

    d   = x_{t-1} - x_t                       (x_{-1} = prev)
    x_c = x + d mu_c                           c in r, w, k, v, a
    r, k, v = x_r W_r^T, x_k W_k^T, x_v W_v^T
    h_w = tanh(x_w W_1^T),  s = sigmoid(h_w W_2^T + b_2),  log w = -e^{-1/2} s
    h_a = x_a A_1^T,        a = sigmoid(h_a A_2^T + a_b)
    kk  = normalize_head(k o k_k)              (F.normalize, eps 1e-12)
    outputs: r, k o (1 + (a - 1) o k_a), v, -kk, kk o a, log w

Backward, from the outputs' gradients g_r, g_k', g_v, g_an, g_b, g_lw:
    g_kk = g_b o a - g_an,   g_a = g_b o kk + g_k' o k o k_a,   g_k = g_k' o (1 + (a - 1) k_a)
    g_u  = (g_kk - kk <g_kk, kk>_head) / n     (n = max(|u|, eps), u = k o k_k; g_kk / eps
                                                where |u| <= eps),  g_k += g_u o k_k
    g_za = g_a o a (1 - a),   g_zw = -e^{-1/2} g_lw o s (1 - s)
    the LoRAs and projections by their matmuls (h_a, h_w kept), then
    g_x += sum_c g_{x_c} o (1 - mu_c),  g_x_{t-1} += sum_c g_{x_c} o mu_c,  g_mu_c = sum g_{x_c} o d.

Autograd keeps x, prev and the rank-16 h_w, h_a ((batch, L, 16) each); the backward
rebuilds the mixes and k (one matmul) a slice of ``SLICE`` steps of one batch row at a
time, and never recomputes r, v or the LoRAs' first products. Before this the piece ran
under ``recomputed_in_slices``: its forward twice (three D x D projections recomputed)
and autograd's backward of ~30 ops per slice, with the outputs packed and unpacked by
cat (docs/RESULTS.md, "Training at LM shapes"). The six outputs come back as separate
(batch, L, D) tensors, so their gradients need no concatenation either.

:class:`RWKV7OutFn` does the same for the output piece, W_o [(groupnorm_head(o) + bonus)
o gate] (:func:`rwkv7_out_ref`): it keeps its inputs (the operator's, alive anyway), the
rank-32 gate activations and the norm's statistics, and its backward never recomputes
the product by W_o.

The elementwise chains between the matmuls (the mixes and their gradient sums, the
k / kk / sigmoid chain, the norm + bonus + gate) run in C (``csrc/rwkv7_fused.c``, one
pass per chain; built as :mod:`models.kernels.cpu_kernels` builds its library), or,
without a compiler, as their torch twins (:class:`_TorchChains`, same arguments).
:func:`rwkv7_prep_ref` and :func:`rwkv7_out_ref` are the plain arithmetic under autograd,
the twins the tests compare with (tests/models/test_rwkv7_cpu.py, float64 gradcheck, both
chains).
"""
from __future__ import annotations

import ctypes
import math

import torch
import torch.nn.functional as F

from models.kernels import cpu_kernels as _ck

__all__ = ["RWKV7OutFn", "RWKV7PrepFn", "applies", "rwkv7_out", "rwkv7_out_ref",
           "rwkv7_prep", "rwkv7_prep_ref"]

SLICE = 512            # steps of one batch row per work item, forward and backward
_C0 = math.exp(-0.5)   # log w = -e^{-1/2} sigmoid(...)
_EPS = 1e-12           # F.normalize's
USE_C = True           # the C chains where the library builds (tests switch to the twins)
ABI_VERSION = 1
_LIBRARY = _ck.KernelLibrary("rwkv7_fused", ("rwkv7_fused.c", "kernel_common.h",
                                              "rwkv7_fused_impl.h"),
                             ("rk_abi_version", ABI_VERSION),
                             ("mix_fwd", "mix_bwd", "prep_fwd", "prep_bwd", "out_fwd",
                              "out_bwd"), "RWKV-7 CPU kernel")


def rwkv7_prep_ref(x, prev, mu, w_r, w_k, w_v, w1, w2, b2, a1, a2, ab, k_k, k_a, n_heads):
    """x (batch, T, D), prev (batch, D) the step before x, mu (>= 5, D) (rows r, w, k, v,
    a) -> (r, k', v, -kk, kk a, log w), each (batch, T, D): the module doc's arithmetic."""
    shifted = torch.cat([prev[:, None], x[:, :-1]], 1)
    xr, xw, xk, xv, xa = torch.addcmul(x, shifted - x, mu[:5, None, None])
    r, k, v = F.linear(xr, w_r), F.linear(xk, w_k), F.linear(xv, w_v)
    log_w = -_C0 * F.linear(torch.tanh(F.linear(xw, w1)), w2, b2).sigmoid()
    a = F.linear(F.linear(xa, a1), a2, ab).sigmoid()
    B, T, D = k.shape
    kk = F.normalize((k * k_k).view(B, T, n_heads, -1), dim=-1).view(B, T, D)
    return r, k * (1 + (a - 1) * k_a), v, -kk, kk * a, log_w


def _items(B: int, T: int):
    """(b, s, e) per work item: steps [s, e) of batch row b."""
    for b in range(B):
        for s in range(0, T, SLICE):
            yield b, s, min(T, s + SLICE)


def _row_before(x, prev, b, s):
    """The row before x[b, s]: x[b, s - 1], or prev[b] at s = 0."""
    return x[b, s - 1] if s else prev[b]


# ---------------------------------------------------------------------------------------
# The elementwise chains: csrc/rwkv7_fused.c, and their torch twins (same arguments, the
# oracle of tests/models/test_rwkv7_cpu.py and the path without a C compiler). Rows are
# (n, D) contiguous; "acc" arguments are added to, the others written.
# ---------------------------------------------------------------------------------------

class _TorchChains:
    """The chains in torch."""

    @staticmethod
    def mix_fwd(x, before, mu, out):
        xs = torch.cat([before[None], x[:-1]], 0)
        torch.addcmul(x, xs - x, mu[:, None], out=out)

    @staticmethod
    def mix_bwd(x, before, mu, g, gx, g_before, gmu):
        d = torch.cat([before[None], x[:-1]], 0) - x
        gmu.add_((g * d).sum(1))
        gs = (g * mu[:, None]).sum(0)
        gx.add_(g.sum(0) - gs)
        gx[:-1] += gs[1:]
        g_before.add_(gs[0])

    @staticmethod
    def prep_fwd(k, zw, za, k_k, k_a, H, ok, oan, ob, olw):
        kk, _ = _normalize(k, k_k, H)
        a = za.sigmoid()
        torch.mul(k, (a - 1).mul_(k_a).add_(1), out=ok)
        torch.neg(kk, out=oan)
        torch.mul(kk, a, out=ob)
        torch.mul(zw.sigmoid(), -_C0, out=olw)

    @staticmethod
    def prep_bwd(k, zw, za, k_k, k_a, H, gk2, gan, gb, glw, gk, gza, gzw, gk_a, gk_k, gab,
                 gb2):
        n, D = k.shape
        kk, nrm = _normalize(k, k_k, H)
        a, sw = za.sigmoid(), zw.sigmoid()
        g_kk = gb * a - gan
        g_a = gb * kk + gk2 * k * k_a
        gk_a.add_((gk2 * k * (a - 1)).sum(0))
        g_kk3, kk3 = g_kk.view(n, H, -1), kk.view(n, H, -1)
        dot = (g_kk3 * kk3).sum(-1, keepdim=True).masked_fill_(nrm <= _EPS, 0)
        g_u = ((g_kk3 - kk3 * dot) / nrm).view(n, D)
        gk_k.add_((g_u * k).sum(0))
        torch.mul(gk2, (a - 1).mul_(k_a).add_(1), out=gk).addcmul_(g_u, k_k)
        torch.mul(g_a, a * (1 - a), out=gza)
        torch.mul(glw, sw * (1 - sw) * -_C0, out=gzw)
        gab.add_(gza.sum(0))
        gb2.add_(gzw.sum(0))

    @staticmethod
    def out_fwd(o, r, k, v, r_k, gn_w, gn_b, gate, eps, H, z, mean, rstd):
        n, D = o.shape
        o3 = o.view(n, H, -1)
        var, m = torch.var_mean(o3, -1, correction=0)
        mean.copy_(m)
        torch.rsqrt(var.add_(eps), out=rstd)
        c = (r * k * r_k).view(n, H, -1).sum(-1, keepdim=True)
        pre = ((o3 - mean[..., None]) * rstd[..., None]).view(n, D).mul_(gn_w).add_(gn_b)
        torch.mul(pre.view(n, H, -1).addcmul_(c, v.view(n, H, -1)).view(n, D), gate, out=z)

    @staticmethod
    def out_bwd(o, r, k, v, r_k, gn_w, gn_b, gate, mean, rstd, gz, H, z, go, gr, gk, gv,
                ggate, grk, ggw, ggb):
        n, D = o.shape
        o_hat = ((o.view(n, H, -1) - mean[..., None]) * rstd[..., None]).view(n, D)
        c = (r * k * r_k).view(n, H, -1).sum(-1, keepdim=True)
        pre = (o_hat * gn_w + gn_b).view(n, H, -1).addcmul_(c, v.view(n, H, -1)).view(n, D)
        torch.mul(pre, gate, out=z)
        torch.mul(gz, pre, out=ggate)
        gpre = gz * gate
        gv.view(n, H, -1).copy_(gpre.view(n, H, -1) * c)
        gc = (gpre * v).view(n, H, -1).sum(-1, keepdim=True)
        gcr = (gc * r_k.view(H, -1)).view(n, D)
        torch.mul(gcr, k, out=gr)
        torch.mul(gcr, r, out=gk)
        grk.add_((gc * (r * k).view(n, H, -1)).sum(0).view(D))
        ggw.add_((gpre * o_hat).sum(0))
        ggb.add_(gpre.sum(0))
        g_hat = (gpre * gn_w).view(n, H, -1)
        o_hat3 = o_hat.view(n, H, -1)
        gom = g_hat - g_hat.mean(-1, keepdim=True)
        gom.sub_(o_hat3 * (g_hat * o_hat3).mean(-1, keepdim=True))
        torch.mul(gom, rstd[..., None], out=go.view(n, H, -1))


class _CChains:
    """The chains in C (csrc/rwkv7_fused.c)."""

    @staticmethod
    def _call(kind, tensors, sizes):
        lib = _LIBRARY.library()
        t0 = tensors[0]
        ptrs = (ctypes.c_void_p * len(tensors))(
            *[t if isinstance(t, int) else t.data_ptr() for t in tensors])
        longs = (ctypes.c_long * len(sizes))(*sizes)
        sfx = "f32" if t0.dtype == torch.float32 else "f64"
        if getattr(lib, f"{kind}_{sfx}")(ptrs, longs) != 0:
            raise RuntimeError(f"RWKV-7 kernel {kind}: failed for sizes {sizes}")

    @classmethod
    def mix_fwd(cls, x, before, mu, out):
        cls._call("mix_fwd", [x, before, mu, out], [x.shape[0], x.shape[1], mu.shape[0]])

    @classmethod
    def mix_bwd(cls, x, before, mu, g, gx, g_before, gmu):
        cls._call("mix_bwd", [x, before, mu, g, gx, g_before, gmu],
                  [x.shape[0], x.shape[1], mu.shape[0]])

    @classmethod
    def prep_fwd(cls, k, zw, za, k_k, k_a, H, ok, oan, ob, olw):
        cls._call("prep_fwd", [k, zw, za, k_k, k_a, ok, oan, ob, olw],
                  [k.shape[0], k.shape[1], H])

    @classmethod
    def prep_bwd(cls, k, zw, za, k_k, k_a, H, gk2, gan, gb, glw, gk, gza, gzw, gk_a, gk_k,
                 gab, gb2):
        cls._call("prep_bwd", [k, zw, za, k_k, k_a, gk2, gan, gb, glw, gk, gza, gzw, gk_a,
                               gk_k, gab, gb2], [k.shape[0], k.shape[1], H])

    @classmethod
    def out_fwd(cls, o, r, k, v, r_k, gn_w, gn_b, gate, eps, H, z, mean, rstd):
        e = ctypes.c_double(eps)
        cls._call("out_fwd", [o, r, k, v, r_k, gn_w, gn_b, gate, z, mean, rstd,
                              ctypes.addressof(e)], [o.shape[0], o.shape[1], H])

    @classmethod
    def out_bwd(cls, o, r, k, v, r_k, gn_w, gn_b, gate, mean, rstd, gz, H, z, go, gr, gk,
                gv, ggate, grk, ggw, ggb):
        cls._call("out_bwd", [o, r, k, v, r_k, gn_w, gn_b, gate, mean, rstd, gz, z, go, gr,
                              gk, gv, ggate, grk, ggw, ggb], [o.shape[0], o.shape[1], H])


def chains():
    """The C chains when the library builds (and :data:`USE_C`), else the torch twins."""
    return _CChains if USE_C and _LIBRARY.load()[0] is not None else _TorchChains


def _normalize(k, k_k, H):
    """kk = k o k_k / max(|k o k_k|_head, eps) and the clamped norms (n, H, 1)."""
    n = k.shape[0]
    u = (k * k_k).view(n, H, -1)
    nrm = torch.linalg.vector_norm(u, dim=-1, keepdim=True).clamp_min_(_EPS)
    return (u / nrm).view(n, -1), nrm


def _c(t):
    return t if t.is_contiguous() else t.contiguous()


class RWKV7PrepFn(torch.autograd.Function):
    """forward(x, prev, mu5, w_r, w_k, w_v, w1, w2, b2, a1, a2, ab, k_k, k_a, n_heads) ->
    (r, k', v, a_neg, b, log_w); shapes as :func:`rwkv7_prep_ref` (mu5 (5, D)); x, prev
    contiguous."""

    @staticmethod
    def forward(ctx, x, prev, mu5, w_r, w_k, w_v, w1, w2, b2, a1, a2, ab, k_k, k_a, n_heads):
        ops = chains()
        B, T, D = x.shape
        mu5, k_k, k_a = _c(mu5), _c(k_k), _c(k_a)
        outs = [x.new_empty(B, T, D) for _ in range(6)]
        r_o, k_o, v_o, an_o, b_o, lw_o = outs
        hw = x.new_empty(B, T, w1.shape[0])
        ha = x.new_empty(B, T, a1.shape[0])
        xc = x.new_empty(5 * min(SLICE, T) * D)
        for b, s, e in _items(B, T):
            xi = xc[:5 * (e - s) * D].view(5, e - s, D)
            ops.mix_fwd(x[b, s:e], _row_before(x, prev, b, s), mu5, xi)
            torch.mm(xi[0], w_r.t(), out=r_o[b, s:e])
            torch.mm(xi[3], w_v.t(), out=v_o[b, s:e])
            k = xi[2] @ w_k.t()
            torch.tanh(xi[1] @ w1.t(), out=hw[b, s:e])
            torch.mm(xi[4], a1.t(), out=ha[b, s:e])
            zw = torch.addmm(b2, hw[b, s:e], w2.t())
            za = torch.addmm(ab, ha[b, s:e], a2.t())
            ops.prep_fwd(k, zw, za, k_k, k_a, n_heads, k_o[b, s:e], an_o[b, s:e],
                         b_o[b, s:e], lw_o[b, s:e])
        ctx.save_for_backward(x, prev, mu5, w_r, w_k, w_v, w1, w2, b2, a1, a2, ab, k_k, k_a,
                              hw, ha)
        ctx.n_heads = n_heads
        return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        (x, prev, mu5, w_r, w_k, w_v, w1, w2, b2, a1, a2, ab, k_k, k_a, hw,
         ha) = ctx.saved_tensors
        ops = chains()
        H = ctx.n_heads
        B, T, D = x.shape
        g_r, g_k2, g_v, g_an, g_b, g_lw = (x.new_zeros(B, T, D) if g is None else _c(g)
                                           for g in grads)
        gx = torch.zeros_like(x)
        gprev = torch.zeros_like(prev)
        gmu = torch.zeros_like(mu5)
        gw = [torch.zeros_like(w) for w in (w_r, w_k, w_v, w1, w2, b2, a1, a2, ab, k_k, k_a)]
        gw_r, gw_k, gw_v, gw1, gw2, gb2, ga1, ga2, gab, gk_k, gk_a = gw
        m = min(SLICE, T)
        xc, gxc = x.new_empty(5 * m * D), x.new_empty(5 * m * D)
        gk, gza, gzw = (x.new_empty(m, D) for _ in range(3))
        for b, s, e in _items(B, T):
            n = e - s
            xi, gi = xc[:5 * n * D].view(5, n, D), gxc[:5 * n * D].view(5, n, D)
            ops.mix_fwd(x[b, s:e], _row_before(x, prev, b, s), mu5, xi)
            k = xi[2] @ w_k.t()
            hw_i, ha_i = hw[b, s:e], ha[b, s:e]
            zw = torch.addmm(b2, hw_i, w2.t())
            za = torch.addmm(ab, ha_i, a2.t())
            ops.prep_bwd(k, zw, za, k_k, k_a, H, g_k2[b, s:e], g_an[b, s:e], g_b[b, s:e],
                         g_lw[b, s:e], gk[:n], gza[:n], gzw[:n], gk_a, gk_k, gab, gb2)
            g_k, g_za, g_zw = gk[:n], gza[:n], gzw[:n]
            ga2.addmm_(g_za.t(), ha_i)
            g_ha = g_za @ a2
            gw2.addmm_(g_zw.t(), hw_i)
            g_hp = (g_zw @ w2).mul_(1 - hw_i * hw_i)
            torch.mm(g_r[b, s:e], w_r, out=gi[0])
            torch.mm(g_hp, w1, out=gi[1])
            torch.mm(g_k, w_k, out=gi[2])
            torch.mm(g_v[b, s:e], w_v, out=gi[3])
            torch.mm(g_ha, a1, out=gi[4])
            gw_r.addmm_(g_r[b, s:e].t(), xi[0])
            gw1.addmm_(g_hp.t(), xi[1])
            gw_k.addmm_(g_k.t(), xi[2])
            gw_v.addmm_(g_v[b, s:e].t(), xi[3])
            ga1.addmm_(g_ha.t(), xi[4])
            ops.mix_bwd(x[b, s:e], _row_before(x, prev, b, s), mu5, gi, gx[b, s:e],
                        _row_before(gx, gprev, b, s), gmu)
        return (gx, gprev, gmu, *gw, None)


def rwkv7_out_ref(o, x, prev, r, k, v, mu_g, g1, g2, r_k, gn_w, gn_b, w_o, eps):
    """The output piece: o (batch, T, H, K) the operator's output, x (batch, T, D) and prev
    (batch, D) as for the prep, r, k, v (batch, T, H, K) the operator's inputs ->
    W_o [(groupnorm_head(o) + bonus) o gate] (batch, T, D), with
    gate = sigmoid(x_g G_1^T) G_2^T, x_g = x + (x_{t-1} - x) mu_g, and
    bonus = ((r o k o r_k).sum per head) v."""
    shifted = torch.cat([prev[:, None], x[:, :-1]], 1)
    gate = F.linear(F.linear(torch.addcmul(x, shifted - x, mu_g), g1).sigmoid(), g2)
    bonus = ((r * k * r_k).sum(-1, keepdim=True) * v).flatten(-2)
    B, T, H = o.shape[:3]
    on = F.group_norm(o.reshape(B * T, -1), H, gn_w, gn_b, eps).reshape(B, T, -1)
    return F.linear((on + bonus) * gate, w_o)


class RWKV7OutFn(torch.autograd.Function):
    """forward(o, x, prev, r, k, v, mu_g, g1, g2, r_k, gn_w, gn_b, w_o, eps) -> y
    (batch, T, D), as :func:`rwkv7_out_ref`; o, r, k, v (batch, T, H, K) and x, prev
    contiguous. Keeps its inputs (alive anyway: the operator's), the rank-32
    sigmoid(x_g G_1^T) and the norm's (mean, 1/std) per head; the backward rebuilds the
    normalised o, the bonus and the gate a slice at a time, never the product by W_o."""

    @staticmethod
    def forward(ctx, o, x, prev, r, k, v, mu_g, g1, g2, r_k, gn_w, gn_b, w_o, eps):
        ops = chains()
        B, T, H, K = o.shape
        D = H * K
        ctx.mu_shape, ctx.rk_shape = mu_g.shape, r_k.shape
        mu_g = _c(mu_g).view(1, D)
        r_k, gn_w, gn_b = (_c(t).view(D) for t in (r_k, gn_w, gn_b))
        o2, r2, k2, v2 = (t.view(B, T, D) for t in (o, r, k, v))
        y = x.new_empty(B, T, D)
        hg = x.new_empty(B, T, g1.shape[0])
        mean, rstd = x.new_empty(B, T, H), x.new_empty(B, T, H)
        m = min(SLICE, T)
        xg, z = x.new_empty(1, m, D), x.new_empty(m, D)
        for b, s, e in _items(B, T):
            n = e - s
            ops.mix_fwd(x[b, s:e], _row_before(x, prev, b, s), mu_g, xg[:, :n])
            torch.mm(xg[0, :n], g1.t(), out=hg[b, s:e]).sigmoid_()
            gate = hg[b, s:e] @ g2.t()
            ops.out_fwd(o2[b, s:e], r2[b, s:e], k2[b, s:e], v2[b, s:e], r_k, gn_w, gn_b,
                        gate, eps, H, z[:n], mean[b, s:e], rstd[b, s:e])
            torch.mm(z[:n], w_o.t(), out=y[b, s:e])
        ctx.save_for_backward(o, x, prev, r, k, v, mu_g, g1, g2, r_k, gn_w, gn_b, w_o, hg,
                              mean, rstd)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        (o, x, prev, r, k, v, mu_g, g1, g2, r_k, gn_w, gn_b, w_o, hg, mean,
         rstd) = ctx.saved_tensors
        ops = chains()
        B, T, H, K = o.shape
        D = H * K
        gy = _c(gy)
        o2, r2, k2, v2 = (t.view(B, T, D) for t in (o, r, k, v))
        go, gr, gk, gv = (x.new_empty(B, T, D) for _ in range(4))
        gx = torch.zeros_like(x)
        gprev = torch.zeros_like(prev)
        gmu, gg1, gg2, grk, gw, gb, gwo = (torch.zeros_like(t) for t in
                                           (mu_g, g1, g2, r_k, gn_w, gn_b, w_o))
        m = min(SLICE, T)
        xg, gxg = x.new_empty(1, m, D), x.new_empty(1, m, D)
        z, ggate = x.new_empty(m, D), x.new_empty(m, D)
        for b, s, e in _items(B, T):
            n = e - s
            hgi, gyi = hg[b, s:e], gy[b, s:e]
            gate = hgi @ g2.t()
            gz = gyi @ w_o
            ops.out_bwd(o2[b, s:e], r2[b, s:e], k2[b, s:e], v2[b, s:e], r_k, gn_w, gn_b,
                        gate, mean[b, s:e], rstd[b, s:e], gz, H, z[:n], go[b, s:e],
                        gr[b, s:e], gk[b, s:e], gv[b, s:e], ggate[:n], grk, gw, gb)
            gwo.addmm_(gyi.t(), z[:n])
            gg2.addmm_(ggate[:n].t(), hgi)
            g_hp = (ggate[:n] @ g2).mul_(hgi * (1 - hgi))
            before = _row_before(x, prev, b, s)
            ops.mix_fwd(x[b, s:e], before, mu_g, xg[:, :n])
            gg1.addmm_(g_hp.t(), xg[0, :n])
            torch.mm(g_hp, g1, out=gxg[0, :n])
            ops.mix_bwd(x[b, s:e], before, mu_g, gxg[:, :n], gx[b, s:e],
                        _row_before(gx, gprev, b, s), gmu)
        return (go.view(o.shape), gx, gprev, gr.view(o.shape), gk.view(o.shape),
                gv.view(o.shape), gmu.view(ctx.mu_shape), gg1, gg2, grk.view(ctx.rk_shape),
                gw, gb, gwo, None)


def applies(x: torch.Tensor) -> bool:
    """Whether :class:`RWKV7PrepFn` runs for x: a CPU tensor in float32 / float64."""
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)


def rwkv7_prep(x, prev, mu, w_r, w_k, w_v, w1, w2, b2, a1, a2, ab, k_k, k_a, n_heads):
    """:func:`rwkv7_prep_ref`'s outputs through :class:`RWKV7PrepFn` where it
    :func:`applies` (parameters cast to x's dtype), else the reference."""
    params = (mu[:5], w_r, w_k, w_v, w1, w2, b2, a1, a2, ab, k_k, k_a)
    if not applies(x) or any(p.dtype != x.dtype for p in (prev, *params)):
        return rwkv7_prep_ref(x, prev, mu, w_r, w_k, w_v, w1, w2, b2, a1, a2, ab, k_k, k_a,
                              n_heads)
    return RWKV7PrepFn.apply(x.contiguous(), prev.contiguous(), *params, n_heads)


def rwkv7_out(o, x, prev, r, k, v, mu_g, g1, g2, r_k, gn_w, gn_b, w_o, eps):
    """:func:`rwkv7_out_ref`'s output through :class:`RWKV7OutFn` where it :func:`applies`
    (every tensor in x's dtype), else the reference."""
    ts = (o, prev, r, k, v, mu_g, g1, g2, r_k, gn_w, gn_b, w_o)
    if not applies(x) or any(t.dtype != x.dtype for t in ts):
        return rwkv7_out_ref(o, x, prev, r, k, v, mu_g, g1, g2, r_k, gn_w, gn_b, w_o, eps)
    o, x, prev, r, k, v = (t.contiguous() for t in (o, x, prev, r, k, v))
    return RWKV7OutFn.apply(o, x, prev, r, k, v, mu_g, g1, g2, r_k, gn_w, gn_b, w_o, eps)
