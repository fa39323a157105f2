"""The linear-RNN operators in C on the CPU: backend ``cpu`` of
:mod:`models.kernels.linear_rnn_backends`.

Same names, arguments and results as :mod:`models.kernels.linear_rnn` (fla's convention:
q, k (batch, time, heads, key_dim), v (batch, time, heads, value_dim), log-gates g, beta,
``scale``, ``initial_state`` (batch, heads, key_dim, value_dim), ``output_final_state``;
returns ``(o, final_state or None)``), computed by ``csrc/linear_rnn_impl.h``: the
recurrence one step at a time with the state in cache, and a hand-written backward that
recomputes the states one chunk of ``CHUNK_LEN`` steps at a time from the checkpoints the
forward stored. The maths, the backward's derivation and the memory layout are in the
header's comment; the plain ``*_ref`` functions of ``linear_rnn`` are its oracle
(tests/models/test_linear_rnn_cpu.py).

Why a recurrence and not chunks: on a CPU the chunkwise form's small (chunk, chunk)
matmuls run at a fifth of torch's large-GEMM speed and do twice the arithmetic of the
recurrence (docs/RESULTS.md). What it keeps for the backward: the inputs (views are read
in place, through their strides) and one (key_dim, value_dim) state per chunk, so a long
sequence needs no segment recompute.

float32 and float64 are computed as given; half and bfloat16 in float32 (the output in
the input dtype, the final state in float32, as the chunked form).
"""
from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from models.kernels import cpu_kernels
from models.kernels.delta_product import delta_product_via
from models.kernels.linear_rnn import _check, _compute_dtype, expand_heads

CHUNK_LEN = 64          # steps between stored states; the backward recomputes one chunk
TILE = 16               # the C kernel's LRNN_LT: checkpoint rows are padded to a multiple


def available() -> bool:
    return cpu_kernels.available()


def unavailable_reason() -> str:
    return cpu_kernels.unavailable_reason()


def _strides(x: torch.Tensor | None) -> list[int]:
    """(batch, time, head) strides of a 3-D or 4-D (batch, time, head[, dim]) tensor."""
    return [0, 0, 0] if x is None else list(x.stride()[:3])


