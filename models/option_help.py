"""One line on every keyword option a registry entry takes, for people choosing values.

``models.entry(name).options()`` lists an entry's options and defaults (its factory's keyword
parameters); what each one *means* was written only in some factories' docstrings, so a
form listing a mixer's options showed ``num_householder = 2`` with nothing beside it. This
module is where those meanings live, read from the factories and mixers (and the papers
they implement), kept apart from the model code so that the models need no change:

- :data:`HELP`: an option name -> its meaning, for names whose meaning is the same in every
  entry that takes them (``n_heads``, ``d_conv``, ``dropout``, ...);
- :data:`FOR_ENTRY`: (entry, option) -> its meaning where an entry gives a shared name a
  meaning of its own (``pattern`` of ``based`` vs ``interleaved``) or a name is its alone.

:func:`option_help` answers for one entry and option; :func:`undocumented` lists the options
of the registry that neither table explains (tests/models/test_model_option_help.py keeps it
empty, so a new option cannot ship without a line here). Each line is at most
:data:`MAX_LEN` characters: it is shown on one line beside ``name = default``.
"""
from __future__ import annotations

import models

MAX_LEN = 70

HELP: dict[str, str] = {
    # widths, heads, state
    "n_heads": "heads per layer",
    "num_v_heads": "value heads (grouped value attention); none: n_heads",
    "headdim": "head size (channels per head)",
    "ngroups": "groups of heads that share one B and C (Mamba-2's ngroups)",
    "d_state": "state size per channel",
    "d_inner": "mixer width; none: expand * d_model",
    "expand": "inner width = expand * d_model",
    "expand_k": "key width = expand_k * d_model",
    "expand_v": "value width = expand_v * d_model",
    "mlp_mult": "MLP width = mlp_mult * d_model",
    "mult": "hidden width of the gated MLP = mult * d_model",
    "channel_mixer": "MLP after each mixer: none or swiglu",
    "norm": "normalisation layer: rms or layer",
    "dropout": "dropout probability",
    "bias": "bias in the input and output projections",
    # short convolutions
    "d_conv": "short causal convolution width",
    "conv_size": "short causal convolution width",
    "conv_bias": "bias in the short causal convolution",
    "use_short_conv": "short causal convolution on q, k, v before the mixer",
    # kernels
    "backend": "kernel implementation (auto picks one that runs here)",
    "chunk_size": "chunk length of the chunked kernel; none: its default",
    # step size and decay (S4/Mamba families)
    "dt_rank": "rank of the step size projection (auto: ceil(d_model / 16))",
    "dt_min": "smallest initial step size",
    "dt_max": "largest initial step size",
    "dt_init_floor": "initial step sizes are clamped to at least this",
    # linear RNNs
    "allow_neg_eigval": "negative state-transition eigenvalues (Grazzi et al. 2025)",
    "gate_low_rank_dim": "rank of the low-rank projection that makes the gate",
    "num_householder": "delta-rule (Householder) steps per token (DeltaProduct's n_h)",
    "use_forget_gate": "a data-dependent decay of the state (Gated DeltaProduct)",
    # attention
    "attn_scale": "attention score scale; none: 1/sqrt(head size)",
    "max_len": "most positions: a learned table's length and the key/value cache's",
    "pos": "position encoding: rope, xpos or none (transformer: absolute, learned)",
    "window": "sliding attention window (keys each query sees)",
    # hybrids
    "t_layers": "Transformer (attention) layers in each block's attention branch",
    "m_layers": "recurrent layers in each block's recurrent branch",
    "projector": "how the input is split into and the branches merged back",
    # pretrained checkpoints
    "path": "Hugging Face checkpoint folder to load",
    "train_mode": "full: fine-tune all; freeze: only the task head; lora: adapters",
    "lora_r": "rank of the LoRA adapters (train_mode lora)",
    "lora_alpha": "LoRA scale numerator (update scaled by lora_alpha / lora_r)",
    "lora_dropout": "dropout on the LoRA adapters' input",
    "lora_targets": "Linear modules that get adapters; none: the model type's own",
}

