"""Mamba-3's data-dependent rotation of q and k in C on a CPU, forward and hand-written
backward (issue 43, training at language-model shapes): what
:func:`models.kernels.mamba3_scan.rotate` does to C and B in the chunked SISO form, both in
one call with the same angles:

    y_2i = a c_i - b s_i,  y_2i+1 = a s_i + b c_i,   (a, b) = (x_2i, x_2i+1),
    c_i = cos theta_i, s_i = sin theta_i, i < R; channels past 2R copied.

With a per-row ``coef`` the same pass also gives the chunked form's scaled keys
kc = rot(k) coef and its correction's dot products qk = rot(q) . rot(k) (Mamba-3's SISO
``mamba3_scan._chunked``: two more products and a sum over (b, L, heads, N) otherwise, each
with its autograd twin).

Backward: dx = dy turned back by -theta; dtheta_i = sum over q and k of
dy_2i+1 y_2i - dy_2i y_2i+1 (as ``mamba3_scan._Rotate``). Autograd keeps the angles and the
two outputs (``_Rotate`` keeps the outputs and cos, sin per tensor). At 2 x 2048, d_model
256 the torch form (cos, sin, four strided multiply-adds per tensor, about twice as many
passes backward) was ~24% of a Mamba-3 step (torch.profiler, one thread, forward, its
recompute and backward); this is one read and one write of each row per direction, cos and
sin once for both tensors (float32: an inlined vectorised sin/cos, csrc/rotate.c): 7x the
torch form's fwd+bwd at (2, 512, 16, 64).

:func:`applies` gates it (float32 / float64 CPU tensors of one dtype, q, k and theta with one
leading shape, no autocast, the library built, :data:`ENABLED`); build as
:mod:`models.kernels.cpu_kernels` (``SSM_WORKBENCH_NO_CPU_KERNEL=1`` disables it). Tested
against ``mamba3_scan.rotate`` in tests/models/test_rotate_cpu.py.
"""
from __future__ import annotations

import ctypes

import torch

from models.kernels import cpu_kernels as _ck

ABI_VERSION = 4
ENABLED = True          # False: the torch rotation (one-process A/B timings)
ANGLES_ENABLED = True   # False: the torch angles (cumsum, floor; A/B timings, tests' twin)
MAX_ITEMS = 64          # row blocks per call
_LIBRARY = _ck.KernelLibrary("rotate", ("rotate.c", "rotate_impl.h"), ("rot_abi_version", ABI_VERSION),
                             ("rot_fwd", "rot_bwd", "rot_angles_fwd", "rot_angles_bwd"),
                             "Mamba-3 rotation CPU kernel")
load = _LIBRARY.load


def applies(q: torch.Tensor, k: torch.Tensor, theta: torch.Tensor) -> bool:
    """Whether :class:`RotatePairFn` runs: CPU float32/float64 q, k (..., N) of one shape and
    theta (..., R) of their leading shape and dtype, 0 < 2R <= N, outside autocast."""
    return (ENABLED and q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64)
            and k.dtype == q.dtype and theta.dtype == q.dtype and k.device == q.device
            and theta.device == q.device and k.shape == q.shape and q.dim() >= 1
            and theta.shape[:-1] == q.shape[:-1] and 0 < 2 * theta.shape[-1] <= q.shape[-1]
            and not (torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled())
            and load()[0] is not None)


def _rows(t: torch.Tensor, d: int) -> torch.Tensor:
    t = t.reshape(-1, d)
    return t if t.stride(-1) == 1 else t.contiguous()


def _call(kind: str, dtype: torch.dtype, tensors: list, sizes: list[int]) -> None:
    lib = _LIBRARY.library()
    ptrs = (ctypes.c_void_p * len(tensors))(*[None if t is None else t.data_ptr() for t in tensors])
    longs = (ctypes.c_long * len(sizes))(*sizes)
    if getattr(lib, f"{kind}_{'f32' if dtype == torch.float32 else 'f64'}")(ptrs, longs) != 0:
        raise MemoryError(f"rotation kernel {kind}: could not allocate a work buffer")


