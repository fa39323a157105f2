"""Registry entries for the linear-RNN family (issues 21, 35): GLA, RetNet, linear attention,
DeltaNet, Gated DeltaNet, Gated DeltaProduct, KDA and RWKV-7 mixers (models/linear_rnn/) in a
pre-norm residual ``RecurrentStack``.

Every entry takes ``n_heads``, ``backend`` ("auto" | "torch" | "ref" | "fla" | "cpu"), ``chunk_size``
(the torch backend's chunk), ``channel_mixer`` ("none" | "swiglu": a pre-norm residual
SwiGLU after each mixer, the Llama-style block of the fla models), ``mlp_mult``, ``norm``
and ``dropout``, and has a fixed-size recurrent state (``state_size()``), so it streams
(``models.ssm.mamba.stream``) and steps token by token. The options several entries share
are written once, in groups (OPERATOR, SHORT_CONV, DELTA, STACK); each entry lists its
mixer's own and names the groups it takes (``_entry``, which also gives every entry the
family "linear-rnn" and the init below).

Default init "torch" (PyTorch's fan-in scaled Linear init), not fla's ``_init_weights``
(N(0, 0.02), scheme "hf"): 0.02 is sized for fla's widths of 1024 and more. At d_model 64 it
makes the swish output gates silu(x W_g) ~ 0.08, and Gated DeltaNet stayed at chance on
MQAR (L 64, 4 pairs) for 625 steps where DeltaNet, without that gate, reached 0.98; with
"torch" its loss leaves chance within 300 steps and GLA's falls 2.4 vs 3.6 (loss after 300
steps, lr 3e-3, batch 32, `init_scheme` set in the profile either way). A profile can still
ask for "hf". A_log / dt_bias are not Linear parameters and keep their own init.
"""
from __future__ import annotations

import inspect

from models.ssm.mamba import RecurrentStack
from models.registry import register

_P = inspect.Parameter


def _group(*options: tuple[str, object, str]) -> tuple[inspect.Parameter, ...]:
    """Keyword options (name, default, annotation as the registry reads it)."""
    return tuple(_P(name, _P.KEYWORD_ONLY, default=d, annotation=a) for name, d, a in options)


# Options several entries take, each group written once; an entry takes all of a group.
OPERATOR = _group(("chunk_size", None, "int | None"), ("backend", "auto", "str"))   # every entry
SHORT_CONV = _group(("use_short_conv", True, "bool"), ("conv_size", 4, "int"))
DELTA = _group(("num_v_heads", None, "int | None"), ("allow_neg_eigval", False, "bool"))
STACK = _group(("channel_mixer", "none", "str"), ("mlp_mult", 2.0, "float"),        # every entry;
               ("norm", "rms", "str"), ("dropout", 0.0, "float"))                 # the stack's


def _entry(name: str, description: str, *groups: tuple[inspect.Parameter, ...]):
    """Decorator: registers ``_stacked(*groups)(mixer)`` as model ``name``, family
    "linear-rnn", init "torch" (every entry here; why "torch": the module docstring)."""
    def deco(mixer):
        factory = _stacked(*groups)(mixer)
        return register(name, description, family="linear-rnn", init="torch")(factory)

    return deco


def _stacked(*groups: tuple[inspect.Parameter, ...]):
    """Decorator: an entry's factory from a function ``mixer(d_model, n_layers, <the mixer's own
    options>)`` that returns the mixer's class (imported there, when a model is built). The
    factory's signature, against which the registry checks options and reads their defaults,
    is that function's followed by the options of ``groups``, OPERATOR and STACK; it builds a
    pre-norm residual RecurrentStack of n_layers mixers, passing STACK's options to the stack
    and every other option to the mixer under its own name."""
    def deco(mixer):
        own = inspect.signature(mixer)
        extra = [p for group in (*groups, OPERATOR, STACK) for p in group]
        signature = own.replace(parameters=[*own.parameters.values(), *extra],
                                return_annotation="RecurrentStack")

        def factory(*args, **kwargs) -> RecurrentStack:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            options = dict(bound.arguments)
            cls = mixer(**{k: options[k] for k in own.parameters})
            d_model, n_layers = options.pop("d_model"), options.pop("n_layers")
            stack = {p.name: options.pop(p.name) for p in STACK}
            return RecurrentStack(d_model, n_layers, lambda i: cls(d_model, **options), **stack)

        factory.__signature__ = signature
        factory.__name__, factory.__qualname__, factory.__doc__ = mixer.__name__, mixer.__qualname__, mixer.__doc__
        return factory

    return deco