FOR_ENTRY: dict[tuple[str, str], str] = {
    # mamba3
    ("mamba3", "A_floor"): "decay rate A is clamped to <= -A_floor (never a frozen state)",
    ("mamba3", "complex_state"): "rotate the state by data-dependent angles (false: real)",
    ("mamba3", "rope_fraction"): "fraction of the state channels rotated (0.5 or 1.0)",
    ("mamba3", "mimo_rank"): "rank of the multi-input multi-output state update (1: SISO)",
    ("mamba3", "outproj_norm"): "RMSNorm each head's output before the z gate",
    # rwkv7
    ("rwkv7", "decay_low_rank_dim"): "rank of the LoRA that makes the data-dependent decay w",
    ("rwkv7", "a_low_rank_dim"): "rank of the LoRA that makes the in-context learning rate a",
    ("rwkv7", "gate_low_rank_dim"): "rank of the LoRA that makes the output gate g",
    # gla
    ("gla", "gate_logit_normalizer"): "log-sigmoid gate divided by this (slower forgetting)",
    # linear attention
    ("linear_attention", "feature_map"): "feature map on q and k: elu+1 or identity",
    ("linear_attention", "normalize"): "divide by the sum of the keys' features (attention's denominator)",
    ("linear_attention", "output_norm"): "norm on each head's output: none or rms",
    # retnet
    ("retnet", "rope_base"): "base of the rotary position angles",
    # S4 family
    ("s4", "learn_AB"): "train the HiPPO state matrices A and B (false: fixed)",
    ("s4d", "init"): "diagonal A initialisation: lin, inv, real or legs (S4D paper)",
    ("s4d", "disc"): "discretisation: zoh or bilinear",
    ("s4d", "kernel_mode"): "kernel computation: split (low memory) or naive",
    ("s4_dplr", "disc"): "discretisation: zoh or bilinear",
    ("s4_dplr", "freq_chunk"): "frequencies per chunk of the Cauchy kernel (bounds memory)",
    # hyena
    ("hyena", "order"): "Hyena order: long convolutions and gates per layer",
    ("hyena", "short_width"): "width of the short convolution on the projections",
    ("hyena", "filter_width"): "hidden width of the MLP that makes the long filters",
    ("hyena", "emb_dim"): "positional features fed to the filter MLP (odd, >= 3)",
    ("hyena", "l_max"): "length that normalises the filters' decay window",
    # based / interleaved
    ("based", "pattern"): "layer codes cycled over layers: C BaseConv, B Based, W window",
    ("based", "feature_dim"): "feature size of the Taylor linear attention's q and k",
    ("based", "kernel_size"): "width of BaseConv's short convolution",
    ("interleaved", "pattern"): "layer codes, repeated to n_layers: A attention, M Mamba, ...",
    # hybrid (parallel branches)
    ("hybrid", "recurrent"): "the recurrent branch's layer: mamba, mamba2, gla, retnet, ...",
    ("hybrid", "combiner"): "how the branches are merged: null, res or gated-res",
    ("hybrid", "split"): "same: both branches see the whole input; linear: split in two",
    ("hybrid", "split_ratio"): "with split linear: attention branch width / d_model",
    # H3 family
    ("h3", "shift_size"): "state size of the shift SSM on the keys",
    # stitched checkpoints
    ("pretrained_hybrid", "gptneo_path"): "GPT-Neo checkpoint folder",
    ("pretrained_hybrid", "mamba_path"): "Mamba checkpoint folder",
    ("pretrained_hybrid", "mamba_per_block"): "Mamba layers beside each GPT-Neo layer",
}

# entries built on another's mixer take its meanings (the H3 variants, ...)
ALIASES: dict[str, str] = {}


def _base(entry: str) -> str:
    """The entry whose per-entry meanings ``entry`` shares: h3_s4 -> h3 (H3 variants all
    have a shift SSM), else itself."""
    if entry in ALIASES:
        return ALIASES[entry]
    if entry.startswith("h3_"):
        return "h3"
    return entry


def option_help(entry: str, option: str) -> str:
    """One line on ``option`` of registry entry ``entry``; "" where none is written."""
    return FOR_ENTRY.get((entry, option)) or FOR_ENTRY.get((_base(entry), option)) or HELP.get(option, "")


def undocumented() -> list[str]:
    """``entry.option`` for every option of the registry without a line here."""
    return [f"{n}.{k}" for n in models.names() for k in models.entry(n).options() if not option_help(n, k)]
