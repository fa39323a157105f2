"""The generalised (diagonal-plus-low-rank) delta rule: RWKV-7 and Kimi Delta Attention.

Per batch element and head the state S_t is a (key_dim, value_dim) matrix (fla's layout):

    dplr / rwkv7  (RWKV-7 "Goose", Peng et al. 2025; fla ``fla/ops/rwkv7``,
                   ``fla/ops/generalized_delta_rule`` (chunk_dplr_delta_rule)):
                  S_t = diag(exp(gk_t)) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T
                  o_t = scale * S_t^T q_t
                  (in the paper's (value, key) layout S_t = S_{t-1} (diag(w_t) + a_t b_t^T)
                  + v_t k_t^T with w = exp(gk); RWKV-7 uses a = -kappa_hat,
                  b = kappa_hat * a_lr, the in-context learning rate)
    kda           (Kimi Delta Attention, Kimi Linear, Moonshot AI 2025; fla ``fla/ops/kda``):
                  S'  = diag(exp(g_t)) S_{t-1}            g_t a vector over the key dim
                  S_t = S' + beta_t k_t (v_t - S'^T k_t)^T
                  o_t = scale * S_t^T q_t
                  i.e. the dplr rule with a_t = exp(g_t) o k_t, b_t = -beta_t k_t and
                  k_t -> beta_t k_t: Gated DeltaNet with a channel-wise decay.

Arguments (fla's convention): q, k, a, b, gk, g (batch, time, heads, key_dim) with gates in
log space (<= 0); v (batch, time, heads, value_dim); beta (batch, time, heads);
``initial_state`` (batch, heads, key_dim, value_dim); ``output_final_state``; returns
(o (batch, time, heads, value_dim), final state or None). ``kda`` takes grouped value heads
(v, g, beta, the state with a multiple of q/k's heads, value head h reading q/k head h // G).
Scale: rwkv7's default is 1.0 (fla's ``chunk_rwkv7``: RWKV has no 1/sqrt(d)), kda's
key_dim ** -0.5 (fla's ``chunk_kda``).

Two forms each:

- ``*_ref``: the recurrence, one step at a time (the oracle; slow).
- the plain name: chunkwise-parallel. With b_c (inclusive) and b_x = b_c - gk (exclusive)
  the within-chunk cumulative log-decays, the pseudo-values u_t = a_t^T S_{t-1} solve the
  unit lower triangular system

      (I - M_ab) u = (a o exp(b_x)) S_0 + M_ak V,
      M_xy[t, s] = sum_k x_tk exp(b_x,tk - b_c,sk) y_sk   for s < t,

  (``torch.linalg.solve_triangular``, once per chunk for U and W with u = U + W S_0), then
  o = scale ((q o exp(b_c)) S_0 + M_qb u + M_qk V) (s <= t) and
  S_C = exp(b_c,C) S_0 + (b o exp(b_c,C - b_c))^T u + (k o exp(b_c,C - b_c))^T V.
  Only the state crosses chunks. Decay products are formed as x exp(b - r) . y exp(r - b)
  with r the chunk's mid-range per key channel (one matmul) while every chunk's range of
  cumulative log-decay is below ``_max_span`` (as ``linear_rnn``'s gla); beyond it (very
  strong decays) the full (chunk, chunk, key_dim) tensor exp(b_t - b_s), masked before
  exp: exact, but memory-bound and slower. Lengths are zero-padded (k = a = b = 0, gk = 0
  leave the state unchanged), so the final state is exact and streaming in pieces with
  ``initial_state`` equals one call. Long sequences under autograd run in recomputed
  segments as the other linear-RNN operators (``linear_rnn._maybe_segmented``).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from models.kernels.linear_rnn import (_check, _chunk_len, _compute_dtype, _from_chunks,
                                       _l2norm, _maybe_segmented, _state0, _to_chunks,
                                       expand_heads)

__all__ = ["rwkv7", "rwkv7_ref", "kda", "kda_ref", "OPS", "make_inputs"]

# chunk on a CPU: linear_rnn's tuned size for the delta rules (whose chunk is the same UT
# solve and state loop), not tuned for these two separately
CPU_CHUNK_SIZE = {"rwkv7": 16, "kda": 16}
DEFAULT_CHUNK_SIZE = 64
FACTORISED = True          # allow the one-matmul form of the decay products


def _chunk(chunk_size, T, op, device):
    """The chunk used: chunk_size, None the op's default for the device, less when short."""
    if chunk_size is None:
        chunk_size = CPU_CHUNK_SIZE[op] if device.type == "cpu" else DEFAULT_CHUNK_SIZE
    return _chunk_len(chunk_size, T, op, device)


