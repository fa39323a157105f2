"""Initialisation schemes for a composed model (token embedding, backbone, output head).

The reference implementations the workbench's models follow do not leave PyTorch's module
defaults in place; they re-initialise the whole language model after building it. A
reproduction that keeps the defaults trains a different model (issue 10: the MAD Mamba
row learns about twice as fast with its reference init and tied head). Three schemes:

``torch``
    Nothing is re-initialised: each module keeps its own constructor's init (PyTorch's
    defaults plus whatever the backbone sets itself, e.g. Mamba's dt/A/D init). The head
    is untied unless asked for.
``mamba``
    state-spaces/mamba ``_init_weights`` (``mamba_ssm/models/mixer_seq_simple.py``), which
    Hugging Face's ``MambaPreTrainedModel`` repeats: embedding ``N(0, std)`` (std 0.02 by
    default; mamba-130m-hf's config says 0.1), Linear biases zeroed except those marked
    ``_no_reinit`` (the dt bias), and the output projection of every residual branch
    (parameters named ``out_proj.weight`` or ``fc2.weight``) redrawn Kaiming-uniform
    (a = sqrt 5, PyTorch's Linear default) and divided by sqrt(number of residual
    branches). Other Linear weights keep PyTorch's default. Tied head.
``hf``
    What Hugging Face's ``_init_weights`` does for the architecture. GPT-Neo's (attention,
    MLPs and everything else): every Linear and Embedding weight ``N(0, std)``
    (``initializer_range``, 0.02), Linear biases zero, norm weights 1 and biases 0, no
    residual rescale. ``MambaPreTrainedModel``'s for Mamba / S6 mixers (as of the late-2024
    releases the published MAD runs used): embedding ``N(0, std)``, Linear biases zeroed
    except the dt bias, Linear weights at PyTorch's default, and no residual rescale
    (``rescale_prenorm_residual`` is false in its configs) — so the out-projection the
    workbench's Mamba shrinks by 1/sqrt(n_layers) is redrawn at the default scale. Tied head.

A tied head is ``Linear(d_model, vocab, bias=False)`` sharing the embedding matrix, as in
both references' LM heads; tying needs token inputs and per-position outputs over the same
vocabulary.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

SCHEMES = ("torch", "mamba", "hf")
DEFAULT_STD = 0.02
RESIDUAL_OUT_NAMES = ("out_proj", "fc2")  # as named in mamba-ssm's rescale rule


def check_scheme(scheme: str) -> str:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown init scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")
    return scheme


def count_residual_branches(model: nn.Module) -> int:
    """Number of ``x + f(norm(x))`` branches (mamba-ssm's n_layer * n_residuals_per_layer)."""
    from models.common import PreNormResidual

    return sum(isinstance(m, PreNormResidual) for m in model.modules())


def _selective_ssm_linears(model: nn.Module) -> set[int]:
    """ids of the Linear layers inside Mamba / S6 mixers (Hugging Face inits them apart)."""
    from models.ssm.s6 import SelectiveSSM

    return {id(m) for mixer in model.modules() if isinstance(mixer, SelectiveSSM)
            for m in mixer.modules() if isinstance(m, nn.Linear)}


def _norm_modules(model: nn.Module):
    from models.common import RMSNorm

    return [m for m in model.modules() if isinstance(m, (nn.LayerNorm, RMSNorm))]


@torch.no_grad()
def apply_init(model: nn.Module, scheme: str, std: float = DEFAULT_STD) -> None:
    """Re-initialise ``model`` in place by ``scheme`` (see the module docstring)."""
    check_scheme(scheme)
    if not std > 0:
        raise ValueError(f"init_std must be > 0, got {std!r}")
    if scheme == "torch":
        return
    in_ssm = _selective_ssm_linears(model)
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, nn.Linear):
            if module.bias is not None and not getattr(module.bias, "_no_reinit", False):
                nn.init.zeros_(module.bias)
            if scheme != "hf" or getattr(module.weight, "_no_reinit", False):
                continue
            if id(module) not in in_ssm:
                nn.init.normal_(module.weight, std=std)
            elif name.rsplit(".", 1)[-1] in RESIDUAL_OUT_NAMES:
                # undo the backbone's 1/sqrt(n_layers): PyTorch's default, as HF leaves it
                nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5))
    if scheme == "hf":
        for norm in _norm_modules(model):
            nn.init.ones_(norm.weight)
            if getattr(norm, "bias", None) is not None:
                nn.init.zeros_(norm.bias)
        return
    branches = max(count_residual_branches(model), 1)
    for name, p in model.named_parameters():
        parts = name.split(".")
        if len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in RESIDUAL_OUT_NAMES:
            nn.init.kaiming_uniform_(p, a=math.sqrt(5))
            p.div_(math.sqrt(branches))


def tie(encoder: nn.Module, head: nn.Module) -> nn.Linear:
    """A bias-free Linear head sharing ``encoder``'s embedding matrix (vocab, d_model)."""
    if not isinstance(encoder, nn.Embedding):
        raise ValueError("tie_embeddings needs token inputs (an embedding table)")
    if not isinstance(head, nn.Linear) or head.out_features != encoder.num_embeddings:
        raise ValueError(
            f"tie_embeddings needs a per-position head over the input vocabulary "
            f"({encoder.num_embeddings} tokens); this task's head is {head}")
    tied = nn.Linear(encoder.embedding_dim, encoder.num_embeddings, bias=False)
    tied.weight = encoder.weight
    return tied


def can_tie(encoder: nn.Module, head: nn.Module) -> bool:
    return (isinstance(encoder, nn.Embedding) and isinstance(head, nn.Linear)
            and head.out_features == encoder.num_embeddings
            and head.in_features == encoder.embedding_dim)
