"""Delta-rule mixers: :class:`DeltaNet`, :class:`GatedDeltaNet` and :class:`GatedDeltaProduct`
(on ``models.linear_rnn.linear_mixers``' base class, whose module docstring gives the shared
contract: forward, init_state, forward_with_state, step, state_size, backend, chunk_size).

All follow the structure of flash-linear-attention's layers (``fla/layers/delta_net.py``,
``fla/layers/gated_deltanet.py``, ``fla/layers/gated_deltaproduct.py``,
github.com/fla-org/flash-linear-attention); code written
here. One difference in form, not in function: fla runs three ``ShortConvolution``s (q, k,
v); here one depthwise conv runs over the concatenated [q | k | v] channels (the same
per-channel filters; one kernel call instead of three). Its parameters and cache live in a
``ShortConvolution`` (``qkv_conv1d``); the conv runs time-major through
``models.common.causal_conv`` inside a piece recomputed from x in the backward
(``models.common.recomputed_in_slices``), as does the output norm + gate + o_proj: autograd
keeps x, the operator's inputs and output, and the per-head gates.

State: (S (batch, num_v_heads, head_k_dim, head_v_dim), conv cache (batch, key_dim (1 + n) +
value_dim n, conv_size - 1)), or (S,) with ``use_short_conv=False``; n = num_householder
(1 but for Gated DeltaProduct), num_v_heads = n_heads unless grouped value heads are asked.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.common import causal_conv, conv_cache, recomputed_in_slices, rms_norm, take_whole
from models.kernels import gated_norm_cpu, linear_rnn_cpu
from models.linear_rnn.linear_mixers import (GatedHeadRMSNorm, HeadRMSNorm, LinearRNNMixer, _dims,
                                            _stacked_weights)
from models.conv.short_conv import ShortConvolution

__all__ = ["DeltaNet", "GatedDeltaNet", "GatedDeltaProduct"]


# Training at LM shapes (issue 43): while the projections' output, batch x T x channels,
# fits PROJ_WHOLE_MAX_BYTES, they run under plain autograd as one matmul and their output is
# kept (the backward runs no second q/k/v matmul: Gated DeltaNet 0.79x, KDA 0.69x the step
# time at 2 x 2048, d_model 256, for ~14 MiB more per layer); above it (long sequences,
# large batches) the q/k/v projection is recomputed with the conv in the backward, slice by
# slice, and the layer keeps x and the conv's output only (the rule of Mamba-2's _mix_whole).
PROJ_WHOLE_MAX_BYTES = 64 * 2**20


def _int_option(name: str, value, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")
    return value


def _softplus_inv_dt(n: int) -> torch.Tensor:
    """(n,) dt_bias with softplus(dt_bias) = dt log-uniform in [0.001, 0.1], floored at 1e-4
    (Mamba-2's init, fla's for the gated delta-rule layers)."""
    dt = torch.exp(torch.rand(n) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
    dt = dt.clamp(min=1e-4)
    return dt + torch.log(-torch.expm1(-dt))                             # softplus^-1(dt)


class _DeltaBase(LinearRNNMixer):
    """q, k, v projections, the short conv + SiLU (or SiLU alone), L2-normalised q and k
    (inside the operator: ``use_qk_l2norm_in_kernel``), beta = sigmoid(x W_b) per value
    head, or 2 sigmoid(x W_b) with ``allow_neg_eigval``.

    Options shared by the delta-rule layers:

    - ``allow_neg_eigval`` (Grazzi, Siems, Zela, Franke, Hutter & Pontil, "Unlocking
      State-Tracking in Linear RNNs Through Negative Eigenvalues", ICLR 2025; code
      adankow/unlocking_state_tracking, and fla's layers' option of this name): beta =
      2 sigmoid(.) in (0, 2), so the transition I - beta k k^T (|k| = 1) has the eigenvalue
      1 - beta in (-1, 1) along k (a reflection at beta = 2) instead of [0, 1). What lets
      the delta rule learn parity and modular counting. Default off.
    - ``num_v_heads`` (grouped value heads, "GVA": Qwen3-Next's Gated DeltaNet, fla's
      ``num_v_heads``): value_dim splits into num_v_heads heads, a multiple of n_heads (the
      q/k heads); value head h reads q/k head h // (num_v_heads / n_heads); beta, the decay
      and the state are per value head. None: num_v_heads = n_heads.
    - ``num_householder`` (n, DeltaProduct): k, v and beta get n rows per token, written in
      n delta-rule steps (fla's layout: channels ordered (n, heads, dim), token t's j-th row
      at time t n + j of the operator's k, v, beta).
    """

    def _init_delta(self, d_model, n_heads, expand_k, expand_v, use_short_conv, conv_size,
                    conv_bias, backend, chunk_size, num_v_heads=None, allow_neg_eigval=False,
                    num_householder=1):
        self._init_common(backend, chunk_size)
        if not isinstance(use_short_conv, bool):
            raise ValueError(f"use_short_conv must be true or false; got {use_short_conv!r}")
        if not isinstance(allow_neg_eigval, bool):
            raise ValueError(f"allow_neg_eigval must be true or false; got {allow_neg_eigval!r}")
        self.d_model, self.n_heads = d_model, n_heads
        self.key_dim, self.value_dim = _dims(d_model, n_heads, expand_k, expand_v)
        hv = n_heads if num_v_heads is None else _int_option("num_v_heads", num_v_heads)
        if hv % n_heads or self.value_dim % hv:
            raise ValueError(f"num_v_heads = {hv} must be a multiple of n_heads = {n_heads} "
                             f"and split value_dim = d_model * expand_v = {self.value_dim}")
        self.num_v_heads = hv
        self.num_householder = _int_option("num_householder", num_householder)
        self.allow_neg_eigval = allow_neg_eigval
        self.head_k_dim, self.head_v_dim = self.key_dim // n_heads, self.value_dim // hv
        self.use_short_conv = use_short_conv
        n = self.num_householder
        self.q_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, self.key_dim * n, bias=False)
        self.v_proj = nn.Linear(d_model, self.value_dim * n, bias=False)
        self.b_proj = nn.Linear(d_model, hv * n, bias=False)
        self._split = [self.key_dim, self.key_dim * n, self.value_dim * n]
        # the short conv gives the keys a local n-gram view before the delta rule writes
        # them (fla warns that turning it off costs quality)
        self.qkv_conv1d = (ShortConvolution(sum(self._split), conv_size, bias=conv_bias,
                                            activation="silu")
                           if use_short_conv else None)

    def _init_extras(self, batch):
        return () if self.qkv_conv1d is None else (self.qkv_conv1d.init_state(batch),)

    def _extras_size(self):
        return 0 if self.qkv_conv1d is None else self.qkv_conv1d.state_size()

    def _vheads(self, t: torch.Tensor) -> torch.Tensor:
        """(batch, T, num_v_heads * d) -> (batch, T, num_v_heads, d)."""
        return t.unflatten(-1, (self.num_v_heads, -1))

    def _rows(self, t: torch.Tensor, heads: int) -> torch.Tensor:
        """(batch, T, n * heads * d) -> (batch, T n, heads, d): the n Householder rows of
        each token in a row (fla's '... t (n h d) -> ... (t n) h d'); a view for n = 1."""
        return t.unflatten(-1, (self.num_householder, heads, -1)).flatten(1, 2)

    def _qkv_beta(self, x, extras):
        """x (batch, T, d_model) -> q (batch, T, heads, head_k_dim), k (batch, T n, heads,
        head_k_dim), v (batch, T n, num_v_heads, head_v_dim), beta (batch, T n,
        num_v_heads) in (0, 1) (in (0, 2) with allow_neg_eigval), next extras.

        q, k, v come from one piece recomputed from x in the backward, a slice at a time
        (the conv with conv_size - 1 steps of context): the projections and the conv's
        pre-activation are not kept, and the piece's output, time-major, is the operator's
        input as it is (views, no copies, for n = 1). The conv is ``qkv_conv1d``'s maths and
        parameters run by :func:`models.common.causal_conv` (the C kernel on CPU)."""
        conv = self.qkv_conv1d
        width = sum(self._split) + self.b_proj.weight.shape[0]
        # models.common.take_whole: the one rule, recorded and forced by the estimate's probe
        if take_whole(x.shape[0] * x.shape[1], width * x.element_size(), PROJ_WHOLE_MAX_BYTES,
                      cpu_only=False, device=x.device):
            qkv, beta, extra, nxt = self._projected(x, extras)
            self._extra_proj = extra
            return self._split_heads(qkv, beta, nxt)
        w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
        self._extra_proj = None
        if conv is not None:
            cache = extras[0] if extras else None                     # (batch, channels, W - 1)
            left = None if cache is None else cache.to(x.dtype).transpose(1, 2)
            qkv = recomputed_in_slices(self._qkv, 1, conv.kernel_size - 1, x, w, conv.weight,
                                       conv.bias, left)
            if cache is None:
                cache = conv.init_state(x.shape[0], device=x.device, dtype=x.dtype)
            k1 = conv.kernel_size - 1
            nxt = (conv_cache(cache, F.linear(x[:, x.shape[1] - min(k1, x.shape[1]):], w)),)
        else:
            qkv, nxt = recomputed_in_slices(self._qkv, 1, 0, x, w, None, None, None), ()
        return self._split_heads(qkv, self.b_proj(x), nxt)

    def _split_heads(self, qkv, b, nxt):
        """qkv (batch, T, channels) after the conv, b = x W_b -> the operator's q, k, v,
        beta (see :meth:`_qkv_beta`) and the next extras."""
        q, k, v = qkv.split(self._split, dim=-1)
        beta = b.sigmoid()
        if self.allow_neg_eigval:          # eigenvalue 1 - beta of I - beta k k^T in (-1, 1)
            beta = beta * 2.0
        beta = beta.unflatten(-1, (self.num_householder, self.num_v_heads)).flatten(1, 2)
        return (self._heads(q), self._rows(k, self.n_heads), self._rows(v, self.num_v_heads),
                beta, nxt)

    def _proj_extra_weights(self) -> list[torch.Tensor]:
        """Weights of the subclass's own projections of x (its decay's), stacked into the
        one projection matmul of :meth:`_projected`; their outputs reach the subclass as
        ``self._extra_proj``."""
        return []

    def _projected(self, x, extras):
        """The pre-operator piece with the projections under plain autograd: one matmul of
        x with [W_q | W_k | W_v | W_b | the subclass's], then the short conv + SiLU (the C
        kernel on CPU, reading the matmul's output in place) -> (qkv, x W_b, [the
        subclass's outputs], next extras). Against the recomputed piece (above
        :data:`PROJ_WHOLE_MAX_BYTES`): the
        backward runs no second projection and one matmul replaces three, for one kept
        (batch, T, channels) tensor more per layer."""
        extra_w = self._proj_extra_weights()
        ws = [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, self.b_proj.weight,
              *extra_w]
        y = F.linear(x, torch.cat(ws))
        C = sum(self._split)
        pre, b, *extra = y.split([C, ws[3].shape[0], *(w.shape[0] for w in extra_w)], dim=-1)
        conv = self.qkv_conv1d
        if conv is None:
            return F.silu(pre), b, extra, ()
        cache = extras[0] if extras else None                         # (batch, channels, W - 1)
        left = None if cache is None else cache.to(x.dtype).transpose(1, 2)
        qkv = causal_conv(pre, conv.weight, conv.bias, left, silu=True)
        if cache is None:
            cache = conv.init_state(x.shape[0], device=x.device, dtype=x.dtype)
        k1 = conv.kernel_size - 1
        return qkv, b, extra, (conv_cache(cache, pre[:, pre.shape[1] - min(k1, pre.shape[1]):]),)

    # -- decode: one token without the sequence machinery (issue 43 item 1) -------------
    def step(self, x_t: torch.Tensor, state: tuple) -> tuple[torch.Tensor, tuple]:
        """One token: x_t (batch, d_model) -> (y_t, next state). Without autograd (decode:
        ``torch.no_grad`` / ``inference_mode``) the C step :meth:`_fused_step` where it
        applies (DeltaNet, Gated DeltaNet, Gated DeltaProduct on a CPU in float32 / float64),
        else the torch step :meth:`_fast_step`; with autograd recording, the reference path
        (the sequence code at T = 1 and the op's ``*_ref``), which the tests hold both to."""
        if torch.is_grad_enabled():
            return super().step(x_t, state)
        fused = self._fused_step(x_t, state)
        return fused if fused is not None else self._fast_step(x_t, state)

    # the layers whose maths csrc/delta_rule_step.c covers set this (not KDA's vector decay)
    _c_step = False

    def _fused_step(self, x_t, state):
        """The decode step in one C call (DeltaNet, Gated DeltaNet, Gated DeltaProduct on a
        CPU in float32 / float64, the library built): the stacked matmul of
        :meth:`_fast_step`, ``models.kernels.linear_rnn_cpu.delta_rule_step`` from there to
        the output projection (conv window, SiLU, L2 norms, beta, decay, the n writes,
        readout, head norm, gate), o_proj. None where it does not apply (the caller then
        takes :meth:`_fast_step`). The new state and conv cache are new tensors."""
        if not self._c_step:
            return None
        names, forget, offsets = self._c_plan()
        # parameters read from the modules' dicts, not through nn.Module.__getattr__: at
        # batch 1 the lookups were a fair part of the step
        mods, params = self._modules, self._parameters
        S, conv = state[0], mods.get("qkv_conv1d")
        cache = conv_w = conv_b = A_log = dt_bias = None
        if conv is not None:
            cache, conv_w, conv_b = state[1], conv.weight, conv.bias
        if forget:
            A_log, dt_bias = params["A_log"], params["dt_bias"]
        norm, w_o = mods["o_norm"], mods["o_proj"]._parameters["weight"]
        if linear_rnn_cpu.delta_step_unsupported(x_t, S, w_o, norm.weight, cache, conv_w,
                                                 conv_b, A_log, dt_bias):
            return None
        ws = [mods[n]._parameters["weight"] for n in names]
        o, S2, cache2 = linear_rnn_cpu.delta_rule_step(
            F.linear(x_t, _stacked_weights(self, ws)), S, cache, conv_w, conv_b, A_log, dt_bias,
            norm.weight, offsets, n_heads=self.n_heads, num_householder=self.num_householder,
            allow_neg_eigval=self.allow_neg_eigval, eps=norm.eps)
        return F.linear(o, w_o), ((S2,) if conv is None else (S2, cache2))

    def _c_plan(self) -> tuple[tuple[str, ...], bool, tuple]:
        """What :meth:`_fused_step` reads of the layer's structure, worked out once: the
        projections of :meth:`_x_weights` by name (DeltaNet: q, k, v, b; the gated layers:
        then a (with the forget gate) and g), whether it decays, and the column offsets of
        [q | k | v], b, a and the gate in their product (None: absent)."""
        plan = self.__dict__.get("_c_plan_cache")
        if plan is None:
            gated = isinstance(self, _GatedBase)
            forget = gated and self.use_forget_gate
            names = ("q_proj", "k_proj", "v_proj", "b_proj", *(("a_proj",) if forget else ()),
                     *(("g_proj",) if gated else ()))
            C, nb = sum(self._split), self.b_proj.weight.shape[0]
            oa = C + nb if forget else None
            og = C + nb + (self.num_v_heads if forget else 0) if gated else None
            plan = self.__dict__["_c_plan_cache"] = (names, forget, (0, C, oa, og))
        return plan

    def _x_weights(self) -> list[torch.Tensor]:
        """The weights applied to x_t, stacked into one matmul per step: q, k, v, beta, then
        the subclass's (its gate and output-gate projections)."""
        return [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, self.b_proj.weight]

    def _step_gate(self, x_t, parts):
        """The step's log-decay from the matmul's ``parts`` (q, k, v, b, then the
        subclass's): None (no decay), (batch, v heads) or (batch, v heads, head_k_dim)."""
        return None

    def _step_out(self, o, x_t, parts):
        """o (batch, v heads, head_v_dim) -> y_t (batch, d_model): DeltaNet's normed o_proj."""
        return F.linear(rms_norm(o, self.o_norm.weight, self.o_norm.eps).flatten(-2),
                        self.o_proj.weight)

    def _fast_step(self, x_t, state):
        """The decode step in a few whole-batch ops (no autograd): one matmul for every
        projection of x_t (the stacked weights kept between steps while the parameters are
        unchanged: :func:`_stacked_weights`), the short conv as a window product over
        [cache | x_t], L2-normalised q / k, then the delta-rule update of S in place of the
        op's ``*_ref`` loop (decay, then n Householder writes, then o = scale S^T q).
        Equal to the reference step to rounding (tests/models/test_linear_rnn_fast_paths.py)."""
        S = state[0]
        ws = self._x_weights()
        y = F.linear(x_t, _stacked_weights(self, ws))
        parts = y.split([w.shape[0] for w in ws], dim=-1)
        B, n, H, Hv = x_t.shape[0], self.num_householder, self.n_heads, self.num_v_heads
        dk, dv = self.head_k_dim, self.head_v_dim
        dt = torch.float32 if x_t.dtype in (torch.float16, torch.bfloat16) else x_t.dtype
        qkv = torch.cat(parts[:3], -1)
        conv = self.qkv_conv1d
        if conv is not None:
            window = torch.cat([state[1].to(qkv.dtype), qkv[..., None]], -1)   # (B, C, W)
            pre = (window * conv.weight[:, 0]).sum(-1)
            if conv.bias is not None:
                pre = pre + conv.bias
            qkv, nxt = F.silu(pre), (window[..., 1:].contiguous(),)
        else:
            qkv, nxt = F.silu(qkv), ()
        q, k, v = qkv.to(dt).split(self._split, dim=-1)
        q = F.normalize(q.view(B, H, dk), dim=-1)
        k = F.normalize(k.view(B, n, H, dk), dim=-1)
        v = v.view(B, n, Hv, dv)
        beta = parts[3].to(dt).sigmoid().view(B, n, Hv)
        if self.allow_neg_eigval:
            beta = beta * 2.0
        if Hv != H:                                     # grouped value heads
            q, k = q.repeat_interleave(Hv // H, 1), k.repeat_interleave(Hv // H, 2)
        S = S.to(dt)
        g = self._step_gate(x_t, parts)
        if g is not None:
            g = g.to(dt).exp()
            S = S * (g[..., None] if g.dim() == 3 else g[..., None, None])
        for j in range(n):
            kj = k[:, j]
            err = v[:, j] - (kj.unsqueeze(-2) @ S).squeeze(-2)          # v - S^T k
            S = S + kj[..., None] * (beta[:, j, :, None] * err)[..., None, :]
        o = ((q.unsqueeze(-2) @ S).squeeze(-2) * dk ** -0.5).to(x_t.dtype)
        return self._step_out(o, x_t, parts), (S, *nxt)

    def _qkv(self, h, x, w, conv_w, conv_b, left):
        """silu(shortconv(x W^T)) (silu(x W^T) without the conv): x (batch, T, d_model) ->
        (batch, T - h, key_dim (1 + n) + value_dim n), time-major; the first h steps of x
        are the conv's context (h = 0: ``left``, the cache, is)."""
        y = F.linear(x, w)
        if conv_w is None:
            return F.silu(y)
        return causal_conv(y, conv_w, conv_b, None if h else left, silu=True)[:, h:]


class DeltaNet(_DeltaBase):
    """DeltaNet (Schlag, Irie & Schmidhuber, "Linear Transformers Are Secretly Fast Weight
    Programmers", 2021; chunked training: Yang, Wang, Zhang, Shen & Kim, "Parallelizing
    Linear Transformers with the Delta Rule over Sequence Length", 2024); structure of
    fla's ``fla/layers/delta_net.py`` (``DeltaNet``: expand_k 1, expand_v 1, short conv
    of 4 + SiLU on q, k, v, L2 q/k norm, sigmoid beta, per-head RMS output norm, no gate).

        q, k, v = silu(shortconv([x W_q | x W_k | x W_v]));  q, k <- q/|q|, k/|k|
        beta    = sigmoid(x W_b)   (2 sigmoid with allow_neg_eigval)   (batch, T, v heads)
        S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T,  o_t = head_k^-0.5 S_t^T q_t
        y   = W_o [ rmsnorm_head(o) ]                                   (``delta_rule``)

    ``allow_neg_eigval`` and ``num_v_heads``: see :class:`_DeltaBase`.
    """

    op_name = "delta_rule"
    _c_step = True

    def __init__(self, d_model: int, n_heads: int = 4, expand_k: float = 1.0,
                 expand_v: float = 1.0, use_short_conv: bool = True, conv_size: int = 4,
                 conv_bias: bool = False, norm_eps: float = 1e-5, backend: str = "auto",
                 chunk_size: int | None = None, num_v_heads: int | None = None,
                 allow_neg_eigval: bool = False):
        super().__init__()
        self._init_delta(d_model, n_heads, expand_k, expand_v, use_short_conv, conv_size,
                         conv_bias, backend, chunk_size, num_v_heads, allow_neg_eigval)
        self.o_norm = HeadRMSNorm(self.head_v_dim, eps=norm_eps)
        self.o_proj = nn.Linear(self.value_dim, d_model, bias=False)

    def _inputs(self, x, extras):
        q, k, v, beta, nxt = self._qkv_beta(x, extras)
        return [q, k, v, beta], {"use_qk_l2norm_in_kernel": True}, nxt

    def _output(self, o, x):
        # norm and o_proj recomputed from o, a slice at a time in the backward
        return recomputed_in_slices(self._normed_out, 1, 0, o, self.o_norm.weight,
                                    self.o_proj.weight)

    def _normed_out(self, h, o, norm_w, w_o):
        """W_o [rmsnorm_head(o)]: o (batch, T, v heads, head_v_dim) -> (batch, T, d_model)."""
        return F.linear(rms_norm(o, norm_w, self.o_norm.eps).flatten(-2), w_o)


class _GatedBase(_DeltaBase):
    """The gated layers' parts: the Mamba-2 style decay per value head (optional), the
    swish output gate fused with a per-head RMS norm, o_proj."""

    def _init_gated(self, d_model, n_heads, expand_k, expand_v, use_short_conv, conv_size,
                    conv_bias, norm_eps, backend, chunk_size, num_v_heads, allow_neg_eigval,
                    num_householder=1, use_forget_gate=True):
        self._init_delta(d_model, n_heads, expand_k, expand_v, use_short_conv, conv_size,
                         conv_bias, backend, chunk_size, num_v_heads, allow_neg_eigval,
                         num_householder)
        if not isinstance(use_forget_gate, bool):
            raise ValueError(f"use_forget_gate must be true or false; got {use_forget_gate!r}")
        self.use_forget_gate = use_forget_gate
        hv = self.num_v_heads
        if use_forget_gate:
            self.a_proj = nn.Linear(d_model, hv, bias=False)
            A = torch.empty(hv).uniform_(0, 16)
            self.A_log = nn.Parameter(torch.log(A))
            self.A_log._no_weight_decay = True
            self.dt_bias = nn.Parameter(_softplus_inv_dt(hv))
            self.dt_bias._no_weight_decay = True
        self.g_proj = nn.Linear(d_model, self.value_dim, bias=False)
        self.o_norm = GatedHeadRMSNorm(self.head_v_dim, eps=norm_eps)
        self.o_proj = nn.Linear(self.value_dim, d_model, bias=False)

    def log_gate(self, x: torch.Tensor) -> torch.Tensor | None:
        """x (batch, T, d_model) -> g (batch, T, v heads) <= 0: the per-step log decay (None
        without the forget gate)."""
        if not self.use_forget_gate:
            return None
        extra = getattr(self, "_extra_proj", None)
        a = extra[0] if extra else self.a_proj(x)
        return -self.A_log.exp() * F.softplus(a + self.dt_bias)

    def _proj_extra_weights(self):
        return [self.a_proj.weight] if self.use_forget_gate else []

    def _inputs(self, x, extras):
        q, k, v, beta, nxt = self._qkv_beta(x, extras)
        g = self.log_gate(x)
        self._extra_proj = None
        return [q, k, v, g, beta], {"use_qk_l2norm_in_kernel": True}, nxt

    def _x_weights(self):
        extra = [self.a_proj.weight] if self.use_forget_gate else []
        return [*super()._x_weights(), *extra, self.g_proj.weight]

    def _step_gate(self, x_t, parts):
        if not self.use_forget_gate:
            return None
        return -self.A_log.exp() * F.softplus(parts[4] + self.dt_bias)

    def _step_out(self, o, x_t, parts):
        gate = parts[-1].view(*o.shape)
        return F.linear((rms_norm(o, self.o_norm.weight, self.o_norm.eps) * F.silu(gate))
                        .flatten(-2), self.o_proj.weight)

    def _output(self, o, x):
        # norm, gate and o_proj in one piece recomputed from (o, x) slice by slice in the
        # backward: the gate g_proj(x) and the norm's intermediates are not kept
        return recomputed_in_slices(self._gated_out, 2, 0, o, x, self.g_proj.weight,
                                    self.o_norm.weight, self.o_proj.weight)

    def _gated_out(self, h, o, x, w_g, norm_w, w_o):
        """W_o [rmsnorm_head(o) * silu(x W_g)]: o (batch, T, v heads, head_v_dim), x (batch,
        T, d_model) -> (batch, T, d_model) (h = 0: position-wise)."""
        gate = self._vheads(F.linear(x, w_g))   # the norm and gate in one C pass on a CPU:
        normed = gated_norm_cpu.gated_rms_norm(o, gate, norm_w, self.o_norm.eps, None, True)
        return F.linear(normed.flatten(-2), w_o)


class GatedDeltaNet(_GatedBase):
    """Gated DeltaNet (Yang, Kautz & Hatamizadeh, "Gated Delta Networks: Improving Mamba2
    with Delta Rule", ICLR 2025); structure of fla's ``fla/layers/gated_deltanet.py``
    (``GatedDeltaNet`` with use_gate=True: key_dim 0.75 d and value_dim 1.5 d, fla's
    "6 d^2 parameters" split; short conv of 4; Mamba-2 style decay; gated RMS norm).

        q, k, v, beta as in :class:`DeltaNet`
        g     = -exp(A_log) * softplus(x W_a + dt_bias)   (batch, T, v heads), log space <= 0
        S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T
        o_t = head_k^-0.5 S_t^T q_t                                  (``gated_delta_rule``)
        y   = W_o [ rmsnorm_head(o) * silu(x W_g) ]

    A_log and dt_bias are initialised as fla's (and Mamba-2's): A ~ U(0, 16) per head,
    softplus(dt_bias) = dt log-uniform in [0.001, 0.1] (floored at 1e-4); neither gets
    weight decay (``_no_weight_decay``, read by the worker's optimiser groups).
    ``allow_neg_eigval`` and ``num_v_heads`` (Qwen3-Next's grouped value heads): see
    :class:`_DeltaBase`.
    """

    op_name = "gated_delta_rule"
    _c_step = True

    def __init__(self, d_model: int, n_heads: int = 4, expand_k: float = 0.75,
                 expand_v: float = 1.5, use_short_conv: bool = True, conv_size: int = 4,
                 conv_bias: bool = False, norm_eps: float = 1e-5, backend: str = "auto",
                 chunk_size: int | None = None, num_v_heads: int | None = None,
                 allow_neg_eigval: bool = False):
        super().__init__()
        self._init_gated(d_model, n_heads, expand_k, expand_v, use_short_conv, conv_size,
                         conv_bias, norm_eps, backend, chunk_size, num_v_heads,
                         allow_neg_eigval)


class GatedDeltaProduct(_GatedBase):
    """Gated DeltaProduct (Siems, Carstensen, Zela, Hutter, Pontil & Grazzi, "DeltaProduct:
    Improving State-Tracking in Linear RNNs via Householder Products", 2025); structure of
    fla's ``fla/layers/gated_deltaproduct.py`` (``GatedDeltaProduct``: Gated DeltaNet whose
    k, v and beta projections are n = num_householder times wider, so each token writes n
    delta-rule steps; the decay once per token, before them).

        q = x W_q;  k_j, v_j = x W_k^(j), x W_v^(j)  (j = 0..n-1), all through the short conv
        beta_j = sigmoid(x W_b^(j))   (2 sigmoid with allow_neg_eigval)
        S_t = (prod_{j = n-1..0} (I - beta_tj k_tj k_tj^T)) exp(g_t) S_{t-1} + (write terms)
        o_t = head_k^-0.5 S_t^T q_t,  y = W_o [ rmsnorm_head(o) * silu(x W_g) ]
                                                              (``gated_delta_product``)

    Each factor is a generalised Householder matrix (a reflection at beta = 2), so the
    transition is a product of n of them: n = 1 is Gated DeltaNet; n >= 2 with
    allow_neg_eigval reaches rotations, what the paper's state-tracking results (S3, S4,
    A5, S5) need. fla's layer defaults to allow_neg_eigval=True and n = 2; here n = 2 and
    allow_neg_eigval off (as on every layer of this workbench: a profile turns it on).
    ``use_forget_gate=False`` drops the decay (DeltaProduct). ``num_v_heads``: see
    :class:`_DeltaBase`.
    """

    op_name = "gated_delta_product"
    _c_step = True

    def __init__(self, d_model: int, n_heads: int = 4, expand_k: float = 0.75,
                 expand_v: float = 1.5, num_householder: int = 2, use_forget_gate: bool = True,
                 use_short_conv: bool = True, conv_size: int = 4, conv_bias: bool = False,
                 norm_eps: float = 1e-5, backend: str = "auto", chunk_size: int | None = None,
                 num_v_heads: int | None = None, allow_neg_eigval: bool = False):
        super().__init__()
        self._init_gated(d_model, n_heads, expand_k, expand_v, use_short_conv, conv_size,
                         conv_bias, norm_eps, backend, chunk_size, num_v_heads,
                         allow_neg_eigval, num_householder, use_forget_gate)
