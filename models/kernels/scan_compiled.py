"""The ``compiled`` backend of the selective scan (opt-in, never picked by ``auto``): the
blockwise algorithm of :class:`models.kernels.selective_scan.SelectiveScanTorch` with each
block's forward and backward written as pure functions and handed to ``torch.compile``
(one graph per block shape, ``dynamic=False``). Also the time-major layout helpers both
blockwise backends share.
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch


def _time_major(u, delta, A, B, C):
    """(batch, dim, L) / (batch, N, L) / (dim, N) -> contiguous (L, batch, dim) / (L, batch, N) / (N, dim)."""
    return (u.permute(2, 0, 1).contiguous(), delta.permute(2, 0, 1).contiguous(),
            A.t().contiguous(), B.permute(2, 0, 1).contiguous(), C.permute(2, 0, 1).contiguous())


def _state_major(h, u, N):
    """A (batch, dim, N) state, or None for zeros, as the blockwise scans carry it: (batch, N,
    dim), contiguous, in the dtype of u (batch, dim, L)."""
    if h is None:
        return u.new_zeros(u.shape[0], N, u.shape[1])
    return h.to(u.dtype).transpose(1, 2).contiguous()


def _backward_inputs(ctx, dy, dh_last):
    """What both blockwise backwards start from, given the saved (u, delta, A, B, C,
    block_h0): uT, deltaT, At, BT, CT as :func:`_time_major`, dy (batch, dim, L) as
    (L, batch, dim), the block-start states (n_blocks, batch, N, dim) and the carry
    dL/dh_L (batch, N, dim), zeros when dh_last is None."""
    u, delta, A, B, C, block_h0 = ctx.saved_tensors
    return (*_time_major(u, delta, A, B, C), dy.permute(2, 0, 1).contiguous(), block_h0,
            _state_major(dh_last, u, A.shape[1]))


def _block_forward(d, u, At, B, C, h):
    """One block of the scan, functional (no in-place writes), so it compiles to one kernel.

    d, u: (T, batch, dim); At: (N, dim); B, C: (T, batch, N); h: (batch, N, dim) = h_{s-1}.
    Returns y (T, batch, dim) and the last state (batch, N, dim).
    """
    deltaA = torch.exp(d[:, :, None, :] * At)                      # ZOH
    deltaB_u = (d * u)[:, :, None, :] * B[..., None]               # Euler
    ys = []
    for t in range(d.shape[0]):  # unrolled at trace time: T is fixed per graph
        h = deltaA[t] * h + deltaB_u[t]
        ys.append((h * C[t, :, :, None]).sum(1))                   # y_t = C_t . h_t
    return torch.stack(ys), h


def _block_backward(d, u, At, B, C, dy, h_start, carry):
    """Gradients of one block, functional. Shapes as in :func:`_block_forward`; dy: (T, b, dim);
    carry = dL/dh at the block's last step from everything after it (b, N, dim).

    Returns du, ddelta (T, b, dim); dB, dC (T, b, N); dAt (N, dim) of this block; and
    dL/dh_{s-1} (b, N, dim), the carry for the previous block.
    """
    T = d.shape[0]
    deltaA = torch.exp(d[:, :, None, :] * At)
    deltaB_u = (d * u)[:, :, None, :] * B[..., None]
    hs, h = [], h_start
    for t in range(T):                                             # recompute the states
        h = deltaA[t] * h + deltaB_u[t]
        hs.append(h)
    # adjoint: g_t = dL/dh_t = C_t dy_t + deltaA_{t+1} g_{t+1}
    Cdy = C[..., None] * dy[:, :, None, :]
    gs = [Cdy[T - 1] + carry]
    for t in range(T - 2, -1, -1):
        gs.append(Cdy[t] + deltaA[t + 1] * gs[-1])
    g = torch.stack(gs[::-1])                                      # (T, b, N, dim)
    h_all = torch.stack(hs)
    h_prev = torch.cat([h_start[None], h_all[:-1]])
    dC = (h_all * dy[:, :, None, :]).sum(-1)
    gB = (g * B[..., None]).sum(2)                                 # sum_n g B: (T, b, dim)
    du = gB * d
    dB = (g * (d * u)[:, :, None, :]).sum(-1)
    g_dA = g * h_prev * deltaA                                     # dL/d(delta A)
    ddelta = (g_dA * At).sum(2) + gB * u
    dAt = (g_dA * d[:, :, None, :]).sum((0, 1))
    return du, ddelta, dB, dC, dAt, deltaA[0] * g[0]


class _Compiled:
    """Lazily ``torch.compile``d block kernels; eager on the first compile failure (warned once)."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.compiled: Callable | None = None
        self.failed = False

    def __call__(self, *args):
        if not self.failed:
            try:
                if self.compiled is None:
                    self.compiled = torch.compile(self.fn, dynamic=False)
                return self.compiled(*args)
            except Exception as exc:  # noqa: BLE001  any compiler failure: run eagerly instead
                self.failed = True
                msg = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
                warnings.warn(f"selective scan: torch.compile of {self.fn.__name__} failed "
                              f"({type(exc).__name__}: {msg}); running it eagerly", RuntimeWarning)
        return self.fn(*args)


_compiled_forward = _Compiled(_block_forward)
_compiled_backward = _Compiled(_block_backward)


class SelectiveScanCompiled(torch.autograd.Function):
    """:class:`SelectiveScanTorch` with compiled block kernels; same inputs, outputs, memory."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, h0, block_len):
        L = u.shape[2]
        uT, deltaT, At, BT, CT = _time_major(u, delta, A, B, C)
        h = _state_major(h0, u, A.shape[1])
        starts = list(range(0, L, block_len))
        block_h0, ys = [], []
        for s in starts:
            e = min(s + block_len, L)
            block_h0.append(h)
            y, h = _compiled_forward(deltaT[s:e], uT[s:e], At, BT[s:e], CT[s:e], h)
            ys.append(y)
        ctx.save_for_backward(u, delta, A, B, C, torch.stack(block_h0))
        ctx.block_len = block_len
        ctx.has_h0 = h0 is not None
        return torch.cat(ys).permute(1, 2, 0), h.transpose(1, 2)

    @staticmethod
    def backward(ctx, dy, dh_last):
        uT, deltaT, At, BT, CT, dyT, block_h0, carry = _backward_inputs(ctx, dy, dh_last)
        block_len = ctx.block_len
        L = uT.shape[0]
        du, ddelta, dB, dC = (torch.empty_like(uT), torch.empty_like(deltaT),
                              torch.empty_like(BT), torch.empty_like(CT))
        dAt = torch.zeros_like(At)
        starts = list(range(0, L, block_len))
        for k in reversed(range(len(starts))):
            s = starts[k]
            e = min(s + block_len, L)
            du[s:e], ddelta[s:e], dB[s:e], dC[s:e], dAt_k, carry = _compiled_backward(
                deltaT[s:e], uT[s:e], At, BT[s:e], CT[s:e], dyT[s:e], block_h0[k], carry)
            dAt += dAt_k
        dh0 = carry.transpose(1, 2) if ctx.has_h0 else None
        return (du.permute(1, 2, 0), ddelta.permute(1, 2, 0), dAt.t(),
                dB.permute(1, 2, 0), dC.permute(1, 2, 0), dh0, None)
