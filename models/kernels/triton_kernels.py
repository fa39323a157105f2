"""Triton kernels of the Mamba block (backend ``"triton"``), wrapped in autograd Functions:

- :class:`SelectiveScanTriton`: the fused selective scan (softplus + delta bias, the
  recurrence with an initial state in and the final state out, D skip, SiLU gate),
  forward and backward; any (batch, time, channel) strides;
- :class:`CausalConv1dTriton`: the causal depthwise conv + SiLU, time-major, with the
  inputs before t = 0 (``left``) for streaming.

The kernels themselves are in :mod:`models.kernels.triton_scan` (read its docstring for the
schedule). Triton comes with every CUDA build of PyTorch, so on a GPU this backend needs no
build step. It runs on CUDA tensors; on CPU tensors only under Triton's interpreter
(``TRITON_INTERPRET=1`` set before this module is first imported), which is slow and exists
so that the tests check these kernels on machines without a GPU.

:func:`unavailable_reason` says why the backend cannot run ("" when it can), for a device.
"""
from __future__ import annotations

import functools
import os

import torch

from models.kernels.scan_reference import selective_scan_ref


def _scan_tile() -> tuple[int, int]:
    """(steps per chunk, channels per program) of the scan: ``SSM_WORKBENCH_TRITON_SCAN_TILE``
    = "BTxBD" (powers of two) overrides the default, for tuning on a new GPU with `bench`."""
    raw = os.environ.get("SSM_WORKBENCH_TRITON_SCAN_TILE", "16x16")
    try:
        bt, bd = (int(v) for v in raw.lower().split("x"))
        if bt < 2 or bd < 2 or bt & (bt - 1) or bd & (bd - 1):
            raise ValueError
    except ValueError:
        raise ValueError(f"SSM_WORKBENCH_TRITON_SCAN_TILE={raw!r}: expected BTxBD, powers of two "
                         f">= 2, e.g. 16x16") from None
    return bt, bd


# Chunk (time tile) and channel tile of the scan at N <= 16; the checkpointed states cost
# batch * dim * N * L / SCAN_BT floats. What each launch costs an SM is measured by
# compiling for the GPU without one (`ssm-workbench bench --triton-compile 90`,
# models/kernels/triton_aot.py): at 16 x 16 x 16 on sm_90 the forward uses 128 registers
# a thread at 4 warps and the backward 232 at 8, neither spills.
SCAN_BT, SCAN_BD = _scan_tile()
_TILE_PINNED = "SSM_WORKBENCH_TRITON_SCAN_TILE" in os.environ
SCAN_FWD_WARPS = 4
SCAN_BWD_WARPS = 8
# The backward's partial sums of dB and dC are (batch, channel tiles, L, N): it takes
# tiles no narrower than 4 channels and no more than 16 tiles (memory, not speed).
SCAN_BWD_MIN_BD = 4
SCAN_BWD_MAX_TILES = 16
CONV_BLT = 64
CONV_BLD = 32
CONV_WARPS = 4
# The conv's backward: 64 x 32 tiles at 4 warps spilled 16-32 bytes a thread on sm_90
# (255 registers); 32 x 32 at 8 warps uses 80 and spills nothing.
CONV_BWD_BLT = 32
CONV_BWD_WARPS = 8


