"""Gated DeltaProduct (Siems, Carstensen, Zela, Hutter, Pontil & Grazzi, "DeltaProduct:
Improving State-Tracking in Linear RNNs via Householder Products", 2025): n delta-rule
(Householder) steps per token, in the convention of ``models.kernels.linear_rnn`` (fla's):

    S <- exp(g_t) S;   for j = 0..n-1:  S <- S + beta_tj k_tj (v_tj - S^T k_tj)^T
    o_t = scale S^T q_t

k, v and beta carry n rows per token (batch, time * n, ...), q and g one. The step-by-step
oracle ``gated_delta_product_ref``, the chunked ``gated_delta_product`` (linear_rnn's chunked
delta rules on the interleaved sequence of T n steps, ``delta_product_via``) and
``PRODUCT_OPS``. Built on ``models.kernels.linear_rnn``, which does not import this module;
the family's whole table (linear_rnn's ``OPS`` and these) is ``models.kernels.linear_rnn_ops``'
``ALL_OPS``.
"""
from __future__ import annotations

import torch

from models.kernels.linear_rnn import (_check, _compute_dtype, _l2norm, _state0, delta_rule,
                                       gated_delta_rule)

__all__ = ["gated_delta_product", "gated_delta_product_ref", "delta_product_via",
           "PRODUCT_OPS"]


