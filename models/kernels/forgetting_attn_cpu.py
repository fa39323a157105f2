"""Forgetting attention (FoX) in C on a CPU: backend ``cpu`` of
:mod:`models.attention.forgetting_attention`, forward and hand-written backward.

Maths (Lin et al., ICLR 2025), per batch row and head, positions i of the queries and j of
the keys (the queries are the last nq of the nk positions):

    z_ij = scale q_i . k_j + c_i - c_j  (j <= i),   c_t = sum_{l <= t} log f_l,
    P_ij = exp(z_ij - lse_i),  lse_i = log sum_j exp(z_ij),   o_i = sum_j P_ij v_j.

Backward, from dO: dP_ij = dO_i . v_j, D_i = dO_i . o_i, dz_ij = P_ij (dP_ij - D_i);
dq_i = scale sum_j dz_ij k_j, dk_j = scale sum_i dz_ij q_i, dv_j = sum_i P_ij dO_i and
dc_t = sum_j dz_tj - sum_i dz_it (the row sums vanish in exact arithmetic: softmax ignores a
per-row shift). autograd takes dc back through the float64 cumulative sum to the log gates.

Why C and not ``scaled_dot_product_attention``: see ``csrc/forgetting_attn.c``. The kernel
works flash-style, 8 queries at a time against their visible keys, so memory is O(L d) plus
a (8, L) score buffer per thread; the forward saves lse (batch, heads, nq) for the backward.

float32 precision: c is summed in float64 and the decay of a pair is formed as
(c_i - c_p0) + (c_p0 - c_j), p0 the first query of the block of 8, so its rounding error
scales with the decay of the pairs that carry weight, not with |c| (up to L |log f|); the
float32 error against the float64 definition stays near plain float32 attention's however
strong the forgetting (measured in docs/RESULTS.md).

Build: as :mod:`models.kernels.cpu_kernels` (the system C compiler, the same flag sets and
cache directory, ``SSM_WORKBENCH_NO_CPU_KERNEL=1`` disables it); :func:`load` returns the
reason when it cannot build, and ``auto`` then uses the ``torch`` form.
"""
from __future__ import annotations

import ctypes

import torch

from models.kernels import cpu_kernels as _ck

ABI_VERSION = 1
DMAX = 256               # largest head dimension the kernel takes (csrc: DMAX)
JT = 16                  # keys per score tile: kt and vt are padded to a multiple of it
_LIBRARY = _ck.KernelLibrary("forgetting_attn", ("forgetting_attn.c", "kernel_common.h",
                                                  "forgetting_attn_impl.h"),
                             ("fa_abi_version", ABI_VERSION), ("fa_fwd", "fa_bwd"),
                             "forgetting-attention CPU kernel")
load = _LIBRARY.load


def unsupported(q: torch.Tensor) -> str:
    """Why the kernel cannot take these queries ("" when it can)."""
    d = q.shape[-1]
    return _LIBRARY.unsupported(q, f"head dimension {d} > {DMAX}" if d > DMAX else "")


def _call(kind: str, dtype: torch.dtype, scale: float, tensors: list[torch.Tensor], sizes: list[int]) -> None:
    lib = _LIBRARY.library()
    s = ctypes.c_double(scale)
    ptrs = (ctypes.c_void_p * (len(tensors) + 1))(ctypes.addressof(s), *[t.data_ptr() for t in tensors])
    longs = (ctypes.c_long * len(sizes))(*sizes)
    rc = getattr(lib, f"{kind}_{'f32' if dtype == torch.float32 else 'f64'}")(ptrs, longs)
    if rc == -1:
        raise MemoryError(f"forgetting-attention kernel {kind}: could not allocate a work buffer")
    if rc != 0:
        raise RuntimeError(f"forgetting-attention kernel {kind}: bad sizes {sizes}")


def _transposed(x: torch.Tensor, ldk: int) -> torch.Tensor:
    """(bh, n, d) -> (bh, d, ldk), zero past n."""
    out = x.new_zeros(x.shape[0], x.shape[2], ldk)
    out[..., :x.shape[1]] = x.transpose(1, 2)
    return out


class ForgettingAttnCPU(torch.autograd.Function):
    """q: (bh, nq, d); k, v: (bh, nk, d), d a multiple of 16; c: (bh, nk) float64 ->
    o (bh, nq, d)."""

    @staticmethod
    def forward(ctx, q, k, v, c, scale):
        bh, nq, d = q.shape
        nk = k.shape[1]
        ldk = -(-nk // JT) * JT
        q, k, v, c = q.contiguous(), k.contiguous(), v.contiguous(), c.contiguous()
        kt = _transposed(k, ldk)
        out = q.new_empty(bh, nq, d)
        lse = q.new_empty(bh, nq)
        sizes = [bh, nq, nk, d, ldk, torch.get_num_threads()]
        _call("fa_fwd", q.dtype, scale, [q, kt, v, c, out, lse], sizes)
        ctx.save_for_backward(q, k, kt, v, c, out, lse)
        ctx.scale, ctx.sizes = scale, sizes
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, kt, v, c, out, lse = ctx.saved_tensors
        bh, nq, nk, d, ldk, _ = ctx.sizes
        sizes = [bh, nq, nk, d, ldk, torch.get_num_threads()]
        dq, dc = torch.empty_like(q), torch.empty_like(c)
        dkt, dvt = kt.new_empty(bh, d, ldk), kt.new_empty(bh, d, ldk)   # transposed, as kt
        _call("fa_bwd", q.dtype, ctx.scale,
              [q, k, kt, v, _transposed(v, ldk), c, out, lse, dout.contiguous(), dq, dkt, dvt, dc], sizes)
        return dq, dkt[..., :nk].transpose(1, 2), dvt[..., :nk].transpose(1, 2), dc, None


def forgetting_attn_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                        scale: float | None = None) -> torch.Tensor:
    """fla's calling convention: q (batch, nq, heads, d), k, v (batch, nk, heads, d) with
    nk >= nq (the queries are the last nq positions), g (batch, nk, heads) log forget
    gates -> (batch, nq, heads, d), in q's dtype (float32 or float64)."""
    why = unsupported(q)
    if why:
        raise ValueError(f"forgetting_attn_cpu: {why}")
    b, nq, h, d = q.shape
    nk = k.shape[1]
    scale = d ** -0.5 if scale is None else float(scale)
    c = torch.cumsum(g.to(torch.float64), dim=1)          # float64: see the module doc

    pad = -d % 16                  # zero channels: q . k and the first d of o unchanged

    def heads_first(x, n):
        x = x.to(q.dtype).transpose(1, 2).reshape(b * h, n, d)
        return torch.nn.functional.pad(x, (0, pad)) if pad else x

    c = c.transpose(1, 2).reshape(b * h, nk)
    o = ForgettingAttnCPU.apply(heads_first(q, nq), heads_first(k, nk), heads_first(v, nk), c, scale)
    return o[..., :d].view(b, h, nq, d).transpose(1, 2) if pad else o.view(b, h, nq, d).transpose(1, 2)
