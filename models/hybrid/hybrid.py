"""Transformer / recurrent hybrids: side by side (``hybrid``) and interleaved (``mambaformer``;
general layer patterns are in ``models.hybrid.hybrid_pattern``).

``hybrid`` — n_layers blocks, each running an attention branch and a recurrent branch (Mamba
by default; ``recurrent`` picks mamba, mamba2, gla, retnet, linear_attention, deltanet,
gated_deltanet or based, see ``models.hybrid.hybrid_pattern.RECURRENT_NAMES``) in parallel on the
same (normed) residual stream:

    x -> x + Combine( A(s_A), M(s_M) ),   (s_A, s_M) = Split(norm(x))     per block
      -> final norm

- Split: ``split="same"`` (default) gives both branches the whole normed input, width
  d_model each. ``split="linear"`` projects it with one Linear(d_model, d_A + d_M) into two
  narrower streams, d_A ~ split_ratio * d_model (rounded to a multiple of 2 * n_heads so
  heads are whole and RoPE pairs complete) and d_M = d_model - d_A: the block costs about
  what one model of width d_model costs.
- Branch A: t_layers Transformer layers (pre-norm residual causal attention + pre-norm
  residual GELU MLP) at width d_A, positions ``pos`` (RoPE by default) inside attention.
  Branch M: m_layers pre-norm residual recurrent layers (``recurrent``, Mamba by default)
  at width d_M; the Mamba options (d_state, d_conv, expand) go to Mamba, and to another
  kind only if changed from their defaults and it takes them. No final norm inside a
  branch; the block's own pre-norm residual wraps the whole. (The branch keeps its
  historical attribute name ``mamba_branch`` whatever its kind.)
- Combine, with pad(y) = y truncated or zero-padded to d_model channels:
    ``"null"``:      (pad(y_A) + pad(y_M)) / 2
    ``"res"``:       (P_A y_A + pad(y_A) + P_M y_M + pad(y_M)) / 2     (P_b: Linear(d_b, d_model))
    ``"gated-res"``: sum_b w_b * (g_b * P_b y_b + (1 - g_b) * pad(y_b)),
                     g_b = sigmoid(per-channel logits), w = softmax over branches of
                     per-channel logits; both start at equal weights.

``mambaformer`` — Park et al. 2024, "Can Mamba Learn How to Learn?": a Transformer whose
MLP blocks are replaced by Mamba blocks and which starts with a Mamba block instead of a
positional encoding:

    x -> x + Mamba(norm x) -> n_layers x [ x + Attn(norm x) ; x + Mamba(norm x) ] -> final norm

Both are causal (every part is), report the recurrent branch's ``backend``, and have no fixed-size
recurrent state (``state_size()`` is None: attention's KV cache grows with length). Both decode
token by token (``init_state`` / ``forward_with_state`` / ``step``,
:class:`models.hybrid.hybrid_pattern.DecodingStack`): one list of states per stack, an entry per
layer (a hybrid block's entry: the list of its sub-layers' caches and states), updated in
place by one pass over the layers per token.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.attention.attention import MLP, CausalSelfAttention
from models.attention.transformer import residual_pass
from models.common import PreNormResidual, ResidualStack
from models.hybrid.hybrid_pattern import DecodingStack, init_mixer_state, make_recurrent
from models.ssm.mamba import Mamba

COMBINERS = ("null", "res", "gated-res")
# the hybrid entry's Mamba options and their defaults (other recurrent kinds get them only
# when changed)
MAMBA_DEFAULTS = {"d_state": 16, "d_conv": 4, "expand": 2}
SPLITS = ("same", "linear")


def pad_to(y: torch.Tensor, d: int) -> torch.Tensor:
    """y: (..., d_b) -> (..., d): truncate extra channels or append zero channels."""
    d_b = y.shape[-1]
    if d_b >= d:
        return y[..., :d]
    return F.pad(y, (0, d - d_b))


class Combiner(nn.Module):
    """Branch outputs [(batch, length, d_b)] -> (batch, length, d_model); see module doc."""

    def __init__(self, kind: str, widths: list[int], d_model: int):
        super().__init__()
        if kind not in COMBINERS:
            raise ValueError(f"unknown combiner {kind!r}; expected one of {', '.join(COMBINERS)}")
        self.kind, self.d_model = kind, d_model
        self.proj = (
            nn.ModuleList(nn.Linear(w, d_model) for w in widths) if kind != "null" else None
        )
        if kind == "gated-res":
            # logits 0 -> gate 1/2 between projection and identity, equal branch weights
            self.gate_logits = nn.Parameter(torch.zeros(len(widths), d_model))
            self.branch_logits = nn.Parameter(torch.zeros(len(widths), d_model))

    def forward(self, ys: list[torch.Tensor]) -> torch.Tensor:
        ident = [pad_to(y, self.d_model) for y in ys]
        if self.kind == "null":
            return torch.stack(ident).mean(0)
        proj = [p(y) for p, y in zip(self.proj, ys)]
        if self.kind == "res":
            return torch.stack([p + i for p, i in zip(proj, ident)]).mean(0)
        g = torch.sigmoid(self.gate_logits)                          # (branches, d_model)
        w = torch.softmax(self.branch_logits, dim=0)                 # (branches, d_model)
        mixed = torch.stack([g[b] * proj[b] + (1 - g[b]) * ident[b] for b in range(len(ys))])
        return (w[:, None, None, :] * mixed).sum(0)


class HybridBlock(nn.Module):
    """Split -> (attention branch, recurrent branch) in parallel -> combine.

    (batch, length, d_model) -> (batch, length, d_model); the caller adds norm and residual.
    """

    def __init__(self, d_model: int, t_layers: int, m_layers: int, combiner: str, split: str,
                 split_ratio: float, n_heads: int, pos: str, mlp_mult: int, norm: str,
                 dropout: float, mamba_kwargs: dict, recurrent: str = "mamba"):
        super().__init__()
        if t_layers < 1 or m_layers < 1:
            raise ValueError(f"t_layers and m_layers must be >= 1 (got {t_layers}, {m_layers}); "
                             "use the 'transformer' or 'mamba' entries for a single kind")
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        if split == "same":
            d_a = d_m = d_model
            self.splitter = None
        else:
            if not 0.0 < split_ratio < 1.0:
                raise ValueError(f"split_ratio must be in (0, 1), got {split_ratio}")
            unit = 2 * n_heads if pos in ("rope", "xpos") else n_heads
            d_a = max(unit, round(split_ratio * d_model / unit) * unit)
            d_m = d_model - d_a
            if d_m < 1:
                raise ValueError(f"split leaves no width for Mamba: d_model={d_model}, "
                                 f"attention width {d_a} (multiple of {unit})")
            self.splitter = nn.Linear(d_model, d_a + d_m)
        if d_a % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide the attention width {d_a}")
        self.d_a, self.d_m = d_a, d_m
        attn_layers: list[nn.Module] = []
        for _ in range(t_layers):
            attn_layers.append(PreNormResidual(
                d_a, CausalSelfAttention(d_a, n_heads, pos=pos, dropout=dropout), norm, dropout))
            attn_layers.append(PreNormResidual(d_a, MLP(d_a, mlp_mult, dropout), norm, dropout))
        self.attn_branch = nn.Sequential(*attn_layers)
        self.recurrent = recurrent
        self.mamba_branch = nn.Sequential(*(
            PreNormResidual(d_m, self._make_recurrent(recurrent, d_m, mamba_kwargs), norm, dropout)
            for _ in range(m_layers)
        ))
        self.combine = Combiner(combiner, [d_a, d_m], d_model)

    @staticmethod
    def _make_recurrent(recurrent: str, d_m: int, mamba_kwargs: dict) -> nn.Module:
        if recurrent == "mamba":
            return Mamba(d_m, **mamba_kwargs)
        options = {k: v for k, v in mamba_kwargs.items() if k != "backend"}
        return make_recurrent(recurrent, d_m, backend=mamba_kwargs.get("backend", "auto"),
                              options=options, defaults=MAMBA_DEFAULTS)

    @property
    def recurrent_branch(self) -> nn.Sequential:
        return self.mamba_branch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, length, d_model) -> (batch, length, d_model)."""
        if self.splitter is None:
            s_a = s_m = x
        else:
            s_a, s_m = self.splitter(x).split([self.d_a, self.d_m], dim=-1)
        return self.combine([self.attn_branch(s_a), self.mamba_branch(s_m)])

    @property
    def backend(self) -> str:
        return str(getattr(self.mamba_branch[0].mixer, "backend", "torch"))

    def state_size(self) -> None:
        return None

    # -- decoding: the attention branch's caches and the recurrent branch's states, one list
    def init_state(self, batch: int) -> list:
        """One entry per sub-layer: the attention branch's (a key/value cache per attention
        layer, ``()`` per MLP), then the recurrent branch's states."""
        return [init_mixer_state(layer.mixer, batch) for layer in (*self.attn_branch, *self.mamba_branch)]

    def _decode(self, x: torch.Tensor, state: list, method: str) -> tuple[torch.Tensor, list]:
        s_a, s_m = (x, x) if self.splitter is None else self.splitter(x).split([self.d_a, self.d_m], dim=-1)
        y_a = residual_pass(self.attn_branch, s_a, state, method)
        y_m = residual_pass(self.mamba_branch, s_m, state, method, len(self.attn_branch))
        if method == "step":   # the combiner weighs (batch, length, width) outputs
            return self.combine([y_a[:, None], y_m[:, None]])[:, 0], state
        return self.combine([y_a, y_m]), state

    def forward_with_state(self, x: torch.Tensor, state: list) -> tuple[torch.Tensor, list]:
        """x: (batch, length, d_model) after the positions in ``state`` -> (y, state updated in place)."""
        return self._decode(x, state, "forward_with_state")

    def step(self, x_t: torch.Tensor, state: list) -> tuple[torch.Tensor, list]:
        """One token x_t: (batch, d_model) -> (y_t (batch, d_model), state updated in place)."""
        return self._decode(x_t, state, "step")


