"""Blocks around an "inner layer": the Mamba paper's Table 1 grid (Gu & Dao 2023).

An inner layer maps (batch, length, c) -> (batch, length, c) causally, with the channel
count c given at construction (``make_inner``):

    s4        dense S4, HiPPO-LegS, bilinear                 (models.ssm.s4)
    s4_dplr   S4 DPLR ("S4 complex"), Cauchy kernel          (models.ssm.s4_dplr)
    s4d_real  S4D-Real,  s4d_lin  S4D-Lin,  s4d_inv  S4D-Inv (models.ssm.s4d)
    s6        selective SSM                                  (models.ssm.s6)
    hyena     Hyena implicit long convolution                (models.conv.hyena)

Blocks (each used as the mixer of a pre-norm residual stack):

    none   y = W_o GELU(inner(x))                              (the S4 layer's shape)
    h3     y = W_o (Q * inner(shift(K) * V))                   (models.ssm.h3; inner = diag SSM)
    mamba  x, z = W_in x (expand E);  x = SiLU(causal depthwise conv_4(x));
           y = W_o (inner(x) * SiLU(z))                        (inner has E d channels)
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.common import ResidualStack, stack_with_state
from models.ssm.h3 import H3
from models.conv.hyena import HyenaFilterConv
from models.ssm.s4 import S4
from models.ssm.s4_dplr import S4DPLR
from models.ssm.s4d import S4D

INNERS = ("s4", "s4_dplr", "s4d_real", "s4d_lin", "s4d_inv", "s6", "hyena")
BLOCKS = ("none", "h3", "mamba")
DEFAULT_D_STATE = {"s4": 64, "s4_dplr": 64, "s4d_real": 64, "s4d_lin": 64, "s4d_inv": 64, "s6": 16}


def make_inner(inner: str, d: int, d_state: int | None = None) -> nn.Module:
    """Build inner layer ``inner`` with ``d`` channels. d_state None -> the inner's default."""
    if inner not in INNERS:
        raise ValueError(f"unknown inner layer {inner!r}; expected one of {', '.join(INNERS)}")
    if inner == "hyena":
        if d_state is not None:
            raise ValueError("the hyena inner layer has no d_state")
        return HyenaFilterConv(d)
    N = DEFAULT_D_STATE[inner] if d_state is None else d_state
    if inner == "s4":
        return S4(d, d_state=N)
    if inner == "s4_dplr":
        return S4DPLR(d, d_state=N)
    if inner.startswith("s4d_"):
        return S4D(d, d_state=N, init=inner[len("s4d_"):])
    from models.ssm.s6 import S6   # the selective scan lives with the S6 / Mamba family
    return S6(d, d_state=N)


def _inner_state(inner: nn.Module) -> int | None:
    fn = getattr(inner, "state_size", None)
    return fn() if callable(fn) else None


class NoGateBlock(nn.Module):
    """y = W_o GELU(inner(x)). x: (batch, length, d) -> same."""

    def __init__(self, d: int, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.out_proj = nn.Linear(d, d)

    @property
    def backend(self) -> str:
        return str(getattr(self.inner, "backend", "torch"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(F.gelu(self.inner(x)))

    def state_size(self) -> int | None:
        return _inner_state(self.inner)

    def init_state(self, batch: int):
        return self.inner.init_state(batch)

    def step(self, x_t: torch.Tensor, state):
        """x_t: (batch, d) -> (y_t (batch, d), state)."""
        y, state = self.inner.step(x_t, state)
        return self.out_proj(F.gelu(y)), state


class MambaBlock(nn.Module):
    """Mamba block with an arbitrary inner layer. x: (batch, length, d) -> same.

    ``make_inner(c)`` builds the inner layer on c = expand * d channels.
    """

    def __init__(self, d: int, make_inner_fn, expand: int = 2, d_conv: int = 4):
        super().__init__()
        if expand < 1 or d_conv < 1:
            raise ValueError("expand and d_conv must be >= 1")
        self.d, self.d_inner, self.d_conv = d, expand * d, d_conv
        self.in_proj = nn.Linear(d, 2 * self.d_inner, bias=False)
        self.conv1d = nn.Conv1d(self.d_inner, self.d_inner, d_conv, groups=self.d_inner,
                                padding=d_conv - 1)
        self.inner = make_inner_fn(self.d_inner)
        self.out_proj = nn.Linear(self.d_inner, d, bias=False)

    @property
    def backend(self) -> str:
        return str(getattr(self.inner, "backend", "torch"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        L = x.shape[1]
        xs, z = self.in_proj(x).chunk(2, dim=-1)                       # (batch, L, E d) each
        xs = self.conv1d(xs.transpose(1, 2))[..., :L].transpose(1, 2)  # causal conv
        y = self.inner(F.silu(xs)) * F.silu(z)
        return self.out_proj(y)

    def state_size(self) -> int | None:
        s = _inner_state(self.inner)
        return None if s is None else s + self.d_inner * (self.d_conv - 1)

    def init_state(self, batch: int):
        w = self.conv1d.weight
        conv = torch.zeros(batch, self.d_inner, self.d_conv - 1, dtype=w.dtype, device=w.device)
        return conv, self.inner.init_state(batch)

    def step(self, x_t: torch.Tensor, state):
        """x_t: (batch, d) -> (y_t (batch, d), state); state = (last d_conv-1 inputs, inner)."""
        conv, inner_state = state
        xs, z = self.in_proj(x_t).chunk(2, dim=-1)
        window = torch.cat([conv, xs[..., None]], dim=-1)              # (batch, E d, d_conv)
        xc = (window * self.conv1d.weight[:, 0, :]).sum(-1) + self.conv1d.bias
        y, inner_state = self.inner.step(F.silu(xc), inner_state)
        return self.out_proj(y * F.silu(z)), (window[..., 1:], inner_state)


class SSMStack(ResidualStack):
    """ResidualStack plus step mode where every mixer has ``init_state`` / ``step``."""

    def init_state(self, batch: int) -> list:
        try:
            return [layer.mixer.init_state(batch) for layer in self.layers]
        except AttributeError as e:
            raise NotImplementedError(f"this backbone has no step mode ({e})") from None

    def step(self, x_t: torch.Tensor, state: list) -> tuple[torch.Tensor, list]:
        """x_t: (batch, d_model) -> (y_t (batch, d_model), next state)."""
        return stack_with_state(self, x_t, state, "step")


def make_block(block: str, inner: str, d_model: int, d_state: int | None = None,
               shift_size: int = 4, expand: int = 2, d_conv: int = 4) -> nn.Module:
    """One mixer of the grid: ``block`` in BLOCKS around ``inner`` in INNERS."""
    if block == "none":
        return NoGateBlock(d_model, make_inner(inner, d_model, d_state))
    if block == "h3":
        return H3(d_model, inner=make_inner(inner, d_model, d_state), shift_size=shift_size)
    if block == "mamba":
        return MambaBlock(d_model, lambda c: make_inner(inner, c, d_state), expand, d_conv)
    raise ValueError(f"unknown block {block!r}; expected one of {', '.join(BLOCKS)}")


def grid_backbone(block: str, inner: str, d_model: int, n_layers: int, norm: str = "rms",
                  dropout: float = 0.0, **block_options) -> SSMStack:
    """Pre-norm residual stack of ``make_block(block, inner, ...)``."""
    return SSMStack(d_model, n_layers, lambda i: make_block(block, inner, d_model, **block_options),
                    norm=norm, dropout=dropout)
