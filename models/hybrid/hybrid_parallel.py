"""GPT-Neo and Mamba side by side, as sadmankiba/hybrid-model builds its hybrid
(``hybrid/hybrid_model.py``; read for issue 10). Registry entry ``hybrid_parallel``.

    h = x + P                                      learned positions (GPT-Neo's wpe), P: (max_len, d)
    for each of n_layers blocks:
        s_T, s_M = Split(h)                        models.hybrid.projectors (null / res / gres / gres-soft)
        y_T = t_layers GPT-Neo layers (s_T)        each: h + Attn(LN h); h + MLP(LN h)
        y_M = m_layers Mamba layers (s_M)          each: h + Mamba(RMSNorm h)
        h = Combine(y_T, y_M)                      the block's output REPLACES the stream
    -> h                                           no final norm

Differences from the workbench's own ``hybrid`` (models.hybrid.hybrid): no residual or norm
around a block (the combiner's output is the next block's input), no final norm, learned
absolute positions at the input instead of RoPE, GPT-Neo's unscaled attention scores by
default (``attn_scale = 1.0``), LayerNorm in the attention branch and RMSNorm in the Mamba
branch (each as its own Hugging Face block has it), and the projector family above. The
Mamba branch takes ``d_inner`` / ``dt_rank`` (the published runs kept mamba-130m-hf's
1536 / 48). Decodes token by token (``init_state`` / ``forward_with_state`` / ``step``): per
block a list of its sub-layers' key/value caches (at most ``max_len`` positions, as the
position table) and Mamba states, updated in place. Not reproduced: GPT-Neo's tanh GELU and its attention-output bias.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from models.attention.attention import MLP, CacheFull, CausalSelfAttention
from models.attention.transformer import residual_pass
from models.common import PreNormResidual
from models.hybrid.projectors import Combiner, Splitter
from models.ssm.mamba import Mamba


class ParallelBlock(nn.Module):
    """Split -> (GPT-Neo branch, Mamba branch) -> combine. (batch, length, d) -> same."""

    def __init__(self, d_model: int, t_layers: int, m_layers: int, projector: str,
                 n_heads: int, mlp_mult: int, attn_scale: float | None, mamba_kwargs: dict):
        super().__init__()
        if t_layers < 1 or m_layers < 1:
            raise ValueError(f"t_layers and m_layers must be >= 1 (got {t_layers}, {m_layers})")
        self.split = Splitter(projector, d_model)
        layers: list[nn.Module] = []
        for _ in range(t_layers):
            layers.append(PreNormResidual(d_model, CausalSelfAttention(
                d_model, n_heads, pos="none", scale=attn_scale), "layer"))
            layers.append(PreNormResidual(d_model, MLP(d_model, mlp_mult), "layer"))
        self.attn_branch = nn.Sequential(*layers)
        self.mamba_branch = nn.Sequential(*(
            PreNormResidual(d_model, Mamba(d_model, **mamba_kwargs), "rms") for _ in range(m_layers)))
        self.combine = Combiner(projector, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s_t, s_m = self.split(x)
        return self.combine([self.attn_branch(s_t), self.mamba_branch(s_m)])

    def init_state(self, batch: int, capacity: int = 0, limit: int | None = None) -> list:
        """One entry per sub-layer: the GPT-Neo branch's (a key/value cache per attention
        layer, at most ``limit`` positions; ``()`` per MLP), then the Mamba states."""
        return [layer.mixer.init_state(batch, capacity, limit) if isinstance(layer.mixer, CausalSelfAttention)
                else layer.mixer.init_state(batch) for layer in (*self.attn_branch, *self.mamba_branch)]

    def decode(self, x: torch.Tensor, state: list, method: str) -> torch.Tensor:
        """x: (batch, d) with ``method`` "step" or (batch, length, d) with "forward_with_state"
        -> the block's output; ``state`` updated in place."""
        s_t, s_m = self.split(x)
        return self.combine([residual_pass(self.attn_branch, s_t, state, method),
                             residual_pass(self.mamba_branch, s_m, state, method, len(self.attn_branch))])


class ParallelHybrid(nn.Module):
    """(batch, length, d_model) -> (batch, length, d_model), causal; see the module doc."""

    def __init__(self, d_model: int, n_layers: int, t_layers: int = 1, m_layers: int = 1,
                 projector: str = "res", n_heads: int = 4, mlp_mult: int = 4,
                 attn_scale: float | None = 1.0, max_len: int = 2048,
                 mamba_kwargs: dict | None = None):
        super().__init__()
        if n_layers < 1:
            raise ValueError("n_layers must be >= 1")
        if n_heads < 1 or d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must be >= 1 and divide d_model={d_model}")
        self.d_model, self.max_len = d_model, max_len
        self.pos_emb = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        self.blocks = nn.ModuleList(
            ParallelBlock(d_model, t_layers, m_layers, projector, n_heads, mlp_mult, attn_scale,
                          dict(mamba_kwargs or {}))
            for _ in range(n_layers))

    @property
    def backend(self) -> str:
        return self.blocks[0].mamba_branch[0].mixer.backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        if length > self.max_len:
            raise ValueError(f"sequence length {length} exceeds max_len={self.max_len} "
                             "of the learned positions")
        h = x + self.pos_emb[:length].to(x.dtype)
        for block in self.blocks:
            h = block(h)
        return h

    def state_size(self) -> None:
        return None  # the attention branch's KV cache grows with length

    # -- decoding: per block the list of its sub-layers' caches and states, updated in place
    def init_state(self, batch: int, capacity: int = 0) -> list:
        return [block.init_state(batch, capacity, self.max_len) for block in self.blocks]

    def _decode(self, x: torch.Tensor, state: list, method: str) -> tuple[torch.Tensor, list]:
        n, length = state[0][0].length, (1 if method == "step" else x.shape[1])
        if n + length > self.max_len:
            raise CacheFull(f"position {n + length - 1:,} is past hybrid_parallel's max_len={self.max_len:,} "
                            f"(its learned positions): {n:,} cached + {length:,} new")
        h = x + self.pos_emb[n:n + length].to(x.dtype)[0 if method == "step" else slice(None)]
        for block, s in zip(self.blocks, state):
            h = block.decode(h, s, method)
        return h, state

    def forward_with_state(self, x: torch.Tensor, state: list) -> tuple[torch.Tensor, list]:
        """x: (batch, length, d_model) after the positions in ``state`` -> (y, state updated
        in place); the learned positions continue at the first attention cache's length."""
        return self._decode(x, state, "forward_with_state")

    def step(self, x_t: torch.Tensor, state: list) -> tuple[torch.Tensor, list]:
        """One token x_t: (batch, d_model) -> (y_t (batch, d_model), state one token on)."""
        return self._decode(x_t, state, "step")
