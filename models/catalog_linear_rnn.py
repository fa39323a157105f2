"""Registry entries for the linear-RNN family (issues 21, 35): GLA, RetNet, linear attention,
DeltaNet, Gated DeltaNet and Gated DeltaProduct mixers (``models.linear_rnn.linear_mixers``, ``models.linear_rnn.delta_mixers``) in a
pre-norm residual ``RecurrentStack``.

Every entry takes ``n_heads``, ``backend`` ("auto" | "torch" | "ref" | "fla" | "cpu"), ``chunk_size``
(the torch backend's chunk), ``channel_mixer`` ("none" | "swiglu": a pre-norm residual
SwiGLU after each mixer, the Llama-style block of the fla models), ``mlp_mult``, ``norm``
and ``dropout``, and has a fixed-size recurrent state (``state_size()``), so it streams
(``models.ssm.mamba.stream``) and steps token by token.

Default init "torch" (PyTorch's fan-in scaled Linear init), not fla's ``_init_weights``
(N(0, 0.02), scheme "hf"): 0.02 is sized for fla's widths of 1024 and more. At d_model 64 it
makes the swish output gates silu(x W_g) ~ 0.08, and Gated DeltaNet stayed at chance on
MQAR (L 64, 4 pairs) for 625 steps where DeltaNet, without that gate, reached 0.98; with
"torch" its loss leaves chance within 300 steps and GLA's falls 2.4 vs 3.6 (loss after 300
steps, lr 3e-3, batch 32, `init_scheme` set in the profile either way). A profile can still
ask for "hf". A_log / dt_bias are not Linear parameters and keep their own init.
"""
from __future__ import annotations

from models.ssm.mamba import RecurrentStack
from models.registry import register


def _stack(d_model, n_layers, make_mixer, norm, dropout, channel_mixer, mlp_mult):
    return RecurrentStack(d_model, n_layers, make_mixer, norm=norm, dropout=dropout,
                          channel_mixer=channel_mixer, mlp_mult=mlp_mult)


@register("gla", "Gated Linear Attention (Yang et al. 2024): low-rank data-dependent decay per key "
                 "channel, swish-gated RMS norm; fla layers/gla.py", family="linear-rnn", init="torch")
def build_gla(d_model: int, n_layers: int, n_heads: int = 4, expand_k: float = 0.5,
              expand_v: float = 1.0, gate_low_rank_dim: int = 16,
              gate_logit_normalizer: float = 16.0, chunk_size: int | None = None,
              backend: str = "auto", channel_mixer: str = "none", mlp_mult: float = 2.0,
              norm: str = "rms", dropout: float = 0.0) -> RecurrentStack:
    from models.linear_rnn.linear_mixers import GatedLinearAttention

    return _stack(d_model, n_layers, lambda i: GatedLinearAttention(
        d_model, n_heads=n_heads, expand_k=expand_k, expand_v=expand_v,
        gate_low_rank_dim=gate_low_rank_dim, gate_logit_normalizer=gate_logit_normalizer,
        backend=backend, chunk_size=chunk_size), norm, dropout, channel_mixer, mlp_mult)


@register("retnet", "RetNet multi-scale retention (Sun et al. 2023): fixed decay 1-2^(-5-h) per head, "
                    "RoPE, GroupNorm, swish gate; fla layers/multiscale_retention.py",
          family="linear-rnn", init="torch")
def build_retnet(d_model: int, n_layers: int, n_heads: int = 4, expand_k: float = 1.0,
                 expand_v: float = 2.0, rope_base: float = 10000.0, chunk_size: int | None = None,
                 backend: str = "auto", channel_mixer: str = "none", mlp_mult: float = 2.0,
                 norm: str = "rms", dropout: float = 0.0) -> RecurrentStack:
    from models.linear_rnn.linear_mixers import MultiScaleRetention

    return _stack(d_model, n_layers, lambda i: MultiScaleRetention(
        d_model, n_heads=n_heads, expand_k=expand_k, expand_v=expand_v, rope_base=rope_base,
        backend=backend, chunk_size=chunk_size), norm, dropout, channel_mixer, mlp_mult)