@_entry("gla", "Gated Linear Attention (Yang et al. 2024): low-rank data-dependent decay per key "
               "channel, swish-gated RMS norm; fla layers/gla.py")
def build_gla(d_model: int, n_layers: int, n_heads: int = 4, expand_k: float = 0.5,
              expand_v: float = 1.0, gate_low_rank_dim: int = 16, gate_logit_normalizer: float = 16.0):
    from models.linear_rnn.linear_mixers import GatedLinearAttention
    return GatedLinearAttention


@_entry("retnet", "RetNet multi-scale retention (Sun et al. 2023): fixed decay 1-2^(-5-h) per head, "
                  "RoPE, GroupNorm, swish gate; fla layers/multiscale_retention.py")
def build_retnet(d_model: int, n_layers: int, n_heads: int = 4, expand_k: float = 1.0,
                 expand_v: float = 2.0, rope_base: float = 10000.0):
    from models.linear_rnn.linear_mixers import MultiScaleRetention
    return MultiScaleRetention


@_entry("linear_attention", "Linear attention (Katharopoulos et al. 2020): elu+1 (or identity) "
                            "features, q.sum(k) normaliser; fla layers/linear_attn.py")
def build_linear_attention(d_model: int, n_layers: int, n_heads: int = 4, expand_k: float = 1.0,
                           expand_v: float = 1.0, feature_map: str = "elu+1", normalize: bool = True,
                           output_norm: str = "none"):
    from models.linear_rnn.linear_mixers import LinearAttention
    return LinearAttention


@_entry("deltanet", "DeltaNet (Schlag et al. 2021; chunked, Yang et al. 2024): delta rule, short "
                    "conv, L2 q/k, sigmoid beta (allow_neg_eigval: 2 sigmoid, Grazzi et al. "
                    "2025), num_v_heads; fla layers/delta_net.py",
        SHORT_CONV, DELTA)
def build_deltanet(d_model: int, n_layers: int, n_heads: int = 4, expand_k: float = 1.0,
                   expand_v: float = 1.0):
    from models.linear_rnn.delta_mixers import DeltaNet
    return DeltaNet


@_entry("gated_deltanet", "Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025): delta rule + Mamba-2 "
                          "decay, short conv, gated RMS norm, allow_neg_eigval, num_v_heads "
                          "(Qwen3-Next GVA); fla layers/gated_deltanet.py",
        SHORT_CONV, DELTA)
def build_gated_deltanet(d_model: int, n_layers: int, n_heads: int = 4, expand_k: float = 0.75,
                         expand_v: float = 1.5):
    from models.linear_rnn.delta_mixers import GatedDeltaNet
    return GatedDeltaNet


@_entry("gated_deltaproduct", "Gated DeltaProduct (Siems et al. 2025): num_householder delta-rule "
                              "(Householder) steps per token + Mamba-2 decay, allow_neg_eigval, "
                              "num_v_heads; fla layers/gated_deltaproduct.py",
        SHORT_CONV, DELTA)
def build_gated_deltaproduct(d_model: int, n_layers: int, n_heads: int = 4, expand_k: float = 0.75,
                             expand_v: float = 1.5, num_householder: int = 2,
                             use_forget_gate: bool = True):
    from models.linear_rnn.delta_mixers import GatedDeltaProduct
    return GatedDeltaProduct


@_entry("kda", "Kimi Delta Attention (Kimi Linear, Moonshot AI 2025): Gated DeltaNet with a decay "
               "per key channel, low-rank sigmoid output gate, allow_neg_eigval, num_v_heads; "
               "fla layers/kda.py, ops/kda",
        SHORT_CONV, DELTA)
def build_kda(d_model: int, n_layers: int, n_heads: int = 4, expand_k: float = 1.0,
              expand_v: float = 1.0):
    from models.linear_rnn.dplr_mixers import KimiDeltaAttention
    return KimiDeltaAttention


@_entry("rwkv7", "RWKV-7 \"Goose\" (Peng et al. 2025): generalised delta rule, vector decay, "
                 "in-context learning rate, token shift (no value residual); fla layers/rwkv7.py, "
                 "BlinkDL/RWKV-LM")
def build_rwkv7(d_model: int, n_layers: int, n_heads: int = 4, decay_low_rank_dim: int = 16,
                a_low_rank_dim: int = 16, gate_low_rank_dim: int = 32):
    from models.linear_rnn.dplr_mixers import RWKV7Attention
    return RWKV7Attention
