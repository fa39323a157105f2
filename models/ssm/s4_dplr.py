"""S4 with a diagonal-plus-low-rank (DPLR) state matrix: the Cauchy-kernel algorithm.

Per channel h, in the eigenbasis of the normal part of HiPPO-LegS (``models.ssm.hippo``):

    A = Lambda - P Q^*      (Lambda diagonal, N complex modes, rank 1; Q = P for LegS)

kept as N/2 modes plus their complex conjugates (so the kernel is real).

Kernel (S4, Gu et al. 2021, Sec. 3.3).  The truncated generating function of
K_l = C Abar^l Bbar at the L-th roots of unity omega_k = exp(-2 pi i k / L) is

    Khat(omega) = sum_{l<L} C Abar^l Bbar omega^l = Ctilde (I - Abar omega)^-1 Bbar,
    Ctilde = C (I - Abar^L)          (S4 learns Ctilde directly, as here)

and K = iFFT(Khat).  With the bilinear Abar, Bbar this is

    Khat(omega) = c(omega) Ctilde (g(omega) I - A)^-1 B,
    g(omega) = (2/Delta) (1 - omega)/(1 + omega),   c(omega) = 2 / (1 + omega).

The Woodbury identity for A = Lambda - P Q^* gives, with R = (g - Lambda)^-1 diagonal,

    Khat(omega) = c(omega) [k00 - k01 (1 + k11)^-1 k10],
    k00 = Ctilde R B, k01 = Ctilde R P, k10 = Q^* R B, k11 = Q^* R P,

each a Cauchy kernel  sum_n w_n / (g - lambda_n)  (note the sign: g - lambda, and the
correction DIVIDES by (1 + k11); multiplying by it is a published bug).  At the Nyquist
frequency omega = -1, g and c are infinite; so we evaluate the same formula multiplied
through by b = Delta/2 (1 + omega), a = 1 - omega:

    Khat(omega) = Delta [k00' - b k01' (1 + b k11')^-1 k10'],   k_xy' = sum_n w_n / (a - b lambda_n)

which is finite everywhere (a - b lambda != 0 since Re lambda < 0).  Frequencies are
processed in chunks, each under activation checkpointing, so memory is bounded by one
chunk of (d, N/2, chunk) complex values in forward and backward.

ZOH (disc="zoh"): exp(Delta (Lambda - P Q^*)) is not diagonal plus low rank, so there is no
Cauchy form of the exact ZOH kernel.  This path builds the dense N x N system from the
DPLR parameters (matrix exponential) and the kernel by repeated squaring as in
``models.ssm.s4``: exact, O(d N^2 L) instead of O(d N L).  Bilinear is the fast default.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from models.conv.fftconv import LongConvLayer
from models.ssm.hippo import legs_dplr
from models.ssm.s4 import init_log_dt, matrix_power_pow2, power_vectors, zoh


def cauchy_woodbury(Lambda: torch.Tensor, W: torch.Tensor, dt: torch.Tensor,
                    omega: torch.Tensor) -> torch.Tensor:
    """Khat at frequencies omega for the bilinear DPLR system (conjugate pairs implied).

    Lambda: (d, M) complex, W: (d, 4, M) complex with rows [Ctilde*B, Ctilde*P, conj(Q)*B,
    conj(Q)*P], dt: (d,), omega: (F,) complex  ->  Khat (d, F) complex.
    """
    a = (1 - omega)[None, :]                                 # (1, F)
    b = (dt[:, None] / 2) * (1 + omega)[None, :]             # (d, F)
    # R[h, m, f] = 1 / (a_f - b_hf lambda_hm) and the same for the conjugate modes
    R = 1.0 / (a[:, None, :] - b[:, None, :] * Lambda[:, :, None])
    Rc = 1.0 / (a[:, None, :] - b[:, None, :] * Lambda.conj()[:, :, None])
    k = W @ R + W.conj() @ Rc                                # (d, 4, F)
    k00, k01, k10, k11 = k.unbind(1)
    return dt[:, None] * (k00 - b * k01 * k10 / (1 + b * k11))


class S4DPLR(LongConvLayer):
    """S4 (DPLR / NPLR parameterisation) inner layer. x: (batch, length, d) -> same.

    Parameters per channel: Lambda (N/2 complex; Re < 0 through -exp), P (N/2 complex,
    Q = P), B (N/2 complex), Ctilde (N/2 complex), log_dt, D.  State size d * N floats
    (N/2 complex modes and their conjugates = N real degrees of freedom).
    """

    def __init__(self, d: int, d_state: int = 64, disc: str = "bilinear",
                 dt_min: float = 1e-3, dt_max: float = 1e-1, freq_chunk: int = 512):
        super().__init__(d)
        if disc not in ("bilinear", "zoh"):
            raise ValueError(f"unknown disc {disc!r}; expected 'bilinear' or 'zoh'")
        if freq_chunk < 1:
            raise ValueError("freq_chunk must be >= 1")
        self.N, self.disc, self.freq_chunk = d_state, disc, freq_chunk
        hp = legs_dplr(d_state)
        M = d_state // 2

        def rep(z: torch.Tensor) -> torch.Tensor:  # (M,) complex -> (d, M, 2) real
            return torch.view_as_real(z.to(torch.complex64)).expand(d, M, 2).clone()

        self.log_neg_re = nn.Parameter(torch.log(-hp["Lambda"].real.float()).expand(d, M).clone())
        self.im = nn.Parameter(hp["Lambda"].imag.float().expand(d, M).clone())
        self.P = nn.Parameter(rep(hp["P"]))
        self.B = nn.Parameter(rep(hp["B"]))
        # Ctilde ~ complex normal, variance 1/2 per part (S4's default)
        self.C = nn.Parameter(torch.randn(d, M, 2) * math.sqrt(0.5))
        self.log_dt = nn.Parameter(init_log_dt(d, dt_min, dt_max))

    # -- parameters as complex tensors -------------------------------------------------
    def _complex(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        Lambda = torch.complex(-self.log_neg_re.exp(), self.im)
        return Lambda, torch.view_as_complex(self.P), torch.view_as_complex(self.B), \
            torch.view_as_complex(self.C)

    def dense_system(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The same system with conjugates made explicit: A (d, N, N), B (d, N), Ctilde (d, N)
        complex, dt (d,).  A = diag(Lambda, conj Lambda) - p p^*, p = [P, conj P]."""
        Lambda, P, B, C = self._complex()
        full = lambda z: torch.cat([z, z.conj()], dim=-1)  # noqa: E731
        p = full(P)
        A = torch.diag_embed(full(Lambda)) - p[:, :, None] * p.conj()[:, None, :]
        return A, full(B), full(C), self.log_dt.exp()

    # -- kernel ------------------------------------------------------------------------
    def kernel(self, L: int) -> torch.Tensor:
        """K: (d, L) real."""
        if self.disc == "zoh":
            return self._kernel_zoh(L)
        Lambda, P, B, C = self._complex()
        W = torch.stack([C * B, C * P, P.conj() * B, P.conj() * P], dim=1)   # (d, 4, M)
        dt = self.log_dt.exp()
        k = torch.arange(L // 2 + 1, device=dt.device, dtype=dt.dtype)
        omega = torch.polar(torch.ones_like(k), -2 * math.pi * k / L)            # (F,)
        chunks = []
        for s in range(0, omega.shape[0], self.freq_chunk):
            om = omega[s:s + self.freq_chunk]
            if torch.is_grad_enabled() and (Lambda.requires_grad or W.requires_grad):
                chunks.append(checkpoint(cauchy_woodbury, Lambda, W, dt, om, use_reentrant=False))
            else:
                chunks.append(cauchy_woodbury(Lambda, W, dt, om))
        Khat = torch.cat(chunks, dim=-1)                                        # (d, F)
        return torch.fft.irfft(Khat, n=L)

    def _kernel_zoh(self, L: int) -> torch.Tensor:
        # in complex128: the matrix exponential, Abar^L and the solve lose ~1e-4 relative
        # accuracy in complex64 at L=4096 (measured); this path is the slow exact one anyway
        A, B, Ct, dt = (t.to(torch.complex128) if t.is_complex() else t.double()
                        for t in self.dense_system())
        Abar, Bbar = zoh(A, B, dt.to(A.dtype))
        I = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
        # C = Ctilde (I - Abar^L)^-1  <=>  (I - Abar^L)^T C^T = Ctilde^T
        C = torch.linalg.solve((I - matrix_power_pow2(Abar, L)).transpose(-1, -2), Ct[..., None])[..., 0]
        V = power_vectors(Abar, Bbar, L)                                         # (d, N, L)
        return torch.einsum("hn,hnl->hl", C, V).real.to(self.log_dt.dtype)

    def state_size(self) -> int:
        return self.d * self.N