@register("linear_attention", "Linear attention (Katharopoulos et al. 2020): elu+1 (or identity) "
                              "features, q.sum(k) normaliser; fla layers/linear_attn.py",
          family="linear-rnn", init="torch")
def build_linear_attention(d_model: int, n_layers: int, n_heads: int = 4,
                           expand_k: float = 1.0, expand_v: float = 1.0,
                           feature_map: str = "elu+1", normalize: bool = True,
                           output_norm: str = "none", chunk_size: int | None = None,
                           backend: str = "auto", channel_mixer: str = "none",
                           mlp_mult: float = 2.0, norm: str = "rms",
                           dropout: float = 0.0) -> RecurrentStack:
    from models.linear_rnn.linear_mixers import LinearAttention

    return _stack(d_model, n_layers, lambda i: LinearAttention(
        d_model, n_heads=n_heads, expand_k=expand_k, expand_v=expand_v,
        feature_map=feature_map, normalize=normalize, output_norm=output_norm,
        backend=backend, chunk_size=chunk_size), norm, dropout, channel_mixer, mlp_mult)


@register("deltanet", "DeltaNet (Schlag et al. 2021; chunked, Yang et al. 2024): delta rule, short "
                      "conv, L2 q/k, sigmoid beta (allow_neg_eigval: 2 sigmoid, Grazzi et al. "
                      "2025), num_v_heads; fla layers/delta_net.py",
          family="linear-rnn", init="torch")
def build_deltanet(d_model: int, n_layers: int, n_heads: int = 4, expand_k: float = 1.0,
                   expand_v: float = 1.0, use_short_conv: bool = True, conv_size: int = 4,
                   chunk_size: int | None = None, backend: str = "auto", channel_mixer: str = "none",
                   mlp_mult: float = 2.0, norm: str = "rms", dropout: float = 0.0,
                   num_v_heads: int | None = None,
                   allow_neg_eigval: bool = False) -> RecurrentStack:
    from models.linear_rnn.linear_mixers import DeltaNet

    return _stack(d_model, n_layers, lambda i: DeltaNet(
        d_model, n_heads=n_heads, expand_k=expand_k, expand_v=expand_v,
        use_short_conv=use_short_conv, conv_size=conv_size, backend=backend,
        chunk_size=chunk_size, num_v_heads=num_v_heads, allow_neg_eigval=allow_neg_eigval),
        norm, dropout, channel_mixer, mlp_mult)


@register("gated_deltanet", "Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025): delta rule + Mamba-2 "
                            "decay, short conv, gated RMS norm, allow_neg_eigval, num_v_heads "
                            "(Qwen3-Next GVA); fla layers/gated_deltanet.py",
          family="linear-rnn", init="torch")
def build_gated_deltanet(d_model: int, n_layers: int, n_heads: int = 4,
                         expand_k: float = 0.75, expand_v: float = 1.5,
                         use_short_conv: bool = True, conv_size: int = 4,
                         chunk_size: int | None = None, backend: str = "auto",
                         channel_mixer: str = "none", mlp_mult: float = 2.0,
                         norm: str = "rms", dropout: float = 0.0,
                         num_v_heads: int | None = None,
                         allow_neg_eigval: bool = False) -> RecurrentStack:
    from models.linear_rnn.linear_mixers import GatedDeltaNet

    return _stack(d_model, n_layers, lambda i: GatedDeltaNet(
        d_model, n_heads=n_heads, expand_k=expand_k, expand_v=expand_v,
        use_short_conv=use_short_conv, conv_size=conv_size, backend=backend,
        chunk_size=chunk_size, num_v_heads=num_v_heads, allow_neg_eigval=allow_neg_eigval),
        norm, dropout, channel_mixer, mlp_mult)


