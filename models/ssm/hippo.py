"""HiPPO-LegS matrices and their normal-plus-low-rank (NPLR / DPLR) form.

HiPPO-LegS (Gu et al. 2020, "HiPPO"; Gu et al. 2021, "S4"), state size N, n, k = 0..N-1:

    A[n, k] = -sqrt(2n+1) sqrt(2k+1)   if n > k
            = -(n + 1)                  if n == k
            = 0                         if n < k
    B[n]    = sqrt(2n+1)

NPLR form (S4, Theorem 1): with P[n] = sqrt(n + 1/2),

    S = A + P P^T = -1/2 I + (skew-symmetric)

is normal, so S = V Lambda V^* with V unitary and Lambda = -1/2 + i mu.  Hence

    A = V Lambda V^* - P P^T = V (Lambda - P~ P~^*) V^*,   P~ = V^* P,

i.e. in the eigenbasis of S, A is diagonal plus rank 1 (DPLR), with Q = P.
The eigenvalues of a real skew-symmetric matrix come in conjugate pairs +-i mu with
conjugate eigenvectors, so only the N/2 modes with mu > 0 are kept; the other half is
their complex conjugate (that is what makes the kernel real: 2 Re of a half sum).
"""
from __future__ import annotations

import torch


def legs(N: int, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """HiPPO-LegS (A, B): A (N, N), B (N,)."""
    q = torch.sqrt(2 * torch.arange(N, dtype=dtype) + 1)
    A = -(q[:, None] * q[None, :])
    A = torch.tril(A, diagonal=-1) - torch.diag(torch.arange(N, dtype=dtype) + 1)
    return A, q.clone()


def legs_low_rank(N: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """P (N,) with A + P P^T normal: P[n] = sqrt(n + 1/2)."""
    return torch.sqrt(torch.arange(N, dtype=dtype) + 0.5)


def legs_dplr(N: int) -> dict[str, torch.Tensor]:
    """HiPPO-LegS in the diagonal-plus-low-rank basis, N even, float64 / complex128.

    Returns the N/2 modes with positive imaginary part (their conjugates are implied):
    ``Lambda`` (N/2,) complex, ``P`` (N/2,) complex (= V_h^* P), ``B`` (N/2,) complex
    (= V_h^* B), ``V`` (N, N/2) complex (the kept eigenvectors; the full unitary basis is
    [V, conj(V)]).
    """
    if N % 2:
        raise ValueError(f"the DPLR form keeps conjugate pairs: N must be even, got {N}")
    A, B = legs(N)
    P = legs_low_rank(N)
    S = A + P[:, None] * P[None, :]
    skew = S + 0.5 * torch.eye(N, dtype=S.dtype)  # real skew-symmetric
    # -i * skew is Hermitian: eigh gives real mu and an orthonormal V, skew = V diag(i mu) V^*
    mu, V = torch.linalg.eigh(-1j * skew.to(torch.complex128))
    keep = mu > 0
    if int(keep.sum()) != N // 2:
        raise RuntimeError("HiPPO-LegS skew part has a zero eigenvalue; cannot pair modes")
    mu, V = mu[keep], V[:, keep]
    Lambda = -0.5 + 1j * mu.to(torch.complex128)
    Vh = V.conj().T
    return {
        "Lambda": Lambda,
        "P": Vh @ P.to(torch.complex128),
        "B": Vh @ B.to(torch.complex128),
        "V": V,
    }
