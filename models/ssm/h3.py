"""H3 (Fu et al. 2023, "Hungry Hungry Hippos").

    Q, K, V = W_q x, W_k x, W_v x
    y = W_o ( Q * SSM_diag( SSM_shift(K) * V ) )

SSM_shift has the shift matrix as A (x_k = [u_k, x_{k-1}[:-1]]) and B = e_1, so its state
holds the last N inputs and its kernel is just C: a learned causal depthwise convolution
of width N over the last N inputs (the current one included).  SSM_diag is an S4D layer
(S4D-Lin init by default) or any other inner layer of the same contract, which is how the
H3 block of the Mamba paper's Table 1 swaps in S4, S6 or Hyena.  Head dimension 1 (the
products are elementwise).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from models.ssm.s4d import S4D


class ShiftSSM(nn.Module):
    """Causal depthwise conv of width N (the shift SSM). x: (batch, length, d) -> same."""

    def __init__(self, d: int, N: int = 4):
        super().__init__()
        if N < 1:
            raise ValueError("shift SSM state size must be >= 1")
        self.d, self.N = d, N
        self.conv = nn.Conv1d(d, d, N, groups=d, padding=N - 1, bias=False)
        with torch.no_grad():
            self.conv.weight.normal_(0, 1 / math.sqrt(N))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        L = x.shape[1]
        return self.conv(x.transpose(1, 2))[..., :L].transpose(1, 2)

    def state_size(self) -> int:
        return self.d * (self.N - 1)   # the last N-1 inputs; the current one is x_t

    def init_state(self, batch: int) -> torch.Tensor:
        w = self.conv.weight
        return torch.zeros(batch, self.d, self.N - 1, dtype=w.dtype, device=w.device)

    def step(self, x_t: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x_t: (batch, d), state: the last N-1 inputs (batch, d, N-1) -> (y_t, state)."""
        window = torch.cat([state, x_t[..., None]], dim=-1)            # (batch, d, N)
        return (window * self.conv.weight[:, 0, :]).sum(-1), window[..., 1:]


class H3(nn.Module):
    """H3 layer. x: (batch, length, d) -> (batch, length, d), causal.

    ``inner``: the module in place of the diagonal SSM (default S4D-Lin, state d_state).
    """

    def __init__(self, d: int, inner: nn.Module | None = None, d_state: int = 64,
                 shift_size: int = 4):
        super().__init__()
        self.d = d
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.shift = ShiftSSM(d, shift_size)
        self.inner = inner if inner is not None else S4D(d, d_state=d_state, init="lin")
        self.out_proj = nn.Linear(d, d)

    @property
    def backend(self) -> str:
        return str(getattr(self.inner, "backend", "torch"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return self.out_proj(q * self.inner(self.shift(k) * v))

    def init_state(self, batch: int):
        """(shift SSM state, inner state); needs an inner layer with step mode."""
        return self.shift.init_state(batch), self.inner.init_state(batch)

    def step(self, x_t: torch.Tensor, state):
        """x_t: (batch, d) -> (y_t (batch, d), state)."""
        shift_state, inner_state = state
        q, k, v = self.q_proj(x_t), self.k_proj(x_t), self.v_proj(x_t)
        k, shift_state = self.shift.step(k, shift_state)
        y, inner_state = self.inner.step(k * v, inner_state)
        return self.out_proj(q * y), (shift_state, inner_state)

    def state_size(self) -> int | None:
        fn = getattr(self.inner, "state_size", None)
        s = fn() if callable(fn) else None
        return None if s is None else s + self.shift.state_size()
