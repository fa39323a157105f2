"""Registry entries for attention, recurrent, convolutional and S4-family models, blocks and hybrids.

The entries: ``transformer``, ``sliding_window_attention``, ``forgetting_transformer``,
``lstm``, ``gated_mlp``, ``hybrid``, ``hybrid_parallel``, ``mambaformer``, ``interleaved``,
``based`` (the rest are in the other ``catalog_*`` modules).
"""
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
    from models.attention.transformer import Transformer

    return Transformer(d_model, n_layers, n_heads=n_heads, pos=pos, mlp_mult=mlp_mult,
                       dropout=dropout, norm=norm, max_len=max_len, attn_scale=attn_scale)


@register(
    "lstm",
    "Stacked LSTM: pre-norm residual single-layer LSTMs of hidden d_model; recurrent state 2*d_model per layer",
    family="rnn",
)
def lstm(d_model: int, n_layers: int, norm: str = "rms", dropout: float = 0.0):
    from models.rnn.lstm import LSTMBackbone

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
    "Transformer and recurrent (mamba default; recurrent=mamba2/gla/retnet/...) branches side by side per block, split then combined (null/res/gated-res)",
    family="hybrid",
)
def hybrid(d_model: int, n_layers: int, t_layers: int = 1, m_layers: int = 1,
           combiner: str = "gated-res", split: str = "same", split_ratio: float = 0.5,
           n_heads: int = 4, pos: str = "rope", mlp_mult: int = 4, d_state: int = 16,
           d_conv: int = 4, expand: int = 2, backend: str = "auto", norm: str = "rms",
           dropout: float = 0.0, recurrent: str = "mamba", channel_mixer: str = "none"):
    """``recurrent``: the recurrent branch, one of models.hybrid.hybrid_pattern.RECURRENT_NAMES
    (mamba, mamba2, gla, retnet, linear_attention, deltanet, gated_deltanet, based);
    d_state / d_conv / expand are Mamba's (another kind gets them only if changed, and then
    must take them). ``channel_mixer="swiglu"``: a SwiGLU (hidden mlp_mult * d_model) after
    each block."""
    from models.hybrid.hybrid import Hybrid

    return Hybrid(d_model, n_layers, t_layers=t_layers, m_layers=m_layers, combiner=combiner,
                  split=split, split_ratio=split_ratio, n_heads=n_heads, pos=pos,
                  mlp_mult=mlp_mult, norm=norm, dropout=dropout,
                  mamba_kwargs=dict(d_state=d_state, d_conv=d_conv, expand=expand,
                                    backend=backend),
                  recurrent=recurrent, channel_mixer=channel_mixer)


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
    from models.hybrid.hybrid_parallel import ParallelHybrid

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
    from models.hybrid.hybrid import MambaFormer

    return MambaFormer(d_model, n_layers, n_heads=n_heads, norm=norm, dropout=dropout,
                       mamba_kwargs=dict(d_state=d_state, d_conv=d_conv, expand=expand,
                                         backend=backend))


@register(
    "sliding_window_attention",
    "Sliding-window causal attention (t sees t-window+1..t; RoPE), O(L*window) memory, fixed state: "
    "the last window-1 keys/values (Longformer, Mistral, Based)",
    family="attention",
)
def sliding_window_attention(d_model: int, n_layers: int, n_heads: int = 4, window: int = 64,
                             pos: str = "rope", channel_mixer: str = "none",
                             mlp_mult: float = 2.0, norm: str = "rms", dropout: float = 0.0,
                             backend: str = "auto"):
    """Pre-norm residual stack of models.attention.sliding_window.SlidingWindowAttention; recurrent
    (step / forward_with_state / forward_chunked), state 2 * (window - 1) * d_model + 1 per layer."""
    from models.ssm.mamba import RecurrentStack
    from models.attention.sliding_window import SlidingWindowAttention

    return RecurrentStack(
        d_model, n_layers,
        lambda i: SlidingWindowAttention(d_model, n_heads=n_heads, window=window, pos=pos,
                                         backend=backend),
        norm=norm, dropout=dropout, channel_mixer=channel_mixer, mlp_mult=mlp_mult,
    )


