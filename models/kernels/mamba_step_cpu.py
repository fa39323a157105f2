"""The decode step of Mamba and Mamba-2 in C on the CPU (issue 43): ``csrc/mamba_step.c``.

One call per layer and token from the output of the layer's input projection to the input
of its output projection (the matmuls around it stay PyTorch's):

- :func:`mamba_step`: the conv window + bias + SiLU (and the next conv cache), x_proj,
  dt_proj, softplus, exp(delta A), the state update h' = dA h + delta B x (2 dA - 1 with
  ``allow_neg_eigval``), y = C . h' + D x, times silu(z);
- :func:`mamba2_step`: the conv over x, B, C, softplus(dt + dt_bias), the per-head decay,
  the SSD's one-token update S' = a S + B (dt x)^T, y = S'^T C + D x, and the gated RMS
  norm per group.

- :func:`add_rmsnorm`: the residual stack's glue between two layers' decode steps,
  x' = x + y and the next layer's pre-norm rmsnorm(x') w (``RecurrentStack.step``: at
  small widths the norm's five PyTorch ops cost as much as a whole mixer step).

Each has a plain PyTorch twin (``mamba_step_ref``, ``mamba2_step_ref``) with the same
arguments and results, the tests' oracle for the C; the mixers' own reference is their
torch step (``Mamba._torch_step``, ``Mamba2._torch_step``) and their full forward. The
state and conv cache passed in are read, never written: the results are new tensors
(the decode loops, CUDA-graph and sync-free, rely on that contract).

Only without autograd, on CPU float32 / float64 tensors of one dtype
(:func:`unsupported` says why not, and the mixers then take their torch step).
"""
from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from models.kernels import cpu_kernels

ABI_VERSION = 2
_LIBRARY = cpu_kernels.KernelLibrary(
    "mamba_step", ("mamba_step.c", "kernel_common.h", "mamba_step_impl.h"),
    ("ms_abi_version", ABI_VERSION), ("ms_mamba", "ms_mamba2", "ms_add_rmsnorm"),
    "Mamba decode-step kernel")


