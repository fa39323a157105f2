"""RWKV-7's and KDA's generalised delta rule in C on the CPU: backend ``cpu`` of
``rwkv7`` and ``kda`` (:mod:`models.kernels.linear_rnn_backends`).

Same names, arguments and results as :mod:`models.kernels.generalized_delta` (fla's
convention; shapes in its module doc), computed by ``csrc/dplr_impl.h``: the recurrence

    u_t = S_{t-1}^T a_t,   S_t = diag(exp(gk_t)) S_{t-1} + b_t u_t^T + k_t v_t^T,
    o_t = scale S_t^T q_t

one step at a time with the state in cache, and a hand-written backward that recomputes
the states one chunk of ``CHUNK_LEN`` steps at a time from the checkpoints the forward
stored (the derivation is in the header's comment). KDA runs as the same kernel with
a_t = exp(g_t) o k_t, b_t = -beta_t k_t, k_t -> beta_t k_t (``generalized_delta``'s module
doc), formed per step inside the kernel from k, g and beta, which also maps the gradients
back (as tensors in torch the map cost KDA a third more time); with
``use_qk_l2norm_in_kernel`` q and k are L2-normalised per step inside the kernel too, and
the backward maps dq, dk back through the norm (:data:`L2NORM_IN_KERNEL`; in torch, the
normalisation's passes forward and backward were ~7% of a KDA step at 2 x 2048, d_model 256,
and its two normalised copies 8 MiB a layer kept for the backward). The step-by-step ``*_ref``
functions are the oracle (tests/models/test_generalized_delta.py).

Why C and not the chunked form: on a CPU the chunks' (chunk, chunk) matmuls and triangular
solves run far below large-GEMM speed; the chunked forms are 1.6-3.8x faster than ``ref``
at L = 4096, the recurrence in C over 10x (docs/RESULTS.md). Memory for the backward: the
inputs and one (key_dim, value_dim) state per chunk, so no segment recompute is needed.

float32 and float64 are computed as given; half and bfloat16 in float32 (the output in
the input dtype, the final state in float32, as the chunked form). Built and loaded with
the other C kernels (:mod:`models.kernels.cpu_kernels`): unavailable without a compiler,
and ``auto`` then takes the chunked form.
"""
from __future__ import annotations

import torch

from models.kernels import cpu_kernels
from models.kernels.generalized_delta import _check_rwkv7
from models.kernels.linear_rnn import _check, _compute_dtype, _l2norm, expand_heads
# the same C library, checkpoint spacing, tile and stride layout as the delta-rule kernels
from models.kernels.linear_rnn_cpu import (CHUNK_LEN, _strides, available, backward_grads,
                                           forward_buffers, no_step_grads, unavailable_reason)

__all__ = ["rwkv7", "kda", "OPS", "available", "unavailable_reason"]

# False: KDA's q, k normalised in torch before the kernel (the form before issue 43's
# training work; one-process A/B timings and the tests' twin)
L2NORM_IN_KERNEL = True