def forward_buffers(q: torch.Tensor, v: torch.Tensor, h0: torch.Tensor | None, scale: float,
                    chunk_len: int, needs_grad: bool):
    """The C forward's outputs and prepared inputs for q (B, T, H, K), v (B, T, H, V): o
    (B, T, H, V), the final state (B, H, K, V), the state stored every chunk_len steps when a
    backward will follow (B, H, chunks, K, V padded to a multiple of TILE; else None), h0
    (B, H, K, V) contiguous (or None) and scale as a one-element tensor of q's dtype (the
    kernels read it through a pointer)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    o, S_last = q.new_empty(B, T, H, V), q.new_empty(B, H, K, V)
    Vp = -(-V // TILE) * TILE
    ckpt = q.new_empty(B, H, -(-T // chunk_len), K, Vp) if needs_grad and T > 0 else None
    h0 = None if h0 is None else h0.contiguous()
    return o, S_last, ckpt, h0, torch.tensor([scale], dtype=q.dtype)


def backward_grads(q: torch.Tensor, v: torch.Tensor, d_o: torch.Tensor | None,
                   dS_last: torch.Tensor | None):
    """The incoming gradients as the C backward reads them, in q's dtype and contiguous: d_o
    (B, T, H, V) (zeros when None) and dS_last (B, H, K, V) (or None)."""
    B, T, H, _ = q.shape
    d_o = q.new_zeros(B, T, H, v.shape[-1]) if d_o is None else d_o.to(q.dtype).contiguous()
    return d_o, None if dS_last is None else dS_last.to(q.dtype).contiguous()


def no_step_grads(q: torch.Tensor, v: torch.Tensor, dS: torch.Tensor | None,
                  grads: tuple) -> torch.Tensor:
    """The backward when the kernel has nothing to run (no steps, heads or state): ``grads``
    (None skipped) zeroed; returns dh0 (B, H, K, V), which is dS_last (zeros when None)."""
    for t in grads:
        if t is not None:
            t.zero_()
    B, _, H, K = q.shape
    return q.new_zeros(B, H, K, v.shape[-1]) if dS is None else dS.clone()


class LinearRNNCPU(torch.autograd.Function):
    """forward(q, k, v, g, beta, h0, scale, gate, delta, chunk_len, l2norm) -> (o, S_last),
    with gate one of 0 (none), 1 (g: (B, T, H)), 2 (g: (B, T, H, K)), delta 0/1 (beta:
    (B, T, H)) and l2norm 0/1 (q, k normalised per step inside the kernel). Inputs are
    already in the compute dtype, last axis contiguous."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, h0, scale, gate, delta, chunk_len, l2norm=0):
        if gate == 2 and delta:
            raise ValueError("linear_rnn_cpu: a vector gate with the delta rule is not an operator")
        lib = cpu_kernels._library_for(q, k, v, g, beta, h0)
        B, T, H, K = q.shape
        V = v.shape[-1]
        dtype = q.dtype
        needs_grad = any(ctx.needs_input_grad[:6])
        o, S_last, ckpt, h0c, scale_t = forward_buffers(q, v, h0, scale, chunk_len, needs_grad)
        sizes = [B, T, H, K, V, gate, delta, chunk_len, torch.get_num_threads(),
                 *_strides(q), *_strides(k), *_strides(v), *_strides(g), *_strides(beta),
                 int(l2norm)]
        if B * H > 0 and K * V > 0:
            cpu_kernels._call(lib, "lrnn_fwd", dtype,
                              [q, k, v, g, beta, h0c, scale_t, o, S_last, ckpt], sizes)
        else:
            S_last = q.new_zeros(B, H, K, V) if h0c is None else h0c.clone()
        if needs_grad:
            ctx.save_for_backward(q, k, v, g, beta, ckpt, scale_t)
            ctx.sizes = sizes
            ctx.has_h0 = h0 is not None
        return o, S_last

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_o, dS_last):
        q, k, v, g, beta, ckpt, scale_t = ctx.saved_tensors
        B, T, H, K = q.shape
        V = v.shape[-1]
        dtype = q.dtype
        d_o, dS = backward_grads(q, v, d_o, dS_last)
        dq, dk = q.new_empty(B, T, H, K), q.new_empty(B, T, H, K)
        dv = q.new_empty(B, T, H, V)
        dg = None if g is None else q.new_empty(g.shape)
        dbeta = None if beta is None else q.new_empty(B, T, H)
        dh0 = q.new_empty(B, H, K, V)
        sizes = list(ctx.sizes)
        sizes[8] = torch.get_num_threads()
        if T > 0 and B * H > 0 and K * V > 0:
            cpu_kernels._call(cpu_kernels.load()[0], "lrnn_bwd", dtype,
                              [q, k, v, g, beta, None, scale_t, None, None, ckpt, d_o, dS,
                               dq, dk, dv, dg, dbeta, dh0], sizes)
        else:
            dh0 = no_step_grads(q, v, dS, (dq, dk, dv, dg, dbeta))
        return (dq, dk, dv, dg, dbeta, dh0 if ctx.has_h0 else None, None, None, None, None,
                None)


def _run(q, k, v, g, beta, scale, initial_state, output_final_state, vector_gate=False,
         chunk_len=None, l2norm=False):
    _check(q, k, v, g, beta, initial_state, vector_gate)
    q, k = expand_heads(q, k, v)         # grouped value heads: the kernel takes one count
    dt = _compute_dtype(q)
    K = q.shape[-1]
    scale = K ** -0.5 if scale is None else float(scale)
    gate = 0 if g is None else (2 if vector_gate else 1)
    args = [cpu_kernels._rows_contiguous(x, dt) for x in (q, k, v, g, beta)]
    h0 = None if initial_state is None else initial_state.to(dt)
    o, S = LinearRNNCPU.apply(*args, h0, scale, gate, int(beta is not None),
                              chunk_len or CHUNK_LEN, int(l2norm))
    return o.to(v.dtype), (S if output_final_state else None)


