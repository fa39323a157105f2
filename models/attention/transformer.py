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

Decoding (``init_state`` / ``forward_with_state`` / ``step``, the interface of the recurrent
backbones): each attention layer keeps a key/value cache (``models.attention.attention.KVCache``,
preallocated and grown in chunks), so a prompt is read once and each new token costs one
query against the cached keys; positions continue from the cache's length. The cache holds
at most ``max_len`` positions: past it, a one-line ``CacheFull`` error.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from models.attention.attention import (
    CACHE_CHUNK,
    MLP,
    CacheFull,
    CausalSelfAttention,
    KVCache,
    StaticKV,
    sinusoidal_positions,
    static_kv,
)
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

    # -- decoding with a key/value cache (init_state / forward_with_state / step) ----------
    def init_state(self, batch: int, capacity: int = 0) -> list:
        """Per sub-layer: a :class:`~models.attention.attention.KVCache` for each attention
        layer (room for ``capacity`` positions now, at most ``max_len``), ``()`` for each MLP."""
        return [layer.mixer.init_state(batch, capacity, self.max_len) for layer in self.stack.layers]

    def _positions_at(self, offset: int, length: int, x: torch.Tensor) -> torch.Tensor:
        """x (batch, length, d_model) at positions offset .. offset+length-1 plus its
        absolute / learned positions; a CacheFull past ``max_len``."""
        if offset + length > self.max_len:
            raise CacheFull(f"position {offset + length - 1:,} is past the Transformer's max_len={self.max_len:,} "
                            f"(its key/value cache and position table): {offset:,} cached + {length:,} new")
        if self.pos == "absolute":
            x = x + self._sinusoid_rows(offset + length, x)[offset:offset + length]
        elif self.pos == "learned":
            x = x + self.pos_emb[offset:offset + length].to(x.dtype)
        return x

    def _sinusoid_rows(self, need: int, x: torch.Tensor) -> torch.Tensor:
        """The sinusoidal positions 0 .. >= need-1 on x's device and dtype, kept between
        calls (grown in chunks of CACHE_CHUNK rows, never past max_len): a decoding step
        slices one row instead of computing sin / cos again (~30 us of its ~0.5 ms at
        d_model 16). Rows equal :func:`sinusoidal_positions`'s at any offset (each row
        depends on its position only)."""
        table = getattr(self, "_sinusoids", None)
        if table is None or table.shape[0] < need or table.device != x.device or table.dtype != x.dtype:
            rows = min(-(-need // CACHE_CHUNK) * CACHE_CHUNK, max(self.max_len, need))
            table = sinusoidal_positions(rows, self.d_model, device=x.device, dtype=x.dtype)
            self._sinusoids = table
        return table

    def forward_with_state(self, x: torch.Tensor, state: list) -> tuple[torch.Tensor, list]:
        """x: (batch, length, d_model) after the positions cached in ``state`` -> (y, state).
        Chaining chunks equals one forward over their concatenation; the caches are
        updated in place."""
        x = self._positions_at(state[0].length, x.shape[1], x)
        return stack_step(self.stack, self.emb_drop(x), state, "forward_with_state")

    def step(self, x_t: torch.Tensor, state: list) -> tuple[torch.Tensor, list]:
        """One token x_t: (batch, d_model) -> (y_t (batch, d_model), state one position longer)."""
        cache = state[0]
        if isinstance(cache, StaticKV):   # the position stays a tensor (see static_state)
            if self.pos == "absolute":
                x_t = x_t + self._sinusoid_rows(cache.k.shape[2], x_t).index_select(0, cache.length)
            elif self.pos == "learned":
                x_t = x_t + self.pos_emb.index_select(0, cache.length).to(x_t.dtype)
        else:
            x_t = self._positions_at(cache.length, 1, x_t[:, None, :])[:, 0]
        return stack_step(self.stack, x_t, state, "step")

    def static_state(self, state: list, capacity: int) -> list:
        """``state`` (after a prompt: :meth:`forward_with_state`) with each layer's
        :class:`KVCache` copied into a :class:`~models.attention.attention.StaticKV` of
        ``capacity`` positions in all (at most ``max_len``): a state of fixed-shape tensors
        whose :meth:`step` reads no position on the host, so decoding can replay one CUDA
        graph per token (``workbench.train.decode.graphed_step``). Its steps equal the
        growing cache's; it cannot grow past ``capacity`` (the caller sizes it for the
        prompt plus the tokens to generate)."""
        if capacity > self.max_len:
            raise CacheFull(f"a static key/value cache of {capacity:,} positions is past the Transformer's "
                            f"max_len={self.max_len:,}")
        out = [static_kv(s, capacity) if isinstance(s, KVCache) else s for s in state]
        if self.pos == "absolute" and out:   # the position table built now, not inside a capture
            self._sinusoid_rows(capacity, out[0].k)
        return out


def residual_pass(layers, x: torch.Tensor, states: list, method: str, start: int = 0) -> torch.Tensor:
    """x through pre-norm residual layers (``models.common.PreNormResidual``: x + mixer(norm x)),
    each mixer called as ``method(norm(x), states[start + i]) -> (y, state)`` ("step": x is
    (batch, d_model); "forward_with_state": (batch, length, d_model)) and its state put back
    into ``states`` in place: one pass over the layers, no container rebuilt per token. The
    dropout module is skipped outside training (it is the identity there)."""
    for i, layer in enumerate(layers):
        y, states[start + i] = getattr(layer.mixer, method)(layer.norm(x), states[start + i])
        x = x + (layer.dropout(y) if layer.training else y)
    return x


def stack_step(stack: ResidualStack, x: torch.Tensor, state: list, method: str = "step") -> tuple[torch.Tensor, list]:
    """A ResidualStack's decoding pass (``models.common.stack_with_state``'s, with the
    per-layer states replaced in ``state`` itself, the same list returned): each layer's
    mixer carries its state (a KV cache, a recurrent state, ``()`` for an MLP), the
    channel mixers after each (position-wise) run as they are, then the final norm."""
    mlps = stack.mlps
    if mlps is None:
        x = residual_pass(stack.layers, x, state, method)
    else:
        for i, layer in enumerate(stack.layers):
            x = mlps[i](residual_pass((layer,), x, state, method, i))
    return stack.norm_f(x), state