class DPLRCPU(torch.autograd.Function):
    """forward(q, k, v, a, b, gk, h0, scale, chunk_len, kda, l2norm) -> (o, S_last). q, k,
    a, b, gk (B, T, H, K), v (B, T, H, V), h0 (B, H, K, V) or None; all in the compute dtype
    with a contiguous last axis. kda: a is None, b is beta (B, T, H) and gk is g; the kernel
    forms a = exp(g) o k, b = -beta k, k -> beta k (its gradients: dk, dbeta, dg).
    l2norm: q and k divided by max(|x|, 1e-12) per step inside the kernel (dq, dk are the
    raw inputs' gradients)."""

    @staticmethod
    def forward(ctx, q, k, v, a, b, gk, h0, scale, chunk_len, kda=False, l2norm=False):
        lib = cpu_kernels._library_for(q, k, v, a, b, gk, h0)
        B, T, H, K = q.shape
        V = v.shape[-1]
        dtype = q.dtype
        needs_grad = any(ctx.needs_input_grad[:7])
        o, S_last, ckpt, h0c, scale_t = forward_buffers(q, v, h0, scale, chunk_len, needs_grad)
        sizes = [B, T, H, K, V, chunk_len, torch.get_num_threads(),
                 *(s for x in (q, k, v, a, b, gk) for s in _strides(x)), int(kda),
                 int(l2norm)]
        if T > 0 and B * H > 0 and K * V > 0:
            cpu_kernels._call(lib, "dplr_fwd", dtype,
                              [q, k, v, a, b, gk, h0c, scale_t, o, S_last, ckpt], sizes)
        else:
            o.zero_()
            S_last = q.new_zeros(B, H, K, V) if h0c is None else h0c.clone()
        if needs_grad:
            ctx.save_for_backward(q, k, v, a, b, gk, ckpt, scale_t)
            ctx.sizes = sizes
            ctx.has_h0 = h0 is not None
        return o, S_last

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_o, dS_last):
        q, k, v, a, b, gk, ckpt, scale_t = ctx.saved_tensors
        B, T, H, K = q.shape
        V = v.shape[-1]
        dtype = q.dtype
        d_o, dS = backward_grads(q, v, d_o, dS_last)
        kda = bool(ctx.sizes[25])
        dq, dk, dgk = (q.new_empty(B, T, H, K) for _ in range(3))
        da = None if kda else q.new_empty(B, T, H, K)
        db = q.new_empty(b.shape) if kda else q.new_empty(B, T, H, K)   # kda: dbeta
        dv = q.new_empty(B, T, H, V)
        dh0 = q.new_empty(B, H, K, V)
        sizes = list(ctx.sizes)
        sizes[6] = torch.get_num_threads()
        if T > 0 and B * H > 0 and K * V > 0:
            cpu_kernels._call(cpu_kernels.load()[0], "dplr_bwd", dtype,
                              [q, k, v, a, b, gk, None, scale_t, None, None, ckpt, d_o, dS,
                               dq, dk, dv, da, db, dgk, dh0], sizes)
        else:
            dh0 = no_step_grads(q, v, dS, (dq, dk, dv, da, db, dgk))
        return (dq, dk, dv, da, db, dgk, dh0 if ctx.has_h0 else None, None, None, None,
                None)


def _dplr(q, k, v, a, b, gk, scale, initial_state, output_final_state, chunk_len,
          kda=False, l2norm=False):
    dt = _compute_dtype(q)
    args = [cpu_kernels._rows_contiguous(x, dt) for x in (q, k, v, a, b, gk)]
    h0 = None if initial_state is None else initial_state.to(dt)
    o, S = DPLRCPU.apply(*args, h0, float(scale), int(chunk_len or CHUNK_LEN), kda, l2norm)
    return o.to(v.dtype), (S if output_final_state else None)


def rwkv7(q, k, v, a, b, gk, scale=1.0, initial_state=None, output_final_state=False,
          chunk_len=None):
    """RWKV-7's generalised delta rule (``generalized_delta.rwkv7_ref``) in C."""
    K = _check_rwkv7(q, k, v, a, b, gk, initial_state)[3]
    scale = K ** -0.5 if scale is None else scale
    return _dplr(q, k, v, a, b, gk, scale, initial_state, output_final_state, chunk_len)


def kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
        use_qk_l2norm_in_kernel=False, chunk_len=None):
    """Kimi Delta Attention (``generalized_delta.kda_ref``) in C, as the dplr rule with
    a = exp(g) o k, b = -beta k, k -> beta k, formed inside the kernel (grouped value heads:
    q, k repeated first); ``use_qk_l2norm_in_kernel``: q, k normalised per step inside the
    kernel too (:data:`L2NORM_IN_KERNEL`; else in torch first)."""
    _check(q, k, v, g, beta, initial_state, vector_gate=True)
    q, k = expand_heads(q, k, v)
    in_kernel = bool(use_qk_l2norm_in_kernel) and L2NORM_IN_KERNEL
    if use_qk_l2norm_in_kernel and not in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    K = q.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    return _dplr(q, k, v, None, beta, g, scale, initial_state, output_final_state, chunk_len,
                 kda=True, l2norm=in_kernel)


OPS = {"rwkv7": rwkv7, "kda": kda}
