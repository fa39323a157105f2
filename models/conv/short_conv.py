"""A causal depthwise short convolution with a carried state (the "short conv" of
H3 / Mamba / DeltaNet / Gated DeltaNet / Based).

    y_t = act(sum_{j=0}^{W-1} w_j * x_{t-W+1+j} + b),   per channel, x_{<0} = 0 or the cache

Structure after flash-linear-attention's ``fla/modules/conv/short_conv.py``
(``ShortConvolution``: depthwise Conv1d, kernel W, no bias, SiLU by default, a cache of
the last inputs for streaming); written here in plain PyTorch (``F.conv1d`` over the cache
concatenated with the chunk), so it runs on any device.

The cache holds the last ``W - 1`` inputs, channels first: (batch, channels, W - 1), as
``models.ssm.mamba.Mamba``'s conv_state does, so a chunk run from the cache of the previous
chunk equals one run over both.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.common import recomputed

ACTIVATIONS = ("silu", "none")


class ShortConvolution(nn.Module):
    """Causal depthwise conv over time: x (batch, length, channels) -> same shape.

    ``weight`` (channels, 1, kernel_size) and ``bias`` (channels,) or None are named as in
    ``nn.Conv1d`` (and fla's ``ShortConvolution``, a Conv1d subclass).
    """

    def __init__(self, channels: int, kernel_size: int = 4, bias: bool = False,
                 activation: str = "silu"):
        super().__init__()
        if isinstance(kernel_size, bool) or not isinstance(kernel_size, int) or kernel_size < 1:
            raise ValueError(f"conv_size must be an integer >= 1; got {kernel_size!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"short conv activation must be one of {ACTIVATIONS}; got {activation!r}")
        self.channels, self.kernel_size, self.activation = channels, kernel_size, activation
        conv = nn.Conv1d(channels, channels, kernel_size, groups=channels, bias=bias)
        self.weight, self.bias = conv.weight, conv.bias     # PyTorch's Conv1d init

    def init_state(self, batch: int, device=None, dtype=None) -> torch.Tensor:
        """Zeros (batch, channels, kernel_size - 1): no inputs before the first."""
        return torch.zeros(batch, self.channels, self.kernel_size - 1,
                           device=device or self.weight.device, dtype=dtype or self.weight.dtype)

    def state_size(self) -> int:
        return self.channels * (self.kernel_size - 1)

    def forward(self, x: torch.Tensor, cache: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """x (batch, length, channels), cache (batch, channels, kernel_size - 1) or None
        (zeros) -> (y (batch, length, channels), next cache: the last kernel_size - 1
        inputs, from the cache where the chunk is shorter)."""
        B, T, D = x.shape
        if D != self.channels:
            raise ValueError(f"short conv expects {self.channels} channels; got {D}")
        if cache is None:
            cache = x.new_zeros(B, D, self.kernel_size - 1)
        xp = torch.cat([cache.to(x.dtype), x.transpose(1, 2)], dim=-1)  # (B, D, W - 1 + T)
        # the conv and its SiLU keep two (B, D, T) tensors for the backward: recompute them
        y = recomputed(self._conv_act, xp, self.weight, self.bias)
        new_cache = xp[..., xp.shape[-1] - (self.kernel_size - 1):]
        return y.transpose(1, 2), new_cache

    def _conv_act(self, xp, weight, bias):
        y = F.conv1d(xp, weight, bias, groups=self.channels)    # (B, D, T)
        return F.silu(y) if self.activation == "silu" else y

    def step(self, x_t: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One token: x_t (batch, channels) -> (y_t (batch, channels), next cache)."""
        y, cache = self.forward(x_t[:, None], cache)
        return y[:, 0], cache

    def extra_repr(self) -> str:
        return (f"{self.channels}, kernel_size={self.kernel_size}, "
                f"bias={self.bias is not None}, activation={self.activation}")