def scan_tiles(N: int, batch: int = 0, dim: int = 0, sms: int = 0,
               backward: bool = False) -> tuple[int, int, int]:
    """(BT, BD, BN) of the scan: a program holds (BT, BD, BN) tiles of a chunk in registers
    and walks the sequence for BD channels of one batch row.

    - Above N = 16 the channel tile shrinks to keep BT * BD * BN where it is at N = 16, half
      that in the backward (on sm_90, 16 x 16 x 64 spilled 712 bytes a thread forward and
      2392 backward; 16 x 4 x 64 fits the forward, where the backward spilled 36 bytes;
      16 x 2 x 64 fits it).
    - On a GPU with ``sms`` multiprocessors, a grid of cdiv(dim, BD) * batch programs that
      cannot fill the SMs (b8, 128 channels: 64 programs for 132 SMs) gets narrower tiles:
      halved until the grid has two programs an SM (the forward fits four to seven a
      SM at 4 warps), down to 2 channels; the backward (one program an SM at 8 warps)
      until one an SM, within SCAN_BWD_MIN_BD and SCAN_BWD_MAX_TILES.
      This is occupancy reasoning from the compiled kernels, not yet a timing on a GPU.
    - ``SSM_WORKBENCH_TRITON_SCAN_TILE`` pins BT x BD (no narrowing), for tuning.
    BT is the same forward and backward (the saved states are per chunk); BD may differ.
    """
    bn = _pow2(N)
    # the backward holds more (BT, BD, BN) tiles live: at N = 64 it needs half the forward's
    bd = SCAN_BD if bn <= 16 else max(2, SCAN_BD * 16 // bn // (2 if backward else 1))
    if sms and batch and dim and not _TILE_PINNED:
        want = sms if backward else 2 * sms
        floor = max(SCAN_BWD_MIN_BD, _pow2(-(-dim // SCAN_BWD_MAX_TILES))) if backward else 2
        while bd // 2 >= floor and -(-dim // bd) * batch < want:
            bd //= 2
    return SCAN_BT, bd, bn


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(t: torch.Tensor) -> int:
    """Multiprocessors of ``t``'s GPU; 0 for CPU tensors (the interpreter: no narrowing)."""
    return _sm_count(t.device.index or 0) if t.device.type == "cuda" else 0

_module = None
_import_error = ""


def _interpret_env() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes")


def _load():
    """The kernel module, imported once; None (with the reason kept) when Triton fails."""
    global _module, _import_error
    if _module is None and not _import_error:
        try:
            from models.kernels import triton_scan
            _module = triton_scan
            if interpreting():
                _patch_interpreter()
        except Exception as exc:  # noqa: BLE001  missing or broken Triton: report, don't crash
            _import_error = f"import triton failed: {type(exc).__name__}: {exc}"
    return _module


def interpreting() -> bool:
    """Whether the kernels were decorated in interpreter mode (they then run on CPU tensors)."""
    mod = _module if _module is not None else _load()
    if mod is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(mod.selective_scan_fwd_kernel, InterpretedFunction)


def _patch_interpreter() -> None:
    """Two changes to Triton 3.6's interpreter (CPU test runs only; the GPU path is untouched):

    - it holds a scalar kernel argument as a 1-element numpy array and turns it into a
      Python int (a loop bound such as ``range(n_chunks)``) with ``int(array)``, which
      numpy >= 2.4 refuses for arrays that are not 0-dimensional: re-patch that one
      conversion (``tensor.__index__``) while it runs a kernel (its scope restores it);
    - its ``associative_scan`` with a user combine function calls the function once per
      element (69k calls for one small chunk of the selective scan): run the same
      left-to-right combination once per position along the scanned axis, on whole slices.
      The order of combination, hence every rounding, is the same as the original's.
    """
    import numpy as np
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_ssm_workbench_fix", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    def sliced_scan(self, inputs):
        axis = self.axis
        data = [np.moveaxis(arg.handle.data, axis, 0) for arg in inputs]
        dtypes = [arg.dtype for arg in inputs]
        outs = [np.empty_like(d) for d in data]
        acc = None
        for i in range(data[0].shape[0]):
            cur = tuple(self.to_tensor(d[i], dt) for d, dt in zip(data, dtypes))
            if acc is None:
                acc = cur
            else:
                ret = self.combine_fn.fn(*acc, *cur)
                acc = ret if isinstance(ret, tuple) else (ret,)
            for o, a in zip(outs, acc):
                o[i] = a.handle.data.reshape(o[i].shape)
        return [self.to_tensor(np.moveaxis(o, 0, axis), dt) for o, dt in zip(outs, dtypes)]

    patched._ssm_workbench_fix = True
    interpreter._patch_lang_tensor = patched
    interpreter.ScanOps.generic_scan = sliced_scan


def version() -> str:
    try:
        import triton
        return triton.__version__
    except Exception:  # noqa: BLE001
        return ""


_self_check_result: str | None = None


def self_check(device: torch.device | str) -> str:
    """Run the kernels once on a tiny problem on ``device`` and compare with the sequential
    reference: "" when they agree, else what went wrong (compile error, mismatch).

    The first CUDA use in a process runs it (a second or two of compiling), so a GPU, driver
    or Triton version on which the kernels do not build makes ``auto`` fall back to torch
    with the reason, instead of failing the run.
    """
    try:
        g = torch.Generator().manual_seed(0)
        b, L, dim, N, K = 2, SCAN_BT + 3, 5, 3, 4

        def r(*shape):
            return torch.randn(*shape, generator=g).to(device).requires_grad_()

        u, delta, z, B, C = r(b, L, dim), r(b, L, dim), r(b, L, dim), r(b, L, N), r(b, L, N)
        A = (-torch.rand(dim, N, generator=g) - 0.5).to(device).requires_grad_()
        D, bias, h0 = r(dim), r(dim), r(b, dim, N)
        w, cb = r(dim, 1, K), r(dim)
        inputs = [u, delta, A, B, C, D, z, bias, h0, w, cb]

        def loss(fast: bool):
            if fast:
                x = CausalConv1dTriton.apply(u, w, cb, None, True)
                out, last = SelectiveScanTriton.apply(x, delta, A, B, C, D, z, bias, h0, True, False)
            else:
                x = torch.nn.functional.silu(torch.nn.functional.conv1d(
                    torch.nn.functional.pad(u.transpose(1, 2), (K - 1, 0)), w, cb, groups=dim))
                out, last = selective_scan_ref(x, delta.transpose(1, 2), A, B.transpose(1, 2),
                                               C.transpose(1, 2), D, z.transpose(1, 2), bias,
                                               True, True, h0)
                out = out.transpose(1, 2)
            return (out.sin().sum() + last.cos().sum()), out

        (lf, of), (lr, o_ref) = loss(True), loss(False)
        gf, gr = torch.autograd.grad(lf, inputs), torch.autograd.grad(lr, inputs)
        worst = max([((a - c).abs().max() / c.abs().max().clamp_min(1e-6)).item()
                     for a, c in zip([of, *gf], [o_ref, *gr])])
        if not worst < 1e-3:  # also catches NaN
            return f"Triton kernels disagree with the reference on {device} (relative error {worst:.2g})"
        return ""
    except Exception as exc:  # noqa: BLE001  a kernel that does not compile here: report it
        msg = (str(exc).strip().splitlines() or [""])[0][:300]
        return f"Triton kernels failed on {device}: {type(exc).__name__}: {msg}"


def unavailable_reason(device: torch.device | str | None = None) -> str:
    """Why backend "triton" cannot run on ``device`` ("" when it can; None: on any device)."""
    global _self_check_result
    if os.environ.get("SSM_WORKBENCH_NO_TRITON", "") not in ("", "0"):
        return "disabled by SSM_WORKBENCH_NO_TRITON"
    if _load() is None:
        return _import_error
    kind = None if device is None else torch.device(device).type
    if kind == "cuda" and interpreting():
        return "Triton runs in interpreter mode (TRITON_INTERPRET=1): CPU tensors only"
    if kind == "cpu" and not interpreting():
        return ("Triton kernels need CUDA tensors (on CPU only under Triton's interpreter, "
                "TRITON_INTERPRET=1 set before start; for tests)")
    if kind not in (None, "cpu", "cuda"):
        return f"Triton kernels do not run on {kind} tensors"
    if kind is None and not interpreting() and not torch.cuda.is_available():
        return "torch sees no CUDA device (and TRITON_INTERPRET is not set)"
    if kind == "cuda":
        if not torch.cuda.is_available():
            return "torch sees no CUDA device"
        if _self_check_result is None:
            _self_check_result = ""  # the check itself runs the kernels: no recursion
            _self_check_result = self_check("cuda")
        return _self_check_result
    return ""


def available(device: torch.device | str | None = None) -> bool:
    return unavailable_reason(device) == ""


def _kernels():
    mod = _load()
    if mod is None:
        raise RuntimeError(f"Triton kernels unavailable: {_import_error}")
    return mod




def _compute_dtype(*tensors):
    """float64 when any input is float64 (the tests' oracle precision), else float32."""
    import triton.language as tl
    return tl.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else tl.float32


def _pow2(n: int) -> int:
    return max(2, 1 << (max(1, n) - 1).bit_length())


def _s3(t: torch.Tensor | None) -> list[int]:
    return [0, 0, 0] if t is None else list(t.stride())


def _new_btd(like: torch.Tensor, batch: int, L: int, dim: int, channel_major: bool,
             dtype: torch.dtype) -> torch.Tensor:
    """An empty (batch, L, dim) tensor, stored as (batch, dim, L) when ``channel_major``."""
    if channel_major:
        return like.new_empty(batch, dim, L, dtype=dtype).transpose(1, 2)
    return like.new_empty(batch, L, dim, dtype=dtype)


def _device_guard(t: torch.Tensor):
    """Launch on the tensor's GPU (Triton launches on the current CUDA device)."""
    if t.device.type == "cuda":
        return torch.cuda.device(t.device)
    import contextlib
    return contextlib.nullcontext()


class SelectiveScanTriton(torch.autograd.Function):
    """forward(u, delta, A, B, C, D, z, delta_bias, h0, softplus, channel_major) -> (out, h_last)

      u, delta, z: (batch, L, dim), any strides (delta raw: bias and softplus are fused)
      A: (dim, N); B, C: (batch, L, N), any strides; D, delta_bias: (dim,) or None
      h0: (batch, dim, N) or None; out: (batch, L, dim) in u's dtype (stored (batch, dim, L)
      when ``channel_major``); h_last: (batch, dim, N) float32 (float64 for float64 inputs).

    Saves the inputs and the state entering every chunk of ``BT`` steps (:func:`scan_tiles`).
    """

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, h0, softplus, channel_major=False):
        k = _kernels()
        batch, L, dim = u.shape
        N = A.shape[1]
        state_dtype = torch.float64 if u.dtype == torch.float64 else torch.float32
        grad_dtypes = (A.dtype, B.dtype, C.dtype)          # gradients go back in these
        A = A.to(state_dtype).contiguous()
        D, delta_bias = (None if t is None else t.contiguous() for t in (D, delta_bias))
        h0 = None if h0 is None else h0.to(state_dtype).contiguous()
        out = _new_btd(u, batch, L, dim, channel_major, u.dtype)
        h_last = u.new_empty(batch, dim, N, dtype=state_dtype)
        BT, BD, BN = scan_tiles(N, batch, dim, sm_count(u))
        n_chunks = -(-L // BT)
        needs_grad = any(ctx.needs_input_grad[:9])
        ckpt = u.new_empty(batch, max(n_chunks, 1), dim, N, dtype=state_dtype) if needs_grad else None
        compute = _compute_dtype(u, delta, A, B, C)
        if L == 0:
            h_last.copy_(h0) if h0 is not None else h_last.zero_()
        elif batch * dim > 0:
            with _device_guard(u):
                k.selective_scan_fwd_kernel[(triton_cdiv(dim, BD), batch)](
                    u, delta, z, A, B, C, D, delta_bias, h0, out, h_last, ckpt,
                    L, dim, N, n_chunks, *_s3(u), *_s3(delta), *_s3(z), *_s3(B), *_s3(C), *_s3(out),
                    HAS_D=D is not None, HAS_Z=z is not None, HAS_BIAS=delta_bias is not None,
                    HAS_H0=h0 is not None, SOFTPLUS=bool(softplus), SAVE_CKPT=needs_grad,
                    COMPUTE=compute, BT=BT, BD=BD, BN=BN, num_warps=SCAN_FWD_WARPS)
        if needs_grad:
            ctx.save_for_backward(u, delta, z, A, B, C, D, delta_bias, ckpt)
            ctx.softplus, ctx.channel_major = bool(softplus), channel_major
            ctx.has_h0 = h0 is not None
            ctx.dtypes = grad_dtypes
        return out, h_last

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, dh_last):
        k = _kernels()
        u, delta, z, A, B, C, D, delta_bias, ckpt = ctx.saved_tensors
        batch, L, dim = u.shape
        N = A.shape[1]
        state_dtype = A.dtype
        BT, BD, BN = scan_tiles(N, batch, dim, sm_count(u), backward=True)
        n_chunks = -(-L // BT)
        n_dtiles = triton_cdiv(dim, BD)
        if dout is None:
            dout = u.new_zeros(batch, L, dim)
        dh = None if dh_last is None else dh_last.to(state_dtype).contiguous()
        cm = ctx.channel_major
        du = _new_btd(u, batch, L, dim, cm, u.dtype)
        ddelta = _new_btd(u, batch, L, dim, cm, delta.dtype)
        dz = _new_btd(u, batch, L, dim, cm, z.dtype) if z is not None else None
        # partial sums per batch row (and channel tile for dB, dC): summed here, so the
        # result does not depend on the order in which programs run
        dA_part = u.new_empty(batch, dim, N, dtype=state_dtype)
        dD_part = u.new_empty(batch, dim, dtype=state_dtype) if D is not None else None
        dbias_part = u.new_empty(batch, dim, dtype=state_dtype) if delta_bias is not None else None
        dB_part = u.new_empty(batch, n_dtiles, L, N, dtype=state_dtype)
        dC_part = u.new_empty(batch, n_dtiles, L, N, dtype=state_dtype)
        dh0 = u.new_empty(batch, dim, N, dtype=state_dtype)
        if L == 0 or batch * dim == 0:
            for t in (du, ddelta, dz, dA_part, dD_part, dbias_part, dB_part, dC_part):
                if t is not None:
                    t.zero_()
            dh0 = dh if dh is not None else u.new_zeros(batch, dim, N, dtype=state_dtype)
        else:
            with _device_guard(u):
                k.selective_scan_bwd_kernel[(n_dtiles, batch)](
                    u, delta, z, A, B, C, D, delta_bias, ckpt, dout, dh,
                    du, ddelta, dz, dA_part, dD_part, dbias_part, dB_part, dC_part, dh0,
                    L, dim, N, n_chunks, n_dtiles,
                    *_s3(u), *_s3(delta), *_s3(z), *_s3(B), *_s3(C), *_s3(dout), *_s3(du),
                    HAS_D=D is not None, HAS_Z=z is not None, HAS_BIAS=delta_bias is not None,
                    HAS_DHLAST=dh is not None, SOFTPLUS=ctx.softplus,
                    COMPUTE=_compute_dtype(u, delta, A, B, C), BT=BT, BD=BD, BN=BN,
                    num_warps=SCAN_BWD_WARPS)
        A_dt, B_dt, C_dt = ctx.dtypes
        return (du, ddelta, dA_part.sum(0).to(A_dt), dB_part.sum(1).to(B_dt),
                dC_part.sum(1).to(C_dt), None if D is None else dD_part.sum(0).to(D.dtype), dz,
                None if delta_bias is None else dbias_part.sum(0).to(delta_bias.dtype),
                dh0 if ctx.has_h0 else None, None, None)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


class CausalConv1dTriton(torch.autograd.Function):
    """Causal depthwise conv, time-major: forward(x, weight, bias, left, silu) -> out.

      x: (batch, L, dim), any strides; weight: (dim, 1, K) as in
      ``nn.Conv1d(dim, dim, K, groups=dim)``; bias: (dim,) or None; left: (batch, K-1, dim),
      the inputs before t = 0 (None = zeros);
      out[b, t] = act(bias + sum_j weight[:, 0, j] * x[b, t - (K-1) + j]), act = SiLU or identity.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, left, silu):
        k = _kernels()
        batch, L, dim = x.shape
        K = weight.shape[-1]
        w = weight.reshape(dim, K).contiguous()
        bias = None if bias is None else bias.contiguous()
        left = None if (left is None or K == 1) else left.contiguous()
        out = x.new_empty(batch, L, dim)
        if out.numel():
            with _device_guard(x):
                k.causal_conv_fwd_kernel[(triton_cdiv(L, CONV_BLT), triton_cdiv(dim, CONV_BLD), batch)](
                    x, w, bias, left, out, L, dim, *_s3(x), *_s3(out),
                    HAS_BIAS=bias is not None, HAS_LEFT=left is not None, SILU=bool(silu),
                    COMPUTE=_compute_dtype(x, w), K=K, BLT=CONV_BLT, BLD=CONV_BLD,
                    num_warps=CONV_WARPS)
        ctx.save_for_backward(x, w, bias, left)
        ctx.silu, ctx.weight_shape, ctx.had_left = bool(silu), weight.shape, left is not None
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        k = _kernels()
        x, w, bias, left = ctx.saved_tensors
        batch, L, dim = x.shape
        K = w.shape[1]
        compute = _compute_dtype(x, w)
        work = torch.float64 if compute.primitive_bitwidth == 64 else torch.float32
        n_tt = triton_cdiv(L, CONV_BWD_BLT)
        dpre = x.new_empty(batch, L, dim, dtype=work)
        dw_part = x.new_zeros(batch, n_tt, K, dim, dtype=work)
        dbias_part = x.new_zeros(batch, n_tt, dim, dtype=work)
        dx = torch.empty_like(x)
        dleft = x.new_zeros(batch, K - 1, dim, dtype=left.dtype) if left is not None else None
        if dx.numel():
            with _device_guard(x):
                grid = (n_tt, triton_cdiv(dim, CONV_BLD), batch)
                k.causal_conv_bwd_pre_kernel[grid](
                    x, w, bias, left, dout, dpre, dw_part, dbias_part, L, dim, n_tt,
                    *_s3(x), *_s3(dout),
                    HAS_BIAS=bias is not None, HAS_LEFT=left is not None, SILU=ctx.silu,
                    COMPUTE=compute, K=K, BLT=CONV_BWD_BLT, BLD=CONV_BLD, num_warps=CONV_BWD_WARPS)
                k.causal_conv_bwd_input_kernel[(triton_cdiv(L + K - 1, CONV_BWD_BLT),
                                                triton_cdiv(dim, CONV_BLD), batch)](
                    dpre, w, dx, dleft, L, dim, *_s3(dx),
                    HAS_LEFT=left is not None, COMPUTE=compute, K=K, BLT=CONV_BWD_BLT, BLD=CONV_BLD,
                    num_warps=CONV_BWD_WARPS)
        else:
            dx.zero_()
        dweight = dw_part.sum((0, 1)).t().reshape(ctx.weight_shape).to(w.dtype)
        dbias = None if bias is None else dbias_part.sum((0, 1)).to(bias.dtype)
        return dx, dweight, dbias, dleft if ctx.had_left else None, None


def _eager(fn):
    """torch.compile of a model (the `compile` training setting) runs ``fn`` eagerly, as a
    graph break: tracing into the kernel launches is not needed and not what they were
    tested as. ``torch.compiler.disable`` is applied on the first call, because it imports
    torch._dynamo (over a second), which every process importing the models would pay."""
    disabled = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal disabled
        if disabled is None:
            disabled = getattr(torch.compiler, "disable", lambda f: f)(fn)
        return disabled(*args, **kwargs)

    return call


@_eager
def causal_conv1d(x, weight, bias=None, left=None, silu=True):
    """:class:`CausalConv1dTriton` as a function (shapes there): (batch, L, dim) -> same."""
    return CausalConv1dTriton.apply(x, weight, bias, left, silu)


@_eager
def selective_scan(u, delta, A, B, C, D, z, delta_bias, initial_state, softplus, channel_major):
    """:class:`SelectiveScanTriton` as a function (shapes there): (out, last_state)."""
    return SelectiveScanTriton.apply(u, delta, A, B, C, D, z, delta_bias, initial_state,
                                     softplus, channel_major)
