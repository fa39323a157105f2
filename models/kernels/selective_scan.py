"""The S6 selective scan (Gu & Dao, "Mamba", 2023, Algorithm 2) with three backends.

For every batch element b, channel d and state index n, with time t = 0 .. L-1:

    delta_t  = softplus(delta_t + delta_bias)         (if delta_softplus; else delta_t + bias)
    h_t      = exp(delta_t * A) * h_{t-1}  +  delta_t * B_t * u_t
                 `-- ZOH for A --'            `-- Euler for B --'
    y_t      = sum_n C_t[n] * h_t[n]  +  D * u_t
    out_t    = y_t * silu(z_t)                          (if a gate z is given)

Shapes follow mamba-ssm's ``selective_scan_fn`` (so official checkpoints and code map 1:1):

    u, delta, z:  (batch, dim, length)
    A:            (dim, state)             real; A = -exp(A_log) in the Mamba layer
    B, C:         (batch, state, length)   input-dependent ("selective");
                  (batch, 1, state, length) is accepted too (one group). mamba-ssm also
                  allows G > 1 groups and time-invariant / complex B, C: not supported here.
    D, delta_bias: (dim,)
    out:          (batch, dim, length);  last_state: (batch, dim, state)

Backends (``backend=``):

- ``"ref"``:   :func:`selective_scan_ref` (:mod:`models.kernels.scan_reference`), the
  recurrence above as a sequential loop under autograd. Slow (backward stores every step),
  kept for tests and for the Triton kernels' self-check.
- ``"torch"``: :class:`SelectiveScanTorch`, a custom autograd Function. Forward walks the
  sequence in blocks of ``block_len`` steps and keeps only the state at block boundaries;
  backward walks the blocks in reverse, recomputes each block's states from its start
  state, runs the adjoint recurrence, and forms all parameter gradients of the block with
  batched contractions. Peak memory is O(batch * dim * state * (block_len + L / block_len))
  instead of the O(batch * dim * state * L) that storing every state needs. Decays are
  running products, never cumulative sums of log-decays (those overflow float32 at
  Mamba's default init, see FACTS.md).
- ``"cuda"``:  mamba-ssm's fused CUDA kernel, when ``import mamba_ssm`` works and the
  inputs live on a CUDA device.
- ``"compiled"``: (:mod:`models.kernels.scan_compiled`) the same blockwise algorithm with each block's forward and backward
  written as pure functions and ``torch.compile``d (one graph per block shape,
  ``dynamic=False``). About 2-3x faster on CPU, but the first call compiles for tens of
  seconds (less with inductor's on-disk cache), so it is opt-in only, never chosen by
  ``auto``. If compilation fails (e.g. no C compiler) it warns once and runs the same
  pure functions eagerly.
- ``"triton"``: :class:`models.kernels.triton_kernels.SelectiveScanTriton`, the project's
  own fused Triton kernels for CUDA tensors (chunked parallel scan, state in float32
  registers, checkpointed every 16 steps for the backward; bias, softplus, D and gate fused;
  initial state in, last state out). No build step: Triton ships with CUDA builds of
  PyTorch. On CPU tensors it runs only under Triton's interpreter (``TRITON_INTERPRET=1``;
  the tests use it). :func:`triton_unavailable_reason` says why not.
- ``"cpu"``:   :class:`models.kernels.cpu_kernels.SelectiveScanCPU`, a fused C kernel for CPU
  tensors (built with the system C compiler on first use, loaded with ctypes; same chunked
  recompute-in-backward memory scheme, chunks of 64). :func:`cpu_unavailable_reason` says
  why it cannot be used (no compiler, or disabled).
- ``"auto"``:  on CUDA tensors cuda if importable, else triton, else torch; on CPU tensors
  cpu when the C kernel builds, else torch. :func:`cuda_unavailable_reason` says why not cuda.

Negative eigenvalues (``neg_eigval=True``; Grazzi, Siems, Zela, Franke, Hutter & Pontil,
"Unlocking State-Tracking in Linear RNNs Through Negative Eigenvalues", ICLR 2025, code
adankow/unlocking_state_tracking: ``deltaA = deltaA * 2 - 1`` in its Mamba's selective scan,
``PositiveNegativeMambaBlock``): the transition becomes 2 exp(delta_t A) - 1 in (-1, 1),
B-bar = delta B unchanged. Only ``ref`` and ``torch`` (running products, so a negative
transition is no harder) compute it; ``auto`` picks ``torch`` then.

Extension beyond mamba-ssm: ``initial_state`` (batch, dim, state) starts the recurrence
from a given h_{-1} (used to stream very long sequences chunk by chunk). The CUDA kernel
has no such input, so ``auto`` uses the triton backend (else torch) whenever an initial
state is given on a CUDA device.
"""
from __future__ import annotations

