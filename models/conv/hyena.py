"""Hyena (Poli et al. 2023, "Hyena Hierarchy"): implicit long convolutions + gating.

Implicit filter.  The kernel of channel c at position t is

    h[c, t] = MLP(z(t))[c] * window_c(t) ,   window_c(t) = exp(-alpha_c t / l_max)

where z(t) = [t / l_max, cos(2 pi f_k t / l_max), sin(2 pi f_k t / l_max)]_k are
positional features (f_k = 1e-4 .. bands-1, as in the paper), the MLP is
Linear -> Sin -> Linear -> Sin -> Linear with a learned frequency in each Sin, and the
decay rates alpha_c are spread over channels so that some filters are short and some long
(window reaching 1e-2 between 0.3 and 1.5 of l_max).  Since h[c, t] depends only on t (and
the fixed normaliser l_max), a prefix of a sequence sees the same filter: lengths beyond
l_max are allowed (the MLP extrapolates), the filter never depends on the sequence length.

Hyena operator of order N:  one projection d -> (N+1) d, a short causal depthwise conv
(width 3) on all streams, split into gates x_1..x_N and v, then

    v <- x_i * (h_i * v)  for i = N .. 2,   y = out_proj(x_1 * v)      (* = long causal conv)

with N - 1 implicit filters (order 2: one long conv, two gates).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from models.conv.fftconv import LongConvLayer, fft_conv


class Sin(nn.Module):
    """sin(w * x) with a learned frequency per feature (SIREN-style)."""

    def __init__(self, dim: int, w: float = 1.0):
        super().__init__()
        self.freq = nn.Parameter(w * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.freq * x)


class ImplicitFilter(nn.Module):
    """Hyena filter generator: ``forward(L) -> h (n_filters, d, L)``."""

    def __init__(self, d: int, n_filters: int = 1, filter_width: int = 64, emb_dim: int = 33,
                 l_max: int = 1024, w: float = 1.0, fast_decay_pct: float = 0.3,
                 slow_decay_pct: float = 1.5, target: float = 1e-2, shift: float = 0.0):
        super().__init__()
        if emb_dim < 3 or emb_dim % 2 == 0:
            raise ValueError(f"emb_dim must be odd and >= 3, got {emb_dim}")
        if l_max < 1:
            raise ValueError("l_max must be >= 1")
        self.d, self.n_filters, self.l_max, self.shift = d, n_filters, l_max, shift
        bands = (emb_dim - 1) // 2
        self.register_buffer("f", torch.linspace(1e-4, bands - 1, bands), persistent=False)
        self.mlp = nn.Sequential(
            nn.Linear(emb_dim, filter_width), Sin(filter_width, w),
            nn.Linear(filter_width, filter_width), Sin(filter_width, w),
            nn.Linear(filter_width, n_filters * d, bias=False),
        )
        max_decay = math.log(target) / fast_decay_pct
        min_decay = math.log(target) / slow_decay_pct
        self.register_buffer("alpha", torch.linspace(min_decay, max_decay, d).abs(), persistent=False)

    def features(self, L: int, device, dtype) -> torch.Tensor:
        """z: (L, emb_dim) for positions t = 0..L-1."""
        t = torch.arange(L, device=device, dtype=dtype)[:, None] / self.l_max   # (L, 1)
        ang = 2 * math.pi * t * self.f.to(dtype)[None, :]
        return torch.cat([t, torch.cos(ang), torch.sin(ang)], dim=-1)

    def forward(self, L: int) -> torch.Tensor:
        dtype = self.mlp[0].weight.dtype
        z = self.features(L, self.mlp[0].weight.device, dtype)
        h = self.mlp(z)                                                         # (L, n*d)
        t = torch.arange(L, device=h.device, dtype=dtype) / self.l_max
        window = torch.exp(-t[:, None] * self.alpha.to(dtype)[None, :]) + self.shift  # (L, d)
        h = h.view(L, self.n_filters, self.d) * window[:, None, :]
        return h.permute(1, 2, 0)                                               # (n, d, L)


class HyenaFilterConv(LongConvLayer):
    """Implicit long convolution as an inner layer: (batch, length, d) -> same, plus D skip."""

    def __init__(self, d: int, **filter_options):
        super().__init__(d)
        self.filter = ImplicitFilter(d, n_filters=1, **filter_options)

    def kernel(self, L: int) -> torch.Tensor:
        return self.filter(L)[0]

    def state_size(self) -> None:
        return None   # the filter spans the whole sequence: no fixed-size state


class Hyena(nn.Module):
    """Hyena operator of order ``order``. x: (batch, length, d) -> (batch, length, d)."""

    backend = "torch"

    def __init__(self, d: int, order: int = 2, short_width: int = 3, **filter_options):
        super().__init__()
        if order < 2:
            raise ValueError(f"Hyena order must be >= 2, got {order}")
        self.d, self.order = d, order
        self.in_proj = nn.Linear(d, (order + 1) * d)
        self.short_conv = nn.Conv1d((order + 1) * d, (order + 1) * d, short_width,
                                    groups=(order + 1) * d, padding=short_width - 1)
        self.filter = ImplicitFilter(d, n_filters=order - 1, **filter_options)
        self.bias = nn.Parameter(torch.randn(order - 1, d))   # the D skip of each long conv
        self.out_proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        L = x.shape[1]
        u = self.in_proj(x).transpose(1, 2)                    # (batch, (N+1) d, L)
        u = self.short_conv(u)[..., :L]                        # causal: drop the right padding
        *gates, v = u.split(self.d, dim=1)                     # x_1..x_N, v: (batch, d, L)
        h = self.filter(L)                                     # (N-1, d, L)
        for i, x_i in enumerate(reversed(gates[1:])):
            v = v * x_i
            v = fft_conv(v, h[i]) + self.bias[i][:, None] * v
        y = (v * gates[0]).transpose(1, 2)
        return self.out_proj(y)

    def state_size(self) -> None:
        return None
