"""Registry entries for the S6 / Mamba family."""
from __future__ import annotations

import math

import torch

from models.ssm.mamba import Mamba, RecurrentStack
from models.registry import register
from models.ssm.s6 import S6


@register("mamba", "Mamba (S6 selective scan + causal conv + gate), pre-norm residual stack; "
                   "allow_neg_eigval: transition 2exp(dA)-1 in (-1,1) (Grazzi et al. 2025)",
          family="ssm", init="mamba")
def build_mamba(
    d_model: int, n_layers: int, d_state: int = 16, d_conv: int = 4, expand: int = 2,
    dt_rank="auto", dt_min: float = 0.001, dt_max: float = 0.1, dt_init_floor: float = 1e-4,
    bias: bool = False, conv_bias: bool = True, backend: str = "auto",
    norm: str = "rms", dropout: float = 0.0, d_inner: int | None = None,
    allow_neg_eigval: bool = False,
) -> RecurrentStack:
    """``d_inner`` (optional) sets the mixer width directly, overriding ``expand``;
    ``allow_neg_eigval`` (Grazzi et al., ICLR 2025, adankow/unlocking_state_tracking) runs
    the torch scan with the transition 2 exp(delta A) - 1."""
    stack = RecurrentStack(
        d_model, n_layers,
        lambda i: Mamba(d_model, d_state=d_state, d_conv=d_conv, expand=expand, dt_rank=dt_rank,
                        dt_min=dt_min, dt_max=dt_max, dt_init_floor=dt_init_floor, bias=bias,
                        conv_bias=conv_bias, backend=backend, d_inner=d_inner,
                        allow_neg_eigval=allow_neg_eigval),
        norm=norm, dropout=dropout,
    )
    # As in mamba-ssm's LM init (GPT-2 style): shrink each residual branch's output
    # projection by 1/sqrt(n_layers) so the residual stream's variance does not grow with depth.
    with torch.no_grad():
        for layer in stack.layers:
            layer.mixer.out_proj.weight.div_(math.sqrt(n_layers))
    return stack


@register("s6", "S6 selective SSM alone (no conv, no gate; d_inner = d_model), pre-norm residual stack",
          family="ssm", init="mamba")
def build_s6(
    d_model: int, n_layers: int, d_state: int = 16, dt_rank="auto", dt_min: float = 0.001,
    dt_max: float = 0.1, dt_init_floor: float = 1e-4, backend: str = "auto",
    norm: str = "rms", dropout: float = 0.0,
) -> RecurrentStack:
    return RecurrentStack(
        d_model, n_layers,
        lambda i: S6(d_model, d_state=d_state, dt_rank=dt_rank, dt_min=dt_min, dt_max=dt_max,
                     dt_init_floor=dt_init_floor, backend=backend),
        norm=norm, dropout=dropout,
    )