def _heads(t: torch.Tensor, h: int, d: int) -> torch.Tensor:
    t = t.reshape(-1, h, d)         # a view where t is only broadcast over its heads
    return t if t.stride(-1) == 1 else t.contiguous()


class RotatePairFn(torch.autograd.Function):
    """forward(q, k, theta, coef=None) -> (rot(q, theta), rot(k, theta)) (module doc); with
    coef (q's leading shape) also kc = rot(k, theta) coef[..., None] and qk = rot(q) . rot(k)
    (= q . k), the chunked Mamba-3 form's scaled keys and its correction's dot products, in
    the same pass. With q_bias / k_bias (h, N), q and k (..., h, N) are q + q_bias and
    k + k_bias (per head) before they turn: q and k may then be broadcast over their heads
    (stride 0, as Mamba-3's B and C), read in place, one row per head. Once differentiable."""

    @staticmethod
    def forward(ctx, q, k, theta, coef=None, q_bias=None, k_bias=None):
        N, R = q.shape[-1], theta.shape[-1]
        th = _rows(theta, R)
        rows = th.shape[0]
        heads = [1, 0, 0]           # hq, q and k head strides (s 8-10, csrc/rotate.c)
        ctx.biased = (None, None, 1)
        if q_bias is None and k_bias is None:
            q2, k2 = _rows(q, N), _rows(k, N)
        else:                       # q, k (..., h, N), maybe broadcast over h: read in place
            h = q.shape[-2]
            q2, k2 = _heads(q, h, N), _heads(k, h, N)
            heads = [h, q2.stride(1), k2.stride(1)]
            ctx.biased = (*(None if b is None else b.shape for b in (q_bias, k_bias)), h)
            q_bias = None if q_bias is None else q_bias.reshape(h, N).contiguous()
            k_bias = None if k_bias is None else k_bias.reshape(h, N).contiguous()
        qr, kr = q2.new_empty(rows, N), q2.new_empty(rows, N)
        cf = kc = qk = None
        if coef is not None:
            cf = coef.reshape(rows).contiguous()
            kc, qk = q2.new_empty(rows, N), q2.new_empty(rows)
        sizes = [rows, N, R, torch.get_num_threads(), min(rows, MAX_ITEMS), q2.stride(0),
                 k2.stride(0), th.stride(0)]
        if rows:
            _call("rot_fwd", q.dtype, [q2, k2, th, qr, kr, cf, kc, qk, q_bias, k_bias],
                  sizes + heads)
        ctx.save_for_backward(th, qr, kr, cf)
        ctx.sizes, ctx.shapes = sizes, (q.shape, theta.shape)
        if coef is None:
            return qr.view(q.shape), kr.view(q.shape)
        return qr.view(q.shape), kr.view(q.shape), kc.view(q.shape), qk.view(q.shape[:-1])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dqr, dkr, dkc=None, dqk=None):
        th, qr, kr, cf = ctx.saved_tensors
        rows, N = qr.shape
        R = th.shape[1]
        dqr = qr.new_zeros(rows, N) if dqr is None else _rows(dqr.to(qr.dtype), N)
        dkr = kr.new_zeros(rows, N) if dkr is None else _rows(dkr.to(kr.dtype), N)
        dq, dk, dth = qr.new_empty(rows, N), kr.new_empty(rows, N), qr.new_empty(rows, R)
        sizes = list(ctx.sizes)
        sizes[3], sizes[5], sizes[6] = torch.get_num_threads(), dqr.stride(0), dkr.stride(0)
        extra, dcoef = [None, None, None, None], None
        if cf is not None:
            dkc = qr.new_zeros(rows, N) if dkc is None else _rows(dkc.to(qr.dtype), N)
            dqk = qr.new_zeros(rows) if dqk is None else dqk.to(qr.dtype).reshape(rows).contiguous()
            dcoef = qr.new_empty(rows)
            extra = [cf, dkc, dqk, dcoef]
            sizes.append(dkc.stride(0))
        if rows:
            _call("rot_bwd", qr.dtype, [th, qr, kr, dqr, dkr, dq, dk, dth, *extra], sizes)
        qs, ts = ctx.shapes
        qb, kb, h = ctx.biased      # x = q + bias: the bias's gradient sums dq over positions
        return (dq.view(qs), dk.view(qs), dth.view(ts),
                None if dcoef is None else dcoef.view(qs[:-1]),
                None if qb is None else dq.view(-1, h, N).sum(0).view(qb),
                None if kb is None else dk.view(-1, h, N).sum(0).view(kb))


