"""Linear RNNs with a matrix state: linear attention, RetNet / Mamba-2 (SSD), GLA, DeltaNet
and Gated DeltaNet, as one family of operators.

Per batch element and head the state S_t is a (key_dim, value_dim) matrix; with t = 0..T-1:

    linear attention  (Katharopoulos et al. 2020)  S_t = S_{t-1} + k_t v_t^T
    simple_gla        (RetNet, Sun et al. 2023;     S_t = exp(g_t) S_{t-1} + k_t v_t^T
                       Mamba-2 SSD, Dao & Gu 2024)  g_t one number per head and step
    gla               (Yang et al. 2024)            S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T
                                                    g_t a vector over the key dim
    delta_rule        (DeltaNet, Schlag et al. 2021; Yang et al. 2024 for the chunked form)
                      S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T
    gated_delta_rule  (Gated DeltaNet, Yang, Kautz & Hatamizadeh 2025)
                      S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T

    gated_delta_product (Gated DeltaProduct, Siems et al. 2025): n delta-rule steps per
                      token, S <- exp(g_t) S, then for j < n:
                      S <- S + beta_tj k_tj (v_tj - S^T k_tj)^T   (``PRODUCT_OPS``,
                      in ``models.kernels.delta_product``, which builds on this module)

    ``OPS`` (here) holds the five above; ``models.kernels.linear_rnn_ops`` holds the
    family's whole table ``ALL_OPS`` (these and ``PRODUCT_OPS``) and ``make_inputs``.

    output            o_t = scale * S_t^T q_t

Argument convention is flash-linear-attention's (fla), so outside code can call these:

    q, k:           (batch, time, heads, key_dim)
    v:              (batch, time, heads, value_dim)
    g:              (batch, time, heads) scalar log-gate per head, or
                    (batch, time, heads, key_dim) for gla; log space (usually <= 0)
    beta:           (batch, time, heads)
    scale:          keyword, default key_dim ** -0.5
    initial_state:  (batch, heads, key_dim, value_dim) or None (zeros)
    output_final_state: return S_{T-1} as the second result (else None)
    returns         (o, final_state), o: (batch, time, heads, value_dim)

Grouped value heads: v, g, beta and the state may have G times q and k's heads (value head h
reads q/k head h // G, fla's and Qwen3-Next's layout); "heads" above is then v's. The
product op's k, v and beta carry n rows per token (batch, time * n, ...), q and g one.

Each operator has two forms:

- ``*_ref``: the recurrence above as a Python loop over time (``unbind``, never indexing
  in the loop: see FACTS.md). The oracle for the tests; slow (autograd stores every step).
- the plain name (``linear_attention``, ...): the chunkwise-parallel form in PyTorch,
  ``chunk_size`` steps per chunk (default: 64 on a GPU, per-op ``CPU_CHUNK_SIZE`` on a
  CPU). Within a chunk the outputs are matmuls with
  a causal, decay-weighted (chunk, chunk) matrix; only the state is passed from chunk to
  chunk (a loop over time / chunk_size chunks). For the delta rules the chunk's updates
  are put in the WY / UT form (Yang et al., "Parallelizing Linear Transformers with the
  Delta Rule over Sequence Length", 2024): the pseudo-values u solve the unit lower
  triangular system (I + strictly_lower(diag(beta) (K K^T o Gamma))) u =
  diag(beta) (V - diag(exp(b)) K S_0), with Gamma_ij = exp(b_i - b_j) the decay from j to i
  and b the chunk's cumulative log-gate, so u = U - W S_0 with U, W found once per chunk
  (``torch.linalg.solve_triangular``), and S_C = exp(b_C) S_0 + (K o exp(b_C - b))^T u.
  Plain autograd runs through it. Lengths that are not a multiple of ``chunk_size`` are
  zero-padded (k = 0, g = 0, beta = 0 leave the state unchanged), so the final state is
  exact; streaming a sequence in pieces with ``initial_state`` = the previous piece's
  final state equals one call.

Under autograd, a sequence longer than ``SEGMENT_LEN`` (``segment_len=``) is run in segments
whose start states alone are kept; the backward recomputes one segment at a time, so what
the operator holds for the backward no longer grows with the chunks' (C, C) matrices
(``models.kernels.segment_recompute``).

Stability of log-space gates in float32: cumulative sums of log-gates reach -1000s within
a chunk (FACTS.md: "the float32 cumsum trap"), so exp(-b_j) would overflow. Only
exponentials of non-positive sums are ever formed: scalar gates use the segment sum of
mamba_ssm's ``ssd_minimal`` (masked to -inf above the diagonal BEFORE exp). The vector
gate (gla) has two forms of a chunk's score matrix, chosen per call from the data: when
every chunk's range of b (per key channel) is small enough that exp(+-range) cannot
overflow (< 62 in float32, < 497 in float64), one matmul
(q exp(b - r)) (k exp(r - b))^T with r the mid-range, exact to rounding; otherwise
(e.g. log-gates of -20 per step) sub-chunks of 8: within a sub-chunk the full
(sub, sub, key_dim) decay tensor exp(b_i - b_j) (masked before exp), across sub-chunks
q_i exp(b_i - r) and k_j exp(r - b_j) with r the cumulative gate at the end of the
sub-chunk before i's, both factors <= 1 when g <= 0 (the scheme of fla's chunk_gla). The
second form is ~5-10x slower on CPU (memory-bound 4-D tensors).

Half / bfloat16 inputs are computed in float32 and returned in the input dtype; the final
state is returned in the compute dtype.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from models.kernels.segment_recompute import SegmentRecompute

__all__ = [
    "linear_attention", "linear_attention_ref",
    "simple_gla", "simple_gla_ref",
    "gla", "gla_ref",
    "delta_rule", "delta_rule_ref",
    "gated_delta_rule", "gated_delta_rule_ref",
    "OPS",
]

DEFAULT_CHUNK_SIZE = 64
# chunk_size=None picks these on a CPU (fwd+bwd at batch 8, 4 heads of 32, L = 4096, one
# thread, `python -m models.kernels.linear_rnn_bench --tune-chunks`: the delta rules' chunk loop
# and triangular solve favour short chunks there) and DEFAULT_CHUNK_SIZE elsewhere.
CPU_CHUNK_SIZE = {"linear_attention": 32, "simple_gla": 32, "gla": 64, "delta_rule": 16,
                  "gated_delta_rule": 16}
GLA_SUB_CHUNK = 8
GLA_FACTORISED = True   # allow the one-matmul form of gla's chunk when the gates permit


# ---------------------------------------------------------------------------------------
# Argument checks shared by both forms
# ---------------------------------------------------------------------------------------

def _check(q, k, v, g=None, beta=None, initial_state=None, vector_gate=False):
    """Shapes checked; returns (B, T, H, K, V) with H the VALUE heads (the state's heads):
    v may have more heads than q and k (grouped value heads, a multiple of them)."""
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q, k must be (batch, time, heads, key_dim) of one shape; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}")
    B, T, Hq, K = q.shape
    if v.dim() != 4 or v.shape[:2] != (B, T) or v.shape[2] < Hq or v.shape[2] % Hq:
        raise ValueError(f"v must be (batch, time, value_heads, value_dim) = ({B}, {T}, "
                         f"a multiple of {Hq}, V); got {tuple(v.shape)}")
    H, V = v.shape[2], v.shape[-1]
    if g is not None:
        want = (B, T, H, K) if vector_gate else (B, T, H)
        if tuple(g.shape) != want:
            raise ValueError(f"g must be {want}; got {tuple(g.shape)}")
    if beta is not None and tuple(beta.shape) != (B, T, H):
        raise ValueError(f"beta must be {(B, T, H)}; got {tuple(beta.shape)}")
    if initial_state is not None and tuple(initial_state.shape) != (B, H, K, V):
        raise ValueError(f"initial_state must be {(B, H, K, V)}; got "
                         f"{tuple(initial_state.shape)}")
    return B, T, H, K, V


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def _state0(initial_state, B, H, K, V, dtype, device):
    if initial_state is None:
        return torch.zeros(B, H, K, V, dtype=dtype, device=device)
    return initial_state.to(dtype)


def _l2norm(x):
    return F.normalize(x, p=2, dim=-1)


# ---------------------------------------------------------------------------------------
# References: the recurrence, one step at a time
# ---------------------------------------------------------------------------------------

def _recurrent_ref(q, k, v, g, beta, scale, initial_state, output_final_state,
                   vector_gate=False):
    """The five recurrences as one loop. q, k (B, T, Hq, K); v (B, T, H, V) with H a
    multiple G of Hq (grouped value heads: value head h reads q/k head h // G); g None or
    (B, T, H) or (B, T, H, K) (vector_gate); beta None (no delta rule) or (B, T, H).

    The state is held as (B, Hq, G, K, V) and each q/k head is contracted with its G value
    heads directly (no repeated copies of q and k: the chunked and C forms repeat them, so
    this loop checks that they repeat them the right way)."""
    B, T, H, K, V = _check(q, k, v, g, beta, initial_state, vector_gate)
    Hq = q.shape[2]
    G = H // Hq
    dt = _compute_dtype(q)
    scale = K ** -0.5 if scale is None else scale
    S = _state0(initial_state, B, H, K, V, dt, q.device).reshape(B, Hq, G, K, V)
    qs, ks = (x.to(dt).unbind(1) for x in (q, k))                       # (B, Hq, K)
    vs = v.to(dt).reshape(B, T, Hq, G, V).unbind(1)                     # (B, Hq, G, V)
    gs = (g.to(dt).reshape(B, T, Hq, G, *g.shape[3:]).unbind(1) if g is not None
          else [None] * T)
    bs = beta.to(dt).reshape(B, T, Hq, G).unbind(1) if beta is not None else [None] * T
    outs = []
    for q_t, k_t, v_t, g_t, b_t in zip(qs, ks, vs, gs, bs):
        if g_t is not None:
            decay = g_t.exp()
            S = S * (decay[..., :, None] if vector_gate else decay[..., None, None])
        if b_t is not None:                                  # delta rule
            kS = torch.einsum("bhk,bhgkv->bhgv", k_t, S)
            v_t = b_t[..., None] * (v_t - kS)
        S = S + k_t[:, :, None, :, None] * v_t[..., None, :]
        outs.append(scale * torch.einsum("bhk,bhgkv->bhgv", q_t, S).reshape(B, H, V))
    o = torch.stack(outs, 1) if outs else v.new_zeros(B, 0, H, V, dtype=dt)
    return o.to(v.dtype), (S.reshape(B, H, K, V) if output_final_state else None)


def linear_attention_ref(q, k, v, scale=None, initial_state=None, output_final_state=False):
    """S_t = S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t, step by step. Shapes: module doc."""
    return _recurrent_ref(q, k, v, None, None, scale, initial_state, output_final_state)


def simple_gla_ref(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    """S_t = exp(g_t) S_{t-1} + k_t v_t^T with g (batch, time, heads), step by step."""
    return _recurrent_ref(q, k, v, g, None, scale, initial_state, output_final_state)


def gla_ref(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    """S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T with g (batch, time, heads, key_dim)."""
    return _recurrent_ref(q, k, v, g, None, scale, initial_state, output_final_state,
                          vector_gate=True)


def delta_rule_ref(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                   use_qk_l2norm_in_kernel=False):
    """S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T, step by step."""
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    return _recurrent_ref(q, k, v, None, beta, scale, initial_state, output_final_state)


def gated_delta_rule_ref(q, k, v, g, beta, scale=None, initial_state=None,
                         output_final_state=False, use_qk_l2norm_in_kernel=False):
    """S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T, step by step."""
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    return _recurrent_ref(q, k, v, g, beta, scale, initial_state, output_final_state)


# ---------------------------------------------------------------------------------------
# Chunkwise-parallel forms
# ---------------------------------------------------------------------------------------

def _chunk_len(chunk_size: int | None, T: int, op: str, device: torch.device) -> int:
    """The chunk actually used: chunk_size (None: the op's default for the device), or less
    for a short sequence (less padding)."""
    if chunk_size is None:
        chunk_size = CPU_CHUNK_SIZE[op] if device.type == "cpu" else DEFAULT_CHUNK_SIZE
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1; got {chunk_size}")
    return min(chunk_size, max(8, -(-T // 8) * 8))


def _to_chunks(x: torch.Tensor, C: int, dtype) -> torch.Tensor:
    """(B, T, H, *rest) -> (B, H, N, C, *rest), zero-padded at the end to N * C steps."""
    B, T, H = x.shape[:3]
    x = x.to(dtype).transpose(1, 2)                      # (B, H, T, *rest)
    pad = (-T) % C
    if pad:
        x = F.pad(x, (0, 0) * (x.dim() - 3) + (0, pad))
    return x.reshape(B, H, (T + pad) // C, C, *x.shape[3:])


def _from_chunks(o: torch.Tensor, T: int, dtype) -> torch.Tensor:
    """(B, H, N, C, V) -> (B, T, H, V)."""
    B, H, N, C, V = o.shape
    return o.reshape(B, H, N * C, V)[:, :, :T].transpose(1, 2).to(dtype)


def _segsum(x: torch.Tensor) -> torch.Tensor:
    """x (..., C) -> (..., C, C) with out[i, j] = x_{j+1} + ... + x_i for i >= j, -inf above
    the diagonal: mamba_ssm's stable segment sum (sums of differences never formed as a
    difference of two large cumulative sums; the mask is applied before any exp)."""
    C = x.size(-1)
    x = x[..., None].expand(*x.shape, C)                 # x[..., i, j] = x_i
    strict = torch.ones(C, C, dtype=torch.bool, device=x.device).tril(-1)
    s = x.masked_fill(~strict, 0).cumsum(-2)
    return s.masked_fill(~strict.logical_or(torch.eye(C, dtype=torch.bool, device=x.device)),
                         float("-inf"))


# Within a chunk, exp(b_i - b_j) is formed as a difference of cumulative sums when the
# chunk's total log-decay is above this (float32 rounds b to ~|b| * 6e-8, so the exponent
# is exact to ~4e-6 here); below it the segment sum (sums of the g's themselves) is used.
SCALAR_DIFF_SPAN = 64.0


def _scalar_decays(gc: torch.Tensor):
    """Chunked scalar log-gates gc (B, H, N, C) -> Gamma (B, H, N, C, C) = exp(b_i - b_j)
    (0 above the diagonal), exp(b) (B, H, N, C) from the chunk start, exp(b_C - b_j)
    (B, H, N, C) to the chunk end, and exp(b_C) (B, H, N); b = within-chunk cumsum.

    Two forms of Gamma, the same to rounding: b_i - b_j masked (-inf above the diagonal)
    before exp, three passes over the (C, C) tensor, when every chunk's total log-decay is
    above -SCALAR_DIFF_SPAN; else the stable segment sum (five passes)."""
    b = gc.cumsum(-1)
    C = gc.size(-1)
    if bool(b[..., -1].min() >= -SCALAR_DIFF_SPAN):
        causal = torch.ones(C, C, dtype=torch.bool, device=gc.device).tril()
        Gamma = (b[..., :, None] - b[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    else:
        Gamma = _segsum(gc).exp()
    eb = b.exp()
    return Gamma, eb, (b[..., -1:] - b).exp(), eb[..., -1]


def _carry(decay, U, S):
    """The inter-chunk recurrence S_n = decay_n * S_{n-1} + U_n. decay None or
    (B, H, N) or (B, H, N, K); U (B, H, N, K, V); S (B, H, K, V).
    Returns the states at each chunk's start (B, H, N, K, V) and the last state."""
    starts = []
    decays = decay.unbind(2) if decay is not None else [None] * U.shape[2]
    for d, u in zip(decays, U.unbind(2)):
        starts.append(S)
        if d is not None:
            S = S * (d[..., None, None] if d.dim() == 2 else d[..., None])
        S = S + u
    return torch.stack(starts, 2), S


def _prologue(op, q, k, v, g, beta, scale, initial_state, chunk_size, vector_gate=False):
    """What every chunked form starts with: shapes checked, the compute dtype, the scale,
    the initial state and the chunk length (None for an empty sequence)."""
    B, T, H, K, V = _check(q, k, v, g, beta, initial_state, vector_gate)
    dt = _compute_dtype(q)
    scale = K ** -0.5 if scale is None else scale
    S0 = _state0(initial_state, B, H, K, V, dt, q.device)
    C = _chunk_len(chunk_size, T, op, q.device) if T else None
    return B, T, H, K, V, dt, scale, S0, C


def _chunk_gated(q, k, v, g, scale, initial_state, chunk_size, vector_gate):
    """linear attention (g None), simple_gla (scalar g) and gla (vector g), chunked.
    Returns (o, final state)."""
    op = "linear_attention" if g is None else ("gla" if vector_gate else "simple_gla")
    B, T, H, K, V, dt, scale, S0, C = _prologue(op, q, k, v, g, None, scale, initial_state,
                                                chunk_size, vector_gate)
    if C is None:
        return v.new_zeros(B, 0, H, V), S0
    qc, kc, vc = (_to_chunks(x, C, dt) for x in (q, k, v))  # (B, H, N, C, K|V)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    if g is None:
        A = (qc @ kc.transpose(-1, -2)).masked_fill(~causal, 0)
        qd, kd, decay = qc, kc, None
    elif not vector_gate:
        Gamma, eb, to_end, decay = _scalar_decays(_to_chunks(g, C, dt))
        A = (qc @ kc.transpose(-1, -2)) * Gamma
        qd, kd = qc * eb[..., None], kc * to_end[..., None]
    else:
        gc = _to_chunks(g, C, dt)                              # (B, H, N, C, K)
        b = gc.cumsum(-2)
        A = _gla_intra(qc, kc, gc, b)
        qd = qc * b.exp()
        kd = kc * (b[..., -1:, :] - b).exp()
        decay = b[..., -1, :].exp()                            # (B, H, N, K)
    starts, S = _carry(decay, kd.transpose(-1, -2) @ vc, S0)
    o = scale * (A @ vc + qd @ starts)
    return _from_chunks(o, T, v.dtype), S


def _gla_max_span(dtype) -> float:
    """The largest within-chunk range of the cumulative log-gate for which the factorised
    form q exp(b - r) . k exp(r - b) (r the mid-range) stays far from overflow and
    underflow: exp(+-span / 2) and the masked upper triangle's exp(span) are finite."""
    return 0.7 * math.log(torch.finfo(dtype).max) if GLA_FACTORISED else -1.0


def _gla_intra(qc, kc, gc, b, sub: int = GLA_SUB_CHUNK):
    """The causal decay-weighted score matrix of GLA within each chunk:
    A[i, j] = sum_k q_ik k_jk exp(b_ik - b_jk) for i >= j, else 0; b = within-chunk cumsum.
    qc, kc, gc, b (B, H, N, C, K) -> (B, H, N, C, C).

    Fast path: when every chunk's range of b (per key channel) is below
    :func:`_gla_max_span`, A = (q exp(b - r)) (k exp(r - b))^T, masked, with r the mid-range
    of b: one matmul, as exact as the direct form (each product term equals
    q_ik k_jk exp(b_ik - b_jk) to rounding; only overflow could hurt, and the range test
    excludes it). Otherwise (strongly negative gates) the sub-chunked form: only
    exponentials of sums <= 0 (for g <= 0) are formed, see the module doc."""
    B, H, N, C, K = qc.shape
    hi, lo = b.amax(-2, keepdim=True), b.amin(-2, keepdim=True)
    if bool(((hi - lo).max() <= _gla_max_span(b.dtype))):
        r = ((hi + lo) / 2).detach()                           # cancels exactly
        A = (qc * (b - r).exp()) @ (kc * (r - b).exp()).transpose(-1, -2)
        causal = torch.ones(C, C, dtype=torch.bool, device=qc.device).tril()
        return A.masked_fill(~causal, 0)
    sub = sub if C % sub == 0 else C
    n = C // sub
    dev = qc.device
    qs, ks, gs = (x.reshape(B, H, N, n, sub, K) for x in (qc, kc, gc))
    bl = gs.cumsum(-2)                                         # cumsum within sub-chunk
    # diagonal blocks: the full (sub, sub, K) decay tensor, masked before exp
    tri = torch.ones(sub, sub, dtype=torch.bool, device=dev).tril()
    E = (bl[..., :, None, :] - bl[..., None, :, :]).masked_fill(~tri[..., None], float("-inf"))
    A_diag = (qs[..., :, None, :] * ks[..., None, :, :] * E.exp()).sum(-1)  # (.., n, s, s)
    eye = torch.eye(n, dtype=qc.dtype, device=dev).reshape(n, 1, n, 1)
    A = A_diag.unsqueeze(-2) * eye                             # (.., n, s, n, s)
    if n > 1:
        ends = b.reshape(B, H, N, n, sub, K)[..., -1, :]       # end of each sub-chunk
        r = torch.cat([torch.zeros_like(ends[..., :1, :]), ends[..., :-1, :]], -2)
        before = (torch.arange(C, device=dev)[None, :] // sub
                  < torch.arange(n, device=dev)[:, None])      # (n, C): j in an earlier sub
        Ek = (r[..., :, None, :] - b[..., None, :, :]).masked_fill(~before[..., None],
                                                                  float("-inf"))
        ko = kc[..., None, :, :] * Ek.exp()                    # (B, H, N, n, C, K)
        A_off = (qs * bl.exp()) @ ko.transpose(-1, -2)         # (B, H, N, n, sub, C)
        A = A + A_off.reshape(B, H, N, n, sub, n, sub)
    return A.reshape(B, H, N, C, C)


def _chunk_delta(q, k, v, g, beta, scale, initial_state, chunk_size):
    """delta_rule (g None) and gated_delta_rule (scalar g), chunked in the WY / UT form.
    Returns (o, final state)."""
    op = "delta_rule" if g is None else "gated_delta_rule"
    B, T, H, K, V, dt, scale, S0, C = _prologue(op, q, k, v, g, beta, scale, initial_state,
                                                chunk_size)
    if C is None:
        return v.new_zeros(B, 0, H, V), S0
    qc, kc, vc = (_to_chunks(x, C, dt) for x in (q, k, v))
    bc = _to_chunks(beta, C, dt)                               # (B, H, N, C)
    eye = torch.eye(C, dtype=dt, device=q.device)
    if g is None:
        Gamma = eb = to_end = decay = None
    else:
        Gamma, eb, to_end, decay = _scalar_decays(_to_chunks(g, C, dt))
    # (I + strictly_lower(diag(beta) (K K^T o Gamma))) [U | W] = diag(beta) [V | exp(b) K]
    KK = kc @ kc.transpose(-1, -2)
    L = (bc[..., :, None] * (KK if Gamma is None else KK * Gamma)).tril(-1) + eye
    kb = kc if eb is None else kc * eb[..., None]
    rhs = bc[..., None] * torch.cat([vc, kb], -1)
    UW = torch.linalg.solve_triangular(L, rhs, upper=False, unitriangular=True)
    U, W = UW[..., :V], UW[..., V:]
    A = qc @ kc.transpose(-1, -2)
    A = A.tril() if Gamma is None else A * Gamma               # causal (Gamma = 0 above)
    kd = kc if to_end is None else kc * to_end[..., None]
    starts, us = [], []
    S = S0
    decays = decay.unbind(2) if decay is not None else [None] * U.shape[2]
    for U_n, W_n, kd_n, d in zip(U.unbind(2), W.unbind(2), kd.unbind(2), decays):
        starts.append(S)
        u = U_n - W_n @ S                                      # pseudo-values (B, H, C, V)
        us.append(u)
        if d is not None:
            S = S * d[..., None, None]
        S = S + kd_n.transpose(-1, -2) @ u
    starts, u = torch.stack(starts, 2), torch.stack(us, 2)
    qd = qc if eb is None else qc * eb[..., None]
    o = scale * (qd @ starts + A @ u)
    return _from_chunks(o, T, v.dtype), S


# ---------------------------------------------------------------------------------------
# Long sequences under autograd: recompute per segment
# ---------------------------------------------------------------------------------------

# A sequence longer than this is trained in segments of this many steps: the forward keeps
# only each segment's start state (B, H, K, V); the backward recomputes one segment at a
# time, last first, with the gradient of its end state from the segment after it. Autograd
# of the chunked form stores every chunk's (C, C) score and decay matrices and the chunked
# copies of q, k, v: ~O(T * (C + K + V)) floats per head, 600+ MiB per layer at batch 8,
# 4 heads, T = 4096, so whole-sequence autograd at T = 16384 costs more than the
# Transformer's fused attention (docs/RESULTS.md). The price is one extra forward of the
# operator. At or below this length nothing changes.
SEGMENT_LEN = 4096


def _maybe_segmented(core, q, k, v, g, beta, initial_state, output_final_state, segment_len):
    """Run core(q, k, v, g, beta, S0) -> (o, S_end) directly, or in recomputed segments
    when autograd will need it and the sequence is longer than the segment (SEGMENT_LEN when
    segment_len is None; 0 turns it off)."""
    seg = SEGMENT_LEN if segment_len is None else segment_len
    tensors = [x for x in (q, k, v, g, beta, initial_state) if x is not None]
    if (seg and q.dim() == 4 and q.shape[1] > seg and torch.is_grad_enabled()
            and any(x.requires_grad for x in tensors)):
        B, T, H, K = q.shape
        S0 = initial_state if initial_state is not None else q.new_zeros(
            B, H, K, v.shape[-1], dtype=_compute_dtype(q))
        o, S = SegmentRecompute.apply(core, seg, q, k, v, g, beta, S0)
    else:
        o, S = core(q, k, v, g, beta, initial_state)
    return o, (S if output_final_state else None)


def linear_attention(q, k, v, scale=None, initial_state=None, output_final_state=False,
                     chunk_size=None, segment_len=None):
    """Linear attention S_t = S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t, chunked.
    (No normaliser: apply feature maps / normalisation outside, as fla's chunk_linear_attn
    with normalize=False.) Shapes: module doc. Returns (o, final_state or None)."""
    return _run_chunked(q, k, v, None, None, scale, initial_state, output_final_state,
                        chunk_size, segment_len)


def simple_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
               chunk_size=None, segment_len=None):
    """Scalar-gated linear attention S_t = exp(g_t) S_{t-1} + k_t v_t^T, g (batch, time,
    heads) in log space: RetNet's fixed decay (g = log(1 - 2^(-5-h))), Mamba-2's SSD
    (g = dt_t * A_h, k = B, q = C, v = dt * x, scale = 1). Chunked."""
    if g is None:
        raise ValueError("simple_gla needs g; use linear_attention for no gate")
    return _run_chunked(q, k, v, g, None, scale, initial_state, output_final_state, chunk_size,
                        segment_len)


def gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
        chunk_size=None, segment_len=None):
    """Gated linear attention S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, g (batch, time,
    heads, key_dim) in log space. Chunked with sub-chunks of 8 (see module doc)."""
    return _run_chunked(q, k, v, g, None, scale, initial_state, output_final_state, chunk_size,
                        segment_len, vector_gate=True)


def delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
               chunk_size=None, use_qk_l2norm_in_kernel=False, segment_len=None):
    """DeltaNet S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T, chunked (WY form).
    Keys are usually L2-normalised (use_qk_l2norm_in_kernel=True does it here, per segment:
    recomputed in the backward of a long sequence)."""
    return _run_chunked(q, k, v, None, beta, scale, initial_state, output_final_state,
                        chunk_size, segment_len, delta=True, l2norm_qk=use_qk_l2norm_in_kernel)


def gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                     output_final_state=False, chunk_size=None,
                     use_qk_l2norm_in_kernel=False, segment_len=None):
    """Gated DeltaNet S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T,
    g (batch, time, heads) in log space; chunked (WY form with the decay folded in)."""
    return _run_chunked(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size,
                        segment_len, delta=True, l2norm_qk=use_qk_l2norm_in_kernel)


def expand_heads(q, k, v):
    """Grouped value heads: q, k (B, T, Hq, K) repeated to v's H heads (H = G Hq), each
    q/k head G times in a row (value head h reads q/k head h // G, as fla's layers'
    ``repeat(x, '... h d -> ... (h g) d')`` and Qwen3-Next's ``repeat_interleave``).
    Unchanged when the head counts agree; a ValueError when H is not a multiple of Hq."""
    if q.dim() != 4 or v.dim() != 4 or v.shape[2] == q.shape[2]:
        return q, k
    Hq, H = q.shape[2], v.shape[2]
    if H < Hq or H % Hq:
        raise ValueError(f"v's heads ({H}) must be a multiple of q and k's heads ({Hq})")
    return q.repeat_interleave(H // Hq, dim=2), k.repeat_interleave(H // Hq, dim=2)


def _run_chunked(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size,
                 segment_len, delta=False, vector_gate=False, l2norm_qk=False):
    """A chunked form as the operators above run it: _chunk_delta (delta) or _chunk_gated,
    on q, k repeated to v's heads, L2-normalised when l2norm_qk (inside the segment, so
    recomputed in a long sequence's backward), through :func:`_maybe_segmented`."""
    q, k = expand_heads(q, k, v)

    def core(q, k, v, g, beta, S):
        if l2norm_qk:
            q, k = _l2norm(q), _l2norm(k)
        if delta:
            return _chunk_delta(q, k, v, g, beta, scale, S, chunk_size)
        return _chunk_gated(q, k, v, g, scale, S, chunk_size, vector_gate)
    return _maybe_segmented(core, q, k, v, g, beta, initial_state, output_final_state,
                            segment_len)


# name -> (chunked, ref, needs g ("scalar" | "vector" | None), needs beta)
OPS = {
    "linear_attention": (linear_attention, linear_attention_ref, None, False),
    "simple_gla": (simple_gla, simple_gla_ref, "scalar", False),
    "gla": (gla, gla_ref, "vector", False),
    "delta_rule": (delta_rule, delta_rule_ref, None, True),
    "gated_delta_rule": (gated_delta_rule, gated_delta_rule_ref, "scalar", True),
}