class _ScanReplay(torch.autograd.Function):
    """The recompute's stand-in for :class:`LinearRNNCPU` (:func:`simple_gla_taped`): forward
    returns the final state a no-grad forward already computed and an output that is never
    read (zeros, a broadcast view); backward is :class:`LinearRNNCPU`'s, from the checkpoints
    that forward stored."""

    @staticmethod
    def forward(ctx, q, k, v, g, h0, ckpt, S_last, scale_t, sizes, has_h0):
        ctx.save_for_backward(q, k, v, g, None, ckpt, scale_t)
        ctx.sizes, ctx.has_h0 = sizes, has_h0
        B, T, H, _ = q.shape
        return v.new_zeros(()).expand(B, T, H, v.shape[-1]), S_last.clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_o, dS_last):
        dq, dk, dv, dg, _, dh0, *_ = LinearRNNCPU.backward(ctx, d_o, dS_last)
        return dq, dk, dv, dg, dh0, None, None, None, None, None


def simple_gla_taped(q, k, v, g, scale, initial_state, tape: list):
    """:func:`simple_gla` (final state always returned) for a piece of a model that a
    segment recompute (``segment_recompute.StatefulSegments``) runs twice: first without
    autograd, then again recording, for its backward. The first run stores the kernel's
    checkpoints and final state on ``tape`` (a list, one entry per call); the recording
    run takes the last entry back and skips the forward kernel: its output is never read
    there (only the graph's backward is), so it is zeros, and the backward recomputes the
    states from the stored checkpoints as :class:`LinearRNNCPU`'s does. Calls recorded in
    the reverse order of the first runs' (as the segments' backward runs, last first) pair
    with them; a recording call that finds the tape empty runs :func:`simple_gla`.
    (Issue 43: the scan's forward in the recompute was ~4% of a Mamba-3 training step at
    2 x 2048, d_model 256; the checkpoints kept cost B H (T / CHUNK_LEN) K V numbers.)"""
    if torch.is_grad_enabled() and not tape:
        return simple_gla(q, k, v, g, scale, initial_state, output_final_state=True)
    _check(q, k, v, g, None, initial_state, False)
    q, k = expand_heads(q, k, v)
    dt = _compute_dtype(q)
    K = q.shape[-1]
    scale = K ** -0.5 if scale is None else float(scale)
    args = [cpu_kernels._rows_contiguous(x, dt) for x in (q, k, v, g)]
    h0 = None if initial_state is None else initial_state.to(dt)
    if torch.is_grad_enabled():
        ckpt, S_last, scale_t, sizes = tape.pop()
        if sizes[:5] != [*args[0].shape, args[2].shape[-1]]:
            raise RuntimeError(f"simple_gla_taped: the tape's entry is for shapes {sizes[:5]}, "
                               f"this call's are {[*args[0].shape, args[2].shape[-1]]}")
        # the strides of this call's tensors (the backward reads them), the rest as stored
        sizes = [*sizes[:9], *(s for x in (*args, None) for s in _strides(x)), sizes[-1]]
        o, S = _ScanReplay.apply(*args, h0, ckpt, S_last, scale_t, sizes, h0 is not None)
        return o.to(v.dtype), S
    q, k, v, g = args
    B, T, H, _ = q.shape
    V = v.shape[-1]
    o, S_last, ckpt, h0c, scale_t = forward_buffers(q, v, h0, scale, CHUNK_LEN, True)
    sizes = [B, T, H, K, V, 1, 0, CHUNK_LEN, torch.get_num_threads(), *_strides(q), *_strides(k),
             *_strides(v), *_strides(g), *_strides(None), 0]
    if B * H > 0 and K * V > 0:
        cpu_kernels._call(cpu_kernels._library_for(q, k, v, g, h0c), "lrnn_fwd", dt,
                          [q, k, v, g, None, h0c, scale_t, o, S_last, ckpt], sizes)
    else:
        S_last = q.new_zeros(B, H, K, V) if h0c is None else h0c.clone()
    tape.append((ckpt, S_last, scale_t, sizes))
    return o.to(v.dtype), S_last


def linear_attention(q, k, v, scale=None, initial_state=None, output_final_state=False,
                     chunk_len=None):
    """S_t = S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t (no normaliser), in C."""
    return _run(q, k, v, None, None, scale, initial_state, output_final_state,
                chunk_len=chunk_len)