from typing import Callable

import torch

from models.kernels import cpu_kernels, triton_kernels
from models.kernels.scan_compiled import (SelectiveScanCompiled, _backward_inputs, _state_major,
                                         _time_major)
from models.kernels.scan_reference import _check_bc, _finish, _prepare, _work_dtype, selective_scan_ref

BACKENDS = ("auto", "cuda", "triton", "cpu", "torch", "compiled", "ref")
DEFAULT_BLOCK_LEN = 32

# ---------------------------------------------------------------------------------------
# Optional CUDA kernels (mamba-ssm, causal-conv1d), imported lazily and defensively.
# ---------------------------------------------------------------------------------------

# name -> (callable or None, reason it is None); filled on first use
_cuda_cache: dict[str, tuple[Callable | None, str]] = {}


def _guarded_import(name: str, importer: Callable[[], Callable]) -> tuple[Callable | None, str]:
    """(the CUDA kernel ``importer()`` returns, or None with the reason). Cached.

    mamba-ssm and causal-conv1d raise non-ImportErrors (OSError, RuntimeError, ...) when their
    extensions are missing or were built for another CUDA, so any exception means
    "not available" and its text is kept for the user."""
    if name not in _cuda_cache:
        if not torch.cuda.is_available():
            _cuda_cache[name] = (None, "torch sees no CUDA device")
        else:
            try:
                _cuda_cache[name] = (importer(), "")
            except Exception as exc:  # noqa: BLE001  any failure means "not available"
                _cuda_cache[name] = (None, f"import {name} failed: {type(exc).__name__}: {exc}")
    return _cuda_cache[name]


def _import_scan() -> Callable:
    from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
    return selective_scan_fn


def _import_conv() -> Callable:
    from causal_conv1d import causal_conv1d_fn
    return causal_conv1d_fn


def _load_cuda_scan() -> tuple[Callable | None, str]:
    """(mamba-ssm's selective_scan_fn or None, reason it is None)."""
    return _guarded_import("mamba_ssm", _import_scan)


def _load_cuda_conv() -> tuple[Callable | None, str]:
    """(causal_conv1d_fn or None, reason it is None)."""
    return _guarded_import("causal_conv1d", _import_conv)


def cuda_available() -> bool:
    return _load_cuda_scan()[0] is not None


def cuda_unavailable_reason() -> str:
    """Why the CUDA scan cannot be used ("" when it can)."""
    return _load_cuda_scan()[1]


def causal_conv1d_cuda() -> Callable | None:
    """causal-conv1d's ``causal_conv1d_fn`` when importable, else None."""
    return _load_cuda_conv()[0]


def cpu_unavailable_reason() -> str:
    """Why the fused CPU kernel cannot be used ("" when it can)."""
    return cpu_kernels.unavailable_reason()


def triton_unavailable_reason(device: torch.device | str | None = "cuda") -> str:
    """Why the Triton kernels cannot run on ``device`` ("" when they can)."""
    return triton_kernels.unavailable_reason(device)


