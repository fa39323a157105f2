"""Dense S4: per channel an N x N HiPPO-LegS state matrix, bilinear discretisation.

Continuous system per channel h (Gu et al. 2021, "S4"):  x'(t) = A x(t) + B u(t),
y(t) = C x(t) + D u(t), with A, B initialised to HiPPO-LegS and learned.

Bilinear (Tustin) discretisation with step Delta = exp(log_dt):

    Abar = (I - Delta/2 A)^-1 (I + Delta/2 A),    Bbar = (I - Delta/2 A)^-1 Delta B

Convolution kernel  K_l = C Abar^l Bbar, l = 0..L-1, so that y = K * u + D u.  The vectors
Abar^l Bbar are built by repeated squaring (no Python loop over l): start from [Bbar];
with P = Abar^(2^j), append P @ (all columns so far), then P <- P @ P.  That doubles the
number of columns per step: ceil(log2 L) batched matmuls.  Memory (d, N, L).

This is the slow, exact reference of the S4 family (O(d N^2 L)); S4 with the Cauchy kernel
is in ``models.ssm.s4_dplr`` and S4D in ``models.ssm.s4d``.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from models.conv.fftconv import LongConvLayer
from models.ssm.hippo import legs


def bilinear(A: torch.Tensor, B: torch.Tensor, dt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A: (..., N, N), B: (..., N), dt: (...) -> (Abar (..., N, N), Bbar (..., N))."""
    N = A.shape[-1]
    I = torch.eye(N, dtype=A.dtype, device=A.device)
    half = (dt / 2)[..., None, None]
    M = I - half * A
    Abar = torch.linalg.solve(M, I + half * A)
    Bbar = torch.linalg.solve(M, (dt[..., None] * B)[..., None])[..., 0]
    return Abar, Bbar


def zoh(A: torch.Tensor, B: torch.Tensor, dt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-order hold: Abar = exp(Delta A), Bbar = A^-1 (Abar - I) B.  Shapes as ``bilinear``."""
    N = A.shape[-1]
    I = torch.eye(N, dtype=A.dtype, device=A.device)
    Abar = torch.linalg.matrix_exp(dt[..., None, None] * A)
    Bbar = torch.linalg.solve(A, ((Abar - I) @ B[..., None]))[..., 0]
    return Abar, Bbar


def power_vectors(Abar: torch.Tensor, Bbar: torch.Tensor, L: int) -> torch.Tensor:
    """[Abar^l Bbar for l < L] by repeated squaring. Abar (..., N, N), Bbar (..., N) -> (..., N, L)."""
    V = Bbar[..., None]
    P = Abar
    while V.shape[-1] < L:
        V = torch.cat([V, P @ V], dim=-1)
        if V.shape[-1] < L:
            P = P @ P
    return V[..., :L]


def matrix_power_pow2(Abar: torch.Tensor, L: int) -> torch.Tensor:
    """Abar^L by binary exponentiation (log2 L matmuls). Abar (..., N, N)."""
    result = None
    P = Abar
    while L:
        if L & 1:
            result = P if result is None else result @ P
        L >>= 1
        if L:
            P = P @ P
    if result is None:
        return torch.eye(Abar.shape[-1], dtype=Abar.dtype, device=Abar.device).expand_as(Abar)
    return result


def init_log_dt(d: int, dt_min: float, dt_max: float) -> torch.Tensor:
    """log Delta uniform in [log dt_min, log dt_max] (S4 / S4D default 1e-3 .. 1e-1)."""
    return torch.rand(d) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)


class S4(LongConvLayer):
    """Dense S4 inner layer. x: (batch, length, d) -> (batch, length, d).

    Parameters per channel: A (N, N), B (N,), C (N,), log_dt, D.  State size d * N.
    """

    def __init__(self, d: int, d_state: int = 64, dt_min: float = 1e-3, dt_max: float = 1e-1,
                 learn_AB: bool = True):
        super().__init__(d)
        self.N = d_state
        A, B = legs(d_state, dtype=torch.float32)
        A = A.expand(d, d_state, d_state).clone()
        B = B.expand(d, d_state).clone()
        if learn_AB:
            self.A, self.B = nn.Parameter(A), nn.Parameter(B)
        else:
            self.register_buffer("A", A)
            self.register_buffer("B", B)
        # C ~ N(0, 1/N): the LegS state carries Legendre coefficients of unit scale
        self.C = nn.Parameter(torch.randn(d, d_state) / math.sqrt(d_state))
        self.log_dt = nn.Parameter(init_log_dt(d, dt_min, dt_max))

    def discretize(self) -> tuple[torch.Tensor, torch.Tensor]:
        return bilinear(self.A, self.B, self.log_dt.exp())

    def kernel(self, L: int) -> torch.Tensor:
        """K: (d, L), K[h, l] = C_h Abar_h^l Bbar_h."""
        Abar, Bbar = self.discretize()
        V = power_vectors(Abar, Bbar, L)                 # (d, N, L)
        return torch.einsum("hn,hnl->hl", self.C, V)

    def init_state(self, batch: int) -> torch.Tensor:
        """Zero state (batch, d, N)."""
        return torch.zeros(batch, self.d, self.N, dtype=self.C.dtype, device=self.C.device)

    def step(self, x_t: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x_k = Abar x_{k-1} + Bbar u_k, y_k = C x_k + D u_k.  x_t: (batch, d) -> (y_t, state)."""
        Abar, Bbar = self.discretize()
        state = torch.einsum("hnm,bhm->bhn", Abar, state) + Bbar * x_t[..., None]
        return torch.einsum("hn,bhn->bh", self.C, state) + self.D * x_t, state

    def state_size(self) -> int:
        return self.d * self.N
