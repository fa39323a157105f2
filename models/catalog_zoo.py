"""Registry entries for attention, recurrent, convolutional and S4-family models, blocks and hybrids."""
from __future__ import annotations

from models.registry import register


@register(
    "transformer",
    "Causal Transformer: pre-norm multi-head attention + GELU MLP; positions absolute (default), learned, rope, xpos or none",
    family="attention",
    # PyTorch defaults: this Transformer's default shape (sinusoidal positions of amplitude
    # 1) has no single reference; GPT-Neo's init (init_scheme = "hf") belongs with its
    # learned N(0, 0.02) positions (pos = "learned"). With sinusoidal positions the 0.02
    # token embeddings drown and the learning tests stay at chance for 300 steps.
)
def transformer(d_model: int, n_layers: int, n_heads: int = 4, pos: str = "absolute",
                mlp_mult: int = 4, dropout: float = 0.0, norm: str = "layer",
                max_len: int = 4096, attn_scale: float | None = None):
    """``attn_scale``: score scale, default 1/sqrt(d_head); GPT-Neo's is 1.0."""
    from models.transformer import Transformer

    return Transformer(d_model, n_layers, n_heads=n_heads, pos=pos, mlp_mult=mlp_mult,
                       dropout=dropout, norm=norm, max_len=max_len, attn_scale=attn_scale)


@register(
    "lstm",
    "Stacked LSTM: pre-norm residual single-layer LSTMs of hidden d_model; recurrent state 2*d_model per layer",
    family="rnn",
)
def lstm(d_model: int, n_layers: int, norm: str = "rms", dropout: float = 0.0):
    from models.lstm import LSTMBackbone

    return LSTMBackbone(d_model, n_layers, norm=norm, dropout=dropout)


@register(
    "gated_mlp",
    "Token-wise gated MLP (W3[(W1 x)*SiLU(W2 x)]) residual stack; mixes NO positions (control: cannot copy)",
    family="mlp",
)
def gated_mlp(d_model: int, n_layers: int, mult: float = 2.0, bias: bool = False,
              norm: str = "rms", dropout: float = 0.0):
    from models.gated_mlp import GatedMLPBackbone

    return GatedMLPBackbone(d_model, n_layers, mult=mult, bias=bias, norm=norm, dropout=dropout)


@register(
    "hybrid",
    "Transformer and Mamba branches side by side in each block (t_layers/m_layers), split then combined (null/res/gated-res)",
    family="hybrid",
)
def hybrid(d_model: int, n_layers: int, t_layers: int = 1, m_layers: int = 1,
           combiner: str = "gated-res", split: str = "same", split_ratio: float = 0.5,
           n_heads: int = 4, pos: str = "rope", mlp_mult: int = 4, d_state: int = 16,
           d_conv: int = 4, expand: int = 2, backend: str = "auto", norm: str = "rms",
           dropout: float = 0.0):
    from models.hybrid import Hybrid

    return Hybrid(d_model, n_layers, t_layers=t_layers, m_layers=m_layers, combiner=combiner,
                  split=split, split_ratio=split_ratio, n_heads=n_heads, pos=pos,
                  mlp_mult=mlp_mult, norm=norm, dropout=dropout,
                  mamba_kwargs=dict(d_state=d_state, d_conv=d_conv, expand=expand,
                                    backend=backend))


@register(
    "hybrid_parallel",
    "GPT-Neo and Mamba branches side by side per block between projector split/combine (null/res/gres/gres-soft), "
    "block output replaces the stream (sadmankiba/hybrid-model)",
    family="hybrid",
    init="hf",  # the reference builds both branches from Hugging Face models
)
def hybrid_parallel(d_model: int, n_layers: int, t_layers: int = 1, m_layers: int = 1,
                    projector: str = "res", n_heads: int = 4, mlp_mult: int = 4,
                    attn_scale: float | None = 1.0, max_len: int = 2048, d_state: int = 16,
                    d_conv: int = 4, expand: int = 2, d_inner: int | None = None,
                    dt_rank="auto", backend: str = "auto"):
    """n_layers blocks; ``attn_scale`` 1.0 is GPT-Neo's (None: 1/sqrt(d_head))."""
    from models.hybrid_parallel import ParallelHybrid

    return ParallelHybrid(d_model, n_layers, t_layers=t_layers, m_layers=m_layers,
                          projector=projector, n_heads=n_heads, mlp_mult=mlp_mult,
                          attn_scale=attn_scale, max_len=max_len,
                          mamba_kwargs=dict(d_state=d_state, d_conv=d_conv, expand=expand,
                                            d_inner=d_inner, dt_rank=dt_rank, backend=backend))


@register(
    "mambaformer",
    "MambaFormer (Park et al. 2024): leading Mamba instead of positions, then alternating attention and Mamba layers",
    family="hybrid",
)
def mambaformer(d_model: int, n_layers: int, n_heads: int = 4, d_state: int = 16,
                d_conv: int = 4, expand: int = 2, backend: str = "auto", norm: str = "rms",
                dropout: float = 0.0):
    from models.hybrid import MambaFormer

    return MambaFormer(d_model, n_layers, n_heads=n_heads, norm=norm, dropout=dropout,
                       mamba_kwargs=dict(d_state=d_state, d_conv=d_conv, expand=expand,
                                         backend=backend))
