"""Gated RMS norm in C on a CPU, forward and hand-written backward (issue 43, training at
language-model shapes): Mamba-2's ``GatedRMSNorm`` (mamba-ssm's RMSNormGated with
norm_before_gate=False, group-wise) and the linear RNNs' ``GatedHeadRMSNorm`` (fla's
FusedRMSNormGated, per head, norm before the gate). With a(z) = silu(z) (or sigmoid(z)) and
r one per row and group of ``group_size`` channels:

    gate before norm:  h = x a(z),  y = h r w,      r = rsqrt(mean_group(h^2) + eps)
    norm before gate:  y = x r w a(z),              r = rsqrt(mean_group(x^2) + eps)

Backward (g the gradient reaching the normalised value, x_hat = h r or x r):
d(pre-norm) = r (g w - x_hat mean_group(g w x_hat)), dw = sum over rows of g x_hat, and
silu'(z) = s (1 + z (1 - s)), s = sigmoid(z) (sigmoid' = s (1 - s)).

Autograd keeps x, z and r (one float per row and group): what the recomputed torch form
keeps (its inputs), plus r. The kernel's forward is one pass over x and z (each group's
channels stay in cache between the sum of squares and the scaling), its backward one more;
the torch form is about eight elementwise passes forward, run twice (recomputed), and a dozen
autograd ops backward.

:func:`applies` gates it: float32 / float64 CPU tensors of one dtype and shape, no autocast,
the library built, :data:`ENABLED` (the A/B switch). Build: as
:mod:`models.kernels.cpu_kernels` (the system C compiler, the same flag sets and cache;
``SSM_WORKBENCH_NO_CPU_KERNEL=1`` disables it). :func:`gated_rms_norm_ref` is the plain
arithmetic the tests compare with (tests/models/test_gated_norm_cpu.py).

The same library holds Mamba-3's D skip and gate, out = (y + D x) silu(z) with D per head
(:class:`SkipGateFn`, :func:`skip_gate`): one pass forward, one backward, keeping y, x and z
(what the recomputed torch form keeps) instead of running the forward twice.
"""
from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from models.kernels import cpu_kernels as _ck

ABI_VERSION = 2
ENABLED = True          # False: callers take their torch form (one-process A/B timings)
MAX_ITEMS = 64          # row blocks per call: the backward's weight-gradient partial sums
_LIBRARY = _ck.KernelLibrary("gated_norm", ("gated_norm.c", "kernel_common.h", "gated_norm_impl.h"),
                             ("gn_abi_version", ABI_VERSION), ("gn_fwd", "gn_bwd", "sg_fwd", "sg_bwd"),
                             "gated RMS norm CPU kernel")
load = _LIBRARY.load


def _autocast() -> bool:
    return torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled()


