"""Linear-RNN sequence mixers over the operators of ``models.kernels.linear_rnn``:

- :class:`GatedLinearAttention` (GLA, Yang et al. 2024): data-dependent decay per key channel;
- :class:`MultiScaleRetention`  (RetNet, Sun et al. 2023): a fixed decay per head, rotary;
- :class:`LinearAttention`      (Katharopoulos et al. 2020): no decay, a feature map and
  (optionally) the normaliser q . sum k;
- ``DeltaNet``, ``GatedDeltaNet`` and ``GatedDeltaProduct`` live in ``models.linear_rnn.delta_mixers``
  (which builds on this module's :class:`LinearRNNMixer`; this module does not import it).

Each follows the structure of its flash-linear-attention layer (``fla/layers/*.py``,
github.com/fla-org/flash-linear-attention); the code is this project's own.

Every mixer maps x (batch, length, d_model) -> (batch, length, d_model), causally, with
no outer norm or residual (``models.ssm.mamba.RecurrentStack`` adds pre-norm residuals), and
carries a recurrent state, a tuple whose first element is the matrix state
S (batch, heads, head_k_dim, head_v_dim) of the operator (fla's ``initial_state``):

- ``init_state(batch)`` -> zeros (plus a short-conv cache / position counter where present),
- ``forward_with_state(x, state)`` -> (y, next state): chaining chunks == one forward,
- ``step(x_t, state)`` -> (y_t, next state), x_t (batch, d_model): the ``*_ref`` recurrence
  for one step (any device, any backend; ``_ref_step``), or without autograd on a CPU the
  layer's fused step (GLA, RetNet, linear attention: one matmul, one C call to
  ``models.kernels.linear_rnn_cpu``, o_proj; ``_fused_step``, held to ``_ref_step``),
- ``state_size()`` -> floats of state per sequence (matrix state + conv cache + counter).

Training memory (GLA, RetNet and the delta rules): the pieces before and after the operator
(RetNet's projections + rotary, the delta rules' projections + short conv; the norm +
output gate + o_proj of all but linear attention) are recomputed from x in
the backward a slice of steps at a time (``models.common.recomputed_in_slices``), so
autograd keeps x, the operator's inputs (q, k, v, gates) and its output o, not the gate's
projection or the norms' intermediates.

Backend (``backend="auto" | "torch" | "ref" | "fla" | "cpu"``, ``models.kernels.linear_rnn_backends``):
the option is kept as ``backend_choice``; ``backend`` is the name that ran in the last
forward (before any forward: what would run on the parameters' device). ``chunk_size``
goes to the ``torch`` backend's chunked form only (fla and ref take none); None (the
default) lets the operator pick its tuned size for the device (``linear_rnn.CPU_CHUNK_SIZE``).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.common import RMSNorm, recomputed, recomputed_in_slices, rms_norm
from models.kernels import linear_rnn_cpu, linear_rnn_ops
from models.kernels.linear_rnn_backends import (BackendError, check_backend, fla_status,
                                                get_op, resolve)

__all__ = ["GatedLinearAttention", "MultiScaleRetention", "LinearAttention", "HeadRMSNorm",
           "GatedHeadRMSNorm", "LinearRNNMixer"]


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


class HeadRMSNorm(RMSNorm):
    """RMS norm over the last dim, one head's values: (..., d) -> (..., d)."""


def _gated_head_rms_norm(x, gate, weight, eps):
    return rms_norm(x, weight, eps) * F.silu(gate)


class GatedHeadRMSNorm(HeadRMSNorm):
    """norm(o) * silu(gate): fla's ``FusedRMSNormGated`` (swish gate), unfused, recomputed
    in the backward. o, gate (..., d) -> (..., d)."""

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        from models.kernels import gated_norm_cpu

        if gated_norm_cpu.applies(x, gate, self.weight):   # CPU fp32/64: the C kernel (issue 43)
            return gated_norm_cpu.GatedRMSNormFn.apply(x, gate, self.weight, self.eps,
                                                       x.shape[-1], True, False)
        return recomputed(_gated_head_rms_norm, x, gate, self.weight, self.eps)