def _householder_steps(q, k, v, beta, num_householder):
    """n, the number of delta-rule steps per token, from the shapes (fla's layout: k, v and
    beta carry n rows per token, token t's j-th at time t * n + j), checked against
    ``num_householder`` when it is given."""
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"q, k must be 4-D (batch, time, heads, key_dim); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}")
    T, Tn = q.shape[1], k.shape[1]
    n = num_householder if num_householder is not None else (Tn // T if T else 1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"num_householder must be an integer >= 1; got {n!r}")
    for name, x in (("k", k), ("v", v), ("beta", beta)):
        if x.shape[1] != T * n:
            raise ValueError(f"{name} must have time = {T} * num_householder = {T * n} "
                             f"(q's time {T}, n = {n}); got {tuple(x.shape)}")
    return n


def gated_delta_product_ref(q, k, v, g, beta, num_householder=None, scale=None,
                            initial_state=None, output_final_state=False,
                            use_qk_l2norm_in_kernel=False):
    """Gated DeltaProduct (Siems, Carstensen, Zela, Hutter, Pontil & Grazzi, "DeltaProduct:
    Improving State-Tracking in Linear RNNs via Householder Products", 2025; fla's
    ``fla/ops/gated_delta_product``), step by step: per token t, with n = num_householder,

        S <- exp(g_t) S;   for j = 0..n-1:  S <- S + beta_tj k_tj (v_tj - S^T k_tj)^T
        o_t = scale S^T q_t

    i.e. S_t = (prod_j (I - beta_tj k_tj k_tj^T)) exp(g_t) S_{t-1} + ..., a product of n
    generalised Householder matrices per token (each reflects when beta_tj = 2).

    Shapes (fla's): q (B, T, Hq, K); k (B, T n, Hq, K); v (B, T n, H, V); beta (B, T n, H);
    g (B, T, H) log-gate or None (no decay); H a multiple of Hq (grouped value heads);
    initial_state (B, H, K, V). num_householder None: read from k's time. Returns
    (o (B, T, H, V), final state or None)."""
    n = _householder_steps(q, k, v, beta, num_householder)
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    B, T, Hq, K = q.shape
    # the per-token shapes for the shared checks: one Householder row stands in for k
    _check(q, k[:, ::n], v[:, ::n], g, beta[:, ::n], initial_state)
    H, V = v.shape[2], v.shape[-1]
    G = H // Hq
    dt = _compute_dtype(q)
    scale = K ** -0.5 if scale is None else scale
    S = _state0(initial_state, B, H, K, V, dt, q.device).reshape(B, Hq, G, K, V)
    ks = k.to(dt).reshape(B, T, n, Hq, K).unbind(1)                     # (B, n, Hq, K)
    vs = v.to(dt).reshape(B, T, n, Hq, G, V).unbind(1)
    bs = beta.to(dt).reshape(B, T, n, Hq, G).unbind(1)
    gs = g.to(dt).reshape(B, T, Hq, G).unbind(1) if g is not None else [None] * T
    outs = []
    for q_t, k_t, v_t, b_t, g_t in zip(q.to(dt).unbind(1), ks, vs, bs, gs):
        if g_t is not None:
            S = S * g_t.exp()[..., None, None]
        for k_j, v_j, b_j in zip(k_t.unbind(1), v_t.unbind(1), b_t.unbind(1)):
            kS = torch.einsum("bhk,bhgkv->bhgv", k_j, S)
            S = S + k_j[:, :, None, :, None] * (b_j[..., None] * (v_j - kS))[..., None, :]
        outs.append(scale * torch.einsum("bhk,bhgkv->bhgv", q_t, S).reshape(B, H, V))
    o = torch.stack(outs, 1) if outs else v.new_zeros(B, 0, H, V, dtype=dt)
    return o.to(v.dtype), (S.reshape(B, H, K, V) if output_final_state else None)


def delta_product_via(delta_op, gated_op, q, k, v, g, beta, num_householder=None,
                      scale=None, initial_state=None, output_final_state=False, **kw):
    """Gated DeltaProduct as one delta-rule call on the interleaved sequence of T n steps
    (how fla runs it): step t n + j writes (k_tj, v_tj, beta_tj); the decay exp(g_t) sits
    on step t n (log-gate 0 on the others) and q_t on step t n + n - 1 (zeros before it),
    whose output is o_t. ``gated_op`` (``delta_op`` when g is None) is any operator of
    fla's convention: the chunked form here, the C kernels, fla's. Shapes: as
    :func:`gated_delta_product_ref`; ``kw`` goes to the operator."""
    n = _householder_steps(q, k, v, beta, num_householder)
    B, T, Hq, K = q.shape
    if n == 1:
        qi, gi = q, g
    else:
        qi = torch.cat([q.new_zeros(B, T, n - 1, Hq, K), q[:, :, None]], 2).flatten(1, 2)
        if g is not None:
            gi = torch.cat([g[:, :, None], g.new_zeros(B, T, n - 1, *g.shape[2:])], 2)
            gi = gi.flatten(1, 2)
    if g is None:
        o, S = delta_op(qi, k, v, beta, scale=scale, initial_state=initial_state,
                        output_final_state=output_final_state, **kw)
    else:
        o, S = gated_op(qi, k, v, gi, beta, scale=scale, initial_state=initial_state,
                        output_final_state=output_final_state, **kw)
    if n > 1:
        o = o.unflatten(1, (T, n))[:, :, -1]
    return o, S


def gated_delta_product(q, k, v, g, beta, num_householder=None, scale=None,
                        initial_state=None, output_final_state=False, chunk_size=None,
                        use_qk_l2norm_in_kernel=False, segment_len=None):
    """Gated DeltaProduct (see :func:`gated_delta_product_ref`), chunked: the chunked
    gated delta rule (WY form) on the interleaved sequence of T n steps
    (:func:`delta_product_via`); g None runs the delta rule (DeltaProduct without decay).
    Arguments in fla's ``chunk_gated_delta_product`` order (num_householder after beta;
    None reads it from k's time)."""
    return delta_product_via(delta_rule, gated_delta_rule, q, k, v, g, beta, num_householder,
                             scale, initial_state, output_final_state, chunk_size=chunk_size,
                             use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                             segment_len=segment_len)


# Operators whose k, v and beta carry several rows per token (fla's layout; ``OPS``' generic
# tests slice every argument by the same time range, so these are kept apart).
# name -> (chunked, ref, gate, needs beta) as in OPS
PRODUCT_OPS = {
    "gated_delta_product": (gated_delta_product, gated_delta_product_ref, "scalar", True),
}