# ---------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------

def _check_rwkv7(q, k, v, a, b, gk, initial_state):
    B, T, H, K, V = _check(q, k, v, initial_state=initial_state)
    if H != q.shape[2]:
        raise ValueError(f"rwkv7: v must have q's heads ({q.shape[2]}); got {tuple(v.shape)}")
    for name, x in (("a", a), ("b", b), ("gk", gk)):
        if x is None or tuple(x.shape) != tuple(q.shape):
            raise ValueError(f"rwkv7: {name} must be {tuple(q.shape)} (batch, time, heads, "
                             f"key_dim); got {None if x is None else tuple(x.shape)}")
    return B, T, H, K, V


# ---------------------------------------------------------------------------------------
# References: one step at a time
# ---------------------------------------------------------------------------------------

def rwkv7_ref(q, k, v, a, b, gk, scale=1.0, initial_state=None, output_final_state=False):
    """S_t = diag(exp(gk_t)) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T, o_t = scale S_t^T q_t,
    step by step (fla's ``chunk_dplr_delta_rule`` / ``chunk_rwkv7(log_w=gk)`` argument
    order). Shapes: module doc. Returns (o, final_state or None)."""
    B, T, H, K, V = _check_rwkv7(q, k, v, a, b, gk, initial_state)
    dt = _compute_dtype(q)
    scale = K ** -0.5 if scale is None else scale
    S = _state0(initial_state, B, H, K, V, dt, q.device)
    outs = []
    for q_t, k_t, v_t, a_t, b_t, g_t in zip(*(x.to(dt).unbind(1) for x in (q, k, v, a, b, gk))):
        aS = torch.einsum("bhk,bhkv->bhv", a_t, S)               # a_t^T S_{t-1}
        S = (S * g_t.exp()[..., None] + b_t[..., None] * aS[..., None, :]
             + k_t[..., None] * v_t[..., None, :])
        outs.append(scale * torch.einsum("bhk,bhkv->bhv", q_t, S))
    o = torch.stack(outs, 1) if outs else v.new_zeros(B, 0, H, V, dtype=dt)
    return o.to(v.dtype), (S if output_final_state else None)


def kda_ref(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
            use_qk_l2norm_in_kernel=False):
    """Kimi Delta Attention step by step: S' = diag(exp(g_t)) S_{t-1},
    S_t = S' + beta_t k_t (v_t - S'^T k_t)^T, o_t = scale S_t^T q_t. g (batch, time,
    value_heads, key_dim) log-space; grouped value heads allowed. Shapes: module doc."""
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    B, T, H, K, V = _check(q, k, v, g, beta, initial_state, vector_gate=True)
    q, k = expand_heads(q, k, v)
    dt = _compute_dtype(q)
    scale = K ** -0.5 if scale is None else scale
    S = _state0(initial_state, B, H, K, V, dt, q.device)
    outs = []
    for q_t, k_t, v_t, g_t, b_t in zip(*(x.to(dt).unbind(1) for x in (q, k, v, g, beta))):
        S = S * g_t.exp()[..., None]
        err = v_t - torch.einsum("bhk,bhkv->bhv", k_t, S)
        S = S + k_t[..., None] * (b_t[..., None] * err)[..., None, :]
        outs.append(scale * torch.einsum("bhk,bhkv->bhv", q_t, S))
    o = torch.stack(outs, 1) if outs else v.new_zeros(B, 0, H, V, dtype=dt)
    return o.to(v.dtype), (S if output_final_state else None)


# ---------------------------------------------------------------------------------------
# Chunkwise-parallel form
# ---------------------------------------------------------------------------------------

def _max_span(dtype) -> float:
    """Largest within-chunk range of cumulative log-decay for the factorised products:
    exp(+-span) stays finite (as linear_rnn._gla_max_span)."""
    return 0.7 * math.log(torch.finfo(dtype).max) if FACTORISED else -1.0


