"""A token-wise gated MLP backbone: it mixes NO positions, by design.

    GatedMLP(x) = W3 [ (W1 x) * SiLU(W2 x) ]        (the SwiGLU feed-forward, Shazeer 2020)

    x -> n_layers x [ x + GatedMLP_i(norm_i(x)) ] -> final norm

Each output position is a function of the input at that position only, so the model is
trivially causal and cannot solve any task that needs information from other positions
(copying, recall): it is the "no sequence mixing" control in a comparison. Not to be confused
with gMLP (Liu et al. 2021), whose spatial gating unit does mix positions.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.common import ResidualStack


class GatedMLP(nn.Module):
    """(batch, length, d_model) -> (batch, length, d_model), position by position."""

    backend = "torch"

    def __init__(self, d_model: int, mult: float = 2.0, bias: bool = False):
        super().__init__()
        d_hidden = max(1, int(round(mult * d_model)))
        self.W1 = nn.Linear(d_model, d_hidden, bias=bias)   # value
        self.W2 = nn.Linear(d_model, d_hidden, bias=bias)   # gate
        self.W3 = nn.Linear(d_hidden, d_model, bias=bias)   # output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.W3(self.W1(x) * F.silu(self.W2(x)))

    def state_size(self) -> int:
        return 0  # nothing from earlier positions is needed to produce the next output


class GatedMLPBackbone(ResidualStack):
    """Pre-norm residual stack of token-wise gated MLPs; recurrent state size 0."""

    def __init__(self, d_model: int, n_layers: int, mult: float = 2.0, bias: bool = False,
                 norm: str = "rms", dropout: float = 0.0):
        if mult <= 0:
            raise ValueError(f"mult must be > 0, got {mult}")
        super().__init__(d_model, n_layers, lambda i: GatedMLP(d_model, mult, bias),
                         norm=norm, dropout=dropout)
