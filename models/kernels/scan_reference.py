"""The S6 selective scan's sequential reference (backend "ref") and the input handling every
backend of :mod:`models.kernels.selective_scan` shares (B/C shapes, working dtype, delta's
bias and softplus, the D skip and the gate).

Apart from the dispatch so that the Triton kernels' self-check
(:func:`models.kernels.triton_kernels.self_check`) compares them with the reference without
importing the module that dispatches to them. Shapes and the recurrence: see
:mod:`models.kernels.selective_scan`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _check_bc(A, B, C):
    """B, C as (batch, state, length) (one group of (batch, 1, state, length) is squeezed);
    errors for what no backend here supports."""
    if B.dim() == 4:
        if B.shape[1] != 1 or C.dim() != 4 or C.shape[1] != 1:
            raise NotImplementedError("grouped B/C with more than one group are not supported")
        B, C = B[:, 0], C[:, 0]
    if B.dim() != 3 or C.dim() != 3:
        raise ValueError("B and C must be (batch, state, length) (input-dependent)")
    if A.is_complex():
        raise NotImplementedError("complex A is not supported")
    return B, C


def _work_dtype(u: torch.Tensor) -> torch.dtype:
    """Low-precision inputs are scanned in float32, as mamba-ssm does."""
    return torch.float32 if u.dtype in (torch.float16, torch.bfloat16) else u.dtype


def _prepare(u, delta, A, B, C, delta_bias, delta_softplus):
    """Common input handling: group dim, dtype, bias + softplus of delta."""
    B, C = _check_bc(A, B, C)
    work = _work_dtype(u)
    u, delta, B, C = u.to(work), delta.to(work), B.to(work), C.to(work)
    A = A.to(work)
    if delta_bias is not None:
        delta = delta + delta_bias.to(work)[:, None]
    if delta_softplus:
        delta = F.softplus(delta)
    return u, delta, A, B, C


def _finish(y, u, D, z, dtype_in):
    """out = (y + D u) * silu(z), cast back to the input dtype."""
    if D is not None:
        y = y + u * D.to(y.dtype)[:, None]
    if z is not None:
        y = y * F.silu(z.to(y.dtype))
    return y.to(dtype_in)


def selective_scan_ref(
    u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
    return_last_state=False, initial_state=None, neg_eigval=False,
):
    """Sequential reference scan. Shapes: see :mod:`models.kernels.selective_scan`. ``neg_eigval``: the
    transition 2 exp(delta A) - 1 in (-1, 1) (Grazzi et al. 2025) instead of exp(delta A).

    Loops with ``unbind`` over time: indexing step by step under autograd would make
    backward quadratic in length (every select's backward allocates a full-size grad).
    """
    dtype_in = u.dtype
    u, delta, A, B, C = _prepare(u, delta, A, B, C, delta_bias, delta_softplus)
    batch, dim, _ = u.shape
    h = (u.new_zeros(batch, dim, A.shape[1]) if initial_state is None
         else initial_state.to(u.dtype))
    ys = []
    for u_t, delta_t, B_t, C_t in zip(u.unbind(-1), delta.unbind(-1), B.unbind(-1), C.unbind(-1)):
        # u_t, delta_t: (batch, dim); B_t, C_t: (batch, state); h: (batch, dim, state)
        deltaA = torch.exp(delta_t[:, :, None] * A)                       # ZOH
        if neg_eigval:
            deltaA = 2 * deltaA - 1
        deltaB_u = delta_t[:, :, None] * B_t[:, None, :] * u_t[:, :, None]  # Euler
        h = deltaA * h + deltaB_u
        ys.append(torch.einsum("bdn,bn->bd", h, C_t))
    y = torch.stack(ys, dim=-1)  # (batch, dim, length)
    out = _finish(y, u, D, z, dtype_in)
    return (out, h) if return_last_state else out