def _decay_scores(x, ex, y, ey, strict, factorised, r):
    """M[t, s] = sum_k x_tk y_sk exp(ex_tk - ey_sk) for s < t (strict) or s <= t, else 0.
    x, ex, y, ey (B, H, N, C, K) -> (B, H, N, C, C). Factorised: (x exp(ex - r))
    (y exp(r - ey))^T; else the (C, C, K) tensor of exponents masked before exp."""
    C = x.shape[-2]
    mask = torch.ones(C, C, dtype=torch.bool, device=x.device).tril(-1 if strict else 0)
    if factorised:
        M = (x * (ex - r).exp()) @ (y * (r - ey).exp()).transpose(-1, -2)
        return M.masked_fill(~mask, 0)
    E = (ex[..., :, None, :] - ey[..., None, :, :]).masked_fill(~mask[..., None], float("-inf"))
    return (x[..., :, None, :] * y[..., None, :, :] * E.exp()).sum(-1)


def _chunk_dplr(q, k, v, a, b, gk, scale, S0, C, a_inclusive=False):
    """The chunked dplr recurrence (module doc) on already-expanded heads; all of q, k, a, b,
    gk (B, T, H, K), v (B, T, H, V), S0 (B, H, K, V) in the compute dtype. a_inclusive: the
    a-side decay is exp(b_c) (a_t already carries its own step's decay, kda) rather than
    exp(b_x). Returns (o (B, T, H, V) in v's dtype, S_end)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    dt = S0.dtype
    qc, kc, vc, ac, bc, gc = (_to_chunks(x, C, dt) for x in (q, k, v, a, b, gk))
    bcum = gc.cumsum(-2)                                       # b_c (B, H, N, C, K)
    bex = bcum if a_inclusive else bcum - gc                   # a's exponent
    hi = torch.maximum(bcum.amax(-2, keepdim=True), bex.amax(-2, keepdim=True))
    lo = torch.minimum(bcum.amin(-2, keepdim=True), bex.amin(-2, keepdim=True))
    factorised = bool((hi - lo).max() <= _max_span(dt))
    r = ((hi + lo) / 2).detach()                               # cancels exactly
    bk = torch.cat([bc, kc], -2)                               # (.., 2C, K): b rows, k rows
    ebk = torch.cat([bcum, bcum], -2)
    # a against [b | k], and q against [b | k] (strict / inclusive lower triangles)
    if factorised:
        ybk = bk * (r - ebk).exp()
        Ma = (ac * (bex - r).exp()) @ ybk.transpose(-1, -2)    # (.., C, 2C)
        Mq = (qc * (bcum - r).exp()) @ ybk.transpose(-1, -2)
        strict = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)
        incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
        M_ab, M_ak = Ma[..., :C].masked_fill(~strict, 0), Ma[..., C:].masked_fill(~strict, 0)
        M_qb, M_qk = Mq[..., :C].masked_fill(~incl, 0), Mq[..., C:].masked_fill(~incl, 0)
    else:
        M_ab = _decay_scores(ac, bex, bc, bcum, True, False, None)
        M_ak = _decay_scores(ac, bex, kc, bcum, True, False, None)
        M_qb = _decay_scores(qc, bcum, bc, bcum, False, False, None)
        M_qk = _decay_scores(qc, bcum, kc, bcum, False, False, None)
    eye = torch.eye(C, dtype=dt, device=q.device)
    # (I - M_ab) [U | W] = [M_ak V | a o exp(b_x)]:  u = U + W S_0
    rhs = torch.cat([M_ak @ vc, ac * bex.exp()], -1)
    UW = torch.linalg.solve_triangular(eye - M_ab, rhs, upper=False, unitriangular=True)
    U, W = UW[..., :V], UW[..., V:]
    to_end = (bcum[..., -1:, :] - bcum).exp()                  # (B, H, N, C, K)
    bd, kd = bc * to_end, kc * to_end
    decay = bcum[..., -1, :].exp()                             # (B, H, N, K)
    kv_end = kd.transpose(-1, -2) @ vc                         # (B, H, N, K, V)
    starts, us = [], []
    S = S0
    for U_n, W_n, bd_n, kv_n, d_n in zip(U.unbind(2), W.unbind(2), bd.unbind(2),
                                         kv_end.unbind(2), decay.unbind(2)):
        starts.append(S)
        u = U_n + W_n @ S                                      # (B, H, C, V)
        us.append(u)
        S = S * d_n[..., None] + bd_n.transpose(-1, -2) @ u + kv_n
    starts, u = torch.stack(starts, 2), torch.stack(us, 2)
    o = scale * ((qc * bcum.exp()) @ starts + M_qb @ u + M_qk @ vc)
    return _from_chunks(o, T, v.dtype), S


def rwkv7(q, k, v, a, b, gk, scale=1.0, initial_state=None, output_final_state=False,
          chunk_size=None, segment_len=None):
    """RWKV-7's generalised delta rule (see :func:`rwkv7_ref`), chunked. Arguments in fla's
    ``chunk_dplr_delta_rule`` order; gk the log-decay (RWKV-7's w = exp(gk) in (0, 1))."""
    B, T, H, K, V = _check_rwkv7(q, k, v, a, b, gk, initial_state)
    dt = _compute_dtype(q)
    scale = K ** -0.5 if scale is None else scale
    ab = torch.stack([a, b], 3)                                # one time-sliced tensor

    def core(q, k, v, gk, ab, S):
        S0 = _state0(S, q.shape[0], H, K, V, dt, q.device)
        if q.shape[1] == 0:
            return v.new_zeros(q.shape[0], 0, H, V), S0
        C = _chunk(chunk_size, q.shape[1], "rwkv7", q.device)
        return _chunk_dplr(q, k, v, ab[:, :, :, 0].to(dt), ab[:, :, :, 1].to(dt), gk, scale,
                           S0, C)
    return _maybe_segmented(core, q, k, v, gk, ab, initial_state, output_final_state,
                            segment_len)


def kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
        chunk_size=None, use_qk_l2norm_in_kernel=False, segment_len=None):
    """Kimi Delta Attention (see :func:`kda_ref`), chunked: the dplr form with
    a = k (its decay exp(b_c) inclusive of the step), b = -beta k, k -> beta k. Arguments in
    fla's ``chunk_kda`` order (g before beta, log space)."""
    B, T, H, K, V = _check(q, k, v, g, beta, initial_state, vector_gate=True)
    q, k = expand_heads(q, k, v)
    dt = _compute_dtype(q)
    scale = K ** -0.5 if scale is None else scale

    def core(q, k, v, g, beta, S):
        S0 = _state0(S, q.shape[0], H, K, V, dt, q.device)
        if q.shape[1] == 0:
            return v.new_zeros(q.shape[0], 0, H, V), S0
        if use_qk_l2norm_in_kernel:
            q, k = _l2norm(q), _l2norm(k)
        C = _chunk(chunk_size, q.shape[1], "kda", q.device)
        q, k, g, beta = (x.to(dt) for x in (q, k, g, beta))
        kb = k * beta[..., None]
        return _chunk_dplr(q, kb, v, k, -kb, g, scale, S0, C, a_inclusive=True)
    return _maybe_segmented(core, q, k, v, g, beta, initial_state, output_final_state,
                            segment_len)