def choose_backend(backend: str, device: torch.device | str, initial_state: bool = False,
                   neg_eigval: bool = False) -> str:
    """Resolve ``backend`` for tensors on ``device`` to one of "cuda", "triton", "cpu",
    "torch", "compiled", "ref".

    ``neg_eigval`` (the transition 2 exp(delta A) - 1, see the module doc): only "torch" and
    "ref" compute it; "auto" resolves to "torch", any other forced backend is an error.

    ``auto``: on CUDA tensors mamba-ssm's kernel when importable (and no initial state is
    given: it takes none), else the Triton kernels, else torch; on CPU tensors the C
    kernels, else torch. Triton on CPU tensors (its interpreter) is only ever forced.

    Forcing "cuda" or "cpu" where it cannot run is an error that says why, not a silent
    fallback.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown selective-scan backend {backend!r}; expected one of {BACKENDS}")
    if neg_eigval:
        if backend in ("auto", "torch", "ref"):
            return "torch" if backend == "auto" else backend
        raise ValueError(f"selective-scan backend {backend!r} has no negative-eigenvalue "
                         "transition (allow_neg_eigval); use 'auto', 'torch' or 'ref'")
    kind = torch.device(device).type
    on_cuda = kind == "cuda"
    if backend == "auto":
        if on_cuda and not initial_state and cuda_available():
            return "cuda"
        if on_cuda and triton_kernels.available(kind):
            return "triton"
        return "cpu" if (kind == "cpu" and cpu_kernels.available()) else "torch"
    if backend == "triton":
        reason = triton_kernels.unavailable_reason(kind)
        if reason:
            raise RuntimeError(f"selective-scan backend 'triton' unavailable: {reason}")
    if backend == "cpu":
        if not cpu_kernels.available():
            raise RuntimeError(f"selective-scan backend 'cpu' unavailable: {cpu_unavailable_reason()}")
        if kind != "cpu":
            raise RuntimeError(f"selective-scan backend 'cpu' needs CPU tensors, got device {device}")
    if backend == "cuda":
        if not cuda_available():
            raise RuntimeError(f"selective-scan backend 'cuda' unavailable: {cuda_unavailable_reason()}")
        if not on_cuda:
            raise RuntimeError(f"selective-scan backend 'cuda' needs CUDA tensors, got device {device}")
        if initial_state:
            raise RuntimeError("selective-scan backend 'cuda' (mamba-ssm) takes no initial_state")
    return backend


# ---------------------------------------------------------------------------------------
# Fast pure-PyTorch scan: blockwise, custom backward that recomputes states per block
# ---------------------------------------------------------------------------------------

def _block_inputs(d, du, At, B, deltaA, deltaB_u, neg=False):
    """Fill deltaA = exp(delta A) (2 exp(delta A) - 1 when neg) and deltaB_u = delta u B for
    one block, in place.

    d: (T, batch, dim) delta; du: (T, batch, dim) delta * u; At: (N, dim); B: (T, batch, N);
    deltaA, deltaB_u: (T, batch, N, dim) workspace slices, overwritten. Writing into reused
    buffers instead of fresh tensors saves an allocation (and its page faults) per big op:
    about 1.8x on a (32, 8, 16, 128) multiply on this CPU.
    """
    torch.mul(d[:, :, None, :], At, out=deltaA)
    deltaA.exp_()                                                  # ZOH:   exp(delta A)
    if neg:
        deltaA.mul_(2).sub_(1)                                     # in (-1, 1)
    torch.mul(du[:, :, None, :], B[..., None], out=deltaB_u)       # Euler: delta B u


def _run_block(deltaA, deltaB_u, h):
    """h_t = deltaA_t h_{t-1} + deltaB_u_t over the block, in place: deltaB_u becomes the
    states h_t (T, b, N, d). Returns the last state (a view into deltaB_u)."""
    for dA_t, h_t in zip(deltaA.unbind(0), deltaB_u.unbind(0)):
        h_t.addcmul_(dA_t, h)
        h = h_t
    return h


class SelectiveScanTorch(torch.autograd.Function):
    """Core recurrence h_t = exp(delta_t A) h_{t-1} + delta_t B_t u_t, y_t = C_t . h_t.

    forward(u, delta, A, B, C, h0, block_len) -> (y, h_last)
      u, delta: (batch, dim, L) with delta already biased/softplus'd; A: (dim, N);
      B, C: (batch, N, L); h0: (batch, dim, N) or None.
      y: (batch, dim, L); h_last: (batch, dim, N).
    Saves only the inputs and the state at every block start (n_blocks, batch, N, dim).

    Internally time-major with the state index before the channel, (T, batch, N, dim):
    each step is one contiguous slice, and the sums over N (y, and the delta / u
    gradients) add contiguous rows of length dim, which on CPU is 2-3x faster than
    reducing a length-16 last axis; multiply-then-sum also beats bmm/einsum here.
    All (T, batch, N, dim) intermediates live in a few workspace buffers reused by every
    block (forward: 2, backward: 4).
    """

    @staticmethod
    def forward(ctx, u, delta, A, B, C, h0, block_len, neg=False):
        batch, dim, L = u.shape
        N = A.shape[1]
        uT, deltaT, At, BT, CT = _time_major(u, delta, A, B, C)
        duT = deltaT * uT
        h = _state_major(h0, u, N)
        starts = list(range(0, L, block_len))
        block_h0 = u.new_empty(len(starts), batch, N, dim)
        yT = u.new_empty(L, batch, dim)
        T0 = min(block_len, L)
        ws_dA, ws_h = u.new_empty(T0, batch, N, dim), u.new_empty(T0, batch, N, dim)
        for k, s in enumerate(starts):
            e = min(s + block_len, L)
            block_h0[k] = h
            dA, hs = ws_dA[: e - s], ws_h[: e - s]
            _block_inputs(deltaT[s:e], duT[s:e], At, BT[s:e], dA, hs, neg)
            h = _run_block(dA, hs, h).clone()                          # hs is overwritten next
            torch.sum(hs.mul_(CT[s:e, :, :, None]), dim=2, out=yT[s:e])  # y_t = C_t . h_t
        ctx.save_for_backward(u, delta, A, B, C, block_h0)
        ctx.block_len, ctx.neg = block_len, neg
        ctx.has_h0 = h0 is not None
        return yT.permute(1, 2, 0), h.transpose(1, 2)

    @staticmethod
    def backward(ctx, dy, dh_last):
        # carry = dLoss/dh at the end of the current block, from everything after it
        uT, deltaT, At, BT, CT, dyT, block_h0, carry = _backward_inputs(ctx, dy, dh_last)
        block_len = ctx.block_len
        L, batch, dim = uT.shape
        N = At.shape[0]
        duT = deltaT * uT

        du = torch.empty_like(uT)
        ddelta = torch.empty_like(deltaT)
        dB = torch.empty_like(BT)
        dC = torch.empty_like(CT)
        dAt = torch.zeros_like(At)
        dAt_k = torch.empty_like(At)
        gB = torch.empty_like(uT[:block_len])
        T0 = min(block_len, L)
        ws_dA, ws_h, ws_g, ws_tmp = (uT.new_empty(T0, batch, N, dim) for _ in range(4))
        starts = list(range(0, L, block_len))
        for k in reversed(range(len(starts))):
            s = starts[k]
            e = min(s + block_len, L)
            T = e - s
            h_start = block_h0[k]
            dA, hs, gs, tmp, gB_b = ws_dA[:T], ws_h[:T], ws_g[:T], ws_tmp[:T], gB[:T]
            _block_inputs(deltaT[s:e], duT[s:e], At, BT[s:e], dA, hs, ctx.neg)
            _run_block(dA, hs, h_start)                                # recompute this block's states
            d_blk, u_blk, dy_blk = deltaT[s:e], uT[s:e], dyT[s:e, :, None, :]

            # Adjoint recurrence: g_t = dL/dh_t = C_t dy_t + deltaA_{t+1} g_{t+1}
            torch.mul(CT[s:e, :, :, None], dy_blk, out=gs)             # (T, b, N, dim)
            g_steps, dA_steps = gs.unbind(0), dA.unbind(0)
            g_steps[-1].add_(carry)
            for t in range(T - 2, -1, -1):
                g_steps[t].addcmul_(dA_steps[t + 1], g_steps[t + 1])
            carry = dA_steps[0] * g_steps[0]                           # dL/dh_{s-1}

            # y_t = C_t . h_t  ->  dC_t[n] = sum_d dy_t[d] h_t[n, d]
            torch.sum(torch.mul(hs, dy_blk, out=tmp), dim=-1, out=dC[s:e])
            # deltaB_u_t = delta_t u_t B_t: g_t is dL/d(deltaB_u_t)
            torch.sum(torch.mul(gs, BT[s:e, :, :, None], out=tmp), dim=2, out=gB_b)  # sum_n g B
            torch.mul(gB_b, d_blk, out=du[s:e])
            torch.sum(torch.mul(gs, duT[s:e, :, None, :], out=tmp), dim=-1, out=dB[s:e])
            # deltaA_t = exp(delta_t A): dL/d(delta_t A) = g_t h_{t-1} deltaA_t  (in place in gs);
            # neg: deltaA_t = 2 exp(delta_t A) - 1, whose derivative 2 exp(.) is deltaA_t + 1
            gs[1:].mul_(hs[:-1])
            gs[0].mul_(h_start)
            gs.mul_(dA.add_(1) if ctx.neg else dA)
            torch.sum(torch.mul(gs, At, out=tmp), dim=2, out=ddelta[s:e])
            ddelta[s:e].addcmul_(gB_b, u_blk)
            torch.sum(torch.mul(gs, d_blk[:, :, None, :], out=tmp), dim=(0, 1), out=dAt_k)
            dAt += dAt_k
        dh0 = carry.transpose(1, 2) if ctx.has_h0 else None
        return (du.permute(1, 2, 0), ddelta.permute(1, 2, 0), dAt.t(),
                dB.permute(1, 2, 0), dC.permute(1, 2, 0), dh0, None, None)


def selective_scan_torch(
    u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
    return_last_state=False, initial_state=None, block_len: int = DEFAULT_BLOCK_LEN,
    compiled: bool = False, neg_eigval: bool = False,
):
    """Fast pure-PyTorch scan (any device). Same contract as :func:`selective_scan_ref`.

    ``compiled=True`` runs the blocks through ``torch.compile``d kernels (backend "compiled";
    not with ``neg_eigval``).
    """
    if block_len < 1:
        raise ValueError("block_len must be >= 1")
    dtype_in = u.dtype
    u, delta, A, B, C = _prepare(u, delta, A, B, C, delta_bias, delta_softplus)
    if compiled and neg_eigval:
        raise ValueError("the compiled scan has no negative-eigenvalue transition")
    if compiled:
        y, last = SelectiveScanCompiled.apply(u, delta, A, B, C, initial_state, block_len)
    else:
        y, last = SelectiveScanTorch.apply(u, delta, A, B, C, initial_state, block_len,
                                           neg_eigval)
    out = _finish(y, u, D, z, dtype_in)
    return (out, last) if return_last_state else out


def selective_scan_cpu_tm(
    u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
    return_last_state=False, initial_state=None, chunk_len: int = cpu_kernels.CHUNK_LEN,
    channel_major: bool = False,
):
    """The fused C kernel (backend "cpu"), time-major: u, delta, z: (batch, L, dim);
    B, C: (batch, L, N); A: (dim, N); D, delta_bias: (dim,); initial_state (batch, dim, N).
    Returns out (batch, L, dim) [, last_state (batch, dim, N)]. Softplus, bias, D and the
    gate run inside the kernel, forward and backward. ``channel_major``: u, delta, z are
    transposed (batch, dim, L) tensors; out is then stored that way too.
    """
    if chunk_len < 1:
        raise ValueError("chunk_len must be >= 1")
    B, C = _check_bc(A, B, C)
    dtype_in = u.dtype
    work = _work_dtype(u)
    out, last = cpu_kernels.SelectiveScanCPU.apply(
        u.to(work), delta.to(work), A.to(work), B.to(work), C.to(work),
        None if D is None else D.to(work), None if z is None else z.to(work),
        None if delta_bias is None else delta_bias.to(work),
        None if initial_state is None else initial_state.to(work), bool(delta_softplus), chunk_len,
        channel_major)
    out = out.to(dtype_in)
    return (out, last) if return_last_state else out


def selective_scan_triton_tm(
    u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
    return_last_state=False, initial_state=None, channel_major: bool = False,
):
    """The fused Triton kernels (backend "triton"), time-major: u, delta, z: (batch, L, dim);
    B, C: (batch, L, N); A: (dim, N); D, delta_bias: (dim,); initial_state (batch, dim, N).
    Returns out (batch, L, dim) in u's dtype [, last_state (batch, dim, N) float32]. Any
    strides; float32 state and arithmetic for float32 / bfloat16 / float16 inputs (float64
    for float64). ``channel_major``: out is stored as (batch, dim, L) (mamba-ssm's layout).
    """
    B, C = _check_bc(A, B, C)
    out, last = triton_kernels.selective_scan(
        u, delta, A, B, C, D, z, delta_bias, initial_state, bool(delta_softplus), channel_major)
    return (out, last) if return_last_state else out


# ---------------------------------------------------------------------------------------
# Public entry point
# ---------------------------------------------------------------------------------------

def _device_of(t: torch.Tensor) -> torch.device:
    """Device used for dispatch (a seam for tests that fake CUDA tensors)."""
    return t.device


def selective_scan_fn(
    u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
    return_last_state=False, backend: str = "auto", initial_state=None, neg_eigval=False,
):
    """mamba-ssm-compatible selective scan; ``backend`` in auto | cuda | triton | cpu | torch |
    compiled | ref.

    u, delta, z: (batch, dim, length); A: (dim, state); B, C: (batch, state, length);
    D, delta_bias: (dim,); initial_state: (batch, dim, state) or None; neg_eigval: the
    transition 2 exp(delta A) - 1 (torch and ref only, see :func:`choose_backend`).
    Returns out (batch, dim, length) [, last_state (batch, dim, state)].
    """
    chosen = choose_backend(backend, _device_of(u), initial_state is not None, neg_eigval)
    if chosen == "cuda":
        fn = _load_cuda_scan()[0]
        return fn(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)
    if chosen == "ref":
        return selective_scan_ref(u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                                  return_last_state, initial_state=initial_state,
                                  neg_eigval=neg_eigval)
    if chosen in ("cpu", "triton"):
        B, C = _check_bc(A, B, C)
        fused = selective_scan_cpu_tm if chosen == "cpu" else selective_scan_triton_tm
        return _swap_time_and_channels(fused(
            u.transpose(1, 2), delta.transpose(1, 2), A, B.transpose(1, 2), C.transpose(1, 2),
            D, None if z is None else z.transpose(1, 2), delta_bias, delta_softplus,
            return_last_state, initial_state, channel_major=True), return_last_state)
    return selective_scan_torch(u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                                return_last_state, initial_state=initial_state,
                                compiled=chosen == "compiled", neg_eigval=neg_eigval)


def selective_scan_tm(
    u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
    return_last_state=False, backend: str = "auto", initial_state=None, neg_eigval=False,
):
    """:func:`selective_scan_fn` for time-major tensors, the layout the Mamba block makes:
    u, delta, z: (batch, L, dim); B, C: (batch, L, N); returns out (batch, L, dim).

    The "cpu" and "triton" backends read these directly (strided views are fine); the others get
    transposed views and their output is transposed back.
    """
    chosen = choose_backend(backend, _device_of(u), initial_state is not None, neg_eigval)
    if chosen in ("cpu", "triton"):
        fused = selective_scan_cpu_tm if chosen == "cpu" else selective_scan_triton_tm
        return fused(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state,
                     initial_state)
    return _swap_time_and_channels(selective_scan_fn(
        u.transpose(1, 2), delta.transpose(1, 2), A, B.transpose(1, 2), C.transpose(1, 2), D,
        None if z is None else z.transpose(1, 2), delta_bias, delta_softplus,
        return_last_state, backend=chosen, initial_state=initial_state, neg_eigval=neg_eigval),
        return_last_state)


def _swap_time_and_channels(res, return_last_state: bool):
    """out (b, L, d) <-> (b, d, L) of a scan result; the last state is left as it is."""
    if return_last_state:
        return res[0].transpose(1, 2), res[1]
    return res.transpose(1, 2)