def simple_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
               chunk_len=None):
    """S_t = exp(g_t) S_{t-1} + k_t v_t^T, g (batch, time, heads), in C."""
    if g is None:
        raise ValueError("simple_gla needs g; use linear_attention for no gate")
    return _run(q, k, v, g, None, scale, initial_state, output_final_state,
                chunk_len=chunk_len)


def gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
        chunk_len=None):
    """S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, g (batch, time, heads, key_dim), in C."""
    return _run(q, k, v, g, None, scale, initial_state, output_final_state, vector_gate=True,
                chunk_len=chunk_len)


def delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
               use_qk_l2norm_in_kernel=False, chunk_len=None):
    """S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T, in C (q, k L2-normalised
    per step inside the kernel when use_qk_l2norm_in_kernel: no normalised copies kept)."""
    return _run(q, k, v, None, beta, scale, initial_state, output_final_state,
                chunk_len=chunk_len, l2norm=use_qk_l2norm_in_kernel)


def gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                     output_final_state=False, use_qk_l2norm_in_kernel=False, chunk_len=None):
    """S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T, in C."""
    return _run(q, k, v, g, beta, scale, initial_state, output_final_state,
                chunk_len=chunk_len, l2norm=use_qk_l2norm_in_kernel)


def gated_delta_product(q, k, v, g, beta, num_householder=None, scale=None,
                        initial_state=None, output_final_state=False,
                        use_qk_l2norm_in_kernel=False, chunk_len=None):
    """Gated DeltaProduct (``delta_product.gated_delta_product_ref``): the C gated delta rule
    (the delta rule when g is None) on the interleaved sequence of T num_householder steps
    (``delta_product.delta_product_via``). fla's layout: k, v, beta carry n rows per token."""
    return delta_product_via(delta_rule, gated_delta_rule, q, k, v, g, beta, num_householder,
                             scale, initial_state, output_final_state,
                             use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                             chunk_len=chunk_len)


OPS = {"linear_attention": linear_attention, "simple_gla": simple_gla, "gla": gla,
       "delta_rule": delta_rule, "gated_delta_rule": gated_delta_rule,
       "gated_delta_product": gated_delta_product}


# ---------------------------------------------------------------------------------------
# The decode step of GLA, RetNet and linear attention (issue 43): csrc/linear_rnn_step.c
# ---------------------------------------------------------------------------------------
#
# One call per layer and token from the layer's projected input y = x_t [W_q | W_k | ...]^T
# (one matmul, outside) to the input of its output projection: the decay (GLA's low-rank
# gate, RetNet's fixed gamma), RoPE or the feature map, S' = diag(a) S + k v^T, o = scale
# S'^T q, the normaliser, the head norm and the swish gate. Each function has a plain
# PyTorch twin ``*_step_ref`` with the same arguments (the maths written out, the tests'
# oracle for the C); the mixers' own reference is their sequence code at T = 1.
# ``offsets`` are the column offsets of the pieces in y (q, k, v, then gate / low-rank
# hidden where the layer has them).

STEP_ABI_VERSION = 1
STEP_MAX_DIM = 1024      # csrc's LRS_MAXD: the largest head_k / state value dim
_GLA, _RETENTION, _LINEAR = 0, 1, 2
_NORM_NONE, _NORM_RMS, _NORM_GROUP = 0, 1, 2
_STEP_LIBRARY = cpu_kernels.KernelLibrary(
    "linear_rnn_step", ("linear_rnn_step.c", "linear_rnn_step_impl.h"),
    ("lrs_abi_version", STEP_ABI_VERSION), ("lrs_step",), "linear-RNN decode-step kernel")