# name -> (chunked, ref)
OPS = {"rwkv7": (rwkv7, rwkv7_ref), "kda": (kda, kda_ref)}


def make_inputs(name, batch=2, time=37, heads=2, key_dim=8, value_dim=8, dtype=torch.float64,
                gate_range=(-1.0, 0.0), seed=0, device="cpu", requires_grad=True,
                value_heads=None, beta_range=(0.0, 1.0), a_lr_range=(0.0, 1.0)):
    """Random positional arguments for ``name``: rwkv7 (q, k, v, a, b, gk) with RWKV-7's
    a = -kappa_hat, b = kappa_hat * a_lr (kappa_hat L2-normalised, a_lr in a_lr_range:
    the transition's eigenvalues stay in [-1, 1]); kda (q, k, v, g, beta) with k
    L2-normalised. Log-gates uniform in gate_range."""
    gen = torch.Generator().manual_seed(seed)
    B, T, H, K, V = batch, time, heads, key_dim, value_dim

    def unif(lo_hi, *shape):
        lo, hi = lo_hi
        return lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=dtype)

    q = torch.randn(B, T, H, K, generator=gen, dtype=dtype)
    k = torch.randn(B, T, H, K, generator=gen, dtype=dtype)
    if name == "rwkv7":
        v = torch.randn(B, T, H, V, generator=gen, dtype=dtype)
        kk = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=dtype), dim=-1)
        args = [q, k, v, -kk, kk * unif(a_lr_range, B, T, H, K), unif(gate_range, B, T, H, K)]
    elif name == "kda":
        HV = heads if value_heads is None else value_heads
        v = torch.randn(B, T, HV, V, generator=gen, dtype=dtype)
        args = [q, _l2norm(k), v, unif(gate_range, B, T, HV, K), unif(beta_range, B, T, HV)]
    else:
        raise KeyError(f"unknown op {name!r}; known: {', '.join(OPS)}")
    return [x.to(device).requires_grad_(requires_grad) for x in args]