class Hybrid(DecodingStack, ResidualStack):
    """n_layers pre-norm residual :class:`HybridBlock` s and a final norm."""

    def __init__(self, d_model: int, n_layers: int, t_layers: int = 1, m_layers: int = 1,
                 combiner: str = "gated-res", split: str = "same", split_ratio: float = 0.5,
                 n_heads: int = 4, pos: str = "rope", mlp_mult: int = 4, norm: str = "rms",
                 dropout: float = 0.0, mamba_kwargs: dict | None = None,
                 recurrent: str = "mamba", channel_mixer: str = "none"):
        """``recurrent``: the recurrent branch's kind; ``channel_mixer``="swiglu" adds a
        pre-norm residual SwiGLU (hidden ``mlp_mult * d_model``, the same multiplier as the
        attention branch's MLP) after each block."""
        mk = dict(mamba_kwargs or {})
        super().__init__(
            d_model, n_layers,
            lambda i: HybridBlock(d_model, t_layers, m_layers, combiner, split, split_ratio,
                                  n_heads, pos, mlp_mult, norm, dropout, mk, recurrent),
            norm=norm, dropout=dropout, channel_mixer=channel_mixer, mlp_mult=mlp_mult,
        )


class MambaFormer(DecodingStack, ResidualStack):
    """Mamba, then n_layers x (attention, Mamba), all pre-norm residual; no positions.
    Decodes token by token: a key/value cache per attention layer, a state per Mamba."""

    def __init__(self, d_model: int, n_layers: int, n_heads: int = 4, norm: str = "rms",
                 dropout: float = 0.0, mamba_kwargs: dict | None = None):
        mk = dict(mamba_kwargs or {})
        if n_heads < 1 or d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must be >= 1 and divide d_model={d_model}")

        def make_mixer(i: int) -> nn.Module:
            # i = 0: the leading Mamba that stands in for a positional encoding;
            # then odd i attention, even i Mamba (the Mamba takes the MLP's place).
            if i % 2 == 1:
                return CausalSelfAttention(d_model, n_heads, pos="none", dropout=dropout)
            return Mamba(d_model, **mk)

        super().__init__(d_model, 2 * n_layers + 1, make_mixer, norm=norm, dropout=dropout)