# -- Mamba-3's angles (issue 43, training at LM shapes) ------------------------------------
#
# theta_t = (theta0 + sum_{s<=t} omega_s dt_s) mod 2 pi (``mamba3_scan.angles``) in one C
# pass each way (csrc/rotate_impl.h, rot_angles_fwd / rot_angles_bwd). In torch: a product,
# the cumsum, the mod's divide, floor, multiply and subtract forward, and flip, cumsum, flip
# and two products backward, each a pass over (b, L, heads, R): about 6% of a Mamba-3 step at
# 2 x 2048, d_model 256 (forward, its segment recompute and backward).

def angles_apply(omega: torch.Tensor, dt: torch.Tensor, theta0: torch.Tensor) -> bool:
    """Whether :class:`AnglesFn` runs: CPU float32/float64 omega (b, L, h, R) with a
    contiguous last axis (broadcast views allowed), dt (b, L, h), theta0 (b, h, R), one
    dtype, outside autocast, the library built, :data:`ANGLES_ENABLED`."""
    return (ANGLES_ENABLED and omega.device.type == "cpu"
            and omega.dtype in (torch.float32, torch.float64)
            and dt.dtype == omega.dtype and theta0.dtype == omega.dtype
            and dt.device == omega.device and theta0.device == omega.device
            and omega.dim() == 4 and dt.shape == omega.shape[:3]
            and theta0.shape == (omega.shape[0], omega.shape[2], omega.shape[3])
            and (omega.shape[3] <= 1 or omega.stride(3) == 1)
            and not (torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled())
            and load()[0] is not None)


class AnglesFn(torch.autograd.Function):
    """forward(omega (b, L, h, R), dt (b, L, h), theta0 (b, h, R)) -> theta (b, L, h, R),
    ``mamba3_scan.angles`` (the mod's floor has zero gradient). omega and dt are read
    through their strides (omega broadcast over the heads stays a view); the backward
    returns omega's gradient at its full (b, L, h, R) shape (autograd sums a broadcast)."""

    @staticmethod
    def forward(ctx, omega, dt, theta0):
        b, L, h, R = omega.shape
        theta = omega.new_empty(b, L, h, R)
        th0 = theta0.contiguous()
        sizes = [b, L, h, R, *omega.stride()[:3], *dt.stride(), torch.get_num_threads()]
        if theta.numel():
            _call("rot_angles_fwd", omega.dtype, [omega, dt, th0, theta], sizes)
        ctx.save_for_backward(omega, dt)
        ctx.sizes = sizes
        return theta

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dtheta):
        omega, dt = ctx.saved_tensors
        b, L, h, R = omega.shape
        dtheta = dtheta.to(omega.dtype).contiguous()
        domega, ddt = omega.new_empty(b, L, h, R), omega.new_empty(b, L, h)
        dth0 = omega.new_empty(b, h, R)
        sizes = list(ctx.sizes)
        sizes[10] = torch.get_num_threads()
        if domega.numel() or ddt.numel():
            if R == 0:
                ddt.zero_()
            else:
                _call("rot_angles_bwd", omega.dtype, [omega, dt, dtheta, domega, ddt, dth0], sizes)
        else:
            dth0.zero_()
        return domega, ddt, dth0
