"""A hybrid stitched from two pretrained checkpoints: GPT-Neo and Mamba side by side (issue 11).

    h = wte(tokens) + wpe(positions)               GPT-Neo's embeddings (and its tokenizer)
    for block i in 0 .. n-1                        n = GPT-Neo's layer count (12 for 125M)
        s_T, s_M = Split_i(h)                      models.hybrid.projectors: null / res / gres / gres-soft
        y_T = GPT-Neo layer i (s_T)
        y_M = Mamba layers k*i .. k*i+k-1 (s_M)    k = mamba_per_block (2: Mamba-130M has 24)
        h = Combine_i(y_T, y_M)
    -> GPT-Neo's final LayerNorm

The structure of sadmankiba/hybrid-model's hybrid (see models/hybrid/hybrid_parallel.py) over
pretrained layers; both checkpoints must have the same width (768 for GPT-Neo 125M and
Mamba 130M). GPT-Neo's final norm closes the stack (a pretrained norm for the pooled
readout; the from-scratch reference had none). The splitters and combiners are new and
always train; ``train_mode`` (``full`` / ``freeze`` / ``lora``) applies to the
pretrained layers.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from models.pretrained import CheckpointError, HFCausalLMBackbone, mamba_from_checkpoint
from models.hybrid.projectors import Combiner, Splitter


class StitchedHybrid(nn.Module):
    """(batch, length, d) -> (batch, length, d); ``token_embedding`` is GPT-Neo's."""

    def __init__(self, gptneo_path: str, mamba_path: str, projector: str = "gres",
                 mamba_per_block: int = 2, backend: str = "auto"):
        super().__init__()
        neo = HFCausalLMBackbone(gptneo_path).model
        if getattr(neo.config, "model_type", "") != "gpt_neo":
            raise CheckpointError(f"{gptneo_path}: model_type {neo.config.model_type!r}; the "
                                  "stitched hybrid takes a GPT-Neo checkpoint as gptneo_path")
        mamba = mamba_from_checkpoint(mamba_path, backend=backend)
        d = int(neo.config.hidden_size)
        if mamba.d_model != d:
            raise CheckpointError(f"widths differ: GPT-Neo {d}, Mamba {mamba.d_model}; the "
                                  "stitched hybrid needs checkpoints of one width")
        n = len(neo.h)
        if mamba_per_block < 1 or len(mamba.layers) < n * mamba_per_block:
            raise CheckpointError(f"{n} GPT-Neo layers x {mamba_per_block} Mamba layers per block "
                                  f"need {n * mamba_per_block} Mamba layers; {mamba_path} has "
                                  f"{len(mamba.layers)}")
        self.d_model, self.checkpoint = d, f"{gptneo_path} + {mamba_path}"
        self.token_embedding, self.pos_emb, self.norm_f = neo.wte, neo.wpe, neo.ln_f
        self.attn_layers = nn.ModuleList(neo.h)
        self.mamba_layers = nn.ModuleList(
            nn.Sequential(*mamba.layers[i * mamba_per_block:(i + 1) * mamba_per_block])
            for i in range(n))
        self.splitters = nn.ModuleList(Splitter(projector, d) for _ in range(n))
        self.combiners = nn.ModuleList(Combiner(projector, d) for _ in range(n))
        self.backend = mamba.backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        h = x + self.pos_emb(torch.arange(length, device=x.device))[None].to(x.dtype)
        for split, attn, mamba, combine in zip(self.splitters, self.attn_layers,
                                               self.mamba_layers, self.combiners):
            s_t, s_m = split(h)
            y_t = attn(s_t)
            y_t = y_t[0] if isinstance(y_t, tuple) else y_t
            h = combine([y_t, mamba(s_m)])
        return self.norm_f(h)

    def state_size(self) -> None:
        return None

    def projector_parameters(self):
        yield from self.splitters.parameters()
        yield from self.combiners.parameters()