@register("gated_deltaproduct", "Gated DeltaProduct (Siems et al. 2025): num_householder delta-rule "
                                "(Householder) steps per token + Mamba-2 decay, allow_neg_eigval, "
                                "num_v_heads; fla layers/gated_deltaproduct.py",
          family="linear-rnn", init="torch")
def build_gated_deltaproduct(d_model: int, n_layers: int, n_heads: int = 4,
                             expand_k: float = 0.75, expand_v: float = 1.5,
                             num_householder: int = 2, use_forget_gate: bool = True,
                             allow_neg_eigval: bool = False, num_v_heads: int | None = None,
                             use_short_conv: bool = True, conv_size: int = 4,
                             chunk_size: int | None = None, backend: str = "auto",
                             channel_mixer: str = "none", mlp_mult: float = 2.0,
                             norm: str = "rms", dropout: float = 0.0) -> RecurrentStack:
    from models.linear_rnn.linear_mixers import GatedDeltaProduct

    return _stack(d_model, n_layers, lambda i: GatedDeltaProduct(
        d_model, n_heads=n_heads, expand_k=expand_k, expand_v=expand_v,
        num_householder=num_householder, use_forget_gate=use_forget_gate,
        allow_neg_eigval=allow_neg_eigval, num_v_heads=num_v_heads,
        use_short_conv=use_short_conv, conv_size=conv_size, backend=backend,
        chunk_size=chunk_size), norm, dropout, channel_mixer, mlp_mult)


@register("kda", "Kimi Delta Attention (Kimi Linear, Moonshot AI 2025): Gated DeltaNet with a decay "
                 "per key channel, low-rank sigmoid output gate, allow_neg_eigval, num_v_heads; "
                 "fla layers/kda.py, ops/kda",
          family="linear-rnn", init="torch")
def build_kda(d_model: int, n_layers: int, n_heads: int = 4, expand_k: float = 1.0,
              expand_v: float = 1.0, use_short_conv: bool = True, conv_size: int = 4,
              chunk_size: int | None = None, backend: str = "auto", channel_mixer: str = "none",
              mlp_mult: float = 2.0, norm: str = "rms", dropout: float = 0.0,
              num_v_heads: int | None = None, allow_neg_eigval: bool = False) -> RecurrentStack:
    from models.linear_rnn.dplr_mixers import KimiDeltaAttention

    return _stack(d_model, n_layers, lambda i: KimiDeltaAttention(
        d_model, n_heads=n_heads, expand_k=expand_k, expand_v=expand_v,
        use_short_conv=use_short_conv, conv_size=conv_size, backend=backend,
        chunk_size=chunk_size, num_v_heads=num_v_heads, allow_neg_eigval=allow_neg_eigval),
        norm, dropout, channel_mixer, mlp_mult)


@register("rwkv7", "RWKV-7 \"Goose\" (Peng et al. 2025): generalised delta rule, vector decay, "
                   "in-context learning rate, token shift (no value residual); fla layers/rwkv7.py, "
                   "BlinkDL/RWKV-LM",
          family="linear-rnn", init="torch")
def build_rwkv7(d_model: int, n_layers: int, n_heads: int = 4, decay_low_rank_dim: int = 16,
                a_low_rank_dim: int = 16, gate_low_rank_dim: int = 32,
                chunk_size: int | None = None, backend: str = "auto",
                channel_mixer: str = "none", mlp_mult: float = 2.0, norm: str = "rms",
                dropout: float = 0.0) -> RecurrentStack:
    from models.linear_rnn.dplr_mixers import RWKV7Attention

    return _stack(d_model, n_layers, lambda i: RWKV7Attention(
        d_model, n_heads=n_heads, decay_low_rank_dim=decay_low_rank_dim,
        a_low_rank_dim=a_low_rank_dim, gate_low_rank_dim=gate_low_rank_dim, backend=backend,
        chunk_size=chunk_size), norm, dropout, channel_mixer, mlp_mult)
