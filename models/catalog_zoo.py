"""Registry entries for attention, recurrent, convolutional and S4-family models, blocks and hybrids."""
from __future__ import annotations

from models.registry import register


@register(
    "transformer",
    "Causal Transformer: pre-norm multi-head attention + GELU MLP; positions absolute (default), learned, rope, xpos or none",
    family="attention",
)
def transformer(d_model: int, n_layers: int, n_heads: int = 4, pos: str = "absolute",
                mlp_mult: int = 4, dropout: float = 0.0, norm: str = "layer",
                max_len: int = 4096):
    from models.transformer import Transformer

    return Transformer(d_model, n_layers, n_heads=n_heads, pos=pos, mlp_mult=mlp_mult,
                       dropout=dropout, norm=norm, max_len=max_len)


@register(
    "lstm",
    "Stacked LSTM: pre-norm residual single-layer LSTMs of hidden d_model; recurrent state 2*d_model per layer",
    family="rnn",
)
def lstm(d_model: int, n_layers: int, norm: str = "rms", dropout: float = 0.0):
    from models.lstm import LSTMBackbone

    return LSTMBackbone(d_model, n_layers, norm=norm, dropout=dropout)