@register(
    "forgetting_transformer",
    "Forgetting Transformer (FoX; Lin et al., ICLR 2025; zhixuan-lin/forgetting-transformer, fla "
    "forgetting_attn): softmax attention + per-head forget-gate decay bias; KV cache state",
    family="attention",
)
def forgetting_transformer(d_model: int, n_layers: int, n_heads: int = 4, channel_mixer: str = "swiglu",
                           mlp_mult: float = 2.0, norm: str = "rms", dropout: float = 0.0,
                           backend: str = "auto"):
    """Pre-norm residual stack of models.attention.forgetting_attention.ForgettingAttention, each
    followed by a SwiGLU MLP (the paper's LLaMA-style blocks, RMSNorm); ``backend``: auto
    (fla's parallel_forgetting_attn on CUDA when installed, the C kernel on a CPU when it
    builds, else torch), torch (shift-trick fused SDPA), cpu, ref, fla.
    Parameters per layer: 4 d^2 + (d + 1) n_heads + the MLP's and norms'."""
    from models.attention.forgetting_attention import ForgettingAttention
    from models.ssm.mamba import RecurrentStack   # a ResidualStack that also decodes (init_state / step)

    return RecurrentStack(d_model, n_layers,
                          lambda i: ForgettingAttention(d_model, n_heads=n_heads, dropout=dropout, backend=backend),
                          norm=norm, dropout=dropout, channel_mixer=channel_mixer, mlp_mult=mlp_mult)


BASED_CODES = "CBW"


@register(
    "based",
    "Based (Arora et al. 2024, zoology): layers cycle pattern CBW = BaseConv(k=3), Taylor linear attention, "
    "sliding window (64); n_layers 2 = zoology's MQAR Based",
    family="linear-rnn",
)
def based(d_model: int, n_layers: int, pattern: str = "CBW", n_heads: int = 1,
          feature_dim: int = 16, window: int = 64, pos: str = "rope", kernel_size: int = 3,
          channel_mixer: str = "none", mlp_mult: float = 2.0, norm: str = "layer",
          dropout: float = 0.0, backend: str = "auto"):
    """The Based stack as zoology builds it: layer i is ``pattern[i % len(pattern)]``, as
    zoology's ``Hybrid`` mixer cycles its configs over layers: C = BaseConv (short gated
    conv, kernel ``kernel_size``), B = BasedLinearAttention (``feature_dim`` 16, Taylor
    features), W = SlidingWindowAttention (``window`` keys, ``pos``). zoology's MQAR Figure 2
    Based is n_layers 2, "CB", 1 head, LayerNorm, no MLP (its state mixer is Identity): the
    defaults at n_layers 2. Its Based+sliding ablation (02-01_sliding.py) is n_layers 3, "CBW".
    The Based LMs (HazyResearch/based, based-360m.yaml) use "CBWCC" with SwiGLU MLPs
    (channel_mixer="swiglu") and a 64-token window (flash-attn window (64, 0)). zoology's
    SlidingAttn sees block_size + 1 keys: its block_size b is window b + 1 here."""
    from models.hybrid.hybrid_pattern import build_interleaved

    bad = [c for c in pattern if c not in BASED_CODES]
    if not pattern or bad:
        raise ValueError(f"based: pattern {pattern!r} may use only C (BaseConv), B (Based linear "
                         f"attention), W (sliding window attention); bad: {', '.join(map(repr, bad)) or 'empty'}")
    return build_interleaved(
        d_model, n_layers, pattern=pattern, n_heads=n_heads, window=window, pos=pos,
        channel_mixer=channel_mixer, mlp_mult=mlp_mult, norm=norm, dropout=dropout,
        backend=backend,
        mixer_options={"B": {"feature_dim": feature_dim}, "C": {"kernel_size": kernel_size}},
    )


@register(
    "interleaved",
    "Interleaved hybrid (Jamba, Lieber et al. 2024; Samba, Ren et al. 2024): layer pattern of mixer codes "
    "(MMA = Mamba, Mamba, attention) + SwiGLU",
    family="hybrid",
)
def interleaved(d_model: int, n_layers: int, pattern: str = "MMA", n_heads: int = 4,
                window: int = 64, pos: str = "rope", channel_mixer: str = "swiglu",
                mlp_mult: float = 2.0, norm: str = "rms", dropout: float = 0.0,
                backend: str = "auto"):
    """``pattern`` is repeated / truncated to n_layers; codes A attention, W sliding window,
    M mamba, 2 mamba2, G gla, R retnet, L linear attention, B based, D deltanet, N gated
    deltanet, C BaseConv (models.hybrid.hybrid_pattern). Recurrent (fixed state) unless an A layer
    is present."""
    from models.hybrid.hybrid_pattern import build_interleaved

    return build_interleaved(d_model, n_layers, pattern=pattern, n_heads=n_heads, window=window,
                             pos=pos, channel_mixer=channel_mixer, mlp_mult=mlp_mult, norm=norm,
                             dropout=dropout, backend=backend)
