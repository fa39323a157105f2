"""A decoder-only (causal) Transformer backbone.

    x -> x + P (absolute positions only)
      -> n_layers x [ x + Attn(norm(x)) ; x + MLP(norm(x)) ]     (pre-norm residual)
      -> final norm

Attention is multi-head, causal (always), with positions chosen by ``pos``:

- ``"absolute"`` (default): sinusoidal positions added to the input once; defined at any
  length, no parameters.
- ``"learned"``: a learned (max_len, d_model) table added to the input once; sequences
  longer than ``max_len`` are an error.
- ``"rope"``, ``"xpos"``: rotary (and xPos-decayed rotary) positions on q and k in every
  attention layer; see ``models.attention.attention``.
- ``"none"``: no positions at all (a causal Transformer can still infer some position
  from the mask, but this is the ablation, not a sensible baseline).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from models.attention.attention import MLP, CausalSelfAttention, sinusoidal_positions
from models.common import ResidualStack

TRANSFORMER_POSITIONS = ("absolute", "learned", "rope", "xpos", "none")


class Transformer(nn.Module):
    """Causal Transformer: (batch, length, d_model) -> (batch, length, d_model)."""

    backend = "torch"

    def __init__(self, d_model: int, n_layers: int, n_heads: int = 4, pos: str = "absolute",
                 mlp_mult: int = 4, dropout: float = 0.0, norm: str = "layer",
                 max_len: int = 4096, attn_scale: float | None = None):
        super().__init__()
        if pos not in TRANSFORMER_POSITIONS:
            raise ValueError(f"unknown pos {pos!r}; expected one of "
                             f"{', '.join(TRANSFORMER_POSITIONS)}")
        if n_heads < 1 or d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must be >= 1 and divide d_model={d_model}")
        if mlp_mult < 1:
            raise ValueError(f"mlp_mult must be >= 1, got {mlp_mult}")
        self.d_model, self.pos, self.max_len = d_model, pos, max_len
        attn_pos = pos if pos in ("rope", "xpos") else "none"

        def make_mixer(i: int) -> nn.Module:
            # Even sub-layers attend, odd ones are the MLP: one Transformer layer = two
            # pre-norm residual sub-layers.
            if i % 2 == 0:
                return CausalSelfAttention(d_model, n_heads, pos=attn_pos, dropout=dropout,
                                           scale=attn_scale)
            return MLP(d_model, mlp_mult, dropout)

        self.stack = ResidualStack(d_model, 2 * n_layers, make_mixer, norm=norm, dropout=dropout)
        self.pos_emb = nn.Parameter(torch.randn(max_len, d_model) * 0.02) if pos == "learned" else None
        self.emb_drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, length, d_model) -> (batch, length, d_model)."""
        length = x.shape[1]
        if self.pos == "absolute":
            x = x + sinusoidal_positions(length, self.d_model, device=x.device, dtype=x.dtype)
        elif self.pos == "learned":
            if length > self.max_len:
                raise ValueError(f"sequence length {length} exceeds max_len={self.max_len} "
                                 "of the learned positions")
            x = x + self.pos_emb[:length].to(x.dtype)
        return self.stack(self.emb_drop(x))

    def state_size(self) -> None:
        return None  # attention keeps a KV cache that grows with length
