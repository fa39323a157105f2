"""Generalised delta-rule mixers over ``models.kernels.generalized_delta``:

- :class:`KimiDeltaAttention` (KDA; Kimi Linear, Moonshot AI 2025, arXiv 2510.26692;
  fla ``fla/layers/kda.py``): Gated DeltaNet with a decay per key channel;
- :class:`RWKV7Attention` (RWKV-7 "Goose", Peng et al. 2025, arXiv 2503.14456; fla
  ``fla/layers/rwkv7.py``, BlinkDL/RWKV-LM): the generalised delta rule with a vector decay
  and an in-context learning rate.

The mixer contract is ``models.linear_rnn.linear_mixers``' (forward, forward_with_state, step,
init_state, state_size, backend, chunk_size); ``step`` runs a fused one-token update
without autograd (decode) and the ``*_ref`` recurrence with it (the oracle).
Structure follows the fla layers; code written here.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from models import common
from models.common import recomputed_in_slices, rms_norm
from models.linear_rnn.delta_mixers import _DeltaBase, _GatedBase, _int_option, _softplus_inv_dt
from models.kernels import gated_norm_cpu, generalized_delta, linear_rnn_cpu, rwkv7_cpu
from models.kernels.linear_rnn_backends import BackendError, get_op
from models.linear_rnn.linear_mixers import LinearRNNMixer, _dims, _stacked_weights

__all__ = ["KimiDeltaAttention", "RWKV7Attention"]

# RWKV-7's pre-operator piece is recomputed in the backward this many steps at a time (its
# intermediates, ~40 d_model-wide tensors per step, are what the backward's peak holds)
PREP_STEPS = 256

# KDA's output piece (low-rank gate, gated norm, o_proj) runs under plain autograd while its
# kept tensors, batch x T x (value_dim + head_v_dim) numbers, fit this many bytes (issue 43,
# training at LM shapes: no second gate and o_proj matmuls in the backward, ~9 MiB more a
# layer at 2 x 2048, d_model 256, about what the C kernel's in-kernel q/k norm saves);
# above it, recomputed slice by slice in the backward. 0: always recomputed (the form
# before; one-process A/B timings and the tests' twin).
OUT_WHOLE_MAX_BYTES = 64 * 2**20


class _RefStep:
    """``step`` (recurrent=True) runs the op's ``*_ref`` from ``generalized_delta``; the
    backend before any forward is what ``get_op`` gives (auto on a CPU: the C form when it
    builds, else the chunked torch form)."""

    @property
    def backend(self) -> str:
        if self._last_backend is not None:
            return self._last_backend
        try:
            return get_op(self.op_name, self.backend_choice,
                          next(self.parameters()).device.type)[1]
        except BackendError:
            return self.backend_choice

    def _apply_op(self, args, kwargs, S0, final, recurrent):
        if recurrent:
            ref = generalized_delta.OPS[self.op_name][1]
            return ref(*args, initial_state=S0, output_final_state=final, **kwargs)
        return super()._apply_op(args, kwargs, S0, final, recurrent)


class KimiDeltaAttention(_RefStep, _GatedBase):
    """Kimi Delta Attention; structure of fla's ``fla/layers/kda.py``:

        q, k, v = silu(shortconv([x W_q | x W_k | x W_v]));  q, k <- q/|q|, k/|k| (in kernel)
        beta    = sigmoid(x W_b)   (2 sigmoid with allow_neg_eigval)    (batch, T, v heads)
        g       = -exp(A_log_h) softplus(x W_f1 W_f2 + dt_bias)   (batch, T, v heads, head_k)
                  (low-rank, rank head_v_dim, as fla's f_proj; fla's ``fused_kda_gate``)
        S_t = diag(exp(g_t)) S_{t-1} + beta_t k_t (v_t - (diag(exp(g_t)) S_{t-1})^T k_t)^T
        o_t = head_k^-0.5 S_t^T q_t                                          (``kda``)
        y   = W_o [ rmsnorm_head(o) * sigmoid(x W_g1 W_g2 + b_g) ]   (low-rank output gate)

    A ~ U(1, 16) per value head (A_log = log A), dt_bias per key channel; neither decayed.
    ``allow_neg_eigval``, ``num_v_heads``: see ``models.linear_rnn.delta_mixers._DeltaBase``.
    State: (S (batch, v heads, head_k_dim, head_v_dim), conv cache).
    """

    op_name = "kda"

    def __init__(self, d_model: int, n_heads: int = 4, expand_k: float = 1.0,
                 expand_v: float = 1.0, use_short_conv: bool = True, conv_size: int = 4,
                 conv_bias: bool = False, norm_eps: float = 1e-5, backend: str = "auto",
                 chunk_size: int | None = None, num_v_heads: int | None = None,
                 allow_neg_eigval: bool = False):
        super().__init__()
        self._init_gated(d_model, n_heads, expand_k, expand_v, use_short_conv, conv_size,
                         conv_bias, norm_eps, backend, chunk_size, num_v_heads,
                         allow_neg_eigval, use_forget_gate=False)
        hv, dk, r = self.num_v_heads, self.head_k_dim, self.head_v_dim
        self.f_proj = nn.Sequential(nn.Linear(d_model, r, bias=False),
                                    nn.Linear(r, hv * dk, bias=False))
        self.A_log = nn.Parameter(torch.empty(hv).uniform_(1, 16).log())
        self.A_log._no_weight_decay = True
        self.dt_bias = nn.Parameter(_softplus_inv_dt(hv * dk))
        self.dt_bias._no_weight_decay = True
        self.g_proj = nn.Sequential(nn.Linear(d_model, r, bias=False),
                                    nn.Linear(r, self.value_dim, bias=True))

    def _proj_extra_weights(self):
        return [self.f_proj[0].weight]

    def _x_weights(self):
        return [*_DeltaBase._x_weights(self), self.f_proj[0].weight, self.g_proj[0].weight]

    def _step_gate(self, x_t, parts):
        f = F.linear(parts[4], self.f_proj[1].weight) + self.dt_bias
        return -self.A_log.exp()[:, None] * F.softplus(f.view(x_t.shape[0], self.num_v_heads, -1))

    def _step_out(self, o, x_t, parts):
        lin2 = self.g_proj[1]
        gate = F.linear(parts[5], lin2.weight, lin2.bias).view(*o.shape)
        return F.linear((rms_norm(o, self.o_norm.weight, self.o_norm.eps) * gate.sigmoid())
                        .flatten(-2), self.o_proj.weight)

    def _fused_step(self, x_t, state):
        """The decode step in one C call on a CPU in float32 / float64 (issue 43): the
        stacked matmul x_t [W_q | W_k | W_v | W_b | W_f1 | W_g1], the two low-rank products
        f = (x W_f1) W_f2 and gate = (x W_g1) W_g2 + b_g here, then
        ``linear_rnn_cpu.delta_rule_step`` with the decay per key channel (from f) and the
        sigmoid gate, then o_proj. None where it does not apply (:meth:`_fast_step` then)."""
        S, conv = state[0], self.qkv_conv1d
        cache = conv_w = conv_b = None
        if conv is not None:
            cache, conv_w, conv_b = state[1], conv.weight, conv.bias
        (f1, f2), g2 = self.f_proj, self.g_proj[1]
        w_o, norm = self.o_proj.weight, self.o_norm
        if linear_rnn_cpu.delta_step_unsupported(x_t, S, w_o, norm.weight, cache, conv_w, conv_b,
                                                 self.A_log, self.dt_bias, f2.weight, g2.weight,
                                                 g2.bias):
            return None
        C, nb, r = sum(self._split), self.b_proj.weight.shape[0], f1.weight.shape[0]
        y = F.linear(x_t, _stacked_weights(self, self._x_weights()))
        f = F.linear(y[:, C + nb:C + nb + r], f2.weight)
        gate = F.linear(y[:, C + nb + r:], g2.weight, g2.bias)
        o, S2, cache2 = linear_rnn_cpu.delta_rule_step(
            y, S, cache, conv_w, conv_b, self.A_log, self.dt_bias, norm.weight, (0, C, None, None),
            n_heads=self.n_heads, num_householder=self.num_householder,
            allow_neg_eigval=self.allow_neg_eigval, eps=norm.eps, key_decay=f,
            sigmoid_gate=gate)
        return F.linear(o, w_o), ((S2,) if conv is None else (S2, cache2))

    def log_gate(self, x: torch.Tensor) -> torch.Tensor:
        """x (batch, T, d_model) -> g (batch, T, v heads, head_k_dim) <= 0."""
        extra = getattr(self, "_extra_proj", None)
        f1 = extra[0] if extra else self.f_proj[0](x)
        f = self._vheads(F.linear(f1, self.f_proj[1].weight) + self.dt_bias)
        return -self.A_log.exp()[:, None] * F.softplus(f)

    def _output(self, o, x):
        lin1, lin2 = self.g_proj
        args = (o, x, lin1.weight, lin2.weight, lin2.bias, self.o_norm.weight,
                self.o_proj.weight)
        width = self.value_dim + self.head_v_dim
        if OUT_WHOLE_MAX_BYTES and common.take_whole(
                x.shape[0] * x.shape[1], width * x.element_size(), OUT_WHOLE_MAX_BYTES,
                cpu_only=False, device=x.device):
            return self._gated_out(0, *args)
        return recomputed_in_slices(self._gated_out, 2, 0, *args)

    def _gated_out(self, h, o, x, w_g1, w_g2, b_g, norm_w, w_o):
        """W_o [rmsnorm_head(o) * sigmoid(x W_g1 W_g2 + b_g)] (h = 0: position-wise)."""
        gate = self._vheads(F.linear(F.linear(x, w_g1), w_g2, b_g))   # norm, gate: one C pass
        normed = gated_norm_cpu.gated_rms_norm(o, gate, norm_w, self.o_norm.eps, None, True,
                                               sigmoid=True)
        return F.linear(normed.flatten(-2), w_o)


class RWKV7Attention(_RefStep, LinearRNNMixer):
    """RWKV-7 time mixing; structure of fla's ``fla/layers/rwkv7.py`` (``RWKV7Attention``)
    without the cross-layer value residual (each layer is self-contained here):

        x'_c = x + (x_{t-1} - x) mu_c   for c in r, w, k, v, a, g   (token shift; state: x_{T-1})
        r, k, v = x'_r W_r, x'_k W_k, x'_v W_v            (batch, T, heads, head_dim)
        log w = -exp(-1/2) sigmoid(w_0 + tanh(x'_w A_w) B_w)     per key channel, in (-0.61, 0)
        a   = sigmoid(a_0 + x'_a A_a B_a)                 in-context learning rate in (0, 1)
        g   = sigmoid(x'_g A_g) B_g                       output gate
        kappa = (k o k_k) / |k o k_k| per head;  k <- k o (1 + (a - 1) o k_a)
        S_t = diag(exp(log w_t)) S_{t-1} + b_t (a'_t^T S_{t-1}) + k_t v_t^T,
              a' = -kappa, b = kappa o a                 (``generalized_delta.rwkv7``, scale 1)
        o   = groupnorm_head(S_t^T r_t) + ((r o k o r_k).sum per head) v
        y   = W_o [ o * g ]

    key_dim = value_dim = d_model, n_heads heads of head_dim = d_model / n_heads.
    State: (S (batch, heads, head_dim, head_dim), x_{T-1} (batch, d_model)).
    """

    op_name = "rwkv7"

    def __init__(self, d_model: int, n_heads: int = 4, decay_low_rank_dim: int = 16,
                 a_low_rank_dim: int = 16, gate_low_rank_dim: int = 32,
                 norm_eps: float = 1e-5, backend: str = "auto",
                 chunk_size: int | None = None):
        super().__init__()
        self._init_common(backend, chunk_size)
        for name, val in (("decay_low_rank_dim", decay_low_rank_dim),
                          ("a_low_rank_dim", a_low_rank_dim),
                          ("gate_low_rank_dim", gate_low_rank_dim)):
            _int_option(name, val)
        self.d_model, self.n_heads = d_model, n_heads
        self.key_dim, self.value_dim = _dims(d_model, n_heads, 1.0, 1.0)
        self.head_k_dim = self.head_v_dim = d_model // n_heads
        D = d_model
        # token-shift mixing coefficients mu_r, mu_w, mu_k, mu_v, mu_a, mu_g (fla: x_r, ...)
        self.mu = nn.Parameter(torch.linspace(0.2, 0.8, 6)[:, None].repeat(1, D))
        self.r_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(D, D, bias=False) for _ in range(4))
        self.w_lora = nn.Sequential(nn.Linear(D, decay_low_rank_dim, bias=False), nn.Tanh(),
                                    nn.Linear(decay_low_rank_dim, D, bias=True))
        self.a_lora = nn.Sequential(nn.Linear(D, a_low_rank_dim, bias=False),
                                    nn.Linear(a_low_rank_dim, D, bias=True))
        self.g_lora = nn.Sequential(nn.Linear(D, gate_low_rank_dim, bias=False), nn.Sigmoid(),
                                    nn.Linear(gate_low_rank_dim, D, bias=False))
        self.k_k = nn.Parameter(torch.full((D,), 0.85))
        self.k_a = nn.Parameter(torch.ones(D))
        self.r_k = nn.Parameter(torch.zeros(n_heads, self.head_k_dim))
        self.g_norm = nn.GroupNorm(n_heads, D, eps=self.head_v_dim * norm_eps)

    def _init_extras(self, batch):
        p = next(self.parameters())
        return (torch.zeros(batch, self.d_model, device=p.device, dtype=p.dtype),)

    def _extras_size(self):
        return self.d_model

    def _prep_params(self):
        return (self.mu, self.r_proj.weight, self.k_proj.weight, self.v_proj.weight,
                self.w_lora[0].weight, self.w_lora[2].weight, self.w_lora[2].bias,
                self.a_lora[0].weight, self.a_lora[1].weight, self.a_lora[1].bias,
                self.g_lora[0].weight, self.g_lora[2].weight, self.k_k, self.k_a, self.r_k)

    def _inputs(self, x, extras):
        """Everything before the operator as one piece. On a CPU (``_fused``) it is
        ``models.kernels.rwkv7_cpu.RWKV7PrepFn``: a hand-written backward that keeps x and
        two rank-16 tensors and rebuilds the mixes and k (one matmul), its elementwise
        chains in C; its six outputs are the operator's inputs. Elsewhere the piece is
        recomputed from x in the backward, a slice of steps at a time
        (``recomputed_in_slices``, one step of context for the token shift): autograd keeps
        x and the packed output [r | k | v | -kk | kk a | log w] (6 d_model per step, the
        operator's inputs read in place), not the six shifted mixes, the LoRA
        intermediates or the projections' inputs (issue 43: RWKV-7 held 2.5x Mamba's
        training memory). The output gate and bonus are recomputed in the output piece
        instead of kept."""
        B, D = x.shape[0], self.d_model
        prev = (extras[0].to(x.dtype)[:, None] if extras else x.new_zeros(B, 1, D))
        params, T = self._prep_params(), x.shape[1]
        if self._fused(x, params):
            # on a CPU: the piece as one Function with a hand-written backward that keeps
            # x (and two rank-16 tensors) and recomputes only the mixes and k
            outs = rwkv7_cpu.rwkv7_prep(x, prev[:, 0], *params[:10], *params[12:14],
                                         self.n_heads)
        else:
            # one recomputed piece per PREP_STEPS steps (the next piece's x_{-1} is a view
            # of x): the backward rebuilds one piece's ~40 d_model-wide intermediates at a
            # time
            pieces = [recomputed_in_slices(self._prep, 1, 1, x[:, s:s + PREP_STEPS],
                                           x[:, s - 1:s] if s else prev, *params)
                      for s in range(0, T, PREP_STEPS)]
            packed = pieces[0] if len(pieces) == 1 else torch.cat(pieces, 1)
            outs = packed.split(D, dim=-1)
        r, k, v, a_neg, b, log_w = (self._heads(t) for t in outs)
        self._for_output = (prev, r, k, v)
        return [r, k, v, a_neg, b, log_w], {"scale": 1.0}, (x[:, -1],)

    @staticmethod
    def _fused(x, tensors) -> bool:
        """Whether the pieces run as ``models.kernels.rwkv7_cpu``'s Functions: a CPU
        tensor in float32 / float64 with every tensor in its dtype, and, under autograd,
        recomputation on (their backwards recompute k and the LoRA products; under
        ``models.compute.no_recompute``, which counts model FLOPs, the plain pieces run)."""
        return (rwkv7_cpu.applies(x) and all(t.dtype == x.dtype for t in tensors)
                and (not torch.is_grad_enabled() or common._records((x, *tensors))))

    def _prep(self, h, x, prev, mu, w_r, w_k, w_v, w1, w2, b2, a1, a2, ab, g1, g2, k_k, k_a,
              r_k):
        """x (batch, h + T', d_model) with h steps of context (h = 0: ``prev`` is x_{-1}) ->
        (batch, T', 6 d_model): the token shift, projections, LoRAs, kk and the modified k
        of the class docstring, packed."""
        shifted = x[:, :-1] if h else torch.cat([prev, x[:, :-1]], 1)     # x_{t-1}
        x = x[:, h:]
        xr, xw, xk, xv, xa = torch.addcmul(x, shifted - x, mu[:5, None, None])
        r, k, v = F.linear(xr, w_r), F.linear(xk, w_k), F.linear(xv, w_v)
        log_w = -math.exp(-0.5) * F.linear(torch.tanh(F.linear(xw, w1)), w2, b2).sigmoid()
        a = F.linear(F.linear(xa, a1), a2, ab).sigmoid()
        kk = F.normalize(self._heads(k * k_k), dim=-1).flatten(-2)
        k = k * (1 + (a - 1) * k_a)
        return torch.cat([r, k, v, -kk, kk * a, log_w], -1)

    def _output(self, o, x):
        prev, r, k, v = self._for_output
        self._for_output = None
        args = (o, x, prev[:, 0], r, k, v, self.mu[5], self.g_lora[0].weight,
                self.g_lora[2].weight, self.r_k, self.g_norm.weight, self.g_norm.bias,
                self.o_proj.weight)
        if self._fused(x, args):
            # on a CPU: one Function that keeps its inputs (the operator's, alive anyway)
            # and rebuilds the norm, bonus and gate in the backward, not the W_o product
            return rwkv7_cpu.rwkv7_out(*args, self.g_norm.eps)
        return recomputed_in_slices(self._out_piece, 5, 1, o, x, r, k, v, prev, self.mu[5],
                                    self.g_lora[0].weight, self.g_lora[2].weight, self.r_k,
                                    self.g_norm.weight, self.g_norm.bias, self.o_proj.weight)

    def _out_piece(self, h, o, x, r, k, v, prev, mu_g, g1, g2, r_k, gn_w, gn_b, w_o):
        """W_o [(groupnorm_head(o) + bonus) * gate] over steps [h, ...) of the per-step args
        (h steps of token-shift context; h = 0: ``prev`` is x_{-1}): the output gate
        (from the shifted x) and the bonus (from r, k, v) recomputed here, not kept."""
        shifted = x[:, :-1] if h else torch.cat([prev, x[:, :-1]], 1)
        x, o, r, k, v = (t[:, h:] for t in (x, o, r, k, v))
        gate = F.linear(F.linear(torch.addcmul(x, shifted - x, mu_g), g1).sigmoid(), g2)
        bonus = ((r * k * r_k).sum(-1, keepdim=True) * v).flatten(-2)
        B, T = o.shape[:2]
        o = F.group_norm(o.reshape(B * T, -1), self.n_heads, gn_w, gn_b, self.g_norm.eps)
        return F.linear((o.reshape(B, T, -1) + bonus) * gate, w_o)

    def step(self, x_t: torch.Tensor, state: tuple) -> tuple[torch.Tensor, tuple]:
        """One token: x_t (batch, d_model) -> (y_t, next state). Without autograd the fused
        step (the six token-shift mixes in one op, the state update in place of
        ``rwkv7_ref``'s loop); with autograd the reference step (the sequence code at
        T = 1), which tests/models/test_linear_rnn_fast_paths.py holds the fused one to."""
        if torch.is_grad_enabled():
            return super().step(x_t, state)
        S, prev = state[0], state[1].to(x_t.dtype)
        B, H = x_t.shape[0], self.n_heads
        dt = torch.float32 if x_t.dtype in (torch.float16, torch.bfloat16) else x_t.dtype
        xr, xw, xk, xv, xa, xg = torch.addcmul(x_t, prev - x_t, self.mu[:, None])
        r, k, v = self.r_proj(xr), self.k_proj(xk), self.v_proj(xv)
        decay = (-math.exp(-0.5) * self.w_lora(xw).sigmoid()).to(dt).exp()
        a = self.a_lora(xa).sigmoid()
        kk = F.normalize((k * self.k_k).view(B, H, -1), dim=-1)
        k = k * (1 + (a - 1) * self.k_a)
        r, k, v, a = (t.view(B, H, -1) for t in (r, k, v, a))
        bonus = (r * k * self.r_k).sum(-1, keepdim=True) * v
        r, k, v, kk, a = (t.to(dt) for t in (r, k, v, kk, a))
        S = S.to(dt)
        aS = (-kk.unsqueeze(-2) @ S)                                   # (B, H, 1, V)
        S = (S * decay.view(B, H, -1, 1) + (kk * a).unsqueeze(-1) * aS
             + k.unsqueeze(-1) * v.unsqueeze(-2))
        o = (r.unsqueeze(-2) @ S).squeeze(-2).to(x_t.dtype)
        o = F.group_norm(o.reshape(B, -1), H, self.g_norm.weight, self.g_norm.bias,
                         self.g_norm.eps)
        y = self.o_proj((o + bonus.flatten(-2)) * self.g_lora(xg))
        return y, (S, x_t)