def _dims(d_model: int, n_heads: int, expand_k: float, expand_v: float) -> tuple[int, int]:
    """(key_dim, value_dim) = (int(d_model * expand_k), int(d_model * expand_v)), each
    checked to split into n_heads heads (a ValueError naming the option otherwise)."""
    if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"n_heads must be an integer >= 1; got {n_heads!r}")
    dims = []
    for opt, e in (("expand_k", expand_k), ("expand_v", expand_v)):
        if not (isinstance(e, (int, float)) and e > 0):
            raise ValueError(f"{opt} must be a number > 0; got {e!r}")
        d = int(d_model * e)
        if d < n_heads or d % n_heads:
            raise ValueError(f"{opt} = {e}: d_model * {opt} = {d} does not split into "
                             f"n_heads = {n_heads} heads")
        dims.append(d)
    return dims[0], dims[1]


def _stacked_weights(module: nn.Module, weights: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat(weights), kept on ``module`` and reused while every weight is the same
    tensor at the same version (an optimiser step, ``load_state_dict`` or ``.to`` changes
    one, and the next call stacks them anew): a decode step then reads the stacked copy
    instead of copying every projection again. Only for steps without autograd."""
    try:
        key = tuple((w.data_ptr(), w._version, w.dtype, w.device) for w in weights)
    except RuntimeError:            # inference tensors carry no version: do not cache
        return torch.cat(weights)
    hit = module.__dict__.get("_stacked_cache")
    if hit is not None and hit[0] == key:
        return hit[1]
    stacked = torch.cat(weights)
    module.__dict__["_stacked_cache"] = (key, stacked)
    return stacked


class LinearRNNMixer(nn.Module):
    """Shared plumbing: backend choice, the operator call, the state tuple.

    Subclasses set ``op_name`` and implement

    - ``_inputs(x, extras)`` -> (op args [q, k, v, (g), (beta)] in fla's (batch, time,
      heads, dim) layout, op kwargs, next extras): everything before the operator; x
      (batch, T, d_model), extras the state after S (conv cache, counter) or None (fresh);
    - ``_output(o, x)`` -> y (batch, T, d_model): everything after it;
    - ``_init_extras(batch)`` and ``_extras_size()`` where they carry more than S;

    and set ``n_heads``, ``head_k_dim``, ``head_v_dim`` (of S; the state's value dim is
    ``state_v_dim``, which LinearAttention widens by its normaliser column).
    """

    op_name: str = ""

    def _init_common(self, backend: str, chunk_size: int | None) -> None:
        check_backend(backend)                   # BackendError (a ValueError) naming it
        if backend == "fla":
            ok, why = fla_status()
            if not ok:
                raise BackendError(f"backend 'fla' unavailable: {why}; use 'auto' or 'torch'")
        if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
            raise ValueError(f"chunk_size must be an integer >= 1; got {chunk_size!r}")
        self.backend_choice, self.chunk_size = backend, chunk_size
        self._last_backend: str | None = None

    @property
    def state_v_dim(self) -> int:
        return self.head_v_dim

    @property
    def state_heads(self) -> int:
        """Heads of S: the value heads (``num_v_heads`` of the delta rules' grouped value
        heads; n_heads elsewhere)."""
        return getattr(self, "num_v_heads", self.n_heads)

    @property
    def backend(self) -> str:
        """The backend of the last forward; before any, what runs on the parameters' device."""
        if self._last_backend is not None:
            return self._last_backend
        try:
            return resolve(self.backend_choice, next(self.parameters()).device.type)
        except BackendError:                     # "fla" while the parameters are on a CPU
            return self.backend_choice

    # -- the operator ----------------------------------------------------------------
    def _apply_op(self, args, kwargs, S0, final: bool, recurrent: bool):
        if recurrent:                            # step: the reference recurrence
            op = linear_rnn_ops.ALL_OPS[self.op_name][1]
        else:
            op, resolved = get_op(self.op_name, self.backend_choice, args[0].device.type)
            self._last_backend = resolved
            if resolved == "torch":
                kwargs = {**kwargs, "chunk_size": self.chunk_size}
        return op(*args, initial_state=S0, output_final_state=final, **kwargs)

    def _run(self, x: torch.Tensor, state, final: bool, recurrent: bool = False):
        S0, extras = (None, None) if state is None else (state[0], tuple(state[1:]))
        args, kwargs, next_extras = self._inputs(x, extras)
        o, S = self._apply_op(args, kwargs, S0, final, recurrent)
        y = self._output(o, x)
        return y, ((S, *next_extras) if final else None)

    # -- the mixer contract ----------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (batch, length, d_model) -> (batch, length, d_model), causal."""
        return self._run(x, None, final=False)[0]

    def forward_with_state(self, x: torch.Tensor, state: tuple) -> tuple[torch.Tensor, tuple]:
        """x (batch, length, d_model) from ``state`` -> (y, next state)."""
        return self._run(x, state, final=True)

    def step(self, x_t: torch.Tensor, state: tuple) -> tuple[torch.Tensor, tuple]:
        """One token: x_t (batch, d_model) -> (y_t (batch, d_model), next state). Without
        autograd (decode: ``torch.no_grad`` / ``inference_mode``) the layer's fused step
        where it has one that applies (:meth:`_fused_step`), else :meth:`_ref_step`."""
        if not torch.is_grad_enabled():
            fused = self._fused_step(x_t, state)
            if fused is not None:
                return fused
        return self._ref_step(x_t, state)

    def _ref_step(self, x_t: torch.Tensor, state: tuple) -> tuple[torch.Tensor, tuple]:
        """The reference step: the sequence code at T = 1 with the operator's ``*_ref``
        (any device, any dtype, under autograd too); the fused steps are held to it."""
        y, state = self._run(x_t[:, None], state, final=True, recurrent=True)
        return y[:, 0], state

    def _fused_step(self, x_t: torch.Tensor, state: tuple) -> tuple[torch.Tensor, tuple] | None:
        """The decode step in one C call (GLA, RetNet, linear attention: one stacked matmul
        for the input projections, ``models.kernels.linear_rnn_cpu``'s ``*_step`` from there
        to the output projection, which is the second matmul), or None where it does not
        apply (not a CPU float32 / float64 layer, the C library unavailable, a layer
        without one): the caller then takes :meth:`_ref_step`."""
        return None

    def _projected(self, x_t: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
        """x_t (batch, d_model) times the stacked ``weights`` (kept between steps:
        :func:`_stacked_weights`): (batch, sum of their rows)."""
        return F.linear(x_t, _stacked_weights(self, weights))

    def init_state(self, batch: int) -> tuple:
        """(S zeros (batch, state_heads, head_k_dim, state_v_dim), *extras)."""
        p = next(self.parameters())
        S = torch.zeros(batch, self.state_heads, self.head_k_dim, self.state_v_dim,
                        device=p.device, dtype=p.dtype)
        return (S, *self._init_extras(batch))

    def state_size(self) -> int:
        return self.state_heads * self.head_k_dim * self.state_v_dim + self._extras_size()

    def _init_extras(self, batch: int) -> tuple:
        return ()

    def _extras_size(self) -> int:
        return 0

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        """(batch, T, heads * d) -> (batch, T, heads, d)."""
        return t.unflatten(-1, (self.n_heads, -1))


# ---------------------------------------------------------------------------------------
# GLA
# ---------------------------------------------------------------------------------------

class GatedLinearAttention(LinearRNNMixer):
    """Gated Linear Attention (Yang, Wang, Shen, Panda & Kim, "Gated Linear Attention
    Transformers with Hardware-Efficient Training", 2024); structure of fla's
    ``fla/layers/gla.py`` (``GatedLinearAttention``, defaults: expand_k 0.5, expand_v 1,
    low-rank gate 16, gate_logit_normalizer 16, no short conv, swish output gate fused
    with a per-head RMS norm).

        q, k = x W_q, x W_k              (batch, T, heads, head_k_dim),  key_dim = expand_k d
        v    = x W_v                     (batch, T, heads, head_v_dim),  value_dim = expand_v d
        g    = logsigmoid(x W_g1 W_g2 + b) / gate_logit_normalizer   (batch, T, heads, head_k)
        S_t  = diag(exp(g_t)) S_{t-1} + k_t v_t^T,   o_t = head_k_dim^-0.5 S_t^T q_t   (``gla``)
        y    = W_o [ rmsnorm_head(o) * silu(x W_r) ]

    State: (S (batch, heads, head_k_dim, head_v_dim),).
    """

    op_name = "gla"

    def __init__(self, d_model: int, n_heads: int = 4, expand_k: float = 0.5,
                 expand_v: float = 1.0, gate_low_rank_dim: int = 16,
                 gate_logit_normalizer: float = 16.0, norm_eps: float = 1e-5,
                 backend: str = "auto", chunk_size: int | None = None):
        super().__init__()
        self._init_common(backend, chunk_size)
        if not gate_logit_normalizer > 0:
            raise ValueError(f"gate_logit_normalizer must be > 0; got {gate_logit_normalizer!r}")
        if isinstance(gate_low_rank_dim, bool) or not isinstance(gate_low_rank_dim, int) \
                or gate_low_rank_dim < 1:
            raise ValueError(f"gate_low_rank_dim must be an integer >= 1; got {gate_low_rank_dim!r}")
        self.d_model, self.n_heads = d_model, n_heads
        self.key_dim, self.value_dim = _dims(d_model, n_heads, expand_k, expand_v)
        self.head_k_dim, self.head_v_dim = self.key_dim // n_heads, self.value_dim // n_heads
        self.gate_logit_normalizer = gate_logit_normalizer
        self.q_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, self.value_dim, bias=False)
        self.g_proj = nn.Linear(d_model, self.value_dim, bias=False)      # output gate
        # low rank: forget gates need few parameters (GLA paper, Section 4.4)
        self.gk_proj = nn.Sequential(nn.Linear(d_model, gate_low_rank_dim, bias=False),
                                     nn.Linear(gate_low_rank_dim, self.key_dim, bias=True))
        self.g_norm_swish_gate = GatedHeadRMSNorm(self.head_v_dim, eps=norm_eps)
        self.o_proj = nn.Linear(self.value_dim, d_model, bias=False)

    def log_gate(self, x: torch.Tensor) -> torch.Tensor:
        """x (batch, T, d_model) -> g (batch, T, heads, head_k_dim) <= 0, log space;
        recomputed from x in the backward (the low-rank hidden and logsigmoid's input,
        1.5 key_dim wide, are not kept)."""
        w1, lin2 = self.gk_proj[0].weight, self.gk_proj[1]
        return recomputed_in_slices(self._log_gate, 1, 0, x, w1, lin2.weight, lin2.bias)

    def _log_gate(self, h, x, w1, w2, b2):
        return self._heads(F.logsigmoid(F.linear(F.linear(x, w1), w2, b2))
                           / self.gate_logit_normalizer)

    def _inputs(self, x, extras):
        q, k, v = (self._heads(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        return [q, k, v, self.log_gate(x)], {}, ()

    def _fused_step(self, x_t, state):
        S, low, norm = state[0], self.gk_proj[1], self.g_norm_swish_gate
        if linear_rnn_cpu.step_unsupported(x_t, S, self.o_proj.weight, low.weight, norm.weight):
            return None
        ws = [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, self.g_proj.weight,
              self.gk_proj[0].weight]
        K, V = self.key_dim, self.value_dim
        o, S = linear_rnn_cpu.gla_step(self._projected(x_t, ws), S, low.weight, low.bias,
                                       norm.weight, (0, K, 2 * K, 2 * K + V, 2 * K + 2 * V),
                                       low_rank=low.in_features,
                                       normalizer=self.gate_logit_normalizer, eps=norm.eps)
        return F.linear(o, self.o_proj.weight), (S,)

    def _output(self, o, x):
        # norm, gate and o_proj in one piece recomputed from (o, x) slice by slice in the
        # backward: the gate g_proj(x) and the norm's intermediates are not kept
        n = self.g_norm_swish_gate
        return recomputed_in_slices(self._gated_out, 2, 0, o, x, self.g_proj.weight, n.weight,
                                    self.o_proj.weight)

    def _gated_out(self, h, o, x, w_g, norm_w, w_o):
        """W_o [rmsnorm_head(o) * silu(x W_g)]: o (batch, T, heads, head_v_dim), x (batch,
        T, d_model) -> (batch, T, d_model) (h = 0: position-wise)."""
        gate = self._heads(F.linear(x, w_g))
        o = _gated_head_rms_norm(o, gate, norm_w, self.g_norm_swish_gate.eps)
        return F.linear(o.flatten(-2), w_o)


# ---------------------------------------------------------------------------------------
# RetNet
# ---------------------------------------------------------------------------------------

def rotary(x: torch.Tensor, pos: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Plain RoPE (Su et al. 2021) in the half-split layout (fla's RotaryEmbedding with
    interleaved=False, as ``models.attention.attention.Rotary``): channel j pairs with j + d/2, rotated
    by pos * base^(-2j/d). x (batch, T, heads, d), pos (batch, T) integers -> x's shape."""
    half = x.shape[-1] // 2
    inv_freq = base ** (-2.0 * torch.arange(half, device=x.device, dtype=torch.float64)
                        / x.shape[-1])
    angle = pos.to(torch.float64)[..., None] * inv_freq            # (batch, T, half)
    cos, sin = (f(angle)[:, :, None].to(x.dtype) for f in (torch.cos, torch.sin))
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class MultiScaleRetention(LinearRNNMixer):
    """Multi-scale retention (Sun et al., "Retentive Network: A Successor to Transformer
    for Large Language Models", 2023); structure of fla's ``fla/layers/multiscale_retention.py``
    (``MultiScaleRetention``: expand_k 1, expand_v 2, rotary on q and k, swish output gate).

        q, k = rope(x W_q), rope(x W_k)   (batch, T, heads, head_k_dim), positions from 0
        v    = x W_v                      (batch, T, heads, head_v_dim)
        S_t  = gamma_h S_{t-1} + k_t v_t^T,  gamma_h = 1 - 2^(-5-h), h = 0..heads-1
        o_t  = head_k_dim^-0.5 S_t^T q_t             (``simple_gla``, g = log gamma_h)
        y    = W_o [ groupnorm_head(o) * silu(x W_g) ]

    Positions: the paper's xPos-style relative rotation is replaced by plain RoPE (as fla
    does); its decay comes from gamma alone. Normalisation: the paper's GroupNorm (one group
    per head: mean and variance per head, affine over value_dim); fla uses an RMS norm.

    State: (S (batch, heads, head_k_dim, head_v_dim), pos (batch,) int64 = the absolute
    position of the next token): RoPE in step / chunked mode needs it.
    """

    op_name = "simple_gla"

    def __init__(self, d_model: int, n_heads: int = 4, expand_k: float = 1.0,
                 expand_v: float = 2.0, rope_base: float = 10000.0, norm_eps: float = 1e-5,
                 backend: str = "auto", chunk_size: int | None = None):
        super().__init__()
        self._init_common(backend, chunk_size)
        self.d_model, self.n_heads = d_model, n_heads
        self.key_dim, self.value_dim = _dims(d_model, n_heads, expand_k, expand_v)
        self.head_k_dim, self.head_v_dim = self.key_dim // n_heads, self.value_dim // n_heads
        if self.head_k_dim % 2:
            raise ValueError(f"rotary positions need an even head key dim; d_model * expand_k "
                             f"/ n_heads = {self.head_k_dim} (n_heads = {n_heads}, "
                             f"expand_k = {expand_k})")
        self.rope_base = rope_base
        self.q_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, self.value_dim, bias=False)
        self.g_proj = nn.Linear(d_model, self.value_dim, bias=False)
        self.group_norm = nn.GroupNorm(n_heads, self.value_dim, eps=norm_eps)
        self.o_proj = nn.Linear(self.value_dim, d_model, bias=False)

    def log_decay(self) -> torch.Tensor:
        """log gamma_h = log(1 - 2^(-5-h)), (heads,) float64: fixed, not learned."""
        h = torch.arange(self.n_heads, dtype=torch.float64)
        return torch.log1p(-torch.exp2(-5.0 - h))

    def _init_extras(self, batch):
        return (torch.zeros(batch, dtype=torch.long, device=self.q_proj.weight.device),)

    def _extras_size(self):
        return 1                                  # the position counter

    def _inputs(self, x, extras):
        B, T, _ = x.shape
        pos0 = (extras[0] if extras else torch.zeros(B, dtype=torch.long, device=x.device))
        pos = pos0[:, None] + torch.arange(T, device=x.device)        # (batch, T)
        # q and k recomputed from x in the backward (slice by slice): the projections' and
        # the rotation's intermediates are not kept, only x and the positions
        q, k = (recomputed_in_slices(self._rope_proj, 2, 0, x, pos, p.weight)
                for p in (self.q_proj, self.k_proj))
        v = self._heads(self.v_proj(x))
        g = self.log_decay().to(device=x.device, dtype=_compute_dtype(x))
        g = g.expand(B, T, -1).contiguous()                           # (batch, T, heads)
        return [q, k, v, g], {}, (pos0 + T,)

    def _fused_step(self, x_t, state):
        S, pos = state
        gn = self.group_norm
        if (pos.dtype != torch.int64
                or linear_rnn_cpu.step_unsupported(x_t, S, self.o_proj.weight, gn.weight)):
            return None
        ws = [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, self.g_proj.weight]
        K = self.key_dim
        o, S = linear_rnn_cpu.retention_step(
            self._projected(x_t, ws), S, pos, self._inv_freq(), self._decay(x_t.dtype),
            gn.weight, gn.bias, (0, K, 2 * K, 2 * K + self.value_dim), eps=gn.eps)
        return F.linear(o, self.o_proj.weight), (S, pos + 1)

    def _inv_freq(self) -> torch.Tensor:
        """RoPE's base^(-2j/d), j < head_k_dim / 2, float64 (as :func:`rotary`), kept."""
        f = self.__dict__.get("_inv_freq_cache")
        if f is None:
            half = self.head_k_dim // 2
            f = self.rope_base ** (-2.0 * torch.arange(half, dtype=torch.float64) / self.head_k_dim)
            self.__dict__["_inv_freq_cache"] = f
        return f

    def _decay(self, dtype: torch.dtype) -> torch.Tensor:
        """gamma_h = exp(log gamma_h) in ``dtype``, as the operator forms it, kept per dtype."""
        cache = self.__dict__.setdefault("_decay_cache", {})
        if dtype not in cache:
            cache[dtype] = self.log_decay().to(dtype).exp()
        return cache[dtype]

    def _rope_proj(self, h, x, pos, weight):
        """rope(x W^T): x (batch, T, d_model), pos (batch, T) -> (batch, T, heads, head_k_dim)
        (h, context steps of a slice, is 0: position-wise)."""
        return rotary(self._heads(F.linear(x, weight)), pos, self.rope_base)

    def _output(self, o, x):
        # norm, gate and o_proj in one piece recomputed from (o, x) slice by slice: its
        # (batch, T, value_dim) intermediates (five, 64 MiB each at batch 8, L = 16384)
        # live one slice at a time in the backward, and the gate g_proj(x) is not kept
        gn = self.group_norm
        return recomputed_in_slices(self._gated_out, 2, 0, o, x, gn.weight, gn.bias,
                                    self.g_proj.weight, self.o_proj.weight)

    def _gated_out(self, h, o, x, gn_w, gn_b, w_g, w_o):
        """W_o [groupnorm_head(o) * silu(x W_g)]: o (batch, T, heads, head_v_dim), x (batch,
        T, d_model) -> (batch, T, d_model) (h = 0: position-wise)."""
        B, T = o.shape[:2]
        o = F.group_norm(o.reshape(B * T, self.value_dim), self.n_heads, gn_w, gn_b,
                         self.group_norm.eps).reshape(B, T, self.value_dim)
        return F.linear(_swish_gate(o, F.linear(x, w_g)), w_o)


def _swish_gate(o, gate):
    return o * F.silu(gate)


# ---------------------------------------------------------------------------------------
# Linear attention
# ---------------------------------------------------------------------------------------

FEATURE_MAPS = ("elu+1", "identity")
OUTPUT_NORMS = ("none", "rms")


class LinearAttention(LinearRNNMixer):
    """Linear attention (Katharopoulos, Vyas, Pappas & Fleuret, "Transformers are RNNs",
    2020); structure of fla's ``fla/layers/linear_attn.py`` (``LinearAttention``: expand_k
    1, expand_v 1, feature maps on q and k, optional per-head RMS output norm).

        q, k = phi(x W_q), phi(x W_k)    phi = elu(.) + 1 ("elu+1") or the identity
        v    = x W_v
        num_t = scale S_t^T q_t,   S_t = S_{t-1} + k_t v_t^T              (``linear_attention``)
        o_t  = num_t / (scale q_t . z_t + eps),   z_t = sum_{s<=t} k_s     (normalize=True)
        y    = W_o [ norm_head(o) ]     (norm "none" by default; "rms" is fla's default)

    The normaliser is the same operator run on a ones value column (v' = [v, 1] gives
    [num, scale q . z] in one call), so z lives in S's extra column and streams with it;
    scale = head_k_dim^-0.5 (fla's) cancels in the ratio. With "identity" features the
    denominator can be near 0 or negative (fla allows it too); "elu+1" keeps it > 0.
    An RMS output norm divides out the per-position denominator again, so with
    ``output_norm="rms"`` ``normalize`` matters only through eps.

    State: (S (batch, heads, head_k_dim, head_v_dim + normalize),).
    """

    op_name = "linear_attention"

    def __init__(self, d_model: int, n_heads: int = 4, expand_k: float = 1.0,
                 expand_v: float = 1.0, feature_map: str = "elu+1", normalize: bool = True,
                 eps: float = 1e-6, output_norm: str = "none", norm_eps: float = 1e-5,
                 backend: str = "auto", chunk_size: int | None = None):
        super().__init__()
        self._init_common(backend, chunk_size)
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"feature_map must be one of {', '.join(FEATURE_MAPS)}; "
                             f"got {feature_map!r}")
        if output_norm not in OUTPUT_NORMS:
            raise ValueError(f"output_norm must be one of {', '.join(OUTPUT_NORMS)}; "
                             f"got {output_norm!r}")
        if not isinstance(normalize, bool):
            raise ValueError(f"normalize must be true or false; got {normalize!r}")
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0; got {eps!r}")
        self.d_model, self.n_heads = d_model, n_heads
        self.key_dim, self.value_dim = _dims(d_model, n_heads, expand_k, expand_v)
        self.head_k_dim, self.head_v_dim = self.key_dim // n_heads, self.value_dim // n_heads
        self.feature_map, self.normalize, self.eps = feature_map, normalize, eps
        self.q_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, self.value_dim, bias=False)
        self.norm = HeadRMSNorm(self.head_v_dim, eps=norm_eps) if output_norm == "rms" else None
        self.o_proj = nn.Linear(self.value_dim, d_model, bias=False)

    @property
    def state_v_dim(self) -> int:
        return self.head_v_dim + int(self.normalize)    # + the running key sum's column

    def phi(self, t: torch.Tensor) -> torch.Tensor:
        return F.elu(t) + 1.0 if self.feature_map == "elu+1" else t

    def _inputs(self, x, extras):
        q, k = (self.phi(self._heads(p(x))) for p in (self.q_proj, self.k_proj))
        v = self._heads(self.v_proj(x))
        if self.normalize:
            v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
        return [q, k, v], {}, ()

    def _fused_step(self, x_t, state):
        S, norm = state[0], self.norm
        nw = None if norm is None else norm.weight
        if linear_rnn_cpu.step_unsupported(x_t, S, self.o_proj.weight, nw):
            return None
        ws = [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]
        K = self.key_dim
        o, S = linear_rnn_cpu.linear_attention_step(
            self._projected(x_t, ws), S, nw, (0, K, 2 * K),
            elu_features=self.feature_map == "elu+1", normalize=self.normalize, eps=self.eps,
            norm_eps=1e-5 if norm is None else norm.eps)
        return F.linear(o, self.o_proj.weight), (S,)

    def _output(self, o, x):
        if self.normalize:
            o = o[..., :-1] / (o[..., -1:] + self.eps)
        if self.norm is not None:
            o = self.norm(o)
        return self.o_proj(o.flatten(-2))

