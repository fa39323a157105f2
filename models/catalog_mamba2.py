"""Registry entries for Mamba-2 (models/ssm/mamba2.py) and Mamba-3 (models/ssm/mamba3.py)."""
from __future__ import annotations

import math

import torch

from models.ssm.mamba import RecurrentStack
from models.ssm.mamba2 import Mamba2
from models.registry import register


@register("mamba2", "Mamba-2 (SSD; Dao & Gu 2024, state-spaces/mamba Mamba2): multi-head scalar-A SSM, "
          "conv, gated RMSNorm, pre-norm residual stack", family="ssm", init="mamba")
def build_mamba2(
    d_model: int, n_layers: int, d_state: int = 64, d_conv: int = 4, expand: int = 2,
    headdim: int = 32, ngroups: int = 1, chunk_size: int | None = None, dt_min: float = 0.001,
    dt_max: float = 0.1, dt_init_floor: float = 1e-4, bias: bool = False,
    conv_bias: bool = True, backend: str = "auto", norm: str = "rms", dropout: float = 0.0,
    channel_mixer: str = "none", mlp_mult: float = 2.0,
) -> RecurrentStack:
    """headdim 32 (mamba-ssm's default is 64) so that d_model 64 gives 4 heads."""
    stack = RecurrentStack(
        d_model, n_layers,
        lambda i: Mamba2(d_model, d_state=d_state, d_conv=d_conv, expand=expand, headdim=headdim,
                         ngroups=ngroups, chunk_size=chunk_size, dt_min=dt_min, dt_max=dt_max,
                         dt_init_floor=dt_init_floor, bias=bias, conv_bias=conv_bias,
                         backend=backend),
        norm=norm, dropout=dropout, channel_mixer=channel_mixer, mlp_mult=mlp_mult,
    )
    # as the `mamba` entry (mamba-ssm's LM init): shrink each mixer's output projection by
    # 1/sqrt(n_layers) so the residual stream's variance does not grow with depth
    with torch.no_grad():
        for layer in stack.layers:
            layer.mixer.out_proj.weight.div_(math.sqrt(n_layers))
    return stack


@register("mamba3", "Mamba-3 (Lahoti et al., ICLR 2026, state-spaces/mamba Mamba3): "
          "exponential-trapezoidal SSD, data-dependent rotary (complex) state, SISO or MIMO "
          "(mimo_rank), no conv",
          family="ssm", init="mamba")
def build_mamba3(
    d_model: int, n_layers: int, d_state: int = 64, expand: int = 2, headdim: int = 32,
    ngroups: int = 1, rope_fraction: float = 0.5, complex_state: bool = True,
    dt_min: float = 0.001, dt_max: float = 0.1, dt_init_floor: float = 1e-4,
    A_floor: float = 1e-4, outproj_norm: bool = False, mimo_rank: int = 1,
    chunk_size: int | None = None, backend: str = "auto", norm: str = "rms", dropout: float = 0.0,
    channel_mixer: str = "none", mlp_mult: float = 2.0,
) -> RecurrentStack:
    """headdim 32, d_state 64 (mamba-ssm: 64, 128) so that d_model 64 gives 4 heads."""
    from models.ssm.mamba3 import Mamba3

    stack = RecurrentStack(
        d_model, n_layers,
        lambda i: Mamba3(d_model, d_state=d_state, expand=expand, headdim=headdim,
                         ngroups=ngroups, rope_fraction=rope_fraction,
                         complex_state=complex_state, dt_min=dt_min, dt_max=dt_max,
                         dt_init_floor=dt_init_floor, A_floor=A_floor,
                         outproj_norm=outproj_norm, mimo_rank=mimo_rank, chunk_size=chunk_size,
                         backend=backend),
        norm=norm, dropout=dropout, channel_mixer=channel_mixer, mlp_mult=mlp_mult,
    )
    with torch.no_grad():   # as mamba2: out_proj shrunk by 1/sqrt(n_layers)
        for layer in stack.layers:
            layer.mixer.out_proj.weight.div_(math.sqrt(n_layers))
    return stack