def unsupported(x: torch.Tensor, *tensors: torch.Tensor | None) -> str:
    """Why the C step cannot take these tensors ("" when it can): autograd recording, not
    CPU float32 / float64, tensors of another dtype or device, or the library
    unavailable."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (x, *tensors)):
        return "autograd is recording (the C step has no backward)"
    if x.dim() != 2:
        return f"input of shape {tuple(x.shape)}: the step takes (batch, width)"
    dtype, cpu = x.dtype, x.is_cpu
    for t in tensors:                  # a plain loop: at decode widths this check is timed
        if t is not None and (t.dtype is not dtype or t.is_cpu is not cpu):
            return "the state, input and parameters are not of one dtype and device"
    return _LIBRARY.unsupported(x)


def neg_exp(module: torch.nn.Module, A_log: torch.Tensor) -> torch.Tensor:
    """-exp(A_log), kept on ``module`` and reused while A_log is the same tensor at the same
    version (an optimiser step, ``load_state_dict`` or ``.to`` changes it, and the next
    call computes it anew). Only for steps without autograd."""
    try:
        key = (A_log.data_ptr(), A_log._version, A_log.dtype, A_log.device)
    except RuntimeError:            # inference tensors carry no version: do not cache
        return -torch.exp(A_log.detach())
    hit = module.__dict__.get("_neg_exp_cache")
    if hit is not None and hit[0] == key:
        return hit[1]
    A = -torch.exp(A_log.detach())
    module.__dict__["_neg_exp_cache"] = (key, A)
    return A


def mamba_step(xz, conv_state, conv_w, conv_b, x_proj_w, dt_w, dt_b, A, D, h, *,
               allow_neg_eigval: bool):
    """Mamba's decode step (``models.ssm.mamba.Mamba``). xz (B, 2 d_inner): in_proj's
    output [x | z]; conv_state (B, d_inner, W - 1); conv_w (d_inner, 1, W), conv_b
    (d_inner) or None; x_proj_w (dt_rank + 2 d_state, d_inner); dt_w (d_inner, dt_rank),
    dt_b (d_inner); A = -exp(A_log) (d_inner, d_state); D (d_inner); h (B, d_inner,
    d_state). Returns (y (B, d_inner), the next conv cache, h'), new tensors: y the input
    of out_proj."""
    Bsz, Din, N = h.shape
    W = conv_w.shape[-1]
    R = dt_w.shape[1]
    if xz.stride(-1) != 1:
        xz = xz.contiguous()
    h, cache = h.contiguous(), conv_state.contiguous()
    h2, cache2, y = torch.empty_like(h), torch.empty_like(cache), xz.new_empty(Bsz, Din)
    keep = [None if t is None else t.contiguous()               # alive for the call
            for t in (conv_w, conv_b, x_proj_w, dt_w, dt_b, A, D)]
    ptrs = (ctypes.c_void_p * 13)(xz.data_ptr(), cache.data_ptr(), cache2.data_ptr(),
                                  *[None if t is None else t.data_ptr() for t in keep],
                                  h.data_ptr(), h2.data_ptr(), y.data_ptr())
    sizes = (ctypes.c_long * 9)(Bsz, Din, N, R, W, xz.stride(0), Din, int(allow_neg_eigval),
                                torch.get_num_threads())
    lib = _LIBRARY.library()
    fn = lib.ms_mamba_f32 if xz.dtype == torch.float32 else lib.ms_mamba_f64
    if fn(ptrs, sizes) != 0:
        raise MemoryError("Mamba decode-step kernel: could not allocate a work buffer")
    return y, cache2, h2


def mamba_step_ref(xz, conv_state, conv_w, conv_b, x_proj_w, dt_w, dt_b, A, D, h, *,
                   allow_neg_eigval: bool):
    """:func:`mamba_step` in plain PyTorch."""
    Din, N = A.shape
    R = dt_w.shape[1]
    x, z = xz[:, :Din], xz[:, Din:2 * Din]
    window = torch.cat([conv_state, x[:, :, None]], -1)                    # (B, Din, W)
    xc = (window * conv_w[:, 0]).sum(-1)
    if conv_b is not None:
        xc = xc + conv_b
    xc = F.silu(xc)
    dt, Bm, Cm = F.linear(xc, x_proj_w).split([R, N, N], -1)
    delta = F.softplus(F.linear(dt, dt_w, dt_b))                           # (B, Din)
    dA = torch.exp(delta[..., None] * A)
    if allow_neg_eigval:
        dA = 2 * dA - 1
    h2 = dA * h + (delta * xc)[..., None] * Bm[:, None, :]
    y = (h2 * Cm[:, None, :]).sum(-1) + D * xc
    return y * F.silu(z), window[..., 1:].clone(), h2


def mamba2_step(u, conv_state, conv_w, conv_b, dt_bias, A_log, D, norm_w, S, *, ngroups: int,
                eps: float):
    """Mamba-2's decode step (``models.ssm.mamba2.Mamba2``). u (B, d_inner + conv_dim +
    nheads): in_proj's output [z | x B C | dt_raw]; conv_state (B, conv_dim, W - 1);
    conv_w (conv_dim, 1, W), conv_b (conv_dim) or None; dt_bias, A_log, D (nheads);
    norm_w (d_inner) the gated norm's weight (groups of d_inner / ngroups channels,
    norm_before_gate=False, ``eps``); S (B, nheads, d_state, headdim). Returns (o (B,
    d_inner), the next conv cache, S'), new tensors: o the input of out_proj."""
    Bsz, H, N, P = S.shape
    W = conv_w.shape[-1]
    HP = H * P
    if u.stride(-1) != 1:
        u = u.contiguous()
    S, cache = S.contiguous(), conv_state.contiguous()
    S2, cache2, out = torch.empty_like(S), torch.empty_like(cache), u.new_empty(Bsz, HP)
    keep = [None if t is None else t.contiguous()               # alive for the call
            for t in (conv_w, conv_b, dt_bias, A_log, D, norm_w)]
    scal = (ctypes.c_double * 1)(eps)
    ptrs = (ctypes.c_void_p * 13)(u.data_ptr(), cache.data_ptr(), cache2.data_ptr(),
                                  *[None if t is None else t.data_ptr() for t in keep],
                                  S.data_ptr(), S2.data_ptr(), out.data_ptr(),
                                  ctypes.addressof(scal))
    sizes = (ctypes.c_long * 10)(Bsz, H, P, N, ngroups, W, u.stride(0), HP,
                                 HP + cache.shape[1], torch.get_num_threads())
    lib = _LIBRARY.library()
    fn = lib.ms_mamba2_f32 if u.dtype == torch.float32 else lib.ms_mamba2_f64
    if fn(ptrs, sizes) != 0:
        raise MemoryError("Mamba-2 decode-step kernel: could not allocate a work buffer")
    return out, cache2, S2


def mamba2_step_ref(u, conv_state, conv_w, conv_b, dt_bias, A_log, D, norm_w, S, *,
                    ngroups: int, eps: float):
    """:func:`mamba2_step` in plain PyTorch."""
    Bsz, H, N, P = S.shape
    HP, G = H * P, ngroups
    Cd = conv_state.shape[1]
    z, xBC, dt_raw = u[:, :HP], u[:, HP:HP + Cd], u[:, HP + Cd:HP + Cd + H]
    window = torch.cat([conv_state, xBC[:, :, None]], -1)                  # (B, Cd, W)
    xBC = (window * conv_w[:, 0]).sum(-1)
    if conv_b is not None:
        xBC = xBC + conv_b
    x, Bm, Cm = F.silu(xBC).split([HP, G * N, G * N], -1)
    x = x.view(Bsz, H, P)
    Bm = Bm.view(Bsz, G, N).repeat_interleave(H // G, 1)                   # (B, H, N)
    Cm = Cm.view(Bsz, G, N).repeat_interleave(H // G, 1)
    dt = F.softplus(dt_raw + dt_bias)                                      # (B, H)
    a = torch.exp(dt * -torch.exp(A_log))
    S2 = a[..., None, None] * S + Bm[..., :, None] * (dt[..., None] * x)[..., None, :]
    y = (Cm[..., :, None] * S2).sum(-2) + D[:, None] * x                   # (B, H, P)
    g = (y.reshape(Bsz, HP) * F.silu(z)).view(Bsz, G, HP // G)
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)
    return g.reshape(Bsz, HP) * norm_w, window[..., 1:].clone(), S2


def add_rmsnorm(x, y, w, eps: float):
    """x (B, d), y (B, d) or None, w (d,) -> (x' = x + y (x itself when y is None),
    rmsnorm(x') w (B, d)), new tensors (x' is new unless y is None)."""
    x = x.contiguous()                 # no copy when it is (as the residual stream is)
    Bsz, d = x.shape
    h = torch.empty_like(x)
    if y is None:
        xo = x
    else:
        y = y.contiguous()
        xo = torch.empty_like(x)
    scal = (ctypes.c_double * 1)(eps)
    ptrs = (ctypes.c_void_p * 6)(x.data_ptr(), None if y is None else y.data_ptr(),
                                 w.data_ptr(), xo.data_ptr(), h.data_ptr(),
                                 ctypes.addressof(scal))
    sizes = (ctypes.c_long * 4)(Bsz, d, d, d)
    lib = _LIBRARY.library()
    (lib.ms_add_rmsnorm_f32 if x.dtype == torch.float32 else lib.ms_add_rmsnorm_f64)(ptrs, sizes)
    return xo, h


def add_rmsnorm_ref(x, y, w, eps: float):
    """:func:`add_rmsnorm` in plain PyTorch (``models.common.rms_norm``'s arithmetic)."""
    if y is not None:
        x = x + y
    return x, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