def applies(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :class:`GatedRMSNormFn` runs for x, z: CPU tensors of one shape in float32 or
    float64 with a weight of their dtype and width, outside autocast, the library built
    (half precision and other devices keep their callers' torch forms)."""
    return (ENABLED and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
            and z.dtype == x.dtype and weight.dtype == x.dtype and z.device == x.device
            and weight.device == x.device and z.shape == x.shape and x.dim() >= 1
            and weight.shape == x.shape[-1:] and not _autocast() and load()[0] is not None)


def _rows(t: torch.Tensor, d: int) -> torch.Tensor:
    """t as (rows, d) with contiguous channels and one row stride (a view when it can be)."""
    t = t.reshape(-1, d)
    return t if t.stride(-1) == 1 else t.contiguous()


def _call(kind: str, dtype: torch.dtype, eps: float, tensors: list, sizes: list[int]) -> None:
    lib = _LIBRARY.library()
    e = ctypes.c_double(eps)
    ptrs = (ctypes.c_void_p * (len(tensors) + 1))(
        ctypes.addressof(e), *[None if t is None else t.data_ptr() for t in tensors])
    longs = (ctypes.c_long * len(sizes))(*sizes)
    if getattr(lib, f"{kind}_{'f32' if dtype == torch.float32 else 'f64'}")(ptrs, longs) != 0:
        raise RuntimeError(f"gated RMS norm kernel {kind} failed (sizes {sizes})")


class GatedRMSNormFn(torch.autograd.Function):
    """forward(x, z, weight, eps, group_size, norm_before_gate, sigmoid) -> y, x's shape:
    x, z (..., d), weight (d,), group_size dividing d (module doc); once differentiable."""

    @staticmethod
    def forward(ctx, x, z, weight, eps: float, group_size: int, norm_before_gate: bool,
                sigmoid: bool):
        d = x.shape[-1]
        if d % group_size:
            raise ValueError(f"group_size {group_size} does not divide {d}")
        x2, z2, w = _rows(x, d), _rows(z, d), weight.contiguous()
        rows = x2.shape[0]
        out = x2.new_empty(rows, d)
        rstd = x2.new_empty(rows, d // group_size)
        items = min(rows, MAX_ITEMS)
        sizes = [rows, d // group_size, group_size, int(norm_before_gate), int(sigmoid),
                 torch.get_num_threads(), items, x2.stride(0), z2.stride(0)]
        if rows and d:
            _call("gn_fwd", x.dtype, eps, [x2, z2, w, out, rstd], sizes)
        ctx.save_for_backward(x2, z2, w, rstd)
        ctx.eps, ctx.sizes, ctx.shapes = eps, sizes, (x.shape, z.shape)
        return out.view(x.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x2, z2, w, rstd = ctx.saved_tensors
        rows, d = x2.shape
        dy2 = _rows(dy.to(x2.dtype), d)
        dx, dz = x2.new_empty(rows, d), x2.new_empty(rows, d)
        sizes = list(ctx.sizes)
        sizes[5] = torch.get_num_threads()
        items = sizes[6]
        dw_part = x2.new_empty(items, d)
        if rows and d:
            _call("gn_bwd", x2.dtype, ctx.eps, [x2, z2, w, rstd, dy2, dx, dz, dw_part],
                  sizes + [dy2.stride(0)])
        else:
            dx.zero_(), dz.zero_(), dw_part.zero_()
        dw = dw_part.sum(0) if ctx.needs_input_grad[2] else None
        xs, zs = ctx.shapes
        return dx.view(xs), dz.view(zs), dw, None, None, None, None


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float,
                   group_size: int | None = None, norm_before_gate: bool = False,
                   sigmoid: bool = False) -> torch.Tensor:
    """The gated norm (module doc) by the kernel where :func:`applies`, else by
    :func:`gated_rms_norm_ref`. group_size None: the whole last dim."""
    gs = x.shape[-1] if group_size is None else group_size
    if applies(x, z, weight):
        return GatedRMSNormFn.apply(x, z, weight, eps, gs, norm_before_gate, sigmoid)
    return gated_rms_norm_ref(x, z, weight, eps, gs, norm_before_gate, sigmoid)


def gated_rms_norm_ref(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float,
                       group_size: int | None = None, norm_before_gate: bool = False,
                       sigmoid: bool = False) -> torch.Tensor:
    """The plain arithmetic (autograd through it): the twin the tests compare with, and the
    fallback of :func:`gated_rms_norm`. Half precision is normalised in float32 and returned
    in x's dtype with the casts of the torch forms it stands for: norm before gate as
    ``models.common.rms_norm(x, w, eps) * a(z)`` (the linear RNNs' output norms), gate
    before norm as Mamba-2's ``GatedRMSNorm`` (all in float32, then cast)."""
    gs = x.shape[-1] if group_size is None else group_size
    act = torch.sigmoid if sigmoid else F.silu
    f = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    h = x.to(f) if norm_before_gate else x.to(f) * act(z.to(f))
    g = h.unflatten(-1, (-1, gs))
    g = (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)).flatten(-2)
    if norm_before_gate:
        return g.to(x.dtype) * weight * act(z)
    return (g * weight).to(x.dtype)


class SkipGateFn(torch.autograd.Function):
    """forward(y, x, z, Dc, sigmoid) -> (y + Dc x) a(z): y, x, z (..., d) of one shape, Dc (d,)
    the skip's weight per channel; once differentiable."""

    @staticmethod
    def forward(ctx, y, x, z, Dc, sigmoid: bool):
        d = y.shape[-1]
        y2, x2, z2, D = _rows(y, d), _rows(x, d), _rows(z, d), Dc.contiguous()
        rows = y2.shape[0]
        out = y2.new_empty(rows, d)
        sizes = [rows, d, int(sigmoid), torch.get_num_threads(), min(rows, MAX_ITEMS),
                 y2.stride(0), x2.stride(0), z2.stride(0)]
        if rows and d:
            _call("sg_fwd", y.dtype, 0.0, [y2, x2, z2, D, out], sizes)
        ctx.save_for_backward(y2, x2, z2, D)
        ctx.sizes, ctx.shape = sizes, y.shape
        return out.view(y.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        y2, x2, z2, D = ctx.saved_tensors
        rows, d = y2.shape
        g = _rows(dout.to(y2.dtype), d)
        dy, dx, dz = (y2.new_empty(rows, d) for _ in range(3))
        sizes = list(ctx.sizes)
        sizes[3] = torch.get_num_threads()
        dD_part = y2.new_empty(sizes[4], d)
        if rows and d:
            _call("sg_bwd", y2.dtype, 0.0, [y2, x2, z2, D, g, dy, dx, dz, dD_part],
                  sizes + [g.stride(0)])
        else:
            dy.zero_(), dx.zero_(), dz.zero_(), dD_part.zero_()
        s = ctx.shape
        return dy.view(s), dx.view(s), dz.view(s), dD_part.sum(0), None


def skip_gate_applies(y: torch.Tensor, x: torch.Tensor, z: torch.Tensor, D: torch.Tensor) -> bool:
    """Whether :func:`skip_gate` runs the kernel: as :func:`applies` for y, x, z, and D of
    their dtype."""
    return (applies(y, z, y.new_empty(y.shape[-1:])) and x.shape == y.shape
            and x.dtype == y.dtype and x.device == y.device and D.dtype == y.dtype
            and D.device == y.device)


def skip_gate(y: torch.Tensor, x: torch.Tensor, z: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    """(y + D[:, None] x) silu(z): y, x, z (..., heads, P), D (heads,), by the kernel where
    :func:`skip_gate_applies`, else by :func:`skip_gate_ref`."""
    if skip_gate_applies(y, x, z, D):
        Dc = D[:, None].expand(D.shape[0], y.shape[-1]).reshape(-1)
        return SkipGateFn.apply(y.flatten(-2), x.flatten(-2), z.flatten(-2), Dc,
                                False).view(y.shape)
    return skip_gate_ref(y, x, z, D)


def skip_gate_ref(y: torch.Tensor, x: torch.Tensor, z: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    """The plain arithmetic of :func:`skip_gate` (the tests' twin)."""
    return (y + D[:, None] * x) * F.silu(z)
