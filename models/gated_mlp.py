"""A token-wise gated MLP backbone: it mixes NO positions, by design.

    GatedMLP(x) = W3 [ (W1 x) * SiLU(W2 x) ]        (the SwiGLU feed-forward, Shazeer 2020)

    x -> n_layers x [ x + GatedMLP_i(norm_i(x)) ] -> final norm

Each output position is a function of the input at that position only, so the model is
trivially causal and cannot solve any task that needs information from other positions
(copying, recall): it is the "no sequence mixing" control in a comparison. Not to be confused
with gMLP (Liu et al. 2021), whose spatial gating unit does mix positions. The GatedMLP
module itself is models/common.py's (every stack's ``channel_mixer="swiglu"`` uses it).
"""
from __future__ import annotations

from models.common import GatedMLP, ResidualStack

__all__ = ["GatedMLP", "GatedMLPBackbone"]  # GatedMLP is common's (ResidualStack's SwiGLU), used here


class GatedMLPBackbone(ResidualStack):
    """Pre-norm residual stack of token-wise gated MLPs; recurrent state size 0."""

    def __init__(self, d_model: int, n_layers: int, mult: float = 2.0, bias: bool = False,
                 norm: str = "rms", dropout: float = 0.0):
        if mult <= 0:
            raise ValueError(f"mult must be > 0, got {mult}")
        super().__init__(d_model, n_layers, lambda i: GatedMLP(d_model, mult, bias),
                         norm=norm, dropout=dropout)
