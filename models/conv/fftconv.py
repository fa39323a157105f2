"""Causal long convolution by FFT, and the base class of the convolutional "inner layers".

An inner layer maps x: (batch, length, d) -> (batch, length, d), causally, channel by
channel:  y[:, t, h] = sum_{s<=t} K[h, t-s] x[:, s, h] + D[h] x[:, t, h].

The FFT pads to at least 2L so that the circular convolution equals the linear one on the
first L outputs (no wrap-around from the end of the sequence into its start = causal).
"""
from __future__ import annotations

import torch
import torch.nn as nn


def _fast_len(n: int) -> int:
    """Smallest 2^a 3^b >= n (pocketfft is fast on these sizes)."""
    best = 1 << (n - 1).bit_length()
    p3 = 1
    while p3 < best:
        p = p3
        while p < n:
            p *= 2
        best = min(best, p)
        p3 *= 3
    return best


def fft_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Causal convolution. u: (batch, d, L), k: (d, Lk) with Lk <= L -> (batch, d, L).

    y[b, h, t] = sum_{s=0}^{t} k[h, s] u[b, h, t - s].
    """
    L = u.shape[-1]
    if k.shape[-1] > L:
        k = k[..., :L]
    n = _fast_len(L + k.shape[-1])
    dtype = u.dtype
    if dtype in (torch.float16, torch.bfloat16):  # cuFFT half needs powers of 2; do it in fp32
        u, k = u.float(), k.float()
    y = torch.fft.irfft(torch.fft.rfft(u, n=n) * torch.fft.rfft(k, n=n), n=n)[..., :L]
    return y.to(dtype)


class LongConvLayer(nn.Module):
    """Base of the LTI inner layers (S4, S4 DPLR, S4D, Hyena filter).

    Subclasses define ``kernel(L) -> (d, L)`` (the convolution kernel K) and set ``self.d``.
    ``D`` (d,) is the skip term.  forward: x (batch, length, d) -> (batch, length, d).
    """

    backend = "torch"

    def __init__(self, d: int):
        super().__init__()
        self.d = d
        self.D = nn.Parameter(torch.randn(d))

    def kernel(self, L: int) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, length, d) -> (batch, length, d)."""
        if x.shape[-1] != self.d:
            raise ValueError(f"expected {self.d} channels, got {x.shape[-1]}")
        u = x.transpose(1, 2)                           # (batch, d, L)
        K = self.kernel(u.shape[-1]).to(u.dtype)        # (d, L)
        y = fft_conv(u, K) + self.D.to(u.dtype)[:, None] * u
        return y.transpose(1, 2)
