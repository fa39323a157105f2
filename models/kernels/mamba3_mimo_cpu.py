"""The Mamba-3 MIMO recurrence in C on a CPU: backend ``cpu`` of
:func:`models.kernels.mamba3_scan.mamba3_mimo`, forward and hand-written backward.

Maths (``csrc/mamba3_mimo.c``), per batch row and head, steps t and ranks i, j: with the
trapezoid folded into the keys as in :mod:`models.kernels.mamba3_scan` (the running state
U_t = S_t + mu_{t+1} sum_j kr_{t,j} v_{t,j}^T, c_t = lam_t dt_t + mu_{t+1}, m_t = mu_{t+1}),

    U_t = exp(adt_t) U_{t-1} + c_t sum_j k_{t,j} v_{t,j}^T,
    o_{t,i} = U_t^T q_{t,i} - m_t sum_j (q_{t,i} . k_{t,j}) v_{t,j},

q_{t,i} and k_{t,i} turned by the angles theta_t inside the kernel (pairs (2l, 2l+1), as
``rotate``; its backward turns the gradients back and returns theta's). The kernel takes
(q, k, v, adt, c, m, U0, theta) and returns (o, U_L); autograd takes the gradients of c, m,
U0 and theta back to dt, lam, omega and the initial state. Backward: from the state stored every ``chunk``
steps, recomputing the chunk's states (memory B H (L / chunk + chunk) N P).

Build: as :mod:`models.kernels.cpu_kernels` (the system C compiler, the same flag sets and
cache directory; ``SSM_WORKBENCH_NO_CPU_KERNEL=1`` disables it); :func:`load` returns the
reason when it cannot build, and the MIMO op then runs its SSD form.
"""
from __future__ import annotations

import ctypes
import sys

import torch

from models.kernels import cpu_kernels as _ck

ABI_VERSION = 1
CHUNK = 64               # steps between stored states (the backward recomputes a chunk)
_LIBRARY = _ck.KernelLibrary("mamba3_mimo", ("mamba3_mimo.c", "mamba3_mimo_impl.h", "mamba3_mimo_body.h"),
                             ("m3_abi_version", ABI_VERSION), ("m3_fwd", "m3_bwd"), "Mamba-3 MIMO CPU kernel")
load = _LIBRARY.load
unsupported = _LIBRARY.unsupported     # (v) -> why the kernel cannot take these tensors, or ""


_MADV_HUGEPAGE = 14        # Linux <sys/mman.h>
_HUGE_MIN = 4 << 20        # bytes: below this the page faults cost little
_libc = None


def _empty(like: torch.Tensor, *shape: int) -> torch.Tensor:
    """``like.new_empty(*shape)``, on Linux advised into transparent huge pages before its first
    touch: the kernel's outputs (o, dq, dk, dv: B L r H P each) are fresh mappings, and
    faulting them in 4 KiB at a time cost about as much as the forward itself (measured
    ~23 ms per 64 MiB at L = 4096 against ~5 ms with 2 MiB pages). Advice only: where it is
    refused the tensor is the same."""
    global _libc
    t = like.new_empty(*shape)
    nbytes = t.numel() * t.element_size()
    if nbytes < _HUGE_MIN or not sys.platform.startswith("linux"):
        return t
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    page = 4096
    start = -(-t.data_ptr() // page) * page
    end = (t.data_ptr() + nbytes) // page * page
    if end > start:
        _libc.madvise(start, end - start, _MADV_HUGEPAGE)
    return t


def _call(kind: str, dtype: torch.dtype, tensors: list[torch.Tensor], sizes: list[int]) -> None:
    lib = _LIBRARY.library()
    ptrs = (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])
    longs = (ctypes.c_long * len(sizes))(*sizes)
    if getattr(lib, f"{kind}_{'f32' if dtype == torch.float32 else 'f64'}")(ptrs, longs) != 0:
        raise MemoryError(f"Mamba-3 MIMO kernel {kind}: could not allocate a work buffer")


class Mamba3MimoCPU(torch.autograd.Function):
    """q, k (b, L, r, h, N) before rotation, v (b, L, r, h, P), adt, c, m (b, L, h), U0
    (b, h, N, P), theta (b, L, h, R) (R = 0: no rotation), all one dtype -> (o (b, L, r, h,
    P), U_L (b, h, N, P))."""

    @staticmethod
    def forward(ctx, q, k, v, adt, c, m, U0, theta, chunk):
        b, L, r, h, N = q.shape
        P, R = v.shape[-1], theta.shape[-1]
        q, k, v, adt, c, m, U0, theta = (t.contiguous() for t in (q, k, v, adt, c, m, U0, theta))
        nck = -(-L // chunk)
        o, UL, ck = _empty(v, b, L, r, h, P), U0.new_empty(b, h, N, P), _empty(U0, b, h, nck, N, P)
        sizes = [b, L, r, h, N, P, chunk, torch.get_num_threads(), R]
        cos, sin = torch.cos(theta), torch.sin(theta)       # vectorised here, not per step in C
        _call("m3_fwd", v.dtype, [q, k, v, adt, c, m, U0, o, UL, ck, cos, sin], sizes)
        ctx.save_for_backward(q, k, v, adt, c, m, ck, cos, sin)
        ctx.sizes = sizes
        return o, UL

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, dUL):
        q, k, v, adt, c, m, ck, cos, sin = ctx.saved_tensors
        b, L, r, h, N, P, chunk, _, R = ctx.sizes
        do = torch.zeros_like(v) if do is None else do.contiguous()
        dUL = ck.new_zeros(b, h, N, P) if dUL is None else dUL.contiguous()
        dq, dk, dv = _empty(q, *q.shape), _empty(k, *k.shape), _empty(v, *v.shape)
        dadt, dc, dm, dU0 = (torch.empty_like(adt), torch.empty_like(c), torch.empty_like(m),
                             ck.new_empty(b, h, N, P))
        dtheta = _empty(cos, b, L, h, R)
        sizes = [b, L, r, h, N, P, chunk, torch.get_num_threads(), R]
        _call("m3_bwd", v.dtype, [q, k, v, adt, c, m, ck, do, dUL, dq, dk, dv, dadt, dc, dm, dU0,
                                  cos, dtheta, sin], sizes)
        return dq, dk, dv, dadt, dc, dm, dU0, dtheta, None


def mamba3_mimo_scan(q, k, v, adt, c, m, U0, theta, chunk: int | None = None):
    """The fused recurrence (module doc), q and k turned by ``theta`` (b, L, h, R) inside (as
    :func:`~models.kernels.mamba3_scan.rotate`); ``chunk`` steps between the backward's
    stored states (default :data:`CHUNK`). Returns (o, U_L)."""
    chunk = CHUNK if chunk is None else int(chunk)
    if chunk < 1:
        raise ValueError(f"mamba3_mimo_scan: chunk must be >= 1, got {chunk}")
    why = unsupported(v) or ("" if q.shape[-1] % 2 == 0 else f"odd state size {q.shape[-1]}")
    if why:
        raise ValueError(f"mamba3_mimo_scan: {why}")
    return Mamba3MimoCPU.apply(q, k, v, adt, c, m, U0, theta, chunk)
