"""S4D: diagonal state space layer (Gu et al. 2022, "On the Parameterization and
Initialization of Diagonal State Space Models").

Per channel h, modes n:  x'(t) = A x(t) + B u(t),  y = C x + D u,  A = diag(A_n).

Initialisations (n = 0 .. N/2-1 for the complex ones):
    real : A_n = -(n + 1),                          n = 0 .. N-1  (N real modes)
    lin  : A_n = -1/2 + i pi n
    inv  : A_n = -1/2 + i (N/pi) (N/(2n+1) - 1)
    legs : A_n = the eigenvalues of the normal part of HiPPO-LegS (S4D-LegS), B = V^* B_legs
B = 1 for real / lin / inv, C ~ complex normal (variance 1/2 per part), log Delta uniform
in [log 1e-3, log 1e-1].

Complex inits keep N/2 modes whose conjugates are implied: the kernel is 2 Re of the half
sum (the real init keeps N real modes and takes 1 Re).  Either way the state holds N real
numbers per channel: ``state_size() = d * N`` (a complex mode counts as 2 reals).

Discretisation, ZOH (default):  Abar = exp(Delta A), Bbar = (exp(Delta A) - 1) / A * B;
bilinear: Abar = (1 + Delta A/2) / (1 - Delta A/2), Bbar = Delta B / (1 - Delta A/2).

Kernel (Vandermonde):  K_l = s Re sum_n C_n Bbar_n Abar_n^l   (s = 2 complex, 1 real).
Naively that materialises (d, N/2, L).  Writing l = i J + j (J = ceil(sqrt L)) gives
Abar^l = Abar^(iJ) Abar^j, so K[:, i, j] = Re sum_n (s C Bbar Abar^(iJ))_n (Abar^j)_n is a
batched (d, I, N/2) @ (d, N/2, J) complex matmul: O(d N sqrt(L)) extra memory.

Recurrent form (``init_state`` / ``step``): x_k = Abar x_{k-1} + Bbar u_k,
y_k = s Re(C x_k) + D u_k: the same discretised system, one step at a time.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from models.conv.fftconv import LongConvLayer
from models.ssm.hippo import legs_dplr
from models.ssm.s4 import init_log_dt

INITS = ("real", "lin", "inv", "legs")


def s4d_init(init: str, N: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B) complex128 for init in INITS: (N,) for real, (N/2,) for the complex ones."""
    if init == "real":
        A = -(torch.arange(N, dtype=torch.float64) + 1)
        return A.to(torch.complex128), torch.ones(N, dtype=torch.complex128)
    if init not in INITS:
        raise ValueError(f"unknown init {init!r}; expected one of {', '.join(INITS)}")
    if N % 2:
        raise ValueError(f"complex S4D keeps conjugate pairs: d_state must be even, got {N}")
    n = torch.arange(N // 2, dtype=torch.float64)
    if init == "lin":
        A = torch.complex(-0.5 * torch.ones_like(n), math.pi * n)
    elif init == "inv":
        A = torch.complex(-0.5 * torch.ones_like(n), (N / math.pi) * (N / (2 * n + 1) - 1))
    else:  # legs
        hp = legs_dplr(N)
        return hp["Lambda"], hp["B"]
    return A, torch.ones(N // 2, dtype=torch.complex128)


def vandermonde_naive(W: torch.Tensor, dtA: torch.Tensor, L: int) -> torch.Tensor:
    """sum_n W[h, n] exp(dtA[h, n] l) for l < L: (d, M) complex, (d, M) -> (d, L) complex.
    Materialises (d, M, L)."""
    l = torch.arange(L, device=W.device, dtype=W.real.dtype)
    return torch.einsum("hn,hnl->hl", W, torch.exp(dtA[:, :, None] * l))


def vandermonde_split(W: torch.Tensor, dtA: torch.Tensor, L: int) -> torch.Tensor:
    """Same as ``vandermonde_naive`` with l = i J + j: a batched matmul, O(d M sqrt L) memory."""
    J = max(1, math.isqrt(L - 1) + 1) if L > 1 else 1
    I = -(-L // J)
    r = torch.arange(max(I, J), device=W.device, dtype=W.real.dtype)
    outer = W[:, None, :] * torch.exp(dtA[:, None, :] * (J * r[:I])[None, :, None])  # (d, I, M)
    inner = torch.exp(dtA[:, :, None] * r[:J])                                      # (d, M, J)
    return (outer @ inner).reshape(W.shape[0], I * J)[:, :L]


class S4D(LongConvLayer):
    """S4D inner layer. x: (batch, length, d) -> (batch, length, d); also step mode."""

    def __init__(self, d: int, d_state: int = 64, init: str = "lin", disc: str = "zoh",
                 dt_min: float = 1e-3, dt_max: float = 1e-1, kernel_mode: str = "split"):
        super().__init__(d)
        if disc not in ("zoh", "bilinear"):
            raise ValueError(f"unknown disc {disc!r}; expected 'zoh' or 'bilinear'")
        if kernel_mode not in ("split", "naive"):
            raise ValueError(f"unknown kernel_mode {kernel_mode!r}; expected 'split' or 'naive'")
        A, B = s4d_init(init, d_state)
        self.N, self.init, self.disc, self.kernel_mode = d_state, init, disc, kernel_mode
        self.is_real = init == "real"
        M = A.shape[0]
        rep = lambda t: t.float().expand(d, M).clone()  # noqa: E731
        self.log_neg_re = nn.Parameter(rep(torch.log(-A.real)))
        C = torch.randn(d, M, 2) * math.sqrt(0.5)
        if self.is_real:
            # a real system: no imaginary parts anywhere (kept as zero buffers)
            C[..., 1] = 0
            self.register_buffer("A_im", torch.zeros(d, M))
            self.register_buffer("B_im", torch.zeros(d, M))
            self.register_buffer("C_im", C[..., 1].clone())
            self.C_re = nn.Parameter(C[..., 0].clone())
        else:
            self.A_im = nn.Parameter(rep(A.imag))
            self.B_im = nn.Parameter(rep(B.imag))
            self.C_re, self.C_im = nn.Parameter(C[..., 0].clone()), nn.Parameter(C[..., 1].clone())
        self.B_re = nn.Parameter(rep(B.real))
        self.log_dt = nn.Parameter(init_log_dt(d, dt_min, dt_max))
        self.scale = 1.0 if self.is_real else 2.0   # 2 Re for the implied conjugate modes

    def A(self) -> torch.Tensor:
        """(d, M) complex."""
        return torch.complex(-self.log_neg_re.exp(), self.A_im)

    def discretize(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dtA, Abar, Bbar), each (d, M) complex."""
        A = self.A()
        B = torch.complex(self.B_re, self.B_im)
        dtA = A * self.log_dt.exp()[:, None]
        if self.disc == "zoh":
            Abar = torch.exp(dtA)
            Bbar = (Abar - 1) / A * B
        else:
            Abar = (1 + dtA / 2) / (1 - dtA / 2)
            Bbar = self.log_dt.exp()[:, None] * B / (1 - dtA / 2)
            dtA = torch.log(Abar)  # Abar^l = exp(l log Abar)
        return dtA, Abar, Bbar

    def kernel(self, L: int) -> torch.Tensor:
        """K: (d, L) real."""
        dtA, _, Bbar = self.discretize()
        W = self.scale * torch.complex(self.C_re, self.C_im) * Bbar
        fn = vandermonde_split if self.kernel_mode == "split" else vandermonde_naive
        return fn(W, dtA, L).real

    # -- recurrent mode -------------------------------------------------------------------
    def init_state(self, batch: int) -> torch.Tensor:
        """Zero state (batch, d, M): complex, or real for init="real" (a real system's modes
        stay real, so carrying them as complex would double the state: state_size() = d N)."""
        dt = self.log_dt
        ctype = torch.complex128 if dt.dtype == torch.float64 else torch.complex64
        return torch.zeros(batch, self.d, self.log_neg_re.shape[1], dtype=dt.dtype if self.is_real else ctype,
                           device=dt.device)

    def step(self, x_t: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One time step. x_t: (batch, d), state (batch, d, M) -> (y_t (batch, d), new state)."""
        _, Abar, Bbar = self.discretize()
        if self.is_real:  # A, B and C have no imaginary parts (zero buffers): a real recurrence
            state = Abar.real * state + Bbar.real * x_t[..., None].to(Bbar.real.dtype)
            y = self.scale * (self.C_re * state).sum(-1) + self.D * x_t
            return y.to(x_t.dtype), state
        state = Abar * state + Bbar * x_t[..., None].to(Bbar.dtype)
        C = torch.complex(self.C_re, self.C_im)
        y = self.scale * (C * state).sum(-1).real + self.D * x_t
        return y.to(x_t.dtype), state

    def state_size(self) -> int:
        return self.d * self.N