def step_unsupported(y: torch.Tensor, S: torch.Tensor, *params: torch.Tensor | None) -> str:
    """Why the C decode step cannot take these tensors ("" when it can): autograd recording,
    not CPU float32 / float64, dtypes that differ (the state, the parameters), head dims
    over STEP_MAX_DIM, or the library unavailable."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (y, S, *params)):
        return "autograd is recording (the C step has no backward)"
    if any(t is not None and t.dtype != y.dtype for t in (S, *params)):
        return "the state, input and parameters are not of one dtype"
    if S.dim() != 4 or max(S.shape[-2:]) > STEP_MAX_DIM:
        return f"state {tuple(S.shape)}: head dims over {STEP_MAX_DIM}"
    return _STEP_LIBRARY.unsupported(y)


def _step_call(mode: int, y, S, heads: int, V: int, offsets, *, scale: float, eps: float = 0.0,
               normalizer: float = 1.0, la_eps: float = 0.0, W2=None, b2=None, nw=None, nb=None,
               pos=None, inv_freq=None, decay=None, low_rank: int = 0, phi: int = 0,
               normalize: int = 0, norm: int = _NORM_NONE):
    """The C step: returns (out (B, heads V), S' (B, heads, K, Vs), a new tensor). The
    pointer and size arrays are built here directly (not through ``cpu_kernels._call``):
    at decode widths the call's Python overhead is a fair part of the step."""
    fn = _step_function(y.dtype)
    B, H, K, Vs = S.shape
    if y.stride(-1) != 1:
        y = y.contiguous()
    S = S.contiguous()
    S2, out = torch.empty_like(S), y.new_empty(B, H * V)
    scal = (ctypes.c_double * 4)(scale, eps, normalizer, la_eps)
    off = (*offsets, 0, 0, 0, 0, 0)[:5]
    ptrs = (ctypes.c_void_p * 12)(
        y.data_ptr(), S.data_ptr(), S2.data_ptr(), out.data_ptr(), ctypes.addressof(scal),
        *[None if t is None else t.data_ptr() for t in (W2, b2, nw, nb, pos, inv_freq, decay)])
    sizes = (ctypes.c_long * 17)(B, H, K, V, Vs, mode, y.stride(0), *off, low_rank, phi,
                                 normalize, norm, torch.get_num_threads())
    if fn(ptrs, sizes) != 0:
        raise RuntimeError(f"linear-RNN decode-step kernel: head dims over {STEP_MAX_DIM}")
    return out, S2


def _step_function(dtype: torch.dtype):
    """The library's ``lrs_step_f32`` / ``_f64`` for ``dtype`` (RuntimeError saying why
    when the library is unavailable)."""
    lib = _STEP_LIBRARY.library()
    return lib.lrs_step_f32 if dtype == torch.float32 else lib.lrs_step_f64


def _c(t):
    return None if t is None else t.contiguous()


def gla_step(y, S, W2, b2, norm_w, offsets, *, low_rank: int, normalizer: float, eps: float):
    """GLA's decode step (``models.linear_rnn.linear_mixers.GatedLinearAttention``). y (B, *)
    holds q, k (heads x K), v, gate (heads x V) and the low-rank hidden (low_rank) at
    ``offsets``; S (B, heads, K, V); W2 (heads K, low_rank), b2 (heads K) the gate's second
    linear; norm_w (V,). Returns (rmsnorm(o) norm_w * silu(gate) (B, heads V), S')."""
    return _step_call(_GLA, y, S, S.shape[1], S.shape[-1], offsets, scale=S.shape[2] ** -0.5,
                      eps=eps, normalizer=normalizer, W2=_c(W2), b2=_c(b2), nw=_c(norm_w),
                      low_rank=low_rank, norm=_NORM_RMS)


def gla_step_ref(y, S, W2, b2, norm_w, offsets, *, low_rank: int, normalizer: float, eps: float):
    """:func:`gla_step` in plain PyTorch."""
    B, H, K, V = S.shape
    oq, ok, ov, og, ol = offsets
    q, k = y[:, oq:oq + H * K].view(B, H, K), y[:, ok:ok + H * K].view(B, H, K)
    v, gate = y[:, ov:ov + H * V].view(B, H, V), y[:, og:og + H * V].view(B, H, V)
    g = F.logsigmoid(F.linear(y[:, ol:ol + low_rank], W2, b2)).view(B, H, K) / normalizer
    S2 = S * g.exp()[..., None] + k[..., None] * v[..., None, :]
    o = K ** -0.5 * (q[..., None, :] @ S2).squeeze(-2)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * norm_w * F.silu(gate)
    return o.flatten(1), S2


def retention_step(y, S, pos, inv_freq, decay, norm_w, norm_b, offsets, *, eps: float):
    """RetNet's decode step (``MultiScaleRetention``). y (B, *) holds q, k (heads x K), v and
    the gate (heads x V) at ``offsets``; S (B, heads, K, V); pos (B,) int64, each row's
    position; inv_freq (K / 2,) float64 RoPE frequencies; decay (heads,) gamma_h in y's
    dtype; norm_w, norm_b (heads V) the group norm's affine. Returns (groupnorm_head(o) *
    silu(gate) (B, heads V), S')."""
    return _step_call(_RETENTION, y, S, S.shape[1], S.shape[-1], offsets,
                      scale=S.shape[2] ** -0.5, eps=eps, nw=_c(norm_w), nb=_c(norm_b),
                      pos=_c(pos), inv_freq=_c(inv_freq), decay=_c(decay), norm=_NORM_GROUP)


def retention_step_ref(y, S, pos, inv_freq, decay, norm_w, norm_b, offsets, *, eps: float):
    """:func:`retention_step` in plain PyTorch."""
    B, H, K, V = S.shape
    oq, ok, ov, og = offsets[:4]
    ang = pos.to(torch.float64)[:, None] * inv_freq                 # (B, K / 2)
    cos, sin = (f(ang)[:, None].to(y.dtype) for f in (torch.cos, torch.sin))

    def rope(x):
        x1, x2 = x[..., :K // 2], x[..., K // 2:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)
    q, k = rope(y[:, oq:oq + H * K].view(B, H, K)), rope(y[:, ok:ok + H * K].view(B, H, K))
    v, gate = y[:, ov:ov + H * V].view(B, H, V), y[:, og:og + H * V].view(B, H, V)
    S2 = S * decay[:, None, None] + k[..., None] * v[..., None, :]
    o = K ** -0.5 * (q[..., None, :] @ S2).squeeze(-2)
    o = F.group_norm(o.reshape(B, H * V), H, norm_w, norm_b, eps).view(B, H, V)
    return (o * F.silu(gate)).flatten(1), S2


def linear_attention_step(y, S, norm_w, offsets, *, elu_features: bool, normalize: bool,
                          eps: float, norm_eps: float):
    """Linear attention's decode step (``LinearAttention``). y (B, *) holds q, k (heads x K)
    and v (heads x V) at ``offsets``; S (B, heads, K, V + normalize); phi = elu + 1 when
    elu_features, else the identity; norm_w (V,) or None: the per-head RMS output norm.
    Returns (o (B, heads V), S'), o the numerator over (normaliser + eps) when normalize."""
    V = S.shape[-1] - int(normalize)
    return _step_call(_LINEAR, y, S, S.shape[1], V, offsets, scale=S.shape[2] ** -0.5,
                      eps=norm_eps, la_eps=eps, nw=_c(norm_w), phi=int(elu_features),
                      normalize=int(normalize), norm=_NORM_NONE if norm_w is None else _NORM_RMS)


def linear_attention_step_ref(y, S, norm_w, offsets, *, elu_features: bool, normalize: bool,
                              eps: float, norm_eps: float):
    """:func:`linear_attention_step` in plain PyTorch."""
    B, H, K, Vs = S.shape
    V = Vs - int(normalize)
    oq, ok, ov = offsets[:3]
    q, k = y[:, oq:oq + H * K].view(B, H, K), y[:, ok:ok + H * K].view(B, H, K)
    if elu_features:
        q, k = F.elu(q) + 1.0, F.elu(k) + 1.0
    v = y[:, ov:ov + H * V].view(B, H, V)
    if normalize:
        v = torch.cat([v, torch.ones_like(v[..., :1])], -1)
    S2 = S + k[..., None] * v[..., None, :]
    o = K ** -0.5 * (q[..., None, :] @ S2).squeeze(-2)
    if normalize:
        o = o[..., :-1] / (o[..., -1:] + eps)
    if norm_w is not None:
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + norm_eps) * norm_w
    return o.flatten(1), S2


# ---------------------------------------------------------------------------------------
# The decode step of the delta rules (issue 43): csrc/delta_rule_step.c
# ---------------------------------------------------------------------------------------
#
# DeltaNet, Gated DeltaNet and Gated DeltaProduct: one call per layer and token from the
# stacked projections y = x_t [W_q | W_k | W_v | W_b | (W_a) | (W_g)]^T to the input of
# o_proj: the short conv's window (and its next cache), SiLU, the L2 norms of q and k,
# beta, the Mamba-2 style decay, the n delta-rule writes, the readout, the head RMS norm
# and the swish gate; KDA (ABI 2): the decay per key channel from f = x W_f1 W_f2 and the
# sigmoid gate from x W_g1 W_g2 + b_g, both low-rank products formed by the caller and
# passed apart. ``delta_rule_step_ref`` is its twin in plain PyTorch.

DELTA_STEP_ABI_VERSION = 2
_DELTA_STEP_LIBRARY = cpu_kernels.KernelLibrary(
    "delta_rule_step", ("delta_rule_step.c", "kernel_common.h", "delta_rule_step_impl.h"),
    ("drs_abi_version", DELTA_STEP_ABI_VERSION), ("drs_step",), "delta-rule decode-step kernel")


def delta_step_unsupported(y: torch.Tensor, S: torch.Tensor, *params: torch.Tensor | None) -> str:
    """Why :func:`delta_rule_step` cannot take these tensors ("" when it can): the checks of
    :func:`step_unsupported` (autograd recording, not CPU float32 / float64, dtypes that
    differ, head dims over STEP_MAX_DIM), against this kernel's library."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (y, S, *params)):
        return "autograd is recording (the C step has no backward)"
    if any(t is not None and t.dtype != y.dtype for t in (S, *params)):
        return "the state, input and parameters are not of one dtype"
    if S.dim() != 4 or max(S.shape[-2:]) > STEP_MAX_DIM:
        return f"state {tuple(S.shape)}: head dims over {STEP_MAX_DIM}"
    return _DELTA_STEP_LIBRARY.unsupported(y)


def delta_rule_step(y, S, conv_state, conv_w, conv_b, A_log, dt_bias, norm_w, offsets, *,
                    n_heads: int, num_householder: int, allow_neg_eigval: bool, eps: float,
                    key_decay=None, sigmoid_gate=None):
    """The delta rules' decode step (``models.linear_rnn.delta_mixers``: DeltaNet, Gated
    DeltaNet, Gated DeltaProduct). y (B, *) holds, from column ``offsets[0]``, the q, k, v
    channels before the conv ([q (H dk) | k (n H dk) | v (n Hv dv)], fla's (n, heads, dim)
    order), the beta logits (n Hv) at ``offsets[1]``, the decay's input a (Hv) at
    ``offsets[2]`` and the output gate (Hv dv) at ``offsets[3]`` (None: the layer has
    none); S (B, Hv, dk, dv); conv_state (B, C, W - 1) and conv_w (C, 1, W) (C the q, k, v
    channels), conv_b (C) or None, or all three None without the short conv; A_log,
    dt_bias (Hv) the decay's parameters (None without it); norm_w (dv,) the head RMS
    norm's weight. Returns (out (B, Hv dv), S', the next conv cache or None), new tensors:
    rmsnorm(o) norm_w (* silu(gate)), o = dk^-0.5 S'^T q.

    KDA: ``key_decay`` f (B, Hv dk) makes the decay per key channel,
    exp(-exp(A_log_hv) softplus(f + dt_bias)) (dt_bias (Hv dk)) scaling S's rows
    (``offsets[2]`` unread); ``sigmoid_gate`` (B, Hv dv) makes the gate sigmoid(gate)
    (``offsets[3]`` unread)."""
    B, Hv, dk, dv = S.shape
    n = num_householder
    C = n_heads * dk * (1 + n) + Hv * dv * n
    W = 0 if conv_w is None else conv_w.shape[-1]
    if y.stride(-1) != 1:
        y = y.contiguous()
    S = S.contiguous()
    S2, out, act = torch.empty_like(S), y.new_empty(B, Hv * dv), y.new_empty(B, C)
    cache = cache2 = None
    if W:
        cache = conv_state.contiguous()
        cache2 = torch.empty_like(cache)
    key_decay, sigmoid_gate = _c(key_decay), _c(sigmoid_gate)      # kept alive for the call
    weights = tuple(_c(t) for t in (conv_w, conv_b, A_log, dt_bias, norm_w))   # likewise
    scal = (ctypes.c_double * 2)(dk ** -0.5, eps)
    oq, ob, oa, og = offsets
    ptrs = (ctypes.c_void_p * 15)(
        y.data_ptr(), S.data_ptr(), S2.data_ptr(), out.data_ptr(), act.data_ptr(),
        *[None if t is None else t.data_ptr()
          for t in (cache, cache2, *weights)],
        ctypes.addressof(scal),
        *[None if t is None else t.data_ptr() for t in (key_decay, sigmoid_gate)])
    sizes = (ctypes.c_long * 14)(B, n_heads, Hv, dk, dv, n, W, y.stride(0), oq, ob,
                                 -1 if oa is None else oa, -1 if og is None else og,
                                 int(allow_neg_eigval), torch.get_num_threads())
    lib = _DELTA_STEP_LIBRARY.library()
    fn = lib.drs_step_f32 if y.dtype == torch.float32 else lib.drs_step_f64
    rc = fn(ptrs, sizes)
    if rc != 0:
        raise RuntimeError(f"delta-rule decode-step kernel: head dims over {STEP_MAX_DIM} or "
                           f"value heads {Hv} not a multiple of n_heads {n_heads} (code {rc})")
    return out, S2, cache2


def delta_rule_step_ref(y, S, conv_state, conv_w, conv_b, A_log, dt_bias, norm_w, offsets, *,
                        n_heads: int, num_householder: int, allow_neg_eigval: bool,
                        eps: float, key_decay=None, sigmoid_gate=None):
    """:func:`delta_rule_step` in plain PyTorch."""
    B, Hv, dk, dv = S.shape
    n, H = num_householder, n_heads
    C = H * dk * (1 + n) + Hv * dv * n
    oq, ob, oa, og = offsets
    pre = y[:, oq:oq + C]
    cache2 = None
    if conv_w is not None:
        window = torch.cat([conv_state, pre[..., None]], -1)                # (B, C, W)
        pre = (window * conv_w[:, 0]).sum(-1)
        if conv_b is not None:
            pre = pre + conv_b
        cache2 = window[..., 1:].clone()
    q, k, v = F.silu(pre).split([H * dk, n * H * dk, n * Hv * dv], -1)
    q = F.normalize(q.view(B, H, dk), dim=-1).repeat_interleave(Hv // H, 1)
    k = F.normalize(k.view(B, n, H, dk), dim=-1).repeat_interleave(Hv // H, 2)
    v = v.view(B, n, Hv, dv)
    beta = y[:, ob:ob + n * Hv].sigmoid().view(B, n, Hv) * (2.0 if allow_neg_eigval else 1.0)
    S2 = S
    if key_decay is not None:                                               # KDA
        g = -A_log.exp()[:, None] * F.softplus((key_decay + dt_bias).view(B, Hv, dk))
        S2 = S2 * g.exp()[..., None]
    elif oa is not None:
        g = -A_log.exp() * F.softplus(y[:, oa:oa + Hv] + dt_bias)           # (B, Hv)
        S2 = S2 * g.exp()[..., None, None]
    for j in range(n):
        err = v[:, j] - (k[:, j, :, None, :] @ S2).squeeze(-2)             # v - S^T k
        S2 = S2 + k[:, j, ..., None] * (beta[:, j, :, None] * err)[..., None, :]
    o = dk ** -0.5 * (q[..., None, :] @ S2).squeeze(-2)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * norm_w
    if sigmoid_gate is not None:                                            # KDA
        o = o * sigmoid_gate.view(B, Hv, dv).sigmoid()
    elif og is not None:
        o = o * F.silu(y[:, og:og + Hv * dv].view(B, Hv, dv))
    return o.flatten(1), (S2.clone() if S2 is S else S2), cache2
