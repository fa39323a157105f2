"""Triton kernels of the Mamba block: the fused selective scan and the causal depthwise conv.

Imported only through :mod:`models.kernels.triton_kernels` (which catches a missing or
broken Triton). The maths is the one in :mod:`models.kernels.selective_scan`'s docstring;
this file is the GPU schedule of it.

**Selective scan.** One program per (batch row, tile of ``BD`` channels) walks the sequence
in chunks of ``BT`` steps. A chunk's decays and inputs,

    a_t = exp(delta_t A)          (BT, BD, BN)    ZOH
    b_t = delta_t u_t B_t         (BT, BD, BN)    Euler

are combined by a parallel prefix scan along time (``tl.associative_scan`` with the
operator (a1, b1) . (a2, b2) = (a1 a2, a2 b1 + b2)), giving for every step t of the chunk
the product of decays P_t and the state H_t reached from a zero state; the true state is
h_t = H_t + P_t h_in, with h_in carried from the previous chunk in registers. So the state
lives in float32 registers and never touches memory except once per chunk, where it is
stored for the backward pass (``ckpt``: the state entering every chunk).

The backward pass walks the chunks in reverse. It recomputes the chunk's states from its
checkpoint, then the adjoint g_t = dL/dh_t with a reverse scan of the same operator over

    g_t = C_t dy_t + a_{t+1} g_{t+1}        (a_{t+1} loaded from the next step's delta)

plus ``carry`` = the gradient flowing in from after the chunk. With g and h all parameter
gradients of the chunk are elementwise products and sums: e.g. dL/d(delta_t A) needs
a_t h_{t-1}, which is h_t - b_t (so no shifted copy of the states is needed).

Masked steps past the end of the sequence get delta = 0, hence a = 1 and b = 0: they leave
the state unchanged, so the state after a chunk is always its last row.

**Causal conv.** out[t] = act(bias + sum_j w[j] x[t - (K-1) + j]), with ``left`` holding the
K-1 inputs before t = 0 (streaming); backward in two kernels: the pre-activation gradient
(with weight and bias gradients per time tile), then the input gradient by the transposed
stencil, which also yields the gradient of ``left``.

All loads are cast to the compute dtype (float32, or float64 for float64 inputs) and all
stores cast to the destination's dtype, so bfloat16/float16 inputs and outputs work.
Strides are arguments: any (batch, time, channel) layout is read and written in place.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _first_order_combine(a1, b1, a2, b2):
    """(a1, b1) then (a2, b2): h -> a2 (a1 h + b1) + b2."""
    return a1 * a2, a2 * b1 + b2


@triton.jit
def _softplus(x):
    # log1p is not in every Triton backend (the interpreter lacks it); above 20 it is x.
    return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))


@triton.jit
def _channel_tile(A_ptr, D_ptr, bias_ptr, pid_d, dim, N, HAS_D: tl.constexpr,
                  HAS_BIAS: tl.constexpr, COMPUTE: tl.constexpr, BD: tl.constexpr,
                  BN: tl.constexpr):
    """A program's channels d (BD,) and state indices n (BN,), their masks, the (BD, BN)
    offsets and mask into (dim, N) arrays, and its rows of A (BD, BN), D and delta_bias
    (BD,; zeros when absent)."""
    d = pid_d * BD + tl.arange(0, BD)
    n = tl.arange(0, BN)
    dmask = d < dim
    nmask = n < N
    dn_mask = dmask[:, None] & nmask[None, :]
    dn_off = d[:, None] * N + n[None, :]
    A = tl.load(A_ptr + dn_off, mask=dn_mask, other=0.0).to(COMPUTE)
    if HAS_D:
        Dv = tl.load(D_ptr + d, mask=dmask, other=0.0).to(COMPUTE)
    else:
        Dv = tl.zeros((BD,), dtype=COMPUTE)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + d, mask=dmask, other=0.0).to(COMPUTE)
    else:
        bias = tl.zeros((BD,), dtype=COMPUTE)
    return d, n, dmask, nmask, dn_mask, dn_off, A, Dv, bias


@triton.jit
def _load_chunk(u_ptr, delta_ptr, bias, B_ptr, C_ptr, b, t, d, n, L, dim, N,
                su_b, su_t, su_d, sdt_b, sdt_t, sdt_d, sB_b, sB_t, sB_n, sC_b, sC_t, sC_n,
                HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, COMPUTE: tl.constexpr):
    """One chunk's inputs at times t (BT,): u (BT, BD); delta + bias before softplus
    (dt_raw) and after it, zero at padded steps (dt); B, C (BT, BN)."""
    tmask = t < L
    td_mask = tmask[:, None] & (d < dim)[None, :]
    tn_mask = tmask[:, None] & (n < N)[None, :]
    u = tl.load(u_ptr + b * su_b + t[:, None] * su_t + d[None, :] * su_d,
                mask=td_mask, other=0.0).to(COMPUTE)
    dt_raw = tl.load(delta_ptr + b * sdt_b + t[:, None] * sdt_t + d[None, :] * sdt_d,
                     mask=td_mask, other=0.0).to(COMPUTE)
    if HAS_BIAS:
        dt_raw = dt_raw + bias[None, :]
    if SOFTPLUS:
        dt = _softplus(dt_raw)
    else:
        dt = dt_raw
    dt = tl.where(td_mask, dt, 0.0)                                       # padding: identity step
    Bt = tl.load(B_ptr + b * sB_b + t[:, None] * sB_t + n[None, :] * sB_n,
                 mask=tn_mask, other=0.0).to(COMPUTE)
    Ct = tl.load(C_ptr + b * sC_b + t[:, None] * sC_t + n[None, :] * sC_n,
                 mask=tn_mask, other=0.0).to(COMPUTE)
    return u, dt_raw, dt, Bt, Ct


@triton.jit
def _chunk_states(dt, u, Bt, A, h_in):
    """States of one chunk from the state entering it: decay a_t, input b_t and h_t, all
    (BT, BD, BN), by a parallel prefix scan along time."""
    decay = tl.exp(dt[:, :, None] * A[None, :, :])                        # ZOH
    inp = (dt * u)[:, :, None] * Bt[:, None, :]                           # Euler
    P, H = tl.associative_scan((decay, inp), 0, _first_order_combine)
    return decay, inp, H + P * h_in[None, :, :]


@triton.jit
def selective_scan_fwd_kernel(
    u_ptr, delta_ptr, z_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, h0_ptr,
    out_ptr, hlast_ptr, ckpt_ptr,
    L, dim, N, n_chunks,
    su_b, su_t, su_d, sdt_b, sdt_t, sdt_d, sz_b, sz_t, sz_d,
    sB_b, sB_t, sB_n, sC_b, sC_t, sC_n, so_b, so_t, so_d,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_H0: tl.constexpr,
    SOFTPLUS: tl.constexpr, SAVE_CKPT: tl.constexpr, COMPUTE: tl.constexpr,
    BT: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr,
):
    """Grid (cdiv(dim, BD), batch). u, delta, z, out: (batch, L, dim); B, C: (batch, L, N);
    A: (dim, N) contiguous; D, bias: (dim,); h0, hlast: (batch, dim, N) contiguous;
    ckpt: (batch, n_chunks, dim, N) contiguous, the state entering each chunk."""
    pid_d = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    d, n, dmask, nmask, dn_mask, dn_off, A, Dv, bias = _channel_tile(
        A_ptr, D_ptr, bias_ptr, pid_d, dim, N, HAS_D, HAS_BIAS, COMPUTE, BD, BN)
    state_off = b * dim * N + dn_off
    if HAS_H0:
        h = tl.load(h0_ptr + state_off, mask=dn_mask, other=0.0).to(COMPUTE)
    else:
        h = tl.zeros((BD, BN), dtype=COMPUTE)
    t_local = tl.arange(0, BT)
    is_last = (t_local == BT - 1)[:, None, None]
    for c in range(0, n_chunks):
        if SAVE_CKPT:
            tl.store(ckpt_ptr + (b * n_chunks + c) * dim * N + dn_off, h, mask=dn_mask)
        t = c * BT + t_local
        td_mask = (t < L)[:, None] & dmask[None, :]
        u, dt_raw, dt, Bt, Ct = _load_chunk(
            u_ptr, delta_ptr, bias, B_ptr, C_ptr, b, t, d, n, L, dim, N,
            su_b, su_t, su_d, sdt_b, sdt_t, sdt_d, sB_b, sB_t, sB_n, sC_b, sC_t, sC_n,
            HAS_BIAS, SOFTPLUS, COMPUTE)
        decay, inp, hs = _chunk_states(dt, u, Bt, A, h)
        y = tl.sum(hs * Ct[:, None, :], axis=2)                             # (BT, BD)
        if HAS_D:
            y = y + Dv[None, :] * u
        if HAS_Z:
            zt = tl.load(z_ptr + b * sz_b + t[:, None] * sz_t + d[None, :] * sz_d,
                         mask=td_mask, other=0.0).to(COMPUTE)
            y = y * zt * tl.sigmoid(zt)
        tl.store(out_ptr + b * so_b + t[:, None] * so_t + d[None, :] * so_d, y, mask=td_mask)
        h = tl.sum(tl.where(is_last, hs, 0.0), axis=0)
    tl.store(hlast_ptr + state_off, h, mask=dn_mask)


@triton.jit
def selective_scan_bwd_kernel(
    u_ptr, delta_ptr, z_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, ckpt_ptr,
    dout_ptr, dhlast_ptr,
    du_ptr, ddelta_ptr, dz_ptr, dA_ptr, dD_ptr, dbias_ptr, dB_ptr, dC_ptr, dh0_ptr,
    L, dim, N, n_chunks, n_dtiles,
    su_b, su_t, su_d, sdt_b, sdt_t, sdt_d, sz_b, sz_t, sz_d,
    sB_b, sB_t, sB_n, sC_b, sC_t, sC_n, sdo_b, sdo_t, sdo_d,
    sg_b, sg_t, sg_d,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_DHLAST: tl.constexpr, SOFTPLUS: tl.constexpr, COMPUTE: tl.constexpr,
    BT: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr,
):
    """Grid (cdiv(dim, BD), batch). Inputs as in the forward kernel; dout: (batch, L, dim);
    dhlast, dh0: (batch, dim, N). Outputs: du, ddelta (raw delta, before bias/softplus), dz
    with strides sg_*; per-program partial sums: dA (batch, dim, N), dD, dbias (batch, dim),
    dB, dC (batch, n_dtiles, L, N) contiguous (summed over batch / tiles by the caller)."""
    pid_d = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    d, n, dmask, nmask, dn_mask, dn_off, A, Dv, bias = _channel_tile(
        A_ptr, D_ptr, bias_ptr, pid_d, dim, N, HAS_D, HAS_BIAS, COMPUTE, BD, BN)
    state_off = b * dim * N + dn_off
    if HAS_DHLAST:
        carry = tl.load(dhlast_ptr + state_off, mask=dn_mask, other=0.0).to(COMPUTE)
    else:
        carry = tl.zeros((BD, BN), dtype=COMPUTE)
    dA_acc = tl.zeros((BD, BN), dtype=COMPUTE)
    dD_acc = tl.zeros((BD,), dtype=COMPUTE)
    dbias_acc = tl.zeros((BD,), dtype=COMPUTE)
    t_local = tl.arange(0, BT)
    is_first = (t_local == 0)[:, None, None]
    for i in range(0, n_chunks):
        c = n_chunks - 1 - i
        t = c * BT + t_local
        td_mask = (t < L)[:, None] & dmask[None, :]
        tn_mask = (t < L)[:, None] & nmask[None, :]
        u, dt_raw, dt, Bt, Ct = _load_chunk(
            u_ptr, delta_ptr, bias, B_ptr, C_ptr, b, t, d, n, L, dim, N,
            su_b, su_t, su_d, sdt_b, sdt_t, sdt_d, sB_b, sB_t, sB_n, sC_b, sC_t, sC_n,
            HAS_BIAS, SOFTPLUS, COMPUTE)
        # a_{t+1}: the next step's decay, within this chunk (the chunk's last step takes carry)
        t1 = t + 1
        next_mask = ((t_local < BT - 1) & (t1 < L))[:, None] & dmask[None, :]
        dt1 = tl.load(delta_ptr + b * sdt_b + t1[:, None] * sdt_t + d[None, :] * sdt_d,
                      mask=next_mask, other=0.0).to(COMPUTE)
        if HAS_BIAS:
            dt1 = dt1 + bias[None, :]
        if SOFTPLUS:
            dt1 = _softplus(dt1)
        dt1 = tl.where(next_mask, dt1, 0.0)                                 # a = exp(0) = 1
        dout = tl.load(dout_ptr + b * sdo_b + t[:, None] * sdo_t + d[None, :] * sdo_d,
                       mask=td_mask, other=0.0).to(COMPUTE)
        h_in = tl.load(ckpt_ptr + (b * n_chunks + c) * dim * N + dn_off,
                       mask=dn_mask, other=0.0).to(COMPUTE)
        decay, inp, hs = _chunk_states(dt, u, Bt, A, h_in)                  # recomputed
        # gate and skip
        if HAS_Z:
            zt = tl.load(z_ptr + b * sz_b + t[:, None] * sz_t + d[None, :] * sz_d,
                         mask=td_mask, other=0.0).to(COMPUTE)
            sig = tl.sigmoid(zt)
            y = tl.sum(hs * Ct[:, None, :], axis=2)
            if HAS_D:
                y = y + Dv[None, :] * u
            dz = dout * y * sig * (1.0 + zt * (1.0 - sig))
            tl.store(dz_ptr + b * sg_b + t[:, None] * sg_t + d[None, :] * sg_d, dz, mask=td_mask)
            dy = dout * zt * sig
        else:
            dy = dout
        if HAS_D:
            du = dy * Dv[None, :]
            dD_acc += tl.sum(dy * u, axis=0)
        else:
            du = tl.zeros((BT, BD), dtype=COMPUTE)
        # adjoint g_t = C_t dy_t + a_{t+1} g_{t+1}, then + (prod of a's) * carry
        decay_next = tl.exp(dt1[:, :, None] * A[None, :, :])
        Q, G = tl.associative_scan((decay_next, Ct[:, None, :] * dy[:, :, None]), 0,
                                   _first_order_combine, reverse=True)
        g = G + Q * carry[None, :, :]
        carry = tl.sum(tl.where(is_first, decay * g, 0.0), axis=0)         # dL/dh_{s-1}
        g_decay_h = g * (hs - inp)                                          # g_t a_t h_{t-1}
        dA_acc += tl.sum(g_decay_h * dt[:, :, None], axis=0)
        gB = tl.sum(g * Bt[:, None, :], axis=2)                             # (BT, BD)
        du += gB * dt
        ddt = tl.sum(g_decay_h * A[None, :, :], axis=2) + gB * u
        if SOFTPLUS:
            ddt = ddt * tl.sigmoid(dt_raw)
        ddt = tl.where(td_mask, ddt, 0.0)
        dbias_acc += tl.sum(ddt, axis=0)
        tl.store(du_ptr + b * sg_b + t[:, None] * sg_t + d[None, :] * sg_d, du, mask=td_mask)
        tl.store(ddelta_ptr + b * sg_b + t[:, None] * sg_t + d[None, :] * sg_d, ddt, mask=td_mask)
        dB = tl.sum(g * (dt * u)[:, :, None], axis=1)                       # (BT, BN)
        dC = tl.sum(hs * dy[:, :, None], axis=1)
        part_off = ((b * n_dtiles + pid_d) * L + t[:, None]) * N + n[None, :]
        tl.store(dB_ptr + part_off, dB, mask=tn_mask)
        tl.store(dC_ptr + part_off, dC, mask=tn_mask)
    tl.store(dA_ptr + state_off, dA_acc, mask=dn_mask)
    tl.store(dh0_ptr + state_off, carry, mask=dn_mask)
    if HAS_D:
        tl.store(dD_ptr + b * dim + d, dD_acc, mask=dmask)
    if HAS_BIAS:
        tl.store(dbias_ptr + b * dim + d, dbias_acc, mask=dmask)


@triton.jit
def _conv_pre(x_ptr, w_ptr, bias_ptr, left_ptr, b, t, d, dim, L, sx_b, sx_t, sx_d,
              HAS_BIAS: tl.constexpr, HAS_LEFT: tl.constexpr, COMPUTE: tl.constexpr,
              K: tl.constexpr, BLT: tl.constexpr, BLD: tl.constexpr):
    """Pre-activation of the causal conv at times t (BLT,) and channels d (BLD,)."""
    dmask = d < dim
    if HAS_BIAS:
        acc = tl.zeros((BLT, BLD), dtype=COMPUTE) + tl.load(
            bias_ptr + d, mask=dmask, other=0.0).to(COMPUTE)[None, :]
    else:
        acc = tl.zeros((BLT, BLD), dtype=COMPUTE)
    for j in tl.static_range(K):
        src = t - (K - 1) + j
        m = ((src >= 0) & (src < L))[:, None] & dmask[None, :]
        xv = tl.load(x_ptr + b * sx_b + src[:, None] * sx_t + d[None, :] * sx_d,
                     mask=m, other=0.0).to(COMPUTE)
        if HAS_LEFT:
            ml = ((src < 0) & (t < L))[:, None] & dmask[None, :]
            xv += tl.load(left_ptr + (b * (K - 1) + (src[:, None] + K - 1)) * dim + d[None, :],
                          mask=ml, other=0.0).to(COMPUTE)
        w = tl.load(w_ptr + d * K + j, mask=dmask, other=0.0).to(COMPUTE)
        acc += w[None, :] * xv
    return acc


@triton.jit
def causal_conv_fwd_kernel(
    x_ptr, w_ptr, bias_ptr, left_ptr, out_ptr, L, dim,
    sx_b, sx_t, sx_d, so_b, so_t, so_d,
    HAS_BIAS: tl.constexpr, HAS_LEFT: tl.constexpr, SILU: tl.constexpr, COMPUTE: tl.constexpr,
    K: tl.constexpr, BLT: tl.constexpr, BLD: tl.constexpr,
):
    """Grid (cdiv(L, BLT), cdiv(dim, BLD), batch). x, out: (batch, L, dim) any strides;
    w: (dim, K) contiguous; bias: (dim,); left: (batch, K-1, dim) contiguous."""
    b = tl.program_id(2).to(tl.int64)
    t = tl.program_id(0) * BLT + tl.arange(0, BLT)
    d = tl.program_id(1) * BLD + tl.arange(0, BLD)
    pre = _conv_pre(x_ptr, w_ptr, bias_ptr, left_ptr, b, t, d, dim, L, sx_b, sx_t, sx_d,
                    HAS_BIAS, HAS_LEFT, COMPUTE, K, BLT, BLD)
    if SILU:
        pre = pre * tl.sigmoid(pre)
    m = (t < L)[:, None] & (d < dim)[None, :]
    tl.store(out_ptr + b * so_b + t[:, None] * so_t + d[None, :] * so_d, pre, mask=m)


@triton.jit
def causal_conv_bwd_pre_kernel(
    x_ptr, w_ptr, bias_ptr, left_ptr, dout_ptr, dpre_ptr, dw_ptr, dbias_ptr, L, dim, n_ttiles,
    sx_b, sx_t, sx_d, sdo_b, sdo_t, sdo_d,
    HAS_BIAS: tl.constexpr, HAS_LEFT: tl.constexpr, SILU: tl.constexpr, COMPUTE: tl.constexpr,
    K: tl.constexpr, BLT: tl.constexpr, BLD: tl.constexpr,
):
    """dpre = dout * act'(pre) into dpre (batch, L, dim) contiguous; per time tile partial
    sums dw (batch, n_ttiles, K, dim) and dbias (batch, n_ttiles, dim)."""
    b = tl.program_id(2).to(tl.int64)
    pid_t = tl.program_id(0)
    t = pid_t * BLT + tl.arange(0, BLT)
    d = tl.program_id(1) * BLD + tl.arange(0, BLD)
    dmask = d < dim
    m = (t < L)[:, None] & dmask[None, :]
    dout = tl.load(dout_ptr + b * sdo_b + t[:, None] * sdo_t + d[None, :] * sdo_d,
                   mask=m, other=0.0).to(COMPUTE)
    if SILU:
        pre = _conv_pre(x_ptr, w_ptr, bias_ptr, left_ptr, b, t, d, dim, L, sx_b, sx_t, sx_d,
                        HAS_BIAS, HAS_LEFT, COMPUTE, K, BLT, BLD)
        sig = tl.sigmoid(pre)
        dpre = dout * sig * (1.0 + pre * (1.0 - sig))
    else:
        dpre = dout
    dpre = tl.where(m, dpre, 0.0)
    tl.store(dpre_ptr + (b * L + t[:, None]) * dim + d[None, :], dpre, mask=m)
    tile = b * n_ttiles + pid_t
    if HAS_BIAS:
        tl.store(dbias_ptr + tile * dim + d, tl.sum(dpre, axis=0), mask=dmask)
    for j in tl.static_range(K):
        src = t - (K - 1) + j
        ms = ((src >= 0) & (src < L))[:, None] & dmask[None, :]
        xv = tl.load(x_ptr + b * sx_b + src[:, None] * sx_t + d[None, :] * sx_d,
                     mask=ms, other=0.0).to(COMPUTE)
        if HAS_LEFT:
            ml = ((src < 0) & (t < L))[:, None] & dmask[None, :]
            xv += tl.load(left_ptr + (b * (K - 1) + (src[:, None] + K - 1)) * dim + d[None, :],
                          mask=ml, other=0.0).to(COMPUTE)
        tl.store(dw_ptr + (tile * K + j) * dim + d, tl.sum(dpre * xv, axis=0), mask=dmask)


@triton.jit
def causal_conv_bwd_input_kernel(
    dpre_ptr, w_ptr, dx_ptr, dleft_ptr, L, dim, sg_b, sg_t, sg_d,
    HAS_LEFT: tl.constexpr, COMPUTE: tl.constexpr,
    K: tl.constexpr, BLT: tl.constexpr, BLD: tl.constexpr,
):
    """Grid (cdiv(L + K - 1, BLT), cdiv(dim, BLD), batch). For input positions
    p = -(K-1) .. L-1: grad[p] = sum_j w[j] dpre[p + K-1-j]; p >= 0 goes to dx (strides
    sg_*), p < 0 to dleft (batch, K-1, dim) contiguous."""
    b = tl.program_id(2).to(tl.int64)
    p = tl.program_id(0) * BLT + tl.arange(0, BLT) - (K - 1)
    d = tl.program_id(1) * BLD + tl.arange(0, BLD)
    dmask = d < dim
    acc = tl.zeros((BLT, BLD), dtype=COMPUTE)
    for j in tl.static_range(K):
        dst = p + (K - 1) - j
        m = ((dst >= 0) & (dst < L))[:, None] & dmask[None, :]
        g = tl.load(dpre_ptr + (b * L + dst[:, None]) * dim + d[None, :], mask=m, other=0.0)
        w = tl.load(w_ptr + d * K + j, mask=dmask, other=0.0).to(COMPUTE)
        acc += w[None, :] * g.to(COMPUTE)
    mx = ((p >= 0) & (p < L))[:, None] & dmask[None, :]
    tl.store(dx_ptr + b * sg_b + p[:, None] * sg_t + d[None, :] * sg_d, acc, mask=mx)
    if HAS_LEFT:
        ml = (p < 0)[:, None] & dmask[None, :]
        tl.store(dleft_ptr + (b * (K - 1) + (p[:, None] + K - 1)) * dim + d[None, :], acc, mask=ml)
